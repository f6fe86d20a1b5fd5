//! The fence covers address spaces: a replica that lost the Lease can no more hand out an
//! address held through another pool of the same address space than one held in its own
//! pool. In process against the stand-in, with two replicas' copies of the pool records
//! (`kipam::planning::records::commit_shared`, the commit step of every pass); then the real
//! controller with two replicas over two overlapping pools, the leader frozen past its lease.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, PostParams};

use kube_standin::ApiServer;
use serde_json::json;

use kipam::planning::records::{self, CommitError, PlannedOn, RecordKey};
use kipam::resources::{IPAMPool, IPAMPoolRecord, Reservation};
use kipam::seed::Context;

use super::support::Seed;

async fn client(api: &ApiServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// One replica's context (its own copy of the records).
async fn replica(api: &ApiServer) -> Arc<Context> {
    let client = client(api).await;
    Context::builder(client)
        .complete_ledger(Default::default())
        .build()
}

/// A fresh (quorum) list of the records into `ctx`'s copy, as at the start of a term.
async fn load_records(ctx: &Context) {
    let list = Api::<IPAMPoolRecord>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    ctx.records.lock().await.reset(list.items);
}

async fn create_pool(api: &ApiServer, name: &str) -> IPAMPool {
    let pool: IPAMPool = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": name},
        "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.0.0.0/16", "allocationRange": 4}}},
    }))
    .unwrap();
    Api::<IPAMPool>::all(client(api).await)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap()
}

fn range(text: &str) -> Reservation {
    Reservation {
        cidr: None,
        addresses: vec![text.into()],
    }
}

fn entries(list: &[(&str, &str)]) -> BTreeMap<String, Reservation> {
    list.iter()
        .map(|(c, r)| (c.to_string(), range(r)))
        .collect()
}

/// Two replicas that read the pools alike (no pool view to compare).
fn same_view() -> PlannedOn {
    PlannedOn::default()
}

fn is_conflict(r: Result<u64, CommitError>) -> bool {
    matches!(r, Err(e) if e.is_stale())
}

/// Refused: a conflict, or a record that says its writer saw newer pools.
fn is_refused(r: &Result<u64, CommitError>) -> bool {
    matches!(r, Err(e) if e.is_stale() || matches!(e, CommitError::PoolsBehind { .. }))
}

/// The record of `pool` in dc-1 as the server stores it, shards joined.
fn stored(api: &ApiServer, pool: &str) -> BTreeMap<String, Reservation> {
    let mut out = BTreeMap::new();
    for r in api.list("ipampoolrecords", None) {
        let r: IPAMPoolRecord = serde_json::from_value(r).unwrap();
        if r.spec.pool == pool {
            out.extend(r.spec.reservations);
        }
    }
    out
}

/// Two replicas read the records of pools `a` and `b` (one network, one address space). The
/// new leader hands 10.0.0.8-11 to cluster y through pool b; the deposed one, on its older
/// view, would hand the same addresses to cluster x through pool a. Its commit is refused
/// before it writes anything, whichever of the two shards it reaches first, and pool a's
/// record never shows x.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_hand_out_an_address_held_through_another_pool() {
    let api = ApiServer::start().await.unwrap();
    for crd in kipam::resources::crds() {
        api.apply(&serde_json::to_value(&crd).unwrap()).unwrap();
    }
    let (pool_a, pool_b) = (create_pool(&api, "a").await, create_pool(&api, "b").await);
    let key_a: RecordKey = ("a".into(), "dc-1".into());
    let key_b: RecordKey = ("b".into(), "dc-1".into());
    let old = replica(&api).await;
    let new = replica(&api).await;

    // A first term: the old leader commits w's addresses through pool a (raising b's fence).
    let others_of_a = [(pool_b.clone(), key_b.clone())];
    let others_of_b = [(pool_a.clone(), key_a.clone())];
    records::commit_shared(
        &old,
        &pool_a,
        &key_a,
        entries(&[("w", "10.0.0.0-10.0.0.3")]),
        Default::default(),
        &others_of_a,
        &same_view(),
    )
    .await
    .unwrap();
    // Both replicas now hold the same view.
    load_records(&old).await;
    load_records(&new).await;

    // The new term: y gets 10.0.0.8-11 through pool b.
    records::commit_shared(
        &new,
        &pool_b,
        &key_b,
        entries(&[("y", "10.0.0.8-10.0.0.11")]),
        Default::default(),
        &others_of_b,
        &same_view(),
    )
    .await
    .unwrap();
    let a_before = stored(&api, "a");

    // The deposed leader, planning on its old view, gives x the same addresses in pool a.
    let stale = records::commit_shared(
        &old,
        &pool_a,
        &key_a,
        entries(&[("w", "10.0.0.0-10.0.0.3"), ("x", "10.0.0.8-10.0.0.11")]),
        Default::default(),
        &others_of_a,
        &same_view(),
    )
    .await;
    assert!(is_conflict(stale), "the stale commit is refused");
    assert_eq!(stored(&api, "a"), a_before, "pool a's record is unchanged");
    assert!(!stored(&api, "a").contains_key("x"));
    assert_eq!(
        stored(&api, "b"),
        entries(&[("y", "10.0.0.8-10.0.0.11")]),
        "pool b's record is as the new leader left it"
    );

    // The other way round: the deposed leader's view of pool b is stale, its view of pool a
    // current (nobody wrote a's shard since it last read it).
    load_records(&old).await;
    load_records(&new).await;
    records::commit_shared(
        &new,
        &pool_b,
        &key_b,
        entries(&[("y", "10.0.0.8-10.0.0.11"), ("z", "10.0.0.12-10.0.0.15")]),
        Default::default(),
        &[], // as if b shared nothing: only b's own shard is written
        &same_view(),
    )
    .await
    .unwrap();
    let stale = records::commit_shared(
        &old,
        &pool_a,
        &key_a,
        entries(&[("w", "10.0.0.0-10.0.0.3"), ("x", "10.0.0.12-10.0.0.15")]),
        Default::default(),
        &others_of_a,
        &same_view(),
    )
    .await;
    assert!(
        is_conflict(stale),
        "raising b's fence on the stale view of b is refused"
    );
    assert!(
        !stored(&api, "a").contains_key("x"),
        "and a was not written"
    );

    // On a fresh view, a commit that adds nothing of b's lands, and b's fence went up.
    load_records(&old).await;
    let fence_before = fence_of(&api, "b");
    records::commit_shared(
        &old,
        &pool_a,
        &key_a,
        entries(&[("w", "10.0.0.0-10.0.0.3"), ("x", "10.0.0.16-10.0.0.19")]),
        Default::default(),
        &others_of_a,
        &same_view(),
    )
    .await
    .unwrap();
    assert!(stored(&api, "a").contains_key("x"));
    assert!(fence_of(&api, "b") > fence_before, "b's fence was raised");
}

/// The highest fence of pool `pool`'s shards.
fn fence_of(api: &ApiServer, pool: &str) -> i64 {
    api.list("ipampoolrecords", None)
        .into_iter()
        .filter_map(|r| serde_json::from_value::<IPAMPoolRecord>(r).ok())
        .filter(|r| r.spec.pool == pool)
        .filter_map(|r| r.spec.fence)
        .max()
        .unwrap_or(0)
}

/// A pool as given, created on the server (the object the server answered: its version).
async fn create(api: &ApiServer, pool: serde_json::Value) -> IPAMPool {
    let pool: IPAMPool = serde_json::from_value(pool).unwrap();
    Api::<IPAMPool>::all(client(api).await)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap()
}

/// `pool` replaced on the server by `edit` (the object the server answered).
async fn replace(api: &ApiServer, pool: &IPAMPool, edit: impl FnOnce(&mut IPAMPool)) -> IPAMPool {
    let mut changed = pool.clone();
    edit(&mut changed);
    Api::<IPAMPool>::all(client(api).await)
        .replace(
            &pool.metadata.name.clone().unwrap(),
            &PostParams::default(),
            &changed,
        )
        .await
        .unwrap()
}

fn range_pool(name: &str, cidr: &str, space: &str) -> serde_json::Value {
    json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": name},
        "spec": {
            "addressSpace": space,
            "datacenters": {"dc-1": {"type": "range", "poolCidr": cidr, "allocationRange": 4}},
        },
    })
}

/// Every (holder, shard) of pool `pool` as the server stores them.
fn holders(api: &ApiServer, pool: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in api.list("ipampoolrecords", None) {
        let r: IPAMPoolRecord = serde_json::from_value(r).unwrap();
        if r.spec.pool == pool {
            for holder in r.spec.reservations.keys() {
                out.push((holder.clone(), r.metadata.name.clone().unwrap()));
            }
        }
    }
    out.sort();
    out
}

async fn setup_api() -> ApiServer {
    let api = ApiServer::start().await.unwrap();
    for crd in kipam::resources::crds() {
        api.apply(&serde_json::to_value(&crd).unwrap()).unwrap();
    }
    api
}

/// Issue 35, item 2: a pool datacenter that never held anything is widened (a /26 becomes a
/// /25) while a deposed leader, which still reads the /26, commits its first allocation.
/// Divided by the pool each reads, the two replicas' first shards for one address would have
/// two names (a /25 block and a /26 block) and both creates would pass. Both must first create
/// the pool datacenter's one layout record: the one that loses reads it and divides as it
/// says, so their shards meet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_widened_before_its_first_commit_is_divided_alike_by_both_replicas() {
    let api = setup_api().await;
    let narrow = create(&api, range_pool("w", "10.0.0.0/26", "default")).await;
    let wide = replace(&api, &narrow, |p| {
        p.spec.datacenters.get_mut("dc-1").unwrap().pool_cidr = "10.0.0.0/25".into();
    })
    .await;
    let key: RecordKey = ("w".into(), "dc-1".into());
    let (old, new) = (replica(&api).await, replica(&api).await);
    load_records(&old).await;
    load_records(&new).await;
    let old_view = PlannedOn::pools([&narrow]);
    let new_view = PlannedOn::pools([&wide]);

    // The new leader gives y 10.0.0.8-11 through the widened pool: layout record, one shard.
    records::commit(
        &new,
        &wide,
        &key,
        entries(&[("y", "10.0.0.8-10.0.0.11")]),
        Default::default(),
        &new_view,
    )
    .await
    .unwrap();
    // The deposed leader, on the /26 it still reads and records it read before, gives x the
    // same addresses: refused, and again once it has read the layout record (its shard is
    // now the new leader's /25 one, which it does not hold).
    for attempt in ["without the layout record", "with it"] {
        let stale = records::commit(
            &old,
            &narrow,
            &key,
            entries(&[("x", "10.0.0.8-10.0.0.11")]),
            Default::default(),
            &old_view,
        )
        .await;
        assert!(
            is_refused(&stale),
            "the stale first commit is refused ({attempt}): {stale:?}"
        );
    }
    assert_eq!(
        holders(&api, "w"),
        vec![("y".to_string(), "w.dc-1.0a000000-25".to_string())],
        "only y holds anything, in the layout record's division"
    );
    let layout: IPAMPoolRecord = serde_json::from_value(
        api.get("ipampoolrecords", None, "w.dc-1.layout")
            .expect("the layout record"),
    )
    .unwrap();
    assert_eq!(layout.spec.block_length, Some(25));

    // On records read afresh, the shard says its writer saw the widened pool: a replica that
    // still reads the /26 waits for its pools to catch up; then x lands beside y, in the
    // shard of the layout record's division.
    load_records(&old).await;
    let both = entries(&[("x", "10.0.0.16-10.0.0.19"), ("y", "10.0.0.8-10.0.0.11")]);
    let stale = records::commit(
        &old,
        &narrow,
        &key,
        both.clone(),
        Default::default(),
        &old_view,
    )
    .await;
    assert!(
        matches!(stale, Err(CommitError::PoolsBehind { .. })),
        "{stale:?}"
    );
    records::commit(
        &old,
        &wide,
        &key,
        both,
        Default::default(),
        &PlannedOn::pools([&wide]),
    )
    .await
    .unwrap();
    assert_eq!(
        holders(&api, "w"),
        vec![
            ("x".to_string(), "w.dc-1.0a000000-25".to_string()),
            ("y".to_string(), "w.dc-1.0a000000-25".to_string()),
        ]
    );
}

/// Issue 35, item 3: pools `a` and `b` cover one network in two address spaces, then `b` is
/// moved into `a`'s space. The new leader, which has seen the edit, gives y 10.0.0.8-11
/// through `b`, raising `a`'s fence. A deposed replica whose pool watch lags — it reads the
/// records afresh but the pools from before the edit, so it plans `a` alone — would give x
/// the same addresses through `a`: its compare-and-swap on `a`'s shard passes (it holds the
/// shard as the fence raise left it). The shard says its writer saw newer pools, so the
/// commit is refused until the replica's pools catch up. A replica whose pools are current
/// but below a stamp (a pool deleted since) confirms with one list and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_space_edit_joining_two_pools_fences_a_replica_that_has_not_seen_it() {
    let api = setup_api().await;
    let a = create(&api, range_pool("a", "10.0.0.0/16", "red")).await;
    let b_apart = create(&api, range_pool("b", "10.0.0.0/16", "blue")).await;
    let b = replace(&api, &b_apart, |p| {
        p.spec.address_space = Some("red".into())
    })
    .await;
    let key_a: RecordKey = ("a".into(), "dc-1".into());
    let key_b: RecordKey = ("b".into(), "dc-1".into());
    let (old, new) = (replica(&api).await, replica(&api).await);
    load_records(&new).await;
    let new_view = PlannedOn::pools([&a, &b]);
    records::commit_shared(
        &new,
        &b,
        &key_b,
        entries(&[("y", "10.0.0.8-10.0.0.11")]),
        Default::default(),
        &[(a.clone(), key_a.clone())],
        &new_view,
    )
    .await
    .unwrap();

    // The lagging replica: records current, pools from before the edit (a and b apart).
    load_records(&old).await;
    let old_view = PlannedOn::pools([&a, &b_apart]);
    let stale = records::commit_shared(
        &old,
        &a,
        &key_a,
        entries(&[("x", "10.0.0.8-10.0.0.11")]),
        Default::default(),
        &[],
        &old_view,
    )
    .await;
    assert!(
        matches!(stale, Err(CommitError::PoolsBehind { .. })),
        "refused: {stale:?}"
    );
    assert!(stored(&api, "a").is_empty(), "a holds nothing");

    // Caught up, it plans a and b together (x elsewhere) and commits.
    let caught_up = PlannedOn::pools([&a, &b]);
    records::commit_shared(
        &old,
        &a,
        &key_a,
        entries(&[("x", "10.0.0.16-10.0.0.19")]),
        Default::default(),
        &[(b.clone(), key_b.clone())],
        &caught_up,
    )
    .await
    .unwrap();
    assert_eq!(stored(&api, "a"), entries(&[("x", "10.0.0.16-10.0.0.19")]));

    // A pool created and seen by the new leader stamps a's shard with its version; deleted
    // again, no replica's pools reach that version until the pools change. A replica whose
    // pools are current lists them once, finds them exactly as it read them, and commits.
    let c = create(&api, range_pool("c", "10.9.0.0/16", "red")).await;
    load_records(&new).await;
    records::commit(
        &new,
        &a,
        &key_a,
        entries(&[("x", "10.0.0.16-10.0.0.19"), ("z", "10.0.0.20-10.0.0.23")]),
        Default::default(),
        &PlannedOn::pools([&a, &b, &c]),
    )
    .await
    .unwrap();
    Api::<IPAMPool>::all(client(&api).await)
        .delete("c", &Default::default())
        .await
        .unwrap();
    load_records(&old).await;
    records::commit(
        &old,
        &a,
        &key_a,
        entries(&[
            ("v", "10.0.0.24-10.0.0.27"),
            ("x", "10.0.0.16-10.0.0.19"),
            ("z", "10.0.0.20-10.0.0.23"),
        ]),
        Default::default(),
        &PlannedOn::pools([&a, &b]),
    )
    .await
    .expect("a current view is confirmed by a list and commits");
    assert!(stored(&api, "a").contains_key("v"));
}

/// Issue 35, item 4: pools `a` and `b` share dc-1's network; `b` is then edited into an
/// invalid pool (host bits in `poolCidr`, so its network does not read). The new leader
/// leaves `b` out of the plan and gives y 10.0.0.8-11 through `a`. A deposed replica that
/// still reads `b` as valid gives x the same addresses through `b`, after raising `a`'s fence
/// (b and a share a space in its view) — and before the new leader read `a`'s shard, so that
/// the new leader's commit into `a` passes. The new leader's commit raises `b`'s fences too
/// (over the division of `b`'s layout record), so the deposed replica's write into `b` is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_pool_is_fenced_by_a_commit_into_another_pool_of_its_datacenter() {
    let api = setup_api().await;
    let a = create(&api, range_pool("a", "10.0.0.0/16", "red")).await;
    let b_valid = create(&api, range_pool("b", "10.0.0.0/16", "red")).await;
    let key_a: RecordKey = ("a".into(), "dc-1".into());
    let key_b: RecordKey = ("b".into(), "dc-1".into());
    let (old, new) = (replica(&api).await, replica(&api).await);
    // b held something before: its layout record and a shard exist.
    records::commit(
        &old,
        &b_valid,
        &key_b,
        entries(&[("w", "10.0.0.0-10.0.0.3")]),
        Default::default(),
        &same_view(),
    )
    .await
    .unwrap();
    let b_broken = replace(&api, &b_valid, |p| {
        p.spec.datacenters.get_mut("dc-1").unwrap().pool_cidr = "10.0.0.1/16".into();
    })
    .await;
    assert!(kipam::validation::pool_input(&b_broken).is_err());
    load_records(&old).await;

    // The deposed replica raises a's fence first (its view: a and b share addresses).
    let added = [kipam::address::AddrRange::parse_lenient("10.0.0.8-10.0.0.11").unwrap()];
    let old_view = PlannedOn::pools([&a, &b_valid]);
    records::raise_fences(&old, &a, &key_a, &added, &old_view)
        .await
        .unwrap();

    // The new leader reads the records after that raise and commits y through a, fencing b.
    load_records(&new).await;
    records::commit_shared(
        &new,
        &a,
        &key_a,
        entries(&[("y", "10.0.0.8-10.0.0.11")]),
        Default::default(),
        &[(b_broken.clone(), key_b.clone())],
        &PlannedOn::pools([&a, &b_broken]),
    )
    .await
    .expect("an invalid pool's fence is raised over its layout record's division");

    // The deposed replica's write into b, planned on its copy from before the new leader's
    // commit, is refused.
    let stale = records::commit(
        &old,
        &b_valid,
        &key_b,
        entries(&[("w", "10.0.0.0-10.0.0.3"), ("x", "10.0.0.8-10.0.0.11")]),
        Default::default(),
        &old_view,
    )
    .await;
    assert!(stale.is_err(), "refused: {stale:?}");
    assert!(!stored(&api, "b").contains_key("x"), "b never shows x");
    assert_eq!(stored(&api, "a"), entries(&[("y", "10.0.0.8-10.0.0.11")]));
}

/// Two pools over one network in dc-1, one address space.
const SHARED_POOLS: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: lb}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/22, allocationRange: 2}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: vip}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/22, allocationRange: 1}
";

/// Every address held by two allocations of dc-1, whatever their pool.
fn cross_pool_overlaps(seed: &Seed) -> Vec<String> {
    let mut pieces: Vec<(u128, u128, String)> = Vec::new();
    for obj in seed.allocations() {
        let Ok(s) = kipam::validation::stored_allocation(&obj) else {
            continue;
        };
        let Some(held) = s.held else { continue };
        pieces.extend(
            held.ranges()
                .map(|r| (r.first(), r.last(), format!("{}/{}", s.cluster, s.pool))),
        );
    }
    pieces.sort();
    pieces
        .windows(2)
        .filter(|w| w[0].1 >= w[1].0)
        .map(|w| format!("{} and {}", w[0].2, w[1].2))
        .collect()
}

/// The real controller, two replicas, two pools sharing dc-1's addresses: clusters arrive
/// while the leader is frozen past its lease, the other takes over, the frozen one thaws in
/// the middle of it. No address is ever held through both pools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_and_a_frozen_leader_never_share_an_address_across_pools() {
    let seed = Seed::start("spaces-sigstop").await;
    seed.apply(SHARED_POOLS);
    let ctls = [seed.controller("r0"), seed.controller("r1")];
    let mut created = 0usize;
    let check = |seed: &Seed, step: &str| {
        let found = cross_pool_overlaps(seed);
        assert!(found.is_empty(), "shared address after {step}: {found:?}");
    };
    for round in 0..3 {
        seed.wait_for("a leader", Duration::from_secs(20), "r0", |s| {
            !s.lease_holder().is_empty()
        })
        .await;
        let idx = if seed.lease_holder() == "r0" { 0 } else { 1 };
        for _ in 0..20 {
            seed.cluster(&format!("c{created:03}"), "dc-1");
            created += 1;
        }
        tokio::time::sleep(Duration::from_millis(100 * round as u64)).await;
        ctls[idx].signal("STOP");
        let stopped = Instant::now();
        check(&seed, "stop");
        for _ in 0..10 {
            seed.cluster(&format!("c{created:03}"), "dc-1");
            created += 1;
        }
        let other = format!("r{}", 1 - idx);
        // The takeover, confirmed before anything that depends on it.
        seed.wait_leader(&other, Duration::from_secs(20)).await;
        let n = created;
        seed.wait_for(
            "the other replica serves",
            Duration::from_secs(40),
            &other,
            |s| {
                (0..n).all(|i| {
                    let c = format!("c{i:03}");
                    s.phase(&c, "lb") == "Allocated" && s.phase(&c, "vip") == "Allocated"
                })
            },
        )
        .await;
        check(&seed, "takeover");
        for _ in 0..5 {
            seed.cluster(&format!("c{created:03}"), "dc-1");
            created += 1;
        }
        ctls[idx].signal("CONT");
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            check(&seed, "thaw");
        }
        eprintln!("round {round}: takeover after {:?}", stopped.elapsed());
    }
    let n = created;
    seed.wait_for("everything converges", Duration::from_secs(60), "r0", |s| {
        (0..n).all(|i| {
            let c = format!("c{i:03}");
            s.phase(&c, "lb") == "Allocated" && s.phase(&c, "vip") == "Allocated"
        })
    })
    .await;
    check(&seed, "the end");
    assert_eq!(seed.assert_no_overlap_no_leak(), 2 * created);
}

/// A pool whose released addresses wait an hour, and a pool sharing its network.
const QUARANTINE_POOLS: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: edge}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 4, reuseAfter: 1h}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: vip}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 1}
";

/// The quarantine entries of the pool records, as stored: (pool, entry name, addresses).
fn quarantine_entries(seed: &Seed) -> Vec<(String, String, Vec<String>)> {
    let mut out = Vec::new();
    for r in seed.api.list("ipampoolrecords", None) {
        let r: IPAMPoolRecord = serde_json::from_value(r).unwrap();
        for (name, entry) in r.spec.reservations {
            if name.starts_with("quarantined/") {
                out.push((r.spec.pool.clone(), name, entry.addresses));
            }
        }
    }
    out.sort();
    out
}

/// Two replicas. A cluster is deleted: its addresses go to quarantine, in the pool record.
/// The leader is killed in the middle of the quarantine; the new leader, reading the record,
/// gives a newcomer other addresses (in both pools of the space), and gives the deleted
/// cluster, created again, exactly its old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_in_the_middle_of_a_quarantine_hands_nothing_out() {
    let seed = Seed::start("quarantine-failover").await;
    seed.apply(QUARANTINE_POOLS);
    let mut ctls = [seed.controller("r0"), seed.controller("r1")];
    seed.cluster("web", "dc-1");
    seed.wait_for("web allocated", Duration::from_secs(30), "r0", |s| {
        s.phase("web", "edge") == "Allocated" && s.phase("web", "vip") == "Allocated"
    })
    .await;
    let held = seed.held("web", "edge");
    assert_eq!(held, "10.0.0.0-10.0.0.3");

    seed.delete("clusters", None, "web");
    seed.wait_for(
        "web's addresses quarantined in the record",
        Duration::from_secs(30),
        "r0",
        |s| {
            s.get("clusters", None, "web").is_none()
                && s.allocation("web", "edge").is_none()
                && quarantine_entries(s).iter().any(|(p, n, a)| {
                    p == "edge" && n.starts_with("quarantined/web@") && a == &vec![held.clone()]
                })
                && !s
                    .api
                    .list("ipampoolrecords", None)
                    .iter()
                    .any(|r| r["spec"]["reservations"].get("web").is_some())
        },
    )
    .await;

    // The leader dies without handing over; the other replica takes over.
    let leader = seed.lease_holder();
    let (dead, survivor) = if leader == "r0" { (0, "r1") } else { (1, "r0") };
    ctls[dead].kill();
    seed.wait_leader(survivor, Duration::from_secs(20)).await;
    seed.cluster("api", "dc-1");
    seed.wait_for(
        "the survivor serves the newcomer",
        Duration::from_secs(60),
        survivor,
        |s| s.phase("api", "edge") == "Allocated" && s.phase("api", "vip") == "Allocated",
    )
    .await;
    assert_eq!(seed.lease_holder(), survivor);
    assert_eq!(seed.held("api", "edge"), "10.0.0.4-10.0.0.7", "not web's");
    // The other pool of the space does not hand them out either.
    assert_eq!(seed.held("api", "vip"), "10.0.0.8-10.0.0.8");
    seed.wait_for(
        "the pool's status counts them",
        Duration::from_secs(10),
        survivor,
        |s| {
            s.get("ipampools", None, "edge")
                .is_some_and(|p| p["status"]["quarantined"] == "4")
        },
    )
    .await;
    let status = seed.get("ipampools", None, "edge").unwrap();
    assert_eq!(status["status"]["datacenters"]["dc-1"]["quarantined"], "4");
    let metrics_port = ctls[1 - dead].metrics_port;
    let series = "kipam_pool_addresses{pool=\"edge\",datacenter=\"dc-1\",state=\"quarantined\"}";
    let started = Instant::now();
    while Seed::metric(metrics_port, series).await != Some(4.0)
        && started.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(Seed::metric(metrics_port, series).await, Some(4.0));

    // web comes back within the hour: exactly its old addresses, and the quarantine is gone.
    seed.cluster("web", "dc-1");
    seed.wait_for("web is back", Duration::from_secs(30), survivor, |s| {
        s.phase("web", "edge") == "Allocated" && s.phase("web", "vip") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("web", "edge"), held);
    seed.wait_for(
        "the quarantine entry is trimmed",
        Duration::from_secs(30),
        survivor,
        |s| quarantine_entries(s).iter().all(|(p, _, _)| p != "edge"),
    )
    .await;
    assert!(cross_pool_overlaps(&seed).is_empty());
    assert_eq!(seed.assert_no_overlap_no_leak(), 4);
}

/// Seconds since the Unix epoch, by this machine's clock (the controller's too).
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A quarantine that ends frees its addresses by itself: a cluster waiting for room gets them
/// within a second or two of the end, not at the next resync (five minutes), and not a moment
/// before the end. The end is the release time the record keeps (to the second) plus the
/// `reuseAfter` of 8 s; this test's clock and the controller's are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_waiting_for_room_gets_quarantined_addresses_when_the_quarantine_ends() {
    let seed = Seed::start("quarantine-ends").await;
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: tiny}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/30, allocationRange: 4, reuseAfter: 8s}
",
    );
    let _ctl = seed.controller("r0");
    seed.cluster("web", "dc-1");
    seed.wait_for("web allocated", Duration::from_secs(30), "r0", |s| {
        s.phase("web", "tiny") == "Allocated"
    })
    .await;
    seed.delete("clusters", None, "web");
    seed.wait_for(
        "web gone, its addresses quarantined",
        Duration::from_secs(30),
        "r0",
        |s| {
            s.get("clusters", None, "web").is_none()
                && quarantine_entries(s).iter().any(|(p, _, _)| p == "tiny")
        },
    )
    .await;
    let entries = quarantine_entries(&seed);
    let key = &entries
        .iter()
        .find(|(p, _, _)| p == "tiny")
        .expect("entry")
        .1;
    let released_at = match kipam::reservations::parse_quarantine_key(key) {
        Some(Ok((holder, at))) => {
            assert_eq!(holder, "web", "{key}");
            at
        }
        other => panic!("quarantine entry {key:?} does not read: {other:?}"),
    };
    let end = released_at as f64 + 8.0;
    seed.cluster("api", "dc-1");
    seed.wait_for(
        "api waits: the pool is quarantined",
        Duration::from_secs(10),
        "r0",
        |s| s.phase("api", "tiny") == "Failed",
    )
    .await;
    assert!(
        unix_now() < end,
        "checked within the quarantine ({:.1} s after its end)",
        unix_now() - end
    );
    // Looked at every 20 ms: the first look that finds api allocated, and the last before it.
    let mut last_waiting = unix_now();
    let got = loop {
        let now = unix_now();
        if seed.phase("api", "tiny") == "Allocated" {
            break now;
        }
        last_waiting = now;
        assert!(
            now < end + 15.0,
            "api still waits 15 s after the quarantine's end\n{}",
            seed.log("r0")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        got >= end,
        "api got the quarantined addresses {:.2} s before the quarantine's end",
        end - got
    );
    assert!(
        last_waiting <= end + 2.0,
        "api still waited {:.2} s after the quarantine's end, not a second or two",
        last_waiting - end
    );
    eprintln!(
        "allocated between {:.2} s and {:.2} s after the quarantine's end",
        last_waiting - end,
        got - end
    );
    assert_eq!(seed.held("api", "tiny"), "10.0.0.0-10.0.0.3");
    assert!(quarantine_entries(&seed).is_empty(), "the entry is trimmed");
}

/// Two pools of one address space whose gateway lies in the other's CIDR: pool `lb` excludes
/// its gateway 10.0.0.1 by hand, pool `vip` shares the space and covers it. The gateway is
/// held by its network (the router answers there), so no cluster may get it through `vip`:
/// `kipam offline` already refused such a state; the controller must plan the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_gateway_is_never_handed_out_through_another_pool_of_its_address_space() {
    let seed = Seed::start("spaces-gateway").await;
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: lb}
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/28
      allocationRange: 2
      excludeRanges: [10.0.0.1]
      network: {gateway: 10.0.0.1, prefixLength: 24}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: vip}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 1}
",
    );
    let _ctl = seed.controller("ctl");
    for c in ["a", "b", "c"] {
        seed.cluster(c, "dc-1");
    }
    seed.wait_for(
        "every cluster served",
        Duration::from_secs(30),
        "ctl",
        |s| {
            ["a", "b", "c"]
                .iter()
                .all(|c| s.phase(c, "lb") == "Allocated" && s.phase(c, "vip") == "Allocated")
        },
    )
    .await;
    for c in ["a", "b", "c"] {
        for pool in ["lb", "vip"] {
            let held = seed.held(c, pool);
            let gateway = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 1));
            let covers = held.split(',').any(|r| {
                let (first, last) = r.split_once('-').unwrap_or((r, r));
                let ip = |t: &str| u32::from(t.parse::<std::net::Ipv4Addr>().expect("an address"));
                ip(first) <= gateway && gateway <= ip(last)
            });
            assert!(
                !covers,
                "cluster {c} holds {held} through pool {pool}, which covers lb's gateway 10.0.0.1"
            );
        }
    }
    assert!(cross_pool_overlaps(&seed).is_empty());
}

/// The addresses of `held` (`first-last` pieces joined by commas), as IPv4 numbers.
fn addresses_of(held: &str) -> std::collections::BTreeSet<u32> {
    let ip = |t: &str| u32::from(t.trim().parse::<std::net::Ipv4Addr>().unwrap());
    let mut out = std::collections::BTreeSet::new();
    for piece in held.split(',').filter(|p| !p.is_empty()) {
        let (first, last) = piece.split_once('-').unwrap_or((piece, piece));
        out.extend(ip(first)..=ip(last));
    }
    out
}

/// Issue 51: an address excluded from the pool it is quarantined in stays quarantined for the
/// other pools of the address space (the planner dropped the entry when its own allocator
/// could not set the excluded address aside, and a sibling pool without `reuseAfter` handed
/// it out minutes after the release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excluding_a_quarantined_address_keeps_it_from_the_other_pools_of_the_space() {
    let seed = Seed::start("quarantine-exclude").await;
    let pools = |exclude: &str| {
        format!(
            "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {{name: a}}
spec:
  datacenters:
    dc-1: {{type: range, poolCidr: 10.0.0.0/28, allocationRange: 2, reuseAfter: 1h{exclude}}}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {{name: b}}
spec:
  datacenters:
    dc-1: {{type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}}
"
        )
    };
    seed.apply(&pools(""));
    let _ctl = seed.controller("r0");
    seed.cluster("c1", "dc-1");
    seed.wait_for("c1 allocated", Duration::from_secs(30), "r0", |s| {
        s.phase("c1", "a") == "Allocated" && s.phase("c1", "b") == "Allocated"
    })
    .await;
    let released = addresses_of(&seed.held("c1", "a"));
    assert_eq!(released.len(), 2);
    seed.delete("clusters", None, "c1");
    seed.wait_for(
        "c1's addresses quarantined",
        Duration::from_secs(30),
        "r0",
        |s| {
            s.allocation("c1", "a").is_none()
                && s.allocation("c1", "b").is_none()
                && quarantine_entries(s)
                    .iter()
                    .any(|(p, n, _)| p == "a" && n.starts_with("quarantined/c1@"))
        },
    )
    .await;
    seed.apply(&pools(", excludeRanges: [10.0.0.0]"));
    seed.wait_for(
        "the exclusion planned",
        Duration::from_secs(30),
        "r0",
        |s| {
            s.get("ipampools", None, "a").is_some_and(|p| {
                p["status"]["observedGeneration"] == p["metadata"]["generation"]
                    && p["metadata"]["generation"] == 2
            })
        },
    )
    .await;
    seed.cluster("c2", "dc-1");
    seed.wait_for("c2 allocated", Duration::from_secs(30), "r0", |s| {
        s.phase("c2", "a") == "Allocated" && s.phase("c2", "b") == "Allocated"
    })
    .await;
    for pool in ["a", "b"] {
        let got = addresses_of(&seed.held("c2", pool));
        assert!(
            got.is_disjoint(&released),
            "c2 got {got:?} through {pool}, inside c1's hour of quarantine of {released:?}"
        );
    }
    assert!(
        quarantine_entries(&seed)
            .iter()
            .any(|(p, n, _)| p == "a" && n.starts_with("quarantined/c1@")),
        "the quarantine entry is kept until its hour ends"
    );
}

/// Issue 51: deleting a `Retain` pool of another address space that held the same addresses
/// must not end the quarantine of the pool the cluster opted out of (the kept allocation was
/// set aside in every pool of the datacenter, so the quarantine could set nothing aside and
/// its entry was dropped; once the cluster went, its addresses were anybody's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_retain_pool_of_another_space_keeps_a_quarantine() {
    let seed = Seed::start("quarantine-retain").await;
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: q}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2, reuseAfter: 1h}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: r}
spec:
  addressSpace: vrf-b
  reclaimPolicy: Retain
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}
",
    );
    let _ctl = seed.controller("r0");
    seed.cluster("c1", "dc-1");
    seed.wait_for("c1 allocated", Duration::from_secs(30), "r0", |s| {
        s.phase("c1", "q") == "Allocated" && s.phase("c1", "r") == "Allocated"
    })
    .await;
    let released = addresses_of(&seed.held("c1", "q"));
    let mut c1 = seed.get("clusters", None, "c1").expect("c1");
    c1["spec"]["ipam"] = json!({"q": {"optOut": true}});
    seed.api.apply(&c1).expect("c1 opts out of q");
    seed.wait_for(
        "q's addresses quarantined",
        Duration::from_secs(30),
        "r0",
        |s| {
            s.allocation("c1", "q").is_none()
                && quarantine_entries(s)
                    .iter()
                    .any(|(p, n, _)| p == "q" && n.starts_with("quarantined/c1@"))
        },
    )
    .await;
    seed.delete("ipampools", None, "r");
    seed.wait_for(
        "r gone, its allocation kept",
        Duration::from_secs(30),
        "r0",
        |s| s.get("ipampools", None, "r").is_none() && s.allocation("c1", "r").is_some(),
    )
    .await;
    seed.delete("clusters", None, "c1");
    seed.wait_for("c1 gone", Duration::from_secs(30), "r0", |s| {
        s.get("clusters", None, "c1").is_none() && s.allocation("c1", "r").is_none()
    })
    .await;
    seed.cluster("c2", "dc-1");
    seed.wait_for("c2 allocated", Duration::from_secs(30), "r0", |s| {
        s.phase("c2", "q") == "Allocated"
    })
    .await;
    let got = addresses_of(&seed.held("c2", "q"));
    assert!(
        got.is_disjoint(&released),
        "c2 got {got:?} through q inside c1's hour of quarantine of {released:?}"
    );
}

/// A range pool of dc-1 over `cidr` (its size decides the division of its record: a /16 in
/// blocks of /24, a /8 in blocks of /20).
fn pool_over(name: &str, cidr: &str) -> serde_json::Value {
    range_pool(name, cidr, "default")
}

/// Issue 51, item 2: a pool deleted and created again under the same name, over a network
/// that its record divides otherwise, while a deposed leader still plans on the old pool.
/// The new leader gives y 10.0.1.0-3 (a /20 block); the deposed one, on its copy of the old
/// layout record (/24 blocks), would give x the same addresses: the /24 shard it needs does
/// not exist, so its create passes — its raise of the old layout record, which is gone, does
/// not, and the shard it created holds no entry. One it already held (its first /24) is gone
/// too: that commit is refused as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_made_again_under_its_name_refuses_a_replica_that_planned_on_the_old_one() {
    let api = setup_api().await;
    let old_pool = create(&api, pool_over("p", "10.0.0.0/16")).await;
    let key: RecordKey = ("p".into(), "dc-1".into());
    let old = replica(&api).await;
    load_records(&old).await;
    let old_view = PlannedOn::pools([&old_pool]);
    records::commit(
        &old,
        &old_pool,
        &key,
        entries(&[("w", "10.0.0.0-10.0.0.3")]),
        Default::default(),
        &old_view,
    )
    .await
    .unwrap();
    assert_eq!(
        holders(&api, "p"),
        vec![("w".to_string(), "p.dc-1.0a000000-24".to_string())]
    );

    // The pool goes (its records with it, by owner reference) and comes back as a /8.
    Api::<IPAMPool>::all(client(&api).await)
        .delete("p", &Default::default())
        .await
        .unwrap();
    let gone = api.list("ipampoolrecords", None);
    assert!(gone.is_empty(), "the records went with the pool: {gone:?}");
    let new_pool = create(&api, pool_over("p", "10.0.0.0/8")).await;
    let new = replica(&api).await;
    load_records(&new).await;
    records::commit(
        &new,
        &new_pool,
        &key,
        entries(&[("y", "10.0.1.0-10.0.1.3")]),
        Default::default(),
        &PlannedOn::pools([&new_pool]),
    )
    .await
    .unwrap();
    assert_eq!(
        holders(&api, "p"),
        vec![("y".to_string(), "p.dc-1.0a000000-20".to_string())]
    );

    // The deposed replica thaws and commits its plan: x in a /24 it never wrote, then x
    // beside w in the /24 it holds.
    for (attempt, plan) in [
        (
            "a new shard",
            vec![("w", "10.0.0.0-10.0.0.3"), ("x", "10.0.1.0-10.0.1.3")],
        ),
        (
            "the shard it held",
            vec![("w", "10.0.0.0-10.0.0.3"), ("x", "10.0.0.4-10.0.0.7")],
        ),
    ] {
        let stale = records::commit(
            &old,
            &old_pool,
            &key,
            entries(&plan),
            Default::default(),
            &old_view,
        )
        .await;
        assert!(is_refused(&stale), "refused ({attempt}): {stale:?}");
    }
    assert_eq!(
        holders(&api, "p"),
        vec![("y".to_string(), "p.dc-1.0a000000-20".to_string())],
        "nothing but y is held"
    );
}

/// Issue 51, item 2: a datacenter removed from a pool (the leader deletes its records) and
/// added back with another network, which its record divides otherwise, while a deposed
/// leader still plans on the datacenter as it was. Its commit into a shard of the old
/// division is refused, and the new leader's holding is the only one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datacenter_added_back_with_another_network_refuses_a_replica_that_planned_on_the_old_one()
 {
    let api = setup_api().await;
    let first = create(&api, pool_over("p", "10.0.0.0/16")).await;
    let key: RecordKey = ("p".into(), "dc-1".into());
    let (old, new) = (replica(&api).await, replica(&api).await);
    load_records(&old).await;
    let old_view = PlannedOn::pools([&first]);
    records::commit(
        &old,
        &first,
        &key,
        entries(&[("w", "10.0.0.0-10.0.0.3")]),
        Default::default(),
        &old_view,
    )
    .await
    .unwrap();

    // dc-1 removed (another datacenter kept, as a pool needs one): the new leader deletes
    // its records; then dc-1 added back as a /8.
    let removed = replace(&api, &first, |p| {
        let dc = p.spec.datacenters.remove("dc-1").unwrap();
        let mut other = dc.clone();
        other.pool_cidr = "10.200.0.0/16".into();
        p.spec.datacenters.insert("dc-2".into(), other);
    })
    .await;
    load_records(&new).await;
    records::remove(&new, &key).await.unwrap();
    assert!(holders(&api, "p").is_empty());
    let back = replace(&api, &removed, |p| {
        let mut dc = p.spec.datacenters["dc-2"].clone();
        dc.pool_cidr = "10.0.0.0/8".into();
        p.spec.datacenters.insert("dc-1".into(), dc);
    })
    .await;
    records::commit(
        &new,
        &back,
        &key,
        entries(&[("y", "10.0.1.0-10.0.1.3")]),
        Default::default(),
        &PlannedOn::pools([&back]),
    )
    .await
    .unwrap();

    let stale = records::commit(
        &old,
        &first,
        &key,
        entries(&[("w", "10.0.0.0-10.0.0.3"), ("x", "10.0.1.0-10.0.1.3")]),
        Default::default(),
        &old_view,
    )
    .await;
    assert!(is_refused(&stale), "refused: {stale:?}");
    assert_eq!(
        holders(&api, "p"),
        vec![("y".to_string(), "p.dc-1.0a000000-20".to_string())],
        "nothing but y is held"
    );
}

/// The pool datacenters `pool` shares addresses with, as a replica planning on `pools` and
/// its copy of the records groups them (what the planning pass gives the planner).
async fn siblings_of(ctx: &Context, pools: &[&IPAMPool], pool: &str) -> Vec<String> {
    let records = ctx.records.lock().await;
    let inputs: Vec<kipam::planner::PoolInput> = pools
        .iter()
        .map(|p| {
            let mut input = kipam::validation::pool_input(p).expect("a valid pool");
            records.add_former(&mut input);
            input
        })
        .collect();
    kipam::planner::space_siblings(&inputs)
        .get(&(pool.to_string(), "dc-1".to_string()))
        .map(|keys| keys.iter().map(|(p, _)| p.clone()).collect())
        .unwrap_or_default()
}

/// Issue 51, item 2: pool `a` covers 10.0.0.0/24 and, through `additionalCidrs`, 10.1.0.0/24,
/// which pool `b` (same space) covers too; then `a` is narrowed to 10.0.0.0/24 alone, so it
/// no longer overlaps `b`. A deposed leader frozen across the edit still plans them together:
/// it raises `b`'s fence (first), then would write x at 10.1.0.0-3 into `a`'s shard of that
/// /24, which exists (w holds 10.1.0.8-11 there). The new leader,
/// planning on the narrowed `a`, gives y the same addresses through `b` in between. Before,
/// the new leader planned `b` apart from `a`, never wrote `a`'s shard, and both commits
/// passed. Now `a`'s layout record remembers 10.1.0.0/24 (written by the new leader for the
/// narrowed generation before it plans): `a` stays `b`'s sibling, the new leader's commit
/// raises `a`'s fence there, and the deposed one's write into `a` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_narrowed_away_from_another_stays_fenced_against_a_replica_that_planned_before() {
    let api = setup_api().await;
    let wide = create(
        &api,
        json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "a"},
            "spec": {"datacenters": {"dc-1": {
                "type": "range", "poolCidr": "10.0.0.0/24",
                "additionalCidrs": ["10.1.0.0/24"], "allocationRange": 4,
            }}},
        }),
    )
    .await;
    let b = create(&api, range_pool("b", "10.1.0.0/24", "default")).await;
    let key_a: RecordKey = ("a".into(), "dc-1".into());
    let key_b: RecordKey = ("b".into(), "dc-1".into());
    let (old, new) = (replica(&api).await, replica(&api).await);

    // The old leader's pass: layout records up to the pools it reads; a and b together.
    load_records(&old).await;
    let old_view = PlannedOn::pools([&wide, &b]);
    records::keep_layouts(
        &old,
        &[Arc::new(wide.clone()), Arc::new(b.clone())],
        &old_view,
    )
    .await
    .unwrap();
    assert_eq!(siblings_of(&old, &[&wide, &b], "b").await, vec!["a"]);
    // w got 10.1.0.8-11 through a before: a's shard of 10.1.0.0/24 exists.
    records::commit_shared(
        &old,
        &wide,
        &key_a,
        entries(&[("w", "10.1.0.8-10.1.0.11")]),
        Default::default(),
        &[(b.clone(), key_b.clone())],
        &old_view,
    )
    .await
    .unwrap();

    // a is narrowed; the old leader is frozen with its plan: x at 10.1.0.0-3 through a. It
    // raised b's fence before the freeze.
    let narrow = replace(&api, &wide, |p| {
        p.spec
            .datacenters
            .get_mut("dc-1")
            .unwrap()
            .additional_cidrs
            .clear();
    })
    .await;
    let x: kipam::address::AddrRange = "10.1.0.0-10.1.0.3".parse().unwrap();
    records::raise_fences(&old, &b, &key_b, &[x], &old_view)
        .await
        .unwrap();

    // The new leader's pass: layout records first, then the plan and the commit of y.
    load_records(&new).await;
    let new_view = PlannedOn::pools([&narrow, &b]);
    let pools = [Arc::new(narrow.clone()), Arc::new(b.clone())];
    records::keep_layouts(&new, &pools, &new_view)
        .await
        .unwrap();
    let siblings = siblings_of(&new, &[&narrow, &b], "b").await;
    assert_eq!(
        siblings,
        vec!["a"],
        "a still reaches 10.1.0.0/24 for the fence"
    );
    let others: Vec<(IPAMPool, RecordKey)> = siblings
        .iter()
        .map(|_| (narrow.clone(), key_a.clone()))
        .collect();
    records::commit_shared(
        &new,
        &b,
        &key_b,
        entries(&[("y", "10.1.0.0-10.1.0.3")]),
        Default::default(),
        &others,
        &new_view,
    )
    .await
    .unwrap();

    // The old leader thaws and writes x into a: refused.
    let stale = records::commit(
        &old,
        &wide,
        &key_a,
        entries(&[("w", "10.1.0.8-10.1.0.11"), ("x", "10.1.0.0-10.1.0.3")]),
        Default::default(),
        &old_view,
    )
    .await;
    assert!(is_refused(&stale), "refused: {stale:?}");
    assert_eq!(stored(&api, "a"), entries(&[("w", "10.1.0.8-10.1.0.11")]));
    assert_eq!(stored(&api, "b"), entries(&[("y", "10.1.0.0-10.1.0.3")]));

    // Read afresh, the old replica's view of a is older than a's layout record: it waits.
    load_records(&old).await;
    let again = records::commit(
        &old,
        &wide,
        &key_a,
        entries(&[("w", "10.1.0.8-10.1.0.11"), ("x", "10.1.0.4-10.1.0.7")]),
        Default::default(),
        &old_view,
    )
    .await;
    assert!(
        matches!(again, Err(CommitError::PoolsBehind { .. })),
        "{again:?}"
    );
}
