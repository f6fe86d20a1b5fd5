//! kipam as a Cluster API IPAM provider, end to end ([docs/capi.md](../../docs/capi.md)):
//! the real controller serves `IPAddressClaim`s whose `poolRef` names a kipam `IPAMPool`, with
//! Cluster API's own CRDs (`tests/fixtures/capi/`) installed into the seed as they are.
//!
//! Every test checks what a user of Cluster API would: the `IPAddress` the claim gets, the
//! claim's finalizer and status, and that nothing a claim holds is ever held by anyone else
//! (IPAddresses, IPAMAllocations and the pool records agree, see [`assert_consistent`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::api::{PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use kipam::resources::capi::{
    ADDRESS_FINALIZER, ANNOTATION_CAPI_PAUSED, ANNOTATION_CLAIM_DATACENTER,
    ANNOTATION_REQUESTED_ADDRESS, CLAIM_FINALIZER, IPAddress, IPAddressClaim,
    LABEL_CAPI_CLUSTER_NAME, claim_holder, claim_of_holder,
};
use kipam::resources::{IPAMAllocation, IPAMPoolRecord};

use super::support::Seed;

const WAIT: Duration = Duration::from_secs(20);

const CLAIM_CRDS: &str = include_str!("../fixtures/capi/capi-ipam-ipaddressclaims.yaml");
const ADDRESS_CRDS: &str = include_str!("../fixtures/capi/capi-ipam-ipaddresses.yaml");
const CLUSTER_CRDS: &str = include_str!("../fixtures/capi/capi-clusters.yaml");

/// Fully qualified: with Cluster API's CRDs installed, a bare `clusters` is ambiguous.
const CLAIMS: &str = "ipaddressclaims.ipam.cluster.x-k8s.io";
const ADDRESSES: &str = "ipaddresses.ipam.cluster.x-k8s.io";
const KIPAM_CLUSTERS: &str = "clusters.ipam.kipam.dev";
const NS: &str = "machines";

/// A seed with kipam's CRDs, Cluster API's, and the namespace `machines`.
pub async fn capi_seed(name: &str) -> Seed {
    let seed = Seed::start(name).await;
    for crds in [CLAIM_CRDS, ADDRESS_CRDS, CLUSTER_CRDS] {
        seed.apply(crds);
    }
    namespace(&seed, NS);
    seed
}

fn namespace(seed: &Seed, name: &str) {
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
        .expect("namespace");
}

/// Creates a v1beta2 claim of the kipam pool `pool`; `metadata` (labels, annotations) and
/// `spec` (e.g. `clusterName`) are merged in.
fn claim_in(seed: &Seed, ns: &str, name: &str, pool: &str, metadata: Value, spec: Value) {
    let mut obj = json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": pool}},
    });
    merge(&mut obj["metadata"], metadata);
    merge(&mut obj["spec"], spec);
    seed.api.create(&obj).expect("claim created");
}

fn claim(seed: &Seed, name: &str, pool: &str) {
    claim_in(seed, NS, name, pool, json!({}), json!({}));
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

fn get_claim(seed: &Seed, ns: &str, name: &str) -> Option<IPAddressClaim> {
    seed.get(CLAIMS, Some(ns), name)
        .map(|v| serde_json::from_value(v).expect("claim parses"))
}

fn get_address(seed: &Seed, ns: &str, name: &str) -> Option<IPAddress> {
    seed.get(ADDRESSES, Some(ns), name)
        .map(|v| serde_json::from_value(v).expect("IPAddress parses"))
}

/// The claim's `Ready` condition as `(status, reason)`.
fn ready(seed: &Seed, ns: &str, name: &str) -> Option<(String, String)> {
    let c = get_claim(seed, ns, name)?;
    let r = c
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")?;
    Some((r.status, r.reason))
}

fn ready_message(seed: &Seed, name: &str) -> String {
    get_claim(seed, NS, name)
        .and_then(|c| c.status)
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.message)
        .unwrap_or_default()
}

fn is_ready(seed: &Seed, ns: &str, name: &str) -> bool {
    ready(seed, ns, name).is_some_and(|(s, _)| s == "True")
}

fn not_ready_because(seed: &Seed, name: &str, reason: &str) -> bool {
    ready(seed, NS, name).is_some_and(|(s, r)| s == "False" && r == reason)
}

/// The address a claim got: its IPAddress exists and the claim is Ready.
fn address_of(seed: &Seed, ns: &str, name: &str) -> Option<String> {
    if !is_ready(seed, ns, name) {
        return None;
    }
    get_address(seed, ns, name).map(|a| a.spec.address)
}

async fn wait_served(seed: &Seed, log: &str, ns: &str, name: &str) -> String {
    seed.wait_for(&format!("claim {ns}/{name} served"), WAIT, log, |s| {
        address_of(s, ns, name).is_some()
    })
    .await;
    address_of(seed, ns, name).expect("served")
}

async fn wait_reason(seed: &Seed, log: &str, name: &str, reason: &str) {
    seed.wait_for(
        &format!("claim {name}: Ready=False {reason}"),
        WAIT,
        log,
        |s| not_ready_because(s, name, reason),
    )
    .await;
}

/// A claim kipam has not touched at all: no finalizer, no status, no IPAddress.
fn untouched(seed: &Seed, name: &str) -> bool {
    let Some(c) = get_claim(seed, NS, name) else {
        return false;
    };
    c.metadata.finalizers.unwrap_or_default().is_empty()
        && c.status.is_none()
        && get_address(seed, NS, name).is_none()
}

fn ip(s: &str) -> u128 {
    match s.parse::<IpAddr>().expect("an address") {
        IpAddr::V4(a) => u32::from(a).into(),
        IpAddr::V6(a) => a.into(),
    }
}

fn in_cidr(address: &str, cidr: &str) -> bool {
    let (net, len) = cidr.split_once('/').expect("a CIDR");
    let len: u32 = len.parse().expect("a prefix length");
    let width = if net.contains(':') { 128 } else { 32 };
    let size = 1u128 << (width - len);
    let first = ip(net);
    (first..first + size).contains(&ip(address))
}

/// `first-last`, `address` or `cidr` as an inclusive range.
fn span(piece: &str) -> (u128, u128) {
    if piece.contains('/') {
        let (net, len) = piece.split_once('/').expect("cidr");
        let width = if net.contains(':') { 128 } else { 32 };
        let len: u32 = len.parse().expect("len");
        let first = ip(net);
        return (first, first + (1u128 << (width - len)) - 1);
    }
    match piece.split_once('-') {
        Some((a, b)) => (ip(a), ip(b)),
        None => (ip(piece), ip(piece)),
    }
}

/// Every holder's pieces in the records of `pool`/`dc`, shards joined.
fn record_entries(seed: &Seed, pool: &str, dc: &str) -> BTreeMap<String, Vec<(u128, u128)>> {
    let mut out: BTreeMap<String, Vec<(u128, u128)>> = BTreeMap::new();
    for v in seed.api.list("ipampoolrecords", None) {
        let r: IPAMPoolRecord = serde_json::from_value(v).expect("record parses");
        if r.spec.pool != pool || r.spec.datacenter != dc {
            continue;
        }
        for (holder, entry) in r.spec.reservations {
            let pieces = out.entry(holder).or_default();
            pieces.extend(entry.cidr.iter().map(|c| span(c)));
            pieces.extend(entry.addresses.iter().map(|a| span(a)));
        }
    }
    out
}

fn all_records(seed: &Seed) -> BTreeSet<(String, String)> {
    seed.api
        .list("ipampoolrecords", None)
        .into_iter()
        .filter_map(|v| serde_json::from_value::<IPAMPoolRecord>(v).ok())
        .map(|r| (r.spec.pool, r.spec.datacenter))
        .collect()
}

/// The record of `pool`/`dc` holds `address` for the claim `ns/name`.
fn recorded_for_claim(
    seed: &Seed,
    pool: &str,
    dc: &str,
    ns: &str,
    name: &str,
    address: &str,
) -> bool {
    let a = ip(address);
    record_entries(seed, pool, dc)
        .get(&claim_holder(ns, name))
        .is_some_and(|p| p.iter().any(|(f, l)| (*f..=*l).contains(&a)))
}

/// An inclusive range of addresses and who holds it.
type Held = (u128, u128, String);

/// The checker over everything that holds addresses, per pool datacenter:
/// - no two holders' pieces in the records overlap;
/// - no two IPAddresses, nor an IPAddress and a cluster's allocation, share an address;
/// - every IPAddress kipam wrote lies in the record entry of its claim, and that claim exists;
/// - every cluster's allocation lies in the record entry of that cluster.
///
/// Returns the number of IPAddresses checked.
fn assert_consistent(seed: &Seed) -> usize {
    let mut held: BTreeMap<(String, String), Vec<Held>> = BTreeMap::new();
    let mut checked = 0;
    for v in seed.api.list(ADDRESSES, None) {
        let a: IPAddress = serde_json::from_value(v).expect("IPAddress parses");
        let labels = a.metadata.labels.clone().unwrap_or_default();
        let (Some(pool), Some(dc)) = (
            labels.get("ipam.kipam.dev/pool"),
            labels.get("ipam.kipam.dev/datacenter"),
        ) else {
            continue;
        };
        let ns = a.metadata.namespace.clone().unwrap_or_default();
        let name = a.metadata.name.clone().unwrap_or_default();
        assert!(
            recorded_for_claim(seed, pool, dc, &ns, &name, &a.spec.address),
            "IPAddress {ns}/{name} ({}) is not in record {pool}/{dc} under {}",
            a.spec.address,
            claim_holder(&ns, &name)
        );
        let (first, last) = span(&format!("{}/{}", a.spec.address, a.spec.prefix));
        let (first, last) = if is_prefix_pool(seed, pool, dc) {
            (first, last)
        } else {
            let at = ip(&a.spec.address);
            (at, at)
        };
        held.entry((pool.clone(), dc.clone())).or_default().push((
            first,
            last,
            format!("IPAddress {ns}/{name}"),
        ));
        checked += 1;
    }
    for v in seed.api.list("ipamallocations", None) {
        let a: IPAMAllocation = serde_json::from_value(v).expect("allocation parses");
        let s = kipam::validation::stored_allocation(&a).expect("allocation is valid");
        let Some(allocation) = s.held else { continue };
        let entries = record_entries(seed, &s.pool, &s.datacenter);
        let mine = entries.get(&s.cluster).cloned().unwrap_or_default();
        for r in allocation.ranges() {
            assert!(
                mine.iter().any(|(f, l)| *f <= r.first() && r.last() <= *l),
                "cluster {}'s allocation of {} is not in its record entry",
                s.cluster,
                s.pool
            );
            held.entry((s.pool.clone(), s.datacenter.clone()))
                .or_default()
                .push((r.first(), r.last(), format!("cluster {}", s.cluster)));
        }
    }
    // What users see first: two objects showing one address.
    for ((pool, dc), pieces) in held {
        no_overlap(&format!("objects of {pool}/{dc}"), pieces);
    }
    for (pool, dc) in all_records(seed) {
        let mut pieces: Vec<Held> = Vec::new();
        for (holder, spans) in record_entries(seed, &pool, &dc) {
            if let Some((ns, name)) = claim_of_holder(&holder) {
                assert!(
                    get_claim(seed, ns, name).is_some(),
                    "record {pool}/{dc} holds addresses for the claim {ns}/{name}, which is gone"
                );
            }
            pieces.extend(spans.into_iter().map(|(f, l)| (f, l, holder.clone())));
        }
        no_overlap(&format!("record {pool}/{dc}"), pieces);
    }
    checked
}

fn no_overlap(what: &str, mut pieces: Vec<Held>) {
    pieces.sort();
    for pair in pieces.windows(2) {
        assert!(
            pair[0].1 < pair[1].0,
            "{what}: {} and {} overlap",
            pair[0].2,
            pair[1].2
        );
    }
}

fn is_prefix_pool(seed: &Seed, pool: &str, dc: &str) -> bool {
    seed.get("ipampools", None, pool)
        .is_some_and(|p| p["spec"]["datacenters"][dc]["type"] == "prefix")
}

async fn client(seed: &Seed) -> kube::Client {
    let kc = Kubeconfig::from_yaml(&seed.api.kubeconfig_yaml()).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

fn dynamic(
    client: &kube::Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(client.clone(), NS, &ar)
}

/// A Cluster API `Cluster` in `machines`.
fn capi_cluster(seed: &Seed, name: &str, paused: bool, annotated: bool) {
    let mut obj = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"paused": paused},
    });
    if annotated {
        obj["metadata"]["annotations"] = json!({ANNOTATION_CAPI_PAUSED: ""});
    }
    seed.api.create(&obj).expect("Cluster API cluster created");
}

/// Merge-patches an object over HTTP, as `kubectl patch --type merge` would.
async fn merge_patch(api: Api<DynamicObject>, name: &str, patch: Value) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("merge patch");
}

const MACHINES_POOL: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: machines}
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.10.0.0/28
      allocationRange: 4
      network: {gateway: 10.10.0.254, prefixLength: 24}
";

/// a) A claim gets an IPAddress named like it, owned by it, protected, inside the pool, with
/// the prefix and gateway of the pool datacenter's network; the claim gets its finalizer and a
/// Ready status naming the address. A claim written as v1beta1 is served the same way; a claim
/// of another provider's pool is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_gets_an_ip_address_owned_by_it_with_the_pool_network() {
    let seed = capi_seed("capi-serve").await;
    seed.apply(MACHINES_POOL);
    let _ctl = seed.controller("ctl");
    claim(&seed, "web-0", "machines");
    let address = wait_served(&seed, "ctl", NS, "web-0").await;

    let claim_obj = get_claim(&seed, NS, "web-0").expect("claim");
    let pool = seed.get("ipampools", None, "machines").expect("pool");
    let ip_obj = get_address(&seed, NS, "web-0").expect("IPAddress");
    assert!(
        in_cidr(&address, "10.10.0.0/28"),
        "{address} inside the pool"
    );
    assert_eq!(ip_obj.spec.prefix, 24, "network.prefixLength");
    assert_eq!(ip_obj.spec.gateway.as_deref(), Some("10.10.0.254"));
    assert_eq!(ip_obj.spec.claim_ref.name, "web-0");
    assert_eq!(ip_obj.spec.pool_ref.kipam_pool(), Some("machines"));
    let labels = ip_obj.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("ipam.kipam.dev/pool").map(String::as_str),
        Some("machines")
    );
    assert_eq!(
        labels.get("ipam.kipam.dev/datacenter").map(String::as_str),
        Some("dc-1")
    );
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("kipam")
    );
    assert!(
        ip_obj
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|f| f == ADDRESS_FINALIZER),
        "IPAddress protected"
    );
    let owners = ip_obj.metadata.owner_references.clone().unwrap_or_default();
    let by_claim = owners
        .iter()
        .find(|o| o.kind == "IPAddressClaim")
        .expect("claim owns it");
    assert_eq!(by_claim.api_version, "ipam.cluster.x-k8s.io/v1beta2");
    assert_eq!(by_claim.name, "web-0");
    assert_eq!(Some(&by_claim.uid), claim_obj.metadata.uid.as_ref());
    assert_eq!(by_claim.controller, Some(true));
    assert_eq!(by_claim.block_owner_deletion, Some(true));
    let by_pool = owners
        .iter()
        .find(|o| o.kind == "IPAMPool")
        .expect("pool owns it");
    assert_eq!(by_pool.api_version, "ipam.kipam.dev/v1alpha1");
    assert_eq!(by_pool.name, "machines");
    assert_eq!(Some(by_pool.uid.as_str()), pool["metadata"]["uid"].as_str());
    assert_ne!(
        by_pool.controller,
        Some(true),
        "the pool is not the controller"
    );
    assert_eq!(owners.len(), 2);

    assert!(
        claim_obj
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|f| f == CLAIM_FINALIZER),
        "claim finalizer"
    );
    let status = claim_obj.status.clone().expect("claim status");
    assert_eq!(status.address_ref.map(|r| r.name).as_deref(), Some("web-0"));
    let (_, reason) = ready(&seed, NS, "web-0").expect("Ready");
    assert_eq!(reason, "AddressAllocated");
    let message = ready_message(&seed, "web-0");
    assert!(
        message.contains(&address) && message.contains("dc-1"),
        "message: {message}"
    );
    assert!(recorded_for_claim(
        &seed, "machines", "dc-1", NS, "web-0", &address
    ));

    // A claim written as v1beta1 (poolRef with apiGroup), as an older Cluster API writes it.
    let c = client(&seed).await;
    let v1beta1 = dynamic(
        &c,
        "ipam.cluster.x-k8s.io",
        "v1beta1",
        "IPAddressClaim",
        "ipaddressclaims",
    );
    let old: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta1",
        "kind": "IPAddressClaim",
        "metadata": {"name": "web-1", "namespace": NS},
        "spec": {"poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": "machines"}},
    }))
    .expect("claim json");
    v1beta1
        .create(&PostParams::default(), &old)
        .await
        .expect("v1beta1 claim created");
    // And a claim of another provider's pool of the same name, which kipam must not touch.
    claim_in(
        &seed,
        NS,
        "other",
        "machines",
        json!({}),
        json!({"poolRef": {"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "machines"}}),
    );

    let second = wait_served(&seed, "ctl", NS, "web-1").await;
    assert_ne!(second, address);
    assert!(in_cidr(&second, "10.10.0.0/28"));
    seed.wait_for("pool status counts both claims", WAIT, "ctl", |s| {
        s.get("ipampools", None, "machines")
            .is_some_and(|p| p["status"]["allocations"] == 2)
    })
    .await;
    assert!(
        untouched(&seed, "other"),
        "a claim of another provider's pool is left alone"
    );
    assert_eq!(settled(&seed).await, 2);
}

/// b) A claim of a paused Cluster API cluster (by `spec.paused`, or by the annotation; named
/// by `spec.clusterName` or by the older label) and a claim paused itself get nothing until
/// unpaused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_a_paused_cluster_get_nothing_until_it_is_unpaused() {
    let seed = capi_seed("capi-pause").await;
    seed.apply(MACHINES_POOL);
    capi_cluster(&seed, "by-spec", true, false);
    capi_cluster(&seed, "by-annotation", false, true);
    let _ctl = seed.controller("ctl");
    claim_in(
        &seed,
        NS,
        "a",
        "machines",
        json!({}),
        json!({"clusterName": "by-spec"}),
    );
    claim_in(
        &seed,
        NS,
        "b",
        "machines",
        json!({"labels": {LABEL_CAPI_CLUSTER_NAME: "by-annotation"}}),
        json!({}),
    );
    claim_in(
        &seed,
        NS,
        "c",
        "machines",
        json!({"annotations": {ANNOTATION_CAPI_PAUSED: ""}}),
        json!({}),
    );
    // A claim created after them, served: the controller has seen the paused ones by then.
    claim(&seed, "witness", "machines");
    wait_served(&seed, "ctl", NS, "witness").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for name in ["a", "b", "c"] {
        assert!(
            untouched(&seed, name),
            "paused claim {name} was touched:\n{}",
            seed.log("ctl")
        );
    }

    let c = client(&seed).await;
    let clusters = dynamic(&c, "cluster.x-k8s.io", "v1beta2", "Cluster", "clusters");
    merge_patch(
        clusters.clone(),
        "by-spec",
        json!({"spec": {"paused": false}}),
    )
    .await;
    wait_served(&seed, "ctl", NS, "a").await;
    assert!(untouched(&seed, "b") && untouched(&seed, "c"));
    merge_patch(
        clusters,
        "by-annotation",
        json!({"metadata": {"annotations": {ANNOTATION_CAPI_PAUSED: null}}}),
    )
    .await;
    wait_served(&seed, "ctl", NS, "b").await;
    assert!(untouched(&seed, "c"));
    let claims = dynamic(
        &c,
        "ipam.cluster.x-k8s.io",
        "v1beta2",
        "IPAddressClaim",
        "ipaddressclaims",
    );
    merge_patch(
        claims,
        "c",
        json!({"metadata": {"annotations": {ANNOTATION_CAPI_PAUSED: null}}}),
    )
    .await;
    wait_served(&seed, "ctl", NS, "c").await;
    assert_eq!(settled(&seed).await, 4);
}

/// b) A claim deleted while its cluster is paused keeps its address (and its IPAddress) until
/// the cluster is unpaused; then both go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_while_paused_waits_until_unpaused() {
    let seed = capi_seed("capi-pause-delete").await;
    seed.apply(MACHINES_POOL);
    capi_cluster(&seed, "workload", false, false);
    let _ctl = seed.controller("ctl");
    claim_in(
        &seed,
        NS,
        "a",
        "machines",
        json!({}),
        json!({"clusterName": "workload"}),
    );
    let address = wait_served(&seed, "ctl", NS, "a").await;

    let c = client(&seed).await;
    let clusters = dynamic(&c, "cluster.x-k8s.io", "v1beta2", "Cluster", "clusters");
    merge_patch(
        clusters.clone(),
        "workload",
        json!({"spec": {"paused": true}}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    seed.delete(CLAIMS, Some(NS), "a");
    claim(&seed, "witness", "machines");
    wait_served(&seed, "ctl", NS, "witness").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = get_claim(&seed, NS, "a").expect("the paused claim is still there");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(
        get_address(&seed, NS, "a").map(|a| a.spec.address),
        Some(address.clone()),
        "its IPAddress stays while paused"
    );
    assert!(recorded_for_claim(
        &seed, "machines", "dc-1", NS, "a", &address
    ));

    merge_patch(clusters, "workload", json!({"spec": {"paused": false}})).await;
    seed.wait_for("the claim and its IPAddress gone", WAIT, "ctl", |s| {
        get_claim(s, NS, "a").is_none() && get_address(s, NS, "a").is_none()
    })
    .await;
    assert!(!recorded_for_claim(
        &seed, "machines", "dc-1", NS, "a", &address
    ));
    assert_eq!(settled(&seed).await, 1);
}

/// c) Deleting a claim releases its address: kipam deletes the IPAddress *before* it lets the
/// claim go (so no garbage collector is needed), and the address is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_claim_loses_its_ip_address_first_then_goes() {
    let seed = capi_seed("capi-delete").await;
    seed.apply(MACHINES_POOL);
    let _ctl = seed.controller("ctl");
    claim(&seed, "web-0", "machines");
    let address = wait_served(&seed, "ctl", NS, "web-0").await;

    let c = client(&seed).await;
    let ips = dynamic(
        &c,
        "ipam.cluster.x-k8s.io",
        "v1beta2",
        "IPAddress",
        "ipaddresses",
    );
    let claims = dynamic(
        &c,
        "ipam.cluster.x-k8s.io",
        "v1beta2",
        "IPAddressClaim",
        "ipaddressclaims",
    );
    let rv = seed.api.resource_version().to_string();
    let mut ip_events = ips
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    let mut claim_events = claims
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    seed.delete(CLAIMS, Some(NS), "web-0");

    let claim_gone = deleted_rv(&mut claim_events).await;
    let ip_gone = deleted_rv(&mut ip_events).await;
    let (Some(claim_gone), Some(ip_gone)) = (claim_gone, ip_gone) else {
        panic!(
            "claim deleted at {claim_gone:?}, IPAddress at {ip_gone:?}\n{}",
            seed.log("ctl")
        );
    };
    assert!(
        ip_gone < claim_gone,
        "the IPAddress goes before the claim (rv {ip_gone} vs {claim_gone})"
    );
    assert_eq!(settled(&seed).await, 0);
    assert!(!recorded_for_claim(
        &seed, "machines", "dc-1", NS, "web-0", &address
    ));
    assert!(
        !record_entries(&seed, "machines", "dc-1").contains_key(&claim_holder(NS, "web-0")),
        "no record entry left for the claim"
    );
}

/// [`assert_consistent`] once the record has let go of the claims that are gone: kipam drops a
/// released claim's entry on the pass after its `IPAddress` is gone (never before), so the
/// entry outlives the claim by a pass. Overlaps are never waited out: any is a failure.
async fn settled(seed: &Seed) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        let leftover = all_records(seed).into_iter().any(|(pool, dc)| {
            record_entries(seed, &pool, &dc).keys().any(|holder| {
                claim_of_holder(holder)
                    .is_some_and(|(ns, name)| get_claim(seed, ns, name).is_none())
            })
        });
        if !leftover || Instant::now() > deadline {
            return assert_consistent(seed);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The resource version of the next DELETED event of a watch.
async fn deleted_rv(
    events: &mut futures::stream::BoxStream<'static, kube::Result<WatchEvent<DynamicObject>>>,
) -> Option<u64> {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(1), events.next()).await {
            Ok(Some(Ok(WatchEvent::Deleted(o)))) => {
                return o.metadata.resource_version.and_then(|v| v.parse().ok());
            }
            Ok(None) => return None,
            _ => {}
        }
    }
    None
}

/// Four addresses a machine may have: 10.20.0.1-10.20.0.4 (the /29's network and broadcast
/// addresses are no machine's; .5 and .6 excluded).
const TINY_POOL: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: tiny}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.20.0.0/29, excludeRanges: [10.20.0.5-10.20.0.6], allocationRange: 1}
";

/// c) With `reuseAfter`, a released address is kept from new claims until the quarantine
/// ends, and a claim re-created with the same namespace and name meanwhile gets it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_address_returns_to_its_claim_and_waits_for_others() {
    let seed = capi_seed("capi-quarantine").await;
    seed.apply(&TINY_POOL.replace("allocationRange: 1}", "allocationRange: 1, reuseAfter: 8s}"));
    let _ctl = seed.controller("ctl");
    for name in ["a", "b", "c", "d"] {
        claim(&seed, name, "tiny");
    }
    let mut taken = BTreeSet::new();
    for name in ["a", "b", "c", "d"] {
        taken.insert(wait_served(&seed, "ctl", NS, name).await);
    }
    assert_eq!(taken.len(), 4, "four distinct addresses fill the pool");
    let b_address = address_of(&seed, NS, "b").expect("b");

    seed.delete(CLAIMS, Some(NS), "b");
    seed.wait_for("b gone", WAIT, "ctl", |s| get_claim(s, NS, "b").is_none())
        .await;
    let released = Instant::now();
    claim(&seed, "e", "tiny");
    wait_reason(&seed, "ctl", "e", "PoolExhausted").await;
    assert!(get_address(&seed, NS, "e").is_none());

    // b comes back within the quarantine: its old address.
    claim(&seed, "b", "tiny");
    assert_eq!(wait_served(&seed, "ctl", NS, "b").await, b_address);
    assert!(
        released.elapsed() < Duration::from_secs(8),
        "checked within the quarantine"
    );
    assert!(not_ready_because(&seed, "e", "PoolExhausted"));

    // Released again: e waits for the quarantine's end, then gets it.
    seed.delete(CLAIMS, Some(NS), "b");
    seed.wait_for("b gone again", WAIT, "ctl", |s| {
        get_claim(s, NS, "b").is_none()
    })
    .await;
    let released = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        address_of(&seed, NS, "e").is_none(),
        "e got a quarantined address {:?} after {:?}",
        address_of(&seed, NS, "e"),
        released.elapsed()
    );
    assert_eq!(wait_served(&seed, "ctl", NS, "e").await, b_address);
    assert!(
        released.elapsed() >= Duration::from_secs(7),
        "not before the quarantine ends"
    );
    assert_eq!(settled(&seed).await, 4);
}

/// d) A claim of a pool that does not exist yet says so, and is served once it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_made_before_its_pool_is_served_when_the_pool_appears() {
    let seed = capi_seed("capi-pool-later").await;
    let _ctl = seed.controller("ctl");
    claim(&seed, "early", "machines");
    wait_reason(&seed, "ctl", "early", "PoolNotReady").await;
    assert!(get_address(&seed, NS, "early").is_none());
    assert!(
        !ready_message(&seed, "early").is_empty(),
        "the message says what to do"
    );
    seed.apply(MACHINES_POOL);
    let address = wait_served(&seed, "ctl", NS, "early").await;
    assert!(in_cidr(&address, "10.10.0.0/28"));
    assert_eq!(settled(&seed).await, 1);
}

const TWO_DC_POOL: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: two}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.41.0.0/28, allocationRange: 2}
    dc-2: {type: range, poolCidr: 10.42.0.0/28, allocationRange: 2}
";

/// d) The datacenter: the claim's annotation, else the kipam Cluster named like the claim's
/// cluster, else the pool's only one; several and none named is ambiguous, and a datacenter
/// the pool lacks is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_datacenter_comes_from_the_annotation_or_the_kipam_cluster_never_a_guess() {
    let seed = capi_seed("capi-datacenter").await;
    seed.apply(TWO_DC_POOL);
    seed.cluster("edge", "dc-2");
    // The claims' Cluster API Cluster (kipam's `Cluster` of the same name gives the datacenter).
    capi_cluster(&seed, "edge", false, false);
    let _ctl = seed.controller("ctl");
    claim(&seed, "vague", "two");
    claim_in(
        &seed,
        NS,
        "annotated",
        "two",
        json!({"annotations": {ANNOTATION_CLAIM_DATACENTER: "dc-2"}}),
        json!({}),
    );
    claim_in(
        &seed,
        NS,
        "of-edge",
        "two",
        json!({}),
        json!({"clusterName": "edge"}),
    );
    claim_in(
        &seed,
        NS,
        "of-edge-label",
        "two",
        json!({"labels": {LABEL_CAPI_CLUSTER_NAME: "edge"}, "annotations": {ANNOTATION_CLAIM_DATACENTER: "dc-1"}}),
        json!({}),
    );
    claim_in(
        &seed,
        NS,
        "nowhere",
        "two",
        json!({"annotations": {ANNOTATION_CLAIM_DATACENTER: "dc-9"}}),
        json!({}),
    );

    wait_reason(&seed, "ctl", "vague", "DatacenterAmbiguous").await;
    wait_reason(&seed, "ctl", "nowhere", "DatacenterUnknown").await;
    assert!(
        get_address(&seed, NS, "vague").is_none() && get_address(&seed, NS, "nowhere").is_none()
    );
    let annotated = wait_served(&seed, "ctl", NS, "annotated").await;
    assert!(in_cidr(&annotated, "10.42.0.0/28"), "{annotated} from dc-2");
    let of_edge = wait_served(&seed, "ctl", NS, "of-edge").await;
    assert!(
        in_cidr(&of_edge, "10.42.0.0/28"),
        "{of_edge} from edge's dc-2"
    );
    assert_eq!(
        get_address(&seed, NS, "of-edge")
            .and_then(|a| a.metadata.labels)
            .and_then(|l| l.get("ipam.kipam.dev/datacenter").cloned())
            .as_deref(),
        Some("dc-2")
    );
    let over = wait_served(&seed, "ctl", NS, "of-edge-label").await;
    assert!(
        in_cidr(&over, "10.41.0.0/28"),
        "the annotation wins over the cluster: {over}"
    );

    // Naming the datacenter resolves the ambiguity.
    let c = client(&seed).await;
    let claims = dynamic(
        &c,
        "ipam.cluster.x-k8s.io",
        "v1beta2",
        "IPAddressClaim",
        "ipaddressclaims",
    );
    merge_patch(
        claims,
        "vague",
        json!({"metadata": {"annotations": {ANNOTATION_CLAIM_DATACENTER: "dc-1"}}}),
    )
    .await;
    let resolved = wait_served(&seed, "ctl", NS, "vague").await;
    assert!(in_cidr(&resolved, "10.41.0.0/28"));
    assert!(not_ready_because(&seed, "nowhere", "DatacenterUnknown"));
    assert!(seed.get(KIPAM_CLUSTERS, None, "edge").is_some());
    assert_eq!(settled(&seed).await, 4);
}

/// e) A claim beyond the pool's capacity waits (PoolExhausted) and is served as soon as
/// another claim's address is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_beyond_capacity_is_served_when_another_is_deleted() {
    let seed = capi_seed("capi-full").await;
    seed.apply(TINY_POOL);
    let _ctl = seed.controller("ctl");
    for name in ["a", "b", "c", "d"] {
        claim(&seed, name, "tiny");
    }
    for name in ["a", "b", "c", "d"] {
        wait_served(&seed, "ctl", NS, name).await;
    }
    claim(&seed, "e", "tiny");
    wait_reason(&seed, "ctl", "e", "PoolExhausted").await;
    assert!(get_address(&seed, NS, "e").is_none());
    let c_address = address_of(&seed, NS, "c").expect("c");
    // Every IPAddress event from here on, in the API server's order.
    let ips = dynamic(
        &client(&seed).await,
        "ipam.cluster.x-k8s.io",
        "v1beta2",
        "IPAddress",
        "ipaddresses",
    );
    let rv = seed.api.resource_version().to_string();
    let mut events = ips
        .watch(&WatchParams::default(), &rv)
        .await
        .expect("watch")
        .boxed();
    let mut live: BTreeMap<String, String> = get_addresses(&seed);
    seed.delete(CLAIMS, Some(NS), "c");
    assert_eq!(wait_served(&seed, "ctl", NS, "e").await, c_address);
    // At no moment did two IPAddresses show c's address: e's was created only once c's was
    // gone (without a quarantine the address goes straight to the claim that waits).
    while let Ok(Some(Ok(event))) =
        tokio::time::timeout(Duration::from_millis(300), events.next()).await
    {
        match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                let name = o.metadata.name.clone().unwrap_or_default();
                let address = o.data["spec"]["address"].as_str().unwrap_or("").to_string();
                live.insert(name, address);
            }
            WatchEvent::Deleted(o) => {
                live.remove(&o.metadata.name.clone().unwrap_or_default());
            }
            _ => {}
        }
        let holders: Vec<&String> = live
            .iter()
            .filter(|(_, a)| **a == c_address)
            .map(|(n, _)| n)
            .collect();
        assert!(
            holders.len() <= 1,
            "{c_address} shown by {holders:?} at once"
        );
    }
    assert_eq!(live.get("e"), Some(&c_address));
    assert!(!live.contains_key("c"));
    assert_eq!(settled(&seed).await, 4);
}

/// Every IPAddress of the namespace, by name, with its address.
fn get_addresses(seed: &Seed) -> BTreeMap<String, String> {
    seed.api
        .list(ADDRESSES, Some(NS))
        .into_iter()
        .filter_map(|v| {
            Some((
                v["metadata"]["name"].as_str()?.to_string(),
                v["spec"]["address"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// f) `ipam.kipam.dev/requested-address`: honoured when free, refused when a cluster's range
/// holds it or it lies outside the pool, and refused as invalid when it does not parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_address_is_honoured_only_when_free() {
    let seed = capi_seed("capi-requested").await;
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: lan}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.30.0.0/28, allocationRange: 4}
",
    );
    seed.cluster("c1", "dc-1");
    let _ctl = seed.controller("ctl");
    seed.wait_for("c1 allocated", WAIT, "ctl", |s| {
        s.phase("c1", "lan") == "Allocated"
    })
    .await;
    let held_by_c1 = seed.held("c1", "lan");
    let first_of_c1 = held_by_c1
        .split(['-', ','])
        .next()
        .expect("an address")
        .to_string();
    let requested = |value: &str| json!({"annotations": {ANNOTATION_REQUESTED_ADDRESS: value}});
    claim_in(&seed, NS, "free", "lan", requested("10.30.0.9"), json!({}));
    claim_in(
        &seed,
        NS,
        "taken",
        "lan",
        requested(&first_of_c1),
        json!({}),
    );
    claim_in(
        &seed,
        NS,
        "outside",
        "lan",
        requested("192.168.7.1"),
        json!({}),
    );
    claim_in(
        &seed,
        NS,
        "garbage",
        "lan",
        requested("ten.thirty"),
        json!({}),
    );

    assert_eq!(wait_served(&seed, "ctl", NS, "free").await, "10.30.0.9");
    wait_reason(&seed, "ctl", "taken", "RequestedAddressUnavailable").await;
    wait_reason(&seed, "ctl", "outside", "RequestedAddressUnavailable").await;
    wait_reason(&seed, "ctl", "garbage", "RequestedAddressInvalid").await;
    for name in ["taken", "outside", "garbage"] {
        assert!(
            get_address(&seed, NS, name).is_none(),
            "{name} has no IPAddress"
        );
    }
    assert_eq!(seed.held("c1", "lan"), held_by_c1, "c1 keeps its range");
    assert_eq!(settled(&seed).await, 1);
}

/// g) Claims and clusters' `allocationRange` blocks in one pool datacenter, created, grown
/// and deleted interleaved: nothing ever overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_and_cluster_ranges_share_a_pool_without_overlap() {
    let seed = capi_seed("capi-mixed").await;
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: shared}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.50.0.0/26, allocationRange: 3}
",
    );
    namespace(&seed, "other");
    let _ctl = seed.controller("ctl");
    for i in 0..8 {
        seed.cluster(&format!("k{i}"), "dc-1");
        claim(&seed, &format!("m{i}"), "shared");
        claim_in(
            &seed,
            "other",
            &format!("m{i}"),
            "shared",
            json!({}),
            json!({}),
        );
    }
    seed.wait_for("every cluster and claim served", WAIT, "ctl", |s| {
        (0..8).all(|i| {
            s.phase(&format!("k{i}"), "shared") == "Allocated"
                && address_of(s, NS, &format!("m{i}")).is_some()
                && address_of(s, "other", &format!("m{i}")).is_some()
        })
    })
    .await;
    assert_eq!(settled(&seed).await, 16);

    // Churn: some go, more come, both kinds.
    for i in (0..8).step_by(2) {
        seed.delete(KIPAM_CLUSTERS, None, &format!("k{i}"));
        seed.delete(CLAIMS, Some(NS), &format!("m{i}"));
    }
    for i in 8..12 {
        claim(&seed, &format!("m{i}"), "shared");
        seed.cluster(&format!("k{i}"), "dc-1");
    }
    seed.wait_for("the churn settles", WAIT, "ctl", |s| {
        (8..12).all(|i| {
            s.phase(&format!("k{i}"), "shared") == "Allocated"
                && address_of(s, NS, &format!("m{i}")).is_some()
        }) && (0..8)
            .step_by(2)
            .all(|i| get_claim(s, NS, &format!("m{i}")).is_none())
    })
    .await;
    assert_eq!(settled(&seed).await, 16);
}

/// h) Two controllers; the leader is killed while ~100 claims arrive. Every claim ends
/// Ready, nothing overlaps, and every IPAddress is in the pool record under its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_arriving_across_a_leader_change_are_all_served_once() {
    let seed = capi_seed("capi-leader").await;
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: big}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.60.0.0/24, allocationRange: 4}
",
    );
    let mut a = seed.controller("ctl-a");
    let mut b = seed.controller("ctl-b");
    seed.wait_for("a leader", WAIT, "ctl-a", |s| !s.lease_holder().is_empty())
        .await;
    for i in 0..4 {
        seed.cluster(&format!("k{i}"), "dc-1");
    }
    const N: usize = 100;
    for i in 0..N {
        claim(&seed, &format!("vm-{i:03}"), "big");
        if i == 40 {
            let leader = seed.lease_holder();
            let log = leader.clone();
            seed.wait_for("some claims served before the kill", WAIT, &log, |s| {
                address_of(s, NS, "vm-000").is_some()
            })
            .await;
            if leader == "ctl-a" {
                a.kill();
            } else {
                b.kill();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let survivor = if a.is_running() { "ctl-a" } else { "ctl-b" };
    seed.wait_for(
        "every claim Ready",
        Duration::from_secs(25),
        survivor,
        |s| (0..N).all(|i| address_of(s, NS, &format!("vm-{i:03}")).is_some()),
    )
    .await;
    let addresses: BTreeSet<String> = (0..N)
        .filter_map(|i| address_of(&seed, NS, &format!("vm-{i:03}")))
        .collect();
    assert_eq!(addresses.len(), N, "{N} distinct addresses");
    assert_eq!(settled(&seed).await, N);
    assert_eq!(seed.lease_holder(), survivor);
}

/// The checker the tests above rely on does see an address held twice, and says so: with the
/// controller stopped (nothing it does can race the forgeries), a claim's `IPAddress` written
/// by hand inside a cluster's range, with a record entry of that claim holding the address
/// (so it passes the checks before), is an overlap of the objects; without the `IPAddress`,
/// the record entry alone is an overlap of the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consistency_checker_sees_an_address_held_twice() {
    let seed = capi_seed("capi-checker").await;
    seed.apply(
        TINY_POOL
            .replace("allocationRange: 1", "allocationRange: 2")
            .as_str(),
    );
    seed.cluster("c1", "dc-1");
    let mut ctl = seed.controller("ctl");
    seed.wait_for("c1 allocated", WAIT, "ctl", |s| {
        s.phase("c1", "tiny") == "Allocated"
    })
    .await;
    assert_eq!(settled(&seed).await, 0);
    ctl.kill();
    let first = seed
        .held("c1", "tiny")
        .split(['-', ','])
        .next()
        .expect("an address")
        .to_string();
    claim_in(&seed, NS, "forged", "tiny", json!({}), json!({}));
    // The claim's record entry, holding c1's first address.
    let mut record = seed
        .api
        .list("ipampoolrecords", None)
        .into_iter()
        .find(|r| r["spec"]["pool"] == "tiny" && r["spec"]["datacenter"] == "dc-1")
        .expect("the record of tiny/dc-1");
    record["spec"]["reservations"][claim_holder(NS, "forged")] = json!({"addresses": [first]});
    seed.api.apply(&record).expect("forged record entry");
    seed.api
        .create(&json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "kind": "IPAddress",
            "metadata": {"name": "forged", "namespace": NS, "labels": {
                "ipam.kipam.dev/pool": "tiny", "ipam.kipam.dev/datacenter": "dc-1",
            }},
            "spec": {
                "claimRef": {"name": "forged"},
                "poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": "tiny"},
                "address": first,
                "prefix": 30,
            },
        }))
        .expect("forged IPAddress");
    assert!(recorded_for_claim(
        &seed, "tiny", "dc-1", NS, "forged", &first
    ));
    assert_eq!(
        checker_failure(&seed),
        format!("objects of tiny/dc-1: IPAddress {NS}/forged and cluster c1 overlap")
    );
    // The record alone.
    seed.delete(ADDRESSES, Some(NS), "forged");
    assert_eq!(
        checker_failure(&seed),
        format!(
            "record tiny/dc-1: {} and c1 overlap",
            claim_holder(NS, "forged")
        )
    );
}

/// The message [`assert_consistent`] fails with on the seed as it is; fails the test when it
/// passes.
fn checker_failure(seed: &Seed) -> String {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| assert_consistent(seed)));
    match caught {
        Ok(n) => panic!("the checker passed ({n} IPAddresses) a forged address held twice"),
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".to_string()),
    }
}

/// `docs/capi.md`'s example, applied as it is: the addresses the page shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_example_gives_the_documented_addresses() {
    let seed = capi_seed("capi-example").await;
    let _ctl = seed.controller("ctl");
    seed.apply(include_str!("../../docs/examples/capi.yaml"));
    let doc = include_str!("../../docs/capi.md");
    for (name, address) in [
        ("edge-1-cp-0-eth0", "10.20.0.2"),
        ("edge-1-lb-0-eth0", "10.20.0.200"),
    ] {
        assert_eq!(
            wait_served(&seed, "ctl", "edge-clusters", name).await,
            address
        );
        let a = get_address(&seed, "edge-clusters", name).expect("IPAddress");
        assert_eq!(a.spec.prefix, 22);
        assert_eq!(a.spec.gateway.as_deref(), Some("10.20.0.1"));
        let row = format!("{name}   {address}");
        assert!(
            doc.lines()
                .any(|l| l.starts_with(&row) && l.contains(" 22 ") && l.ends_with("10.20.0.1")),
            "docs/capi.md shows no row {row:?} with prefix 22 and gateway 10.20.0.1"
        );
    }
    assert_eq!(settled(&seed).await, 2);
}

/// A new claim in a quiet seed takes the short pass (served from the kept allocators, its
/// entry committed alone) rather than a plan of the whole seed, and is written as fully as
/// by the full pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_claim_in_a_quiet_seed_takes_the_short_pass() {
    let seed = capi_seed("capi-short").await;
    seed.apply(MACHINES_POOL);
    seed.cluster("alpha", "dc-1");
    let _ctl = seed.controller("ctl");
    claim(&seed, "first", "machines");
    wait_served(&seed, "ctl", NS, "first").await;
    // Quiet: no pass for a while (under load the passes that follow the first claim, its
    // status and the pool's, can take longer than any fixed sleep).
    let passes = |seed: &Seed| seed.full_log("ctl").matches("pass done").count();
    let mut seen = passes(&seed);
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = passes(&seed);
        if now == seen {
            break;
        }
        seen = now;
    }
    let before = seed
        .full_log("ctl")
        .matches("short pass steps for claims")
        .count();
    claim(&seed, "second", "machines");
    let address = wait_served(&seed, "ctl", NS, "second").await;
    let log = seed.full_log("ctl");
    assert!(
        log.matches("short pass steps for claims").count() > before,
        "the new claim took no short pass:\n{}",
        seed.log("ctl")
    );
    let c = get_claim(&seed, NS, "second").expect("claim");
    assert!(
        c.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&CLAIM_FINALIZER.to_string())
    );
    assert!(recorded_for_claim(
        &seed, "machines", "dc-1", NS, "second", &address
    ));
    // The two claims' addresses (the cluster's range is checked, not counted).
    assert_eq!(settled(&seed).await, 2);
}

/// Claims are seen where pools are seen: the pool's status and `Claims` column, the
/// `kipam_claims` series, the REST API's allocations (with namespace and name) and usage, and
/// the address lookup (which names the claim, not "free").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_counted_and_listed_where_pools_are_seen() {
    let seed = capi_seed("capi-seen").await;
    super::api::script_auth(&seed);
    seed.apply(MACHINES_POOL);
    seed.cluster("alpha", "dc-1");
    let ctl = seed.controller("ctl");
    claim(&seed, "m0", "machines");
    let address = wait_served(&seed, "ctl", NS, "m0").await;
    seed.wait_for("pool status counts the claim", WAIT, "ctl", |s| {
        s.get("ipampools.ipam.kipam.dev", None, "machines")
            .is_some_and(|p| p.pointer("/status/claims") == Some(&json!(1)))
    })
    .await;
    let pool = seed
        .get("ipampools.ipam.kipam.dev", None, "machines")
        .expect("pool");
    assert_eq!(
        pool.pointer("/status/allocations"),
        Some(&json!(2)),
        "{pool}"
    );
    assert_eq!(
        pool.pointer("/status/datacenters/dc-1/claims"),
        Some(&json!(1)),
        "{pool}"
    );
    assert_eq!(
        Seed::metric(
            ctl.metrics_port,
            "kipam_claims{pool=\"machines\",datacenter=\"dc-1\"}"
        )
        .await,
        Some(1.0)
    );
    let base = "/api/v2/seeds/seed/ipampools/machines";
    let (code, list) = super::api::http(
        ctl.api_port,
        "GET",
        &format!("{base}/allocations"),
        Some("reader-token"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{list}");
    let claims: Vec<&Value> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter(|a| a.get("claim").is_some())
        .collect();
    assert_eq!(claims.len(), 1, "{list}");
    assert_eq!(claims[0]["claim"], json!({"namespace": NS, "name": "m0"}));
    assert_eq!(claims[0]["addresses"], json!([address]));
    let (code, view) =
        super::api::http(ctl.api_port, "GET", base, Some("reader-token"), None).await;
    assert_eq!(code, 200, "{view}");
    assert_eq!(
        view["datacenters"]["dc-1"]["usage"]["claims"],
        json!(1),
        "{view}"
    );
    let (code, found) = super::api::http(
        ctl.api_port,
        "GET",
        &format!("/api/v2/seeds/seed/addresses/{address}"),
        Some("reader-token"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{found}");
    assert!(
        found.to_string().contains(&claim_holder(NS, "m0")),
        "the lookup names the claim: {found}"
    );
    // The pool page's detail of the datacenter lists the claim among the holders.
    let (code, detail) = super::api::http(
        ctl.api_port,
        "GET",
        "/ui/api/pools/machines/datacenters/dc-1",
        Some("reader-token"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{detail}");
    assert!(
        detail.to_string().contains(&claim_holder(NS, "m0")),
        "the page lists the claim: {detail}"
    );
}

/// Two replicas; the leader is frozen (SIGSTOP) past its lease while claims and clusters keep
/// arriving, the other takes over, and the frozen one thaws in the middle of it: at every
/// look, no address is held twice and every `IPAddress` is in its claim's record entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_thawing_hands_no_claim_address_out_twice() {
    let seed = capi_seed("capi-sigstop").await;
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: big}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.70.0.0/24, allocationRange: 4}
",
    );
    let ctls = [seed.controller("r0"), seed.controller("r1")];
    seed.wait_for("a leader", WAIT, "r0", |s| !s.lease_holder().is_empty())
        .await;
    let idx = if seed.lease_holder() == "r0" { 0 } else { 1 };
    let claims = std::cell::Cell::new(0usize);
    let more = |seed: &Seed, n: usize| {
        for _ in 0..n {
            let i = claims.get();
            claim(seed, &format!("vm-{i:03}"), "big");
            claims.set(i + 1);
            if i.is_multiple_of(3) {
                seed.cluster(&format!("k{:02}", i / 3), "dc-1");
            }
        }
    };
    more(&seed, 20);
    tokio::time::sleep(Duration::from_millis(150)).await;
    ctls[idx].signal("STOP");
    assert_consistent(&seed);
    more(&seed, 15);
    let other = format!("r{}", 1 - idx);
    // The takeover, confirmed: what follows is served by the other replica while the frozen
    // one still believes it leads.
    seed.wait_leader(&other, Duration::from_secs(20)).await;
    let served =
        |s: &Seed, n: usize| (0..n).all(|i| address_of(s, NS, &format!("vm-{i:03}")).is_some());
    let n = claims.get();
    seed.wait_for(
        "the other replica serves every claim",
        Duration::from_secs(40),
        &other,
        |s| served(s, n),
    )
    .await;
    assert_consistent(&seed);
    more(&seed, 10);
    ctls[idx].signal("CONT");
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_consistent(&seed);
    }
    let n = claims.get();
    seed.wait_for(
        "everything converges",
        Duration::from_secs(40),
        &other,
        |s| served(s, n),
    )
    .await;
    let addresses: BTreeSet<String> = (0..n)
        .filter_map(|i| address_of(&seed, NS, &format!("vm-{i:03}")))
        .collect();
    assert_eq!(addresses.len(), n, "{n} distinct addresses");
    assert_eq!(settled(&seed).await, n);
}

// ---- Issue 36: held to Cluster API's contract and the reference provider ----

/// A hand-made `IPAddress` in `machines` (no `managed-by` label: not kipam's).
fn hand_made(seed: &Seed, name: &str, claim_ref: &str, pool: &str, address: &str, prefix: i32) {
    seed.api
        .create(&json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "kind": "IPAddress",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "claimRef": {"name": claim_ref},
                "poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": pool},
                "address": address,
                "prefix": prefix,
            },
        }))
        .expect("hand-made IPAddress");
}

fn uid_of(seed: &Seed, resource: &str, name: &str) -> Option<String> {
    seed.get(resource, Some(NS), name)
        .and_then(|v| v["metadata"]["uid"].as_str().map(str::to_string))
}

fn resource_version_of(seed: &Seed, resource: &str, name: &str) -> Option<String> {
    seed.get(resource, Some(NS), name).and_then(|v| {
        v["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string)
    })
}

/// 36.2: a claim whose Cluster API `Cluster` does not exist waits (`ClusterNotFound`, naming
/// it) and is served once the Cluster exists and is not paused. A claim that holds an address
/// keeps it when its Cluster goes (a lagging cache must never free it), and a claim being
/// deleted is still released without its Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_a_missing_cluster_waits_and_a_held_address_outlives_its_cluster() {
    let seed = capi_seed("capi-no-cluster").await;
    seed.apply(MACHINES_POOL);
    capi_cluster(&seed, "there", false, false);
    let _ctl = seed.controller("ctl");
    claim_in(
        &seed,
        NS,
        "held",
        "machines",
        json!({}),
        json!({"clusterName": "there"}),
    );
    let held = wait_served(&seed, "ctl", NS, "held").await;
    claim_in(
        &seed,
        NS,
        "ghost-0",
        "machines",
        json!({}),
        json!({"clusterName": "ghost"}),
    );
    claim_in(
        &seed,
        NS,
        "ghost-1",
        "machines",
        json!({"labels": {LABEL_CAPI_CLUSTER_NAME: "ghost"}}),
        json!({}),
    );
    for name in ["ghost-0", "ghost-1"] {
        wait_reason(&seed, "ctl", name, "ClusterNotFound").await;
        assert!(
            get_address(&seed, NS, name).is_none(),
            "{name} got an address"
        );
        let message = ready_message(&seed, name);
        assert!(
            message.contains("machines/ghost"),
            "names the Cluster: {message}"
        );
    }
    // The Cluster appears paused: still nothing; unpaused: served.
    capi_cluster(&seed, "ghost", true, false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        get_address(&seed, NS, "ghost-0").is_none(),
        "served while paused"
    );
    let c = client(&seed).await;
    let clusters = dynamic(&c, "cluster.x-k8s.io", "v1beta2", "Cluster", "clusters");
    merge_patch(
        clusters.clone(),
        "ghost",
        json!({"spec": {"paused": false}}),
    )
    .await;
    wait_served(&seed, "ctl", NS, "ghost-0").await;
    wait_served(&seed, "ctl", NS, "ghost-1").await;

    // The Cluster of a claim that holds an address goes: the address stays the claim's.
    clusters
        .delete("there", &Default::default())
        .await
        .expect("Cluster deleted");
    claim(&seed, "witness", "machines");
    wait_served(&seed, "ctl", NS, "witness").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(address_of(&seed, NS, "held"), Some(held.clone()), "kept");
    assert!(recorded_for_claim(
        &seed, "machines", "dc-1", NS, "held", &held
    ));
    // Deleted without its Cluster: released all the same.
    seed.delete(CLAIMS, Some(NS), "held");
    seed.wait_for("the claim and its IPAddress gone", WAIT, "ctl", |s| {
        get_claim(s, NS, "held").is_none() && get_address(s, NS, "held").is_none()
    })
    .await;
    assert_eq!(settled(&seed).await, 3);
}

/// 36.3: an `IPAddress` made before its claim (naming the claim and the kipam pool, inside the
/// pool, held by nobody else) is adopted: same object (uid), same address, now protected and
/// owned, in the record under the claim, and the claim Ready with `addressRef`. One that
/// cannot be adopted (it names another claim) is said in the claim's condition, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_address_made_before_its_claim_is_adopted_or_the_claim_says_why_not_once() {
    let seed = capi_seed("capi-adopt").await;
    seed.apply(MACHINES_POOL);
    let _ctl = seed.controller("ctl");
    hand_made(&seed, "pinned", "pinned", "machines", "10.10.0.9", 24);
    hand_made(
        &seed,
        "stray",
        "somebody-else",
        "machines",
        "10.10.0.11",
        24,
    );
    let uid = uid_of(&seed, ADDRESSES, "pinned").expect("uid");
    // The hand-made addresses are set aside: a plain claim never gets them.
    claim(&seed, "plain", "machines");
    let plain = wait_served(&seed, "ctl", NS, "plain").await;
    assert!(plain != "10.10.0.9" && plain != "10.10.0.11", "{plain}");

    claim(&seed, "pinned", "machines");
    assert_eq!(wait_served(&seed, "ctl", NS, "pinned").await, "10.10.0.9");
    let adopted = get_address(&seed, NS, "pinned").expect("IPAddress");
    assert_eq!(adopted.metadata.uid.as_ref(), Some(&uid), "the same object");
    assert!(
        adopted
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .contains(&ADDRESS_FINALIZER.to_string())
    );
    let owners = adopted
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o.kind == "IPAddressClaim" && o.controller == Some(true))
    );
    assert!(owners.iter().any(|o| o.kind == "IPAMPool"));
    assert!(recorded_for_claim(
        &seed,
        "machines",
        "dc-1",
        NS,
        "pinned",
        "10.10.0.9"
    ));
    let status = get_claim(&seed, NS, "pinned")
        .and_then(|c| c.status)
        .expect("status");
    assert_eq!(
        status.address_ref.map(|r| r.name).as_deref(),
        Some("pinned")
    );

    claim(&seed, "stray", "machines");
    wait_reason(&seed, "ctl", "stray", "AddressNotAdoptable").await;
    let message = ready_message(&seed, "stray");
    assert!(message.contains("somebody-else"), "{message}");
    assert_eq!(
        get_address(&seed, NS, "stray")
            .map(|a| a.spec.address)
            .as_deref(),
        Some("10.10.0.11"),
        "left as it was"
    );
    // Said once: the claim is not written again and again.
    let rv = resource_version_of(&seed, CLAIMS, "stray");
    claim(&seed, "later", "machines");
    wait_served(&seed, "ctl", NS, "later").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        resource_version_of(&seed, CLAIMS, "stray"),
        rv,
        "written again"
    );
    // The consistency check over what kipam holds (the stray one is not kipam's).
    assert_consistent(&seed);
}

const SHARED_NODES: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: second}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.10.0.0/28, allocationRange: 1}
";

/// 36.4: deleting a pool never pulls addresses from under running machines: the pool stays
/// (Terminating, its status saying which claims hold its addresses), each claim keeps its
/// address and `IPAddress`, and no other holder of the address space gets one while its
/// `IPAddress` exists; once the claims are deleted, the pool goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pool_keeps_its_claims_addresses_until_the_claims_go() {
    let seed = capi_seed("capi-pool-delete").await;
    seed.apply(MACHINES_POOL);
    let _ctl = seed.controller("ctl");
    claim(&seed, "a", "machines");
    claim(&seed, "b", "machines");
    let a = wait_served(&seed, "ctl", NS, "a").await;
    let b = wait_served(&seed, "ctl", NS, "b").await;
    let uid_a = uid_of(&seed, ADDRESSES, "a");
    seed.delete("ipampools", None, "machines");
    // The same addresses through another pool of the space: claims there fill it.
    seed.apply(SHARED_NODES);
    for i in 0..16 {
        claim(&seed, &format!("s{i:02}"), "second");
    }
    seed.wait_for("the pool says who holds its addresses", WAIT, "ctl", |s| {
        s.condition("ipampools", "machines", "Deleting")
            .is_some_and(|c| {
                c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("machines/a"))
            })
    })
    .await;
    seed.wait_for("the second pool is full", WAIT, "ctl", |s| {
        (0..16).any(|i| not_ready_because(s, &format!("s{i:02}"), "PoolExhausted"))
    })
    .await;
    let pool = seed
        .get("ipampools", None, "machines")
        .expect("the pool stays");
    assert!(pool["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(address_of(&seed, NS, "a"), Some(a.clone()));
    assert_eq!(address_of(&seed, NS, "b"), Some(b.clone()));
    assert_eq!(uid_of(&seed, ADDRESSES, "a"), uid_a, "never re-created");
    let others: BTreeMap<String, String> = get_addresses(&seed)
        .into_iter()
        .filter(|(n, _)| n.starts_with('s'))
        .collect();
    assert!(
        !others.values().any(|x| *x == a || *x == b),
        "a held address was handed out again: {others:?}"
    );
    // The claims go: their addresses are released, and the pool goes with the last.
    seed.delete(CLAIMS, Some(NS), "a");
    seed.wait_for("a gone", WAIT, "ctl", |s| {
        get_claim(s, NS, "a").is_none() && get_address(s, NS, "a").is_none()
    })
    .await;
    assert!(
        seed.get("ipampools", None, "machines").is_some(),
        "b still holds"
    );
    seed.delete(CLAIMS, Some(NS), "b");
    seed.wait_for("the pool goes once no claim holds", WAIT, "ctl", |s| {
        s.get("ipampools", None, "machines").is_none()
    })
    .await;
}

/// 36.6: no machine gets its network's network address, IPv4 broadcast address or gateway,
/// whatever the exclusions (here none, and no `network`: those of the CIDR); a cluster's range
/// keeps today's first fit from the CIDR's first address. A pool whose reserved addresses leave
/// nothing says so in its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_machine_gets_the_network_broadcast_or_gateway_address() {
    let seed = capi_seed("capi-reserved").await;
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: eight}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.80.0.0/29, allocationRange: 2}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: ranges}
spec:
  addressSpace: other
  datacenters:
    dc-1: {type: range, poolCidr: 10.81.0.0/29, allocationRange: 2}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: none}
spec:
  addressSpace: third
  datacenters:
    dc-1: {type: range, poolCidr: 10.82.0.0/30, allocationRange: 1, excludeRanges: [10.82.0.1-10.82.0.2]}
",
    );
    let _ctl = seed.controller("ctl");
    for i in 0..7 {
        claim(&seed, &format!("m{i}"), "eight");
    }
    // Asking for the network address by name is refused too.
    claim_in(
        &seed,
        NS,
        "asks-network",
        "eight",
        json!({"annotations": {ANNOTATION_REQUESTED_ADDRESS: "10.80.0.0"}}),
        json!({}),
    );
    seed.wait_for("six claims served, one waits", WAIT, "ctl", |s| {
        (0..7)
            .filter(|i| address_of(s, NS, &format!("m{i}")).is_some())
            .count()
            == 6
            && (0..7).any(|i| not_ready_because(s, &format!("m{i}"), "PoolExhausted"))
    })
    .await;
    let given: BTreeSet<String> = (0..7)
        .filter_map(|i| address_of(&seed, NS, &format!("m{i}")))
        .collect();
    assert!(
        !given.contains("10.80.0.0") && !given.contains("10.80.0.7"),
        "{given:?}"
    );
    wait_reason(&seed, "ctl", "asks-network", "RequestedAddressUnavailable").await;
    assert!(ready_message(&seed, "asks-network").contains("network address"));
    // A cluster's range: today's behaviour, from the first address.
    seed.cluster("lb", "dc-1");
    seed.wait_for("lb allocated", WAIT, "ctl", |s| {
        s.phase("lb", "ranges") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("lb", "ranges"), "10.81.0.0-10.81.0.1");
    seed.wait_for(
        "the pool says nothing is left for machines",
        WAIT,
        "ctl",
        |s| {
            s.condition("ipampools", "none", "MachineAddressesAvailable")
                .is_some_and(|c| c["status"] == "False" && c["reason"] == "AllReserved")
        },
    )
    .await;
    assert!(
        seed.condition("ipampools", "eight", "MachineAddressesAvailable")
            .is_none(),
        "only where it is so"
    );
}

/// 36.7: the `IPAddress` as the contract's users read it: the claim's cluster label copied,
/// the pool's owner reference blocking its deletion; the contract's `PoolNotReady` for a pool
/// that is missing or invalid; a pool annotated `cluster.x-k8s.io/paused` serves no new claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ip_address_reads_as_the_contract_says_and_a_paused_pool_serves_nothing_new() {
    let seed = capi_seed("capi-contract").await;
    seed.apply(MACHINES_POOL);
    capi_cluster(&seed, "work", false, false);
    let _ctl = seed.controller("ctl");
    claim_in(
        &seed,
        NS,
        "labelled",
        "machines",
        json!({"labels": {LABEL_CAPI_CLUSTER_NAME: "work"}}),
        json!({"clusterName": "work"}),
    );
    wait_served(&seed, "ctl", NS, "labelled").await;
    let a = get_address(&seed, NS, "labelled").expect("IPAddress");
    assert_eq!(
        a.metadata
            .labels
            .clone()
            .unwrap_or_default()
            .get(LABEL_CAPI_CLUSTER_NAME)
            .map(String::as_str),
        Some("work")
    );
    let by_pool = a
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|o| o.kind == "IPAMPool")
        .expect("pool owner");
    assert_eq!(by_pool.block_owner_deletion, Some(true));

    claim(&seed, "nowhere", "missing");
    wait_reason(&seed, "ctl", "nowhere", "PoolNotReady").await;
    assert!(ready_message(&seed, "nowhere").contains("does not exist"));

    let c = client(&seed).await;
    let pools = Api::<DynamicObject>::all_with(
        c.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("ipam.kipam.dev", "v1alpha1", "IPAMPool"),
            "ipampools",
        ),
    );
    merge_patch(
        pools.clone(),
        "machines",
        json!({"metadata": {"annotations": {ANNOTATION_CAPI_PAUSED: ""}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    claim(&seed, "while-paused", "machines");
    claim(&seed, "witness", "missing");
    wait_reason(&seed, "ctl", "witness", "PoolNotReady").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        untouched(&seed, "while-paused"),
        "a paused pool served a claim"
    );
    assert!(
        address_of(&seed, NS, "labelled").is_some(),
        "what is held stays"
    );
    merge_patch(
        pools,
        "machines",
        json!({"metadata": {"annotations": {ANNOTATION_CAPI_PAUSED: null}}}),
    )
    .await;
    wait_served(&seed, "ctl", NS, "while-paused").await;
}

/// 36.8: editing a pool's network keeps every `IPAddress` as it is (same object, same spec:
/// immutable in Cluster API); new claims get the new network, and the pool's status counts the
/// `IPAddress`es still showing the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_a_pool_network_keeps_ip_addresses_and_counts_the_old_ones() {
    let seed = capi_seed("capi-network-edit").await;
    seed.apply(MACHINES_POOL);
    let _ctl = seed.controller("ctl");
    claim(&seed, "before", "machines");
    wait_served(&seed, "ctl", NS, "before").await;
    let uid = uid_of(&seed, ADDRESSES, "before");
    let rv = resource_version_of(&seed, ADDRESSES, "before");
    seed.apply(&MACHINES_POOL.replace(
        "network: {gateway: 10.10.0.254, prefixLength: 24}",
        "network: {gateway: 10.10.0.253, prefixLength: 24}",
    ));
    seed.wait_for("the pool counts the old IPAddress", WAIT, "ctl", |s| {
        s.condition("ipampools", "machines", "IPAddressesOutdated")
            .is_some_and(|c| {
                c["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("1 IPAddresses"))
            })
    })
    .await;
    claim(&seed, "after", "machines");
    wait_served(&seed, "ctl", NS, "after").await;
    assert_eq!(
        get_address(&seed, NS, "after")
            .and_then(|a| a.spec.gateway)
            .as_deref(),
        Some("10.10.0.253")
    );
    let old = get_address(&seed, NS, "before").expect("kept");
    assert_eq!(old.spec.gateway.as_deref(), Some("10.10.0.254"));
    assert_eq!(uid_of(&seed, ADDRESSES, "before"), uid, "never re-created");
    assert_eq!(
        resource_version_of(&seed, ADDRESSES, "before"),
        rv,
        "never written"
    );
    assert_eq!(settled(&seed).await, 2);
}

/// CI history seed 357714436: a hand-made `IPAddress`'s record entry whose object is gone stays
/// held until a read confirms the object absent. When that read fails, the check is asked again
/// on its own after a few seconds: nothing else may ever wake the planning loop (a wake with
/// nothing changed plans nothing), and the address would stay unusable until the periodic
/// resync, minutes later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_made_entry_whose_absence_could_not_be_read_is_checked_again_soon() {
    let seed = capi_seed("capi-hand-made-recheck").await;
    seed.apply(MACHINES_POOL);
    let _ctl = seed.controller("ctl");
    claim(&seed, "first", "machines");
    wait_served(&seed, "ctl", NS, "first").await;
    // A hand-made IPAddress with its record entry, as the webhook leaves them.
    hand_made(&seed, "ghost", "ghost", "machines", "10.10.0.12", 24);
    let shard = seed
        .api
        .list("ipampoolrecords", None)
        .into_iter()
        .find(|r| r["spec"]["pool"] == "machines" && r["spec"]["block"].is_string())
        .expect("a shard of machines");
    let name = shard["metadata"]["name"]
        .as_str()
        .expect("named")
        .to_string();
    const GHOST: &str = "ipaddress/machines/ghost@2020-01-01T00:00:00Z";
    Api::<IPAMPoolRecord>::all(client(&seed).await)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"reservations": {
                GHOST: {"addresses": ["10.10.0.12-10.10.0.12"]}
            }}})),
        )
        .await
        .expect("entry written as kipam");
    // kipam's next commit to the shard meets the entry (its write conflicts, it reads again).
    claim(&seed, "second", "machines");
    wait_served(&seed, "ctl", NS, "second").await;
    assert!(record_entries(&seed, "machines", "dc-1").contains_key(GHOST));
    // It is deleted, and the one read that asks whether it is gone fails.
    seed.api.inject_failures("get", "ipaddresses", 1, 500);
    seed.delete(ADDRESSES, Some(NS), "ghost");
    seed.wait_for("the read failed", WAIT, "ctl", |s| {
        s.api.pending_failures() == 0
    })
    .await;
    assert!(
        record_entries(&seed, "machines", "dc-1").contains_key(GHOST),
        "released without a read confirming the object gone"
    );
    // Nothing else happens in the seed: only the check's own timer can release it.
    seed.wait_for("the ghost's entry released", WAIT, "ctl", |s| {
        !record_entries(s, "machines", "dc-1").contains_key(GHOST)
    })
    .await;
    assert!(
        seed.log("ctl")
            .contains("cannot confirm a hand-made IPAddress gone"),
        "the failed read is logged"
    );
    assert_eq!(settled(&seed).await, 2);
}
