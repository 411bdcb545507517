//! A real tonic client against a tonic server behind the tower layer.

use std::time::Duration;

use tollgate_example_grpc::{run, Call};

#[tokio::test]
async fn a_limited_call_is_resource_exhausted_with_its_delay() {
    let calls = run().await.unwrap();
    for (i, call) in calls[..2].iter().enumerate() {
        let Call::Served { status, ratelimit } = call else {
            panic!("call {} is within the limit: {call}", i + 1)
        };
        assert_eq!(status, "Serving");
        let expected = format!("\"per-client\";r={};t=", 1 - i);
        assert!(
            ratelimit
                .as_deref()
                .is_some_and(|r| r.starts_with(&expected)),
            "{ratelimit:?}"
        );
    }
    let Call::Refused {
        code,
        retry_after,
        ratelimit,
        retry_delay,
        message,
    } = &calls[2]
    else {
        panic!("the third call is over the limit: {}", calls[2])
    };
    // Not INTERNAL: tonic read grpc-status, not a 429's JSON body.
    assert_eq!(*code, tonic::Code::ResourceExhausted, "{message}");
    // Two per minute with a burst of two: the next unit comes in 30 s (less
    // the moments since the calls), whole seconds in `retry-after`, exact
    // in RetryInfo.
    assert_eq!(retry_after.as_deref(), Some("30"));
    let delay = retry_delay.expect("a RetryInfo detail");
    assert!(
        delay > Duration::from_secs(29) && delay <= Duration::from_secs(30),
        "{delay:?}"
    );
    assert!(ratelimit.as_deref().unwrap().contains(";r=0;"));
    assert!(message.contains("(policies: per-client)"), "{message}");
}
