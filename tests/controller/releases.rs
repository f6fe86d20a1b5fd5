//! Every release frees an address only once no object shows it: a cluster moved to another
//! datacenter, a cluster opting out of a pool, a datacenter removed from a pool and a pin
//! changed, each while another cluster waits for exactly those addresses. The old object's
//! write is made to fail once, so it keeps showing the addresses for a retry's backoff; a
//! watch of every `IPAMAllocation` version checks that the waiting cluster's object never
//! shows them at the same time.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use kipam::address::{AddrRange, Cidr};
use kipam::resources::IPAMAllocation;
use kube::api::{Api, WatchEvent, WatchParams};
use serde_json::{Value, json};

use super::support::Seed;

const WAIT: Duration = Duration::from_secs(30);

/// What one `IPAMAllocation` shows: its datacenter and addresses as (first, last) pairs.
type Shown = (String, Vec<(u128, u128)>);

fn shown(a: &IPAMAllocation) -> Shown {
    let mut ranges: Vec<(u128, u128)> = a
        .spec
        .addresses
        .iter()
        .filter_map(|t| t.parse::<AddrRange>().ok())
        .map(|r| (r.first(), r.last()))
        .collect();
    if let Some(c) = a.spec.cidr.as_deref().and_then(|c| c.parse::<Cidr>().ok()) {
        let r = c.range();
        ranges.push((r.first(), r.last()));
    }
    (a.spec.dc.clone(), ranges)
}

/// Every `IPAMAllocation` version from the moment it starts, kept per object, and every moment
/// at which two clusters' objects of one datacenter showed a common address.
struct History {
    events: futures::stream::BoxStream<'static, Result<WatchEvent<IPAMAllocation>, kube::Error>>,
    live: BTreeMap<(String, String), Shown>,
    doubles: Vec<String>,
}

impl History {
    async fn start(seed: &Seed) -> History {
        let api: Api<IPAMAllocation> = Api::all(client(seed).await);
        let rv = seed.api.resource_version().to_string();
        let events = api
            .watch(&WatchParams::default(), &rv)
            .await
            .expect("watch")
            .boxed();
        let live = seed
            .allocations()
            .iter()
            .map(|a| (key(a), shown(a)))
            .collect();
        History {
            events,
            live,
            doubles: Vec::new(),
        }
    }

    /// Takes every event that arrives within `quiet` of the previous one. A watch that fails
    /// or ends fails the test: a history with a hole proves nothing.
    async fn drain(&mut self, quiet: Duration) {
        loop {
            let event = match tokio::time::timeout(quiet, self.events.next()).await {
                Err(_) => return,
                Ok(None) => panic!("the IPAMAllocation watch ended"),
                Ok(Some(Err(e))) => panic!("the IPAMAllocation watch failed: {e}"),
                Ok(Some(Ok(event))) => event,
            };
            let rv = match &event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                    o.metadata.resource_version.clone().unwrap_or_default()
                }
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(e) => panic!("the IPAMAllocation watch sent an error: {e}"),
            };
            match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                    self.live.insert(key(&o), shown(&o));
                }
                WatchEvent::Deleted(o) => {
                    self.live.remove(&key(&o));
                }
                _ => {}
            }
            self.check(&rv);
        }
    }

    fn check(&mut self, rv: &str) {
        let all: Vec<(&(String, String), &Shown)> = self.live.iter().collect();
        for (i, (ka, (dca, ra))) in all.iter().enumerate() {
            for (kb, (dcb, rb)) in &all[i + 1..] {
                if ka.0 == kb.0 || dca != dcb {
                    continue;
                }
                if ra
                    .iter()
                    .any(|a| rb.iter().any(|b| a.0 <= b.1 && b.0 <= a.1))
                {
                    self.doubles.push(format!(
                        "at resourceVersion {rv}: {}/{} and {}/{} both show an address of datacenter {dca}",
                        ka.0, ka.1, kb.0, kb.1
                    ));
                }
            }
        }
    }

    /// Ends the history: the watch's view must be the store's, and nothing was shown twice.
    /// Also checks that a failure the test injected was used: otherwise the old object's
    /// write never failed and the test proved less than it says.
    async fn finish(mut self, seed: &Seed) {
        assert_eq!(
            seed.api.pending_failures(),
            0,
            "the injected failure was used"
        );
        self.drain(Duration::from_millis(500)).await;
        let listed: BTreeMap<(String, String), Shown> = seed
            .allocations()
            .iter()
            .map(|a| (key(a), shown(a)))
            .collect();
        assert_eq!(self.live, listed, "the watch missed a change");
        assert!(
            self.doubles.is_empty(),
            "one address shown by two clusters at once:\n{}",
            self.doubles.join("\n")
        );
    }
}

async fn client(seed: &Seed) -> kube::Client {
    let path = seed.dir().join("kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

fn key(a: &IPAMAllocation) -> (String, String) {
    (
        a.metadata.namespace.clone().unwrap_or_default(),
        a.metadata.name.clone().unwrap_or_default(),
    )
}

/// Changes a Cluster's spec with `edit`.
fn edit_cluster(seed: &Seed, name: &str, edit: impl FnOnce(&mut Value)) {
    let mut obj = seed
        .get("clusters.ipam.kipam.dev", None, name)
        .expect("cluster exists");
    edit(&mut obj["spec"]);
    if let Some(meta) = obj["metadata"].as_object_mut() {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    seed.api.apply(&obj).expect("cluster edited");
}

/// Starts a controller, lets `first` and `second` fill the pool, makes `waiting` wait, and
/// returns once it does.
async fn full_pool(seed: &Seed, pools: &str, clusters: &[(&str, &str)], waiting: (&str, &str)) {
    seed.apply(pools);
    for (name, extra) in clusters {
        seed.cluster_with(name, "dc-1", extra);
    }
    seed.wait_for("the pool is full", WAIT, "ctl", |s| {
        clusters.iter().all(|(name, _)| {
            s.condition("clusters.ipam.kipam.dev", name, "IPAMReady")
                .is_some_and(|c| c["status"] == "True")
        })
    })
    .await;
    seed.cluster_with(waiting.0, "dc-1", waiting.1);
    seed.wait_for("the last cluster waits", WAIT, "ctl", |s| {
        s.condition("clusters.ipam.kipam.dev", waiting.0, "IPAMReady")
            .is_some_and(|c| c["status"] == "False")
    })
    .await;
}

const SMALL: &str = "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: small}\nspec:\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.9.0.0/29, allocationRange: 4}\n    dc-2: {type: range, poolCidr: 10.8.0.0/29, allocationRange: 4}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_moved_to_another_datacenter_frees_its_range_only_once_its_object_moved() {
    let seed = Seed::start("release-move").await;
    let _ctl = seed.controller("ctl");
    full_pool(&seed, SMALL, &[("a", ""), ("b", "")], ("c", "")).await;
    let a_held = seed.held("a", "small");
    let history = History::start(&seed).await;
    // The move rewrites a's object in place; its first try fails, so it keeps showing dc-1's
    // addresses for a retry's backoff.
    seed.api
        .inject_failures("update", "ipamallocations", 1, 500);
    edit_cluster(&seed, "a", |spec| spec["datacenter"] = json!("dc-2"));
    seed.wait_for("c served with a's old range, a moved", WAIT, "ctl", |s| {
        s.phase("c", "small") == "Allocated"
            && s.allocation("a", "small")
                .is_some_and(|a| a.spec.dc == "dc-2")
    })
    .await;
    history.finish(&seed).await;
    assert_eq!(seed.held("c", "small"), a_held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_opting_out_frees_its_range_only_once_its_object_is_gone() {
    let seed = Seed::start("release-optout").await;
    let _ctl = seed.controller("ctl");
    full_pool(&seed, SMALL, &[("a", ""), ("b", "")], ("c", "")).await;
    let a_held = seed.held("a", "small");
    let history = History::start(&seed).await;
    seed.api
        .inject_failures("delete", "ipamallocations", 1, 500);
    edit_cluster(&seed, "a", |spec| {
        spec["ipam"] = json!({"small": {"optOut": true}});
    });
    seed.wait_for(
        "c served with a's old range, a's object gone",
        WAIT,
        "ctl",
        |s| s.phase("c", "small") == "Allocated" && s.allocation("a", "small").is_none(),
    )
    .await;
    history.finish(&seed).await;
    assert_eq!(seed.held("c", "small"), a_held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datacenter_removed_from_a_pool_frees_its_range_only_once_its_objects_are_gone() {
    // Two pools over the same addresses of dc-1 (one address space): `a` holds half through
    // each, so `c` waits for both. Removing dc-1 from `wide` releases a's range there, which
    // `c` may then get through `narrow` — once a's object of `wide` is gone.
    let pools = "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: wide}\nspec:\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.9.0.0/29, allocationRange: 4}\n    dc-2: {type: range, poolCidr: 10.8.0.0/29, allocationRange: 4}\n---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: narrow}\nspec:\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.9.0.0/29, allocationRange: 4}\n";
    let seed = Seed::start("release-dc").await;
    let _ctl = seed.controller("ctl");
    full_pool(&seed, pools, &[("a", "")], ("c", "")).await;
    let a_wide = seed.held("a", "wide");
    let history = History::start(&seed).await;
    seed.api
        .inject_failures("delete", "ipamallocations", 1, 500);
    let pools: Api<kipam::resources::IPAMPool> = Api::all(client(&seed).await);
    pools
        .patch(
            "wide",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"datacenters": {"dc-1": null}}})),
        )
        .await
        .expect("dc-1 removed from pool wide");
    seed.wait_for(
        "c served from narrow with a's old range",
        WAIT,
        "ctl",
        |s| s.phase("c", "narrow") == "Allocated" && s.allocation("a", "wide").is_none(),
    )
    .await;
    history.finish(&seed).await;
    assert_eq!(seed.held("c", "narrow"), a_wide);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_pin_frees_what_it_gave_up_only_once_its_object_changed() {
    let seed = Seed::start("release-pin").await;
    let _ctl = seed.controller("ctl");
    full_pool(
        &seed,
        SMALL,
        &[
            ("a", "ipam: {small: {addresses: ['10.9.0.0-10.9.0.3']}}"),
            ("b", ""),
        ],
        ("c", "ipam: {small: {allocationRange: 2}}"),
    )
    .await;
    assert_eq!(seed.held("a", "small"), "10.9.0.0-10.9.0.3");
    let history = History::start(&seed).await;
    seed.api
        .inject_failures("update", "ipamallocations", 1, 500);
    edit_cluster(&seed, "a", |spec| {
        spec["ipam"] = json!({"small": {"addresses": ["10.9.0.0-10.9.0.1"]}});
    });
    seed.wait_for(
        "c served with what a gave up, a re-pinned",
        WAIT,
        "ctl",
        |s| s.phase("c", "small") == "Allocated" && s.held("a", "small") == "10.9.0.0-10.9.0.1",
    )
    .await;
    history.finish(&seed).await;
    assert_eq!(seed.held("c", "small"), "10.9.0.2-10.9.0.3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_kept_by_retain_stays_a_holder_for_the_other_pools_of_its_datacenter() {
    // `kept` (reclaimPolicy Retain) and `other` share dc-1's addresses; `a` holds half through
    // each. Deleting `kept` leaves a's allocation of it in place, unmanaged: its addresses are
    // still a's, so `c` must not get them through `other`.
    let pools = "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: kept}\nspec:\n  reclaimPolicy: Retain\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.9.0.0/29, allocationRange: 4}\n---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: other}\nspec:\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.9.0.0/29, allocationRange: 4}\n";
    let seed = Seed::start("release-retain").await;
    let _ctl = seed.controller("ctl");
    full_pool(&seed, pools, &[("a", "")], ("c", "")).await;
    let a_kept = seed.held("a", "kept");
    let history = History::start(&seed).await;
    seed.delete("ipampools.ipam.kipam.dev", None, "kept");
    seed.wait_for("pool kept gone", WAIT, "ctl", |s| {
        s.get("ipampools.ipam.kipam.dev", None, "kept").is_none()
    })
    .await;
    // Passes run on every change; give the controller time to (wrongly) serve c.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        seed.held("a", "kept"),
        a_kept,
        "the retained allocation stays"
    );
    assert_ne!(
        seed.phase("c", "other"),
        "Allocated",
        "c got addresses through pool other: {}",
        seed.held("c", "other")
    );
    history.finish(&seed).await;
}

/// Somebody else's finalizer keeps a released allocation after kipam deleted it: it shows its
/// range until it is gone, so the waiting cluster gets nothing meanwhile, and kipam sends its
/// delete once (no pass deletes it again). Once the finalizer goes, the watch's deletion wakes
/// the planner and the waiting cluster is served without any other change. Before, the delete's
/// answer took the object out of the ledger though it was still there, and nothing woke the
/// planner once it was gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_held_by_another_finalizer_frees_its_range_only_once_its_object_is_gone() {
    let seed = Seed::start("release-finalizer").await;
    let _ctl = seed.controller("ctl");
    full_pool(&seed, SMALL, &[("a", ""), ("b", "")], ("c", "")).await;
    let a_held = seed.held("a", "small");
    let allocations: Api<IPAMAllocation> = Api::namespaced(client(&seed).await, "cluster-a");
    let finalizer =
        |list: Value| kube::api::Patch::Merge(json!({"metadata": {"finalizers": list}}));
    allocations
        .patch(
            "small",
            &kube::api::PatchParams::default(),
            &finalizer(json!(["backup.example.com/hold"])),
        )
        .await
        .expect("a finalizer of somebody else's on a's allocation");
    let history = History::start(&seed).await;
    seed.api.reset_stats();
    edit_cluster(&seed, "a", |spec| {
        spec["ipam"] = json!({"small": {"optOut": true}});
    });
    seed.wait_for(
        "a's allocation deleted, kept by the finalizer",
        WAIT,
        "ctl",
        |s| {
            s.allocation("a", "small")
                .is_some_and(|a| a.metadata.deletion_timestamp.is_some())
        },
    )
    .await;
    // Passes run on every change; give the controller time to (wrongly) serve c or delete
    // a's allocation again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_ne!(
        seed.phase("c", "small"),
        "Allocated",
        "c served while a's allocation still shows {a_held}"
    );
    assert_eq!(
        seed.api.stats().count("delete", "ipamallocations"),
        1,
        "a's allocation is deleted once"
    );
    allocations
        .patch(
            "small",
            &kube::api::PatchParams::default(),
            &finalizer(Value::Null),
        )
        .await
        .expect("the finalizer removed");
    seed.wait_for(
        "c served with a's old range, a's object gone",
        WAIT,
        "ctl",
        |s| s.phase("c", "small") == "Allocated" && s.allocation("a", "small").is_none(),
    )
    .await;
    history.finish(&seed).await;
    assert_eq!(seed.held("c", "small"), a_held);
}
