//! The admission webhook end to end: the real `kipam controller` serves it over TLS, the
//! stand-in calls it for every write that the configuration printed by `kipam webhook-config`
//! selects, and a human's bad writes are refused with the webhook's message while the
//! controller's own writes and valid objects go through.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_standin::UserInfo;
use serde_json::{Value, json};

use kipam::resources::{Cluster, IPAMAllocation, IPAMPool, IPAMPoolRecord};

use crate::support::{
    Controller, POOLS, Seed, free_port, install_webhook_configuration as install_configuration,
    webhook_certificates as certificates,
};

const HUMAN_TOKEN: &str = "token-of-alice";

async fn client_for(seed: &Seed, token: &str) -> Client {
    let kc =
        kube::config::Kubeconfig::from_yaml(&seed.api.kubeconfig_yaml_for_token(token)).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

/// The refusal's HTTP code and message.
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(s)) => (s.code, s.message.clone()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn denied(code_and_message: (u16, String), code: u16, parts: &[&str]) {
    let (got, message) = code_and_message;
    assert_eq!(got, code, "{message}");
    assert!(
        message.starts_with("admission webhook \"validate.ipam.kipam.dev\" denied the request: "),
        "{message}"
    );
    for p in parts {
        assert!(message.contains(p), "{message:?} lacks {p:?}");
    }
}

/// Makes the human's token known next to the kubeconfig's admin token.
fn with_human(seed: &Seed) {
    let admin = seed.api.token();
    seed.api.set_token_review(move |t| {
        if t == admin {
            Some(UserInfo::new("system:admin").with_groups(&["system:masters"]))
        } else if t == HUMAN_TOKEN {
            Some(UserInfo::new("alice"))
        } else {
            None
        }
    });
}

/// A controller serving the webhook on a port of its own; returns it and the port.
fn webhook_controller(seed: &Seed, identity: &str, cert: &str, key: &str) -> (Controller, u16) {
    let port = free_port();
    let controller = seed.controller_with(
        identity,
        &[
            "--webhook-addr",
            &format!("127.0.0.1:{port}"),
            "--tls-cert-file",
            cert,
            "--tls-key-file",
            key,
            "--service-account",
            "system:admin",
        ],
    );
    (controller, port)
}

/// Waits until the webhook answers from loaded caches: a dry-run pool create passes.
async fn wait_until_serving(seed: &Seed, human: &Client, log_of: &str) {
    let pools: Api<IPAMPool> = Api::all(human.clone());
    let probe: IPAMPool = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": "probe"},
        "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.9.0.0/24", "allocationRange": 1}}},
    }))
    .unwrap();
    let mut last = String::new();
    for _ in 0..200 {
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        match pools.create(&dry, &probe).await {
            Ok(_) => return,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the webhook never admitted a valid pool: {last}\n{}",
        seed.log(log_of)
    );
}

/// A seed with the controller serving the webhook and the configuration installed.
async fn seed_with_webhook(name: &str) -> (Seed, Controller, Client) {
    let seed = Seed::start(name).await;
    with_human(&seed);
    let (ca, cert, key) = certificates(&seed);
    let (controller, port) = webhook_controller(&seed, "w1", &cert, &key);
    install_configuration(&seed, port, &ca);
    let human = client_for(&seed, HUMAN_TOKEN).await;
    wait_until_serving(&seed, &human, "w1").await;
    (seed, controller, human)
}

fn pool(v: Value) -> IPAMPool {
    serde_json::from_value(v).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_pools_overlapping_allocations_and_exclusions_over_live_ones_are_refused() {
    let (seed, _controller, human) = seed_with_webhook("webhook").await;
    let pools: Api<IPAMPool> = Api::all(human.clone());
    let clusters: Api<Cluster> = Api::all(human.clone());

    // Valid pools are admitted, through a human's client.
    for doc in POOLS.split("\n---\n") {
        let v: Value = serde_saphyr::from_str(doc).unwrap();
        pools
            .create(&PostParams::default(), &pool(v))
            .await
            .unwrap();
    }
    // An invalid pool is refused with the field, the value and the rule.
    let bad = pool(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": "bad"},
        "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.5.0.0/26", "allocationRange": 65}}},
    }));
    denied(
        refusal(pools.create(&PostParams::default(), &bad).await),
        422,
        &[
            "IPAMPool bad: spec.datacenters[dc-1].allocationRange \"65\": exceeds the 64 addresses of poolCidr",
        ],
    );
    // A datacenter name the CRD cannot check.
    let bad_dc = pool(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": "bad-dc"},
        "spec": {"datacenters": {"DC_1": {"type": "range", "poolCidr": "10.5.0.0/26", "allocationRange": 4}}},
    }));
    denied(
        refusal(pools.create(&PostParams::default(), &bad_dc).await),
        422,
        &["spec.datacenters", "\"DC_1\"", "DNS-1123 label"],
    );
    assert!(seed.get("ipampools", None, "bad").is_none());

    // A cluster through the human's client: kipam allocates for it (its own writes pass).
    let c1: Cluster = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "c1"}, "spec": {"datacenter": "dc-1"},
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &c1).await.unwrap();
    seed.wait_for("c1 allocated", Duration::from_secs(20), "w1", |s| {
        s.phase("c1", "metallb") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("c1", "metallb"), "10.0.0.0-10.0.0.3");

    // A cluster with a bad override is refused.
    let bad_cluster: Cluster = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "c9"},
        "spec": {"datacenter": "dc-1", "ipam": {"metallb": {"addresses": ["10.0.0.999"]}}},
    }))
    .unwrap();
    denied(
        refusal(clusters.create(&PostParams::default(), &bad_cluster).await),
        422,
        &["Cluster c9: spec.ipam[metallb].addresses[0] \"10.0.0.999\""],
    );

    // A hand-made allocation overlapping c1's is refused, naming it.
    seed.apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cluster-x\n");
    let allocations: Api<IPAMAllocation> = Api::namespaced(human.clone(), "cluster-x");
    let overlapping: IPAMAllocation = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMAllocation",
        "metadata": {"name": "metallb", "namespace": "cluster-x"},
        "spec": {"type": "range", "dc": "dc-1", "addresses": ["10.0.0.2-10.0.0.5"]},
    }))
    .unwrap();
    denied(
        refusal(
            allocations
                .create(&PostParams::default(), &overlapping)
                .await,
        ),
        422,
        &[
            "overlaps IPAMAllocation cluster-c1/metallb of cluster c1 (10.0.0.0-10.0.0.3) at 10.0.0.2-10.0.0.3",
        ],
    );
    assert!(
        seed.get("ipamallocations", Some("cluster-x"), "metallb")
            .is_none()
    );

    // An exclusion over c1's live allocation is refused, naming the cluster.
    let exclude = |ranges: Value| {
        Patch::Merge(json!({"spec": {"datacenters": {"dc-1": {"excludeRanges": ranges}}}}))
    };
    denied(
        refusal(
            pools
                .patch(
                    "metallb",
                    &PatchParams::default(),
                    &exclude(json!(["10.0.0.1"])),
                )
                .await,
        ),
        422,
        &[
            "spec.datacenters[dc-1].excludeRanges[0] \"10.0.0.1\"",
            "hits the allocation of cluster c1 (10.0.0.0-10.0.0.3)",
        ],
    );
    // An exclusion over free addresses is admitted.
    pools
        .patch(
            "metallb",
            &PatchParams::default(),
            &exclude(json!(["10.0.0.15"])),
        )
        .await
        .unwrap();

    // The human can neither delete the live allocation nor touch the record.
    let c1_allocations: Api<IPAMAllocation> = Api::namespaced(human.clone(), "cluster-c1");
    denied(
        refusal(
            c1_allocations
                .delete("metallb", &DeleteParams::default())
                .await,
        ),
        403,
        &["releases nothing"],
    );
    let records: Api<IPAMPoolRecord> = Api::all(human.clone());
    denied(
        refusal(
            records
                .delete("metallb.dc-1.0a000000-28", &DeleteParams::default())
                .await,
        ),
        403,
        &["written by kipam alone"],
    );
    denied(
        refusal(
            records
                .patch(
                    "metallb.dc-1.0a000000-28",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"reservations": {"c9": {"addresses": ["10.0.0.8-10.0.0.11"]}}}})),
                )
                .await,
        ),
        403,
        &["written by kipam alone"],
    );
    // Nor grow the allocation by hand.
    denied(
        refusal(
            c1_allocations
                .patch(
                    "metallb",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"addresses": ["10.0.0.0-10.0.0.7"]}})),
                )
                .await,
        ),
        422,
        &["changes the addresses of a live allocation"],
    );

    // kipam goes on: a second cluster is allocated next to c1, nothing overlaps.
    let record_patches = seed.api.stats().count("patch", "ipampoolrecords");
    let c2: Cluster = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": "c2"}, "spec": {"datacenter": "dc-1"},
    }))
    .unwrap();
    clusters.create(&PostParams::default(), &c2).await.unwrap();
    seed.wait_for("c2 allocated", Duration::from_secs(20), "w1", |s| {
        s.phase("c2", "metallb") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("c2", "metallb"), "10.0.0.4-10.0.0.7");
    assert_eq!(seed.held("c1", "metallb"), "10.0.0.0-10.0.0.3");
    // c2 went into the existing record shard through kipam's own patch, past the webhook.
    assert!(seed.api.stats().count("patch", "ipampoolrecords") > record_patches);
    let record = seed
        .get("ipampoolrecords", None, "metallb.dc-1.0a000000-28")
        .unwrap();
    assert_eq!(
        record["spec"]["reservations"]["c2"]["addresses"],
        json!(["10.0.0.4-10.0.0.7"])
    );
    seed.assert_no_overlap_no_leak();
    // Deleting the cluster releases through kipam's own writes, unhindered.
    clusters
        .delete("c2", &DeleteParams::default())
        .await
        .unwrap();
    seed.wait_for("c2 released", Duration::from_secs(20), "w1", |s| {
        s.get("clusters", None, "c2").is_none() && s.allocation("c2", "metallb").is_none()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_does_not_lead_serves_the_webhook_from_its_own_caches() {
    let seed = Seed::start("webhook-follower").await;
    with_human(&seed);
    let (ca, cert, key) = certificates(&seed);
    let (_w1, port1) = webhook_controller(&seed, "w1", &cert, &key);
    let (_w2, port2) = webhook_controller(&seed, "w2", &cert, &key);
    seed.apply(POOLS);
    seed.cluster("c1", "dc-1");
    seed.wait_for("c1 allocated", Duration::from_secs(20), "w1", |s| {
        s.phase("c1", "metallb") == "Allocated" && !s.lease_holder().is_empty()
    })
    .await;
    // The API server calls the replica that does not hold the Lease.
    let (follower, port) = if seed.lease_holder() == "w1" {
        ("w2", port2)
    } else {
        ("w1", port1)
    };
    install_configuration(&seed, port, &ca);
    let human = client_for(&seed, HUMAN_TOKEN).await;
    wait_until_serving(&seed, &human, follower).await;
    seed.apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cluster-x\n");
    let allocations: Api<IPAMAllocation> = Api::namespaced(human.clone(), "cluster-x");
    let overlapping: IPAMAllocation = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMAllocation",
        "metadata": {"name": "metallb", "namespace": "cluster-x"},
        "spec": {"type": "range", "dc": "dc-1", "addresses": ["10.0.0.3"]},
    }))
    .unwrap();
    // The follower's ledger learns of c1's allocation through its own watch, which may lag the
    // leader's write on a loaded machine: dry runs (which the webhook judges too) until it
    // does, then the real request.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    for _ in 0..200 {
        if allocations.create(&dry, &overlapping).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    denied(
        refusal(
            allocations
                .create(&PostParams::default(), &overlapping)
                .await,
        ),
        422,
        &["cluster c1"],
    );
    let pools: Api<IPAMPool> = Api::all(human.clone());
    denied(
        refusal(
            pools
                .patch(
                    "metallb",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"spec": {"datacenters": {"dc-1": {"excludeRanges": ["10.0.0.0"]}}}}),
                    ),
                )
                .await,
        ),
        422,
        &["hits the allocation of cluster c1"],
    );
    assert!(
        seed.log(follower).contains("admission refused"),
        "the follower {follower} answered"
    );
    // The follower knew c1's allocation without a watch of its own for the webhook: each
    // replica watches allocations once, for its ledger, which the webhook and the addon
    // applier read.
    let watches = seed.api.stats().count("watch", "ipamallocations");
    assert_eq!(watches, 2, "allocation watches opened by two replicas");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_certificate_files_stop_the_controller_with_the_file_named() {
    let seed = Seed::start("webhook-nocert").await;
    let missing = seed.dir().join("missing.crt").display().to_string();
    let key = seed.dir().join("missing.key").display().to_string();
    let (mut controller, _) = webhook_controller(&seed, "w1", &missing, &key);
    let mut stopped = false;
    for _ in 0..200 {
        if !controller.is_running() {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stopped, "the controller kept running: {}", seed.log("w1"));
    let log = seed.log("w1");
    assert!(
        log.contains("webhook:") && log.contains("missing.crt: cannot read"),
        "{log}"
    );
}

/// A full pool grown in place: the clusters waiting on it are served, oldest first, by the one
/// apply that adds a CIDR; the clusters already holding addresses keep them byte for byte. An
/// edit that would strand a holding is refused, naming it, already in a server-side dry run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_grows_in_place_and_its_waiting_clusters_are_served() {
    let (seed, _controller, human) = seed_with_webhook("growth").await;
    let pools: Api<IPAMPool> = Api::all(human.clone());
    let manifest = |extra: &str| {
        let yaml = format!(
            "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: metallb\nspec:\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/29\n      allocationRange: 4\n{extra}"
        );
        serde_saphyr::from_str::<IPAMPool>(&yaml).unwrap()
    };
    let apply = PatchParams::apply("kubectl");
    pools
        .patch("metallb", &apply, &Patch::Apply(manifest("")))
        .await
        .unwrap();
    // Four clusters, two of which fit.
    for name in ["a", "b", "c", "d"] {
        seed.cluster(name, "dc-1");
    }
    seed.wait_for(
        "a, b allocated; c, d waiting",
        Duration::from_secs(20),
        "w1",
        |s| {
            s.phase("a", "metallb") == "Allocated"
                && s.phase("b", "metallb") == "Allocated"
                && s.phase("c", "metallb") == "Failed"
                && s.phase("d", "metallb") == "Failed"
        },
    )
    .await;
    assert_eq!(seed.held("a", "metallb"), "10.0.0.0-10.0.0.3");
    assert_eq!(seed.held("b", "metallb"), "10.0.0.4-10.0.0.7");
    let before_a = seed.allocation("a", "metallb").unwrap();
    let before_b = seed.allocation("b", "metallb").unwrap();

    // A narrower poolCidr would strand b: refused in a dry run, naming it, nothing changed.
    let mut narrowed = manifest("");
    narrowed.spec.datacenters.get_mut("dc-1").unwrap().pool_cidr = "10.0.0.0/30".into();
    let dry = PatchParams {
        dry_run: true,
        ..PatchParams::apply("kubectl")
    };
    denied(
        refusal(pools.patch("metallb", &dry, &Patch::Apply(narrowed)).await),
        422,
        &[
            "spec.datacenters[dc-1].poolCidr \"10.0.0.0/30\"",
            "allocations affected: b (10.0.0.4-10.0.0.7)",
        ],
    );
    let stored = seed.get("ipampools", None, "metallb").unwrap();
    assert_eq!(
        stored["spec"]["datacenters"]["dc-1"]["poolCidr"],
        "10.0.0.0/29"
    );

    // One apply adds a CIDR: c (older) and d are served from it, in that order.
    pools
        .patch(
            "metallb",
            &apply,
            &Patch::Apply(manifest("      additionalCidrs: [10.0.9.0/29]\n")),
        )
        .await
        .unwrap();
    seed.wait_for("c and d allocated", Duration::from_secs(20), "w1", |s| {
        s.phase("c", "metallb") == "Allocated" && s.phase("d", "metallb") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("c", "metallb"), "10.0.9.0-10.0.9.3");
    assert_eq!(seed.held("d", "metallb"), "10.0.9.4-10.0.9.7");
    // The old holders are untouched: the same spec, not even rewritten.
    let after_a = seed.allocation("a", "metallb").unwrap();
    let after_b = seed.allocation("b", "metallb").unwrap();
    assert_eq!(after_a.spec, before_a.spec);
    assert_eq!(after_b.spec, before_b.spec);
    assert_eq!(
        after_a.metadata.resource_version, before_a.metadata.resource_version,
        "a's allocation was written again"
    );
    // The pool's status counts both CIDRs, each on its own line.
    seed.wait_for(
        "the status shows both CIDRs",
        Duration::from_secs(20),
        "w1",
        |s| {
            s.get("ipampools", None, "metallb")
                .and_then(|p| p.pointer("/status/datacenters/dc-1/cidrs").cloned())
                .and_then(|c| c.as_array().map(|a| a.len()))
                == Some(2)
                && s.get("ipampools", None, "metallb")
                    .and_then(|p| p.pointer("/status/datacenters/dc-1/allocated").cloned())
                    == Some(json!("16"))
        },
    )
    .await;
    let status =
        seed.get("ipampools", None, "metallb").unwrap()["status"]["datacenters"]["dc-1"].clone();
    assert_eq!(status["total"], "16");
    assert_eq!(status["cidrs"][0]["cidr"], "10.0.0.0/29");
    assert_eq!(status["cidrs"][0]["allocated"], "8");
    assert_eq!(status["cidrs"][1]["cidr"], "10.0.9.0/29");
    assert_eq!(status["cidrs"][1]["available"], "0");
    // Removing the CIDR that now holds c and d is refused, naming them.
    denied(
        refusal(
            pools
                .patch("metallb", &dry, &Patch::Apply(manifest("")))
                .await,
        ),
        422,
        &[
            "additionalCidrs",
            "c (10.0.9.0-10.0.9.3)",
            "d (10.0.9.4-10.0.9.7)",
        ],
    );
    seed.assert_no_overlap_no_leak();
}

// ---- Issue 35, item 5: a hand-made IPAddress is committed before it is admitted ----

/// The shards of `pool`'s record in dc-1 as the server stores them, entries joined.
fn recorded(seed: &Seed, pool: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out = std::collections::BTreeMap::new();
    for r in seed.api.list("ipampoolrecords", None) {
        let r: IPAMPoolRecord = serde_json::from_value(r).unwrap();
        if r.spec.pool == pool && r.spec.datacenter == "dc-1" {
            for (k, v) in r.spec.reservations {
                out.insert(k, v.addresses);
            }
        }
    }
    out
}

fn ip_address(name: &str, claim: &str, pool: &str, address: &str) -> kube::api::DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddress",
        "metadata": {"name": name, "namespace": "machines"},
        "spec": {
            "claimRef": {"name": claim},
            "poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": pool},
            "address": address,
            "prefix": 24,
        },
    }))
    .unwrap()
}

/// The webhook answered from its caches alone, so between its answer and the planner seeing
/// the object, a commit planned without the object could hand the same address to a cluster
/// (two objects showing one address). Now the admitted address is in the pool record, behind
/// the fence, before the create returns: a replica that read the records before cannot commit
/// it, through the pool or through another pool of its address space (whose shard the webhook
/// fences); a dry run writes nothing; the claim the object names adopts it, and the entry of
/// one whose object never appeared is dropped once a read confirms it absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_made_ip_address_is_committed_to_the_record_before_it_is_admitted() {
    use kipam::planning::records::{self, PlannedOn};
    use kipam::resources::Reservation;

    let seed = crate::capi::capi_seed("webhook-hand-made").await;
    with_human(&seed);
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: machines}
spec:
  addressSpace: lab
  datacenters:
    dc-1: {type: range, poolCidr: 10.10.0.0/28, allocationRange: 1}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: vip}
spec:
  addressSpace: lab
  datacenters:
    dc-1: {type: range, poolCidr: 10.10.0.0/28, allocationRange: 1}
",
    );
    let (ca, cert, key) = certificates(&seed);
    let (_controller, port) = webhook_controller(&seed, "w1", &cert, &key);
    install_configuration(&seed, port, &ca);
    let human = client_for(&seed, HUMAN_TOKEN).await;
    wait_until_serving(&seed, &human, "w1").await;

    // A deposed replica: its copy of the records is from before the object.
    let admin = Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&seed.api.kubeconfig_yaml()).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    let stale = kipam::seed::Context::builder(admin.clone())
        .complete_ledger(Default::default())
        .build();
    let list = Api::<IPAMPoolRecord>::all(admin.clone())
        .list(&Default::default())
        .await
        .unwrap();
    stale.records.lock().await.reset(list.items);

    let gvk = kube::api::GroupVersionKind::gvk("ipam.cluster.x-k8s.io", "v1beta2", "IPAddress");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "ipaddresses");
    let addresses: Api<kube::api::DynamicObject> =
        Api::namespaced_with(human.clone(), "machines", &resource);

    // A dry run is reviewed and writes nothing.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    addresses
        .create(
            &dry,
            &ip_address("pinned", "pinned", "machines", "10.10.0.9"),
        )
        .await
        .expect("dry run admitted");
    assert!(
        !recorded(&seed, "machines")
            .keys()
            .any(|k| k.starts_with("ipaddress/")),
        "a dry run wrote {:?}",
        recorded(&seed, "machines")
    );

    addresses
        .create(
            &PostParams::default(),
            &ip_address("pinned", "pinned", "machines", "10.10.0.9"),
        )
        .await
        .expect("admitted");
    // In the record as soon as the create returned.
    let entry = recorded(&seed, "machines")
        .into_iter()
        .find(|(k, _)| k.starts_with("ipaddress/machines/pinned@"))
        .unwrap_or_else(|| panic!("no entry in {:?}", recorded(&seed, "machines")));
    assert_eq!(entry.1, vec!["10.10.0.9-10.10.0.9".to_string()]);

    // The deposed replica's commits of the same address are refused, in the pool and through
    // the other pool of its address space.
    let one = |who: &str| {
        std::collections::BTreeMap::from([(
            who.to_string(),
            Reservation {
                cidr: None,
                addresses: vec!["10.10.0.9-10.10.0.9".into()],
            },
        )])
    };
    for (pool, holder) in [("machines", "cluster-x"), ("vip", "cluster-y")] {
        let obj = Api::<IPAMPool>::all(admin.clone()).get(pool).await.unwrap();
        let key = (pool.to_string(), "dc-1".to_string());
        let r = records::commit(
            &stale,
            &obj,
            &key,
            one(holder),
            Default::default(),
            &PlannedOn::default(),
        )
        .await;
        assert!(
            matches!(&r, Err(e) if e.is_stale()),
            "{pool}: a commit on the old copy went through: {r:?}"
        );
        assert!(
            !recorded(&seed, pool).contains_key(holder),
            "{pool}: {:?}",
            recorded(&seed, pool)
        );
    }

    // A second object for the same address is refused, naming the first.
    let (code, message) = refusal(
        addresses
            .create(
                &PostParams::default(),
                &ip_address("copy", "copy", "machines", "10.10.0.9"),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("hand-made IPAddress machines/pinned"),
        "{message}"
    );

    // An entry whose object never appeared (long past its admission) goes once a read
    // confirms the object absent; the address is then handed out again.
    let shard = seed
        .api
        .list("ipampoolrecords", None)
        .into_iter()
        .find(|r| r["spec"]["pool"] == "machines" && r["spec"]["block"].is_string())
        .expect("a shard of machines");
    let name = shard["metadata"]["name"].as_str().unwrap().to_string();
    Api::<IPAMPoolRecord>::all(admin.clone())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"reservations": {
                "ipaddress/machines/ghost@2020-01-01T00:00:00Z": {"addresses": ["10.10.0.12-10.10.0.12"]}
            }}})),
        )
        .await
        .expect("entry written as kipam");
    // Clusters served from both pools never get the pinned address.
    for i in 0..5 {
        seed.cluster(&format!("c{i:02}"), "dc-1");
    }
    seed.wait_for("every cluster served", Duration::from_secs(40), "w1", |s| {
        (0..5).all(|i| {
            let c = format!("c{i:02}");
            s.phase(&c, "machines") == "Allocated" && s.phase(&c, "vip") == "Allocated"
        })
    })
    .await;
    for i in 0..5 {
        for pool in ["machines", "vip"] {
            let held = seed.held(&format!("c{i:02}"), pool);
            assert!(
                !held.contains("10.10.0.9-") && held != "10.10.0.9",
                "c{i:02} got the hand-made address through {pool}: {held}"
            );
        }
    }
    seed.wait_for(
        "the ghost's entry released",
        Duration::from_secs(30),
        "w1",
        |s| !recorded(s, "machines").contains_key("ipaddress/machines/ghost@2020-01-01T00:00:00Z"),
    )
    .await;
    assert!(
        recorded(&seed, "machines").contains_key(&entry.0),
        "the live object's entry went: {:?}",
        recorded(&seed, "machines")
    );
}

// ---- History seed 140841025: a hand-made IPAddress outlives its pool's datacenter ----

/// The entries of every shard of `pool`'s record in `dc`, as the server stores them.
fn recorded_in(
    seed: &Seed,
    pool: &str,
    dc: &str,
) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out = std::collections::BTreeMap::new();
    for r in seed.api.list("ipampoolrecords", None) {
        let r: IPAMPoolRecord = serde_json::from_value(r).unwrap();
        if r.spec.pool == pool && r.spec.datacenter == dc {
            for (k, v) in r.spec.reservations {
                out.insert(k, v.addresses);
            }
        }
    }
    out
}

/// A hand-made `IPAddress` admitted in pool `vip`'s dc-2 keeps showing its address after
/// dc-2 is removed from `vip`: the object is still there, so the address is still held in
/// dc-2. The history test found a second hand-made object for that address admitted through
/// `wide` (another pool of the same address space serving dc-2), because the webhook only
/// counted hand-made objects whose pool still served the datacenter; the planner likewise set
/// the object aside only in its own pool's datacenters, so a cluster in dc-2 could get the
/// address too. Both now count it in dc-2 until it is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_made_ip_address_whose_pool_left_the_datacenter_still_holds_its_address() {
    let seed = crate::capi::capi_seed("webhook-orphan-hand-made").await;
    with_human(&seed);
    // `wide` has one free address in dc-2, 10.10.0.15, inside `vip`'s dc-2 network.
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: vip}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.20.0.0/28, allocationRange: 1}
    dc-2: {type: range, poolCidr: 10.10.0.8/29, allocationRange: 1}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: wide}
spec:
  datacenters:
    dc-2: {type: range, poolCidr: 10.10.0.0/28, allocationRange: 1, excludeRanges: [10.10.0.0-10.10.0.14]}
",
    );
    let (ca, cert, key) = certificates(&seed);
    let (_controller, port) = webhook_controller(&seed, "w1", &cert, &key);
    install_configuration(&seed, port, &ca);
    let human = client_for(&seed, HUMAN_TOKEN).await;
    wait_until_serving(&seed, &human, "w1").await;

    let gvk = kube::api::GroupVersionKind::gvk("ipam.cluster.x-k8s.io", "v1beta2", "IPAddress");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "ipaddresses");
    let addresses: Api<kube::api::DynamicObject> =
        Api::namespaced_with(human.clone(), "machines", &resource);
    addresses
        .create(
            &PostParams::default(),
            &ip_address("first", "first", "vip", "10.10.0.15"),
        )
        .await
        .expect("the first hand-made address is admitted");
    assert!(
        recorded_in(&seed, "vip", "dc-2")
            .keys()
            .any(|k| k.starts_with("ipaddress/machines/first@")),
        "{:?}",
        recorded_in(&seed, "vip", "dc-2")
    );

    // dc-2 leaves `vip`; the object stays.
    let admin = Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&seed.api.kubeconfig_yaml()).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    Api::<IPAMPool>::all(admin)
        .patch(
            "vip",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"datacenters": {"dc-2": null}}})),
        )
        .await
        .expect("dc-2 removed from vip");
    // The webhook has seen the edit once an address of vip's old dc-2 lies outside vip.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut seen = false;
    for _ in 0..200 {
        match addresses
            .create(&dry, &ip_address("probe", "probe", "vip", "10.10.0.9"))
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("lies in none of the CIDRs") => {
                seen = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(
        seen,
        "the webhook never saw dc-2 leave vip\n{}",
        seed.log("w1")
    );

    // A second object for the address, through the other pool serving dc-2: refused, naming
    // the first.
    denied(
        refusal(
            addresses
                .create(
                    &PostParams::default(),
                    &ip_address("second", "second", "wide", "10.10.0.15"),
                )
                .await,
        ),
        422,
        &[
            "spec.address \"10.10.0.15\"",
            "hand-made IPAddress machines/first",
        ],
    );

    // Nor does a cluster in dc-2 get it through `wide`, while the object shows it.
    seed.cluster("c1", "dc-2");
    seed.wait_for(
        "c1 planned (served, or waiting)",
        Duration::from_secs(30),
        "w1",
        |s| {
            s.phase("c1", "wide") == "Allocated"
                || s.condition("clusters.ipam.kipam.dev", "c1", "IPAMReady")
                    .is_some_and(|c| c["status"] == "False")
        },
    )
    .await;
    assert!(
        !seed.held("c1", "wide").contains("10.10.0.15"),
        "c1 got the address the hand-made object shows: {}",
        seed.held("c1", "wide")
    );
    assert_ne!(seed.phase("c1", "wide"), "Allocated");

    // Once the object is deleted, the address is handed out.
    addresses
        .delete("first", &DeleteParams::default())
        .await
        .expect("first deleted");
    seed.wait_for(
        "c1 served with the freed address",
        Duration::from_secs(40),
        "w1",
        |s| s.phase("c1", "wide") == "Allocated" && s.held("c1", "wide").contains("10.10.0.15"),
    )
    .await;
}

/// The same gap for a cluster's allocation: dc-2 removed from `vip`, whose `reclaimPolicy:
/// Retain` keeps c1's allocation there (kipam never releases it; a person deletes it). The
/// object still shows its address in dc-2, so a hand-made `IPAddress` for it through `wide`
/// (the same address space, serving dc-2) is refused, naming the allocation — the webhook
/// counted only allocations of pools still serving the datacenter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_an_allocation_of_a_removed_datacenter_shows_is_refused_to_hand_made_ones() {
    let seed = crate::capi::capi_seed("webhook-removed-dc-allocation").await;
    with_human(&seed);
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: vip}
spec:
  reclaimPolicy: Retain
  datacenters:
    dc-1: {type: range, poolCidr: 10.20.0.0/28, allocationRange: 1}
    dc-2: {type: range, poolCidr: 10.10.0.8/29, allocationRange: 1}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: wide}
spec:
  datacenters:
    dc-2: {type: range, poolCidr: 10.10.0.0/28, allocationRange: 1}
",
    );
    let (ca, cert, key) = certificates(&seed);
    let (_controller, port) = webhook_controller(&seed, "w1", &cert, &key);
    install_configuration(&seed, port, &ca);
    let human = client_for(&seed, HUMAN_TOKEN).await;
    wait_until_serving(&seed, &human, "w1").await;
    seed.cluster("c1", "dc-2");
    seed.wait_for("c1 served by vip", Duration::from_secs(30), "w1", |s| {
        s.phase("c1", "vip") == "Allocated"
    })
    .await;
    let held = seed.held("c1", "vip");
    let address = held.split('-').next().unwrap_or_default().to_string();
    assert!(address.starts_with("10.10.0."), "{held}");

    let admin = Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&seed.api.kubeconfig_yaml()).unwrap(),
            &Default::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    Api::<IPAMPool>::all(admin)
        .patch(
            "vip",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"datacenters": {"dc-2": null}}})),
        )
        .await
        .expect("dc-2 removed from vip");

    let gvk = kube::api::GroupVersionKind::gvk("ipam.cluster.x-k8s.io", "v1beta2", "IPAddress");
    let resource = kube::api::ApiResource::from_gvk_with_plural(&gvk, "ipaddresses");
    let addresses: Api<kube::api::DynamicObject> =
        Api::namespaced_with(human.clone(), "machines", &resource);
    // The webhook has seen the edit once an address of vip's old dc-2 lies outside vip.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut seen = false;
    for _ in 0..200 {
        match addresses
            .create(&dry, &ip_address("probe", "probe", "vip", &address))
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("lies in none of the CIDRs") => {
                seen = true;
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(
        seen,
        "the webhook never saw dc-2 leave vip\n{}",
        seed.log("w1")
    );
    // Retained: the allocation still shows the address.
    assert_eq!(seed.held("c1", "vip"), held);

    denied(
        refusal(
            addresses
                .create(
                    &PostParams::default(),
                    &ip_address("taken", "taken", "wide", &address),
                )
                .await,
        ),
        422,
        &[
            &format!("spec.address \"{address}\""),
            "held by cluster c1 through IPAMPool vip, which no longer serves dc-2",
            "reclaimPolicy Retain",
        ],
    );
}
