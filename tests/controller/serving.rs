//! Allocation in any order, statuses, conditions, exhaustion and recovery.

use std::time::Duration;

use serde_json::Value;

use super::support::{POOLS, Seed};

const WAIT: Duration = Duration::from_secs(30);

fn ready(seed: &Seed, cluster: &str) -> bool {
    seed.condition("clusters", cluster, "IPAMReady")
        .is_some_and(|c| c["status"] == "True" && c["reason"] == "Allocated")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_then_pools_all_allocated_with_statuses() {
    let seed = Seed::start("order").await;
    // Clusters exist before the controller and before any pool.
    seed.cluster("a1", "dc-1");
    seed.cluster("a2", "dc-1");
    // a2's namespace was made by hand beforehand: kipam adopts it with its label.
    seed.apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cluster-a2\n");
    let ctl = seed.controller("ctl");
    seed.wait_for("clusters without pools are ready", WAIT, "ctl", |s| {
        s.condition("clusters", "a1", "IPAMReady")
            .is_some_and(|c| c["reason"] == "NoPools")
    })
    .await;
    seed.apply(POOLS);
    seed.cluster("b1", "dc-2");
    seed.wait_for("every cluster allocated", WAIT, "ctl", |s| {
        ready(s, "a1") && ready(s, "a2") && ready(s, "b1")
    })
    .await;

    // Oldest first, KKP's first-fit order.
    assert_eq!(seed.held("a1", "metallb"), "10.0.0.0-10.0.0.3");
    assert_eq!(seed.held("a2", "metallb"), "10.0.0.4-10.0.0.7");
    assert_eq!(seed.held("b1", "metallb"), "10.1.0.0/28");
    assert_eq!(seed.held("a1", "metallb-ipv6"), "2001:db8::-2001:db8::f");
    assert!(
        seed.allocation("b1", "metallb-ipv6").is_none(),
        "the IPv6 pool does not serve dc-2"
    );
    for (c, p) in [
        ("a1", "metallb"),
        ("a2", "metallb"),
        ("b1", "metallb"),
        ("a1", "metallb-ipv6"),
    ] {
        assert_eq!(seed.phase(c, p), "Allocated");
        let a = seed.allocation(c, p).unwrap();
        let labels = a.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("ipam.kipam.dev/pool").map(String::as_str),
            Some(p)
        );
        assert_eq!(
            labels.get("ipam.kipam.dev/cluster").map(String::as_str),
            Some(c)
        );
        // A healthy allocation carries no status: its spec and creation time say it all.
        assert_eq!(a.status, None, "{c}/{p}");
        assert!(a.metadata.creation_timestamp.is_some());
    }

    // The namespace is owned by its Cluster; finalizers are in place.
    let cluster = seed.get("clusters", None, "a1").unwrap();
    let ns = seed
        .get("namespaces", None, "cluster-a1")
        .expect("namespace created");
    assert_eq!(
        ns.pointer("/metadata/ownerReferences/0/uid"),
        cluster.pointer("/metadata/uid")
    );
    assert_eq!(
        cluster.pointer("/status/namespace").and_then(Value::as_str),
        Some("cluster-a1")
    );
    assert!(
        cluster["metadata"]["finalizers"]
            .to_string()
            .contains("ipam.kipam.dev/release-allocations")
    );
    let pool = seed.get("ipampools", None, "metallb").unwrap();
    assert!(
        pool["metadata"]["finalizers"]
            .to_string()
            .contains("ipam.kipam.dev/reclaim-allocations")
    );

    // Pool status: exact usage per datacenter and conditions.
    seed.wait_for("both pool statuses written", WAIT, "ctl", |s| {
        let allocations = |pool: &str| {
            s.get("ipampools", None, pool)
                .and_then(|p| p.pointer("/status/datacenters/dc-1/allocations").cloned())
        };
        allocations("metallb") == Some(serde_json::json!(2))
            && allocations("metallb-ipv6") == Some(serde_json::json!(2))
    })
    .await;
    let pool = seed.get("ipampools", None, "metallb").unwrap();
    let dc1 = &pool["status"]["datacenters"]["dc-1"];
    assert_eq!(dc1["total"], "16");
    assert_eq!(dc1["allocated"], "8");
    assert_eq!(dc1["available"], "8");
    assert_eq!(dc1["utilisationPercent"], 50);
    assert_eq!(pool["status"]["maxUtilisationPercent"], 50);
    let v6 = seed.get("ipampools", None, "metallb-ipv6").unwrap();
    assert_eq!(
        v6["status"]["datacenters"]["dc-1"]["total"],
        "18446744073709551616"
    );
    assert_eq!(
        seed.condition("ipampools", "metallb", "Ready").unwrap()["status"],
        "True"
    );
    assert_eq!(
        seed.condition("ipampools", "metallb", "Overlap").unwrap()["status"],
        "False"
    );

    // Health and metrics endpoints.
    let (code, _) = Seed::http_get(ctl.metrics_port, "/healthz").await;
    assert_eq!(code, 200);
    let (code, _) = Seed::http_get(ctl.metrics_port, "/readyz").await;
    assert_eq!(code, 200);
    let (code, body) = Seed::http_get(ctl.metrics_port, "/metrics").await;
    assert_eq!(code, 200);
    // (Leadership may flap for an instant on a loaded machine; the gauge exists either way.)
    assert!(body.contains("kipam_leader "), "{body}");
    assert!(
        body.contains("kipam_pool_utilization_ratio{pool=\"metallb\",datacenter=\"dc-1\"} 0.5"),
        "{body}"
    );
    assert!(body.contains("kipam_api_writes_total{"), "{body}");
    assert_eq!(seed.assert_no_overlap_no_leak(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pool_serves_the_waiting_cluster_when_space_frees() {
    let seed = Seed::start("exhaust").await;
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    for name in ["c1", "c2", "c3", "c4", "c5"] {
        seed.cluster(name, "dc-1");
    }
    // 16 addresses, 4 per cluster: c5 waits.
    seed.wait_for("c5 fails with a clear reason", WAIT, "ctl", |s| {
        s.phase("c5", "metallb") == "Failed"
            && s.condition("clusters", "c5", "IPAMReady")
                .is_some_and(|c| c["status"] == "False")
    })
    .await;
    let failed = seed.allocation("c5", "metallb").unwrap();
    assert_eq!(
        failed.status.and_then(|s| s.message).unwrap_or_default(),
        "pool metallb/dc-1 (10.0.0.0/28) has 0 free addresses, 4 requested by c5"
    );
    let condition = seed.condition("clusters", "c5", "IPAMReady").unwrap();
    assert_eq!(condition["reason"], "PoolExhausted");
    // The other pool is not blocked.
    assert_eq!(seed.phase("c5", "metallb-ipv6"), "Allocated");
    seed.wait_for("capacity conditions and events", WAIT, "ctl", |s| {
        s.condition("ipampools", "metallb", "CapacityExhausted")
            .is_some_and(|c| c["status"] == "True")
    })
    .await;
    let reasons = |s: &Seed| -> Vec<String> {
        s.api
            .list("events.events.k8s.io", None)
            .iter()
            .filter_map(|e| e["reason"].as_str().map(str::to_string))
            .collect()
    };
    // A plain first allocation gets no event (the object and IPAMReady say it); the failure
    // and the pool's threshold do.
    seed.wait_for(
        "PoolExhausted and CapacityExhausted events",
        WAIT,
        "ctl",
        |s| {
            let r = reasons(s);
            ["PoolExhausted", "CapacityExhausted"]
                .iter()
                .all(|want| r.iter().any(|got| got == want))
        },
    )
    .await;

    // c2 goes: c5 gets exactly c2's addresses, nobody else is touched.
    let before: Vec<(String, Option<String>)> = ["c1", "c3", "c4"]
        .iter()
        .map(|c| {
            let a = seed.allocation(c, "metallb").unwrap();
            (a.spec.addresses.join(","), a.metadata.resource_version)
        })
        .collect();
    let c2_held = seed.held("c2", "metallb");
    seed.delete("clusters", None, "c2");
    seed.wait_for("c2 is gone and c5 allocated", WAIT, "ctl", |s| {
        s.get("clusters", None, "c2").is_none() && s.phase("c5", "metallb") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("c5", "metallb"), c2_held);
    let after: Vec<(String, Option<String>)> = ["c1", "c3", "c4"]
        .iter()
        .map(|c| {
            let a = seed.allocation(c, "metallb").unwrap();
            (a.spec.addresses.join(","), a.metadata.resource_version)
        })
        .collect();
    assert_eq!(before, after, "no other allocation changed");
    seed.wait_for("c2's namespace collected", WAIT, "ctl", |s| {
        s.get("namespaces", None, "cluster-c2").is_none()
    })
    .await;
    // The cluster status follows its allocations (written at the end of the same pass).
    seed.wait_for("c5 reports IPAMReady", WAIT, "ctl", |s| {
        s.condition("clusters", "c5", "IPAMReady")
            .is_some_and(|c| c["status"] == "True")
    })
    .await;
    seed.assert_no_overlap_no_leak();
}

/// Issue 39, item 2: a cluster's writes are a chain of its own — its finalizer and namespace,
/// then its allocations once its pool's record commit landed — not one phase of the whole seed
/// after another. Before, a pass created every cluster's namespace before any allocation, so
/// with many clusters waiting when a replica took the lease the first allocation waited for
/// all of them. Judged by the order of the writes (the store's revisions), not by time: with
/// `--write-concurrency 4`, at most 8 chains run at once and a cluster's chain starts only
/// when an earlier one is over, allocations included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_allocation_is_written_before_every_other_clusters_namespace() {
    let seed = Seed::start("chains").await;
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: wide
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.8.0.0/24
      allocationRange: 1
",
    );
    const CLUSTERS: usize = 40;
    let names: Vec<String> = (0..CLUSTERS).map(|i| format!("w{i:03}")).collect();
    for name in &names {
        seed.cluster(name, "dc-1");
    }
    let _ctl = seed.controller_with("ctl", &["--write-concurrency=4"]);
    seed.wait_for("every cluster allocated", WAIT, "ctl", |s| {
        names.iter().all(|n| ready(s, n))
    })
    .await;

    let version = |o: &Value| -> u64 {
        o["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    };
    let allocations = seed.api.list("ipamallocations", None);
    assert_eq!(allocations.len(), CLUSTERS);
    let first_allocation = allocations.iter().map(version).min().unwrap_or_default();
    let namespaces: Vec<Value> = seed
        .api
        .list("namespaces", None)
        .into_iter()
        .filter(|n| {
            n["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("cluster-w"))
        })
        .collect();
    assert_eq!(namespaces.len(), CLUSTERS);
    let later: Vec<&str> = namespaces
        .iter()
        .filter(|n| version(n) > first_allocation)
        .filter_map(|n| n["metadata"]["name"].as_str())
        .collect();
    // Every chain but the first 8 starts after one of those wrote its allocation.
    assert!(
        later.len() >= CLUSTERS - 8,
        "the first allocation (revision {first_allocation}) waited for the namespaces of {} of {CLUSTERS} clusters; made after it: {later:?}",
        CLUSTERS - later.len()
    );
}
