//! The `network` of a pool datacenter: every rule and bound, good and bad, with the message a
//! user reads (the same from `kipam validate`, the webhook and the REST API, which all call
//! these functions).

use kipam::allocator::Allocation;
use kipam::planner::StoredAllocation;
use kipam::validation::{datacenter_network, pool_input, validate_pool};

use super::pool;

/// A pool `metallb` with one datacenter `dc-1` of these settings.
fn one_dc(settings: &str) -> String {
    format!(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: metallb\nspec:\n  datacenters:\n    dc-1:\n{}",
        settings
            .lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>()
    )
}

fn messages(settings: &str) -> Vec<String> {
    match pool_input(&pool(&one_dc(settings))) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(|e| e.to_string()).collect(),
    }
}

/// A range pool `192.168.1.0/26` (a slice of `192.168.1.0/24`, gateway `.1` excluded) with
/// the given `network` lines.
fn range_v4(network: &str) -> String {
    format!(
        "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nexcludeRanges: [\"192.168.1.1\"]\nnetwork:\n{}",
        network
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>()
    )
}

const FIELD: &str = "IPAMPool metallb: spec.datacenters[dc-1].network";

#[test]
fn good_networks_are_accepted_and_read_canonically() {
    for good in [
        // The whole /24, with every field.
        "gateway: 192.168.1.1\nprefixLength: 24\ndnsServers: [\"192.168.1.53\", \"2001:db8::53\"]\nvlanId: 42\nmtu: 9000",
        // A gateway outside the pool, inside the wider network.
        "gateway: 192.168.1.254\nprefixLength: 24",
        // The bounds themselves.
        "vlanId: 0\nmtu: 576",
        "vlanId: 4094\nmtu: 9216",
        "prefixLength: 0",
        "prefixLength: 26",
        // Nothing at all.
        "{}",
    ] {
        assert_eq!(messages(&range_v4(good)), Vec::<String>::new(), "{good}");
    }

    let pool = pool(&one_dc(&range_v4(
        "gateway: \" 192.168.1.1 \"\nprefixLength: 24\ndnsServers: [\"2001:DB8:0::53\", \"9.9.9.9\"]\nvlanId: 42\nmtu: 1500",
    )));
    let settings = &pool.spec.datacenters["dc-1"];
    let network = datacenter_network("dc-1", settings)
        .expect("valid")
        .expect("has a network");
    assert_eq!(network.cidr.to_string(), "192.168.1.0/24");
    assert_eq!(network.gateway.as_deref(), Some("192.168.1.1"));
    assert_eq!(network.prefix_length, 24);
    assert_eq!(network.dns_servers, vec!["2001:db8::53", "9.9.9.9"]);
    assert_eq!((network.vlan_id, network.mtu), (Some(42), Some(1500)));

    // Without prefixLength the network is the pool itself.
    let pool = super::pool(&one_dc(&range_v4("mtu: 1500")));
    let network = datacenter_network("dc-1", &pool.spec.datacenters["dc-1"])
        .expect("valid")
        .expect("has a network");
    assert_eq!(
        (network.cidr.to_string(), network.prefix_length),
        ("192.168.1.0/26".to_string(), 26)
    );
}

#[test]
fn ipv6_and_point_to_point_networks() {
    let v6 = "type: prefix\npoolCidr: 2001:db8:0:100::/56\nallocationPrefix: 64\nexcludePrefixes: [\"2001:db8:0:100::/64\"]\nnetwork:\n  gateway: \"2001:db8:0:100::1\"\n  prefixLength: 48\n  mtu: 1280";
    assert_eq!(messages(v6), Vec::<String>::new());
    // In an IPv4 /31 both addresses are hosts; so are the two of an IPv6 /127.
    let p2p = "type: range\npoolCidr: 10.0.0.1/32\nallocationRange: 1\nnetwork:\n  gateway: 10.0.0.0\n  prefixLength: 31";
    assert_eq!(messages(p2p), Vec::<String>::new());
    let p2p6 = "type: range\npoolCidr: 2001:db8::1/128\nallocationRange: 1\nnetwork:\n  gateway: \"2001:db8::\"\n  prefixLength: 127";
    assert_eq!(messages(p2p6), Vec::<String>::new());
}

#[test]
fn each_network_rule_names_the_field_and_the_value() {
    let cases: &[(&str, &str)] = &[
        (
            "gateway: 192.168.1.300",
            "gateway \"192.168.1.300\": is not an IP address",
        ),
        (
            "gateway: \"2001:db8::1\"\nprefixLength: 24",
            "gateway \"2001:db8::1\": is IPv6, the pool is IPv4",
        ),
        (
            "gateway: 192.168.2.1\nprefixLength: 24",
            "gateway \"192.168.2.1\": is not inside the network 192.168.1.0/24",
        ),
        (
            "gateway: 192.168.1.254",
            "gateway \"192.168.1.254\": is not inside the network 192.168.1.0/26 (poolCidr; set prefixLength when the network is wider)",
        ),
        (
            "gateway: 192.168.1.0\nprefixLength: 24",
            "gateway \"192.168.1.0\": is the network address of the network 192.168.1.0/24",
        ),
        (
            "gateway: 192.168.1.255\nprefixLength: 24",
            "gateway \"192.168.1.255\": is the broadcast address of the network 192.168.1.0/24",
        ),
        (
            "gateway: 192.168.1.2\nprefixLength: 24",
            "gateway \"192.168.1.2\": lies inside poolCidr 192.168.1.0/26 and is not excluded, so kipam could hand it to a cluster: add it to excludeRanges",
        ),
        (
            "prefixLength: 27",
            "prefixLength \"27\": must be between 0 and 26, the prefix length of poolCidr 192.168.1.0/26: the pool lies inside its network",
        ),
        (
            "prefixLength: -1",
            "prefixLength \"-1\": must be between 0 and 26, the prefix length of poolCidr 192.168.1.0/26: the pool lies inside its network",
        ),
        (
            "prefixLength: 129",
            "prefixLength \"129\": must be between 0 and 26, the prefix length of poolCidr 192.168.1.0/26: the pool lies inside its network",
        ),
        (
            "dnsServers: [\"192.168.1.53\", \"dns.example.com\"]",
            "dnsServers[1] \"dns.example.com\": is not an IP address",
        ),
        (
            "dnsServers: [\"192.168.1.53\", \"2001:db8::53\", \"192.168.1.053\"]",
            "dnsServers[2] \"192.168.1.053\": is not an IP address",
        ),
        (
            "dnsServers: [\"2001:db8::53\", \"2001:DB8:0:0::53\"]",
            "dnsServers[1] \"2001:DB8:0:0::53\": is listed twice (also dnsServers[0])",
        ),
        (
            "dnsServers: [\"1.1.1.1\", \"1.1.1.2\", \"1.1.1.3\", \"1.1.1.4\", \"1.1.1.5\", \"1.1.1.6\", \"1.1.1.7\", \"1.1.1.8\", \"1.1.1.9\"]",
            "dnsServers: must have at most 8 items, has 9",
        ),
        (
            "vlanId: 4095",
            "vlanId \"4095\": must be between 0 and 4094",
        ),
        ("vlanId: -1", "vlanId \"-1\": must be between 0 and 4094"),
        ("mtu: 575", "mtu \"575\": must be between 576 and 9216"),
        ("mtu: 9217", "mtu \"9217\": must be between 576 and 9216"),
    ];
    for (network, want) in cases {
        assert_eq!(
            messages(&range_v4(network)),
            vec![format!("{FIELD}.{want}")],
            "{network}"
        );
    }
}

#[test]
fn the_gateway_of_a_prefix_pool_and_an_ipv6_pool() {
    let prefix = "type: prefix\npoolCidr: 10.20.0.0/24\nallocationPrefix: 27\nnetwork:\n  gateway: 10.20.0.1";
    assert_eq!(
        messages(prefix),
        vec![format!(
            "{FIELD}.gateway \"10.20.0.1\": lies inside poolCidr 10.20.0.0/24 and is not excluded, so kipam could hand it to a cluster: add it to excludePrefixes"
        )]
    );
    let excluded = format!("{prefix}\nexcludePrefixes: [\"10.20.0.0/27\"]");
    assert_eq!(messages(&excluded), Vec::<String>::new());

    // An IPv6 network address is the subnet-router anycast address, not a host's.
    let v6 = "type: range\npoolCidr: 2001:db8::/64\nallocationRange: 8\nnetwork:\n  gateway: \"2001:db8::\"\n  mtu: 1000";
    assert_eq!(
        messages(v6),
        vec![
            format!(
                "{FIELD}.gateway \"2001:db8::\": is the network address of the network 2001:db8::/64 (poolCidr; set prefixLength when the network is wider)"
            ),
            format!(
                "{FIELD}.mtu \"1000\": must be between 1280 and 9216 (the least an IPv6 link carries)"
            ),
        ]
    );
    // The last address of an IPv6 network is an ordinary host.
    let last = "type: range\npoolCidr: 2001:db8:0:1::/64\nallocationRange: 8\nexcludeRanges: [\"2001:db8:0:1:ffff:ffff:ffff:ffff\"]\nnetwork:\n  gateway: \"2001:db8:0:1:ffff:ffff:ffff:ffff\"\n  prefixLength: 63";
    assert_eq!(messages(last), Vec::<String>::new());
}

#[test]
fn strings_over_their_bound_are_refused_too() {
    let long = format!("dnsServers: [\"{}\"]", "1".repeat(46));
    assert_eq!(
        messages(&range_v4(&long)),
        vec![format!(
            "{FIELD}.dnsServers[0] \"{}\": is not an IP address",
            "1".repeat(46)
        )]
    );
}

#[test]
fn every_problem_is_reported_at_once_with_the_pools_own() {
    let all = messages(
        "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 0\nnetwork:\n  gateway: x\n  vlanId: 5000\n  mtu: 100",
    );
    assert_eq!(
        all,
        vec![
            "IPAMPool metallb: spec.datacenters[dc-1].allocationRange \"0\": must be at least 1"
                .to_string(),
            format!("{FIELD}.gateway \"x\": is not an IP address"),
            format!("{FIELD}.vlanId \"5000\": must be between 0 and 4094"),
            format!("{FIELD}.mtu \"100\": must be between 576 and 9216"),
        ]
    );
    // A bad poolCidr is the pool's own error; the network adds only what it can tell.
    let bad_cidr = messages(
        "type: range\npoolCidr: 192.168.1.0/33\nallocationRange: 8\nnetwork:\n  gateway: 192.168.1.1\n  prefixLength: 24",
    );
    assert_eq!(bad_cidr.len(), 1, "{bad_cidr:?}");
    assert!(bad_cidr[0].contains("poolCidr"), "{bad_cidr:?}");
}

/// `network` is not immutable: it changes what a cluster is told, never what it holds. An
/// edit is checked by the creation rules only, whatever the pool holds.
#[test]
fn the_network_may_change_at_any_time() {
    let stored = vec![StoredAllocation {
        cluster: "alpha".into(),
        pool: "metallb".into(),
        datacenter: "dc-1".into(),
        held: Some(Allocation::Range(vec![
            "192.168.1.2-192.168.1.9".parse().unwrap(),
        ])),
        reclaim_policy: None,
        unreadable: None,
    }];
    let old = pool(&one_dc(&range_v4("gateway: 192.168.1.1\nvlanId: 10")));
    for edit in [
        "gateway: 192.168.1.254\nprefixLength: 24\nvlanId: 20\nmtu: 9000",
        "dnsServers: [\"192.168.1.53\"]",
        "{}",
    ] {
        let new = pool(&one_dc(&range_v4(edit)));
        assert!(
            validate_pool(&new, Some(&old), &stored).is_ok(),
            "{edit}: {:?}",
            validate_pool(&new, Some(&old), &stored).err()
        );
    }
    // Removing the network altogether is an edit like any other.
    let without = pool(&one_dc(
        "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nexcludeRanges: [\"192.168.1.1\"]",
    ));
    assert!(validate_pool(&without, Some(&old), &stored).is_ok());

    // A gateway an allocation holds cannot be named: it would have to be excluded, and that
    // exclusion would hit the allocation.
    let taken = pool(&one_dc(&range_v4("gateway: 192.168.1.5")));
    let errors = validate_pool(&taken, Some(&old), &stored).unwrap_err();
    assert_eq!(
        errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
        vec![format!(
            "{FIELD}.gateway \"192.168.1.5\": lies inside poolCidr 192.168.1.0/26 and is not excluded, so kipam could hand it to a cluster: add it to excludeRanges"
        )]
    );
}

/// With several CIDRs, the gateway may not lie in any of them unexcluded, and every CIDR lies
/// in the network whose gateway and prefix length the pool's addresses are given.
#[test]
fn additional_cidrs_lie_in_the_network_and_do_not_hand_out_the_gateway() {
    let base = "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 8\nexcludeRanges: [\"192.168.1.1\"]\nadditionalCidrs: [\"192.168.1.64/26\"]\n";
    // The gateway in the additional CIDR, not excluded.
    assert_eq!(
        messages(&format!(
            "{base}network:\n  gateway: 192.168.1.65\n  prefixLength: 24\n"
        )),
        vec![format!(
            "{FIELD}.gateway \"192.168.1.65\": lies inside additionalCidrs 192.168.1.64/26 and is not excluded, so kipam could hand it to a cluster: add it to excludeRanges"
        )]
    );
    // The same, excluded: accepted.
    let excluded = base.replace("[\"192.168.1.1\"]", "[\"192.168.1.1\", \"192.168.1.65\"]");
    assert_eq!(
        messages(&format!(
            "{excluded}network:\n  gateway: 192.168.1.65\n  prefixLength: 24\n"
        )),
        Vec::<String>::new()
    );
    // A network as narrow as poolCidr leaves the additional CIDR outside it.
    assert_eq!(
        messages(&format!("{base}network:\n  vlanId: 7\n")),
        vec!["IPAMPool metallb: spec.datacenters[dc-1].additionalCidrs[0] \"192.168.1.64/26\": is not inside the network 192.168.1.0/26 (poolCidr; set prefixLength when the network is wider), whose gateway and prefix length the pool's addresses are given".to_string()]
    );
}
