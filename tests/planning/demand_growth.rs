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
    // `max` counts every CIDR of the pool datacenter.
    let two = pool_messages(
        "type: range\npoolCidr: 192.168.1.0/26\nadditionalCidrs: [192.168.2.0/26]\nallocationRange: 2\ngrowth: {max: 100}",
    );
    assert_eq!(two, Vec::<String>::new());
    let too_many = pool_messages(
        "type: range\npoolCidr: 192.168.1.0/26\nadditionalCidrs: [192.168.2.0/26]\nallocationRange: 2\ngrowth: {max: 129}",
    );
    assert_eq!(
        too_many,
        vec!["IPAMPool metallb: spec.datacenters[dc-1].growth.max \"129\": exceeds the 128 addresses of the pool's CIDRs".to_string()]
    );
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
            "IPAMPool metallb: spec.datacenters[dc-1].growth.shrinkAfter \"30s\": is too small: it must be between 1m and 30d",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 8, shrinkAfter: 31d}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth.shrinkAfter \"31d\": is too large: it must be between 1m and 30d",
        ),
        (
            "type: range\npoolCidr: 192.168.1.0/26\nallocationRange: 2\ngrowth: {max: 8, shrinkAfter: 30m1h}",
            "IPAMPool metallb: spec.datacenters[dc-1].growth.shrinkAfter \"30m1h\": gives a unit twice or out of order (1h30m, not 30m1h); write a duration such as 30s, 10m, 1h30m or 7d (it must be between 1m and 30d)",
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

// ---------------------------------------------------------------------------------------
// The decision over random Service churn and clock steps, applied to the real allocator.

mod churn {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use kipam::address::{AddrRange, Cidr};
    use kipam::allocator::{
        Allocation, PoolAllocator, PoolConfig, PoolKind, Request, Strategy as Fit,
    };
    use kipam::planner::growth::{
        Demand, GrowthInput, GrowthPolicy, Holding, Piece, Waiting, apply_outcome, decide,
    };
    use kipam::resources::PieceKind;

    const CLUSTERS: usize = 3;
    const SHRINK_AFTER: u64 = 600;
    const GRACE: i64 = 5;

    #[derive(Clone, Debug)]
    enum Op {
        /// A LoadBalancer Service is created in a user cluster.
        Create(usize),
        /// The n-th Service of a user cluster (modulo their number) is deleted.
        Delete(usize, usize),
        /// MetalLB runs in a user cluster: hands free held addresses to waiting Services and
        /// refuses the rest (possibly long after kipam grew the allocation).
        MetalLb(usize),
        /// The clock moves.
        Tick(u32),
        /// A planning pass: decide and apply.
        Pass,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..CLUSTERS).prop_map(Op::Create),
            2 => (0..CLUSTERS, 0usize..8).prop_map(|(c, n)| Op::Delete(c, n)),
            3 => (0..CLUSTERS).prop_map(Op::MetalLb),
            3 => (1u32..400).prop_map(Op::Tick),
            4 => Just(Op::Pass),
        ]
    }

    #[derive(Default)]
    struct Service {
        id: u64,
        address: Option<u128>,
        since: i64,
        refused: bool,
    }

    #[derive(Default)]
    struct UserCluster {
        services: Vec<Service>,
        /// Addresses some Service held at any moment since the last pass (what a watch saw).
        used_since_pass: BTreeSet<u128>,
        /// Piece -> (services waiting when it was grown).
        grown_for: BTreeMap<AddrRange, BTreeSet<u64>>,
        /// What kipam recorded of its pieces.
        pieces: Vec<Piece>,
    }

    fn held(a: &PoolAllocator, c: usize) -> Vec<AddrRange> {
        match a.get(&format!("c{c}")) {
            Some(Allocation::Range(p)) => p.clone(),
            _ => Vec::new(),
        }
    }

    fn contains(pieces: &[AddrRange], addr: u128) -> bool {
        pieces.iter().any(|p| p.first() <= addr && addr <= p.last())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn no_oscillation_and_no_address_twice(
            increment in 1u128..4,
            max in 4u128..14,
            pool_bits in 4u32..6,
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let cidr: Cidr = format!("10.0.0.0/{}", 32 - pool_bits).parse().unwrap();
            let mut allocator = PoolAllocator::new(PoolConfig::new(
                cidr,
                PoolKind::Range { allocation_range: 2 },
                Fit::FirstFit,
            )).unwrap();
            let mut users: Vec<UserCluster> = (0..CLUSTERS).map(|_| UserCluster::default()).collect();
            for (c, user) in users.iter_mut().enumerate() {
                allocator.allocate(&format!("c{c}"), Request::Addresses(2)).unwrap();
                user.pieces = held(&allocator, c).into_iter().map(|r| Piece {
                    range: r, kind: PieceKind::Initial, grown_at: None, unused_since: None,
                }).collect();
            }
            let policy = GrowthPolicy { increment, max, shrink_after: SHRINK_AFTER };
            let mut now: i64 = 1_000;
            let mut next_id = 0u64;
            // Address -> last moment a Service held it.
            let mut last_used: BTreeMap<u128, i64> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Create(c) => {
                        next_id += 1;
                        users[c].services.push(Service { id: next_id, since: now, ..Default::default() });
                    }
                    Op::Delete(c, n) => {
                        let user = &mut users[c];
                        if !user.services.is_empty() {
                            let s = user.services.remove(n % user.services.len());
                            if let Some(a) = s.address {
                                last_used.insert(a, now);
                            }
                        }
                    }
                    Op::MetalLb(c) => {
                        let pieces = held(&allocator, c);
                        let user = &mut users[c];
                        let taken: BTreeSet<u128> = user.services.iter().filter_map(|s| s.address).collect();
                        let mut free = pieces.iter().flat_map(|p| p.first()..=p.last()).filter(|a| !taken.contains(a));
                        for s in user.services.iter_mut().filter(|s| s.address.is_none()) {
                            match free.next() {
                                Some(a) => { s.address = Some(a); user.used_since_pass.insert(a); last_used.insert(a, now); }
                                None => s.refused = true,
                            }
                        }
                    }
                    Op::Tick(secs) => {
                        for user in &users {
                            for a in user.services.iter().filter_map(|s| s.address) {
                                last_used.insert(a, now);
                            }
                        }
                        now += secs as i64;
                    }
                    Op::Pass => {
                        for user in &mut users {
                            for a in user.services.iter().filter_map(|s| s.address) {
                                user.used_since_pass.insert(a);
                                last_used.insert(a, now);
                            }
                        }
                        let free = allocator.usage().available.to_u128().unwrap();
                        let holdings: Vec<Holding> = users.iter().enumerate().map(|(c, u)| Holding {
                            cluster: format!("c{c}"),
                            pool: "metallb".into(),
                            datacenter: "dc".into(),
                            pieces: u.pieces.clone(),
                            initial: 2,
                            policy: Some(policy),
                            shrink_after: Some(SHRINK_AFTER),
                            demand: Demand {
                                known: true,
                                waiting: u.services.iter().filter(|s| s.address.is_none()).map(|s| Waiting {
                                    service: format!("ns/s{}", s.id), since: s.since, refused: s.refused,
                                }).collect(),
                                used: u.services.iter().filter_map(|s| s.address).collect(),
                                touched: u.used_since_pass.clone(),
                            },
                        }).collect();
                        let input = GrowthInput {
                            holdings,
                            free: BTreeMap::from([(("metallb".to_string(), "dc".to_string()), free)]),
                            pending_grace: GRACE,
                            now,
                        };
                        let outcomes = decide(&input);
                        for (c, outcome) in outcomes.iter().enumerate() {
                            let counted = input.holdings[c].demand.waiting.iter()
                                .filter(|w| w.refused || now - w.since >= GRACE).count() as u128;
                            let user = &mut users[c];
                            for r in &outcome.release {
                                // Nobody waits, and none of the Services it was grown for is
                                // still there without an address or on one of its addresses.
                                prop_assert!(input.holdings[c].demand.waiting.is_empty(), "released {r} while Services wait");
                                let alive: BTreeSet<u64> = user.services.iter().map(|s| s.id).collect();
                                for id in user.grown_for.get(r).into_iter().flatten() {
                                    let s = user.services.iter().find(|s| s.id == *id);
                                    prop_assert!(
                                        !alive.contains(id) || s.is_some_and(|s| s.address.is_some_and(|a| !contains(&[*r], a))),
                                        "released {r} while Service {id} that caused it persists"
                                    );
                                }
                                for a in r.first()..=r.last() {
                                    if let Some(t) = last_used.get(&a) {
                                        prop_assert!(now - t >= SHRINK_AFTER as i64, "released {a} {}s after its last use", now - t);
                                    }
                                }
                            }
                            if outcome.changes_nothing() {
                                user.pieces = outcome.pieces.clone();
                                continue;
                            }
                            let unused_before: u128 = {
                                let pieces = held(&allocator, c);
                                let n: u128 = pieces.iter().map(|p| p.last() - p.first() + 1).sum();
                                n - user.services.iter().filter(|s| s.address.is_some_and(|a| contains(&pieces, a))).count() as u128
                            };
                            let applied = apply_outcome(&mut allocator, outcome, now).map_err(TestCaseError::fail)?;
                            if !applied.added.is_empty() {
                                // One waiting Service never causes two growths: what is unused
                                // after growth is less than the demand plus one increment.
                                let grown: u128 = applied.added.iter().map(|p| p.last() - p.first() + 1).sum();
                                let released: u128 = applied.released.iter().map(|p| p.last() - p.first() + 1).sum();
                                prop_assert!(unused_before + grown - released < counted + increment,
                                    "grew {grown} with {unused_before} unused for {counted} waiting");
                                let waiting: BTreeSet<u64> = user.services.iter().filter(|s| s.address.is_none()).map(|s| s.id).collect();
                                for p in &applied.added {
                                    user.grown_for.insert(*p, waiting.clone());
                                }
                            }
                            let total: u128 = held(&allocator, c).iter().map(|p| p.last() - p.first() + 1).sum();
                            prop_assert!(total <= max.max(2), "holds {total} > max {max}");
                            user.pieces = applied.pieces.clone();
                        }
                        for user in &mut users {
                            user.used_since_pass.clear();
                        }
                    }
                }
                // The promise: no address held by two clusters, every Service's address held
                // by its own cluster.
                let mut seen: BTreeSet<u128> = BTreeSet::new();
                for (c, user) in users.iter().enumerate() {
                    let pieces = held(&allocator, c);
                    for p in &pieces {
                        for a in p.first()..=p.last() {
                            prop_assert!(seen.insert(a), "address {a} held twice");
                        }
                    }
                    for s in &user.services {
                        if let Some(a) = s.address {
                            prop_assert!(contains(&pieces, a), "Service s{} of c{c} on {a}, which c{c} no longer holds", s.id);
                        }
                    }
                    let kinds: Vec<AddrRange> = user.pieces.iter().map(|p| p.range).collect();
                    prop_assert_eq!(&kinds, &pieces, "status pieces follow the allocation");
                }
            }
        }
    }
}

/// A grown piece given back where the pool datacenter has `reuseAfter` is quarantined for its
/// cluster like any released address: listed in the plan's quarantine (what the fenced commit
/// records) and handed to nobody else before the period ends.
#[test]
fn a_grown_piece_given_back_follows_the_quarantine() {
    use kipam::address::AddrRange;
    use kipam::planner::growth::{Outcome, Piece, apply};
    use kipam::resources::PieceKind;

    let pools = vec![super::pool_input(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: lb\nspec:\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/29\n      allocationRange: 2\n      reuseAfter: 1h\n      growth: {increment: 2, max: 6}\n",
    )];
    let range = |t: &str| AddrRange::parse_lenient(t).expect("a range");
    let now: i64 = 1_800_000_000;
    let hour = |_: &str, _: &str| 3600u64;
    let piece = |r: &str, kind: PieceKind| Piece {
        range: range(r),
        kind,
        grown_at: (kind == PieceKind::Grown).then_some(now - 7200),
        unused_since: (kind == PieceKind::Grown).then_some(now - 7200),
    };
    let outcome = |grow: u128, release: Vec<AddrRange>, pieces: Vec<Piece>| Outcome {
        cluster: "c1".into(),
        pool: "lb".into(),
        datacenter: "dc-1".into(),
        grow,
        release,
        pieces,
        unmet: Vec::new(),
        notes: Vec::new(),
    };
    let c1 = vec![super::cluster_in("c1", "dc-1", 1)];

    // c1 holds its initial 10.0.0.0-1 (growth applies to an allocation kept as it is) and
    // grows by 2.
    let (first, _) = kipam::planner::plan_at(&pools, &c1, &[], &[], now - 7300);
    let stored = super::stored_after(&first, &pools);
    let (mut plan, mut states) = kipam::planner::plan_at(&pools, &c1, &stored, &[], now - 7200);
    let initial = vec![piece("10.0.0.0-10.0.0.1", PieceKind::Initial)];
    let (applied, refused) = apply(
        &mut plan,
        &mut states,
        &[outcome(2, Vec::new(), initial.clone())],
        now - 7200,
        &hour,
    );
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(applied[0].added, vec![range("10.0.0.2-10.0.0.3")]);
    let stored = super::stored_after(&plan, &pools);

    // Two hours later the grown piece is given back: quarantined for c1.
    let (mut plan, mut states) = kipam::planner::plan_at(&pools, &c1, &stored, &[], now);
    let mut pieces = initial.clone();
    pieces.push(piece("10.0.0.2-10.0.0.3", PieceKind::Grown));
    let (applied, refused) = apply(
        &mut plan,
        &mut states,
        &[outcome(0, vec![range("10.0.0.2-10.0.0.3")], pieces.clone())],
        now,
        &hour,
    );
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(applied[0].released, vec![range("10.0.0.2-10.0.0.3")]);
    let quarantined: Vec<(String, i64, Vec<String>)> = plan
        .quarantined
        .iter()
        .map(|q| {
            (
                q.holder.clone(),
                q.released_at,
                q.addresses.iter().map(|a| a.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(
        quarantined,
        vec![("c1".to_string(), now, vec!["10.0.0.2-10.0.0.3".to_string()])]
    );

    // A newcomer within the hour gets other addresses; after it, the quarantined ones.
    let stored = super::stored_after(&plan, &pools);
    let both = vec![
        super::cluster_in("c1", "dc-1", 1),
        super::cluster_in("c2", "dc-1", 2),
    ];
    let held_by_c2 = |at: i64| {
        let (plan, _) = kipam::planner::plan_at(&pools, &both, &stored, &plan.quarantined, at);
        plan.decisions
            .iter()
            .find(|d| d.cluster == "c2")
            .and_then(|d| d.held.as_ref())
            .map(|h| h.ranges().map(|r| r.to_string()).collect::<Vec<_>>())
    };
    assert_eq!(
        held_by_c2(now + 60),
        Some(vec!["10.0.0.4-10.0.0.5".to_string()])
    );
    assert_eq!(
        held_by_c2(now + 3601),
        Some(vec!["10.0.0.2-10.0.0.3".to_string()])
    );

    // Without reuseAfter the piece is free at once.
    let (mut plan, mut states) =
        kipam::planner::plan_at(&pools, &c1, &stored_grown(&pools, now), &[], now);
    let (_, refused) = apply(
        &mut plan,
        &mut states,
        &[outcome(0, vec![range("10.0.0.2-10.0.0.3")], pieces)],
        now,
        &|_: &str, _: &str| 0,
    );
    assert!(refused.is_empty(), "{refused:?}");
    assert!(plan.quarantined.is_empty());
}

/// c1 holding 10.0.0.0-10.0.0.3 in pool `lb` (its initial two and a grown two).
fn stored_grown(
    pools: &[kipam::planner::PoolInput],
    now: i64,
) -> Vec<kipam::planner::StoredAllocation> {
    use kipam::planner::growth::{Outcome, Piece, apply};
    let c1 = vec![super::cluster_in("c1", "dc-1", 1)];
    let (first, _) = kipam::planner::plan_at(pools, &c1, &[], &[], now);
    let stored = super::stored_after(&first, pools);
    let (mut plan, mut states) = kipam::planner::plan_at(pools, &c1, &stored, &[], now);
    let initial = Piece {
        range: kipam::address::AddrRange::parse_lenient("10.0.0.0-10.0.0.1").expect("a range"),
        kind: kipam::resources::PieceKind::Initial,
        grown_at: None,
        unused_since: None,
    };
    let grow = Outcome {
        cluster: "c1".into(),
        pool: "lb".into(),
        datacenter: "dc-1".into(),
        grow: 2,
        release: Vec::new(),
        pieces: vec![initial],
        unmet: Vec::new(),
        notes: Vec::new(),
    };
    apply(&mut plan, &mut states, &[grow], now, &|_: &str, _: &str| 0);
    super::stored_after(&plan, pools)
}
