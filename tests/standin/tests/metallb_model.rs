//! The MetalLB model (`kube_standin::metallb`): how it hands out, keeps and takes back
//! addresses when pools change, and what it records.

use std::time::Duration;

use kube_standin::ApiServer;
use kube_standin::MetalLbModel;
use serde_json::{Value, json};

const METALLB_CRDS: &str = include_str!("../../render/fixtures/metallb-crds.yaml");
const SETTLE: Duration = Duration::from_secs(10);

async fn user_cluster() -> ApiServer {
    let api = ApiServer::start().await.expect("stand-in starts");
    api.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "metallb-system"}}))
        .expect("namespace");
    api.apply_yaml(METALLB_CRDS).expect("MetalLB CRDs");
    api
}

fn pool(api: &ApiServer, name: &str, addresses: &[&str]) {
    api.apply(
        &json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": name, "namespace": "metallb-system"},
        "spec": {"addresses": addresses}}),
    )
    .expect("pool");
}

fn service(api: &ApiServer, name: &str, extra: Value) {
    let mut svc = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
    if let (Some(s), Some(e)) = (svc.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            match (s.get_mut(k), v) {
                (Some(Value::Object(base)), Value::Object(more)) => {
                    base.extend(more.clone());
                }
                _ => {
                    s.insert(k.clone(), v.clone());
                }
            }
        }
    }
    api.create(&svc).expect("service");
}

fn address(api: &ApiServer, name: &str) -> Option<String> {
    api.get("services", Some("default"), name).and_then(|s| {
        s["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .map(str::to_string)
    })
}

fn failures(api: &ApiServer, name: &str) -> usize {
    api.list("events", Some("default"))
        .iter()
        .filter(|e| e["reason"] == "AllocationFailed" && e["involvedObject"]["name"] == name)
        .count()
}

#[tokio::test]
async fn a_new_service_gets_the_first_free_address_of_the_pools() {
    let api = user_cluster().await;
    pool(&api, "b", &["10.0.1.0/30"]);
    pool(&api, "a", &["10.0.0.10-10.0.0.11"]);
    let model = MetalLbModel::start(&api);
    service(&api, "one", json!({}));
    service(&api, "two", json!({}));
    service(&api, "three", json!({}));
    service(
        &api,
        "asks",
        json!({"metadata": {"annotations": {"metallb.io/address-pool": "b"}}}),
    );
    service(
        &api,
        "pinned",
        json!({"spec": {"loadBalancerIP": "10.0.1.3"}}),
    );
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "one").as_deref(), Some("10.0.0.10"));
    assert_eq!(address(&api, "two").as_deref(), Some("10.0.0.11"));
    assert_eq!(
        address(&api, "three").as_deref(),
        Some("10.0.1.0"),
        "then the next pool by name"
    );
    assert_eq!(
        address(&api, "asks").as_deref(),
        Some("10.0.1.1"),
        "the pool it asks for"
    );
    assert_eq!(
        address(&api, "pinned").as_deref(),
        Some("10.0.1.3"),
        "the address it asks for"
    );
    service(&api, "four", json!({}));
    service(&api, "five", json!({}));
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "four").as_deref(), Some("10.0.1.2"));
    assert_eq!(address(&api, "five"), None, "nothing is free");
    assert_eq!(
        failures(&api, "five"),
        1,
        "one AllocationFailed event while it waits"
    );
    let served: Vec<(String, Vec<String>)> = model
        .history()
        .into_iter()
        .map(|c| (c.service, c.new))
        .collect();
    assert_eq!(
        served.len(),
        6,
        "every address handed out is in the history: {served:?}"
    );
    assert!(model.lost_addresses().is_empty());
    assert!(model.overlaps().is_empty());
}

#[tokio::test]
async fn a_pool_removed_under_a_service_clears_it_and_the_loss_is_recorded() {
    let api = user_cluster().await;
    pool(&api, "a", &["10.0.0.10-10.0.0.11"]);
    pool(&api, "b", &["10.0.1.10/32"]);
    let model = MetalLbModel::start(&api);
    service(&api, "web", json!({}));
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "web").as_deref(), Some("10.0.0.10"));
    api.delete("ipaddresspools.metallb.io", Some("metallb-system"), "a")
        .unwrap();
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(
        address(&api, "web").as_deref(),
        Some("10.0.1.10"),
        "cleared, then given an address of the pool left"
    );
    let lost = model.lost_addresses();
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].service, "default/web");
    assert_eq!(lost[0].taken(), vec!["10.0.0.10".to_string()]);
    // The last pool goes: MetalLB clears every Service and cannot serve it again.
    api.delete("ipaddresspools.metallb.io", Some("metallb-system"), "b")
        .unwrap();
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "web"), None);
    assert_eq!(model.lost_addresses().len(), 2);
}

#[tokio::test]
async fn a_pool_renamed_keeps_its_services_through_a_refused_overlap() {
    let api = user_cluster().await;
    pool(&api, "hand-made", &["10.0.0.0/29"]);
    let model = MetalLbModel::start(&api);
    service(&api, "web", json!({}));
    service(&api, "db", json!({}));
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "web").as_deref(), Some("10.0.0.0"));
    assert_eq!(address(&api, "db").as_deref(), Some("10.0.0.1"));
    // The new pool first: it overlaps the old one, so the configuration is refused and the
    // old one stays in force.
    pool(&api, "kipam-managed-pool", &["10.0.0.0-10.0.0.7"]);
    assert!(model.caught_up(SETTLE).await);
    let refusals = model.refusals();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(
        refusals[0].reason.contains("overlaps"),
        "{}",
        refusals[0].reason
    );
    assert_eq!(model.config().keys().collect::<Vec<_>>(), vec!["hand-made"]);
    let overlaps = model.overlaps();
    assert_eq!(overlaps.len(), 1);
    assert_eq!(
        overlaps[0].pools,
        ("hand-made".to_string(), "kipam-managed-pool".to_string())
    );
    assert!(overlaps[0].until.is_none(), "still overlapping");
    // Then the old one goes: the new configuration holds every address in use.
    api.delete(
        "ipaddresspools.metallb.io",
        Some("metallb-system"),
        "hand-made",
    )
    .unwrap();
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(
        model.config().keys().collect::<Vec<_>>(),
        vec!["kipam-managed-pool"]
    );
    assert_eq!(address(&api, "web").as_deref(), Some("10.0.0.0"));
    assert_eq!(address(&api, "db").as_deref(), Some("10.0.0.1"));
    assert!(model.lost_addresses().is_empty(), "{:?}", model.history());
    let overlaps = model.overlaps();
    assert!(
        overlaps[0].until.is_some(),
        "the overlap ended: {overlaps:?}"
    );
}

#[tokio::test]
async fn a_pool_edited_in_place_keeps_its_services_without_any_overlap() {
    let api = user_cluster().await;
    pool(&api, "legacy", &["10.0.0.0/29"]);
    let model = MetalLbModel::start(&api);
    service(&api, "web", json!({}));
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "web").as_deref(), Some("10.0.0.0"));
    pool(&api, "legacy", &["10.0.0.0/31", "10.0.5.0/30"]);
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "web").as_deref(), Some("10.0.0.0"));
    // An edit that leaves the address out takes it.
    pool(&api, "legacy", &["10.0.5.0/30"]);
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "web").as_deref(), Some("10.0.5.0"));
    assert_eq!(model.lost_addresses().len(), 1);
    assert!(model.overlaps().is_empty());
    assert!(model.refusals().is_empty());
}

#[tokio::test]
async fn a_service_asking_for_another_pool_is_moved_and_existing_addresses_are_kept_at_start() {
    let api = user_cluster().await;
    pool(&api, "a", &["10.0.0.0/30"]);
    pool(&api, "b", &["10.0.1.0/30"]);
    // Served before the model starts (MetalLB restarting): the first holder keeps its address,
    // a second Service showing the same address is cleared and served anew.
    service(&api, "first", json!({}));
    service(&api, "second", json!({}));
    for name in ["first", "second"] {
        api.set_status(
            "services",
            Some("default"),
            name,
            json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.2"}]}}),
        )
        .unwrap();
    }
    let model = MetalLbModel::start(&api);
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "first").as_deref(), Some("10.0.0.2"));
    assert_eq!(address(&api, "second").as_deref(), Some("10.0.0.0"));
    // An annotation naming another pool than the one its address is in: moved there.
    let mut first = api.get("services", Some("default"), "first").unwrap();
    first["metadata"]["annotations"] = json!({"metallb.universe.tf/address-pool": "b"});
    if let Some(o) = first.as_object_mut() {
        o.remove("status");
    }
    if let Some(m) = first["metadata"].as_object_mut() {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    api.apply(&first).unwrap();
    assert!(model.caught_up(SETTLE).await);
    assert_eq!(address(&api, "first").as_deref(), Some("10.0.1.0"));
    let taken: Vec<String> = model
        .lost_addresses()
        .into_iter()
        .map(|c| c.service)
        .collect();
    assert_eq!(taken, vec!["default/second", "default/first"]);
}
