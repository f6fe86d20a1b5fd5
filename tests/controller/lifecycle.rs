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

/// A cluster deleted from a full pool while another waits: at no moment do two
/// `IPAMAllocation`s show the same address (the waiting cluster's is written only once the
/// deleted cluster's is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_clusters_range_goes_to_a_waiting_cluster_only_once_its_object_is_gone() {
    use futures::StreamExt;
    use kipam::resources::IPAMAllocation;
    use kube::api::{Api, WatchEvent, WatchParams};

    let seed = Seed::start("lifecycle-handover").await;
    seed.apply(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: small}\nspec:\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.9.0.0/29, allocationRange: 4}\n",
    );
    let _ctl = seed.controller("ctl");
    seed.cluster("a", "dc-1");
    seed.cluster("b", "dc-1");
    seed.wait_for("a and b allocated", WAIT, "ctl", |s| {
        s.phase("a", "small") == "Allocated" && s.phase("b", "small") == "Allocated"
    })
    .await;
    seed.cluster("c", "dc-1");
    seed.wait_for("c waits", WAIT, "ctl", |s| {
        s.condition("clusters.ipam.kipam.dev", "c", "IPAMReady")
            .is_some_and(|c| c["status"] == "False")
    })
    .await;
    assert_ne!(seed.phase("c", "small"), "Allocated");
    let a_held = seed.held("a", "small");

    let path = seed.dir().join("kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let api: Api<IPAMAllocation> = Api::all(client);
    let rv = seed.api.resource_version().to_string();
    let mut events = api
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    let mut live: std::collections::BTreeMap<String, String> = seed
        .allocations()
        .into_iter()
        .map(|a| {
            (
                a.metadata.namespace.clone().unwrap_or_default(),
                a.spec.addresses.join(","),
            )
        })
        .collect();
    seed.delete("clusters.ipam.kipam.dev", None, "a");
    seed.wait_for("c allocated", WAIT, "ctl", |s| {
        s.phase("c", "small") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("c", "small"), a_held);
    // Every event up to 300 ms of quiet after c got its range; the watch must neither fail
    // nor end meanwhile (a watch that stopped early would have checked nothing).
    let mut seen = 0;
    loop {
        let event = match tokio::time::timeout(Duration::from_millis(300), events.next()).await {
            Err(_) => break,
            Ok(None) => panic!("the watch of IPAMAllocations ended after {seen} events"),
            Ok(Some(Err(e))) => {
                panic!("the watch of IPAMAllocations failed after {seen} events: {e}")
            }
            Ok(Some(Ok(event))) => event,
        };
        seen += 1;
        match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                live.insert(
                    o.metadata.namespace.clone().unwrap_or_default(),
                    o.spec.addresses.join(","),
                );
            }
            WatchEvent::Deleted(o) => {
                live.remove(&o.metadata.namespace.clone().unwrap_or_default());
            }
            WatchEvent::Error(e) => panic!("the watch of IPAMAllocations sent an error: {e:?}"),
            WatchEvent::Bookmark(_) => {}
        }
        let holders: Vec<&String> = live
            .iter()
            .filter(|(_, a)| !a.is_empty() && **a == a_held)
            .map(|(n, _)| n)
            .collect();
        assert!(holders.len() <= 1, "{a_held} shown by {holders:?} at once");
    }
    // The events replayed reach the state the API server shows: a's allocation deleted, c's
    // holding a's range.
    assert_eq!(
        live.get("cluster-c"),
        Some(&a_held),
        "the watch never showed c holding {a_held} ({seen} events): {live:?}"
    );
    assert!(
        !live.contains_key("cluster-a"),
        "the watch never showed a's allocation deleted ({seen} events): {live:?}"
    );
}

/// A pool switched to `reclaimPolicy: Retain` and deleted at once, before kipam rewrote its
/// allocations' reclaim-policy annotation: the pool used to stay `Terminating` for good (the
/// annotation's rewrite waited for a record commit that a pool being deleted never gets, and
/// the loop planned again every 200 ms), and once it went, its allocations were released as
/// "pool no longer exists". Now the annotation is rewritten without a commit (it reserves
/// nothing), the pool goes, and its allocations stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_set_to_retain_and_deleted_at_once_goes_and_keeps_its_allocations() {
    let seed = Seed::start("lifecycle-retain-at-once").await;
    let _ctl = seed.controller("ctl");
    let pool = |policy: &str| {
        format!(
            "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {{name: lb}}
spec:
  reclaimPolicy: {policy}
  datacenters:
    dc-1: {{type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}}
"
        )
    };
    seed.apply(&pool("Delete"));
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated", WAIT, "ctl", |s| {
        s.phase("a", "lb") == "Allocated"
    })
    .await;
    let kept = seed.held("a", "lb");
    seed.apply(&pool("Retain"));
    seed.delete("ipampools", None, "lb");
    seed.wait_for("the pool is gone", WAIT, "ctl", |s| {
        s.get("ipampools", None, "lb").is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        seed.held("a", "lb"),
        kept,
        "the retained allocation changed"
    );
}

/// Who holds what, by the records the server stores for `pool`: cluster -> its entry's
/// addresses and subnet, joined over shards.
fn recorded(seed: &Seed, pool: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for r in seed.api.list("ipampoolrecords", None) {
        let Ok(r) = serde_json::from_value::<kipam::resources::IPAMPoolRecord>(r) else {
            continue;
        };
        if r.spec.pool != pool {
            continue;
        }
        for (holder, entry) in r.spec.reservations {
            let held = out.entry(holder).or_default();
            held.extend(entry.addresses);
            held.extend(entry.cidr);
        }
    }
    out
}

/// A pool deleted with `Retain` and created again (by the same name, so with a new uid):
/// its records went with the old pool (garbage collection), while the allocations it kept
/// stay and are taken up by the new pool as they are. The new pool's records must hold
/// them again, or its allocator would hand their addresses to the next cluster. This used to
/// stay unrecorded until the periodic resync: the leader kept its own copy of the collected
/// records and found nothing to commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_deleted_with_retain_and_created_again_records_what_it_kept() {
    let seed = Seed::start("lifecycle-retain-again").await;
    let _ctl = seed.controller("ctl");
    let pool = "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: lb}
spec:
  reclaimPolicy: Retain
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}
";
    seed.apply(pool);
    seed.cluster("a", "dc-1");
    seed.cluster("b", "dc-1");
    seed.wait_for("a and b allocated and recorded", WAIT, "ctl", |s| {
        s.phase("a", "lb") == "Allocated"
            && s.phase("b", "lb") == "Allocated"
            && recorded(s, "lb").len() == 2
    })
    .await;
    let kept = (seed.held("a", "lb"), seed.held("b", "lb"));
    for round in 0..2 {
        seed.delete("ipampools", None, "lb");
        seed.wait_for("the pool and its records are gone", WAIT, "ctl", |s| {
            s.get("ipampools", None, "lb").is_none() && recorded(s, "lb").is_empty()
        })
        .await;
        if round == 1 {
            // Let the leader see the pool gone before it comes back.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        seed.apply(pool);
        seed.wait_for("the kept allocations recorded again", WAIT, "ctl", |s| {
            let r = recorded(s, "lb");
            r.len() == 2 && s.phase("a", "lb") == "Allocated" && s.phase("b", "lb") == "Allocated"
        })
        .await;
        assert_eq!(
            (seed.held("a", "lb"), seed.held("b", "lb")),
            kept,
            "round {round}: the kept allocations changed"
        );
    }
    // And a new cluster gets other addresses.
    seed.cluster("c", "dc-1");
    seed.wait_for("c allocated", WAIT, "ctl", |s| {
        s.phase("c", "lb") == "Allocated"
    })
    .await;
    seed.assert_no_overlap_no_leak();
}
