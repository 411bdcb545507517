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
    /// Admitted from the batch this process holds (its cost taken from
    /// the lease numbered `lease`), with this verdict.
    Local { verdict: Verdict, lease: u64 },
    /// The store charges a batch of this many units (≥ the cost); what the
    /// request does not use is held, if the key is still at lease number
    /// `lease` when the answer comes (not reset, blocked or ended since).
    Batch { units: u64, lease: u64 },
}

/// A key's batch: units charged in the store and not yet admitted.
#[derive(Debug)]
struct Held {
    /// The key, to give units back and to tell keys of one hash apart.
    layer: OwnedLayer,
    rendered: Box<str>,
    /// Which lease the units belong to: a number never used before in this
    /// table, changed whenever a lease ends or starts, so a late take given
    /// back or a batch charged before a reset never lands in another lease.
    lease: u64,
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
    /// When a request last took from the batch, or it was charged (µs): a
    /// window's lease idle for a lease's duration makes room when the
    /// table is full.
    last_take: u64,
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
    /// The next lease number.
    next_lease: u64,
}

impl LeaseTable {
    /// A table whose heat is counted over `period` (the shortest lease).
    pub(crate) fn new(period: Duration) -> Self {
        LeaseTable {
            held: HashMap::new(),
            heat: Heat::new(duration_micros(period)),
            hasher: FixedState::default(),
            next_lease: 1,
        }
    }

    fn hash(&self, request: &LayerRequest<'_>) -> u64 {
        self.hasher.hash_one(request.key)
    }

    fn new_lease(&mut self) -> u64 {
        self.next_lease += 1;
        self.next_lease
    }

    /// `request`'s entry (of its key, not another of the same hash).
    fn entry(&mut self, hash: u64, request: &LayerRequest<'_>) -> Option<&mut Held> {
        let held = self.held.get_mut(&hash)?;
        request.key.matches(&held.rendered).then_some(held)
    }

    /// The batch `request` can be admitted from at `now`, if any: its
    /// entry holds the cost, its lease has not ended, and it was charged
    /// under the same limit (a plan change ends it).
    fn covering(&mut self, hash: u64, request: &LayerRequest<'_>, now: u64) -> Option<&mut Held> {
        self.live(hash, request, now)
            .filter(|held| held.units >= request.cost)
    }

    /// `request`'s batch at `now`, if its lease has not ended and it was
    /// charged under the same limit (whatever it still holds).
    fn live(&mut self, hash: u64, request: &LayerRequest<'_>, now: u64) -> Option<&mut Held> {
        let held = self.entry(hash, request)?;
        let same_limit = held.layer.policy().limit() == request.policy.limit();
        (now < held.ends && same_limit).then_some(held)
    }

    /// Add to each of a peek's `verdicts` what its layer's live batch
    /// still holds at `now`: the store counts a batch as used, but its
    /// units are this process's to admit (as an admission from it
    /// reports), and a batch that covers the cost admits.
    pub(crate) fn add_held(
        &mut self,
        requests: &[LayerRequest<'_>],
        now: u64,
        verdicts: &mut [Verdict],
    ) {
        for (request, verdict) in requests.iter().zip(verdicts) {
            let hash = self.hash(request);
            let Some(held) = self.live(hash, request, now) else {
                continue;
            };
            verdict.remaining = verdict
                .remaining
                .saturating_add(held.units)
                .min(verdict.limit);
            if !verdict.allowed && held.units >= request.cost {
                verdict.allowed = true;
                verdict.retry_after = None;
            }
        }
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
            held.last_take = now;
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
            held.last_take = now;
            let verdict = held.verdict(now);
            return Step::Local {
                verdict,
                lease: held.lease,
            };
        }
        if self.held_under_another_limit(hash, request, now) {
            return Step::Forward;
        }
        // What the batch holds cannot cover this request: it ends.
        self.end(hash, request, unused);
        // A quarter of the units asked in the heat's period (the shortest
        // lease): hot when that is at least twice the cost.
        let wanted = heat / 4;
        if wanted < request.cost.saturating_mul(2) {
            return Step::Forward;
        }
        if self.held.len() >= MAX_LEASED_KEYS && !self.held.contains_key(&hash) {
            unused.extend(self.sweep(now, false));
            if self.held.len() >= MAX_LEASED_KEYS {
                self.end_idle_windows(now);
            }
        }
        let full = self.held.len() >= MAX_LEASED_KEYS;
        let lease_number = self.new_lease();
        let held = match self.held.get_mut(&hash) {
            Some(held) if !request.key.matches(&held.rendered) => return Step::Forward,
            Some(held) => held,
            None if full => return Step::Forward,
            None => self
                .held
                .entry(hash)
                .or_insert(Held::new(request, lease_number)),
        };
        let batch = wanted.min(lease.batch_ceiling(request.policy.limit()));
        if held.refilling || now < held.no_batch_until || batch <= request.cost {
            return Step::Forward;
        }
        if held.layer.policy() != request.policy {
            // A plan changed the limit: the next lease is under the new one.
            held.layer = OwnedLayer::of(request);
        }
        held.refilling = true;
        Step::Batch {
            units: batch,
            lease: held.lease,
        }
    }

    /// Whether `request`'s key holds a batch charged under another limit
    /// (another plan's, on a key plans share) that is still in use at
    /// `now`: taken from within a lease's duration, or being charged.
    /// Ending it would throw its units away (a window's cannot be given
    /// back), and two plans taking turns on one key would end each
    /// other's batches on every switch, so the request goes to the store
    /// instead. A batch nobody took from for a lease (its plan no longer
    /// used: a customer upgraded) ends, and the next is the new limit's.
    fn held_under_another_limit(
        &mut self,
        hash: u64,
        request: &LayerRequest<'_>,
        now: u64,
    ) -> bool {
        let Some(held) = self.entry(hash, request) else {
            return false;
        };
        if held.layer.policy().limit() == request.policy.limit() {
            return false;
        }
        held.refilling || (now < held.ends && !held.idle_at(now))
    }

    /// End the lease of `hash`: its units, when a token bucket's or
    /// GCRA's, to `unused` (a window's end with their window: a batch is
    /// never carried into another lease, which might be another window's).
    fn end(&mut self, hash: u64, request: &LayerRequest<'_>, unused: &mut Vec<Unused>) {
        let lease_number = self.new_lease();
        // A batch being charged is the next lease: nothing to end.
        let Some(held) = self.entry(hash, request).filter(|h| !h.refilling) else {
            return;
        };
        held.lease = lease_number;
        held.end(unused);
    }

    /// The store admitted `request` with `batch` units charged for lease
    /// number `lease` (`sent`: when the call left, the limiter's clock):
    /// hold what the request does not use — unless the key was reset,
    /// blocked or ended since, when the batch is not held (units charged
    /// and never admitted: fewer admissions, never more) — and answer the
    /// verdict the request reports.
    pub(crate) fn charged(
        &mut self,
        request: &LayerRequest<'_>,
        (batch, lease): (u64, u64),
        sent: u64,
        verdict: &Verdict,
    ) -> Verdict {
        let hash = self.hash(request);
        let next = self.new_lease();
        let Some(held) = self.entry(hash, request).filter(|h| h.lease == lease) else {
            return *verdict;
        };
        held.refilling = false;
        held.lease = next;
        let reset = duration_micros(verdict.reset_after);
        let duration = request
            .policy
            .lease()
            .map_or(0, |l| duration_micros(l.duration()));
        // A window's units cannot be given back (a give-back arriving after
        // its window ended would count in the next one): its lease holds
        // them until the window ends, so none is lost while it lasts. A
        // lease of a limit that refills ends after its duration, and gives
        // back what it did not use.
        let ends = match LeaseKind::of(request.policy.limit()) {
            Some(LeaseKind::Window { before_reset }) => {
                sent.saturating_add(reset.saturating_sub(duration_micros(before_reset)))
            }
            _ => sent.saturating_add(duration),
        };
        held.units = batch - request.cost;
        held.ends = ends;
        held.last_take = sent;
        held.limit = verdict.limit;
        held.remaining = verdict.remaining;
        held.reset_at = sent.saturating_add(reset);
        crate::observe::lease_batch(request.policy.name(), batch);
        Verdict {
            remaining: verdict.remaining.saturating_add(held.units),
            ..*verdict
        }
    }

    /// A batch for `request`'s lease number `lease` was not charged:
    /// denied (`fits_after`: when the store says it would fit; no batch is
    /// asked for until then, the key's requests going to the store at
    /// their cost), failed, or given up (`None`).
    pub(crate) fn not_charged(
        &mut self,
        request: &LayerRequest<'_>,
        lease: u64,
        fits_after: Option<u64>,
    ) {
        let hash = self.hash(request);
        if let Some(held) = self.entry(hash, request).filter(|h| h.lease == lease) {
            held.refilling = false;
            if let Some(at) = fits_after {
                held.no_batch_until = at;
            }
        }
    }

    /// Give `request`'s cost back to lease number `lease` (the request was
    /// not admitted after all), if the key still holds that lease.
    pub(crate) fn untake(&mut self, request: &LayerRequest<'_>, lease: u64) {
        let hash = self.hash(request);
        if let Some(held) = self.entry(hash, request).filter(|h| h.lease == lease) {
            held.units = held.units.saturating_add(request.cost);
        }
    }

    /// Forget the batches of `requests` (their keys were reset or
    /// blocked in the store: what this process held no longer stands). A
    /// batch being charged meanwhile is not held when it is.
    pub(crate) fn forget(&mut self, requests: &[LayerRequest<'_>]) {
        for request in requests {
            let hash = self.hash(request);
            if self.entry(hash, request).is_some() {
                self.held.remove(&hash);
            }
        }
    }

    /// Make room in a full table: end the window leases nobody took from
    /// for a lease's duration (their units, which cannot be given back,
    /// are lost: under-admission, as before leases held them to their
    /// window's end), and drop their entries.
    fn end_idle_windows(&mut self, now: u64) {
        self.held.retain(|_, h| {
            let window = matches!(
                LeaseKind::of(h.layer.policy().limit()),
                Some(LeaseKind::Window { .. })
            );
            h.refilling || !window || !h.idle_at(now)
        });
    }

    /// End every lease that is over at `now` — or every lease, with
    /// `all` — and drop entries with nothing held, nothing pending and no
    /// wait for a batch: the units to give back.
    pub(crate) fn sweep(&mut self, now: u64, all: bool) -> Vec<Unused> {
        let mut unused = Vec::new();
        for held in self.held.values_mut() {
            // A batch being charged is the next lease: nothing to end.
            if !held.refilling && (all || now >= held.ends) {
                self.next_lease += 1;
                held.lease = self.next_lease;
                held.end(&mut unused);
            }
        }
        self.held
            .retain(|_, h| h.refilling || now < h.no_batch_until || (h.units > 0 && now < h.ends));
        unused
    }
}

impl Held {
    fn new(request: &LayerRequest<'_>, lease: u64) -> Self {
        Held {
            layer: OwnedLayer::of(request),
            rendered: request.key.render().into(),
            lease,
            units: 0,
            ends: 0,
            no_batch_until: 0,
            refilling: false,
            limit: request.policy.capacity(),
            remaining: 0,
            reset_at: 0,
            last_take: 0,
        }
    }

    /// Whether nobody took from this batch for a lease's duration by `now`.
    fn idle_at(&self, now: u64) -> bool {
        let lease = self.layer.policy().lease();
        let idle_after = lease.map_or(0, |l| duration_micros(l.duration()));
        now >= self.last_take.saturating_add(idle_after)
    }

    /// End this lease: its units, when a token bucket's or GCRA's, to
    /// `unused` (a window's end with their window).
    fn end(&mut self, unused: &mut Vec<Unused>) {
        let units = std::mem::take(&mut self.units);
        if units > 0 && LeaseKind::of(self.layer.policy().limit()) == Some(LeaseKind::Refills) {
            unused.push(Unused {
                layer: self.layer.clone(),
                units,
            });
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
