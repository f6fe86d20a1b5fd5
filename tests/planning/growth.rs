//! `growth` on a pool datacenter and a cluster's override: the rules `kipam validate`, the
//! webhook and the planner's inputs share.

use kipam::validation::{cluster_growth, cluster_input, pool_input};

use super::{cluster, pool};

fn pool_messages(dc: &str) -> Vec<String> {
    let yaml = format!(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: metallb\nspec:\n  datacenters:\n    dc-1:\n{}",
        dc.lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>()
    );
    match pool_input(&pool(&yaml)) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn a_range_pool_may_grow() {
    let ok = pool_messages(
        "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {increment: 2, max: 32, shrinkAfter: 10m}",
    );
    assert_eq!(ok, Vec::<String>::new());
    let defaults = pool_messages(
        "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 4}",
    );
    assert_eq!(defaults, Vec::<String>::new());
}

#[test]
fn each_growth_rule_names_the_field_and_the_value() {
    let cases = [
        (
            "type: prefix\npoolCidr: 192.168.1.0/26\nallocationPrefix: 30\ngrowth: {max: 4}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth: is only for type range: a prefix allocation is one subnet and cannot grow by pieces",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\ngrowth: {max: 4}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth.max \"4\": must be at least allocationRange (8)",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 100}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth.max \"100\": exceeds the 64 addresses of poolCidr",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 8, increment: 0}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth.increment \"0\": must be at least 1",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 8, increment: 9}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth.increment \"9\": must be at most max (8)",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 8, shrinkAfter: 30s}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth.shrinkAfter \"30s\": must be between 1m and 30d",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 8, shrinkAfter: 31d}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth.shrinkAfter \"31d\": must be between 1m and 30d",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 8, shrinkAfter: 30m1h}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth.shrinkAfter \"30m1h\": must give each unit once, largest first (1h30m, not 30m1h)",
        ),
    ];
    for (dc, want) in cases {
        let got = pool_messages(dc);
        assert!(got.iter().any(|m| m == want), "{dc}:\n{got:#?}");
    }
    // The CRD's pattern, enforced offline too.
    let got = pool_messages(
        "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 8, shrinkAfter: ten minutes}",
    );
    assert!(
        got.iter().any(|m| m.contains("growth.shrinkAfter")),
        "{got:#?}"
    );
}

#[test]
fn a_cluster_overrides_max_or_turns_growth_off() {
    let c = cluster(
        "apiVersion: ipam.kipam.dev/v1alpha1
kind: Cluster
metadata:
  name: c1
spec:
  datacenter: dc-1
  ipam:
    metallb:
      allocationRange: 4
      growth: {max: 64}
    other:
      growth: {enabled: false}
",
    );
    assert!(cluster_input(&c).is_ok());
    let g = cluster_growth(&c);
    assert_eq!(g["metallb"].max, Some(64));
    assert!(!g["metallb"].disabled);
    assert!(g["other"].disabled);

    let bad = cluster(
        "apiVersion: ipam.kipam.dev/v1alpha1
kind: Cluster
metadata:
  name: c1
spec:
  datacenter: dc-1
  ipam:
    metallb:
      addresses: [\"10.0.0.1\"]
      growth: {max: 64}
    other:
      growth: {max: 0}
",
    );
    let got: Vec<String> = cluster_input(&bad)
        .unwrap_err()
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert!(got.contains(&"Cluster c1: spec.ipam[metallb].growth \"addresses\": cannot go with addresses, cidr, optOut or allocationPrefix: only a range allocation kipam sizes can grow".to_string()), "{got:#?}");
    assert!(
        got.iter()
            .any(|m| m.starts_with("Cluster c1: spec.ipam[other].growth.max \"0\"")),
        "{got:#?}"
    );
}
