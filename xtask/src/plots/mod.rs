//! `cargo xtask plots [--check]`: the figures of docs/algorithms.md, drawn
//! from the reference algorithms themselves (`tollgate-algorithms`, a
//! simulated clock, no store) into `docs/img/`. With `--check` (CI) the
//! files are regenerated in memory and compared byte for byte with the
//! checked-in ones, so a figure cannot drift from the code.

pub(crate) mod svg;

use std::collections::HashMap;
use std::time::Duration;

use tollgate_algorithms::{decide, decide_layers};
use tollgate_limiter::{LayerRequest, Limit, Policy, State, StoreKey, Timestamp, Verdict};

use crate::generated::write_or_check;
use crate::{root, Result};
use svg::{Figure, Guide, Panel, Series, Style};

/// Simulated time starts here (2026), so the algorithms see real-looking
/// timestamps; figures show seconds from it.
const EPOCH_US: u64 = 1_780_000_000_000_000;

const OFFERED: &str = "#c8c8c8";
const ADMITTED: &str = "#2b7bb9";
const DENIED: &str = "#d62728";
const SECOND: &str = "#ff7f0e";
const THIRD: &str = "#2ca02c";

pub(crate) fn plots(args: &[String]) -> Result {
    let check = args.iter().any(|a| a == "--check");
    let figures = [
        ("algorithms.svg", five_algorithms()),
        ("window-boundary.svg", window_boundary()),
        ("bucket-and-gcra.svg", bucket_and_gcra()),
        ("layered.svg", layered()),
    ];
    let files: Vec<(String, String)> = figures
        .into_iter()
        .map(|(name, figure)| (name.to_string(), figure.render()))
        .collect();
    write_or_check(
        &root().join("docs/img"),
        &files,
        check,
        "figures",
        "cargo xtask plots",
    )
}

/// Seconds as microseconds since the epoch.
fn at(seconds: f64) -> Timestamp {
    Timestamp::from_micros(EPOCH_US + (seconds * 1e6).round() as u64)
}

/// `n` requests evenly spread over `[from, to)`.
fn spread(from: f64, to: f64, n: usize) -> impl Iterator<Item = f64> {
    (0..n).map(move |i| from + (to - from) * i as f64 / n as f64)
}

/// One limit deciding `arrivals` (seconds, sorted) one request each:
/// every arrival with its verdict, and the state after it.
fn run(limit: &Limit, arrivals: &[f64]) -> Vec<(f64, Verdict, Option<State>)> {
    let mut state: Option<State> = None;
    let mut out = Vec::new();
    for &t in arrivals {
        let transition = decide(limit, state.as_ref(), at(t), 1);
        if let Some(next) = transition.next {
            state = Some(next.state);
        }
        out.push((t, transition.verdict, state.clone()));
    }
    out
}

/// Requests per whole second.
fn per_second(times: impl Iterator<Item = f64>, seconds: usize) -> Vec<(f64, f64)> {
    let mut counts = vec![0.0; seconds];
    for t in times {
        if let Some(c) = counts.get_mut(t as usize) {
            *c += 1.0;
        }
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(s, c)| (s as f64, c))
        .collect()
}

/// Every algorithm under one bursty trace, on the same axes: steady
/// overload, a burst, an idle gap, a recovery.
fn five_algorithms() -> Figure {
    let mut arrivals: Vec<f64> = spread(0.0, 20.0, 40).collect(); // 2/s
    arrivals.extend(spread(20.0, 21.0, 16)); // a burst
    arrivals.extend(spread(35.0, 36.0, 12)); // after an idle gap, a burst
    arrivals.extend(spread(40.0, 60.0, 16)); // 0.8/s
    let ten = Duration::from_secs(10);
    let limits = [
        (
            "token bucket: capacity 10, 1 token/s",
            Limit::token_bucket(10, 1, Duration::from_secs(1)),
        ),
        (
            "GCRA: 1/s, burst 10",
            Limit::gcra(1, Duration::from_secs(1), 10),
        ),
        ("fixed window: 10 per 10 s", Limit::fixed_window(10, ten)),
        (
            "sliding window counter: 10 per 10 s",
            Limit::sliding_window(10, ten),
        ),
        ("sliding log: 10 per 10 s", Limit::sliding_log(10, ten)),
    ];
    let panels = limits
        .into_iter()
        .map(|(title, limit)| {
            let limit = limit.expect("valid limit");
            let decided = run(&limit, &arrivals);
            let admitted = decided
                .iter()
                .filter(|(_, v, _)| v.allowed)
                .map(|(t, _, _)| *t);
            Panel {
                title: title.to_string(),
                y_label: "requests/s".into(),
                y_max: 16.0,
                series: vec![
                    Series {
                        name: "offered".into(),
                        color: OFFERED,
                        style: Style::Bars {
                            width: 0.9,
                            offset: 0.05,
                        },
                        points: per_second(arrivals.iter().copied(), 60),
                    },
                    Series {
                        name: "admitted".into(),
                        color: ADMITTED,
                        style: Style::Bars {
                            width: 0.5,
                            offset: 0.25,
                        },
                        points: per_second(admitted, 60),
                    },
                ],
                guides: Vec::new(),
            }
        })
        .collect();
    Figure {
        title: "Five algorithms, one trace: 2/s, a burst of 16, idle, a burst of 12, 0.8/s".into(),
        x_label: "time (s)".into(),
        x_max: 60.0,
        x_tick: 5.0,
        panels,
    }
}

/// The fixed window's boundary burst beside the sliding algorithms: what
/// each admitted in the last 10 s, at every instant.
fn window_boundary() -> Figure {
    let mut arrivals: Vec<f64> = spread(8.0, 9.9, 12).collect();
    arrivals.extend(spread(10.0, 11.9, 12));
    arrivals.extend(spread(12.0, 30.0, 24));
    let ten = Duration::from_secs(10);
    let limits = [
        ("fixed window", Limit::fixed_window(10, ten)),
        ("sliding window counter", Limit::sliding_window(10, ten)),
        ("sliding log", Limit::sliding_log(10, ten)),
    ];
    let panels = limits
        .into_iter()
        .map(|(name, limit)| {
            let decided = run(&limit.expect("valid limit"), &arrivals);
            let admitted: Vec<f64> = decided
                .iter()
                .filter(|(_, v, _)| v.allowed)
                .map(|(t, _, _)| *t)
                .collect();
            // Admitted in (t - 10 s, t], every 50 ms.
            let rolling = (0..=600)
                .map(|i| {
                    let t = i as f64 * 0.05;
                    let n = admitted.iter().filter(|&&a| a <= t && a > t - 10.0).count();
                    (t, n as f64)
                })
                .collect();
            Panel {
                title: format!("{name}: 10 per 10 s"),
                y_label: "admitted in last 10 s".into(),
                y_max: 20.0,
                series: vec![Series {
                    name: "admitted in the last 10 s".into(),
                    color: ADMITTED,
                    style: Style::Step,
                    points: rolling,
                }],
                guides: vec![
                    Guide {
                        y: 10.0,
                        label: "limit".into(),
                    },
                    Guide {
                        y: 20.0,
                        label: "2× limit".into(),
                    },
                ],
            }
        })
        .collect();
    Figure {
        title: "12 requests just before t = 10 s, 12 just after, then 1.3/s: admitted in any 10 s"
            .into(),
        x_label: "time (s)".into(),
        x_max: 30.0,
        x_tick: 2.0,
        panels,
    }
}

/// The token bucket's level and GCRA's theoretical arrival time under the
/// same requests, each with the retry-after of its first denial.
fn bucket_and_gcra() -> Figure {
    let mut arrivals: Vec<f64> = spread(2.0, 2.6, 12).collect();
    arrivals.extend(spread(10.0, 20.0, 20));
    let bucket = Limit::token_bucket(10, 1, Duration::from_secs(1)).expect("valid");
    let gcra = Limit::gcra(1, Duration::from_secs(1), 10).expect("valid");

    let decided = run(&bucket, &arrivals);
    // Whole tokens available at t: what a request of cost 1 would see.
    let mut state: Option<State> = None;
    let mut next = decided.iter().peekable();
    let level = (0..=600)
        .map(|i| {
            let t = i as f64 * 0.05;
            while let Some((when, _, after)) = next.peek() {
                if *when > t {
                    break;
                }
                state = after.clone();
                next.next();
            }
            let v = decide(&bucket, state.as_ref(), at(t), 1).verdict;
            (t, (v.remaining + u64::from(v.allowed)) as f64)
        })
        .collect();
    let bucket_panel = marked_panel(
        "token bucket: capacity 10, 1 token/s",
        "tokens",
        "whole tokens available",
        12.0,
        level,
        &decided,
        10.5,
    );

    let decided = run(&gcra, &arrivals);
    // GCRA keeps one number, the theoretical arrival time (TAT): shown as
    // how far it runs ahead of the clock.
    let mut tat = 0u64;
    let mut next = decided.iter().peekable();
    let ahead = (0..=600)
        .map(|i| {
            let t = i as f64 * 0.05;
            while let Some((when, _, after)) = next.peek() {
                if *when > t {
                    break;
                }
                if let Some(State::Cells([value, _, _])) = after {
                    tat = *value;
                }
                next.next();
            }
            let now = at(t).as_micros();
            (t, tat.saturating_sub(now) as f64 / 1e6)
        })
        .collect();
    let mut gcra_panel = marked_panel(
        "GCRA: 1/s, burst 10",
        "seconds ahead",
        "TAT − now",
        12.0,
        ahead,
        &decided,
        10.5,
    );
    gcra_panel.guides.push(Guide {
        y: 9.0,
        label: "passes while TAT − now ≤ 9 s".into(),
    });
    Figure {
        title: "Inside the token bucket and GCRA: 12 requests at t = 2 s, then 2/s from t = 10 s"
            .into(),
        x_label: "time (s)".into(),
        x_max: 30.0,
        x_tick: 2.0,
        panels: vec![bucket_panel, gcra_panel],
    }
}

/// A panel of `line` (named `line_name`), with admitted and denied requests marked at
/// `marks_y` and the first denial's retry-after drawn as a span.
fn marked_panel(
    title: &str,
    y_label: &str,
    line_name: &str,
    y_max: f64,
    line: Vec<(f64, f64)>,
    decided: &[(f64, Verdict, Option<State>)],
    marks_y: f64,
) -> Panel {
    let admitted = decided
        .iter()
        .filter(|(_, v, _)| v.allowed)
        .map(|(t, _, _)| (*t, marks_y))
        .collect();
    let denied = decided
        .iter()
        .filter(|(_, v, _)| !v.allowed)
        .map(|(t, _, _)| (*t, marks_y))
        .collect();
    let retry = decided
        .iter()
        .find(|(_, v, _)| !v.allowed)
        .map(|(t, v, _)| {
            let wait = v.retry_after.unwrap_or_default().as_secs_f64();
            vec![(*t, marks_y - 2.0), (*t + wait, marks_y - 2.0)]
        })
        .unwrap_or_default();
    Panel {
        title: title.into(),
        y_label: y_label.into(),
        y_max,
        series: vec![
            Series {
                name: line_name.into(),
                color: ADMITTED,
                style: Style::Line,
                points: line,
            },
            Series {
                name: "admitted".into(),
                color: THIRD,
                style: Style::Dots,
                points: admitted,
            },
            Series {
                name: "denied".into(),
                color: DENIED,
                style: Style::Crosses,
                points: denied,
            },
            Series {
                name: "first denial's retry-after".into(),
                color: SECOND,
                style: Style::Spans,
                points: retry,
            },
        ],
        guides: Vec::new(),
    }
}

/// One layered decision over time: a key, its tenant and the global layer,
/// all or nothing; each denial marked on the layer that bound it.
fn layered() -> Figure {
    let bucket = |name: &str, capacity, refill| {
        let limit = Limit::token_bucket(capacity, refill, Duration::from_secs(1)).expect("valid");
        Policy::new(name, limit).expect("valid")
    };
    let (per_key, per_tenant, global) = (
        bucket("key", 3, 2),
        bucket("tenant", 4, 2),
        bucket("global", 6, 3),
    );
    // (time, subject, tenant): key a at 3/s throughout; key b of the same
    // tenant sends 6 at once at t = 4 s; keys c and d of another tenant
    // 3/s each from t = 7 s.
    let mut requests: Vec<(f64, &str, &str)> =
        spread(0.0, 12.0, 36).map(|t| (t, "a", "t1")).collect();
    requests.extend(spread(4.0, 4.2, 6).map(|t| (t, "b", "t1")));
    requests.extend(spread(7.0, 12.0, 15).map(|t| (t, "c", "t2")));
    requests.extend(spread(7.1, 12.0, 15).map(|t| (t, "d", "t2")));
    requests.sort_by(|x, y| x.0.total_cmp(&y.0));

    let mut states: HashMap<String, State> = HashMap::new();
    let names = ["key a", "tenant t1", "global"];
    let mut remaining: [Vec<(f64, f64)>; 3] = Default::default();
    let mut binding: [Vec<(f64, f64)>; 3] = Default::default();
    let mut admitted_a = Vec::new();
    for (t, subject, tenant) in requests {
        let keys = [
            StoreKey::new(subject, &per_key, "subject", subject),
            StoreKey::new(tenant, &per_tenant, "tenant", tenant),
            StoreKey::new("all", &global, "global", "all"),
        ];
        let policies = [&per_key, &per_tenant, &global];
        let layers: Vec<LayerRequest<'_>> = keys
            .iter()
            .zip(policies)
            .map(|(key, policy)| LayerRequest {
                key: *key,
                policy,
                cost: 1,
            })
            .collect();
        let rendered: Vec<String> = keys.iter().map(ToString::to_string).collect();
        let current: Vec<Option<&State>> = rendered.iter().map(|k| states.get(k)).collect();
        let decided = decide_layers(&layers, &current, at(t));
        let admitted = decided.admitted();
        for (i, write) in decided.writes.iter().enumerate() {
            if let Some(stored) = write {
                states.insert(rendered[i].clone(), stored.state.clone());
            }
        }
        // The key panel follows key a, the tenant panel tenant t1, the
        // global panel everyone.
        let shown = [subject == "a", tenant == "t1", true];
        for i in 0..3 {
            let v = decided.verdicts[i];
            if shown[i] {
                remaining[i].push((t, v.remaining as f64));
                if !v.allowed {
                    binding[i].push((t, 0.5));
                }
            }
        }
        if subject == "a" && admitted {
            admitted_a.push((t, 0.5));
        }
    }
    let caps = [3.0, 4.0, 6.0];
    let refills = [2, 2, 3];
    let panels = (0..3)
        .map(|i| {
            let mut series = vec![
                Series {
                    name: "remaining after each decision".into(),
                    color: ADMITTED,
                    style: Style::Step,
                    points: std::mem::take(&mut remaining[i]),
                },
                Series {
                    name: "denied by this layer".into(),
                    color: DENIED,
                    style: Style::Crosses,
                    points: std::mem::take(&mut binding[i]),
                },
            ];
            if i == 0 {
                series.push(Series {
                    name: "key a admitted".into(),
                    color: THIRD,
                    style: Style::Dots,
                    points: admitted_a.clone(),
                });
            }
            Panel {
                title: format!(
                    "{}: token bucket, capacity {}, {} tokens/s",
                    names[i], caps[i], refills[i]
                ),
                y_label: "remaining".into(),
                y_max: caps[i],
                series,
                guides: Vec::new(),
            }
        })
        .collect();
    Figure {
        title: "Three layers, all or nothing: key a 3/s; b (same tenant) 6 at 4 s; c, d 3/s each from 7 s"
            .into(),
        x_label: "time (s)".into(),
        x_max: 12.0,
        x_tick: 1.0,
        panels,
    }
}
