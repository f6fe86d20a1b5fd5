//! The shipped `metallb` addon: snapshots of its rendered manifests, and the behaviour around
//! them (which pools appear when, variables, labels, determinism).

use insta::assert_snapshot;
use kipam::render::{ADDON_LABEL, TemplateData};
use serde_json::{Value, json};

use super::{cluster, metallb, prefix, range};

/// Kind and name of every rendered object, in order.
fn names(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

fn addresses<'a>(objects: &'a [Value], name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["metadata"]["name"] == name)
        .map(|o| &o["spec"]["addresses"])
}

#[test]
fn range_single_stack() {
    // KKP's documented range example: the first 8 addresses of 192.168.1.0/26.
    let data = TemplateData::new(cluster("sd87xtqpnm", "azure-westeurope").with_allocation(
        "metallb",
        range("azure-westeurope", &["192.168.1.0-192.168.1.7"]),
    ));
    assert_snapshot!("range_single_stack", metallb(&data).to_yaml());
}

#[test]
fn prefix_single_stack() {
    // KKP's documented prefix example: the first /30 of 192.168.1.0/26.
    let data = TemplateData::new(
        cluster("kd8jnt7gjj", "aws-eu-central-1a")
            .with_allocation("metallb", prefix("aws-eu-central-1a", "192.168.1.0/30")),
    );
    assert_snapshot!("prefix_single_stack", metallb(&data).to_yaml());
}

#[test]
fn ipv6_single_stack() {
    let data = TemplateData::new(cluster("v6only", "dc-v6").with_allocation(
        "metallb",
        range("dc-v6", &["2001:db8:0:1::-2001:db8:0:1::f"]),
    ));
    assert_snapshot!("ipv6_single_stack", metallb(&data).to_yaml());
}

#[test]
fn dual_stack() {
    // The IPv4 entries come first, whatever the allocation types; pools the addon does not
    // know are ignored.
    let data = TemplateData::new(
        cluster("dualstack", "dc-1")
            .with_allocation("metallb-ipv6", prefix("dc-1", "2001:db8:1::/120"))
            .with_allocation("metallb-ipv4", range("dc-1", &["10.10.0.8-10.10.0.15"]))
            .with_allocation("ingress", prefix("dc-1", "10.20.0.0/28")),
    );
    let rendered = metallb(&data);
    assert_eq!(
        addresses(&rendered.objects, "kipam-managed-pool-dualstack"),
        Some(&json!(["10.10.0.8-10.10.0.15", "2001:db8:1::/120"]))
    );
    assert_snapshot!("dual_stack", rendered.to_yaml());
}

#[test]
fn single_and_dual_stack_pools_coexist() {
    let data = TemplateData::new(
        cluster("both", "dc-1")
            .with_allocation("metallb", prefix("dc-1", "192.168.1.4/30"))
            .with_allocation("metallb-ipv4", prefix("dc-1", "10.10.0.0/29"))
            .with_allocation("metallb-ipv6", prefix("dc-1", "2001:db8:1::/124")),
    );
    assert_snapshot!("single_and_dual_stack", metallb(&data).to_yaml());
}

#[test]
fn disjoint_range_pieces() {
    // After a pool's allocationRange grew, a cluster's range may come in several pieces;
    // each becomes one MetalLB address entry, in order.
    let data = TemplateData::new(cluster("grown", "azure-westeurope").with_allocation(
        "metallb",
        range(
            "azure-westeurope",
            &["192.168.1.0-192.168.1.7", "192.168.1.16-192.168.1.23"],
        ),
    ));
    assert_snapshot!("disjoint_range_pieces", metallb(&data).to_yaml());
}

#[test]
fn disabled_auto_allocation() {
    let data = TemplateData::new(
        cluster("manual", "dc-1")
            .with_allocation("metallb", range("dc-1", &["192.168.1.0-192.168.1.7"]))
            .with_allocation("metallb-ipv4", prefix("dc-1", "10.10.0.0/29"))
            .with_allocation("metallb-ipv6", prefix("dc-1", "2001:db8:1::/124")),
    )
    .with_variable("disableAutoIPAMAllocation", json!(true));
    let rendered = metallb(&data);
    assert_eq!(
        names(&rendered.objects),
        ["L2Advertisement/kipam-advertise-all"]
    );
    assert_snapshot!("disabled_auto_allocation", rendered.to_yaml());
}

#[test]
fn disable_flag_may_be_quoted_and_false_keeps_the_pools() {
    let base = TemplateData::new(
        cluster("flags", "dc-1")
            .with_allocation("metallb", range("dc-1", &["192.168.1.0-192.168.1.7"])),
    );
    for (value, pools) in [
        (json!("true"), 0),
        (json!("True"), 0),
        (json!(false), 1),
        (json!("false"), 1),
        (Value::Null, 1),
    ] {
        let rendered = metallb(
            &base
                .clone()
                .with_variable("disableAutoIPAMAllocation", value.clone()),
        );
        let count = rendered
            .objects
            .iter()
            .filter(|o| o["kind"] == "IPAddressPool")
            .count();
        assert_eq!(count, pools, "disableAutoIPAMAllocation: {value}");
    }
    // A value that is neither true nor false is refused rather than guessed at.
    let err = match super::shipped().render(
        "metallb",
        &base.with_variable("disableAutoIPAMAllocation", json!("no")),
    ) {
        Ok(_) => panic!("\"no\" was accepted"),
        Err(err) => err.to_string(),
    };
    assert_eq!(
        err,
        "addon metallb: addons/metallb/10_ip-address-pools.yaml:18: as_bool: expects true or false, got \"no\""
    );
}

const USER_POOL: &str = "\
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: reserved-for-dns
  namespace: metallb-system
spec:
  addresses:
  - 172.30.0.53/32
  autoAssign: false
  serviceAllocation:
    priority: 10
    namespaces: [kube-system]
";

#[test]
fn user_supplied_extra_pool() {
    let data = TemplateData::new(cluster("extra", "azure-westeurope").with_allocation(
        "metallb",
        range("azure-westeurope", &["192.168.1.8-192.168.1.15"]),
    ))
    .with_variable("addressPoolYaml", json!(USER_POOL));
    let rendered = metallb(&data);
    assert_eq!(
        names(&rendered.objects),
        [
            "IPAddressPool/kipam-managed-pool",
            "IPAddressPool/reserved-for-dns",
            "L2Advertisement/kipam-advertise-all"
        ]
    );
    assert_snapshot!("user_supplied_extra_pool", rendered.to_yaml());
}

#[test]
fn user_pool_may_be_given_as_a_mapping() {
    let as_text = TemplateData::new(cluster("extra", "dc-1"))
        .with_variable("addressPoolYaml", json!(USER_POOL));
    let mapping: Value = match serde_saphyr::from_str(USER_POOL) {
        Ok(value) => value,
        Err(err) => panic!("{err}"),
    };
    let as_mapping =
        TemplateData::new(cluster("extra", "dc-1")).with_variable("addressPoolYaml", mapping);
    assert_eq!(metallb(&as_text), metallb(&as_mapping));
}

#[test]
fn dual_stack_needs_both_halves() {
    for pool in ["metallb-ipv4", "metallb-ipv6"] {
        let cidr = if pool.ends_with("v4") {
            "10.0.0.0/30"
        } else {
            "2001:db8::/126"
        };
        let data =
            TemplateData::new(cluster("half", "dc-1").with_allocation(pool, prefix("dc-1", cidr)));
        assert_eq!(
            names(&metallb(&data).objects),
            ["L2Advertisement/kipam-advertise-all"],
            "only {pool}"
        );
    }
}

#[test]
fn no_allocation_renders_only_the_advertisement() {
    let rendered = metallb(&TemplateData::new(cluster("bare", "dc-1")));
    assert_eq!(
        names(&rendered.objects),
        ["L2Advertisement/kipam-advertise-all"]
    );
}

#[test]
fn every_object_carries_the_addon_label() {
    let data = TemplateData::new(
        cluster("labels", "dc-1")
            .with_allocation("metallb", prefix("dc-1", "192.168.1.0/30"))
            .with_allocation("metallb-ipv4", prefix("dc-1", "10.0.0.0/30"))
            .with_allocation("metallb-ipv6", prefix("dc-1", "2001:db8::/126")),
    )
    .with_variable("addressPoolYaml", json!(USER_POOL));
    let rendered = metallb(&data);
    assert_eq!(rendered.addon, "metallb");
    assert_eq!(rendered.objects.len(), 4);
    for object in &rendered.objects {
        assert_eq!(
            object["metadata"]["labels"][ADDON_LABEL], "metallb",
            "{object}"
        );
    }
}

#[test]
fn output_is_deterministic() {
    let build = || {
        TemplateData::new(
            cluster("same", "dc-1")
                .with_allocation("metallb-ipv6", prefix("dc-1", "2001:db8::/126"))
                .with_allocation("metallb", range("dc-1", &["10.0.0.0-10.0.0.3"]))
                .with_allocation("metallb-ipv4", prefix("dc-1", "10.0.1.0/30")),
        )
        .with_variable("addressPoolYaml", json!(USER_POOL))
    };
    let first = metallb(&build()).to_yaml();
    for _ in 0..5 {
        assert_eq!(metallb(&build()).to_yaml(), first);
    }
}

#[test]
fn written_yaml_reads_back_as_the_same_objects() {
    let data = TemplateData::new(cluster("roundtrip", "dc-1").with_allocation(
        "metallb",
        range("dc-1", &["10.0.0.0-10.0.0.3", "10.0.0.8-10.0.0.9"]),
    ))
    .with_variable("addressPoolYaml", json!(USER_POOL));
    let rendered = metallb(&data);
    let back: Vec<Value> = match serde_saphyr::from_multiple(&rendered.to_yaml()) {
        Ok(back) => back,
        Err(err) => panic!("{err}"),
    };
    assert_eq!(back, rendered.objects);
}

/// An allocation made by adoption renders its pool under the hand-made pool's own name and
/// namespace (so MetalLB sees one pool change in place: no Service loses its address, no two
/// pools overlap), with the pieces outside every kipam pool kept in it.
#[test]
fn an_adopted_allocation_takes_the_hand_made_pool_over_in_place() {
    let adopted = range("dc-1", &["10.0.0.11-10.0.0.12", "10.0.0.20-10.0.0.20"]).taking_over(
        "metallb",
        "legacy",
        vec!["192.168.9.0-192.168.9.3".into()],
    );
    let data = TemplateData::new(cluster("brown", "dc-1").with_allocation("metallb", adopted));
    let objects = metallb(&data).objects;
    assert_eq!(
        names(&objects),
        [
            "IPAddressPool/legacy",
            "L2Advertisement/kipam-advertise-all"
        ]
    );
    let pool = &objects[0];
    assert_eq!(pool["metadata"]["namespace"], "metallb");
    assert_eq!(
        pool["spec"]["addresses"],
        json!([
            "10.0.0.11-10.0.0.12",
            "10.0.0.20-10.0.0.20",
            "192.168.9.0-192.168.9.3"
        ])
    );
    assert!(pool["metadata"]["labels"][ADDON_LABEL].is_string());
}
