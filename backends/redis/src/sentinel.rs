//! Finding the primary through Redis Sentinel, and following failovers.
//!
//! The store keeps one multiplexed connection to the primary (or, in pool
//! mode, opens each pooled connection with [`Sentinel::open_primary`]). It
//! asks the sentinels (in the order given) `SENTINEL
//! GET-MASTER-ADDR-BY-NAME`, connects to the address named, and uses it
//! only if the server itself answers `ROLE` with `master` (during a failover a sentinel may still
//! name the old primary). A call that finds the connection dead (an I/O
//! error) or the server demoted (`READONLY`) drops it; the next decision
//! finds the primary again; so does a connection on which
//! [`UNANSWERED_MAX`](crate::call_watch::UNANSWERED_MAX) calls in a row went unanswered past their deadline
//! (a primary whose host died without closing its sockets answers
//! nothing, and no error would say so until the kernel gives up on the
//! connection, many minutes later). Finding it runs in a background task, so a
//! slow sentinel costs a decision at most its deadline and the search
//! still completes; while no primary is known decisions fail at once
//! with [`RedisStoreError::NoPrimary`] (the policy's failure mode
//! decides), and the sentinels are asked again at most every
//! [`RETRY_PAUSE`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo,
    RedisError, Value,
};
use tokio::sync::watch;
use tollgate_limiter::StoreError;

use crate::call_watch::{CallWatch, Watched};
use crate::client;
use crate::error::RedisStoreError;
use crate::settings::Settings;

/// The shortest time between two searches for the primary.
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Where the primary of a Sentinel-managed service is found, and how to
/// log in to it.
#[derive(Clone)]
pub(crate) struct SentinelTarget {
    pub(crate) sentinels: Vec<String>,
    pub(crate) service: String,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: i64,
}

/// The current primary connection and the state of the search for it.
#[derive(Clone, Default)]
struct Current {
    /// The connection and its generation (a call that finds it broken
    /// drops only the generation it used).
    primary: Option<(u64, MultiplexedConnection)>,
    /// The last failed search: when, and what it found.
    failed: Option<(Instant, String)>,
}

/// The primary of one service, found through its sentinels.
pub(crate) struct Sentinel {
    sentinels: Vec<Client>,
    /// Whether the sentinels (and so the primary) speak TLS.
    tls: bool,
    /// With TLS, whether the sentinels' URLs said `#insecure` (the
    /// primary is then not verified either).
    insecure: bool,
    service: String,
    node: RedisConnectionInfo,
    settings: Settings,
    config: AsyncConnectionConfig,
    current: watch::Sender<Current>,
    searching: AtomicBool,
    generation: std::sync::atomic::AtomicU64,
    /// Calls abandoned unanswered in a row ([`CallWatch`]).
    unanswered: AtomicU32,
}

impl Watched for Sentinel {
    fn unanswered(&self) -> &AtomicU32 {
        &self.unanswered
    }

    fn dead(&self, generation: u64) {
        self.forget(generation);
    }
}

impl Sentinel {
    /// Check the sentinel URLs and the service; connects to nothing.
    pub(crate) fn new(
        target: &SentinelTarget,
        settings: &Settings,
        config: AsyncConnectionConfig,
    ) -> Result<Sentinel, StoreError> {
        if target.sentinels.is_empty() {
            return Err(RedisStoreError::InvalidSetting(
                "no sentinel addresses: give at least one (three or more in production)".into(),
            )
            .into());
        }
        if target.service.is_empty() {
            return Err(RedisStoreError::InvalidSetting(
                "empty Sentinel service name: give the name sentinels monitor (`sentinel monitor <name> ...`)".into(),
            )
            .into());
        }
        let sentinels = target
            .sentinels
            .iter()
            .map(|url| client::open(url, settings))
            .collect::<Result<Vec<_>, _>>()?;
        // The primary is reached as the sentinels are: all alike.
        let modes: Vec<(bool, bool)> = sentinels
            .iter()
            .map(|c| client::tls_mode(c.get_connection_info()))
            .collect();
        if modes.windows(2).any(|pair| pair[0] != pair[1]) {
            return Err(RedisStoreError::InvalidSetting(
                "the sentinel URLs mix TLS (rediss://) and plain (redis://) connections, or \
                 #insecure and verified ones: write them all alike (the primary is reached \
                 the same way)"
                    .into(),
            )
            .into());
        }
        let (tls, insecure) = modes.first().copied().unwrap_or_default();
        let mut node = RedisConnectionInfo::default().set_db(target.db);
        if let Some(username) = &target.username {
            node = node.set_username(username);
        }
        if let Some(password) = &target.password {
            node = node.set_password(password);
        }
        Ok(Sentinel {
            sentinels,
            tls,
            insecure,
            service: target.service.clone(),
            node,
            settings: settings.clone(),
            config,
            current: watch::Sender::new(Current::default()),
            searching: AtomicBool::new(false),
            generation: Default::default(),
            unanswered: AtomicU32::new(0),
        })
    }

    /// The primary's connection and its generation: the one known, or
    /// the one a search finds (waited for until the caller's deadline).
    pub(crate) async fn connection(
        self: &Arc<Self>,
    ) -> Result<(u64, MultiplexedConnection), StoreError> {
        let mut seen = self.current.subscribe();
        {
            let current = seen.borrow_and_update();
            if let Some(primary) = &current.primary {
                return Ok(primary.clone());
            }
            if let Some((at, detail)) = &current.failed {
                if at.elapsed() < RETRY_PAUSE {
                    return Err(self.no_primary(detail.clone()));
                }
            }
        }
        self.search();
        loop {
            if seen.changed().await.is_err() {
                return Err(self.no_primary("the store was dropped".into()));
            }
            let current = seen.borrow_and_update();
            if let Some(primary) = &current.primary {
                return Ok(primary.clone());
            }
            if let Some((_, detail)) = &current.failed {
                return Err(self.no_primary(detail.clone()));
            }
        }
    }

    /// A new connection of its own to the primary the sentinels name now
    /// (a pool's: each connection is asked for anew, so connections opened
    /// after a failover reach the new primary).
    pub(crate) async fn open_primary(&self) -> Result<MultiplexedConnection, RedisError> {
        self.find().await.map_err(|detail| {
            RedisError::from((
                redis::ErrorKind::Io,
                "no Sentinel named a reachable primary",
                format!("service {:?}: {detail}", self.service),
            ))
        })
    }

    /// Forget the connection of `generation` after `e` showed it is no
    /// longer the primary's (dead, or demoted to a replica).
    pub(crate) fn check(&self, generation: u64, e: &RedisError) {
        let lost = e.is_unrecoverable_error() || crate::error::is_read_only(e);
        if lost {
            self.forget(generation);
        }
    }

    /// Watch one call on the connection of `generation`.
    pub(crate) fn watch(&self, generation: u64) -> CallWatch<'_, Sentinel> {
        CallWatch::new(self, generation)
    }

    /// Drop the connection of `generation` (not a newer one): the next
    /// decision finds the primary again.
    fn forget(&self, generation: u64) {
        self.current.send_if_modified(|current| {
            let same = matches!(&current.primary, Some((g, _)) if *g == generation);
            if same {
                current.primary = None;
            }
            same
        });
    }

    fn no_primary(&self, detail: String) -> StoreError {
        RedisStoreError::NoPrimary {
            service: self.service.clone(),
            detail,
        }
        .into()
    }

    /// Start a search in the background unless one is running.
    fn search(self: &Arc<Self>) {
        if self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let found = this.find().await;
            this.current.send_modify(|current| match found {
                Ok(con) => {
                    let generation = this.generation.fetch_add(1, Ordering::Relaxed) + 1;
                    current.primary = Some((generation, con));
                    current.failed = None;
                }
                Err(detail) => {
                    current.primary = None;
                    current.failed = Some((Instant::now(), detail));
                }
            });
            this.searching.store(false, Ordering::Release);
        });
    }

    /// Ask every sentinel at once, within the connect timeout; the first
    /// primary that confirms its role wins. (Asked in turn, a sentinel
    /// whose host drops packets took the whole timeout, and the others
    /// were never asked.)
    async fn find(&self) -> Result<MultiplexedConnection, String> {
        type Ask<'s> =
            Pin<Box<dyn Future<Output = Result<MultiplexedConnection, String>> + Send + 's>>;
        let timeout = self.settings.connect_timeout;
        let mut asks: Vec<Option<Ask<'_>>> = self
            .sentinels
            .iter()
            .map(|sentinel| Some(Box::pin(self.ask(sentinel)) as Ask<'_>))
            .collect();
        let mut failures: Vec<String> = Vec::new();
        let first = std::future::poll_fn(|cx| {
            for (i, slot) in asks.iter_mut().enumerate() {
                let Some(ask) = slot else { continue };
                match ask.as_mut().poll(cx) {
                    Poll::Ready(Ok(con)) => return Poll::Ready(Some(con)),
                    Poll::Ready(Err(e)) => {
                        failures.push(format!("sentinel {}: {e}", i + 1));
                        *slot = None;
                    }
                    Poll::Pending => {}
                }
            }
            match asks.iter().any(Option::is_some) {
                true => Poll::Pending,
                false => Poll::Ready(None),
            }
        });
        match tokio::time::timeout(timeout, first).await {
            Ok(Some(con)) => Ok(con),
            Ok(None) => Err(failures.join("; ")),
            Err(_) => {
                failures.push(format!("no other answer within {timeout:?}"));
                Err(failures.join("; "))
            }
        }
    }

    async fn ask(&self, sentinel: &Client) -> Result<MultiplexedConnection, String> {
        let mut con = sentinel
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| format!("unreachable ({e})"))?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.service)
            .query_async(&mut con)
            .await
            .map_err(|e| format!("SENTINEL GET-MASTER-ADDR-BY-NAME failed ({e})"))?;
        let (host, port) = addr.ok_or_else(|| {
            format!(
                "does not monitor a service named {:?}",
                self.service.as_str()
            )
        })?;
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host: host.clone(),
                port,
                insecure: self.insecure,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.clone(), port)
        };
        let info = addr
            .into_connection_info()
            .map_err(|e| e.to_string())?
            .set_redis_settings(self.node.clone());
        let primary = client::open_info(info, &self.settings).map_err(|e| e.to_string())?;
        let mut con = primary
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| format!("the primary it names, {host}:{port}, is unreachable ({e})"))?;
        let role: Vec<Value> = redis::cmd("ROLE")
            .query_async(&mut con)
            .await
            .map_err(|e| match client::is_no_permission(&e) {
                true => format!(
                    "ROLE at {host}:{port} was refused: the store's Redis user needs +role \
                     (AclRule::sentinel(true)) ({e})"
                ),
                false => format!("ROLE at {host}:{port} failed ({e})"),
            })?;
        match role.first() {
            Some(Value::BulkString(word)) if word == b"master" => Ok(con),
            _ => Err(format!(
                "the server it names, {host}:{port}, is not a primary yet (a failover in progress)"
            )),
        }
    }
}
