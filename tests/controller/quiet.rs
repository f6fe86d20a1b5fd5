//! A controller with nothing to do stays idle, also after a write failed once, and after the
//! object a failed write was for is gone.

use std::time::Duration;

use serde_json::json;

use super::support::{Controller, POOLS, Seed};

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

/// A controller started where there is no addons directory (the applier is off, and the
/// planning loop is the one writer of Clusters), settled on cluster `a` of `dc-1`, and its
/// (partial, whole, new) pass counts then.
async fn settled_on_a(seed: &Seed) -> (Controller, [u64; 3]) {
    let ctl = seed.controller_in("ctl", seed.dir(), &[]);
    seed.apply(POOLS);
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated and ready", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated" && ready(s, "a")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let counts = pass_counts(&ctl).await;
    (ctl, counts)
}

async fn pass_counts(ctl: &Controller) -> [u64; 3] {
    [
        ctl.passes_of("partial").await,
        ctl.passes_of("whole").await,
        ctl.passes_of("new").await,
    ]
}

/// Waits for `b` allocated and ready with the injected conflict used, lets whatever the
/// conflict leaves to do run, and checks the controller met it (its debug line `met`).
async fn b_served_after_the_conflict(seed: &Seed, met: &str) {
    seed.wait_for(
        "b allocated and ready, the conflict met",
        WAIT,
        "ctl",
        |s| {
            s.phase("b", "metallb") == "Allocated" && ready(s, "b") && s.api.pending_failures() == 0
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        seed.full_log("ctl").contains(met),
        "the controller met the conflict ({met:?})\n{}",
        seed.log("ctl")
    );
}

/// `b` was served by a short pass after `before`, and nothing planned again.
async fn served_without_planning(seed: &Seed, ctl: &Controller, before: [u64; 3], what: &str) {
    let [partial, whole, new] = pass_counts(ctl).await;
    assert!(
        new > before[2],
        "b was served by a short pass\n{}",
        seed.log("ctl")
    );
    assert_eq!(
        (partial, whole),
        (before[0], before[1]),
        "{what} made the controller plan again (partial, whole passes)\n{}",
        seed.log("ctl")
    );
}

/// A cluster status patch refused with a conflict (somebody wrote the cluster since it was
/// read: the applier's `AddonsReady`, or kipam's own last status whose echo the watch had not
/// brought yet) is read again and written on what changed. It used to leave the cluster to
/// the next pass, which then had to plan again (a growth pass's conflicts made the next pass
/// plan the whole seed while refusals and new clusters waited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_status_that_meets_a_conflict_is_written_again_without_planning() {
    let seed = Seed::start("quiet-conflict").await;
    let (ctl, before) = settled_on_a(&seed).await;

    seed.api.inject_failures("patch", "clusters/status", 1, 409);
    seed.cluster("b", "dc-1");
    b_served_after_the_conflict(&seed, "cluster changed under its status update").await;
    served_without_planning(&seed, &ctl, before, "a status conflict").await;
    seed.assert_no_overlap_no_leak();
}

/// kipam's finalizer patch of a new Cluster that meets a conflict (the applier wrote the
/// Cluster's `AddonsReady` first, as it does for a cluster that comes with its Addons) is made
/// again on the Cluster read anew. It used to make the next pass plan again, and the status
/// the pass wrote after it must not put back an older copy of the conditions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finalizer_patch_that_meets_a_conflict_is_made_again_without_planning() {
    let seed = Seed::start("quiet-finalizer").await;
    let (ctl, before) = settled_on_a(&seed).await;

    // Another writer's condition lands on b before kipam's finalizer patch does: the patch,
    // made from the cached copy, is refused.
    seed.api.inject_failures("patch", "clusters", 1, 409);
    seed.cluster("b", "dc-1");
    seed.api
        .set_status(
            "clusters",
            None,
            "b",
            json!({"conditions": [{
                "type": "AddonsReady", "status": "True", "reason": "InSync",
                "message": "1 addons in sync", "lastTransitionTime": "2026-01-01T00:00:00Z",
            }]}),
        )
        .expect("b's status");
    b_served_after_the_conflict(&seed, "cluster changed under its finalizer patch").await;
    let b = seed.api.get("clusters", None, "b").expect("b");
    assert!(
        b["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "ipam.kipam.dev/release-allocations")),
        "b has kipam's finalizer: {b}"
    );
    assert!(
        seed.condition("clusters", "b", "AddonsReady").is_some(),
        "the other writer's condition is kept: {b}"
    );
    served_without_planning(&seed, &ctl, before, "a finalizer conflict").await;
    seed.assert_no_overlap_no_leak();
}

/// At start kipam adds its finalizer to each pool, then writes the pool's status from the
/// copy the pass read before: that update met a conflict with kipam's own finalizer patch,
/// every time, and made the next pass plan again. It is now written again on the version the
/// server holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_status_that_meets_a_conflict_is_written_again_without_planning() {
    let seed = Seed::start("quiet-pool-status").await;
    seed.apply(POOLS);
    seed.cluster("a", "dc-1");
    let ctl = seed.controller_in("ctl", seed.dir(), &[]);
    seed.wait_for("a allocated, the pool's status written", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
            && s.get("ipampools", None, "metallb")
                .is_some_and(|p| p["status"]["allocations"] == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        seed.full_log("ctl")
            .contains("pool changed under its status update; writing it again"),
        "the pool status met the conflict with the finalizer patch\n{}",
        seed.log("ctl")
    );
    assert_eq!(
        (ctl.passes_of("whole").await, ctl.passes_of("partial").await),
        (1, 0),
        "the pool status conflict made the controller plan again (whole, partial passes)\n{}",
        seed.log("ctl")
    );
    seed.assert_no_overlap_no_leak();
}

fn ready(seed: &Seed, cluster: &str) -> bool {
    seed.condition("clusters", cluster, "IPAMReady")
        .is_some_and(|c| c["status"] == "True" && c["reason"] == "Allocated")
}
