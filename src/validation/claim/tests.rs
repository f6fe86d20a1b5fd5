use super::*;
use crate::planner::PoolInput;
use crate::resources::IPAMPool;
use crate::validation::pool_input;

fn pool(yaml: &str) -> PoolInput {
    let p: IPAMPool = serde_saphyr::from_str(yaml).expect("pool parses");
    pool_input(&p).expect("pool is valid")
}

fn two_dcs() -> PoolInput {
    pool(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: nodes}\nspec:\n  datacenters:\n    fra: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 8}\n    ams: {type: range, poolCidr: 10.1.0.0/24, allocationRange: 8}\n",
    )
}

fn subnets() -> PoolInput {
    pool(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: nets}\nspec:\n  datacenters:\n    fra: {type: prefix, poolCidr: 10.2.0.0/16, allocationPrefix: 28}\n",
    )
}

fn claim(annotations: &[(&str, &str)]) -> IPAddressClaim {
    let mut c: IPAddressClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": "m0-eth0", "namespace": "capi", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"clusterName": "edge", "poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": "nodes"}},
    }))
    .expect("claim parses");
    c.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    c
}

#[test]
fn a_range_claim_asks_one_address_of_its_one_pool() {
    let p = two_dcs();
    let read = claim_input(
        &claim(&[(ANNOTATION_CLAIM_DATACENTER, "ams")]),
        "nodes",
        ClaimPool::Ready(&p),
        None,
        false,
        None,
    );
    let input = read.input.expect("served");
    assert_eq!(input.name, "claim/capi/m0-eth0");
    assert_eq!(input.datacenter, "ams");
    assert_eq!(input.only_pool.as_deref(), Some("nodes"));
    assert_eq!(
        input.overrides.get("nodes"),
        Some(&PoolOverride::Addresses(1))
    );
    assert!(input.asks("nodes") && !input.asks("other"));
}

#[test]
fn the_datacenter_comes_from_the_annotation_then_the_kipam_cluster_never_a_guess() {
    let p = two_dcs();
    let from_cluster = claim_input(
        &claim(&[]),
        "nodes",
        ClaimPool::Ready(&p),
        Some("fra"),
        false,
        None,
    );
    assert_eq!(from_cluster.input.expect("served").datacenter, "fra");
    let ambiguous = claim_input(
        &claim(&[]),
        "nodes",
        ClaimPool::Ready(&p),
        None,
        false,
        None,
    );
    assert!(ambiguous.input.is_none());
    let wait = ambiguous.wait.expect("waits");
    assert_eq!(wait.reason, "DatacenterAmbiguous");
    assert!(wait.message.contains("ams, fra"), "{}", wait.message);
    let unknown = claim_input(
        &claim(&[(ANNOTATION_CLAIM_DATACENTER, "par")]),
        "nodes",
        ClaimPool::Ready(&p),
        Some("fra"),
        false,
        None,
    );
    let wait = unknown.wait.expect("waits");
    assert_eq!(wait.reason, "DatacenterUnknown");
    assert!(wait.message.contains("\"par\""), "{}", wait.message);
}

#[test]
fn a_missing_pool_or_a_bad_requested_address_waits_with_a_reason() {
    // The contract's reason, whatever is wrong with the pool; kipam's detail in the message.
    let missing = claim_input(&claim(&[]), "nodes", ClaimPool::Missing, None, false, None);
    let wait = missing.wait.expect("waits");
    assert_eq!(wait.reason, "PoolNotReady");
    assert!(wait.message.contains("does not exist"), "{}", wait.message);
    for pool in [ClaimPool::Deleting, ClaimPool::Invalid("bad cidr".into())] {
        let read = claim_input(&claim(&[]), "nodes", pool, None, false, None);
        assert_eq!(read.wait.expect("waits").reason, "PoolNotReady");
    }
    let p = two_dcs();
    let bad = claim_input(
        &claim(&[
            (ANNOTATION_CLAIM_DATACENTER, "fra"),
            (ANNOTATION_REQUESTED_ADDRESS, "10.0.0.300"),
        ]),
        "nodes",
        ClaimPool::Ready(&p),
        None,
        false,
        None,
    );
    let wait = bad.wait.expect("waits");
    assert_eq!(wait.reason, "RequestedAddressInvalid");
    assert!(wait.message.contains("10.0.0.300"), "{}", wait.message);
}

#[test]
fn a_requested_address_is_a_pin_and_in_a_prefix_pool_its_subnet() {
    let p = two_dcs();
    let read = claim_input(
        &claim(&[
            (ANNOTATION_CLAIM_DATACENTER, "fra"),
            (ANNOTATION_REQUESTED_ADDRESS, "10.0.0.7"),
        ]),
        "nodes",
        ClaimPool::Ready(&p),
        None,
        false,
        None,
    );
    assert_eq!(
        read.input.expect("served").overrides.get("nodes"),
        Some(&PoolOverride::PinnedAddresses(vec![
            "10.0.0.7".parse().unwrap()
        ]))
    );
    let n = subnets();
    let read = claim_input(
        &claim(&[(ANNOTATION_REQUESTED_ADDRESS, "10.2.3.77")]),
        "nets",
        ClaimPool::Ready(&n),
        None,
        false,
        None,
    );
    assert_eq!(
        read.input.expect("served").overrides.get("nets"),
        Some(&PoolOverride::PinnedCidr("10.2.3.64/28".parse().unwrap()))
    );
}

#[test]
fn a_held_claim_keeps_its_place_whatever_its_annotations_say_now() {
    let held = Allocation::Range(vec!["10.0.0.9".parse().unwrap()]);
    let read = claim_input(
        &claim(&[
            (ANNOTATION_CLAIM_DATACENTER, "ams"),
            (ANNOTATION_REQUESTED_ADDRESS, "10.0.0.10"),
        ]),
        "nodes",
        ClaimPool::Missing,
        None,
        false,
        Some(ClaimHeld {
            datacenter: "fra",
            held: &held,
        }),
    );
    let input = read.input.expect("kept");
    assert_eq!(input.datacenter, "fra");
    assert!(read.note.expect("said").contains("never moved"));
}

#[test]
fn a_paused_claim_being_deleted_keeps_what_it_holds() {
    let p = two_dcs();
    let held = Allocation::Range(vec!["10.0.0.9".parse().unwrap()]);
    let mut c = claim(&[]);
    c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    let paused = claim_input(
        &c,
        "nodes",
        ClaimPool::Ready(&p),
        None,
        true,
        Some(ClaimHeld {
            datacenter: "fra",
            held: &held,
        }),
    )
    .input
    .expect("kept");
    assert!(!paused.deleting && paused.frozen());
    let running = claim_input(
        &c,
        "nodes",
        ClaimPool::Ready(&p),
        None,
        false,
        Some(ClaimHeld {
            datacenter: "fra",
            held: &held,
        }),
    )
    .input
    .expect("released by the plan");
    assert!(running.deleting);
}

#[test]
fn a_claim_of_a_missing_cluster_waits_unless_it_holds_or_is_deleted() {
    let c = claim(&[]);
    let wait = cluster_wait(&c, false, false).expect("waits");
    assert_eq!(wait.reason, "ClusterNotFound");
    assert!(wait.message.contains("capi/edge"), "{}", wait.message);
    assert_eq!(cluster_wait(&c, false, true), None, "found: served");
    assert_eq!(cluster_wait(&c, true, false), None, "holds: keeps it");
    let mut deleted = c.clone();
    deleted.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
    assert_eq!(cluster_wait(&deleted, false, false), None, "released");
    let mut no_cluster = c;
    no_cluster.spec.cluster_name = None;
    assert_eq!(cluster_wait(&no_cluster, false, false), None, "names none");
}

#[test]
fn an_address_made_first_is_adopted_by_a_pin_of_its_own_address_or_refused_saying_why() {
    let p = two_dcs();
    let found =
        |claim_ref: &'static str, pool: Option<&'static str>, address: &'static str| Found {
            name: "m0-eth0",
            claim_ref,
            pool,
            address,
            prefix: 24,
        };
    let pin = adoption(
        "m0-eth0",
        "nodes",
        &p,
        "fra",
        &found("m0-eth0", Some("nodes"), "10.0.0.9"),
    )
    .expect("adopted");
    assert_eq!(
        pin,
        PoolOverride::PinnedAddresses(vec!["10.0.0.9".parse().unwrap()])
    );
    for (f, says) in [
        (found("other", Some("nodes"), "10.0.0.9"), "\"other\""),
        (found("m0-eth0", Some("else"), "10.0.0.9"), "IPAMPool else"),
        (found("m0-eth0", None, "10.0.0.9"), "no kipam pool"),
        (
            found("m0-eth0", Some("nodes"), "10.1.0.9"),
            "outside pool nodes",
        ),
        (found("m0-eth0", Some("nodes"), "ten"), "spec.address"),
    ] {
        let wait = adoption("m0-eth0", "nodes", &p, "fra", &f).expect_err("refused");
        assert_eq!(wait.reason, "AddressNotAdoptable");
        assert!(wait.message.contains(says), "{} lacks {says}", wait.message);
        assert!(
            wait.message.contains("IPAddress m0-eth0"),
            "{}",
            wait.message
        );
    }
    // A prefix pool adopts the subnet the address and prefix name.
    let nets = subnets();
    let sub = Found {
        name: "m0-eth0",
        claim_ref: "m0-eth0",
        pool: Some("nets"),
        address: "10.2.0.16",
        prefix: 28,
    };
    assert_eq!(
        adoption("m0-eth0", "nets", &nets, "fra", &sub),
        Ok(PoolOverride::PinnedCidr("10.2.0.16/28".parse().unwrap()))
    );
}
