//! Body size, request time and concurrency bounds.

use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;

use kipam::api::ApiOptions;

use super::harness::*;

#[tokio::test]
async fn a_body_of_several_megabytes_is_413_declared_or_streamed() {
    let h = Harness::start().await;
    let big = format!(
        "{{\"name\": \"p\", \"x\": \"{}\"}}",
        "a".repeat(5 * 1024 * 1024)
    );
    let (status, body) = h
        .call("POST", POOLS, Some("admin"), Some(Body::from(big.clone())))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(error_of(status, &body).contains("larger than 1048576 bytes"));
    // Without a Content-Length: counted while it is read.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .as_bytes()
        .chunks(64 * 1024)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let stream = Body::from_stream(futures::stream::iter(chunks));
    h.pool(METALLB).await;
    let (status, body) = h
        .call(
            "PATCH",
            &format!("{POOLS}/metallb"),
            Some("admin"),
            Some(stream),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    error_of(status, &body);
    // Unauthenticated: refused before the body is looked at.
    let (status, _) = h.call("POST", POOLS, None, Some(Body::from(big))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_request_over_the_timeout_is_503() {
    let h = Harness::with_options(ApiOptions {
        request_timeout: Duration::from_millis(300),
        ..ApiOptions::default()
    })
    .await;
    h.api.set_latency(Duration::from_secs(2));
    let (status, body) = h.get(POOLS, "admin").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(error_of(status, &body).contains("did not finish"));
}

#[tokio::test]
async fn requests_over_the_concurrency_bound_are_429() {
    let h = Harness::with_options(ApiOptions {
        max_concurrent: 2,
        ..ApiOptions::default()
    })
    .await;
    h.api.set_latency(Duration::from_millis(500));
    let (a, b, c) = tokio::join!(h.get(POOLS, "admin"), h.get(POOLS, "admin"), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        h.get(POOLS, "admin").await
    });
    assert_eq!(a.0, StatusCode::OK);
    assert_eq!(b.0, StatusCode::OK);
    assert_eq!(c.0, StatusCode::TOO_MANY_REQUESTS);
    error_of(c.0, &c.1);
    // Permits come back.
    assert_eq!(h.get(POOLS, "admin").await.0, StatusCode::OK);
}
