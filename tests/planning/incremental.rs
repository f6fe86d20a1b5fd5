//! Incremental planning gives the whole-seed plan: after every event of a random sequence,
//! replanning only the pools `changed_pools` names and patching the previous plan with them —
//! or, for a cluster new to the seed, serving it from the kept allocators (`serve_new`) when
//! that is allowed — must give exactly the plan of the whole seed.

use std::collections::BTreeMap;

use kipam::planner::{
    ClusterInput, Plan, PlanInputs, PoolInput, PoolOverride, PoolStates, changed_pools,
    plan_pools_keeping, serve_new,
};
use proptest::prelude::*;

use super::{cluster_in, pool_input, stored_after};

const CLUSTERS: usize = 8;
const POOLS: usize = 4;
const DATACENTERS: [&str; 2] = ["dc-1", "dc-2"];

#[derive(Clone, Debug)]
enum Event {
    AddCluster {
        c: usize,
        dc: usize,
        day: u32,
    },
    RemoveCluster {
        c: usize,
    },
    MoveCluster {
        c: usize,
        dc: usize,
    },
    Pause {
        c: usize,
        on: bool,
    },
    Deleting {
        c: usize,
    },
    OptOut {
        c: usize,
        pool: usize,
        on: bool,
    },
    Ask {
        c: usize,
        pool: usize,
        addresses: u128,
    },
    Invalid {
        c: usize,
        on: bool,
    },
    PutPool {
        pool: usize,
        shape: usize,
    },
    RemovePool {
        pool: usize,
    },
    /// The plan's writes land: what is stored becomes what the current plan holds.
    WritesLand,
    /// One stored allocation deleted by hand.
    DropStored {
        index: usize,
    },
    /// The clock moves on.
    Tick {
        minutes: i64,
    },
}

fn event() -> impl Strategy<Value = Event> {
    let c = 0..CLUSTERS;
    let pool = 0..POOLS;
    prop_oneof![
        4 => (c.clone(), 0..2usize, 1..28u32).prop_map(|(c, dc, day)| Event::AddCluster { c, dc, day }),
        1 => c.clone().prop_map(|c| Event::RemoveCluster { c }),
        1 => (c.clone(), 0..2usize).prop_map(|(c, dc)| Event::MoveCluster { c, dc }),
        1 => (c.clone(), any::<bool>()).prop_map(|(c, on)| Event::Pause { c, on }),
        1 => c.clone().prop_map(|c| Event::Deleting { c }),
        1 => (c.clone(), pool.clone(), any::<bool>()).prop_map(|(c, pool, on)| Event::OptOut { c, pool, on }),
        1 => (c.clone(), pool.clone(), 1..9u128).prop_map(|(c, pool, addresses)| Event::Ask { c, pool, addresses }),
        1 => (c, any::<bool>()).prop_map(|(c, on)| Event::Invalid { c, on }),
        3 => (pool.clone(), 0..13usize).prop_map(|(pool, shape)| Event::PutPool { pool, shape }),
        2 => (1..90i64).prop_map(|minutes| Event::Tick { minutes }),
        1 => pool.prop_map(|pool| Event::RemovePool { pool }),
        5 => Just(Event::WritesLand),
        1 => (0..64usize).prop_map(|index| Event::DropStored { index }),
    ]
}

/// Pool `i` in one of a few shapes: small ranges that run out, two datacenters, a prefix
/// pool, a `Retain` pool, an exclusion, and shape 0 grown: another CIDR, then a wider
/// `poolCidr` and a third CIDR; shape 2 with another CIDR.
fn pool(i: usize, shape: usize) -> PoolInput {
    let name = format!("pool-{i}");
    let body = match shape {
        0 => format!(
            "datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.{i}.0.0/28\n      allocationRange: 4\n"
        ),
        1 => format!(
            "datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.{i}.0.0/27\n      allocationRange: 4\n    dc-2:\n      type: range\n      poolCidr: 10.{i}.1.0/28\n      allocationRange: 2\n"
        ),
        2 => format!(
            "datacenters:\n    dc-2:\n      type: prefix\n      poolCidr: 10.{i}.2.0/26\n      allocationPrefix: 28\n"
        ),
        3 => format!(
            "reclaimPolicy: Retain\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.{i}.0.0/28\n      allocationRange: 4\n"
        ),
        4 => format!(
            "datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.{i}.0.0/28\n      allocationRange: 4\n      excludeRanges: [10.{i}.0.4-10.{i}.0.7]\n"
        ),
        5 => format!(
            "datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.{i}.0.0/28\n      allocationRange: 4\n      additionalCidrs: [10.{i}.9.0/29]\n"
        ),
        6 => format!(
            "datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.{i}.0.0/27\n      allocationRange: 4\n      additionalCidrs: [10.{i}.9.0/29, 10.{i}.8.252/30]\n"
        ),
        7 => format!(
            "datacenters:\n    dc-2:\n      type: prefix\n      poolCidr: 10.{i}.2.0/26\n      allocationPrefix: 28\n      additionalCidrs: [10.{i}.7.0/27]\n"
        ),
        // Pools sharing the addresses of dc-1 (the default space), with a quarantine.
        8 => "datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.9.0.0/27\n      allocationRange: 3\n      reuseAfter: 1h\n".to_string(),
        9 => "datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.9.0.16/28\n      allocationRange: 2\n    dc-2:\n      type: range\n      poolCidr: 10.9.0.0/28\n      allocationRange: 2\n      reuseAfter: 30m\n".to_string(),
        // The same network in another address space.
        10 => "addressSpace: vrf-b\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.9.0.0/28\n      allocationRange: 4\n      reuseAfter: 2h\n".to_string(),
        // Several CIDRs, the second in the shared addresses of dc-1 above.
        11 => format!(
            "datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.{i}.0.0/29\n      allocationRange: 4\n      additionalCidrs: [10.9.0.32/28]\n      reuseAfter: 20m\n"
        ),
        _ => "datacenters:\n    dc-1:\n      type: prefix\n      poolCidr: 10.9.0.0/26\n      allocationPrefix: 29\n      reuseAfter: 45m\n".to_string(),
    };
    pool_input(&format!(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: {name}\nspec:\n  {body}"
    ))
}

#[derive(Default)]
struct Seed {
    pools: BTreeMap<String, PoolInput>,
    clusters: BTreeMap<String, ClusterInput>,
    stored: Vec<kipam::planner::StoredAllocation>,
    quarantined: Vec<kipam::planner::Quarantined>,
    now: i64,
}

impl Seed {
    fn inputs(&self) -> PlanInputs {
        PlanInputs {
            pools: self.pools.values().cloned().collect(),
            clusters: self.clusters.values().cloned().collect(),
            stored: self.stored.clone(),
            quarantined: self.quarantined.clone(),
            now: self.now,
            held_elsewhere: Vec::new(),
        }
    }

    fn apply(&mut self, event: &Event, current: &Plan) {
        let name = |c: &usize| format!("c{c}");
        match event {
            Event::AddCluster { c, dc, day } => {
                self.clusters
                    .entry(name(c))
                    .or_insert_with(|| cluster_in(&name(c), DATACENTERS[*dc], *day));
            }
            Event::RemoveCluster { c } => {
                self.clusters.remove(&name(c));
            }
            Event::MoveCluster { c, dc } => {
                if let Some(x) = self.clusters.get_mut(&name(c)) {
                    x.datacenter = DATACENTERS[*dc].into();
                }
            }
            Event::Pause { c, on } => {
                if let Some(x) = self.clusters.get_mut(&name(c)) {
                    x.paused = *on;
                }
            }
            Event::Deleting { c } => {
                if let Some(x) = self.clusters.get_mut(&name(c)) {
                    x.deleting = true;
                }
            }
            Event::OptOut { c, pool, on } => {
                if let Some(x) = self.clusters.get_mut(&name(c)) {
                    let key = format!("pool-{pool}");
                    if *on {
                        x.overrides.insert(key, PoolOverride::OptOut);
                    } else {
                        x.overrides.remove(&key);
                    }
                }
            }
            Event::Ask { c, pool, addresses } => {
                if let Some(x) = self.clusters.get_mut(&name(c)) {
                    x.overrides
                        .insert(format!("pool-{pool}"), PoolOverride::Addresses(*addresses));
                }
            }
            Event::Invalid { c, on } => {
                if let Some(x) = self.clusters.get_mut(&name(c)) {
                    x.invalid = on.then(|| "spec.datacenter: made up for the test".to_string());
                }
            }
            Event::PutPool { pool: i, shape } => {
                let p = pool(*i, *shape);
                self.pools.insert(p.name.clone(), p);
            }
            Event::RemovePool { pool } => {
                self.pools.remove(&format!("pool-{pool}"));
            }
            Event::WritesLand => {
                let pools: Vec<PoolInput> = self.pools.values().cloned().collect();
                self.stored = stored_after(current, &pools);
                self.quarantined = current.quarantined.clone();
            }
            Event::Tick { minutes } => self.now += minutes * 60,
            Event::DropStored { index } => {
                if !self.stored.is_empty() {
                    let i = index % self.stored.len();
                    self.stored.remove(i);
                }
            }
        }
    }
}

/// The cluster an `AddCluster` event brings, when it is new to the seed and holds nothing.
fn newcomer(seed: &Seed, event: &Event) -> Option<String> {
    let Event::AddCluster { c, .. } = event else {
        return None;
    };
    let name = format!("c{c}");
    let holds = seed.stored.iter().any(|s| s.cluster == name);
    (!seed.clusters.contains_key(&name) && !holds).then_some(name)
}

/// Runs the events; returns how many new clusters were served from kept allocators.
fn run(events: Vec<Event>) -> Result<usize, TestCaseError> {
    let mut seed = Seed::default();
    let mut before = seed.inputs();
    let mut incremental = Plan::default();
    let mut states = PoolStates::default();
    let mut served_fast = 0;
    for (step, event) in events.iter().enumerate() {
        let newcomer = newcomer(&seed, event);
        seed.apply(event, &incremental);
        let after = seed.inputs();
        let whole = after.plan();
        let fast = newcomer.and_then(|name| {
            let c = seed.clusters.get(&name)?.clone();
            let mut plan = incremental.clone();
            let mut kept = states.clone();
            serve_new(&mut plan, &mut kept, &after.pools, &[c]).map(|_| (plan, kept))
        });
        if let Some((plan, kept)) = fast {
            prop_assert_eq!(
                &plan,
                &whole,
                "step {} ({:?}): served from the kept allocators",
                step,
                event
            );
            incremental = plan;
            states = kept;
            served_fast += 1;
        } else {
            let dirty = changed_pools(&before, &after);
            let (partial, partial_states) = plan_pools_keeping(&after, &dirty);
            incremental.replace_pools(&dirty, partial);
            states.replace_pools(&dirty, partial_states);
            prop_assert_eq!(
                &incremental,
                &whole,
                "step {} ({:?}): replanned {:?}",
                step,
                event,
                dirty
            );
        }
        before = after;
    }
    Ok(served_fast)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn incremental_plans_equal_whole_plans(events in proptest::collection::vec(event(), 1..60)) {
        run(events)?;
    }
}

/// A newcomer younger than everybody is served from the kept allocators; one older than a
/// cluster whose request was just served is not (the whole plan would serve it first).
#[test]
fn new_clusters_are_served_from_kept_allocators_only_when_that_is_exact() {
    let add = |c, day| Event::AddCluster { c, dc: 0, day };
    let young = vec![
        Event::PutPool { pool: 0, shape: 1 },
        Event::PutPool { pool: 1, shape: 2 },
        add(0, 1),
        Event::WritesLand,
        add(1, 2),
        add(2, 3),
    ];
    assert_eq!(run(young).expect("plans agree"), 3);
    let older = vec![Event::PutPool { pool: 0, shape: 1 }, add(0, 5), add(1, 2)];
    assert_eq!(run(older).expect("plans agree"), 1, "only the first");
    // A pool full of waiting clusters: a younger newcomer is served after them, exactly as
    // the whole plan would.
    let mut full = vec![Event::PutPool { pool: 0, shape: 0 }];
    full.extend((0..6).map(|c| add(c, c as u32 + 1)));
    assert_eq!(run(full).expect("plans agree"), 6);
}

/// Nothing changed, nothing to replan; a new cluster replans only the pools of its
/// datacenter.
#[test]
fn only_the_pools_a_change_concerns_are_replanned() {
    let mut seed = Seed::default();
    for (i, shape) in [(0, 0), (1, 2), (2, 0)] {
        seed.apply(&Event::PutPool { pool: i, shape }, &Plan::default());
    }
    seed.apply(
        &Event::AddCluster {
            c: 0,
            dc: 0,
            day: 1,
        },
        &Plan::default(),
    );
    let before = seed.inputs();
    assert!(changed_pools(&before, &before).is_empty());
    seed.apply(
        &Event::AddCluster {
            c: 1,
            dc: 1,
            day: 2,
        },
        &Plan::default(),
    );
    let after = seed.inputs();
    let dirty: Vec<String> = changed_pools(&before, &after).into_iter().collect();
    assert_eq!(dirty, vec!["pool-1".to_string()], "only pool-1 serves dc-2");
}
