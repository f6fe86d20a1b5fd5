//! Started against an API server that lacks what kipam needs, the controller says so once, in
//! words an operator can act on, keeps `/readyz` false with the same reason, and recovers by
//! itself once the precondition is met.

use std::time::{Duration, Instant};

use serde_json::json;

use super::support::{Seed, longest_gap, request_times};

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
    // (Debug lines are not counted: the addon applier repeats there what the planning
    // loop's watch of the same resource says.) Five of kipam's kinds are watched by every
    // replica: pools, clusters, allocations, addons and the pool records (the page's
    // quarantine); each is said once.
    let said = log
        .lines()
        .filter(|l| {
            l.contains("is not installed") && l.contains(".ipam.kipam.dev") && !l.contains("DEBUG")
        })
        .count();
    assert!((1..=5).contains(&said), "said {said} times:\n{log}");
    // Cluster API is optional: its missing kinds are said once each, at info level.
    for kind in [
        "ipaddressclaims.ipam.cluster.x-k8s.io",
        "ipaddresses.ipam.cluster.x-k8s.io",
        "clusters.cluster.x-k8s.io",
    ] {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(kind)).collect();
        assert_eq!(lines.len(), 1, "{kind}:\n{log}");
        assert!(
            lines[0].contains("INFO") && lines[0].contains("claims are not served"),
            "{}",
            lines[0]
        );
    }

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

/// Without kipam's CRDs the addon applier's watches cannot list. On a real API server that is
/// a plain-text `404 page not found`: the applier used to log kube's `Status { … }` dump about
/// once a second for as long as it ran, its retries never slowing down. It now says once which
/// CRD is missing and what to do, retries less and less often, and carries on when the CRDs
/// come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_crds_the_addon_applier_says_so_once_and_backs_off() {
    let seed = Seed::bare("applier-no-crds").await;
    seed.api
        .apply(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kipam-system"}}),
        )
        .expect("namespace");
    let ctl = seed.controller("ctl");
    // Only the applier lists Addons: its retries are these requests.
    let times = request_times(&seed.api, "list", "addons", Duration::from_secs(14)).await;
    let log = seed.full_log("ctl");
    assert!(
        !log.contains("Status {"),
        "a Status dump in the log:\n{log}"
    );
    let about_addons: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("addons.ipam.kipam.dev"))
        .collect();
    assert_eq!(about_addons.len(), 1, "{log}");
    assert!(about_addons[0].contains("WARN"), "{log}");
    assert!(
        about_addons[0].contains(
            "the CustomResourceDefinition addons.ipam.kipam.dev is not installed (or is of an older version): install kipam's CRDs with `kubectl apply -f crds/`"
        ),
        "{log}"
    );
    // The missing Cluster CRD is said once in all, by the planning loop's watch.
    let about_clusters = log
        .lines()
        .filter(|l| l.contains("clusters.ipam.kipam.dev") && l.contains("WARN"))
        .count();
    assert_eq!(about_clusters, 1, "{log}");
    // Growing waits: about 0.2, 0.4, 0.8, 1.6, 3.2 and 6.4 s, not one a second.
    assert!(
        (3..=9).contains(&times.len()),
        "{} lists of Addons in 14 s: {times:?}",
        times.len()
    );
    assert!(
        longest_gap(&times) >= Duration::from_secs(3),
        "the waits never grew: {times:?}"
    );

    // The CRDs arrive: the applier gets going by itself, and says so.
    seed.install_crds();
    let started = Instant::now();
    while !seed.full_log("ctl").contains("addon applier ready") {
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "the applier never started:\n{}",
            seed.log("ctl")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seed.full_log("ctl")
            .contains("addon applier watch recovered")
    );
    drop(ctl);
}
