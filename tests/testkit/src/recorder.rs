//! A `metrics` recorder whose counters and gauges are atomics, as an
//! exporter's are: what a decision costs with metrics on, in tests and
//! benches.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Counters and gauges counted in atomics; histograms dropped.
#[derive(Debug, Default)]
pub struct AtomicRecorder;

impl Recorder for AtomicRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(AtomicU64::new(0)))
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(AtomicU64::new(0)))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

impl AtomicRecorder {
    /// Install it as the process's recorder.
    ///
    /// # Panics
    ///
    /// When a recorder is installed already.
    pub fn install() {
        metrics::set_global_recorder(AtomicRecorder).expect("the first recorder");
    }
}
