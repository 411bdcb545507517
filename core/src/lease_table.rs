//! What a process holds of its leased layers' keys, and how hot each key
//! is: the bookkeeping behind [`LeasedStore`](crate::leased_store::LeasedStore),
//! without I/O (every method runs under its lock).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::time::Duration;

use foldhash::fast::FixedState;

use crate::algorithm::Verdict;
use crate::lease::{Lease, LeaseKind};
use crate::store::{LayerRequest, OwnedLayer};
use crate::time::duration_micros;

/// Most keys holding a batch at once: a hot key beyond them is decided by
/// one store call per request, so memory stays bounded.
pub(crate) const MAX_LEASED_KEYS: usize = 4_096;

/// Counters of the units asked of each key (by hash, collisions adding
/// up: a key can only look hotter than it is).
const HEAT_SLOTS: usize = 4_096;

/// How a request's leased layer is decided.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    /// Not leased (or not now): the store decides it at its cost.
    Forward,
    /// Admitted from the batch this process holds (its cost taken), with
    /// this verdict.
    Local(Verdict),
    /// The store charges a batch of this many units (≥ the cost); what the
    /// request does not use is held.
    Batch(u64),
}

/// A key's batch: units charged in the store and not yet admitted.
#[derive(Debug)]
struct Held {
    /// The key, to give units back and to tell keys of one hash apart.
    layer: OwnedLayer,
    rendered: Box<str>,
    units: u64,
    /// When the lease ends (the limiter's clock, µs).
    ends: u64,
    /// Until when no batch is asked for (µs): the limit had no room for
    /// the last one, and said when it would.
    no_batch_until: u64,
    /// A batch is being charged for this key: other requests do not ask
    /// for one too (they go to the store at their cost).
    refilling: bool,
    /// The store's answer when the batch was charged.
    limit: u64,
    remaining: u64,
    /// When the store said the layer resets (the limiter's clock, µs).
    reset_at: u64,
}

/// Units to give back to the store (a token bucket's or GCRA's).
#[derive(Debug)]
pub(crate) struct Unused {
    pub(crate) layer: OwnedLayer,
    pub(crate) units: u64,
}

/// The lease table of one limiter.
#[derive(Debug)]
pub(crate) struct LeaseTable {
    held: HashMap<u64, Held>,
    heat: Heat,
    hasher: FixedState,
}

impl LeaseTable {
    /// A table whose heat is counted over `period` (the shortest lease).
    pub(crate) fn new(period: Duration) -> Self {
        LeaseTable {
            held: HashMap::new(),
            heat: Heat::new(duration_micros(period)),
            hasher: FixedState::default(),
        }
    }

    fn hash(&self, request: &LayerRequest<'_>) -> u64 {
        self.hasher.hash_one(request.key)
    }

    /// The batch `request` can be admitted from at `now`, if any: its
    /// entry holds the cost and its lease has not ended.
    fn covering(&mut self, hash: u64, request: &LayerRequest<'_>, now: u64) -> Option<&mut Held> {
        let held = self.held.get_mut(&hash)?;
        let usable = held.units >= request.cost && now < held.ends;
        (usable && request.key.matches(&held.rendered)).then_some(held)
    }

    /// Admit every request from its batch at `now`, writing one verdict
    /// each, if every one is leased and covered; otherwise take nothing
    /// and answer `false`.
    pub(crate) fn admit_all(
        &mut self,
        requests: &[LayerRequest<'_>],
        now: u64,
        verdicts: &mut crate::verdicts::Verdicts,
    ) -> bool {
        let hashes: smallvec::SmallVec<[u64; 4]> = requests.iter().map(|r| self.hash(r)).collect();
        let all_covered = requests
            .iter()
            .zip(&hashes)
            .all(|(r, &h)| r.policy.lease().is_some() && self.covering(h, r, now).is_some());
        if !all_covered || has_repeated(&hashes) {
            return false;
        }
        for (request, &hash) in requests.iter().zip(&hashes) {
            self.heat.add(hash, request.cost, now);
            let held = self.covering(hash, request, now).expect("covered above");
            held.units -= request.cost;
            verdicts.push(held.verdict(now));
        }
        true
    }

    /// How each request is decided at `now`: leased layers admitted from
    /// their batch, or charged a batch when their key is hot; expired
    /// batches a token bucket or GCRA did not use go to `unused`.
    pub(crate) fn plan(
        &mut self,
        requests: &[LayerRequest<'_>],
        now: u64,
        unused: &mut Vec<Unused>,
    ) -> smallvec::SmallVec<[Step; 4]> {
        requests
            .iter()
            .map(|request| match request.policy.lease() {
                None => Step::Forward,
                Some(lease) => self.step(request, lease, now, unused),
            })
            .collect()
    }

    fn step(
        &mut self,
        request: &LayerRequest<'_>,
        lease: &Lease,
        now: u64,
        unused: &mut Vec<Unused>,
    ) -> Step {
        let hash = self.hash(request);
        let heat = self.heat.add(hash, request.cost, now);
        if let Some(held) = self.covering(hash, request, now) {
            held.units -= request.cost;
            return Step::Local(held.verdict(now));
        }
        // What the batch holds cannot cover this request: it ends.
        if self
            .held
            .get(&hash)
            .is_some_and(|h| request.key.matches(&h.rendered))
        {
            self.end(hash, unused);
        }
        // Units a quarter of a lease uses, at the rate of the heat's period.
        let per_lease = heat.saturating_mul(duration_micros(lease.duration())) / self.heat.period;
        let wanted = per_lease / 4;
        if wanted < request.cost.saturating_mul(2) {
            return Step::Forward;
        }
        let ceiling = lease.batch_ceiling(request.policy.limit());
        let full = self.held.len() >= MAX_LEASED_KEYS;
        let held = match self.held.get_mut(&hash) {
            Some(held) if !request.key.matches(&held.rendered) => return Step::Forward,
            Some(held) => held,
            None if full => return Step::Forward,
            None => self.held.entry(hash).or_insert(Held::new(request)),
        };
        let batch = wanted.min(ceiling);
        if held.refilling || now < held.no_batch_until || batch <= request.cost {
            return Step::Forward;
        }
        held.refilling = true;
        Step::Batch(batch)
    }

    /// End the lease of `hash`: its units, when a token bucket's or
    /// GCRA's, to `unused` (a window's end with their window: a batch is
    /// never carried into another lease, which might be another window's).
    fn end(&mut self, hash: u64, unused: &mut Vec<Unused>) {
        let Some(held) = self.held.get_mut(&hash) else {
            return;
        };
        let units = std::mem::take(&mut held.units);
        if units > 0 && LeaseKind::of(held.layer.policy().limit()) == Some(LeaseKind::Refills) {
            unused.push(Unused {
                layer: OwnedLayer::of(&held.layer.request(units)),
                units,
            });
        }
    }

    /// The store admitted `request` with `batch` units charged (`sent`:
    /// when the call left, the limiter's clock): hold what the request does
    /// not use, and answer the verdict the request reports.
    pub(crate) fn charged(
        &mut self,
        request: &LayerRequest<'_>,
        batch: u64,
        sent: u64,
        verdict: &Verdict,
    ) -> Verdict {
        let hash = self.hash(request);
        let lease = request.policy.lease().copied().unwrap_or_default();
        let Some(held) = self.held.get_mut(&hash) else {
            return *verdict;
        };
        held.refilling = false;
        let reset = duration_micros(verdict.reset_after);
        let mut ends = sent.saturating_add(duration_micros(lease.duration()));
        if let Some(LeaseKind::Window { before_reset }) = LeaseKind::of(request.policy.limit()) {
            let window_end = sent + reset.saturating_sub(duration_micros(before_reset));
            ends = ends.min(window_end);
        }
        held.units = batch - request.cost;
        held.ends = ends;
        held.limit = verdict.limit;
        held.remaining = verdict.remaining;
        held.reset_at = sent.saturating_add(reset);
        Verdict {
            remaining: verdict.remaining.saturating_add(held.units),
            ..*verdict
        }
    }

    /// A batch for `request` was not charged: denied (`fits_after`: when
    /// the store says it would fit; no batch is asked for until then, the
    /// key's requests going to the store at their cost), failed, or given
    /// up (`None`).
    pub(crate) fn not_charged(&mut self, request: &LayerRequest<'_>, fits_after: Option<u64>) {
        let hash = self.hash(request);
        if let Some(held) = self.held.get_mut(&hash) {
            held.refilling = false;
            if let Some(at) = fits_after {
                held.no_batch_until = at;
            }
        }
    }

    /// Give `request`'s cost back to its batch (the request was not
    /// admitted after all).
    pub(crate) fn untake(&mut self, request: &LayerRequest<'_>) {
        let hash = self.hash(request);
        if let Some(held) = self.held.get_mut(&hash) {
            held.units += request.cost;
        }
    }

    /// Forget the batches of `requests` (their keys were reset or
    /// adjusted in the store: what this process held no longer stands).
    pub(crate) fn forget(&mut self, requests: &[LayerRequest<'_>]) {
        for request in requests {
            let hash = self.hash(request);
            if self
                .held
                .get(&hash)
                .is_some_and(|h| request.key.matches(&h.rendered))
            {
                self.held.remove(&hash);
            }
        }
    }

    /// End every lease that is over at `now` — or every lease, with
    /// `all` — and drop entries with nothing held and nothing pending:
    /// the units to give back.
    pub(crate) fn sweep(&mut self, now: u64, all: bool) -> Vec<Unused> {
        let mut unused = Vec::new();
        let over: Vec<u64> = (self.held.iter())
            .filter(|(_, h)| all || now >= h.ends)
            .map(|(&hash, _)| hash)
            .collect();
        for hash in over {
            self.end(hash, &mut unused);
        }
        self.held
            .retain(|_, h| h.refilling || (h.units > 0 && now < h.ends));
        unused
    }
}

impl Held {
    fn new(request: &LayerRequest<'_>) -> Self {
        Held {
            layer: OwnedLayer::of(request),
            rendered: request.key.render().into(),
            units: 0,
            ends: 0,
            no_batch_until: 0,
            refilling: false,
            limit: request.policy.capacity(),
            remaining: 0,
            reset_at: 0,
        }
    }

    /// The verdict of a request just admitted from this batch at `now`:
    /// the store's remaining when it was charged plus what the batch still
    /// holds, its reset counted down.
    fn verdict(&self, now: u64) -> Verdict {
        Verdict {
            allowed: true,
            limit: self.limit,
            remaining: self.remaining.saturating_add(self.units),
            reset_after: Duration::from_micros(self.reset_at.saturating_sub(now)),
            retry_after: None,
        }
    }
}

/// Whether two requests name keys of one hash (then they are not admitted
/// locally: taking twice from one entry needs care no real request needs).
fn has_repeated(hashes: &[u64]) -> bool {
    hashes
        .iter()
        .enumerate()
        .any(|(i, h)| hashes[..i].contains(h))
}

/// Units asked of each key in the current and the previous period.
#[derive(Debug)]
struct Heat {
    current: Box<[u64]>,
    previous: Box<[u64]>,
    /// When the current period started (µs, the limiter's clock).
    started: u64,
    period: u64,
}

impl Heat {
    fn new(period: u64) -> Self {
        Heat {
            current: vec![0; HEAT_SLOTS].into(),
            previous: vec![0; HEAT_SLOTS].into(),
            started: 0,
            period: period.max(1),
        }
    }

    /// Count `units` asked of `hash` at `now`: the key's heat, the more of
    /// this period's count and the last full period's.
    fn add(&mut self, hash: u64, units: u64, now: u64) -> u64 {
        if now >= self.started.saturating_add(self.period) {
            let consecutive = now < self.started.saturating_add(2 * self.period);
            std::mem::swap(&mut self.current, &mut self.previous);
            self.current.fill(0);
            if !consecutive {
                self.previous.fill(0);
            }
            self.started = now;
        }
        let slot = (hash % HEAT_SLOTS as u64) as usize;
        self.current[slot] = self.current[slot].saturating_add(units);
        self.current[slot].max(self.previous[slot])
    }
}
