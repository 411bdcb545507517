//! OpenTelemetry traces over OTLP/HTTP (JSON): a span per decision, with
//! its domain, its rules and its outcome, continuing the trace Envoy sends
//! (W3C `traceparent` in the gRPC metadata or the HTTP headers).
//!
//! Spans are handed to one exporter task through a bounded queue: a
//! decision never waits on the collector. When the queue is full, or the
//! collector does not answer, spans are dropped and counted
//! (`tollgate_trace_spans_dropped_total`), never retried into memory.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::error::ServerError;

/// `[server.traces]`: where spans go.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceSettings {
    /// The collector's OTLP/HTTP traces endpoint, `http://…/v1/traces`
    /// (a collector or agent beside the server; plain HTTP).
    pub otlp_endpoint: String,
    /// The `service.name` of the spans (default
    /// `tollgate-ratelimit-server`).
    #[serde(default = "default_service")]
    pub service_name: String,
    /// Share of decisions traced when the caller sent no trace context,
    /// 0 to 1 (default 0: only decisions whose caller's trace is sampled).
    #[serde(default)]
    pub sample_ratio: f64,
}

fn default_service() -> String {
    "tollgate-ratelimit-server".into()
}

/// Spans waiting for the exporter, at most.
const QUEUE: usize = 8192;
/// Spans sent in one request, at most.
const BATCH: usize = 512;
/// How long a span waits for its batch to fill, at most.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How long the collector has to answer one batch.
const EXPORT_WITHIN: Duration = Duration::from_secs(5);

/// The caller's trace: W3C `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TraceContext {
    trace_id: [u8; 16],
    parent_id: [u8; 8],
    sampled: bool,
}

impl TraceContext {
    /// `traceparent` (`00-<trace id>-<parent id>-<flags>`), when valid.
    pub(crate) fn parse(header: Option<&http::HeaderValue>) -> Option<TraceContext> {
        let text = header?.to_str().ok()?;
        let mut parts = text.trim().split('-');
        let (version, trace, parent, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?;
        let parent_id: [u8; 8] = hex(parent)?;
        let [flags]: [u8; 1] = hex(flags)?;
        let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
        if zero(&trace_id) || zero(&parent_id) {
            return None;
        }
        Some(TraceContext {
            trace_id,
            parent_id,
            sampled: flags & 1 == 1,
        })
    }
}

/// Lower-case hex of exactly `N` bytes.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span begun: what it continues, and when.
#[derive(Debug)]
pub(crate) struct Span {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent_id: Option<[u8; 8]>,
    start: SystemTime,
}

/// A finished span, as the exporter sends it.
struct Finished {
    span: Span,
    name: &'static str,
    end: SystemTime,
    attributes: Vec<(&'static str, Value)>,
}

/// Unique ids without a random-number crate: a per-process random seed
/// (std's hasher keys) mixed with a counter by SplitMix64.
fn next_id() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    });
    let mut z = seed.wrapping_add(
        COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).max(1)
}

/// The traces of a running server: spans are begun and finished here and
/// sent by an exporter task.
#[derive(Debug)]
pub(crate) struct Tracer {
    sample_ratio: f64,
    queue: mpsc::Sender<Finished>,
    /// Tells the exporter to send what is queued and end; and the
    /// exporter's task.
    exporter: std::sync::Mutex<Option<(oneshot::Sender<()>, JoinHandle<()>)>>,
}

impl std::fmt::Debug for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finished")
            .field("name", &self.name)
            .finish()
    }
}

impl Tracer {
    /// Start the exporter for `settings` (on the running Tokio runtime).
    pub(crate) fn start(settings: &TraceSettings) -> Result<Tracer, ServerError> {
        let invalid = |why: &str| ServerError::Settings(format!("server.traces: {why}"));
        let uri: http::Uri = settings
            .otlp_endpoint
            .parse()
            .map_err(|e| invalid(&format!("otlp_endpoint {:?}: {e}", settings.otlp_endpoint)))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(invalid(&format!(
                "otlp_endpoint {:?} must be http://host:port/v1/traces (a collector beside the server)",
                settings.otlp_endpoint
            )));
        }
        if !(0.0..=1.0).contains(&settings.sample_ratio) {
            return Err(invalid("sample_ratio must be between 0 and 1"));
        }
        let (queue, spans) = mpsc::channel(QUEUE);
        let (stop, stopped) = oneshot::channel();
        let exporter = tokio::spawn(export(uri, settings.service_name.clone(), spans, stopped));
        Ok(Tracer {
            sample_ratio: settings.sample_ratio,
            queue,
            exporter: std::sync::Mutex::new(Some((stop, exporter))),
        })
    }

    /// Begin a span continuing `parent`, when it is sampled: the caller's
    /// choice when it sent a trace context, else `sample_ratio`'s.
    pub(crate) fn begin(&self, parent: Option<TraceContext>) -> Option<Span> {
        let sampled = match parent {
            Some(parent) => parent.sampled,
            None => (next_id() as f64) < self.sample_ratio * (u64::MAX as f64),
        };
        if !sampled {
            return None;
        }
        let trace_id = match parent {
            Some(p) => p.trace_id,
            None => {
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&next_id().to_be_bytes());
                id[8..].copy_from_slice(&next_id().to_be_bytes());
                id
            }
        };
        Some(Span {
            trace_id,
            span_id: next_id().to_be_bytes(),
            parent_id: parent.map(|p| p.parent_id),
            start: SystemTime::now(),
        })
    }

    /// Finish `span` as `name` with `attributes`, for the exporter.
    pub(crate) fn finish(
        &self,
        span: Span,
        name: &'static str,
        attributes: Vec<(&'static str, Value)>,
    ) {
        let finished = Finished {
            span,
            name,
            end: SystemTime::now(),
            attributes,
        };
        if self.queue.try_send(finished).is_err() {
            dropped(1);
        }
    }

    /// Send what is queued and stop the exporter (within `within`);
    /// spans finished later are dropped.
    pub(crate) async fn flush(&self, within: Duration) {
        let exporter = self
            .exporter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((stop, mut task)) = exporter {
            let _ = stop.send(());
            if tokio::time::timeout(within, &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}

/// Longest domain a span carries, in bytes: Envoy's domains are names
/// from its configuration, while the request's is the caller's and may be
/// megabytes (a span is kept in memory until it is sent).
const DOMAIN_AT_MOST: usize = 256;

/// `domain`, cut to [`DOMAIN_AT_MOST`] bytes (at a character's start) and
/// marked `…` when cut.
fn bounded(domain: &str) -> std::borrow::Cow<'_, str> {
    if domain.len() <= DOMAIN_AT_MOST {
        return domain.into();
    }
    let mut end = DOMAIN_AT_MOST;
    while !domain.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &domain[..end]).into()
}

/// The attributes of a decision's span: its domain, how many descriptors,
/// the rules that decided them, the overall code, and whether a store
/// failure failed it closed (`outcome` is `None` for a request refused as
/// bad input).
pub(crate) fn decision_attributes(
    domain: &str,
    descriptors: usize,
    outcome: Option<&crate::Answer>,
) -> Vec<(&'static str, Value)> {
    let mut attributes = vec![
        ("ratelimit.domain", json!(bounded(domain))),
        ("ratelimit.descriptors", json!(descriptors)),
    ];
    let Some(outcome) = outcome else {
        attributes.push(("ratelimit.code", json!("INVALID_ARGUMENT")));
        return attributes;
    };
    let rules: Vec<&str> = outcome
        .statuses
        .iter()
        .filter_map(|s| s.rule.as_deref())
        .collect();
    let code = if outcome.ok() { "OK" } else { "OVER_LIMIT" };
    attributes.extend([
        ("ratelimit.rules", json!(rules.join(","))),
        ("ratelimit.code", json!(code)),
        ("ratelimit.failed_closed", json!(outcome.failed_closed())),
    ]);
    attributes
}

/// Describe the dropped spans' counter (its `# HELP` line).
pub(crate) fn describe() {
    metrics::describe_counter!(
        "tollgate_trace_spans_dropped_total",
        metrics::Unit::Count,
        "Spans dropped: the exporter's queue was full or the collector did not take them"
    );
}

fn dropped(spans: u64) {
    metrics::counter!("tollgate_trace_spans_dropped_total").increment(spans);
}

/// The exporter: batches of up to [`BATCH`] spans, each sent within
/// [`FLUSH_EVERY`] of its first span; once told to stop, what is queued
/// is sent and it ends.
async fn export(
    uri: http::Uri,
    service: String,
    mut spans: mpsc::Receiver<Finished>,
    mut stop: oneshot::Receiver<()>,
) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut batch = Vec::with_capacity(BATCH);
    let mut stopping = false;
    loop {
        let first = tokio::select! {
            span = spans.recv() => span,
            _ = &mut stop, if !stopping => {
                // No more spans come in; those queued still go out.
                stopping = true;
                spans.close();
                continue;
            }
        };
        let Some(first) = first else {
            return;
        };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + FLUSH_EVERY;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, spans.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let body = Bytes::from(encode(&service, &batch).to_string());
        let sent = batch.len() as u64;
        batch.clear();
        let request = http::Request::post(uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("a valid request");
        match tokio::time::timeout(EXPORT_WITHIN, client.request(request)).await {
            Ok(Ok(response)) if response.status().is_success() => {}
            _ => dropped(sent),
        }
    }
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
        .to_string()
}

/// OTLP/HTTP's JSON encoding of `batch`.
fn encode(service: &str, batch: &[Finished]) -> Value {
    let spans: Vec<Value> = batch
        .iter()
        .map(|f| {
            let mut span = json!({
                "traceId": to_hex(&f.span.trace_id),
                "spanId": to_hex(&f.span.span_id),
                "name": f.name,
                "kind": 2, // SPAN_KIND_SERVER
                "startTimeUnixNano": nanos(f.span.start),
                "endTimeUnixNano": nanos(f.end),
                "attributes": f.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
            });
            if let Some(parent) = f.span.parent_id {
                span["parentSpanId"] = json!(to_hex(&parent));
            }
            span
        })
        .collect();
    json!({ "resourceSpans": [{
        "resource": { "attributes": [attribute("service.name", &json!(service))] },
        "scopeSpans": [{
            "scope": { "name": "tollgate-ratelimit-server", "version": env!("CARGO_PKG_VERSION") },
            "spans": spans,
        }],
    }]})
}

/// An attribute in OTLP's JSON: its value typed.
fn attribute(key: &str, value: &Value) -> Value {
    let typed = match value {
        Value::Bool(b) => json!({ "boolValue": b }),
        Value::Number(n) if n.is_i64() || n.is_u64() => json!({ "intValue": n.to_string() }),
        Value::Number(n) => json!({ "doubleValue": n }),
        Value::String(s) => json!({ "stringValue": s }),
        other => json!({ "stringValue": other.to_string() }),
    };
    json!({ "key": key, "value": typed })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller's domain of any size is carried at most 256 bytes long
    /// (cut at a character), a configured one as it is.
    #[test]
    fn a_spans_domain_is_bounded() {
        let domain = |attributes: Vec<(&str, Value)>| attributes[0].1.as_str().unwrap().to_string();
        assert_eq!(domain(decision_attributes("edge", 1, None)), "edge");
        let huge = "é".repeat(1 << 20);
        let carried = domain(decision_attributes(&huge, 1, None));
        assert!(
            carried.len() <= DOMAIN_AT_MOST + "…".len(),
            "{}",
            carried.len()
        );
        assert!(carried.ends_with('…') && carried.starts_with("éé"));
    }

    fn header(text: &str) -> Option<TraceContext> {
        TraceContext::parse(Some(&http::HeaderValue::from_str(text).unwrap()))
    }

    #[test]
    fn traceparent_is_read_as_w3c_writes_it() {
        let c = header("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(to_hex(&c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(to_hex(&c.parent_id), "00f067aa0ba902b7");
        assert!(c.sampled);
        let not = header("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        assert!(!not.sampled);
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert_eq!(header(bad), None, "{bad}");
        }
    }

    #[test]
    fn ids_do_not_repeat() {
        let ids: std::collections::HashSet<u64> = (0..10_000).map(|_| next_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }
}
