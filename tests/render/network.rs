//! The network of a pool datacenter in the template data: `Gateway`, `PrefixLength`, `VLAN`,
//! `DNS` and `MTU` beside each allocation, built from the pools as the controller and the
//! offline mode build it, and present (as `none` / an empty list) where a pool names none.

use kipam::desired::{add_networks, template_data};
use kipam::render::{Renderer, TemplateData};
use kipam::resources::{IPAMAllocation, IPAMPool};
use serde_json::json;

use super::{cluster, metallb, range};

fn pool(yaml: &str) -> IPAMPool {
    serde_saphyr::from_str(yaml).expect("test pool")
}

fn allocation(pool: &str, dc: &str, addresses: &str) -> IPAMAllocation {
    serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMAllocation",
        "metadata": {"name": pool, "namespace": "cluster-alpha"},
        "spec": {"type": "range", "dc": dc, "addresses": [addresses]},
        "status": {"phase": "Allocated"}
    }))
    .expect("test allocation")
}

fn pools() -> Vec<IPAMPool> {
    vec![
        pool(
            "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: metallb}
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 192.168.1.0/26
      allocationRange: 8
      excludeRanges: [\"192.168.1.1\"]
      network:
        gateway: 192.168.1.1
        prefixLength: 24
        dnsServers: [\"192.168.1.53\", \"2001:DB8::53\"]
        vlanId: 100
        mtu: 1500
",
        ),
        pool(
            "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: plain}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 4}
",
        ),
        // A network that does not validate (the webhook would refuse it): nothing of it is
        // shown rather than half of it.
        pool(
            "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: broken}
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.1.0.0/24
      allocationRange: 4
      network: {gateway: 10.9.9.9, vlanId: 7}
",
        ),
    ]
}

fn data() -> TemplateData {
    let allocations = [
        allocation("metallb", "dc-1", "192.168.1.0-192.168.1.7"),
        allocation("plain", "dc-1", "10.0.0.0-10.0.0.3"),
        allocation("broken", "dc-1", "10.1.0.0-10.1.0.3"),
    ];
    let mut data = template_data("alpha", "dc-1", &allocations, Default::default());
    add_networks(&mut data, &pools());
    data
}

#[test]
fn template_data_with_and_without_a_network() {
    let json = serde_json::to_value(data()).expect("serialises");
    let none = json!({
        "Gateway": null, "PrefixLength": null, "VLAN": null, "DNS": [], "MTU": null,
        "MetalLBPool": null, "MetalLBNamespace": null, "MetalLBKept": []
    });
    let allocations = &json["Cluster"]["Network"]["IPAMAllocations"];
    assert_eq!(
        allocations["metallb"],
        json!({
            "Type": "range", "CIDR": "", "Addresses": ["192.168.1.0-192.168.1.7"], "DC": "dc-1",
            "Gateway": "192.168.1.1", "PrefixLength": 24, "VLAN": 100,
            "DNS": ["192.168.1.53", "2001:db8::53"], "MTU": 1500,
            "MetalLBPool": null, "MetalLBNamespace": null, "MetalLBKept": []
        })
    );
    for name in ["plain", "broken"] {
        let mut want = json!({
            "Type": "range", "CIDR": "", "DC": "dc-1",
        });
        want["Addresses"] = allocations[name]["Addresses"].clone();
        for (k, v) in none.as_object().unwrap() {
            want[k] = v.clone();
        }
        assert_eq!(allocations[name], want, "{name}");
    }
    // Written down and read back, the data is the same (fixtures can hold it).
    let back: TemplateData = serde_json::from_value(json).expect("reads back");
    assert_eq!(back, data());
}

/// An addon author tests each value under strict undefined; a pool without a network renders
/// the `else` branches instead of failing.
#[test]
fn templates_test_each_value_under_strict_undefined() {
    let renderer = Renderer::from_memory(
        &[(
            "machines/cm.yaml",
            "apiVersion: v1
kind: ConfigMap
metadata:
  name: machines
data:
{% for name, a in Cluster.Network.IPAMAllocations | items %}
  {{ name }}: \"{% if a.Gateway %}gw={{ a.Gateway }}/{{ a.PrefixLength }}{% else %}no gateway{% endif %}{% if a.VLAN is not none %} vlan={{ a.VLAN }}{% endif %}{% if a.MTU %} mtu={{ a.MTU }}{% endif %}{% for d in a.DNS %} dns={{ d }}{% endfor %}\"
{% endfor %}
",
        )],
        &[],
    )
    .expect("loads");
    let rendered = renderer.render("machines", &data()).expect("renders");
    assert_eq!(
        rendered.objects[0]["data"],
        json!({
            "metallb": "gw=192.168.1.1/24 vlan=100 mtu=1500 dns=192.168.1.53 dns=2001:db8::53",
            "plain": "no gateway",
            "broken": "no gateway",
        })
    );
}

/// The MetalLB addon reads none of it: its output is the same with and without networks (its
/// snapshots, in `metallb.rs`, are unchanged).
#[test]
fn metallb_renders_the_same_with_a_network() {
    let allocations = [allocation("metallb", "dc-1", "192.168.1.0-192.168.1.7")];
    let bare = template_data("alpha", "dc-1", &allocations, Default::default());
    let mut with = bare.clone();
    add_networks(&mut with, &pools());
    assert_ne!(bare, with);
    assert_eq!(metallb(&with).to_yaml(), metallb(&bare).to_yaml());
    let built = TemplateData::new(
        cluster("alpha", "dc-1")
            .with_allocation("metallb", range("dc-1", &["192.168.1.0-192.168.1.7"])),
    );
    assert_eq!(metallb(&built).to_yaml(), metallb(&with).to_yaml());
}
