//! A pool datacenter's `network` end to end: the real controller renders it into a user
//! cluster, renders again within seconds when only the network changes (not at the next
//! resync), freezes the pool without releasing anything when an edit does not validate, and the
//! CRD schema refuses out-of-bound values on its own.

use std::time::Duration;

use kube_standin::ApiServer;
use serde_json::{Value, json};

use super::support::Seed;

const WAIT: Duration = Duration::from_secs(30);

fn pool(network: &str) -> String {
    format!(
        "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: lb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/28
      allocationRange: 4
      excludeRanges: [\"10.0.0.1\"]
{network}"
    )
}

/// Writes every network value of every allocation into a ConfigMap in the user cluster.
const NETINFO: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: netinfo
  namespace: default
data:
{% for name, a in Cluster.Network.IPAMAllocations | items %}
  {{ name }}-addresses: \"{{ a.Addresses | join(',') }}\"
  {{ name }}-gateway: \"{{ a.Gateway or 'none' }}\"
  {{ name }}-vlan: \"{{ a.VLAN if a.VLAN is not none else 'none' }}\"
  {{ name }}-dns: \"{{ a.DNS | join(',') }}\"
{% endfor %}
";

fn configmap(user: &ApiServer) -> Option<Value> {
    user.get("configmaps", Some("default"), "netinfo")
        .map(|c| c["data"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_edit_reaches_the_user_cluster_and_a_bad_one_releases_nothing() {
    let seed = Seed::start("network").await;
    let addons = seed.log_path("addons-dir");
    std::fs::create_dir_all(addons.join("netinfo")).expect("dir");
    std::fs::write(addons.join("netinfo").join("10_cm.yaml"), NETINFO).expect("addon");
    let _ctl = seed.controller_with(
        "ctl",
        &[
            // No resync during the test: only the pool's change may cause the new render.
            "--addon-resync",
            "600",
            "--addons-dir",
            addons.to_str().unwrap(),
            "--templates-dir",
            "/nonexistent/kipam",
        ],
    );
    seed.apply(&pool(
        "      network: {gateway: 10.0.0.1, prefixLength: 24, vlanId: 42, dnsServers: [10.0.0.53]}",
    ));
    let user = ApiServer::start().await.expect("user cluster starts");
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "kc-a", "namespace": "kipam-system"},
            "stringData": {"kubeconfig": user.kubeconfig_yaml()}}))
        .expect("secret");
    seed.cluster_with(
        "a",
        "dc-1",
        "kubeconfig: {secretRef: {namespace: kipam-system, name: kc-a}}",
    );
    seed.wait_for("namespace cluster-a", WAIT, "ctl", |s| {
        s.get("namespaces", None, "cluster-a").is_some()
    })
    .await;
    seed.api
        .create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "netinfo", "namespace": "cluster-a"},
            "spec": {"name": "netinfo"}}),
        )
        .expect("addon");

    let want = json!({
        "lb-addresses": "10.0.0.0-10.0.0.0,10.0.0.2-10.0.0.4",
        "lb-gateway": "10.0.0.1", "lb-vlan": "42", "lb-dns": "10.0.0.53",
    });
    seed.wait_for("the network in the user cluster", WAIT, "ctl", |_| {
        configmap(&user).as_ref() == Some(&want)
    })
    .await;
    let held = seed.held("a", "lb");

    // Only the network changes: rendered again well before the resync.
    seed.apply(&pool(
        "      network: {gateway: 10.0.0.254, prefixLength: 24, vlanId: 43}",
    ));
    let want = json!({
        "lb-addresses": "10.0.0.0-10.0.0.0,10.0.0.2-10.0.0.4",
        "lb-gateway": "10.0.0.254", "lb-vlan": "43", "lb-dns": "",
    });
    seed.wait_for(
        "the edited network in the user cluster",
        WAIT,
        "ctl",
        |_| configmap(&user).as_ref() == Some(&want),
    )
    .await;

    // An edit the webhook would refuse (the gateway is inside the pool and not excluded) gets
    // past the schema here: the pool is frozen and says why, the cluster keeps its addresses,
    // and no half-checked network reaches the user cluster.
    seed.apply(&pool("      network: {gateway: 10.0.0.9, vlanId: 44}"));
    seed.wait_for("the pool says why it is not ready", WAIT, "ctl", |s| {
        s.condition("ipampools", "lb", "Ready").is_some_and(|c| {
            c["status"] == "False"
                && c["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("network.gateway \"10.0.0.9\": lies inside poolCidr")
        })
    })
    .await;
    let none = json!({
        "lb-addresses": "10.0.0.0-10.0.0.0,10.0.0.2-10.0.0.4",
        "lb-gateway": "none", "lb-vlan": "none", "lb-dns": "",
    });
    seed.wait_for("no network shown for the invalid pool", WAIT, "ctl", |_| {
        configmap(&user).as_ref() == Some(&none)
    })
    .await;
    assert_eq!(seed.held("a", "lb"), held);
    assert_eq!(seed.phase("a", "lb"), "Allocated");

    // The CRD schema itself refuses values out of bounds (no webhook runs here).
    let refused = seed.api.apply_yaml(&pool("      network: {vlanId: 4095}"));
    assert!(refused.is_err(), "vlanId 4095 accepted");
    let refused = seed.api.apply_yaml(&pool(
        "      network: {dnsServers: [1.1.1.1, 1.1.1.2, 1.1.1.3, 1.1.1.4, 1.1.1.5, 1.1.1.6, 1.1.1.7, 1.1.1.8, 1.1.1.9]}",
    ));
    assert!(refused.is_err(), "nine DNS servers accepted");
    assert_eq!(seed.held("a", "lb"), held);
}
