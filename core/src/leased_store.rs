//! The store a limiter with leased layers decides through: hot keys of
//! leased layers are admitted from batches already charged in the store
//! it wraps, everything else goes to that store as before (see [`Lease`](crate::Lease)).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use smallvec::SmallVec;

use crate::adjustment::Adjustment;
use crate::decide::Decide;
use crate::error::StoreError;
use crate::hold::{Hold, Holds};
use crate::lease_table::{LeaseTable, Step, Unused};
use crate::store::{LayerRequest, Store};
use crate::time::{duration_micros, Clock};
use crate::verdicts::Verdicts;

/// A store wrapped so that leased layers' hot keys decide from batches.
#[derive(Debug)]
pub(crate) struct LeasedStore {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    table: Mutex<LeaseTable>,
    /// How often ended leases are looked for (half the shortest lease).
    sweep_every: Duration,
    /// Itself, for the sweeping task (which must not keep it alive).
    this: Weak<LeasedStore>,
    /// Whether the sweeping task runs.
    sweeping: std::sync::atomic::AtomicBool,
}

impl LeasedStore {
    /// `inner` with leases whose shortest duration is `shortest`.
    pub(crate) fn new(
        inner: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        shortest: Duration,
    ) -> Arc<Self> {
        let leased = Arc::new_cyclic(|this| LeasedStore {
            inner,
            clock,
            table: Mutex::new(LeaseTable::new(shortest)),
            sweep_every: shortest / 2,
            this: this.clone(),
            sweeping: Default::default(),
        });
        let mut all = every_leased_store();
        all.retain(|s| s.strong_count() > 0);
        all.push(Arc::downgrade(&leased));
        drop(all);
        leased
    }

    /// Forget `layers`' batches in this limiter's table and in those of
    /// every other limiter of this process on the same store: a block or a
    /// reset through one route's limiter must stop the batches another
    /// route's limiter took for the same keys.
    fn forget_everywhere(&self, layers: &[LayerRequest<'_>]) {
        // This store is among them: every one registers when it is made.
        let on_this_store: Vec<Arc<LeasedStore>> = every_leased_store()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|s| Arc::ptr_eq(&s.inner, &self.inner))
            .collect();
        for leased in on_this_store {
            leased.table().forget(layers);
        }
    }

    /// A decision the batches could not give: through the store (a
    /// leased layer may take a new batch on the way).
    async fn decide_through(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        self.start_sweeping();
        let sent = self.now();
        let mut unused = Vec::new();
        let steps = self.table().plan(layers, sent, &mut unused);
        self.return_later(unused);
        let mut pending = Pending {
            store: self,
            layers,
            steps,
            settled: false,
        };
        let mut answer = self.call(layers, &pending.steps).await;
        if pending.batches_denied(&answer, sent) {
            // The limit has no room for a batch: the request alone.
            answer = self.call(layers, &pending.steps).await;
        }
        pending.settle(answer, sent)
    }

    fn table(&self) -> MutexGuard<'_, LeaseTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> u64 {
        self.clock.now().as_micros()
    }

    /// Give back every batch's unused units now and wait for the store
    /// (a shutdown, a reload).
    pub(crate) async fn return_all(&self) {
        let unused = self.table().sweep(self.now(), true);
        give_back(&*self.inner, unused).await;
    }

    /// Give back what ended leases did not use, in the background.
    fn return_later(&self, unused: Vec<Unused>) {
        if unused.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let inner = Arc::clone(&self.inner);
            runtime.spawn(async move { give_back(&*inner, unused).await });
        }
    }

    /// Start the task that ends leases nobody uses any more, once, on the
    /// current runtime.
    fn start_sweeping(&self) {
        use std::sync::atomic::Ordering;
        if self.sweeping.load(Ordering::Relaxed) {
            return;
        }
        // Without a runtime, the next decision tries again.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.sweeping.swap(true, Ordering::AcqRel) {
            let claim = Sweeping(self.this.clone());
            runtime.spawn(sweep_while_alive(claim, self.sweep_every));
        }
    }

    /// Decide `requests` as `steps` say: leased layers admitted from their
    /// batch are left out of the store's call, hot ones ask for a batch.
    async fn call(
        &self,
        requests: &[LayerRequest<'_>],
        steps: &[Step],
    ) -> Result<Verdicts, StoreError> {
        let sent: SmallVec<[LayerRequest<'_>; 4]> = requests
            .iter()
            .zip(steps)
            .filter_map(|(r, step)| match step {
                Step::Local { .. } => None,
                Step::Forward => Some(*r),
                Step::Batch { units, .. } => Some(LayerRequest { cost: *units, ..*r }),
            })
            .collect();
        if sent.is_empty() {
            return Ok(Verdicts::new());
        }
        crate::decide::ask(&*self.inner, &sent).await
    }
}

#[async_trait]
impl Store for LeasedStore {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    /// At once when every layer is leased and admitted from its batch;
    /// else through the store.
    fn decide<'a>(
        &'a self,
        layers: &'a [LayerRequest<'a>],
        verdicts: &'a mut Verdicts,
    ) -> Decide<'a> {
        let leased = layers.iter().all(|l| l.policy.lease().is_some());
        if leased && self.table().admit_all(layers, self.now(), verdicts) {
            return Decide::Now(Ok(()));
        }
        Decide::later(verdicts, self.decide_through(layers))
    }

    /// The store's answer, with what this process's batches still hold
    /// added (as `check` reports it when it admits from them).
    async fn peek(&self, layers: &[LayerRequest<'_>]) -> Result<Verdicts, StoreError> {
        let mut verdicts = self.inner.peek(layers).await?;
        self.table().add_held(layers, self.now(), &mut verdicts);
        Ok(verdicts)
    }

    async fn reset(&self, layers: &[LayerRequest<'_>]) -> Result<(), StoreError> {
        // Before (no batch admits meanwhile) and after (none charged
        // meanwhile is held).
        self.forget_everywhere(layers);
        let answer = self.inner.reset(layers).await;
        self.forget_everywhere(layers);
        answer
    }

    async fn adjust(
        &self,
        layers: &[LayerRequest<'_>],
        adjustment: Adjustment,
    ) -> Result<Verdicts, StoreError> {
        // A block must stop this process's batches too; a penalty or a
        // reward changes what the store holds, not what was charged.
        let block = matches!(adjustment, Adjustment::Block(_));
        if block {
            self.forget_everywhere(layers);
        }
        let answer = self.inner.adjust(layers, adjustment).await;
        if block {
            self.forget_everywhere(layers);
        }
        answer
    }

    async fn acquire(&self, layers: &[LayerRequest<'_>]) -> Result<(Verdicts, Holds), StoreError> {
        self.inner.acquire(layers).await
    }

    async fn release(&self, layers: &[LayerRequest<'_>], holds: &[Hold]) -> Result<(), StoreError> {
        self.inner.release(layers, holds).await
    }

    async fn renew(
        &self,
        layers: &[LayerRequest<'_>],
        holds: &[Hold],
    ) -> Result<Holds, StoreError> {
        self.inner.renew(layers, holds).await
    }
}

impl Drop for LeasedStore {
    /// A dropped limiter (a reload, a shutdown) gives back what it held.
    fn drop(&mut self) {
        let unused = self.table().sweep(self.now(), true);
        self.return_later(unused);
    }
}

/// A decision in flight: what its plan took from batches and which
/// batches it is charging, undone if it ends without an answer (denied,
/// failed, or its future dropped).
struct Pending<'s, 'r> {
    store: &'s LeasedStore,
    layers: &'r [LayerRequest<'r>],
    steps: SmallVec<[Step; 4]>,
    settled: bool,
}

impl Pending<'_, '_> {
    /// The layers the store was asked about, each with its verdict.
    fn sent(&self, verdicts: &Verdicts) -> SmallVec<[(usize, crate::Verdict); 4]> {
        let sent = (0..self.layers.len()).filter(|&i| !matches!(self.steps[i], Step::Local { .. }));
        sent.zip(verdicts.iter().copied()).collect()
    }

    /// When the store denied a batch larger than its request's cost: ask
    /// for none, each batch's key going without one until the store says
    /// it would fit. `true` when it did (the request is decided again).
    fn batches_denied(&mut self, answer: &Result<Verdicts, StoreError>, sent: u64) -> bool {
        let Ok(verdicts) = answer else { return false };
        let asked = self.sent(verdicts);
        let denied_batch = |&(i, v): &(usize, crate::Verdict)| {
            !v.allowed
                && matches!(self.steps[i], Step::Batch { units, .. } if units > self.layers[i].cost)
        };
        if !asked.iter().any(denied_batch) {
            return false;
        }
        let mut table = self.store.table();
        for (i, verdict) in asked {
            if let Step::Batch { lease, .. } = self.steps[i] {
                // At most one lease: a window's retry is its end (hours,
                // a month), and the table keeps a key while it waits, so
                // keys near their limit would fill it and leave no room
                // for hot ones. Asking again after a lease costs one call.
                let most = self.layers[i]
                    .policy
                    .lease()
                    .map_or(0, |l| duration_micros(l.duration()));
                let wait = duration_micros(verdict.retry_after.unwrap_or_default()).min(most);
                table.not_charged(&self.layers[i], lease, Some(sent.saturating_add(wait)));
                self.steps[i] = Step::Forward;
            }
        }
        true
    }

    /// The request's verdicts from the store's `answer` (for the layers it
    /// was asked about) and the batches (for the others).
    fn settle(
        mut self,
        answer: Result<Verdicts, StoreError>,
        sent: u64,
    ) -> Result<Verdicts, StoreError> {
        let verdicts = answer?;
        let admitted = verdicts.iter().all(|v| v.allowed);
        let merged = self.merged(&verdicts, admitted, sent);
        // A denied request is dropped unsettled: its batches given up, the
        // units it took given back (nothing was charged).
        self.settled = admitted;
        Ok(merged)
    }

    /// One verdict per layer: the store's, in order, for the layers sent;
    /// a batch's for the layers admitted from one; batches charged held
    /// when `admitted`.
    fn merged(&self, verdicts: &Verdicts, admitted: bool, sent: u64) -> Verdicts {
        let mut table = self.store.table();
        let mut answers = verdicts.iter();
        let mut merged = Verdicts::new();
        for (request, step) in self.layers.iter().zip(&self.steps) {
            let verdict = match step {
                // Denied by another layer: its take is given back.
                Step::Local { verdict, .. } if !admitted => verdict.uncharged(request.cost),
                Step::Local { verdict, .. } => *verdict,
                Step::Forward => *answers.next().expect("one verdict per layer sent"),
                Step::Batch { units, lease } => {
                    let verdict = answers.next().expect("one verdict per layer sent");
                    match admitted {
                        true => table.charged(request, (*units, *lease), sent, verdict),
                        false => *verdict,
                    }
                }
            };
            merged.push(verdict);
        }
        merged
    }
}

impl Drop for Pending<'_, '_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut table = self.store.table();
        for (request, step) in self.layers.iter().zip(&self.steps) {
            match step {
                Step::Local { lease, .. } => table.untake(request, *lease),
                Step::Batch { lease, .. } => table.not_charged(request, *lease, None),
                Step::Forward => {}
            }
        }
    }
}

/// Give `unused` units back to `store`, each a reward on its key. A
/// failed give-back loses the units (under-admission, never more).
async fn give_back(store: &dyn Store, unused: Vec<Unused>) {
    for u in unused {
        let layers = [u.layer.request(u.units)];
        if store.adjust(&layers, Adjustment::Reward).await.is_ok() {
            crate::observe::lease_returned(u.layer.policy().name(), u.units);
        }
    }
}

/// Every leased store of the process (one per limiter with leased
/// layers), so that a block or a reset reaches the batches of each
/// ([`LeasedStore::forget_everywhere`]). Dead ones are dropped when a new
/// one is made.
fn every_leased_store() -> MutexGuard<'static, Vec<Weak<LeasedStore>>> {
    static ALL: Mutex<Vec<Weak<LeasedStore>>> = Mutex::new(Vec::new());
    ALL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The sweeping task's hold on its store's `sweeping` flag. However the
/// task ends — never run (its runtime had shut down), dropped with its
/// runtime — the flag is cleared, so the store's next decision starts
/// another instead of leaving quiet leases' units out for good.
struct Sweeping(Weak<LeasedStore>);

impl Drop for Sweeping {
    fn drop(&mut self) {
        if let Some(store) = self.0.upgrade() {
            store
                .sweeping
                .store(false, std::sync::atomic::Ordering::Release);
        }
    }
}

/// End ended leases every `every` while the store lives.
async fn sweep_while_alive(claim: Sweeping, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(store) = claim.0.upgrade() else {
            return;
        };
        let unused = store.table().sweep(store.now(), false);
        give_back(&*store.inner, unused).await;
    }
}
