//! How far the sliding window counter strays from an exact count, on a
//! long seeded trace. The counter (the real code, no store) decides every
//! request; beside it the exact sliding log (the real code too) is shown
//! the same history — the requests the counter admitted — and asked what
//! it would decide. A decision is wrong when the two differ: admitted
//! although the exact count of admitted requests in the last window is
//! already at the limit, or denied although it is not. (Two limiters run
//! side by side on their own would drift apart after their first
//! difference, and every later difference would count the drift, not the
//! approximation.)
//!
//! The trace: 10,000 keys, each with its own limit per minute drawn
//! log-uniformly from 10 to 1,000; per key, Poisson arrivals at `load` ×
//! the limit, four fifths of them steady and one fifth in bursts (bursts
//! of a tenth of the limit arriving within one second, at Poisson times);
//! three simulated minutes per load level (the first minute, while the
//! windows fill, is not counted); load levels 0.5×, 0.75×, 1×, 1.25×,
//! 1.5× and 2× the limit. Seeded: the same numbers on every machine.
//!
//! Printed per load level: decisions, the share wrongly admitted, wrongly
//! denied, and the mean difference between the counter's estimate of the
//! requests in the window and the exact count, relative to the exact count
//! (over decisions where it is not zero).
//!
//! Run: `cargo run --release -p tollgate-algorithms --example accuracy`
//! (`cargo xtask accuracy` runs the same).

use std::collections::VecDeque;
use std::time::Duration;

use tollgate_algorithms::decide;
use tollgate_limiter::{Limit, State, Timestamp};

const KEYS: u64 = 10_000;
const LOADS: [f64; 6] = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0];
const WINDOW: Duration = Duration::from_secs(60);
/// Simulated time per load level, and the warm-up not counted.
const RUN_US: u64 = 3 * 60 * 1_000_000;
const WARM_US: u64 = 60 * 1_000_000;
/// The trace starts here (2026), so timestamps look like real ones.
const EPOCH_US: u64 = 1_780_000_000_000_000;
const SEED: u64 = 0x7011_6a7e;

/// SplitMix64: small, seeded, the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// An exponential gap with mean `mean_us`.
    fn gap(&mut self, mean_us: f64) -> u64 {
        (-self.unit().ln() * mean_us) as u64
    }
}

/// One key's arrivals over the run, sorted: steady Poisson traffic plus
/// bursts, `load` × `limit` per window in all.
fn arrivals(rng: &mut Rng, limit: u64, load: f64) -> Vec<u64> {
    let per_us = load * limit as f64 / WINDOW.as_micros() as f64;
    let mut out = Vec::new();
    // Steady: four fifths of the load.
    let mut t = rng.gap(1.0 / (0.8 * per_us));
    while t < RUN_US {
        out.push(t);
        t += rng.gap(1.0 / (0.8 * per_us));
    }
    // Bursts: a tenth of the limit (at least 1) within one second each, at
    // Poisson times, carrying the other fifth.
    let burst = (limit / 10).max(1);
    let bursts_per_us = 0.2 * per_us / burst as f64;
    let mut t = rng.gap(1.0 / bursts_per_us);
    while t < RUN_US {
        for _ in 0..burst {
            let at = t + rng.next() % 1_000_000;
            if at < RUN_US {
                out.push(at);
            }
        }
        t += rng.gap(1.0 / bursts_per_us);
    }
    out.sort_unstable();
    out
}

#[derive(Default)]
struct Tally {
    decisions: u64,
    wrongly_admitted: u64,
    wrongly_denied: u64,
    /// Sum of |estimate − exact| / exact, over decisions with exact > 0.
    relative_error: f64,
    compared: u64,
    /// The most requests the counter let into one window of a key, over
    /// that key's limit: the worst over-admission.
    peak: f64,
}

/// Requests the counter counted in its window before this request, from
/// its verdict (`remaining` is after the charge when admitted; a denial
/// shows at most the limit).
fn counted(limit: u64, allowed: bool, remaining: u64) -> u64 {
    if allowed {
        limit - remaining - 1
    } else {
        limit - remaining
    }
}

fn main() {
    let mut rng = Rng(SEED);
    println!(
        "sliding window counter vs exact sliding log: {KEYS} keys, limits 10-1000/min (log-uniform), \
         Poisson + bursts, {} simulated minutes per load level (first minute not counted), seed {SEED:#x}",
        RUN_US / 60_000_000
    );
    println!(
        "{:>6} {:>12} {:>16} {:>15} {:>22} {:>16}",
        "load",
        "decisions",
        "wrongly admitted",
        "wrongly denied",
        "mean count difference",
        "peak window/limit"
    );
    let mut total = Tally::default();
    for load in LOADS {
        let mut tally = Tally::default();
        for _ in 0..KEYS {
            // Log-uniform in [10, 1000].
            let limit = (10f64 * 100f64.powf(rng.unit())).round() as u64;
            let counter = Limit::sliding_window(limit, WINDOW).expect("valid");
            let log = Limit::sliding_log(limit, WINDOW).expect("valid");
            let mut counter_state: Option<State> = None;
            // The exact history: when each admitted request was counted.
            let mut admitted: VecDeque<u64> = VecDeque::new();
            let mut log_state = State::Log(VecDeque::new());
            let window_us = WINDOW.as_micros() as u64;
            for at in arrivals(&mut rng, limit, load) {
                let now = EPOCH_US + at;
                // Entries that aged out count for nothing: drop them, so
                // the exact log stays one window long.
                while admitted.front().is_some_and(|&t| t + window_us <= now) {
                    admitted.pop_front();
                }
                if let State::Log(entries) = &mut log_state {
                    entries.clone_from(&admitted);
                }
                let stamp = Timestamp::from_micros(now);
                let c = decide(&counter, counter_state.as_ref(), stamp, 1);
                let l = decide(&log, Some(&log_state), stamp, 1);
                if at >= WARM_US {
                    tally.decisions += 1;
                    match (c.verdict.allowed, l.verdict.allowed) {
                        (true, false) => tally.wrongly_admitted += 1,
                        (false, true) => tally.wrongly_denied += 1,
                        _ => {}
                    }
                    let estimate = counted(limit, c.verdict.allowed, c.verdict.remaining);
                    let exact = admitted.len() as u64;
                    if exact > 0 {
                        tally.relative_error += estimate.abs_diff(exact) as f64 / exact as f64;
                        tally.compared += 1;
                    }
                }
                if let Some(next) = c.next {
                    counter_state = Some(next.state);
                    admitted.push_back(admitted.back().map_or(now, |&t| t.max(now)));
                    if at >= WARM_US {
                        tally.peak = tally.peak.max(admitted.len() as f64 / limit as f64);
                    }
                }
            }
        }
        print_row(&format!("{load}×"), &tally);
        total.decisions += tally.decisions;
        total.wrongly_admitted += tally.wrongly_admitted;
        total.wrongly_denied += tally.wrongly_denied;
        total.relative_error += tally.relative_error;
        total.compared += tally.compared;
        total.peak = total.peak.max(tally.peak);
    }
    print_row("all", &total);
}

fn print_row(load: &str, t: &Tally) {
    let share = |n: u64| 100.0 * n as f64 / t.decisions.max(1) as f64;
    println!(
        "{load:>6} {:>12} {:>15.4}% {:>14.4}% {:>21.2}% {:>16.3}",
        t.decisions,
        share(t.wrongly_admitted),
        share(t.wrongly_denied),
        100.0 * t.relative_error / t.compared.max(1) as f64,
        t.peak
    );
}
