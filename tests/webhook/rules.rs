//! Every admission rule, decided in process against a fixed view of the seed.

use serde_json::json;

use crate::support::*;

fn refused(v: &kipam::webhook::review::Verdict, code: u16, parts: &[&str]) {
    assert!(!v.allowed, "expected a refusal, got {v:?}");
    assert_eq!(v.code, code, "{v:?}");
    for p in parts {
        assert!(v.message.contains(p), "{:?} lacks {p:?}", v.message);
    }
}

fn allowed(v: &kipam::webhook::review::Verdict) {
    assert!(v.allowed, "expected admission, got {v:?}");
}

/// c1 holds 10.0.0.0-10.0.0.7 of metallb/dc-1 (object and record).
fn seed() -> Seed {
    Seed::default()
        .pool(range_pool())
        .cluster(cluster_json("c1", json!({"datacenter": "dc-1"})))
        .cluster(cluster_json("c2", json!({"datacenter": "dc-1"})))
        .allocation(allocation_json(
            "c1",
            "metallb",
            "dc-1",
            &["10.0.0.0-10.0.0.7"],
        ))
        .record(record_json(
            "metallb",
            "dc-1",
            json!({"c1": {"addresses": ["10.0.0.0-10.0.0.7"]}}),
        ))
}

#[test]
fn an_invalid_pool_is_refused_with_field_value_and_rule() {
    let bad = pool_json(
        "metallb",
        json!({"dc-1": {"type": "range", "poolCidr": "10.0.0.0/26", "allocationRange": 65}}),
    );
    let v = seed().decide(&request("ipampools", "CREATE", HUMAN, Some(bad), None));
    refused(
        &v,
        422,
        &[
            "IPAMPool metallb",
            "spec.datacenters[dc-1].allocationRange \"65\"",
            "exceeds the 64 addresses of poolCidr",
        ],
    );
}

#[test]
fn a_datacenter_name_the_crd_cannot_check_is_refused() {
    let bad = pool_json(
        "other",
        json!({"EU West": {"type": "range", "poolCidr": "10.1.0.0/24", "allocationRange": 4}}),
    );
    let v = seed().decide(&request("ipampools", "CREATE", HUMAN, Some(bad), None));
    refused(&v, 422, &["spec.datacenters", "EU West", "DNS-1123 label"]);
}

#[test]
fn a_valid_pool_is_admitted() {
    let good = pool_json(
        "other",
        json!({"dc-1": {"type": "prefix", "poolCidr": "2001:db8::/48", "allocationPrefix": 64}}),
    );
    allowed(&seed().decide(&request("ipampools", "CREATE", HUMAN, Some(good), None)));
}

#[test]
fn an_exclusion_over_a_live_allocation_is_refused_naming_the_cluster() {
    let mut new = range_pool();
    new["spec"]["datacenters"]["dc-1"]["excludeRanges"] = json!(["10.0.0.250", "10.0.0.4"]);
    let v = seed().decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(new),
        Some(range_pool()),
    ));
    refused(
        &v,
        422,
        &[
            "spec.datacenters[dc-1].excludeRanges[1] \"10.0.0.4\"",
            "cluster c1",
            "10.0.0.0-10.0.0.7",
        ],
    );
}

#[test]
fn an_exclusion_over_addresses_only_the_record_holds_is_refused() {
    // c3's object is not written yet (a crash between record and object): the record alone
    // holds 10.0.0.8-10.0.0.15.
    let seed = seed().record(record_json(
        "metallb",
        "dc-1",
        json!({"c3": {"addresses": ["10.0.0.8-10.0.0.15"]}}),
    ));
    let mut new = range_pool();
    new["spec"]["datacenters"]["dc-1"]["excludeRanges"] = json!(["10.0.0.250", "10.0.0.9"]);
    let v = seed.decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(new),
        Some(range_pool()),
    ));
    refused(&v, 422, &["cluster c3"]);
}

#[test]
fn narrowing_pool_cidr_past_a_live_allocation_is_refused_naming_it() {
    let seed = seed().allocation(allocation_json(
        "c2",
        "metallb",
        "dc-1",
        &["10.0.0.200-10.0.0.207"],
    ));
    let mut new = range_pool();
    new["spec"]["datacenters"]["dc-1"]["poolCidr"] = json!("10.0.0.0/25");
    new["spec"]["datacenters"]["dc-1"]["excludeRanges"] = json!([]);
    let v = seed.decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(new),
        Some(range_pool()),
    ));
    refused(
        &v,
        422,
        &[
            "poolCidr \"10.0.0.0/25\": may only be widened to a network that contains the old one (was 10.0.0.0/24)",
            "allocations affected: c2 (10.0.0.200-10.0.0.207)",
        ],
    );
}

#[test]
fn a_pool_created_again_must_hold_what_it_retained() {
    // The pool was deleted with Retain: its allocations and no pool remain.
    let seed = Seed::default().allocation(allocation_json(
        "c1",
        "metallb",
        "dc-1",
        &["10.0.0.0-10.0.0.7"],
    ));
    let smaller = pool_json(
        "metallb",
        json!({"dc-1": {"type": "range", "poolCidr": "10.9.0.0/24", "allocationRange": 8}}),
    );
    let v = seed.decide(&request("ipampools", "CREATE", HUMAN, Some(smaller), None));
    refused(
        &v,
        422,
        &["poolCidr", "allocations affected: c1 (10.0.0.0-10.0.0.7)"],
    );
    let prefix = pool_json(
        "metallb",
        json!({"dc-1": {"type": "prefix", "poolCidr": "10.0.0.0/24", "allocationPrefix": 29}}),
    );
    let v = seed.decide(&request("ipampools", "CREATE", HUMAN, Some(prefix), None));
    refused(
        &v,
        422,
        &[
            "spec.datacenters[dc-1].type \"prefix\"",
            "is immutable (was range)",
            "allocations affected: c1 (10.0.0.0-10.0.0.7)",
        ],
    );
    allowed(&seed.decide(&request(
        "ipampools",
        "CREATE",
        HUMAN,
        Some(range_pool()),
        None,
    )));
}

#[test]
fn changing_a_pool_type_is_refused_naming_the_allocation() {
    let mut new = range_pool();
    new["spec"]["datacenters"]["dc-1"] =
        json!({"type": "prefix", "poolCidr": "10.0.0.0/24", "allocationPrefix": 29});
    let v = seed().decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(new),
        Some(range_pool()),
    ));
    refused(
        &v,
        422,
        &[
            "type \"prefix\": is immutable (was range); allocations affected: c1 (10.0.0.0-10.0.0.7)",
        ],
    );
}

#[test]
fn an_update_that_leaves_the_spec_alone_is_admitted_even_when_invalid() {
    // Stored before the rule existed: removing a finalizer must still work.
    let mut old = pool_json(
        "metallb",
        json!({"dc-1": {"type": "range", "poolCidr": "10.0.0.0/26", "allocationRange": 65}}),
    );
    let mut new = old.clone();
    new["metadata"]["finalizers"] = json!([]);
    old["metadata"]["finalizers"] = json!(["ipam.kipam.dev/reclaim-allocations"]);
    allowed(&seed().decide(&request("ipampools", "UPDATE", HUMAN, Some(new), Some(old))));
}

#[test]
fn cluster_overrides_and_pins_are_checked() {
    let bad_key = cluster_json(
        "c9",
        json!({"datacenter": "dc-1", "ipam": {"Metal_LB": {"allocationRange": 4}}}),
    );
    let v = seed().decide(&request("clusters", "CREATE", HUMAN, Some(bad_key), None));
    refused(
        &v,
        422,
        &["Cluster c9", "spec.ipam", "Metal_LB", "DNS-1123 label"],
    );
    let two = cluster_json(
        "c9",
        json!({"datacenter": "dc-1", "ipam": {"metallb": {"allocationRange": 4, "cidr": "10.0.0.0/30"}}}),
    );
    let v = seed().decide(&request("clusters", "CREATE", HUMAN, Some(two), None));
    refused(&v, 422, &["spec.ipam[metallb]", "set at most one of"]);
    let bad_pin = cluster_json(
        "c9",
        json!({"datacenter": "dc-1", "ipam": {"metallb": {"addresses": ["10.0.0.300"]}}}),
    );
    let v = seed().decide(&request(
        "clusters",
        "UPDATE",
        HUMAN,
        Some(bad_pin),
        Some(cluster_json("c9", json!({"datacenter": "dc-1"}))),
    ));
    refused(&v, 422, &["spec.ipam[metallb].addresses[0] \"10.0.0.300\""]);
    let good = cluster_json(
        "c9",
        json!({"datacenter": "dc-1", "ipam": {"metallb": {"addresses": ["10.0.0.100-10.0.0.103"]}}}),
    );
    allowed(&seed().decide(&request("clusters", "CREATE", HUMAN, Some(good), None)));
}

#[test]
fn a_hand_made_allocation_overlapping_another_is_refused_naming_it() {
    let mine = allocation_json("c2", "metallb", "dc-1", &["10.0.0.6-10.0.0.9"]);
    let v = seed().decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(mine),
        None,
    ));
    refused(
        &v,
        422,
        &[
            "IPAMAllocation cluster-c2/metallb",
            "spec.addresses \"10.0.0.6-10.0.0.9\"",
            "overlaps IPAMAllocation cluster-c1/metallb of cluster c1 (10.0.0.0-10.0.0.7) at 10.0.0.6-10.0.0.7",
        ],
    );
}

#[test]
fn a_hand_made_allocation_over_addresses_the_record_holds_for_another_cluster_is_refused() {
    // The record holds 10.0.0.8-10.0.0.15 for c3 whose object does not exist (yet, or any more).
    let seed = seed().record(record_json(
        "metallb",
        "dc-1",
        json!({"c3": {"addresses": ["10.0.0.8-10.0.0.15"]}}),
    ));
    let mine = allocation_json("c2", "metallb", "dc-1", &["10.0.0.12-10.0.0.13"]);
    let v = seed.decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(mine),
        None,
    ));
    refused(
        &v,
        422,
        &["10.0.0.12-10.0.0.13 is recorded for cluster c3 in IPAMPoolRecord metallb.dc-1"],
    );
}

#[test]
fn a_hand_made_allocation_must_stay_in_the_pool_and_out_of_exclusions() {
    let outside = allocation_json("c2", "metallb", "dc-1", &["10.0.1.0-10.0.1.3"]);
    let v = seed().decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(outside),
        None,
    ));
    refused(
        &v,
        422,
        &["10.0.1.0-10.0.1.3 leaves the pool", "10.0.0.0/24"],
    );
    let excluded = allocation_json("c2", "metallb", "dc-1", &["10.0.0.248-10.0.0.251"]);
    let v = seed().decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(excluded),
        None,
    ));
    refused(
        &v,
        422,
        &[
            "10.0.0.250 is excluded from IPAMPool metallb/dc-1 (spec.datacenters[dc-1].excludeRanges[0] \"10.0.0.250\")",
        ],
    );
    let no_pool = allocation_json("c2", "nothere", "dc-1", &["10.0.0.100"]);
    let v = seed().decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(no_pool),
        None,
    ));
    refused(&v, 422, &["no IPAMPool nothere exists"]);
    let no_dc = allocation_json("c2", "metallb", "dc-9", &["10.0.0.100"]);
    let v = seed().decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(no_dc),
        None,
    ));
    refused(&v, 422, &["spec.dc \"dc-9\"", "has no datacenter dc-9"]);
    let mut prefix = allocation_json("c2", "metallb", "dc-1", &[]);
    prefix["spec"] = json!({"type": "prefix", "dc": "dc-1", "cidr": "10.0.0.64/29"});
    let v = seed().decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(prefix),
        None,
    ));
    refused(&v, 422, &["spec.type \"prefix\"", "is of type range"]);
    let unreadable = allocation_json("c2", "metallb", "dc-1", &["10.0.0.9-10.0.0.1"]);
    let v = seed().decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(unreadable),
        None,
    ));
    refused(&v, 422, &["spec.addresses[0]"]);
}

#[test]
fn a_hand_made_allocation_of_free_addresses_is_admitted() {
    let mine = allocation_json("c2", "metallb", "dc-1", &["10.0.0.100-10.0.0.107"]);
    allowed(&seed().decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(mine),
        None,
    )));
}

#[test]
fn the_addresses_of_a_live_allocation_cannot_be_changed_by_hand() {
    let old = allocation_json("c1", "metallb", "dc-1", &["10.0.0.0-10.0.0.7"]);
    let grown = allocation_json(
        "c1",
        "metallb",
        "dc-1",
        &["10.0.0.0-10.0.0.7", "10.0.0.100"],
    );
    let v = seed().decide(&request(
        "ipamallocations",
        "UPDATE",
        HUMAN,
        Some(grown),
        Some(old.clone()),
    ));
    refused(
        &v,
        422,
        &[
            "changes the addresses of a live allocation",
            "cluster c1 holds 10.0.0.0-10.0.0.7",
        ],
    );
    let mut labelled = old.clone();
    labelled["metadata"]["labels"] = json!({"team": "net"});
    allowed(&seed().decide(&request(
        "ipamallocations",
        "UPDATE",
        HUMAN,
        Some(labelled),
        Some(old),
    )));
}

#[test]
fn a_live_allocation_cannot_be_deleted_by_hand_while_its_cluster_lives() {
    let old = allocation_json("c1", "metallb", "dc-1", &["10.0.0.0-10.0.0.7"]);
    let v = seed().decide(&request(
        "ipamallocations",
        "DELETE",
        HUMAN,
        None,
        Some(old.clone()),
    ));
    refused(&v, 403, &["releases nothing", "delete the Cluster"]);
    // The cluster is gone, or its namespace is being deleted: let the cleanup through.
    let without_cluster = Seed::default().pool(range_pool());
    allowed(&without_cluster.decide(&request(
        "ipamallocations",
        "DELETE",
        HUMAN,
        None,
        Some(old.clone()),
    )));
    allowed(&seed().terminating("cluster-c1").decide(&request(
        "ipamallocations",
        "DELETE",
        "system:serviceaccount:kube-system:namespace-controller",
        None,
        Some(old),
    )));
}

#[test]
fn kipams_own_writes_pass_straight_through() {
    let overlapping = allocation_json("c2", "metallb", "dc-1", &["10.0.0.0-10.0.0.3"]);
    allowed(&seed().decide(&request(
        "ipamallocations",
        "CREATE",
        KIPAM,
        Some(overlapping.clone()),
        None,
    )));
    let record = record_json("metallb", "dc-1", json!({}));
    allowed(&seed().decide(&request(
        "ipampoolrecords",
        "UPDATE",
        KIPAM,
        Some(record.clone()),
        Some(record),
    )));
    // Somebody else with the same addresses is refused.
    refused(
        &seed().decide(&request(
            "ipamallocations",
            "CREATE",
            HUMAN,
            Some(overlapping),
            None,
        )),
        422,
        &["overlaps"],
    );
}

#[test]
fn records_are_written_by_kipam_alone() {
    let record = record_json(
        "metallb",
        "dc-1",
        json!({"c1": {"addresses": ["10.0.0.0-10.0.0.7"]}}),
    );
    let mut emptied = record.clone();
    emptied["spec"]["reservations"] = json!({});
    for (op, new, old) in [
        ("CREATE", Some(record.clone()), None),
        ("UPDATE", Some(emptied), Some(record.clone())),
        ("DELETE", None, Some(record.clone())),
    ] {
        let v = seed().decide(&request("ipampoolrecords", op, HUMAN, new, old));
        refused(
            &v,
            403,
            &[
                "IPAMPoolRecord metallb.dc-1",
                "written by kipam alone",
                "alice",
            ],
        );
    }
    // The garbage collector removes the record of a deleted pool.
    let gone = Seed::default();
    allowed(&gone.decide(&request(
        "ipampoolrecords",
        "DELETE",
        "system:serviceaccount:kube-system:generic-garbage-collector",
        None,
        Some(record),
    )));
}

#[test]
fn other_resources_and_subresources_are_not_judged() {
    let mut r = request(
        "ipamallocations",
        "UPDATE",
        HUMAN,
        Some(allocation_json("c1", "metallb", "dc-1", &["10.0.0.9"])),
        Some(allocation_json(
            "c1",
            "metallb",
            "dc-1",
            &["10.0.0.0-10.0.0.7"],
        )),
    );
    r.sub_resource = Some("status".into());
    allowed(&seed().decide(&r));
}

/// The pool of `seed()` grown: a wider poolCidr and an additional CIDR holding c3.
fn grown_pool() -> serde_json::Value {
    pool_json(
        "metallb",
        json!({"dc-1": {"type": "range", "poolCidr": "10.0.0.0/23", "allocationRange": 8,
                        "excludeRanges": ["10.0.0.250", "10.9.0.1"],
                        "additionalCidrs": ["10.9.0.0/28", "10.8.0.0/28"]}}),
    )
}

/// `seed()` after the pool grew.
fn grown_seed() -> Seed {
    Seed::default()
        .pool(grown_pool())
        .cluster(cluster_json("c1", json!({"datacenter": "dc-1"})))
        .cluster(cluster_json("c2", json!({"datacenter": "dc-1"})))
        .allocation(allocation_json(
            "c1",
            "metallb",
            "dc-1",
            &["10.0.0.0-10.0.0.7"],
        ))
}

#[test]
fn widening_pool_cidr_and_adding_cidrs_is_admitted() {
    let v = seed().decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(grown_pool()),
        Some(range_pool()),
    ));
    allowed(&v);
}

#[test]
fn removing_a_cidr_that_holds_something_is_refused_naming_the_holdings() {
    let seed = grown_seed()
        .allocation(allocation_json(
            "c3",
            "metallb",
            "dc-1",
            &["10.9.0.2-10.9.0.9"],
        ))
        .allocation(allocation_json(
            "c4",
            "metallb",
            "dc-1",
            &["10.0.1.0-10.0.1.7"],
        ));
    // 10.9.0.0/28 holds c3: it may not go. 10.8.0.0/28 holds nothing: it may.
    let mut new = grown_pool();
    new["spec"]["datacenters"]["dc-1"]["additionalCidrs"] = json!(["10.8.0.0/28"]);
    new["spec"]["datacenters"]["dc-1"]["excludeRanges"] = json!(["10.0.0.250"]);
    let v = seed.decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(new),
        Some(grown_pool()),
    ));
    refused(
        &v,
        422,
        &[
            "spec.datacenters[dc-1].additionalCidrs",
            "leaves allocations outside every CIDR of the pool",
            "allocations affected: c3 (10.9.0.2-10.9.0.9)",
        ],
    );
    assert!(!v.message.contains("c4"), "{}", v.message);
    let mut empty_one_gone = grown_pool();
    empty_one_gone["spec"]["datacenters"]["dc-1"]["additionalCidrs"] = json!(["10.9.0.0/28"]);
    allowed(&seed.decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(empty_one_gone),
        Some(grown_pool()),
    )));
    // Narrowing back to the /24 strands c4, in the widened half.
    let mut narrowed = grown_pool();
    narrowed["spec"]["datacenters"]["dc-1"]["poolCidr"] = json!("10.0.0.0/24");
    let v = seed.decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(narrowed),
        Some(grown_pool()),
    ));
    refused(
        &v,
        422,
        &[
            "poolCidr \"10.0.0.0/24\": may only be widened to a network that contains the old one (was 10.0.0.0/23)",
            "allocations affected: c4 (10.0.1.0-10.0.1.7)",
        ],
    );
}

#[test]
fn an_allocation_in_an_additional_cidr_is_inside_the_pool() {
    let seed = grown_seed();
    let inside = allocation_json("c2", "metallb", "dc-1", &["10.8.0.0-10.8.0.7"]);
    allowed(&seed.decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(inside),
        None,
    )));
    let gap = allocation_json("c2", "metallb", "dc-1", &["10.8.0.12-10.8.0.19"]);
    let v = seed.decide(&request(
        "ipamallocations",
        "CREATE",
        HUMAN,
        Some(gap),
        None,
    ));
    refused(&v, 422, &["leaves the pool", "10.9.0.0/28, 10.8.0.0/28"]);
}

/// `network` is checked like the rest of the pool, and may change on update: it changes no
/// holding.
#[test]
fn a_pool_network_is_checked_and_may_change() {
    let mut with = range_pool();
    with["spec"]["datacenters"]["dc-1"]["network"] =
        json!({"gateway": "10.0.0.250", "vlanId": 10, "dnsServers": ["10.0.0.53"]});
    let v = seed().decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(with.clone()),
        Some(range_pool()),
    ));
    allowed(&v);

    let mut changed = with.clone();
    changed["spec"]["datacenters"]["dc-1"]["network"] =
        json!({"gateway": "10.0.255.254", "prefixLength": 16, "mtu": 9000});
    let v = seed().decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(changed),
        Some(with.clone()),
    ));
    allowed(&v);

    // c1 holds 10.0.0.5: naming it as the gateway is refused.
    let mut taken = with.clone();
    taken["spec"]["datacenters"]["dc-1"]["network"] = json!({"gateway": "10.0.0.5"});
    let v = seed().decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(taken),
        Some(with.clone()),
    ));
    refused(
        &v,
        422,
        &[
            "IPAMPool metallb",
            "spec.datacenters[dc-1].network.gateway \"10.0.0.5\": lies inside poolCidr 10.0.0.0/24 and is not excluded",
        ],
    );

    let mut bad = range_pool();
    bad["spec"]["datacenters"]["dc-1"]["network"] = json!({"vlanId": 4095, "mtu": 9217});
    let v = seed().decide(&request("ipampools", "CREATE", HUMAN, Some(bad), None));
    refused(
        &v,
        422,
        &[
            "spec.datacenters[dc-1].network.vlanId \"4095\": must be between 0 and 4094",
            "spec.datacenters[dc-1].network.mtu \"9217\": must be between 576 and 9216",
        ],
    );
}

#[test]
fn a_holding_already_outside_the_pool_blocks_no_other_edit() {
    // c5's allocation lies outside the pool already (made by hand): it is reported elsewhere,
    // and raising allocationRange is no edit that strands it.
    let seed = grown_seed().allocation(allocation_json(
        "c5",
        "metallb",
        "dc-1",
        &["10.77.0.0-10.77.0.3"],
    ));
    let mut new = grown_pool();
    new["spec"]["datacenters"]["dc-1"]["allocationRange"] = json!(12);
    allowed(&seed.decide(&request(
        "ipampools",
        "UPDATE",
        HUMAN,
        Some(new),
        Some(grown_pool()),
    )));
}

/// metallb/dc-1 as in [`seed`], plus claim machines/web-0 holding 10.0.0.8 and a quarantine
/// for claim machines/web-1 over 10.0.0.9.
fn claims_seed() -> Seed {
    seed().record(record_json(
        "metallb",
        "dc-1",
        json!({
            "claim/machines/web-0": {"addresses": ["10.0.0.8"]},
            "quarantined/claim/machines/web-1@2026-11-25T18:00:00Z": {"addresses": ["10.0.0.9"]},
        }),
    ))
}

#[test]
fn a_hand_made_ip_address_of_a_kipam_pool_is_checked_in_every_version() {
    let seed = claims_seed();
    for version in ["v1beta1", "v1beta2"] {
        let review = |claim: &str, address: &str| {
            seed.decide(&ip_address_request(
                version,
                "CREATE",
                HUMAN,
                Some(ip_address_json(version, claim, "metallb", address)),
                None,
            ))
        };
        // Its own claim's recorded address, or a free one: admitted.
        allowed(&review("web-0", "10.0.0.8"));
        allowed(&review("web-7", "10.0.0.100"));
        refused(
            &review("web-7", "10.0.0.8"),
            422,
            &[
                "IPAddress machines/web-7",
                "spec.address \"10.0.0.8\"",
                "held by claim machines/web-0",
            ],
        );
        refused(
            &review("web-7", "10.0.0.2"),
            422,
            &["spec.address \"10.0.0.2\"", "held by cluster c1"],
        );
        refused(
            &review("web-1", "10.0.0.9"),
            422,
            &["quarantined for claim machines/web-1"],
        );
        refused(
            &review("web-7", "10.0.0.250"),
            422,
            &["excluded from IPAMPool metallb/dc-1"],
        );
        refused(
            &review("web-7", "10.1.0.1"),
            422,
            &["spec.address \"10.1.0.1\"", "lies in none of the CIDRs"],
        );
        refused(
            &review("web-7", "ten"),
            422,
            &["spec.address \"ten\"", "is not an IP address"],
        );
    }
    let v = seed.decide(&ip_address_request(
        "v1beta2",
        "CREATE",
        HUMAN,
        Some(ip_address_json("v1beta2", "web-7", "gone", "10.0.0.100")),
        None,
    ));
    refused(
        &v,
        422,
        &["spec.poolRef.name \"gone\"", "no IPAMPool gone exists"],
    );
}

#[test]
fn an_ip_address_update_is_checked_unless_its_spec_is_unchanged() {
    let seed = claims_seed();
    let old = ip_address_json("v1beta2", "web-7", "metallb", "10.0.0.100");
    let mut moved = old.clone();
    moved["spec"]["address"] = json!("10.0.0.3");
    let v = seed.decide(&ip_address_request(
        "v1beta2",
        "UPDATE",
        HUMAN,
        Some(moved),
        Some(old.clone()),
    ));
    refused(&v, 422, &["spec is immutable", "IPAMPool metallb"]);
    // Moved to a free address: still refused (the record holds the old one for the claim).
    let mut free = old.clone();
    free["spec"]["address"] = json!("10.0.0.101");
    let v = seed.decide(&ip_address_request(
        "v1beta2",
        "UPDATE",
        HUMAN,
        Some(free),
        Some(old.clone()),
    ));
    refused(&v, 422, &["spec is immutable"]);
    // An object of another provider's pool pointed at a kipam pool is checked like a create.
    let mut foreign = old.clone();
    foreign["spec"]["poolRef"] =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "x"});
    let mut taken = old;
    taken["spec"]["address"] = json!("10.0.0.3");
    let v = seed.decide(&ip_address_request(
        "v1beta2",
        "UPDATE",
        HUMAN,
        Some(taken),
        Some(foreign),
    ));
    refused(&v, 422, &["held by cluster c1"]);
    // An object that got in before the rule can still lose its finalizer.
    let stuck = ip_address_json("v1beta2", "web-7", "metallb", "10.0.0.3");
    let mut released = stuck.clone();
    released["metadata"]["finalizers"] = json!([]);
    allowed(&seed.decide(&ip_address_request(
        "v1beta2",
        "UPDATE",
        HUMAN,
        Some(released),
        Some(stuck),
    )));
}

#[test]
fn kipam_s_own_ip_addresses_and_those_of_other_pools_pass() {
    let seed = claims_seed();
    let taken = ip_address_json("v1beta2", "web-7", "metallb", "10.0.0.8");
    allowed(&seed.decide(&ip_address_request(
        "v1beta2",
        "CREATE",
        KIPAM,
        Some(taken.clone()),
        None,
    )));
    let mut other = taken.clone();
    other["spec"]["poolRef"] =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "metallb"});
    allowed(&seed.decide(&ip_address_request(
        "v1beta2",
        "CREATE",
        HUMAN,
        Some(other),
        None,
    )));
    // v1beta1 without apiGroup: the core group, not kipam's.
    let mut core = taken.clone();
    core["spec"]["poolRef"] = json!({"kind": "IPAMPool", "name": "metallb"});
    allowed(&seed.decide(&ip_address_request(
        "v1beta1",
        "CREATE",
        HUMAN,
        Some(core),
        None,
    )));
    // Deletes are not judged.
    allowed(&seed.decide(&ip_address_request(
        "v1beta2",
        "DELETE",
        HUMAN,
        None,
        Some(taken),
    )));
}
