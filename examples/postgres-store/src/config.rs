//! `[store] kind = "postgres"` in a Tollgate configuration file (the
//! `config` feature): register [`Postgres`] and the file selects this
//! store by name, its settings read and checked with the rest of the file.
//!
//! ```toml
//! [store]
//! kind = "postgres"
//! url = "postgres://tollgate@db.internal:5432/limits"
//! table = "tollgate_state"   # optional
//! pool_size = 8              # optional
//! deadline = "250ms"         # optional
//! connect_timeout = "2s"     # optional
//! ```
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tollgate::config::{Config, StoreKinds};
//! use tollgate::SystemClock;
//! use tollgate_postgres_store::config::Postgres;
//!
//! let kinds = StoreKinds::new().with(Postgres);
//! let config = Config::from_file_with("limits.toml", &kinds)?;
//! let limiters = config.build(Arc::new(SystemClock)).await?;
//! # let _ = limiters; Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use tollgate::config::{DurationSpec, StoreKind};
use tollgate::{async_trait, Clock, Store, StoreError};

use crate::PgStore;

/// The `postgres` store kind: a [`PgStore`] from the file's `[store]`
/// section.
#[derive(Debug, Clone, Copy, Default)]
pub struct Postgres;

/// `[store]`'s fields for `kind = "postgres"`; see [`PgStore::builder`]
/// and its setters for each one's meaning and default.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSettings {
    /// The server, as [`PgStore::builder`] takes it.
    pub url: String,
    /// [`PgStoreBuilder::table`](crate::PgStoreBuilder::table).
    pub table: Option<String>,
    /// [`PgStoreBuilder::pool_size`](crate::PgStoreBuilder::pool_size).
    pub pool_size: Option<usize>,
    /// [`PgStoreBuilder::deadline`](crate::PgStoreBuilder::deadline).
    pub deadline: Option<DurationSpec>,
    /// [`PgStoreBuilder::connect_timeout`](crate::PgStoreBuilder::connect_timeout).
    pub connect_timeout: Option<DurationSpec>,
}

/// The URL is left out: it may hold a password.
impl fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("table", &self.table)
            .field("pool_size", &self.pool_size)
            .field("deadline", &self.deadline)
            .field("connect_timeout", &self.connect_timeout)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl StoreKind for Postgres {
    type Settings = PostgresSettings;

    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn open(
        &self,
        settings: &PostgresSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<dyn Store>, StoreError> {
        let mut builder = PgStore::builder(settings.url.clone()).clock(clock);
        if let Some(table) = &settings.table {
            builder = builder.table(table.clone());
        }
        if let Some(size) = settings.pool_size {
            builder = builder.pool_size(size);
        }
        if let Some(deadline) = settings.deadline {
            builder = builder.deadline(deadline.0);
        }
        if let Some(timeout) = settings.connect_timeout {
            builder = builder.connect_timeout(timeout.0);
        }
        Ok(Arc::new(builder.connect().await?))
    }
}
