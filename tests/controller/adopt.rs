//! Taking over a fleet that already runs MetalLB, end to end: the real controller, three user
//! clusters with hand-made MetalLB pools and Services holding addresses (two of them serving
//! one address), each with the stand-in's model of MetalLB's controller, which records every
//! change of every Service's address and every moment two pools overlap.

use std::collections::BTreeMap;
use std::time::Duration;

use kube_standin::{ApiServer, MetalLbModel};
use serde_json::{Value, json};

use super::support::Seed;

const WAIT: Duration = Duration::from_secs(40);
const METALLB_CRDS: &str = include_str!("../render/fixtures/metallb-crds.yaml");

const POOL: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/24
      allocationRange: 8
";

/// A user cluster with MetalLB's CRDs, a hand-made pool and LoadBalancer Services (name,
/// address asked for), served by the MetalLB model once they exist.
async fn user_cluster(
    pool: &[&str],
    services: &[(&str, Option<&str>)],
) -> (ApiServer, MetalLbModel) {
    let api = ApiServer::start().await.expect("user cluster starts");
    for ns in ["metallb-system", "apps"] {
        let _ = api.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns}}));
    }
    api.apply_yaml(METALLB_CRDS).expect("MetalLB CRDs");
    api.apply(&json!({
        "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "legacy", "namespace": "metallb-system"},
        "spec": {"addresses": pool},
    }))
    .expect("hand-made pool");
    for (name, ip) in services {
        let mut spec = json!({"type": "LoadBalancer",
            "ports": [{"port": 80, "protocol": "TCP"}]});
        if let Some(ip) = ip {
            spec["loadBalancerIP"] = json!(ip);
        }
        api.apply(&json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "apps"}, "spec": spec}))
            .expect("service");
    }
    let model = MetalLbModel::start(&api);
    assert!(model.caught_up(WAIT).await, "MetalLB model caught up");
    (api, model)
}

/// Every LoadBalancer Service's address, by name.
fn addresses(api: &ApiServer) -> BTreeMap<String, String> {
    api.list("services", Some("apps"))
        .iter()
        .filter_map(|s| {
            let ip = s.pointer("/status/loadBalancer/ingress/0/ip")?.as_str()?;
            Some((s["metadata"]["name"].as_str()?.to_string(), ip.to_string()))
        })
        .collect()
}

fn register(seed: &Seed, cluster: &str, user: &ApiServer, adopt: Option<&str>) {
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("kc-{cluster}"), "namespace": "kipam-system"},
            "stringData": {"kubeconfig": user.kubeconfig_yaml()}}))
        .expect("secret");
    let adopt = adopt.map(|a| format!(", adopt: {a}")).unwrap_or_default();
    seed.cluster_with(
        cluster,
        "dc-1",
        &format!(
            "{{kubeconfig: {{secretRef: {{namespace: kipam-system, name: kc-{cluster}}}}}{adopt}}}"
        ),
    );
}

fn addon(seed: &Seed, cluster: &str) {
    let _ = seed
        .api
        .create(&json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": format!("cluster-{cluster}")}}));
    seed.api
        .create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "metallb", "namespace": format!("cluster-{cluster}")},
            "spec": {"name": "metallb"}}),
        )
        .expect("addon");
}

fn adoption(seed: &Seed, cluster: &str) -> Value {
    seed.get("clusters", None, cluster)
        .and_then(|c| c.pointer("/status/adoption").cloned())
        .unwrap_or(Value::Null)
}

fn pool_in(api: &ApiServer) -> Value {
    api.get(
        "ipaddresspools.metallb.io",
        Some("metallb-system"),
        "legacy",
    )
    .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_that_runs_metallb_is_taken_over_without_a_service_losing_its_address() {
    let seed = Seed::start("adopt").await;
    // u1 and u2 both serve 10.0.0.11 (a latent outage nobody knew of); u3 serves two
    // addresses inside kipam's pool and one outside every pool.
    let (u1, m1) = user_cluster(
        &["10.0.0.10-10.0.0.19"],
        &[("a", Some("10.0.0.11")), ("b", None)],
    )
    .await;
    let (u2, m2) = user_cluster(&["10.0.0.11-10.0.0.15"], &[("a", Some("10.0.0.11"))]).await;
    let (u3, m3) = user_cluster(
        &["10.0.0.40-10.0.0.47", "192.168.50.0/30"],
        &[("a", None), ("b", None), ("c", Some("192.168.50.1"))],
    )
    .await;
    let before: Vec<BTreeMap<String, String>> =
        [&u1, &u2, &u3].iter().map(|u| addresses(u)).collect();
    assert_eq!(before[0].len(), 2, "u1 serves two: {:?}", before[0]);
    assert_eq!(before[1].get("a").map(String::as_str), Some("10.0.0.11"));
    assert_eq!(before[2].get("a").map(String::as_str), Some("10.0.0.40"));
    assert_eq!(before[2].get("b").map(String::as_str), Some("10.0.0.41"));

    let _ctl = seed.controller("ctl");
    seed.apply(POOL);
    for (name, user) in [("u1", &u1), ("u2", &u2), ("u3", &u3)] {
        register(&seed, name, user, Some("Adopt"));
        addon(&seed, name);
    }

    // u3 is taken over: exactly what it serves inside the pool becomes its allocation, and its
    // hand-made pool becomes kipam's in place, keeping what lies outside every pool.
    let start = std::time::Instant::now();
    while !seed
        .condition("clusters", "u3", "Adopted")
        .is_some_and(|c| c["status"] == "True")
    {
        assert!(
            start.elapsed() < WAIT,
            "u3 not adopted: {}\npool in u3: {}\nconditions: {}\n{}",
            adoption(&seed, "u3"),
            pool_in(&u3),
            seed.get("clusters", None, "u3").unwrap_or_default()["status"]["conditions"],
            seed.log("ctl")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seed.held("u3", "metallb"), "10.0.0.40-10.0.0.41");
    let legacy = pool_in(&u3);
    assert_eq!(
        legacy["spec"]["addresses"],
        json!(["10.0.0.40-10.0.0.41", "192.168.50.0-192.168.50.3"]),
        "{legacy}"
    );
    assert!(legacy["metadata"]["labels"]["ipam.kipam.dev/addon"].is_string());
    assert!(
        u3.get(
            "ipaddresspools.metallb.io",
            Some("metallb-system"),
            "kipam-managed-pool"
        )
        .is_none(),
        "no second pool beside the one taken over"
    );

    // u1 and u2: reported, each naming the other and the address, and left as they are.
    for (me, other) in [("u1", "u2"), ("u2", "u1")] {
        seed.wait_for(&format!("{me} needs a look"), WAIT, "ctl", |s| {
            adoption(s, me)["state"] == "NeedsLook"
        })
        .await;
        let a = adoption(&seed, me);
        let conflict = a["conflicts"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["with"] == other).cloned())
            .unwrap_or_default();
        assert_eq!(conflict["kind"], "BothServe", "{a}");
        assert_eq!(conflict["addresses"], json!(["10.0.0.11"]), "{a}");
        let condition = seed
            .condition("clusters", me, "Adopted")
            .unwrap_or_default();
        assert_eq!(condition["status"], "False");
        assert!(
            condition["message"]
                .as_str()
                .is_some_and(|m| m.contains(other) && m.contains("10.0.0.11")),
            "{condition}"
        );
        assert_eq!(seed.held(me, "metallb"), "", "{me} adopts nothing");
        let notes: Vec<String> = seed
            .api
            .list("events.events.k8s.io", None)
            .iter()
            .filter(|e| e["reason"] == "AdoptionNeedsLook" && e["regarding"]["name"] == me)
            .filter_map(|e| e["note"].as_str().map(str::to_string))
            .collect();
        assert!(
            notes
                .iter()
                .any(|n| n.contains(other) && n.contains("10.0.0.11")),
            "{notes:?}"
        );
    }
    assert_eq!(
        pool_in(&u1)["spec"]["addresses"],
        json!(["10.0.0.10-10.0.0.19"])
    );
    assert_eq!(
        pool_in(&u2)["spec"]["addresses"],
        json!(["10.0.0.11-10.0.0.15"])
    );

    // A cluster registered afterwards gets none of the adopted addresses, nor anything u1's
    // and u2's hand-made pools may still hand out.
    seed.cluster("u4", "dc-1");
    seed.wait_for("u4 allocated", WAIT, "ctl", |s| {
        !s.held("u4", "metallb").is_empty()
    })
    .await;
    let u4 = seed.held("u4", "metallb");
    for piece in u4.split(',') {
        let (first, last) = piece.split_once('-').unwrap_or((piece, piece));
        let last_octet = |a: &str| {
            a.rsplit('.')
                .next()
                .and_then(|o| o.parse::<u32>().ok())
                .unwrap_or(0)
        };
        for o in last_octet(first)..=last_octet(last) {
            assert!(
                !(10..=19).contains(&o) && !(40..=41).contains(&o),
                "u4 got 10.0.0.{o} ({u4})"
            );
        }
    }

    // Throughout, watched not sampled: no Service lost or changed its address, and MetalLB
    // never saw two overlapping pools nor refused a configuration.
    for (model, user, was) in [
        (&m1, &u1, &before[0]),
        (&m2, &u2, &before[1]),
        (&m3, &u3, &before[2]),
    ] {
        assert!(model.caught_up(WAIT).await);
        assert_eq!(model.lost_addresses(), vec![], "{}", seed.log("ctl"));
        assert_eq!(model.overlaps(), vec![]);
        assert_eq!(model.refusals(), vec![]);
        assert_eq!(&addresses(user), was);
        // One change per Service: getting its address at the start.
        for change in model.history() {
            assert!(change.old.is_empty(), "{change:?}");
        }
    }
}

const GROWING_POOL: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/24
      allocationRange: 8
      reuseAfter: 1h
      growth: {increment: 2, max: 8, shrinkAfter: 1h}
";

/// An adopted allocation is like any other: it grows when MetalLB refuses a Service, a hand
/// edit of the pool it took over is repaired, and once released its addresses are quarantined
/// for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_allocation_grows_is_repaired_and_is_quarantined_like_any_other() {
    let seed = Seed::start("adopt-growth").await;
    let (user, model) = user_cluster(&["10.0.0.40-10.0.0.47"], &[("a", None), ("b", None)]).await;
    let _ctl = seed.controller("ctl");
    seed.apply(GROWING_POOL);
    register(&seed, "u", &user, Some("Adopt"));
    addon(&seed, "u");
    seed.wait_for("u adopted", WAIT, "ctl", |s| {
        s.condition("clusters", "u", "Adopted")
            .is_some_and(|c| c["status"] == "True")
    })
    .await;
    assert_eq!(seed.held("u", "metallb"), "10.0.0.40-10.0.0.41");

    // Growth: the taken-over pool holds only what was served; a third Service is refused by
    // MetalLB, the allocation grows, and the Service is served.
    user.apply(&json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "c", "namespace": "apps"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}}))
        .expect("service c");
    seed.wait_for("c served after growth", WAIT, "ctl", |_| {
        addresses(&user).contains_key("c")
    })
    .await;
    let held = seed.held("u", "metallb");
    assert_ne!(held, "10.0.0.40-10.0.0.41", "the allocation grew");
    let c = addresses(&user)["c"].clone();
    assert!(!c.is_empty());

    // Up to here no Service lost its address, and MetalLB never saw two pools overlap.
    assert!(model.caught_up(WAIT).await);
    assert_eq!(model.lost_addresses(), vec![]);
    assert_eq!(model.overlaps(), vec![]);

    // Drift: a hand edit of the pool kipam took over is taken back (MetalLB moves the
    // Services meanwhile, as it would: that is the hand edit's doing).
    let mut edited = pool_in(&user);
    edited["spec"]["addresses"] = json!(["10.0.0.200-10.0.0.210"]);
    edited["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    user.apply(&edited).expect("hand edit");
    seed.wait_for("the hand edit repaired", WAIT, "ctl", |_| {
        pool_in(&user)["spec"]["addresses"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x.as_str() == Some("10.0.0.40-10.0.0.41")))
    })
    .await;

    // Quarantine: the cluster deleted, its addresses are kept from a newcomer for an hour.
    let before = seed.held("u", "metallb");
    seed.delete("clusters", None, "u");
    seed.wait_for("u released", WAIT, "ctl", |s| {
        s.allocation("u", "metallb").is_none()
    })
    .await;
    seed.cluster("newcomer", "dc-1");
    seed.wait_for("newcomer allocated", WAIT, "ctl", |s| {
        !s.held("newcomer", "metallb").is_empty()
    })
    .await;
    let newcomer = seed.held("newcomer", "metallb");
    for piece in before.split(',') {
        assert!(
            !newcomer.split(',').any(|p| p == piece),
            "newcomer got {piece} of the adopted allocation ({newcomer})"
        );
    }
    assert!(
        !newcomer.contains("10.0.0.40"),
        "newcomer got an adopted address: {newcomer}"
    );
}
