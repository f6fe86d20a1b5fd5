use kipam::allocator::Allocation;
use kipam::planner::StoredAllocation;
use kipam::validation::{cluster_input, pool_input, validate_pool};

use super::{cluster, pool};

fn messages(yaml: &str) -> Vec<String> {
    match pool_input(&pool(yaml)) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

fn one_dc(settings: &str) -> String {
    format!(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: metallb\nspec:\n  datacenters:\n    dc-1:\n{}",
        settings
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>()
    )
}

#[test]
fn kkp_example_pools_are_valid() {
    let yaml = "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    azure-westeurope:
      type: range
      poolCidr: 192.168.1.0/26
      allocationRange: 8
      excludeRanges: [\"192.168.1.1\", \"192.168.1.5-192.168.1.7\"]
    aws-eu-central-1a:
      type: prefix
      poolCidr: 192.168.1.0/26
      allocationPrefix: 30
      excludePrefixes: [\"192.168.1.0/30\", \"192.168.1.8/30\"]
";
    assert_eq!(messages(yaml), Vec::<String>::new());
}

#[test]
fn no_pool_size_cap() {
    // KKP refuses range pools larger than a /20 (IPv4) or /116 (IPv6); kipam does not.
    assert!(
        messages(&one_dc(
            "type: range\npoolCidr: 10.0.0.0/8\nallocationRange: 8"
        ))
        .is_empty()
    );
    assert!(
        messages(&one_dc(
            "type: range\npoolCidr: 2001:db8::/64\nallocationRange: 8"
        ))
        .is_empty()
    );
    assert!(messages(&one_dc("type: range\npoolCidr: ::/0\nallocationRange: 8")).is_empty());
}

#[test]
fn empty_datacenters_are_refused() {
    let yaml = "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: metallb\nspec:\n  datacenters: {}\n";
    assert_eq!(
        messages(yaml),
        vec!["IPAMPool metallb: spec.datacenters: must list at least one datacenter"]
    );
}

#[test]
fn each_datacenter_rule_has_a_clear_message() {
    let cases: &[(&str, &str)] = &[
        (
            "type: range\npoolCidr: 192.168.1.0/33\nallocationRange: 8",
            "IPAMPool metallb: spec.datacenters[dc-1].poolCidr \"192.168.1.0/33\": is not a valid CIDR: prefix length must be 0 to 32 for IPv4",
        ),
        (
            "type: range\npoolCidr: 192.168.1.5/26\nallocationRange: 8",
            "IPAMPool metallb: spec.datacenters[dc-1].poolCidr \"192.168.1.5/26\": is not a valid CIDR: host bits are set; the network is 192.168.1.0/26",
        ),
        (
            "type: range\npoolCidr: \"\"\nallocationRange: 8",
            "IPAMPool metallb: spec.datacenters[dc-1].poolCidr: is required",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26",
            "IPAMPool metallb: spec.datacenters[dc-1].allocationRange: is required for type range",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 0",
            "IPAMPool metallb: spec.datacenters[dc-1].allocationRange \"0\": must be at least 1",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 65",
            "IPAMPool metallb: spec.datacenters[dc-1].allocationRange \"65\": exceeds the 64 addresses of poolCidr",
        ),
        (
            "type: prefix\npoolCidr: 192.168.1.0/26",
            "IPAMPool metallb: spec.datacenters[dc-1].allocationPrefix: is required for type prefix",
        ),
        (
            "type: prefix\npoolCidr: 192.168.1.0/26\nallocationPrefix: 25",
            "IPAMPool metallb: spec.datacenters[dc-1].allocationPrefix \"25\": must be between the pool's prefix length 26 and 32 (IPv4)",
        ),
        (
            "type: prefix\npoolCidr: 2001:db8::/48\nallocationPrefix: 129",
            "IPAMPool metallb: spec.datacenters[dc-1].allocationPrefix \"129\": must be between the pool's prefix length 48 and 128 (IPv6)",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nexcludeRanges: [\"192.168.1.7-192.168.1.5\"]",
            "IPAMPool metallb: spec.datacenters[dc-1].excludeRanges[0] \"192.168.1.7-192.168.1.5\": is not valid: \"192.168.1.7-192.168.1.5\" is not a range: the first address is after the last",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nexcludeRanges: [\"192.168.1.300\"]",
            "IPAMPool metallb: spec.datacenters[dc-1].excludeRanges[0] \"192.168.1.300\": is not valid: \"192.168.1.300\" is not an IP address",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nexcludeRanges: [\"2001:db8::1\"]",
            "IPAMPool metallb: spec.datacenters[dc-1].excludeRanges[0] \"2001:db8::1\": is IPv6, the pool is IPv4",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nexcludeRanges: [\"192.168.1.60-192.168.1.70\"]",
            "IPAMPool metallb: spec.datacenters[dc-1].excludeRanges[0] \"192.168.1.60-192.168.1.70\": is not inside poolCidr 192.168.1.0/26",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nadditionalCidrs: [192.168.1.32/27]",
            "IPAMPool metallb: spec.datacenters[dc-1].additionalCidrs[0] \"192.168.1.32/27\": overlaps poolCidr 192.168.1.0/26",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nadditionalCidrs: [10.0.0.0/24, 10.0.0.128/25]",
            "IPAMPool metallb: spec.datacenters[dc-1].additionalCidrs[1] \"10.0.0.128/25\": overlaps additionalCidrs[0] 10.0.0.0/24",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nadditionalCidrs: [\"2001:db8::/64\"]",
            "IPAMPool metallb: spec.datacenters[dc-1].additionalCidrs[0] \"2001:db8::/64\": is IPv6, poolCidr is IPv4",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nadditionalCidrs: [10.0.0.1/24]",
            "IPAMPool metallb: spec.datacenters[dc-1].additionalCidrs[0] \"10.0.0.1/24\": is not a valid CIDR: host bits are set; the network is 10.0.0.0/24",
        ),
        (
            "type: prefix\npoolCidr: 192.168.1.0/26\nallocationPrefix: 28\nadditionalCidrs: [10.0.0.0/29]",
            "IPAMPool metallb: spec.datacenters[dc-1].additionalCidrs[0] \"10.0.0.0/29\": is smaller than one /28 subnet (allocationPrefix)",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 81\nadditionalCidrs: [10.0.0.0/28]",
            "IPAMPool metallb: spec.datacenters[dc-1].allocationRange \"81\": exceeds the 80 addresses of poolCidr and additionalCidrs",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nadditionalCidrs: [10.0.0.0/28]\nexcludeRanges: [10.0.0.1, 10.0.0.14-10.0.0.17]",
            "IPAMPool metallb: spec.datacenters[dc-1].excludeRanges[1] \"10.0.0.14-10.0.0.17\": is not inside poolCidr 192.168.1.0/26 or one of additionalCidrs",
        ),
        (
            "type: prefix\npoolCidr: 192.168.1.0/26\nallocationPrefix: 30\nexcludePrefixes: [\"192.168.1.2/30\"]",
            "IPAMPool metallb: spec.datacenters[dc-1].excludePrefixes[0] \"192.168.1.2/30\": is not valid: \"192.168.1.2/30\" has host bits set: the network is 192.168.1.0/30",
        ),
        (
            "type: prefix\npoolCidr: 192.168.1.0/26\nallocationPrefix: 30\nexcludePrefixes: [\"192.168.2.0/30\"]",
            "IPAMPool metallb: spec.datacenters[dc-1].excludePrefixes[0] \"192.168.2.0/30\": is not inside poolCidr 192.168.1.0/26",
        ),
        (
            "type: prefix\npoolCidr: 192.168.1.0/26\nallocationPrefix: 30\nexcludeRanges: [\"192.168.1.1\"]",
            "IPAMPool metallb: spec.datacenters[dc-1].excludeRanges[0] \"192.168.1.1\": is only for type range; prefix pools use excludePrefixes",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nallocationPrefix: 30",
            "IPAMPool metallb: spec.datacenters[dc-1].allocationPrefix \"30\": is only for type prefix",
        ),
    ];
    for (settings, expected) in cases {
        assert_eq!(
            messages(&one_dc(settings)),
            vec![expected.to_string()],
            "for {settings}"
        );
    }
}

#[test]
fn update_rules_keep_cidr_type_and_prefix() {
    let old = pool(&one_dc(
        "type: prefix\npoolCidr: 10.0.0.0/24\nallocationPrefix: 28",
    ));
    let changes = [
        (
            "type: prefix\npoolCidr: 10.0.1.0/24\nallocationPrefix: 28",
            "IPAMPool metallb: spec.datacenters[dc-1].poolCidr \"10.0.1.0/24\": may only be widened to a network that contains the old one (was 10.0.0.0/24)",
        ),
        (
            "type: prefix\npoolCidr: 10.0.0.0/24\nallocationPrefix: 29",
            "IPAMPool metallb: spec.datacenters[dc-1].allocationPrefix \"29\": is immutable (was 28)",
        ),
        (
            "type: range\npoolCidr: 10.0.0.0/24\nallocationRange: 16",
            "IPAMPool metallb: spec.datacenters[dc-1].type \"range\": is immutable (was prefix)",
        ),
    ];
    for (settings, expected) in changes {
        let new = pool(&one_dc(settings));
        let errors = validate_pool(&new, Some(&old), &[]).unwrap_err();
        let got: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(got, vec![expected.to_string()], "for {settings}");
    }
    // Adding an exclusion that hits nothing, or a datacenter, is fine.
    let new = pool(&format!(
        "{}    dc-2:\n      type: range\n      poolCidr: 10.1.0.0/24\n      allocationRange: 4\n",
        one_dc(
            "type: prefix\npoolCidr: 10.0.0.0/24\nallocationPrefix: 28\nexcludePrefixes: [\"10.0.0.240/28\"]"
        )
    ));
    assert!(validate_pool(&new, Some(&old), &[]).is_ok());
}

#[test]
fn added_exclusions_must_not_hit_allocations() {
    let held = |text: &str| StoredAllocation {
        cluster: "alpha".into(),
        pool: "metallb".into(),
        datacenter: "dc-1".into(),
        held: Some(Allocation::Range(vec![text.parse().unwrap()])),
        reclaim_policy: None,
        unreadable: None,
    };
    let stored = vec![held("10.0.0.8-10.0.0.15")];
    let old = pool(&one_dc(
        "type: range\npoolCidr: 10.0.0.0/24\nallocationRange: 8\nexcludeRanges: [\"10.0.0.10\"]",
    ));
    let new = pool(&one_dc(
        "type: range\npoolCidr: 10.0.0.0/24\nallocationRange: 8\nexcludeRanges: [\"10.0.0.10\", \"10.0.0.12-10.0.0.20\"]",
    ));
    let errors = validate_pool(&new, Some(&old), &stored).unwrap_err();
    assert_eq!(
        errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        vec![
            "IPAMPool metallb: spec.datacenters[dc-1].excludeRanges[1] \"10.0.0.12-10.0.0.20\": hits the allocation of cluster alpha (10.0.0.8-10.0.0.15)"
        ]
    );
    // The exclusion that was already there (even rewritten as a CIDR) is not "added".
    let same = pool(&one_dc(
        "type: range\npoolCidr: 10.0.0.0/24\nallocationRange: 8\nexcludeRanges: [\"10.0.0.10/32\"]",
    ));
    assert!(validate_pool(&same, Some(&old), &stored).is_ok());
}

#[test]
fn prefix_exclusions_are_compared_as_address_sets() {
    let stored = vec![StoredAllocation {
        cluster: "alpha".into(),
        pool: "metallb".into(),
        datacenter: "dc-1".into(),
        held: Some(Allocation::Prefix("10.0.0.16/28".parse().unwrap())),
        reclaim_policy: None,
        unreadable: None,
    }];
    let old = pool(&one_dc(
        "type: prefix\npoolCidr: 10.0.0.0/24\nallocationPrefix: 28\nexcludePrefixes: [\"10.0.0.0/28\"]",
    ));
    // 10.0.0.0/27 = the old 10.0.0.0/28 plus 10.0.0.16/28, which alpha holds.
    let new = pool(&one_dc(
        "type: prefix\npoolCidr: 10.0.0.0/24\nallocationPrefix: 28\nexcludePrefixes: [\"10.0.0.0/27\"]",
    ));
    let errors = validate_pool(&new, Some(&old), &stored).unwrap_err();
    assert!(
        errors[0]
            .to_string()
            .contains("hits the allocation of cluster alpha (10.0.0.16/28)")
    );
    // Two /29s equal to the old /28 add nothing.
    let split = pool(&one_dc(
        "type: prefix\npoolCidr: 10.0.0.0/24\nallocationPrefix: 28\nexcludePrefixes: [\"10.0.0.0/29\", \"10.0.0.8/29\"]",
    ));
    assert!(validate_pool(&split, Some(&old), &stored).is_ok());
}

#[test]
fn cluster_rules() {
    let bad = cluster(
        "apiVersion: ipam.kipam.dev/v1alpha1
kind: Cluster
metadata:
  name: Bad_Name
spec:
  datacenter: \"\"
  ipam:
    metallb:
      allocationRange: 0
    other:
      optOut: true
      cidr: 10.0.0.0/24
    third:
      addresses: [\"10.0.0.9-10.0.0.1\"]
",
    );
    let got: Vec<String> = cluster_input(&bad)
        .unwrap_err()
        .iter()
        .map(|e| e.to_string())
        .collect();
    assert_eq!(
        got,
        vec![
            "Cluster Bad_Name: metadata.name \"Bad_Name\": must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit (kipam keeps the cluster's objects in namespace cluster-<name>)",
            "Cluster Bad_Name: spec.datacenter: is required",
            "Cluster Bad_Name: spec.ipam[metallb].allocationRange \"0\": must be at least 1",
            "Cluster Bad_Name: spec.ipam[other] \"cidr, optOut\": set at most one of allocationRange, allocationPrefix, addresses, cidr, optOut",
            "Cluster Bad_Name: spec.ipam[third].addresses[0] \"10.0.0.9-10.0.0.1\": is not valid: \"10.0.0.9-10.0.0.1\" is not a range: the first address is after the last",
        ]
    );
}

/// Names kipam turns into object names, namespaces and label values are refused with the
/// field and the rule when they could not be used there.
#[test]
fn names_must_fit_where_kipam_puts_them() {
    let pool_with = |name: &str, dc: &str| {
        format!(
            "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: {name}\nspec:\n  datacenters:\n    \"{dc}\":\n      type: range\n      poolCidr: 10.0.0.0/24\n      allocationRange: 4\n"
        )
    };
    assert!(messages(&pool_with("metallb", &"d".repeat(63))).is_empty());
    let got = messages(&pool_with("metallb", "eu west"));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].starts_with(
            "IPAMPool metallb: spec.datacenters \"eu west\": must be a DNS-1123 label"
        ),
        "{got:?}"
    );
    let got = messages(&pool_with("metallb", &"d".repeat(64)));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].contains("spec.datacenters")
            && got[0].contains("must be at most 63 characters, is 64"),
        "{got:?}"
    );
    // A pool name is an IPAMAllocation name and a label value: a subdomain with dots is not.
    let got = messages(&pool_with("metallb.v4", "dc-1"));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].contains("metadata.name \"metallb.v4\": must be a DNS-1123 label"),
        "{got:?}"
    );
    assert_eq!(messages(&pool_with(&"p".repeat(64), "dc-1")).len(), 1);

    let cluster_with = |name: &str, dc: &str, pool: &str| {
        cluster(&format!(
            "apiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  datacenter: \"{dc}\"\n  ipam:\n    \"{pool}\":\n      allocationRange: 2\n"
        ))
    };
    let errs = |c| match cluster_input(&c) {
        Ok(_) => Vec::new(),
        Err(e) => e.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
    };
    assert!(errs(cluster_with(&"c".repeat(55), "dc-1", "metallb")).is_empty());
    let got = errs(cluster_with(&"c".repeat(56), "dc-1", "metallb"));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].contains("metadata.name") && got[0].contains("at most 55 characters, is 56"),
        "{got:?}"
    );
    let got = errs(cluster_with("c1", "eu west", "metallb"));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].contains("spec.datacenter \"eu west\": must be a DNS-1123 label"),
        "{got:?}"
    );
    let got = errs(cluster_with("c1", &"d".repeat(64), "metallb"));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].contains("spec.datacenter") && got[0].contains("at most 63"),
        "{got:?}"
    );
    let got = errs(cluster_with("c1", "dc-1", "Metal LB"));
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(
        got[0].contains("spec.ipam \"Metal LB\": must be a DNS-1123 label"),
        "{got:?}"
    );
}

/// `kipam validate` (and the controller, and offline mode) enforce the CRD schema's bounds,
/// with the field paths a real server reports.
#[test]
fn schema_bounds_are_enforced_with_server_paths() {
    // 44 characters (an IPv4-mapped IPv6 network written out in full), a CIDR the address
    // parser accepts and of the right shape: only the bound refuses it.
    let long = "0000:0000:0000:0000:0000:0000:100.10.0.0/112".to_string();
    assert_eq!(long.len(), 44);
    let got = messages(&one_dc(&format!(
        "type: prefix\npoolCidr: \"{long}\"\nallocationPrefix: 120"
    )));
    assert_eq!(
        got,
        vec![format!(
            "IPAMPool metallb: spec.datacenters[dc-1].poolCidr \"{long}\": must be at most 43 characters, is 44"
        )]
    );
    let many: Vec<String> = (0..1025)
        .map(|i| format!("\"10.0.{}.{}\"", i / 256, i % 256))
        .collect();
    let got = messages(&one_dc(&format!(
        "type: range\npoolCidr: 10.0.0.0/16\nallocationRange: 4\nexcludeRanges: [{}]",
        many.join(", ")
    )));
    assert_eq!(
        got,
        vec![
            "IPAMPool metallb: spec.datacenters[dc-1].excludeRanges: must have at most 1024 items, has 1025"
        ]
    );
    let got = messages(&one_dc(
        "type: range\npoolCidr: 2001:db8::/32\nallocationRange: 9007199254740993",
    ));
    assert_eq!(
        got,
        vec![
            "IPAMPool metallb: spec.datacenters[dc-1].allocationRange \"9007199254740993\": must be at most 9007199254740992"
        ]
    );
}

#[test]
fn allocation_prefix_is_inferred_from_the_state_only_when_unambiguous() {
    use kipam::address::Cidr;
    use kipam::validation::validate_pool_with_clusters;
    let pool = pool(&one_dc(
        "type: prefix\npoolCidr: 2001:db8::/48\nallocationPrefix: 56",
    ));
    let held = |cluster: &str, cidr: &str| StoredAllocation {
        cluster: cluster.into(),
        pool: "metallb".into(),
        datacenter: "dc-1".into(),
        held: Some(Allocation::Prefix(cidr.parse::<Cidr>().unwrap())),
        reclaim_policy: None,
        unreadable: None,
    };
    let a = super::cluster_in("a", "dc-1", 1);
    let b = super::cluster_in("b", "dc-1", 2);
    let messages = |stored: &[StoredAllocation], clusters: Option<&[_]>| -> Vec<String> {
        match validate_pool_with_clusters(&pool, None, stored, clusters) {
            Ok(_) => Vec::new(),
            Err(e) => e.iter().map(|e| e.to_string()).collect(),
        }
    };
    let both_64 = [held("a", "2001:db8::/64"), held("b", "2001:db8:0:1::/64")];
    let clusters = [a.clone(), b.clone()];
    // Every plain allocation says /64: the pool's allocationPrefix changed.
    assert_eq!(
        messages(&both_64, Some(&clusters)),
        [
            "IPAMPool metallb: spec.datacenters[dc-1].allocationPrefix \"56\": is immutable (was 64); allocations affected: a (2001:db8::/64), b (2001:db8:0:1::/64)"
        ]
    );
    // Without the clusters, no inference (an override could explain the length).
    assert!(messages(&both_64, None).is_empty());
    // Mixed lengths: no single old value, nothing inferred.
    let mixed = [held("a", "2001:db8::/64"), held("b", "2001:db8:0:100::/56")];
    assert!(messages(&mixed, Some(&clusters)).is_empty());
    // b's own override explains its length; a alone still shows the change.
    let mut b_own = b.clone();
    b_own
        .overrides
        .insert("metallb".into(), kipam::planner::PoolOverride::Prefix(64));
    let only_b = [held("b", "2001:db8:0:1::/64")];
    assert!(messages(&only_b, Some(&[a.clone(), b_own])).is_empty());
    // A cluster that is gone says nothing either.
    assert!(messages(&only_b, Some(&[a])).is_empty());
}

#[test]
fn reuse_after_and_address_space_are_checked_with_the_field_and_value() {
    let range = "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nreuseAfter: ";
    for ok in ["0", "30s", "10m", "1h30m", "7d", "1w", "PT10M", "90d"] {
        assert_eq!(
            messages(&one_dc(&format!("{range}\"{ok}\""))),
            Vec::<String>::new(),
            "{ok}"
        );
    }
    let parsed = |text: &str| kipam::validation::parse_reuse_after(text);
    assert_eq!(parsed("10m"), Ok(600));
    assert_eq!(parsed("7d"), Ok(7 * 86_400));
    for (bad, why) in [
        ("91d", "is too large: it must be at most 90d"),
        (
            "soon",
            "is not a duration: write a duration such as 30s, 10m, 1h30m or 7d (it must be at most 90d)",
        ),
        (
            "1 month",
            "is not a duration: write a duration such as 30s, 10m, 1h30m or 7d (it must be at most 90d)",
        ),
        ("-5m", "must not be negative"),
        ("1.5s", "must be whole seconds"),
    ] {
        assert_eq!(
            messages(&one_dc(&format!("{range}\"{bad}\""))),
            vec![format!(
                "IPAMPool metallb: spec.datacenters[dc-1].reuseAfter \"{bad}\": {why}"
            )],
            "{bad}"
        );
    }
    let spaced = |space: &str| {
        format!(
            "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: metallb\nspec:\n  addressSpace: \"{space}\"\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 192.168.1.0/26\n      allocationRange: 8\n"
        )
    };
    assert!(messages(&spaced("vrf-blue")).is_empty());
    let found = messages(&spaced("VRF_1"));
    assert!(
        found
            .iter()
            .any(|m| m.starts_with("IPAMPool metallb: spec.addressSpace \"VRF_1\": ")),
        "{found:?}"
    );
}

/// Every form each duration field read before kipam had one duration reader (commit
/// c6af421: `reuseAfter` through jiff, `shrinkAfter` through its own short form) still
/// reads, to the same seconds: a stored pool never becomes unreadable on upgrade.
#[test]
fn durations_read_before_one_reader_still_read_the_same() {
    let day = 86_400;
    for (text, seconds) in [
        ("0", 0),
        ("0s", 0),
        ("30s", 30),
        ("10m", 600),
        ("1h30m", 5_400),
        ("7d", 7 * day),
        ("90d", 90 * day),
        ("1w", 7 * day),
        ("PT10M", 600),
        ("P1D", day),
        ("PT1H30M", 5_400),
        ("1h 30m", 5_400),
        ("1 hour", 3_600),
        ("2 days", 2 * day),
        ("10 minutes", 600),
        ("1.5h", 5_400),
        ("1000ms", 1),
        ("1d2h3m4s", day + 7_384),
    ] {
        assert_eq!(
            kipam::validation::parse_reuse_after(text),
            Ok(seconds),
            "reuseAfter {text}"
        );
        let range = "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nreuseAfter: ";
        assert_eq!(
            messages(&one_dc(&format!("{range}\"{text}\""))),
            Vec::<String>::new(),
            "reuseAfter {text}"
        );
    }
    for (text, seconds) in [
        ("1m", 60),
        ("60s", 60),
        ("90s", 90),
        ("10m", 600),
        ("1h30m", 5_400),
        ("2d", 2 * day),
        ("30d", 30 * day),
        ("1d2h3m4s", day + 7_384),
        ("0d1m", 60),
        ("010m", 600),
        ("1h0m0s", 3_600),
        ("0h60m", 3_600),
    ] {
        let settings = format!(
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {{max: 8, shrinkAfter: \"{text}\"}}"
        );
        let pool = pool(&one_dc(&settings));
        let dc = &pool.spec.datacenters["dc-1"];
        let policy = kipam::validation::datacenter_growth("dc-1", dc)
            .unwrap_or_else(|e| panic!("shrinkAfter {text}: {e:?}"))
            .unwrap_or_else(|| panic!("shrinkAfter {text}: no growth"));
        assert_eq!(policy.shrink_after, seconds, "shrinkAfter {text}");
        assert_eq!(messages(&one_dc(&settings)), Vec::<String>::new(), "{text}");
    }
}
