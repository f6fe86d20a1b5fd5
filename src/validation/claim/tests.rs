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
    let missing = claim_input(&claim(&[]), "nodes", ClaimPool::Missing, None, false, None);
    assert_eq!(missing.wait.expect("waits").reason, "PoolNotFound");
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
