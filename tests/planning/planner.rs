use kipam::allocator::Allocation;
use kipam::planner::{Change, ClusterInput, Plan, PoolInput, PoolOverride, StoredAllocation, plan};

use super::{cluster_in, pool_input, stored_after};

const METALLB: &str = "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/28
      allocationRange: 4
    dc-2:
      type: prefix
      poolCidr: 10.1.0.0/24
      allocationPrefix: 28
";

const EXTRA: &str = "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: extra
spec:
  reclaimPolicy: Retain
  datacenters:
    dc-1:
      type: range
      poolCidr: 2001:db8::/64
      allocationRange: 16
";

fn held(plan: &Plan, cluster: &str, pool: &str) -> String {
    plan.decision(cluster, pool)
        .and_then(|d| d.held.as_ref())
        .map(|a| a.to_string())
        .unwrap_or_default()
}

fn change(plan: &Plan, cluster: &str, pool: &str) -> Option<Change> {
    plan.decision(cluster, pool).map(|d| d.change)
}

fn pools() -> Vec<PoolInput> {
    vec![pool_input(METALLB), pool_input(EXTRA)]
}

#[test]
fn oldest_cluster_first_whatever_the_input_order() {
    let clusters = vec![
        cluster_in("young", "dc-1", 9),
        cluster_in("old", "dc-1", 1),
        cluster_in("middle", "dc-1", 5),
    ];
    let p = plan(&pools(), &clusters, &[]);
    assert_eq!(held(&p, "old", "metallb"), "10.0.0.0-10.0.0.3");
    assert_eq!(held(&p, "middle", "metallb"), "10.0.0.4-10.0.0.7");
    assert_eq!(held(&p, "young", "metallb"), "10.0.0.8-10.0.0.11");
    assert_eq!(held(&p, "old", "extra"), "2001:db8::-2001:db8::f");
    // Each cluster gets one allocation per pool that lists its datacenter.
    assert_eq!(p.decisions.len(), 6);
    assert!(p.decisions.iter().all(|d| d.change == Change::Create));
}

#[test]
fn rerun_keeps_everything_byte_for_byte() {
    let pools = pools();
    let clusters = vec![
        cluster_in("a", "dc-1", 1),
        cluster_in("b", "dc-2", 2),
        cluster_in("c", "dc-1", 3),
    ];
    let first = plan(&pools, &clusters, &[]);
    let second = plan(&pools, &clusters, &stored_after(&first, &pools));
    for (a, b) in first.decisions.iter().zip(&second.decisions) {
        assert_eq!(b.change, Change::Keep, "{b:?}");
        assert_eq!(a.held, b.held);
    }
    assert_eq!(first.usage, second.usage);
}

#[test]
fn growth_appends_and_lowering_releases_nothing() {
    let pools = pools();
    let mut clusters = vec![cluster_in("a", "dc-1", 1), cluster_in("b", "dc-1", 2)];
    let first = plan(&pools, &clusters, &[]);
    clusters[0]
        .overrides
        .insert("metallb".into(), PoolOverride::Addresses(6));
    let grown = plan(&pools, &clusters, &stored_after(&first, &pools));
    let d = grown.decision("a", "metallb").unwrap();
    assert_eq!(d.change, Change::Grow);
    assert_eq!(
        d.held.as_ref().unwrap().to_string(),
        "10.0.0.0-10.0.0.3,10.0.0.8-10.0.0.9"
    );
    assert_eq!(
        d.previous.as_ref().unwrap().to_string(),
        "10.0.0.0-10.0.0.3"
    );
    assert_eq!(change(&grown, "b", "metallb"), Some(Change::Keep));
    clusters[0]
        .overrides
        .insert("metallb".into(), PoolOverride::Addresses(2));
    let lowered = plan(&pools, &clusters, &stored_after(&grown, &pools));
    assert_eq!(change(&lowered, "a", "metallb"), Some(Change::Keep));
    assert_eq!(
        held(&lowered, "a", "metallb"),
        "10.0.0.0-10.0.0.3,10.0.0.8-10.0.0.9"
    );
}

#[test]
fn pins_are_taken_exactly_or_refused_with_the_reason() {
    let pools = pools();
    let mut clusters = vec![cluster_in("a", "dc-1", 1), cluster_in("pinned", "dc-2", 2)];
    clusters[1].overrides.insert(
        "metallb".into(),
        PoolOverride::PinnedCidr("10.1.0.128/28".parse().unwrap()),
    );
    // A younger cluster in dc-1 pins addresses an older one would otherwise get first.
    let mut young = cluster_in("young", "dc-1", 3);
    young.overrides.insert(
        "metallb".into(),
        PoolOverride::PinnedAddresses(vec!["10.0.0.0-10.0.0.1".parse().unwrap()]),
    );
    clusters.push(young);
    let p = plan(&pools, &clusters, &[]);
    assert_eq!(held(&p, "pinned", "metallb"), "10.1.0.128/28");
    assert_eq!(held(&p, "young", "metallb"), "10.0.0.0-10.0.0.1");
    assert_eq!(held(&p, "a", "metallb"), "10.0.0.2-10.0.0.5");

    // Moving a pin onto taken addresses is refused and the old addresses stay.
    clusters[2].overrides.insert(
        "metallb".into(),
        PoolOverride::PinnedAddresses(vec!["10.0.0.4-10.0.0.5".parse().unwrap()]),
    );
    let refused = plan(&pools, &clusters, &stored_after(&p, &pools));
    let d = refused.decision("young", "metallb").unwrap();
    assert_eq!(d.change, Change::Fail);
    assert_eq!(d.held.as_ref().unwrap().to_string(), "10.0.0.0-10.0.0.1");
    assert_eq!(
        d.message,
        "pinned 10.0.0.4-10.0.0.5 refused: pool metallb/dc-1 (10.0.0.0/28): pinned 10.0.0.4-10.0.0.5 of young is already taken by a; keeping 10.0.0.0-10.0.0.1"
    );
    // Moving it to free addresses replaces the allocation.
    clusters[2].overrides.insert(
        "metallb".into(),
        PoolOverride::PinnedAddresses(vec!["10.0.0.14-10.0.0.15".parse().unwrap()]),
    );
    let moved = plan(&pools, &clusters, &stored_after(&p, &pools));
    let d = moved.decision("young", "metallb").unwrap();
    assert_eq!(d.change, Change::Replace);
    assert_eq!(d.held.as_ref().unwrap().to_string(), "10.0.0.14-10.0.0.15");
    // A pin outside the pool.
    clusters[1].overrides.insert(
        "metallb".into(),
        PoolOverride::PinnedCidr("10.9.0.0/28".parse().unwrap()),
    );
    let outside = plan(&pools, &clusters, &[]);
    assert_eq!(
        outside.decision("pinned", "metallb").unwrap().message,
        "pinned 10.9.0.0/28 refused: pool metallb/dc-2 (10.1.0.0/24): pinned 10.9.0.0-10.9.0.15 of pinned is outside the pool"
    );
}

#[test]
fn opt_out_releases_and_allocates_nothing() {
    let pools = pools();
    let mut clusters = vec![cluster_in("a", "dc-1", 1)];
    let first = plan(&pools, &clusters, &[]);
    clusters[0]
        .overrides
        .insert("extra".into(), PoolOverride::OptOut);
    let p = plan(&pools, &clusters, &stored_after(&first, &pools));
    let d = p.decision("a", "extra").unwrap();
    assert_eq!(d.change, Change::Release);
    assert_eq!(d.message, "cluster a opted out of pool extra");
    assert_eq!(change(&p, "a", "metallb"), Some(Change::Keep));
    let again = plan(&pools, &clusters, &stored_after(&p, &pools));
    assert_eq!(again.decision("a", "extra"), None);
}

#[test]
fn exhaustion_fails_one_pool_only_and_frees_up_for_the_oldest_waiting() {
    let pools = pools();
    // metallb dc-1 holds 16 addresses: four clusters of 4.
    let mut clusters: Vec<ClusterInput> = (1..=6)
        .map(|i| cluster_in(&format!("c{i}"), "dc-1", i))
        .collect();
    let first = plan(&pools, &clusters, &[]);
    for i in 1..=4 {
        assert_eq!(
            change(&first, &format!("c{i}"), "metallb"),
            Some(Change::Create)
        );
    }
    for i in 5..=6 {
        let d = first.decision(&format!("c{i}"), "metallb").unwrap();
        assert_eq!(d.change, Change::Fail);
        assert_eq!(
            d.message,
            format!("pool metallb/dc-1 (10.0.0.0/28) has 0 free addresses, 4 requested by c{i}")
        );
        // The other pool is not blocked.
        assert_eq!(
            change(&first, &format!("c{i}"), "extra"),
            Some(Change::Create)
        );
    }
    // c2 goes away: c5 (older than c6) gets its addresses; nothing else moves.
    clusters.retain(|c| c.name != "c2");
    let second = plan(&pools, &clusters, &stored_after(&first, &pools));
    assert_eq!(change(&second, "c2", "metallb"), Some(Change::Release));
    assert_eq!(change(&second, "c2", "extra"), Some(Change::Release));
    assert_eq!(
        second.decision("c2", "metallb").unwrap().message,
        "cluster c2 no longer exists"
    );
    assert_eq!(change(&second, "c5", "metallb"), Some(Change::Create));
    assert_eq!(held(&second, "c5", "metallb"), "10.0.0.4-10.0.0.7");
    assert_eq!(change(&second, "c6", "metallb"), Some(Change::Fail));
    for c in ["c1", "c3", "c4"] {
        assert_eq!(change(&second, c, "metallb"), Some(Change::Keep));
        assert_eq!(held(&second, c, "metallb"), held(&first, c, "metallb"));
    }
}

#[test]
fn deleting_a_cluster_releases_its_allocations() {
    let pools = pools();
    let mut clusters = vec![cluster_in("a", "dc-1", 1)];
    let first = plan(&pools, &clusters, &[]);
    clusters[0].deleting = true;
    let p = plan(&pools, &clusters, &stored_after(&first, &pools));
    assert!(p.decisions.iter().all(|d| d.change == Change::Release));
    assert_eq!(
        p.decision("a", "metallb").unwrap().message,
        "cluster a is being deleted"
    );
}

#[test]
fn pool_and_datacenter_removal_honour_the_reclaim_policy() {
    let pools = pools();
    let clusters = vec![cluster_in("a", "dc-1", 1), cluster_in("b", "dc-2", 2)];
    let first = plan(&pools, &clusters, &[]);
    let stored = stored_after(&first, &pools);

    // Both pools gone: metallb (Delete) releases, extra (Retain) keeps.
    let p = plan(&[], &clusters, &stored);
    assert_eq!(change(&p, "a", "metallb"), Some(Change::Release));
    assert_eq!(
        p.decision("a", "metallb").unwrap().message,
        "pool metallb no longer exists"
    );
    let retained = p.decision("a", "extra").unwrap();
    assert_eq!(retained.change, Change::Retain);
    assert_eq!(
        retained.held.as_ref().unwrap().to_string(),
        "2001:db8::-2001:db8::f"
    );

    // extra comes back: the retained allocation is still reserved for its cluster.
    let back = plan(&pools, &clusters, &stored_after(&p, &pools));
    assert_eq!(change(&back, "a", "extra"), Some(Change::Keep));
    assert_eq!(held(&back, "a", "extra"), "2001:db8::-2001:db8::f");

    // dc-2 removed from metallb (Delete): b's allocation goes.
    let without_dc2 = pool_input(&METALLB.replace(
        "    dc-2:\n      type: prefix\n      poolCidr: 10.1.0.0/24\n      allocationPrefix: 28\n",
        "",
    ));
    let p = plan(&[without_dc2, pool_input(EXTRA)], &clusters, &stored);
    let d = p.decision("b", "metallb").unwrap();
    assert_eq!(d.change, Change::Release);
    assert_eq!(d.message, "datacenter dc-2 was removed from pool metallb");
    assert_eq!(change(&p, "a", "metallb"), Some(Change::Keep));
}

#[test]
fn paused_clusters_are_left_alone() {
    let pools = pools();
    let mut clusters = vec![cluster_in("a", "dc-1", 1)];
    clusters[0].paused = true;
    let p = plan(&pools, &clusters, &[]);
    assert!(p.decisions.is_empty());
    clusters[0].paused = false;
    let first = plan(&pools, &clusters, &[]);
    clusters[0].paused = true;
    clusters[0].datacenter = "dc-2".into();
    let p = plan(&pools, &clusters, &stored_after(&first, &pools));
    assert!(p.decisions.iter().all(|d| d.change == Change::Keep));
}

#[test]
fn moving_datacenter_replaces_the_allocation() {
    let pools = pools();
    let mut clusters = vec![cluster_in("a", "dc-1", 1)];
    let first = plan(&pools, &clusters, &[]);
    clusters[0].datacenter = "dc-2".into();
    let p = plan(&pools, &clusters, &stored_after(&first, &pools));
    let d = p.decision("a", "metallb").unwrap();
    assert_eq!(d.change, Change::Create);
    assert_eq!(d.datacenter, "dc-2");
    assert_eq!(d.held.as_ref().unwrap().to_string(), "10.1.0.0/28");
    assert_eq!(
        d.previous.as_ref().unwrap().to_string(),
        "10.0.0.0-10.0.0.3"
    );
    // extra does not serve dc-2.
    assert_eq!(change(&p, "a", "extra"), Some(Change::Release));
}

#[test]
fn conflicting_stored_allocations_are_kept_and_reported_never_moved() {
    let pools = pools();
    let clusters = vec![cluster_in("a", "dc-1", 1), cluster_in("b", "dc-1", 2)];
    let overlap = |cluster: &str| StoredAllocation {
        cluster: cluster.into(),
        pool: "metallb".into(),
        datacenter: "dc-1".into(),
        held: Some(Allocation::Range(vec![
            "10.0.0.0-10.0.0.3".parse().unwrap(),
        ])),
        reclaim_policy: None,
        unreadable: None,
    };
    let p = plan(&pools, &clusters, &[overlap("b"), overlap("a")]);
    // Both sides are reported; neither is released, moved or rewritten.
    let a = p.decision("a", "metallb").unwrap();
    assert_eq!(a.change, Change::Conflict);
    assert_eq!(a.held.as_ref().unwrap().to_string(), "10.0.0.0-10.0.0.3");
    assert!(a.message.contains("cluster b"), "{}", a.message);
    let d = p.decision("b", "metallb").unwrap();
    assert_eq!(d.change, Change::Conflict);
    assert_eq!(d.held.as_ref().unwrap().to_string(), "10.0.0.0-10.0.0.3");
    assert!(d.message.contains("already taken by a"), "{}", d.message);
}

/// The pool `metallb` of `pools()` in dc-1 (10.0.0.0/28, 4 per cluster) with an extra line.
fn range_pool(extra: &str) -> Vec<PoolInput> {
    vec![pool_input(&format!(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {{name: metallb}}\nspec:\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/28\n      allocationRange: 4\n{extra}"
    ))]
}

fn held_by(cluster: &str, text: &str) -> StoredAllocation {
    StoredAllocation {
        cluster: cluster.into(),
        pool: "metallb".into(),
        datacenter: "dc-1".into(),
        held: Some(Allocation::Range(
            text.split(',').map(|p| p.parse().unwrap()).collect(),
        )),
        reclaim_policy: None,
        unreadable: None,
    }
}

fn addresses_of(p: &kipam::planner::Plan, cluster: &str) -> Vec<(u128, u128)> {
    p.decision(cluster, "metallb")
        .and_then(|d| d.held.as_ref())
        .map(|h| h.ranges().map(|r| (r.first(), r.last())).collect())
        .unwrap_or_default()
}

fn disjoint(a: &[(u128, u128)], b: &[(u128, u128)]) -> bool {
    a.iter().all(|x| b.iter().all(|y| x.1 < y.0 || y.1 < x.0))
}

#[test]
fn an_invalid_cluster_keeps_its_addresses_and_nobody_else_gets_them() {
    let pools = range_pool("");
    let a = ClusterInput::invalid(
        "a",
        Some("2026-01-01T00:00:00Z".into()),
        "dc-1",
        false,
        "bad pin".into(),
    );
    let clusters = vec![a, cluster_in("b", "dc-1", 2)];
    let p = plan(&pools, &clusters, &[held_by("a", "10.0.0.0-10.0.0.3")]);
    let d = p.decision("a", "metallb").unwrap();
    assert_eq!(d.change, Change::Keep);
    assert!(d.message.contains("bad pin"), "{}", d.message);
    assert_eq!(addresses_of(&p, "b").len(), 1);
    assert!(disjoint(&addresses_of(&p, "a"), &addresses_of(&p, "b")));
}

#[test]
fn a_stored_allocation_under_a_new_exclusion_stays_reserved_and_is_reported() {
    let pools = range_pool("      excludeRanges: [\"10.0.0.2-10.0.0.5\"]\n");
    let clusters = vec![cluster_in("a", "dc-1", 1), cluster_in("b", "dc-1", 2)];
    let p = plan(&pools, &clusters, &[held_by("a", "10.0.0.0-10.0.0.3")]);
    let a = p.decision("a", "metallb").unwrap();
    assert_eq!(a.change, Change::Conflict);
    assert!(a.message.contains("10.0.0.2-10.0.0.5"), "{}", a.message);
    // b gets four addresses, none of a's.
    let b = addresses_of(&p, "b");
    assert!(
        disjoint(
            &[(
                a.held.as_ref().unwrap().ranges().next().unwrap().first(),
                a.held.as_ref().unwrap().ranges().next().unwrap().last()
            )],
            &b
        ),
        "{b:?}"
    );
}

#[test]
fn a_range_allocation_in_a_pool_now_of_prefix_type_stays_reserved() {
    let pools = vec![pool_input(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: metallb}\nspec:\n  datacenters:\n    dc-1:\n      type: prefix\n      poolCidr: 10.0.0.0/28\n      allocationPrefix: 30\n",
    )];
    let clusters = vec![cluster_in("a", "dc-1", 1), cluster_in("b", "dc-1", 2)];
    let p = plan(&pools, &clusters, &[held_by("a", "10.0.0.0-10.0.0.5")]);
    assert_eq!(change(&p, "a", "metallb"), Some(Change::Conflict));
    let b = p.decision("b", "metallb").unwrap();
    assert_eq!(b.held.as_ref().unwrap().to_string(), "10.0.0.8/30");
}

#[test]
fn an_unreadable_allocation_stops_new_allocations_in_its_pool_and_datacenter() {
    let pools = range_pool("");
    let clusters = vec![cluster_in("a", "dc-1", 1), cluster_in("b", "dc-1", 2)];
    let unreadable = StoredAllocation {
        cluster: "a".into(),
        pool: "metallb".into(),
        datacenter: "dc-1".into(),
        held: None,
        reclaim_policy: None,
        unreadable: Some("IPAMAllocation cluster-a/metallb cannot be read".into()),
    };
    let p = plan(&pools, &clusters, &[unreadable]);
    let a = p.decision("a", "metallb").unwrap();
    assert_eq!(a.change, Change::Conflict);
    assert!(a.held.is_none());
    let b = p.decision("b", "metallb").unwrap();
    assert_eq!(b.change, Change::Fail);
    assert!(
        b.message.contains("cluster-a/metallb cannot be read"),
        "{}",
        b.message
    );
}

#[test]
fn an_allocation_never_needs_more_pieces_than_its_object_can_hold() {
    // Every even address of 10.0.0.0/18 is held by somebody: only single odd addresses are
    // free, so 4,200 addresses would take 4,200 pieces.
    let pools = vec![pool_input(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: metallb}\nspec:\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/18\n      allocationRange: 1\n",
    )];
    let mut clusters = Vec::new();
    let mut stored = Vec::new();
    for i in 0..8192u32 {
        let name = format!("h{i:04}");
        clusters.push(cluster_in(&name, "dc-1", 1));
        let addr = std::net::Ipv4Addr::from(0x0a00_0000u32 + 2 * i);
        stored.push(held_by(&name, &addr.to_string()));
    }
    let mut big = cluster_in("z", "dc-1", 2);
    big.overrides
        .insert("metallb".into(), PoolOverride::Addresses(4200));
    clusters.push(big);
    let p = plan(&pools, &clusters, &stored);
    let z = p.decision("z", "metallb").unwrap();
    assert_eq!(z.change, Change::Fail);
    assert!(z.held.is_none());
    assert!(z.message.contains("4200 pieces"), "{}", z.message);
    // Nothing of it stays taken.
    let usage = &p.usage[&("metallb".to_string(), "dc-1".to_string())].usage;
    assert_eq!(usage.allocations, 8192);
}

/// A cluster being deleted gives up everything it holds, a `Retain` pool's allocations
/// included: `Retain` keeps addresses for clusters that stay when their pool goes, and a
/// retained allocation of a cluster being deleted would keep its release finalizer forever.
/// (Seen when `kubectl delete -f examples/` removed the pools and the clusters at once.)
#[test]
fn a_cluster_being_deleted_releases_what_a_retain_pool_kept() {
    let pools = pools();
    let mut clusters = vec![cluster_in("a", "dc-1", 1)];
    let first = plan(&pools, &clusters, &[]);
    let stored = stored_after(&first, &pools);
    clusters[0].deleting = true;
    // The pools go in the same moment: neither is in the planner's view any more.
    let p = plan(&[], &clusters, &stored);
    assert_eq!(change(&p, "a", "extra"), Some(Change::Release));
    assert_eq!(change(&p, "a", "metallb"), Some(Change::Release));
    assert_eq!(
        p.decision("a", "extra").unwrap().message,
        "cluster a is being deleted"
    );
    // A datacenter removed from a Retain pool: the same.
    let extra_elsewhere = pool_input(&EXTRA.replace("dc-1:", "dc-9:"));
    let p = plan(&[extra_elsewhere], &clusters, &stored);
    assert_eq!(change(&p, "a", "extra"), Some(Change::Release));
}
