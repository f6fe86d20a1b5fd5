//! A controller with nothing to do stays idle, also after a write failed once, and after the
//! object a failed write was for is gone.

use std::time::Duration;

use super::support::{POOLS, Seed};

const WAIT: Duration = Duration::from_secs(30);

/// A pool status write that failed once used to leave its backoff entry behind for good: due
/// at once on every pass, it made the planning loop run hundreds of passes a second forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pool_status_write_does_not_keep_the_planner_spinning() {
    let seed = Seed::start("quiet").await;
    let mut ctl = seed.controller("ctl");
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
    let before = ctl.passes().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = ctl.passes().await;
    assert!(
        after - before < 30,
        "{} passes in 3 s with nothing to do",
        after - before
    );
}

/// An allocation write that failed for a cluster deleted since used to leave its backoff
/// entry behind: nothing retried it any more, and due at once on every pass it made the
/// planning loop run hundreds of passes a second for good (as after `kubectl delete -f
/// examples/`, whose namespace deletions refuse kipam's writes for a moment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_for_a_cluster_deleted_since_does_not_keep_the_planner_spinning() {
    let seed = Seed::start("quiet-gone").await;
    let mut ctl = seed.controller("ctl");
    seed.apply(POOLS);
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
    })
    .await;
    // Every create of b's allocations fails until b is gone.
    seed.api
        .inject_failures("create", "ipamallocations", 1000, 500);
    seed.cluster("b", "dc-1");
    seed.wait_for("b's allocation refused", WAIT, "ctl", |s| {
        s.api.pending_failures() < 1000
    })
    .await;
    seed.delete("clusters", None, "b");
    seed.wait_for("b released and gone", WAIT, "ctl", |s| {
        s.get("clusters", None, "b").is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = ctl.passes().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = ctl.passes().await;
    assert!(
        after - before < 30,
        "{} passes in 3 s with nothing to do\n{}",
        after - before,
        seed.log("ctl")
    );
    assert_eq!(seed.phase("a", "metallb"), "Allocated");
}

/// New clusters one after the other: each is allocated at once, but the pool's status
/// (allocation counts, capacity) is written at most about once a second, not once per
/// cluster; it ends up exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_statuses_are_written_at_most_once_a_second_while_clusters_stream_in() {
    let seed = Seed::start("status-stream").await;
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    seed.cluster("a", "dc-2");
    seed.wait_for("a allocated", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
    })
    .await;
    // The start-up passes are over (their status writes are not counted).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = seed.api.stats().count("update", "ipampools/status");
    let started = std::time::Instant::now();
    let names: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    for name in &names {
        seed.cluster(name, "dc-2");
        seed.wait_for("allocated", WAIT, "ctl", |s| {
            s.phase(name, "metallb") == "Allocated"
        })
        .await;
    }
    let elapsed = started.elapsed();
    seed.wait_for("the pool status counts all 9", WAIT, "ctl", |s| {
        s.get("ipampools", None, "metallb")
            .is_some_and(|p| p["status"]["allocations"] == 9)
    })
    .await;
    let updates = seed.api.stats().count("update", "ipampools/status") - before;
    // One pool serves dc-2: once per cluster would be 8.
    let bound = elapsed.as_secs() + 2;
    assert!(
        updates <= bound,
        "{updates} pool status updates for 8 clusters in {elapsed:?} (at most {bound})\n{}",
        seed.log("ctl")
    );
}
