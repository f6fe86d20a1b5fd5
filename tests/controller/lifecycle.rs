//! Pools deleted with Delete and Retain, a datacenter removed, a cluster deleted.

use std::time::Duration;

use super::support::{POOLS, Seed};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_policies_datacenter_removal_and_cluster_deletion() {
    let seed = Seed::start("lifecycle").await;
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    seed.cluster("a", "dc-1");
    seed.cluster("b", "dc-2");
    seed.wait_for("all allocated", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
            && s.phase("a", "metallb-ipv6") == "Allocated"
            && s.phase("b", "metallb") == "Allocated"
    })
    .await;

    // dc-2 leaves metallb (Delete): b's allocation goes, a's stays.
    seed.apply(&POOLS.replace(
        "    dc-2:\n      type: prefix\n      poolCidr: 10.1.0.0/24\n      allocationPrefix: 28\n",
        "",
    ));
    seed.wait_for("b's metallb allocation released", WAIT, "ctl", |s| {
        s.allocation("b", "metallb").is_none()
    })
    .await;
    assert_eq!(seed.held("a", "metallb"), "10.0.0.0-10.0.0.3");

    // metallb-ipv6 (Retain) deleted: the pool goes, a's allocation stays.
    let kept = seed.held("a", "metallb-ipv6");
    seed.delete("ipampools", None, "metallb-ipv6");
    seed.wait_for("the Retain pool is gone", WAIT, "ctl", |s| {
        s.get("ipampools", None, "metallb-ipv6").is_none()
    })
    .await;
    assert_eq!(seed.held("a", "metallb-ipv6"), kept);

    // It comes back: the retained allocation is a's again, unchanged; a new cluster gets the
    // next addresses.
    seed.apply(POOLS);
    seed.cluster("c", "dc-1");
    seed.wait_for("c allocated from the recreated pool", WAIT, "ctl", |s| {
        s.phase("c", "metallb-ipv6") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("a", "metallb-ipv6"), kept);
    assert_eq!(seed.held("c", "metallb-ipv6"), "2001:db8::10-2001:db8::1f");

    // metallb (Delete) deleted: its allocations go, then the pool.
    seed.delete("ipampools", None, "metallb");
    seed.wait_for("metallb and its allocations gone", WAIT, "ctl", |s| {
        s.get("ipampools", None, "metallb").is_none()
            && s.allocation("a", "metallb").is_none()
            && s.allocation("c", "metallb").is_none()
    })
    .await;
    assert_eq!(seed.held("a", "metallb-ipv6"), kept);

    // Cluster a deleted: everything it held goes, then the cluster and its namespace.
    seed.delete("clusters", None, "a");
    seed.wait_for("cluster a fully gone", WAIT, "ctl", |s| {
        s.get("clusters", None, "a").is_none()
            && s.allocation("a", "metallb-ipv6").is_none()
            && s.get("namespaces", None, "cluster-a").is_none()
    })
    .await;
    assert_eq!(seed.held("c", "metallb-ipv6"), "2001:db8::10-2001:db8::1f");
    seed.assert_no_overlap_no_leak();
}

/// A cluster whose spec becomes invalid keeps what it holds, and what it holds stays reserved:
/// another cluster never gets its addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_cluster_keeps_its_addresses_reserved() {
    let seed = Seed::start("invalid-cluster").await;
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
    })
    .await;
    let held = seed.held("a", "metallb");
    // The schema accepts this override, validation does not (at most one setting per pool).
    seed.api
        .apply(&serde_json::json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "a"},
            "spec": {"datacenter": "dc-1", "ipam": {"metallb": {"allocationRange": 2, "optOut": true}}},
        }))
        .expect("the server accepts the edit");
    seed.cluster("b", "dc-1");
    seed.wait_for("b allocated", WAIT, "ctl", |s| {
        s.phase("b", "metallb") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("a", "metallb"), held);
    seed.assert_no_overlap_no_leak();
}
