//! The first promise, fault by fault: an invalid edit, an allocation that no longer fits its
//! pool, a failover with a lagging cache, failed writes, and a leader paused past its lease.
//! Each ends with no two allocations of a pool and datacenter sharing an address.

use std::time::{Duration, Instant};

use serde_json::json;

use super::support::{POOLS, Seed};

fn cluster_object(name: &str, dc: &str, ipam: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"datacenter": dc, "ipam": ipam},
    })
}

/// Cluster x's namespace and an `IPAMAllocation` of pool metallb in dc-1 holding `addresses`,
/// written straight into the store (as an earlier leader, or a human, would have).
fn hand_made_allocation(seed: &Seed, addresses: &str) {
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "cluster-x", "labels": {"ipam.kipam.dev/cluster": "x"}}}))
        .expect("namespace");
    seed.api
        .apply(&json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMAllocation",
            "metadata": {"name": "metallb", "namespace": "cluster-x", "labels": {
                "ipam.kipam.dev/pool": "metallb", "ipam.kipam.dev/cluster": "x",
                "ipam.kipam.dev/datacenter": "dc-1"}},
            "spec": {"type": "range", "dc": "dc-1", "addresses": [addresses]},
        }))
        .expect("allocation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_cluster_edit_frees_nothing() {
    let seed = Seed::start("invalid-edit").await;
    seed.apply(POOLS);
    let _ctl = seed.controller("ctl");
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated", Duration::from_secs(20), "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
    })
    .await;
    let held = seed.held("a", "metallb");
    // An edit kipam cannot use: a pinned subnet with host bits set.
    seed.api
        .apply(&cluster_object(
            "a",
            "dc-1",
            json!({"metallb": {"cidr": "10.0.0.1/30"}}),
        ))
        .expect("edit");
    seed.wait_for("a reported invalid", Duration::from_secs(20), "ctl", |s| {
        s.condition("clusters", "a", "IPAMReady")
            .is_some_and(|c| c["reason"] == "InvalidSpec")
    })
    .await;
    for c in ["b", "c", "d", "e"] {
        seed.cluster(c, "dc-1");
    }
    // The /28 holds four clusters of four: a keeps its four, b..d get the rest, e waits.
    seed.wait_for(
        "b..d allocated, e failed",
        Duration::from_secs(20),
        "ctl",
        |s| {
            ["b", "c", "d"]
                .iter()
                .all(|c| s.phase(c, "metallb") == "Allocated")
                && s.phase("e", "metallb") == "Failed"
        },
    )
    .await;
    assert_eq!(seed.held("a", "metallb"), held);
    assert_eq!(seed.overlaps(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusion_over_a_live_allocation_keeps_it_reserved_and_reported() {
    let seed = Seed::start("exclusion").await;
    seed.apply(POOLS);
    let _ctl = seed.controller("ctl");
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated", Duration::from_secs(20), "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("a", "metallb"), "10.0.0.0-10.0.0.3");
    let mut pool: serde_json::Value = seed.get("ipampools", None, "metallb").expect("pool");
    pool["spec"]["datacenters"]["dc-1"]["excludeRanges"] = json!(["10.0.0.2"]);
    let pool = json!({"apiVersion": pool["apiVersion"], "kind": "IPAMPool",
        "metadata": {"name": "metallb"}, "spec": pool["spec"]});
    seed.api.apply(&pool).expect("exclusion added");
    seed.wait_for("a in conflict", Duration::from_secs(20), "ctl", |s| {
        s.phase("a", "metallb") == "Conflict"
    })
    .await;
    for c in ["b", "c", "d"] {
        seed.cluster(c, "dc-1");
    }
    seed.wait_for("b..d allocated", Duration::from_secs(20), "ctl", |s| {
        ["b", "c", "d"]
            .iter()
            .all(|c| s.phase(c, "metallb") == "Allocated")
    })
    .await;
    assert_eq!(seed.held("a", "metallb"), "10.0.0.0-10.0.0.3");
    assert_eq!(seed.overlaps(), Vec::<String>::new());
    let condition = seed
        .condition("ipampools", "metallb", "Conflict")
        .expect("Conflict condition");
    assert_eq!(condition["status"], "True");
    assert!(
        condition["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cluster-a/metallb"),
        "{condition}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_a_lagging_cluster_cache_releases_nothing() {
    let seed = Seed::start("lagging").await;
    seed.apply(POOLS);
    let mut one = seed.controller("one");
    seed.wait_for("one leads", Duration::from_secs(20), "one", |s| {
        s.lease_holder() == "one"
    })
    .await;
    let _two = seed.controller("two");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // From now on both replicas learn of changes 30 s late. A cluster and the allocation an
    // earlier leader wrote for it appear; then the leader dies.
    seed.api.set_watch_delay(Duration::from_secs(30));
    seed.cluster("x", "dc-1");
    hand_made_allocation(&seed, "10.0.0.8-10.0.0.11");
    let uid = seed.allocation("x", "metallb").and_then(|a| a.metadata.uid);
    one.kill();
    seed.wait_for("two leads", Duration::from_secs(20), "two", |s| {
        s.lease_holder() == "two"
    })
    .await;
    // Two passes' worth of time on the new leader, whose cluster cache has no x yet.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        seed.allocation("x", "metallb").and_then(|a| a.metadata.uid),
        uid,
        "the allocation of a cluster that exists was released\n{}",
        seed.log("two")
    );
    assert_eq!(seed.api.stats().count("delete", "ipamallocations"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_writes_are_reported_and_retried_with_backoff() {
    let seed = Seed::start("write-errors").await;
    seed.apply(POOLS);
    seed.api
        .inject_failures("create", "ipamallocations", 10_000, 422);
    let ctl = seed.controller("ctl");
    seed.cluster("a", "dc-1");
    seed.wait_for(
        "a reports the failed write",
        Duration::from_secs(20),
        "ctl",
        |s| {
            s.condition("clusters", "a", "IPAMReady")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "WriteFailed")
        },
    )
    .await;
    let (_, metrics) = Seed::http_get(ctl.metrics_port, "/metrics").await;
    assert!(
        metrics.contains("kipam_write_errors_total{kind=\"IPAMAllocation\",reason=\"Invalid\"}"),
        "{metrics}"
    );
    // Backoff, not a hot loop: 200 ms doubling per object, so at most four tries in 4 s for
    // each of a's two allocations (a pass every 200 ms would make 40).
    let before = seed.api.stats().count("create", "ipamallocations");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let tries = seed.api.stats().count("create", "ipamallocations") - before;
    assert!(tries <= 10, "{tries} creates in 4 s");
    let log = seed.log("ctl");
    assert!(
        log.contains("WARN"),
        "failed writes are logged at warn level:\n{log}"
    );
}

/// Two replicas; the leader is frozen with SIGSTOP past its lease while the other takes over,
/// then thawed in the middle of whatever it was doing; writes fail now and then. Overlap is
/// checked after every step, and everything converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_cannot_hand_out_an_address_twice() {
    let seed = Seed::start("sigstop").await;
    seed.apply(super::crashes::POOLS);
    let ctls = [seed.controller("r0"), seed.controller("r1")];
    let mut created = 0usize;
    let mut takeovers = Vec::new();
    let check = |seed: &Seed, step: &str| {
        let found = seed.overlaps();
        assert!(found.is_empty(), "overlap after {step}: {found:?}");
    };
    for round in 0..5 {
        seed.wait_for("a leader", Duration::from_secs(20), "r0", |s| {
            !s.lease_holder().is_empty()
        })
        .await;
        let holder = seed.lease_holder();
        let idx = if holder == "r0" { 0 } else { 1 };
        // Clusters arrive, then the leader freezes in the middle of serving them.
        for _ in 0..25 {
            seed.cluster(&format!("c{created:03}"), "dc-1");
            created += 1;
        }
        tokio::time::sleep(Duration::from_millis(150 * round as u64)).await;
        ctls[idx].signal("STOP");
        let stopped = Instant::now();
        check(&seed, "stop");
        if round % 2 == 1 {
            seed.api
                .inject_failures("create", "ipamallocations", 3, 500);
            seed.api.inject_failures("patch", "ipampoolrecords", 2, 500);
            seed.api
                .inject_failures("update", "ipamallocations/status", 2, 429);
        }
        for _ in 0..15 {
            seed.cluster(&format!("c{created:03}"), "dc-1");
            created += 1;
        }
        let other = format!("r{}", 1 - idx);
        let n = created;
        seed.wait_for(
            "the other replica takes over and serves",
            Duration::from_secs(40),
            &other,
            |s| {
                (0..n).all(|i| {
                    let c = format!("c{i:03}");
                    s.phase(&c, "lb") == "Allocated" && s.phase(&c, "lb6") == "Allocated"
                })
            },
        )
        .await;
        takeovers.push(stopped.elapsed());
        check(&seed, "takeover");
        // Thawed while the new leader is busy with a fresh burst.
        for _ in 0..5 {
            seed.cluster(&format!("c{created:03}"), "dc-1");
            created += 1;
        }
        ctls[idx].signal("CONT");
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            check(&seed, "thaw");
        }
    }
    let n = created;
    seed.wait_for("everything converges", Duration::from_secs(60), "r0", |s| {
        (0..n).all(|i| {
            let c = format!("c{i:03}");
            s.phase(&c, "lb") == "Allocated" && s.phase(&c, "lb6") == "Allocated"
        })
    })
    .await;
    assert_eq!(seed.assert_no_overlap_no_leak(), 2 * created);
    eprintln!(
        "clusters {created}, time from SIGSTOP to all served by the other replica: {takeovers:?}"
    );
}

/// A candidate waits out the Lease's own `leaseDurationSeconds`, not only its own
/// `--lease-duration`: a holder with a longer lease may still be writing until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_honours_the_leases_own_duration() {
    let seed = Seed::start("lease-duration").await;
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string();
    seed.api
        .apply(&json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "kipam-seed", "namespace": "kipam-system"},
            "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": 10,
                     "acquireTime": now, "renewTime": now, "leaseTransitions": 0},
        }))
        .expect("lease");
    let started = Instant::now();
    let _ctl = seed.controller("ctl"); // --lease-duration 3
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        seed.lease_holder(),
        "ghost",
        "taken over before the Lease's 10 s ran out"
    );
    seed.wait_for(
        "takes over after 10 s",
        Duration::from_secs(15),
        "ctl",
        |s| s.lease_holder() == "ctl",
    )
    .await;
    assert!(started.elapsed() >= Duration::from_secs(10));
}

/// An `IPAMAllocation` whose addresses cannot be read might hold anything: no new address is
/// handed out in its pool and datacenter until it is fixed, and the pool says which object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_allocation_stops_new_allocations_in_its_pool() {
    let seed = Seed::start("unreadable").await;
    seed.apply(POOLS);
    seed.cluster("x", "dc-1");
    // The schema's shape accepts it; no address parser does.
    hand_made_allocation(&seed, "10.0.0.999-10.0.1.2");
    let _ctl = seed.controller("ctl");
    seed.cluster("b", "dc-1");
    seed.wait_for(
        "b waits, the pool names the object",
        Duration::from_secs(20),
        "ctl",
        |s| {
            s.phase("b", "metallb") == "Failed"
                && s.condition("ipampools", "metallb", "Conflict")
                    .is_some_and(|c| {
                        c["status"] == "True"
                            && c["message"]
                                .as_str()
                                .unwrap_or_default()
                                .contains("cluster-x/metallb cannot be read")
                    })
        },
    )
    .await;
    // The unreadable object is left as it was; its status says why.
    let x = seed.allocation("x", "metallb").expect("still there");
    assert_eq!(x.spec.addresses, vec!["10.0.0.999-10.0.1.2"]);
    assert_eq!(seed.phase("x", "metallb"), "Conflict");
    // Other pools are not blocked.
    seed.wait_for("b's IPv6 allocation", Duration::from_secs(20), "ctl", |s| {
        s.phase("b", "metallb-ipv6") == "Allocated"
    })
    .await;
    // Fixed by hand: b is served at once.
    seed.delete("ipamallocations", Some("cluster-x"), "metallb");
    seed.wait_for(
        "b allocated once the object is gone",
        Duration::from_secs(20),
        "ctl",
        |s| s.phase("b", "metallb") == "Allocated",
    )
    .await;
}

/// A datacenter name that cannot be a label value is refused by validation with the rule,
/// before kipam writes anything (today's fault: a 422 on every pass while all looked fine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datacenter_name_that_cannot_be_a_label_is_reported_not_retried() {
    let seed = Seed::start("eu-west").await;
    seed.apply(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: lb\nspec:\n  datacenters:\n    \"eu west\":\n      type: range\n      poolCidr: 10.9.0.0/24\n      allocationRange: 4\n",
    );
    let _ctl = seed.controller("ctl");
    seed.wait_for(
        "the pool is reported invalid",
        Duration::from_secs(20),
        "ctl",
        |s| {
            s.condition("ipampools", "lb", "Ready").is_some_and(|c| {
                c["status"] == "False"
                    && c["message"]
                        .as_str()
                        .unwrap_or_default()
                        .contains("\"eu west\": must be a DNS-1123 label")
            })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(seed.api.stats().count("create", "ipamallocations"), 0);
    assert_eq!(seed.api.stats().count("create", "ipampoolrecords"), 0);
}
