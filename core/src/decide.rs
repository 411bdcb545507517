//! [`Decide`]: how a store answers [`Store::decide`], at once or later;
//! and [`ask`], a store's verdicts as one value.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::algorithm::Verdict;
use crate::error::StoreError;
use crate::store::{LayerRequest, Store};
use crate::verdicts::Verdicts;

/// A future that decides, boxed.
type Boxed<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// How a store answers [`Store::decide`]: decided already (a store that
/// keeps its state in this process), or a future that decides when
/// awaited. Either way the verdicts go into the list the caller gave.
///
/// The limiter takes [`Now`](Decide::Now) without a boxed future (an
/// in-process decision is too short to pay for one) and awaits
/// [`Later`](Decide::Later); anyone else can `.await` either.
///
/// A `Later` future does nothing until it is polled (as an `async` block
/// does): the limiter may drop one unpolled and ask the store again from
/// the future that waits for it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate_limiter::{Decide, StoreError, Verdicts};
/// let mut verdicts = Verdicts::new();
/// Decide::later(&mut verdicts, async { Ok::<_, StoreError>(Verdicts::new()) }).await?;
/// assert!(verdicts.is_empty());
/// Decide::Now(Ok(())).await?;
/// # Ok(()) }
/// ```
pub enum Decide<'a> {
    /// Decided: the verdicts were written (on `Ok`), or why not.
    Now(Result<(), StoreError>),
    /// Decides when awaited, writing the verdicts.
    Later(Boxed<'a>),
}

impl<'a> Decide<'a> {
    /// A decision to wait for: `decision`'s verdicts, written into
    /// `verdicts` when it answers them. What a store that waits on I/O
    /// answers: `Decide::later(verdicts, async move { … })`.
    pub fn later(
        verdicts: &'a mut Verdicts,
        decision: impl Future<Output = Result<Verdicts, StoreError>> + Send + 'a,
    ) -> Self {
        Decide::Later(Box::pin(async move {
            *verdicts = decision.await?;
            Ok(())
        }))
    }
}

impl fmt::Debug for Decide<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decide::Now(answer) => f.debug_tuple("Now").field(answer).finish(),
            Decide::Later(_) => f.write_str("Later(..)"),
        }
    }
}

impl<'a> IntoFuture for Decide<'a> {
    type Output = Result<(), StoreError>;
    type IntoFuture = Deciding<'a>;

    fn into_future(self) -> Deciding<'a> {
        match self {
            Decide::Now(answer) => Deciding(Inner::Now(Some(answer))),
            Decide::Later(future) => Deciding(Inner::Later(future)),
        }
    }
}

/// The future of an awaited [`Decide`].
#[must_use = "futures do nothing unless polled"]
pub struct Deciding<'a>(Inner<'a>);

enum Inner<'a> {
    /// The answer, until it is taken.
    Now(Option<Result<(), StoreError>>),
    Later(Boxed<'a>),
}

impl fmt::Debug for Deciding<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Deciding")
    }
}

impl Future for Deciding<'_> {
    type Output = Result<(), StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Inner::Now(answer) => Poll::Ready(
                answer
                    .take()
                    .expect("a `Decide` future polled after it answered"),
            ),
            Inner::Later(future) => future.as_mut().poll(cx),
        }
    }
}

/// `store`'s verdicts for `layers` ([`Store::decide`] with a list of its
/// own), checked to be one per layer: a store that answers another count
/// fails with [`StoreError::Protocol`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # use std::time::Duration;
/// use tollgate_limiter::{ask, LayerRequest, Limit, Policy, StoreKey};
/// let store = tollgate_memory::MemoryStore::default();
/// let policy = Policy::new("api", Limit::token_bucket(5, 5, Duration::from_secs(1))?)?;
/// let key = StoreKey::new("api", &policy, "subject", "client-7");
/// let verdicts = ask(&store, &[LayerRequest { key, policy: &policy, cost: 1 }]).await?;
/// assert_eq!(verdicts[0].remaining, 4);
/// # Ok(()) }
/// ```
pub async fn ask(store: &dyn Store, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
    let mut verdicts = Verdicts::new();
    store.decide(layers, &mut verdicts).await?;
    one_each(&verdicts, layers.len())?;
    Ok(verdicts)
}

/// A protocol error unless there is one verdict per layer.
#[inline]
pub(crate) fn one_each(verdicts: &[Verdict], layers: usize) -> Result<(), StoreError> {
    if verdicts.len() != layers {
        return Err(StoreError::Protocol(format!(
            "{} verdicts for {} layers",
            verdicts.len(),
            layers
        )));
    }
    Ok(())
}
