//! Rejections the gRPC way. A gRPC client reads the status from
//! `grpc-status`, not from the HTTP status: given a 429 with a JSON body it
//! reads the body as a message frame and fails with INTERNAL. So a request
//! whose `content-type` is `application/grpc…` is answered with HTTP 200
//! and a *trailers-only* response — no body, the status in the headers
//! that end the stream — as the gRPC over HTTP/2 protocol defines it.

use std::time::Duration;

use crate::identity::RequestView;
use crate::response::{names, Headers};

/// The gRPC status codes Tollgate answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GrpcCode {
    /// 7: the request's subject is denied (a deny list).
    PermissionDenied = 7,
    /// 8: a limit denied the request (HTTP's 429).
    ResourceExhausted = 8,
    /// 13: the limiter could not decide (HTTP's 500).
    Internal = 13,
    /// 14: the store failed and the policy fails closed (HTTP's 503).
    Unavailable = 14,
    /// 16: no identity for a layer that needs one (HTTP's 401).
    Unauthenticated = 16,
}

impl GrpcCode {
    /// The code for the HTTP status Tollgate would answer otherwise.
    pub fn for_http_status(status: u16) -> GrpcCode {
        match status {
            401 => GrpcCode::Unauthenticated,
            403 => GrpcCode::PermissionDenied,
            429 => GrpcCode::ResourceExhausted,
            503 => GrpcCode::Unavailable,
            _ => GrpcCode::Internal,
        }
    }
}

/// `grpc-status`.
pub const GRPC_STATUS: &str = "grpc-status";
/// `grpc-message`, percent-encoded.
pub const GRPC_MESSAGE: &str = "grpc-message";
/// `grpc-status-details-bin`: a `google.rpc.Status`, base64.
pub const GRPC_STATUS_DETAILS: &str = "grpc-status-details-bin";
/// The content type of a gRPC response.
pub const APPLICATION_GRPC: &str = "application/grpc";

/// Whether the request is a gRPC call: a `POST` (every gRPC call is one)
/// whose `content-type` is `application/grpc` or
/// `application/grpc+<codec>` (gRPC-Web's `application/grpc-web…` is
/// another protocol and is not matched). Any other method is answered in
/// HTTP's form, whatever its content type: a client cannot turn a
/// throttled `GET` into an empty `200`.
pub fn is_grpc(view: &dyn RequestView) -> bool {
    if view.method() != "POST" {
        return false;
    }
    view.header_values("content-type").first().is_some_and(|v| {
        let v = v.to_ascii_lowercase();
        v == b"application/grpc"
            || v.starts_with(b"application/grpc+")
            || v.starts_with(b"application/grpc;")
    })
}

/// The headers of a trailers-only gRPC response: `content-type`,
/// `grpc-status`, `grpc-message`, and, when a retry delay is known,
/// `grpc-status-details-bin` carrying a `google.rpc.RetryInfo` (what
/// `tonic-types` and other gRPC clients read as the delay), after `extra`
/// (the rate-limit headers, `retry-after`: they reach the client as
/// metadata).
pub(crate) fn trailers_only(
    code: GrpcCode,
    message: &str,
    retry_after: Option<Duration>,
    mut extra: Headers,
) -> Headers {
    extra.push((names::CONTENT_TYPE, APPLICATION_GRPC.to_string()));
    extra.push((GRPC_STATUS, (code as i32).to_string()));
    extra.push((GRPC_MESSAGE, percent_encode(message)));
    if let Some(delay) = retry_after {
        extra.push((
            GRPC_STATUS_DETAILS,
            base64(&status_with_retry_info(code, message, delay)),
        ));
    }
    extra
}

/// `grpc-message` encoding: bytes outside printable ASCII, and `%`, as
/// `%XX` (the gRPC over HTTP/2 specification).
fn percent_encode(message: &str) -> String {
    // Control bytes and `%`; every byte past ASCII is encoded anyway.
    const GRPC_MESSAGE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
    percent_encoding::utf8_percent_encode(message, GRPC_MESSAGE).to_string()
}

/// The longest `google.protobuf.Duration`: 10,000 years.
const LONGEST_DURATION: Duration = Duration::from_secs(315_576_000_000);

/// A `google.rpc.Status` { code, message, details: [Any(RetryInfo)] } in
/// protobuf's wire format, written by hand: four small messages do not
/// justify a protobuf dependency in every HTTP adapter.
fn status_with_retry_info(code: GrpcCode, message: &str, delay: Duration) -> Vec<u8> {
    // google.protobuf.Duration { seconds = 1; nanos = 2 }, within its range
    // (a wait past it, from a breaker configured to stay open for ever,
    // would read as a negative int64 of seconds).
    let delay = delay.min(LONGEST_DURATION);
    let mut duration = Vec::new();
    if delay.as_secs() > 0 {
        duration.push(0x08);
        varint(&mut duration, delay.as_secs());
    }
    if delay.subsec_nanos() > 0 {
        duration.push(0x10);
        varint(&mut duration, u64::from(delay.subsec_nanos()));
    }
    // google.rpc.RetryInfo { retry_delay = 1 }
    let mut retry_info = Vec::new();
    bytes_field(&mut retry_info, 1, &duration);
    // google.protobuf.Any { type_url = 1; value = 2 }
    let mut any = Vec::new();
    bytes_field(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status { code = 1; message = 2; details = 3 }
    let mut status = vec![0x08];
    varint(&mut status, code as u64);
    bytes_field(&mut status, 2, message.as_bytes());
    bytes_field(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    out.push(field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Standard base64 without padding, as gRPC sends `-bin` metadata.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet_without_padding() {
        // RFC 4648's test vectors, padding removed.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8");
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("retry in 3 s"), "retry in 3 s");
        assert_eq!(percent_encode("100% über"), "100%25 %C3%BCber");
        assert_eq!(percent_encode("a\nb"), "a%0Ab");
    }

    #[test]
    fn the_status_is_protobuf_with_retry_info() {
        let status = status_with_retry_info(
            GrpcCode::ResourceExhausted,
            "no",
            Duration::from_millis(2_500),
        );
        let any_type = b"type.googleapis.com/google.rpc.RetryInfo";
        // Duration { seconds: 2, nanos: 500_000_000 }
        let duration = [0x08, 0x02, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01];
        let mut expected = vec![0x08, 8, 0x12, 2, b'n', b'o', 0x1a];
        let retry_info_len = 2 + duration.len();
        let any_len = 2 + any_type.len() + 2 + retry_info_len;
        expected.push(any_len as u8);
        expected.extend([0x0a, any_type.len() as u8]);
        expected.extend(any_type);
        expected.extend([0x12, retry_info_len as u8, 0x0a, duration.len() as u8]);
        expected.extend(duration);
        assert_eq!(status, expected);
    }

    /// A wait past protobuf's range is sent as its longest duration.
    #[test]
    fn the_retry_delay_stays_within_protobufs_range() {
        let longest = status_with_retry_info(GrpcCode::Unavailable, "", LONGEST_DURATION);
        let endless = status_with_retry_info(GrpcCode::Unavailable, "", Duration::MAX);
        assert_eq!(endless, longest);
    }

    #[test]
    fn codes_follow_the_http_status() {
        assert_eq!(GrpcCode::for_http_status(429) as i32, 8);
        assert_eq!(GrpcCode::for_http_status(503) as i32, 14);
        assert_eq!(GrpcCode::for_http_status(401) as i32, 16);
        assert_eq!(GrpcCode::for_http_status(403) as i32, 7);
        assert_eq!(GrpcCode::for_http_status(500) as i32, 13);
    }
}
