//! Started against an API server that lacks what kipam needs, the controller says so once, in
//! words an operator can act on, keeps `/readyz` false with the same reason, and recovers by
//! itself once the precondition is met.

use std::time::{Duration, Instant};

use serde_json::json;

use super::support::Seed;

async fn readyz_until(
    port: u16,
    timeout: Duration,
    mut check: impl FnMut(u16, &str) -> bool,
) -> (u16, String) {
    let start = Instant::now();
    loop {
        let (code, body) = Seed::http_get(port, "/readyz").await;
        if check(code, &body) || start.elapsed() > timeout {
            return (code, body);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_crds_and_lease_namespace_are_named_then_recovered_from() {
    let seed = Seed::bare("preconditions").await;
    let ctl = seed.controller("ctl");
    let (code, body) = readyz_until(ctl.metrics_port, Duration::from_secs(15), |_, b| {
        b.contains("kubectl apply -f crds/")
    })
    .await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("kubectl apply -f crds/"), "{body}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = seed.log("ctl");
    let said = log
        .lines()
        .filter(|l| l.contains("is not installed"))
        .count();
    assert!((1..=4).contains(&said), "said {said} times:\n{log}");

    // CRDs installed: the Lease's namespace is what is missing now.
    seed.install_crds();
    let (code, body) = readyz_until(ctl.metrics_port, Duration::from_secs(20), |_, b| {
        b.contains("namespace of the Lease")
    })
    .await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("--namespace"), "{body}");

    // Namespace created: ready, and serving.
    seed.api
        .apply(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kipam-system"}}),
        )
        .expect("namespace");
    let (code, body) =
        readyz_until(ctl.metrics_port, Duration::from_secs(30), |c, _| c == 200).await;
    assert_eq!(code, 200, "{body}\n{}", seed.log("ctl"));
    seed.apply(super::support::POOLS);
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated", Duration::from_secs(20), "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
    })
    .await;
}
