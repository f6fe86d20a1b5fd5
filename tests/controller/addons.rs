//! The addon applier end to end: one seed, four user clusters (two reachable with MetalLB's
//! CRDs, one without them, one unreachable), the real controller binary.

use std::time::{Duration, Instant};

use kube_standin::ApiServer;
use serde_json::{Value, json};

use super::support::{Seed, longest_gap, request_times};

const WAIT: Duration = Duration::from_secs(30);
const METALLB_CRDS: &str = include_str!("../render/fixtures/metallb-crds.yaml");

const POOLS: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/24
      allocationRange: 4
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb-ipv4
spec:
  datacenters:
    dc-2:
      type: prefix
      poolCidr: 10.20.0.0/24
      allocationPrefix: 30
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb-ipv6
spec:
  datacenters:
    dc-2:
      type: range
      poolCidr: 2001:db8::/64
      allocationRange: 16
";

/// A user cluster stand-in with the `metallb-system` namespace and, if asked, MetalLB's CRDs.
async fn user_cluster(with_crds: bool) -> ApiServer {
    let api = ApiServer::start().await.expect("user cluster starts");
    api.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "metallb-system"}}))
        .expect("namespace");
    if with_crds {
        api.apply_yaml(METALLB_CRDS).expect("MetalLB CRDs");
    }
    api
}

/// A kubeconfig pointing at a port nobody listens on.
async fn unreachable_kubeconfig() -> String {
    let api = ApiServer::start().await.expect("stand-in starts");
    let kubeconfig = api.kubeconfig_yaml();
    api.shutdown();
    drop(api);
    tokio::time::sleep(Duration::from_millis(100)).await;
    kubeconfig
}

fn put_kubeconfig(seed: &Seed, cluster: &str, kubeconfig: &str) {
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("kc-{cluster}"), "namespace": "kipam-system"},
            "stringData": {"kubeconfig": kubeconfig}}))
        .expect("secret");
}

/// A Cluster with its kubeconfig Secret and a `metallb` Addon in its namespace.
async fn register(seed: &Seed, cluster: &str, dc: &str, kubeconfig: &str) {
    put_kubeconfig(seed, cluster, kubeconfig);
    seed.cluster_with(
        cluster,
        dc,
        &format!("kubeconfig: {{secretRef: {{namespace: kipam-system, name: kc-{cluster}}}}}"),
    );
    let ns = format!("cluster-{cluster}");
    seed.wait_for(&format!("namespace {ns}"), WAIT, "ctl", |s| {
        s.get("namespaces", None, &ns).is_some()
    })
    .await;
    seed.api
        .create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "metallb", "namespace": ns},
            "spec": {"name": "metallb"}}),
        )
        .expect("addon");
}

fn pool_addresses(api: &ApiServer, name: &str) -> Option<Vec<String>> {
    let obj = api.get("ipaddresspools.metallb.io", Some("metallb-system"), name)?;
    Some(
        obj["spec"]["addresses"]
            .as_array()?
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
    )
}

fn addon(seed: &Seed, cluster: &str) -> Option<Value> {
    seed.get("addons", Some(&format!("cluster-{cluster}")), "metallb")
}

/// `(status, reason, message)` of an Addon condition.
fn addon_condition(seed: &Seed, cluster: &str, type_: &str) -> (String, String, String) {
    let Some(obj) = addon(seed, cluster) else {
        return Default::default();
    };
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .unwrap_or_default()
}

fn in_sync(seed: &Seed, cluster: &str) -> bool {
    addon_condition(seed, cluster, "InSync").0 == "True"
}

/// What the seed holds for a cluster, as MetalLB address entries.
fn held_entries(seed: &Seed, cluster: &str, pool: &str) -> Vec<String> {
    seed.allocation(cluster, pool)
        .map(|a| match a.spec.cidr {
            Some(c) => vec![c],
            None => a.spec.addresses,
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addons_reach_user_clusters_and_stay_there() {
    let seed = Seed::start("addons").await;
    let single = user_cluster(true).await;
    let dual = user_cluster(true).await;
    let no_crds = user_cluster(false).await;
    let down = unreachable_kubeconfig().await;
    let _ctl = seed.controller_with("ctl", &["--addon-resync", "2"]);
    seed.apply(POOLS);
    register(&seed, "single", "dc-1", &single.kubeconfig_yaml()).await;
    register(&seed, "dual", "dc-2", &dual.kubeconfig_yaml()).await;
    register(&seed, "nocrd", "dc-1", &no_crds.kubeconfig_yaml()).await;
    register(&seed, "down", "dc-1", &down).await;

    // Each reachable user cluster holds exactly its allocations. A cluster's allocations of
    // two pools are written as their own records' commits land, so the applier may first sync
    // "dual" with one of them (in sync with what exists then): wait for both to be held too.
    // The applier may likewise sync "single" before its allocation exists (in sync with
    // nothing): wait for its pool to reach the user cluster.
    seed.wait_for(
        "single and dual in sync with all they hold",
        WAIT,
        "ctl",
        |s| {
            in_sync(s, "single")
                && !held_entries(s, "single", "metallb").is_empty()
                && pool_addresses(&single, "kipam-managed-pool").is_some()
                && in_sync(s, "dual")
                && !held_entries(s, "dual", "metallb-ipv4").is_empty()
                && !held_entries(s, "dual", "metallb-ipv6").is_empty()
                && pool_addresses(&dual, "kipam-managed-pool-dualstack").is_some()
        },
    )
    .await;
    let expected = held_entries(&seed, "single", "metallb");
    assert_eq!(expected.len(), 1, "{expected:?}");
    assert_eq!(
        pool_addresses(&single, "kipam-managed-pool"),
        Some(expected.clone())
    );
    let before = expected;
    let pool = single
        .get(
            "ipaddresspools.metallb.io",
            Some("metallb-system"),
            "kipam-managed-pool",
        )
        .expect("pool");
    assert_eq!(
        pool["metadata"]["labels"]["ipam.kipam.dev/addon"],
        "metallb"
    );
    assert!(
        single
            .get(
                "l2advertisements.metallb.io",
                Some("metallb-system"),
                "kipam-advertise-all"
            )
            .is_some()
    );
    let mut dual_expected = held_entries(&seed, "dual", "metallb-ipv4");
    dual_expected.extend(held_entries(&seed, "dual", "metallb-ipv6"));
    assert_eq!(dual_expected.len(), 2, "{dual_expected:?}");
    assert_eq!(
        pool_addresses(&dual, "kipam-managed-pool-dualstack"),
        Some(dual_expected)
    );
    assert!(pool_addresses(&dual, "kipam-managed-pool").is_none());
    let status = addon(&seed, "single").expect("addon")["status"].clone();
    assert_eq!(status["appliedObjects"].as_array().map(Vec::len), Some(2));
    assert!(
        status["lastAppliedHash"]
            .as_str()
            .is_some_and(|h| !h.is_empty())
    );
    assert!(status["lastAppliedTime"].as_str().is_some());

    // The unreachable and the CRD-less clusters say why; the others stay in sync.
    // (Both read in one look: a later sync of a loaded machine may replace the message.)
    seed.wait_for("nocrd MissingCRD, down Unreachable", WAIT, "ctl", |s| {
        let nocrd = addon_condition(s, "nocrd", "Applied");
        nocrd.1 == "MissingCRD"
            && nocrd.2.contains("IPAddressPool")
            && addon_condition(s, "down", "Applied").1 == "Unreachable"
    })
    .await;
    assert_eq!(addon_condition(&seed, "down", "InSync").0, "False");
    assert_eq!(addon_condition(&seed, "down", "Rendered").0, "True");
    seed.wait_for("AddonsReady on the clusters", WAIT, "ctl", |s| {
        s.condition("clusters", "single", "AddonsReady")
            .is_some_and(|c| c["status"] == "True")
            && s.condition("clusters", "down", "AddonsReady")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "Unreachable")
    })
    .await;
    assert!(in_sync(&seed, "single") && in_sync(&seed, "dual"));

    // Growth reaches the user cluster within seconds, by event.
    let started = Instant::now();
    seed.api
        .apply(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "single"},
            "spec": {"ipam": {"metallb": {"allocationRange": 8}}}}),
        )
        .expect("grow");
    seed.wait_for(
        "the grown allocation in the user cluster",
        WAIT,
        "ctl",
        |s| {
            let held = held_entries(s, "single", "metallb");
            held != before && pool_addresses(&single, "kipam-managed-pool") == Some(held)
        },
    )
    .await;
    let grown = held_entries(&seed, "single", "metallb");
    eprintln!(
        "growth reached the user cluster after {:?}",
        started.elapsed()
    );

    // A hand edit is reverted, a hand delete restored (by the drift watches here; the 2 s
    // resync would too).
    single
        .apply(
            &json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "kipam-managed-pool", "namespace": "metallb-system"},
            "spec": {"addresses": ["192.0.2.0-192.0.2.255"]}}),
        )
        .expect("hand edit");
    assert_eq!(
        pool_addresses(&single, "kipam-managed-pool"),
        Some(vec!["192.0.2.0-192.0.2.255".to_string()])
    );
    seed.wait_for("the hand edit reverted", WAIT, "ctl", |_| {
        pool_addresses(&single, "kipam-managed-pool") == Some(grown.clone())
    })
    .await;
    single
        .delete(
            "ipaddresspools.metallb.io",
            Some("metallb-system"),
            "kipam-managed-pool",
        )
        .expect("hand delete");
    seed.wait_for("the hand delete restored", WAIT, "ctl", |_| {
        pool_addresses(&single, "kipam-managed-pool") == Some(grown.clone())
    })
    .await;

    // A released allocation prunes its object (the L2Advertisement stays).
    seed.api
        .apply(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "single"},
            "spec": {"ipam": {"metallb": {"optOut": true}}}}),
        )
        .expect("opt out");
    seed.wait_for("the released allocation's pool pruned", WAIT, "ctl", |s| {
        s.allocation("single", "metallb").is_none()
            && pool_addresses(&single, "kipam-managed-pool").is_none()
    })
    .await;
    assert!(
        single
            .get(
                "l2advertisements.metallb.io",
                Some("metallb-system"),
                "kipam-advertise-all"
            )
            .is_some()
    );
    seed.wait_for("single in sync with one object", WAIT, "ctl", |s| {
        in_sync(s, "single")
            && addon(s, "single")
                .is_some_and(|a| a["status"]["appliedObjects"].as_array().map(Vec::len) == Some(1))
    })
    .await;

    // A removed Addon removes its objects, then goes.
    seed.delete("addons", Some("cluster-dual"), "metallb");
    seed.wait_for("dual's objects and Addon gone", WAIT, "ctl", |s| {
        addon(s, "dual").is_none()
            && pool_addresses(&dual, "kipam-managed-pool-dualstack").is_none()
            && dual
                .get(
                    "l2advertisements.metallb.io",
                    Some("metallb-system"),
                    "kipam-advertise-all",
                )
                .is_none()
    })
    .await;

    // A rotated kubeconfig is picked up: "down" now points at a live cluster.
    let revived = user_cluster(true).await;
    put_kubeconfig(&seed, "down", &revived.kubeconfig_yaml());
    seed.wait_for(
        "down in sync after the kubeconfig rotation",
        WAIT,
        "ctl",
        |s| in_sync(s, "down"),
    )
    .await;
    assert_eq!(
        pool_addresses(&revived, "kipam-managed-pool"),
        Some(held_entries(&seed, "down", "metallb"))
    );

    // The CRDs installed late: the next sync applies.
    no_crds.apply_yaml(METALLB_CRDS).expect("CRDs");
    seed.wait_for("nocrd in sync once its CRDs exist", WAIT, "ctl", |s| {
        in_sync(s, "nocrd")
    })
    .await;
    assert_eq!(
        pool_addresses(&no_crds, "kipam-managed-pool"),
        Some(held_entries(&seed, "nocrd", "metallb"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_cluster_does_not_wait_for_its_unreachable_user_cluster() {
    let seed = Seed::start("addons-gone").await;
    let _ctl = seed.controller_with("ctl", &["--addon-resync", "2"]);
    seed.apply(POOLS);
    let live = user_cluster(true).await;
    register(&seed, "lost", "dc-1", &live.kubeconfig_yaml()).await;
    seed.wait_for("lost in sync", WAIT, "ctl", |s| in_sync(s, "lost"))
        .await;
    // The user cluster goes away for good, then its Cluster is deleted.
    live.shutdown();
    seed.delete("clusters", None, "lost");
    seed.wait_for(
        "the Cluster, its namespace and Addon gone",
        WAIT,
        "ctl",
        |s| {
            s.get("clusters", None, "lost").is_none()
                && s.get("namespaces", None, "cluster-lost").is_none()
                && addon(s, "lost").is_none()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_rbac_and_bad_kubeconfigs_are_named() {
    let seed = Seed::start("addons-reasons").await;
    let _ctl = seed.controller_with("ctl", &["--addon-resync", "2"]);
    seed.apply(POOLS);

    let refuses_token = user_cluster(true).await;
    refuses_token.set_require_auth(true);
    refuses_token.set_token_review(|_| None);
    let forbids = user_cluster(true).await;
    forbids.set_require_auth(true);
    // Discovery allowed, every resource request denied.
    forbids.set_access_review(|r| r.resource.is_none());
    let live = user_cluster(true).await;
    register(&seed, "unauth", "dc-1", &refuses_token.kubeconfig_yaml()).await;
    register(&seed, "forbidden", "dc-1", &forbids.kubeconfig_yaml()).await;
    // A kubeconfig that would run a program on the controller.
    let exec = live.kubeconfig_yaml().replace(
        &format!("token: {}", live.token()),
        "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/false}",
    );
    assert_ne!(
        exec,
        live.kubeconfig_yaml(),
        "the fixture must change the kubeconfig"
    );
    register(&seed, "exec", "dc-1", &exec).await;
    // A Secret without the key the Cluster names.
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "kc-nokey", "namespace": "kipam-system"},
            "stringData": {"other": "x"}}))
        .expect("secret");
    seed.cluster_with(
        "nokey",
        "dc-1",
        "kubeconfig: {secretRef: {namespace: kipam-system, name: kc-nokey}}",
    );
    seed.wait_for("namespace cluster-nokey", WAIT, "ctl", |s| {
        s.get("namespaces", None, "cluster-nokey").is_some()
    })
    .await;
    seed.api
        .create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "metallb", "namespace": "cluster-nokey"},
            "spec": {"name": "metallb"}}),
        )
        .expect("addon");

    seed.wait_for("every reason reported", WAIT, "ctl", |s| {
        addon_condition(s, "unauth", "Applied").1 == "Unauthorized"
            && addon_condition(s, "forbidden", "Applied").1 == "Forbidden"
            && addon_condition(s, "exec", "Applied").1 == "KubeconfigInvalid"
            && addon_condition(s, "nokey", "Applied").1 == "KubeconfigInvalid"
    })
    .await;
    assert!(
        addon_condition(&seed, "exec", "Applied")
            .2
            .contains("uses exec")
    );
    assert!(
        addon_condition(&seed, "nokey", "Applied")
            .2
            .contains("key \"kubeconfig\": the key is missing")
    );
    assert!(
        addon_condition(&seed, "forbidden", "Applied")
            .2
            .contains("ClusterRole")
    );
    // No token ever shows up in a status or the log.
    for cluster in ["unauth", "forbidden", "exec"] {
        let text = addon(&seed, cluster).expect("addon").to_string();
        for token in [refuses_token.token(), forbids.token(), live.token()] {
            assert!(!text.contains(&token), "{cluster}: token in status");
        }
    }
    let log = std::fs::read_to_string(seed.log_path("ctl")).unwrap_or_default();
    for token in [refuses_token.token(), forbids.token(), live.token()] {
        assert!(!log.contains(&token), "token in the controller log");
    }
    assert!(live.list("ipaddresspools.metallb.io", None).is_empty());

    // An Addon that never applied anything is not held back by its unusable kubeconfig.
    seed.delete("addons", Some("cluster-nokey"), "metallb");
    seed.wait_for("the nokey Addon gone", WAIT, "ctl", |s| {
        addon(s, "nokey").is_none()
    })
    .await;
}

/// The applier keeps only the metadata of kubeconfig Secrets and reads one from the seed when
/// it builds a client. A read that fails (the seed's API server busy for a moment) is tried
/// again with backoff, not left until the next resync (300 s by default) as an unusable
/// kubeconfig is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_secret_the_seed_fails_to_send_is_read_again_soon() {
    let seed = Seed::start("addons-secret-read").await;
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    let first = user_cluster(true).await;
    register(&seed, "first", "dc-1", &first.kubeconfig_yaml()).await;
    seed.wait_for("first in sync", WAIT, "ctl", |s| in_sync(s, "first"))
        .await;
    // The applier's Secret watch has listed: the next reads of Secrets are kubeconfig reads.
    seed.api.inject_failures("list", "secrets", 3, 500);
    let before = seed.api.stats().count("list", "secrets");
    let flaky = user_cluster(true).await;
    register(&seed, "flaky", "dc-1", &flaky.kubeconfig_yaml()).await;
    seed.wait_for("flaky in sync", WAIT, "ctl", |s| {
        in_sync(s, "flaky")
            && !held_entries(s, "flaky", "metallb").is_empty()
            && pool_addresses(&flaky, "kipam-managed-pool").is_some()
    })
    .await;
    let reads = seed.api.stats().count("list", "secrets") - before;
    assert!(
        reads >= 4,
        "kubeconfig reads: {reads} (3 refused, then one answered)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_user_cluster_delays_no_other() {
    let seed = Seed::start("addons-slow").await;
    let _ctl = seed.controller_with("ctl", &["--addon-resync", "60", "--tenant-timeout", "20"]);
    seed.apply(POOLS);
    let slow = user_cluster(true).await;
    slow.set_latency(Duration::from_secs(3));
    register(&seed, "slow", "dc-1", &slow.kubeconfig_yaml()).await;
    // The slow cluster's sync is under way (its first request is waiting).
    seed.wait_for("the slow cluster's sync started", WAIT, "ctl", |_| {
        slow.stats().total > 0
    })
    .await;
    let fast = user_cluster(true).await;
    let started = Instant::now();
    register(&seed, "fast", "dc-1", &fast.kubeconfig_yaml()).await;
    seed.wait_for("fast in sync", WAIT, "ctl", |s| in_sync(s, "fast"))
        .await;
    let fast_took = started.elapsed();
    assert!(
        !in_sync(&seed, "slow"),
        "the slow cluster was expected to still be syncing"
    );
    assert!(fast_took < Duration::from_secs(6), "{fast_took:?}");
    seed.wait_for(
        "slow in sync in the end",
        Duration::from_secs(60),
        "ctl",
        |s| in_sync(s, "slow"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_applies() {
    let seed = Seed::start("addons-leader").await;
    // Someone else holds the Lease for an hour.
    let now = kipam::resources::now_rfc3339();
    seed.api
        .create(
            &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "kipam-seed", "namespace": "kipam-system"},
            "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                     "acquireTime": now, "renewTime": now}}),
        )
        .expect("lease");
    let _ctl = seed.controller_with("ctl", &["--addon-resync", "1"]);
    seed.apply(POOLS);
    let user = user_cluster(true).await;
    let ns = "cluster-follower";
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"ipam.kipam.dev/cluster": "follower"}}}))
        .expect("namespace");
    put_kubeconfig(&seed, "follower", &user.kubeconfig_yaml());
    seed.cluster_with(
        "follower",
        "dc-1",
        "kubeconfig: {secretRef: {namespace: kipam-system, name: kc-follower}}",
    );
    seed.api
        .create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "metallb", "namespace": ns},
            "spec": {"name": "metallb"}}),
        )
        .expect("addon");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        user.stats().total,
        0,
        "a replica that does not lead talked to the user cluster"
    );
    assert!(addon(&seed, "follower").is_some_and(|a| a.get("status").is_none()));
    // The Lease goes: the replica leads, allocates and applies.
    seed.delete("leases", Some("kipam-system"), "kipam-seed");
    seed.wait_for("applied once leading", WAIT, "ctl", |s| {
        in_sync(s, "follower")
            && pool_addresses(&user, "kipam-managed-pool")
                == Some(held_entries(s, "follower", "metallb"))
    })
    .await;
}

/// An addons directory for one test: the shipped `metallb` addon plus `extra` addons, each
/// given as `(name, source of its one template)`. Returns the addons and templates
/// directories as arguments for the controller.
fn addons_with(seed: &Seed, extra: &[(&str, &str)]) -> (String, String) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let addons = seed.log_path("addons-dir");
    std::fs::create_dir_all(addons.join("metallb")).expect("dir");
    for entry in std::fs::read_dir(root.join("addons/metallb")).expect("metallb addon") {
        let path = entry.expect("entry").path();
        if let Some(name) = path.file_name() {
            std::fs::copy(&path, addons.join("metallb").join(name)).expect("copy");
        }
    }
    for (name, source) in extra {
        std::fs::create_dir_all(addons.join(name)).expect("dir");
        std::fs::write(addons.join(name).join("10_template.yaml"), source).expect("extra addon");
    }
    (
        addons.to_string_lossy().to_string(),
        root.join("templates").to_string_lossy().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_belongs_to_one_addon_and_moves_without_a_gap() {
    let seed = Seed::start("addons-shared").await;
    // The shipped addons plus `extra`, which renders metallb's L2Advertisement too.
    let (addons_dir, templates_dir) = addons_with(
        &seed,
        &[(
            "extra",
            "apiVersion: metallb.io/v1beta1\nkind: L2Advertisement\nmetadata:\n  name: kipam-advertise-all\n  namespace: metallb-system\n",
        )],
    );
    let _ctl = seed.controller_with(
        "ctl",
        &[
            "--addon-resync",
            "60",
            "--addons-dir",
            &addons_dir,
            "--templates-dir",
            &templates_dir,
        ],
    );
    seed.apply(POOLS);
    let user = user_cluster(true).await;
    register(&seed, "shared", "dc-1", &user.kubeconfig_yaml()).await;
    seed.api
        .create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "zz-extra", "namespace": "cluster-shared"},
            "spec": {"name": "extra"}}),
        )
        .expect("addon");
    let extra_condition = |s: &Seed, t: &str| -> (String, String, String) {
        s.get("addons", Some("cluster-shared"), "zz-extra")
            .and_then(|a| {
                a["status"]["conditions"].as_array().and_then(|cs| {
                    cs.iter().find(|c| c["type"] == t).map(|c| {
                        (
                            c["status"].as_str().unwrap_or_default().to_string(),
                            c["reason"].as_str().unwrap_or_default().to_string(),
                            c["message"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                })
            })
            .unwrap_or_default()
    };
    // `zz-extra` comes after `metallb` by name: it is refused, saying which Addon has the
    // object.
    seed.wait_for("metallb in sync, extra refused", WAIT, "ctl", |s| {
        in_sync(s, "shared")
            && pool_addresses(&user, "kipam-managed-pool").is_some()
            && extra_condition(s, "Rendered").1 == "TemplateError"
    })
    .await;
    assert!(
        extra_condition(&seed, "Rendered")
            .2
            .contains("which Addon metallb of this cluster renders too")
    );
    // metallb goes: its pool is pruned, the L2Advertisement stays (extra takes it over).
    seed.delete("addons", Some("cluster-shared"), "metallb");
    seed.wait_for("metallb gone, extra in sync", WAIT, "ctl", |s| {
        addon(s, "shared").is_none() && extra_condition(s, "InSync").0 == "True"
    })
    .await;
    assert!(pool_addresses(&user, "kipam-managed-pool").is_none());
    assert!(
        user.get(
            "l2advertisements.metallb.io",
            Some("metallb-system"),
            "kipam-advertise-all"
        )
        .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_would_exhaust_memory_fails_its_addon_and_nothing_else() {
    let seed = Seed::start("addons-memory").await;
    // 16 bytes doubled 25 times (512 MiB), never printed.
    let (addons_dir, templates_dir) = addons_with(
        &seed,
        &[(
            "grow",
            "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}\n\
             {% for i in range(25) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: grow\n  namespace: metallb-system\n",
        )],
    );
    let mut ctl = seed.controller_with(
        "ctl",
        &[
            "--addons-dir",
            &addons_dir,
            "--templates-dir",
            &templates_dir,
            "--max-render-memory",
            "64MiB",
        ],
    );
    seed.apply(POOLS);
    let user = user_cluster(true).await;
    register(&seed, "big", "dc-1", &user.kubeconfig_yaml()).await;
    seed.api
        .create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "grow", "namespace": "cluster-big"},
            "spec": {"name": "grow"}}),
        )
        .expect("addon");
    let grow_rendered = |s: &Seed| -> (String, String) {
        s.get("addons", Some("cluster-big"), "grow")
            .and_then(|a| {
                a["status"]["conditions"].as_array().and_then(|cs| {
                    cs.iter().find(|c| c["type"] == "Rendered").map(|c| {
                        (
                            c["reason"].as_str().unwrap_or_default().to_string(),
                            c["message"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                })
            })
            .unwrap_or_default()
    };
    seed.wait_for("metallb in sync, grow refused", WAIT, "ctl", |s| {
        in_sync(s, "big")
            && pool_addresses(&user, "kipam-managed-pool").is_some()
            && grow_rendered(s).0 == "TemplateError"
    })
    .await;
    let (_, message) = grow_rendered(&seed);
    assert!(
        message.contains("addon grow: rendering needed more than 64 MiB of memory"),
        "{message}"
    );
    assert!(
        user.get("configmaps", Some("metallb-system"), "grow")
            .is_none()
    );
    // The controller is alive and serving.
    assert!(ctl.is_running());
    let health = Seed::http_get(ctl.metrics_port, "/healthz").await;
    assert_eq!(health.0, 200, "{}", health.1);
}

/// A user cluster without MetalLB's CRDs answers the discovery of `metallb.io/v1beta1` with a
/// plain-text 404. The Addon says `MissingCRD`; the log says once which CRD is missing and what
/// to do (not once per retry), and the retries slow down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_cluster_without_metallb_is_named_once_and_retried_ever_less_often() {
    let seed = Seed::start("addons-no-metallb").await;
    let no_crds = user_cluster(false).await;
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    register(&seed, "nocrd", "dc-1", &no_crds.kubeconfig_yaml()).await;
    // Rendered before the cluster's allocation exists, the addon has its L2Advertisement
    // alone, and that CRD is named first: wait for the rendering with the address pool.
    seed.wait_for("nocrd MissingCRD", WAIT, "ctl", |s| {
        let (_, reason, message) = addon_condition(s, "nocrd", "Applied");
        reason == "MissingCRD" && message.contains("ipaddresspools.metallb.io")
    })
    .await;
    let message = addon_condition(&seed, "nocrd", "Applied").2;
    assert!(
        message.contains("the CustomResourceDefinition ipaddresspools.metallb.io is not installed"),
        "{message}"
    );
    assert!(message.contains("install MetalLB"), "{message}");
    let times = request_times(
        &no_crds,
        "get",
        "/apis/metallb.io/v1beta1",
        Duration::from_secs(8),
    )
    .await;
    let log = seed.full_log("ctl");
    assert!(
        !log.contains("Status {"),
        "a Status dump in the log:\n{log}"
    );
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("ipaddresspools.metallb.io"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains("cluster-nocrd/metallb"), "{log}");
    assert!(
        longest_gap(&times) >= Duration::from_secs(2),
        "the retries never slowed down: {times:?}"
    );
}

/// The planning loop writes a Cluster's `IPAMReady` and the applier its `AddonsReady`, both in
/// `status.conditions`. Each used to patch the whole list from its cached copy: with a lagging
/// cache, the applier's patch put back a list without `IPAMReady`, and `kubectl get clusters`
/// showed an empty IPAM column for good although every allocation was made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipam_ready_and_addons_ready_are_both_kept_with_a_lagging_cache() {
    let seed = Seed::start("both-conditions").await;
    seed.api.set_watch_delay(Duration::from_millis(500));
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    for name in ["a", "b", "c"] {
        let ns = format!("cluster-{name}");
        seed.api
            .create(&json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"ipam.kipam.dev/cluster": name}}}))
            .expect("namespace");
        seed.api
            .create(
                &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
                "metadata": {"name": "metallb", "namespace": ns},
                "spec": {"name": "metallb"}}),
            )
            .expect("addon");
        seed.cluster(name, "dc-1");
    }
    let both = |s: &Seed| {
        ["a", "b", "c"].iter().all(|name| {
            s.condition("clusters", name, "IPAMReady")
                .is_some_and(|c| c["status"] == "True")
                && s.condition("clusters", name, "AddonsReady")
                    .is_some_and(|c| c["reason"] == "KubeconfigInvalid")
        })
    };
    seed.wait_for(
        "IPAMReady and AddonsReady on every Cluster",
        WAIT,
        "ctl",
        both,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        both(&seed),
        "a condition was lost: {:?}",
        seed.api
            .list("clusters", None)
            .iter()
            .map(|c| c["status"].clone())
            .collect::<Vec<_>>()
    );
}

/// A merge patch of the user cluster's `kipam-managed-pool`, as `kubectl edit` or
/// `kubectl label` sends it, by a client of the test (not kipam).
async fn hand_patch(user: &ApiServer, patch: Value) {
    let kc = kube::config::Kubeconfig::from_yaml(&user.kubeconfig_yaml()).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(cfg).expect("client");
    let resource = kube::discovery::ApiResource {
        group: "metallb.io".into(),
        version: "v1beta1".into(),
        api_version: "metallb.io/v1beta1".into(),
        kind: "IPAddressPool".into(),
        plural: "ipaddresspools".into(),
    };
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client, "metallb-system", &resource);
    api.patch(
        "kipam-managed-pool",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(patch),
    )
    .await
    .expect("hand patch");
}

/// Server-side applies of IPAddressPools the user cluster has served (kipam's; the test's own
/// edits are merge patches, counted separately by the caller).
fn pool_patches(user: &ApiServer) -> u64 {
    user.stats().count("patch", "ipaddresspools")
}

/// Drift is repaired within seconds, not at the next resync (here 300 s): kipam watches what
/// it applied in each user cluster. What others add next to kipam's fields stays, and kipam does
/// not keep re-applying over it. A user cluster that forbids the watch is still served, says so
/// once, and holds up no other cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_repaired_within_seconds_without_waiting_for_the_resync() {
    const REPAIR: Duration = Duration::from_secs(5);
    let seed = Seed::start("addons-drift").await;
    let user = user_cluster(true).await;
    // RBAC without list and watch, as the docs asked for before kipam watched anything.
    let nowatch = user_cluster(true).await;
    nowatch.set_require_auth(true);
    nowatch.set_access_review(|r| {
        r.resource
            .as_ref()
            .is_none_or(|a| a.verb != "list" && a.verb != "watch")
    });
    let ctl = seed.controller_with("ctl", &["--addon-resync", "300"]);
    seed.apply(POOLS);
    register(&seed, "drift", "dc-1", &user.kubeconfig_yaml()).await;
    register(&seed, "nowatch", "dc-1", &nowatch.kubeconfig_yaml()).await;
    // In sync with its allocation: a first sync may run before the allocation exists (and be
    // in sync with that), so wait for the allocation to be held too.
    seed.wait_for(
        "both clusters in sync with their allocations",
        WAIT,
        "ctl",
        |s| {
            in_sync(s, "drift")
                && in_sync(s, "nowatch")
                && !held_entries(s, "drift", "metallb").is_empty()
                && pool_addresses(&user, "kipam-managed-pool").is_some()
        },
    )
    .await;
    let held = held_entries(&seed, "drift", "metallb");
    assert_eq!(
        pool_addresses(&user, "kipam-managed-pool"),
        Some(held.clone())
    );

    // A hand edit of kipam's addresses is taken back within seconds.
    let started = Instant::now();
    hand_patch(
        &user,
        json!({"spec": {"addresses": ["192.0.2.0-192.0.2.255"]}}),
    )
    .await;
    seed.wait_for("the hand edit repaired", REPAIR, "ctl", |_| {
        pool_addresses(&user, "kipam-managed-pool") == Some(held.clone())
    })
    .await;
    eprintln!("hand edit repaired after {:?}", started.elapsed());

    // Someone else's label is not drift: it stays, and kipam sends nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    hand_patch(&user, json!({"metadata": {"labels": {"team": "network"}}})).await;
    let applies = pool_patches(&user);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        pool_patches(&user),
        applies,
        "kipam re-applied over someone else's label"
    );
    let pool = user
        .get(
            "ipaddresspools",
            Some("metallb-system"),
            "kipam-managed-pool",
        )
        .expect("pool");
    assert_eq!(pool["metadata"]["labels"]["team"], "network");

    // A field kipam does not render, set by someone else, stays; kipam applies at most once.
    hand_patch(&user, json!({"spec": {"avoidBuggyIPs": true}})).await;
    let applies = pool_patches(&user);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        pool_patches(&user) - applies <= 1,
        "kipam keeps re-applying over someone else's field: {} applies in 3 s",
        pool_patches(&user) - applies
    );
    let pool = user
        .get(
            "ipaddresspools",
            Some("metallb-system"),
            "kipam-managed-pool",
        )
        .expect("pool");
    assert_eq!(pool["spec"]["avoidBuggyIPs"], true);
    assert_eq!(
        pool_addresses(&user, "kipam-managed-pool"),
        Some(held.clone())
    );

    // kipam's own label removed by hand, and the whole pool deleted by hand: both back.
    hand_patch(
        &user,
        json!({"metadata": {"labels": {"ipam.kipam.dev/addon": null}}}),
    )
    .await;
    seed.wait_for("kipam's label restored", REPAIR, "ctl", |_| {
        user.get(
            "ipaddresspools",
            Some("metallb-system"),
            "kipam-managed-pool",
        )
        .is_some_and(|p| p["metadata"]["labels"]["ipam.kipam.dev/addon"] == "metallb")
    })
    .await;
    user.delete(
        "ipaddresspools",
        Some("metallb-system"),
        "kipam-managed-pool",
    )
    .expect("hand delete");
    seed.wait_for("the hand delete restored", REPAIR, "ctl", |_| {
        pool_addresses(&user, "kipam-managed-pool") == Some(held.clone())
    })
    .await;
    assert!(
        Seed::metric(ctl.metrics_port, "kipam_addon_drift_repairs_total")
            .await
            .is_some_and(|n| n >= 3.0)
    );

    // Another writer that sets the addresses back each time: kipam repairs a few times at once,
    // then with growing delays, and says so once; no tight loop.
    let theirs = json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "kipam-managed-pool", "namespace": "metallb-system"},
        "spec": {"addresses": ["192.0.2.0-192.0.2.255"]}});
    let applies = pool_patches(&user);
    let fight = Instant::now();
    while fight.elapsed() < Duration::from_secs(5) {
        if pool_addresses(&user, "kipam-managed-pool") != Some(vec!["192.0.2.0-192.0.2.255".into()])
        {
            user.apply(&theirs).expect("the other writer");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fought = pool_patches(&user) - applies;
    assert!(
        (3..=15).contains(&fought),
        "{fought} applies in 5 s against another writer"
    );
    seed.wait_for("repaired once the other writer stops", WAIT, "ctl", |_| {
        pool_addresses(&user, "kipam-managed-pool") == Some(held.clone())
    })
    .await;

    // The cluster that forbids watching: still in sync, its watches failing, said once each
    // (one per kind kipam applied there), retried with backoff rather than hammered.
    assert!(in_sync(&seed, "nowatch"));
    let lists = nowatch.stats().verb("list");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        nowatch.stats().verb("list") - lists <= 8,
        "{} lists in 4 s from failing watches",
        nowatch.stats().verb("list") - lists
    );
    assert_eq!(
        Seed::metric(
            ctl.metrics_port,
            "kipam_addon_drift_watches{state=\"failing\"}"
        )
        .await,
        Some(2.0)
    );
    let log = std::fs::read_to_string(seed.log_path("ctl")).expect("log");
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("drift watch failed") && l.contains("nowatch"))
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:#?}");
    assert!(
        warnings.iter().all(|l| l.contains("Forbidden")),
        "{warnings:#?}"
    );
    assert_eq!(
        log.matches("keeps being changed").count(),
        1,
        "the fight is said once"
    );
    assert!(!log.contains("Status {"), "a Debug dump in the log:\n{log}");
}

/// The soft open-file limit of `/proc/<pid>/limits`, and the hard one.
fn open_file_limits(pid: u32) -> Option<(String, String)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut fields = line["Max open files".len()..].split_whitespace();
    Some((fields.next()?.to_string(), fields.next()?.to_string()))
}

/// Started with the soft open-file limit of 1,024 some container runtimes give, the controller
/// raises it to the hard limit: the drift watches hold two connections per user cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_raises_its_open_file_limit_to_the_hard_limit() {
    use std::os::unix::process::CommandExt;
    let seed = Seed::start("nofile").await;
    let kubeconfig = seed.dir().join("nofile.kubeconfig");
    seed.api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kipam"));
    command
        .args(["controller", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--metrics-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: between fork and exec the child only lowers its own soft limit.
    unsafe {
        command.pre_exec(|| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_max > 1024 {
                limit.rlim_cur = 1024;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("controller starts");
    let pid = child.id();
    let deadline = Instant::now() + WAIT;
    let mut limits = open_file_limits(pid);
    while limits.as_ref().is_none_or(|(soft, hard)| soft != hard) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        limits = open_file_limits(pid);
    }
    let _ = child.kill();
    let _ = child.wait();
    let (soft, hard) = limits.expect("limits readable");
    assert_eq!(
        soft, hard,
        "the soft open-file limit stayed below the hard one"
    );
}
