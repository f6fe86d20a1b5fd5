//! Growing a full pool in place: random pools, random holdings, random edits of `poolCidr` and
//! `additionalCidrs`. An edit the rules accept moves nothing, hands out nothing outside the
//! pool, and serves the clusters that waited, oldest first; an edit they refuse would have
//! stranded a holding (or is no widening, or makes CIDRs overlap).

use std::collections::BTreeSet;

use kipam::address::{AddrRange, Cidr};
use kipam::allocator::Allocation;
use kipam::planner::{Change, ClusterInput, Plan, PoolInput, StoredAllocation, plan};
use kipam::resources::IPAMPool;
use proptest::prelude::*;

use super::{cluster_in, pool, stored_after};

/// CIDRs an edit may add: below, above and beside `10.0.0.0/27` and its supernets.
const EXTRA: [&str; 6] = [
    "10.0.1.0/28",
    "10.0.2.0/29",
    "10.0.3.0/28",
    "10.0.0.128/28",
    "10.0.0.32/28",
    "10.0.4.0/30",
];
/// What `poolCidr` may become: itself, supernets of it, a narrower and another network.
const POOL_CIDRS: [&str; 5] = [
    "10.0.0.0/27",
    "10.0.0.0/26",
    "10.0.0.0/25",
    "10.0.0.0/28",
    "10.0.0.32/27",
];

#[derive(Clone, Debug)]
struct Case {
    prefix: bool,
    best_fit: bool,
    /// Indexes into `EXTRA`, in fill order.
    before: Vec<usize>,
    after_pool: usize,
    after: Vec<usize>,
    /// Creation day of each cluster.
    days: Vec<u32>,
}

fn indexes(max: usize) -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec((0..EXTRA.len(), any::<u16>()), 0..=max).prop_map(|mut v| {
        v.sort_by_key(|x| x.0);
        v.dedup_by_key(|x| x.0);
        v.sort_by_key(|x| x.1);
        v.into_iter().map(|x| x.0).collect()
    })
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<bool>(),
        any::<bool>(),
        indexes(2),
        prop_oneof![3 => 0..3usize, 1 => 3..5usize],
        indexes(4),
        proptest::collection::vec(1..28u32, 4..12),
    )
        .prop_map(|(prefix, best_fit, before, after_pool, after, days)| Case {
            prefix,
            best_fit,
            before,
            after_pool,
            after,
            days,
        })
}

fn pool_yaml(c: &Case, pool_cidr: &str, extra: &[usize]) -> IPAMPool {
    let kind = if c.prefix {
        "type: prefix\n      allocationPrefix: 29"
    } else {
        "type: range\n      allocationRange: 6"
    };
    let strategy = if c.best_fit { "BestFit" } else { "FirstFit" };
    let more: Vec<&str> = extra.iter().map(|i| EXTRA[*i]).collect();
    pool(&format!(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: metallb\nspec:\n  datacenters:\n    dc-1:\n      {kind}\n      strategy: {strategy}\n      poolCidr: {pool_cidr}\n      additionalCidrs: [{}]\n",
        more.join(", ")
    ))
}

fn cidrs_of(input: &PoolInput) -> Vec<Cidr> {
    input.datacenters["dc-1"].config.cidrs().collect()
}

fn inside(cidrs: &[Cidr], r: &AddrRange) -> bool {
    (r.first()..=r.last()).all(|a| cidrs.iter().any(|c| a >= c.first() && a <= c.last()))
}

fn held(plan: &Plan) -> Vec<(String, Allocation)> {
    plan.decisions
        .iter()
        .filter_map(|d| Some((d.cluster.clone(), d.held.clone()?)))
        .collect()
}

/// No two holders share an address and every address held lies in the pool's CIDRs.
fn check_holdings(plan: &Plan, cidrs: &[Cidr]) -> Result<(), TestCaseError> {
    let mut pieces: Vec<(u128, u128, String)> = Vec::new();
    for (cluster, h) in held(plan) {
        for r in h.ranges() {
            prop_assert!(
                inside(cidrs, &r),
                "{} of {} is outside the pool",
                r,
                cluster
            );
            pieces.push((r.first(), r.last(), cluster.clone()));
        }
    }
    pieces.sort();
    for w in pieces.windows(2) {
        prop_assert!(w[0].1 < w[1].0, "{:?} and {:?} overlap", w[0], w[1]);
    }
    Ok(())
}

fn run(c: Case) -> Result<(), TestCaseError> {
    let clusters: Vec<ClusterInput> = c
        .days
        .iter()
        .enumerate()
        .map(|(i, day)| cluster_in(&format!("c{i:02}"), "dc-1", *day))
        .collect();
    // A prefix pool's CIDRs must each hold one /29.
    let too_small = |i: &usize| c.prefix && EXTRA[*i].parse::<Cidr>().unwrap().prefix_len() > 29;
    let before: Vec<usize> = c.before.iter().copied().filter(|i| !too_small(i)).collect();
    let old = pool_yaml(&c, POOL_CIDRS[0], &before);
    let old_input = kipam::validation::pool_input(&old).expect("valid starting pool");
    let first = plan(std::slice::from_ref(&old_input), &clusters, &[]);
    check_holdings(&first, &cidrs_of(&old_input))?;
    let stored: Vec<StoredAllocation> = stored_after(&first, std::slice::from_ref(&old_input));

    let new = pool_yaml(&c, POOL_CIDRS[c.after_pool], &c.after);
    let verdict = kipam::validation::validate_pool(&new, Some(&old), &stored);
    let new_cidrs: Vec<Cidr> = std::iter::once(POOL_CIDRS[c.after_pool])
        .chain(c.after.iter().map(|i| EXTRA[*i]))
        .map(|t| t.parse().unwrap())
        .collect();
    let stranded: Vec<String> = held(&first)
        .into_iter()
        .filter(|(_, h)| h.ranges().any(|r| !inside(&new_cidrs, &r)))
        .map(|(c, _)| c)
        .collect();
    let input = match verdict {
        Err(errors) => {
            let old_cidr: Cidr = POOL_CIDRS[0].parse().unwrap();
            let widening = new_cidrs[0].contains(&old_cidr.range());
            let overlapping = new_cidrs.iter().enumerate().any(|(i, a)| {
                new_cidrs[..i]
                    .iter()
                    .any(|b| a.range().overlaps(&b.range()))
            });
            let small = c.after.iter().any(too_small);
            prop_assert!(
                !widening || !stranded.is_empty() || overlapping || small,
                "refused without cause: {errors:?}"
            );
            let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            let text = text.join("; ");
            for cluster in &stranded {
                prop_assert!(
                    text.contains(cluster.as_str()) || text.contains("more"),
                    "{} not named in {}",
                    cluster,
                    text
                );
            }
            return Ok(());
        }
        Ok(input) => input,
    };
    prop_assert!(stranded.is_empty(), "accepted, stranding {:?}", stranded);

    let second = plan(std::slice::from_ref(&input), &clusters, &stored);
    check_holdings(&second, &new_cidrs)?;
    // Nothing moves: every holding is kept, byte for byte.
    for (cluster, was) in held(&first) {
        let d = second
            .decisions
            .iter()
            .find(|d| d.cluster == cluster)
            .expect("decided");
        prop_assert_eq!(d.change, Change::Keep, "{}", &d.message);
        prop_assert_eq!(d.held.as_ref(), Some(&was));
    }
    // The clusters that waited are served oldest first: no waiting cluster is passed over by
    // a younger one (all ask for the same size).
    let waited: BTreeSet<String> = first
        .decisions
        .iter()
        .filter(|d| d.change == Change::Fail)
        .map(|d| d.cluster.clone())
        .collect();
    let mut by_age: Vec<&ClusterInput> = clusters
        .iter()
        .filter(|cl| waited.contains(&cl.name))
        .collect();
    by_age.sort_by(|a, b| a.age_key().cmp(&b.age_key()));
    let served: Vec<bool> = by_age
        .iter()
        .map(|cl| {
            second
                .decisions
                .iter()
                .any(|d| d.cluster == cl.name && d.change == Change::Create)
        })
        .collect();
    if let Some(gap) = served.iter().position(|s| !s) {
        prop_assert!(
            served[gap..].iter().all(|s| !s),
            "a younger cluster was served before an older one: {:?}",
            served
        );
    }
    // And the grown pool serves them exactly when it has room (the whole space is in use).
    if served.iter().any(|s| !s) {
        let usage = &second.usage[&("metallb".to_string(), "dc-1".to_string())].usage;
        let size = if c.prefix { 8u64 } else { 6u64 };
        prop_assert!(
            c.prefix || usage.available < size.into(),
            "a range cluster waits with {} addresses free",
            usage.available
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn accepted_edits_move_nothing_and_serve_the_waiting(c in case()) {
        run(c)?;
    }
}

#[test]
fn a_full_pool_grown_serves_its_waiting_clusters_oldest_first() {
    let c = Case {
        prefix: false,
        best_fit: false,
        before: vec![],
        after_pool: 1,
        after: vec![0],
        days: vec![5, 1, 9, 3, 7, 2, 8],
    };
    let clusters: Vec<ClusterInput> = c
        .days
        .iter()
        .enumerate()
        .map(|(i, day)| cluster_in(&format!("c{i:02}"), "dc-1", *day))
        .collect();
    let old = pool_yaml(&c, POOL_CIDRS[0], &[]);
    let old_input = kipam::validation::pool_input(&old).unwrap();
    let first = plan(std::slice::from_ref(&old_input), &clusters, &[]);
    // A /27 holds five clusters of 6 (30 addresses): the two youngest wait.
    let failed: Vec<&str> = first
        .decisions
        .iter()
        .filter(|d| d.change == Change::Fail)
        .map(|d| d.cluster.as_str())
        .collect();
    assert_eq!(failed, ["c02", "c06"]);
    let stored = stored_after(&first, std::slice::from_ref(&old_input));
    // Widened to a /26 and given a CIDR: both served, from the new space, nothing moved.
    let new = pool_yaml(&c, POOL_CIDRS[1], &[0]);
    let input = kipam::validation::validate_pool(&new, Some(&old), &stored).unwrap();
    let second = plan(std::slice::from_ref(&input), &clusters, &stored);
    let got: Vec<(String, String)> = second
        .decisions
        .iter()
        .filter(|d| d.change != Change::Keep)
        .map(|d| (d.cluster.clone(), d.held.as_ref().unwrap().to_string()))
        .collect();
    // c06 (day 8) is older than c02 (day 9): served first, with the last two addresses of
    // the old /27 and the first four of the widened part.
    assert_eq!(
        got,
        [
            ("c02".to_string(), "10.0.0.36-10.0.0.41".to_string()),
            ("c06".to_string(), "10.0.0.30-10.0.0.35".to_string()),
        ]
    );
}
