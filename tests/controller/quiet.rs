//! A controller with nothing to do stays idle, also after a write failed once.

use std::time::Duration;

use super::support::{POOLS, Seed};

const WAIT: Duration = Duration::from_secs(30);

async fn passes(port: u16) -> u64 {
    let (_, metrics) = Seed::http_get(port, "/metrics").await;
    metrics
        .lines()
        .find(|l| l.starts_with("kipam_reconcile_passes_total"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A pool status write that failed once used to leave its backoff entry behind for good: due
/// at once on every pass, it made the planning loop run hundreds of passes a second forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pool_status_write_does_not_keep_the_planner_spinning() {
    let seed = Seed::start("quiet").await;
    let ctl = seed.controller("ctl");
    seed.apply(POOLS);
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
    })
    .await;
    seed.api
        .inject_failures("update", "ipampools/status", 1, 500);
    seed.cluster("b", "dc-1");
    seed.wait_for("b allocated, the failure used", WAIT, "ctl", |s| {
        s.phase("b", "metallb") == "Allocated" && s.api.pending_failures() == 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = passes(ctl.metrics_port).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = passes(ctl.metrics_port).await;
    assert!(
        after - before < 30,
        "{} passes in 3 s with nothing to do",
        after - before
    );
}
