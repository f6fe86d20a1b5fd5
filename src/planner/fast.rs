//! Serving clusters new to the seed without replanning their pools.
//!
//! A plan ends with one allocator per pool datacenter holding everything the plan decided.
//! When the only change since is clusters that did not exist before and hold nothing yet,
//! a whole-seed plan of the new inputs would decide exactly what the last plan decided for
//! everybody else, and serve the new clusters from exactly the allocator state the last plan
//! ended with — provided that, in each pool datacenter they ask from:
//!
//! - no stored allocation that cannot be read blocks new addresses (the plan would refuse
//!   them all);
//! - every cluster whose request the last plan served (or failed) is older than the new
//!   clusters: requests are served oldest first, so an older newcomer would have been served
//!   before them;
//! - the new clusters pin nothing there: pins are placed before every request.
//!
//! Under those conditions [`serve_new`] serves the new clusters from the kept allocators and
//! patches the plan; otherwise it changes nothing and the caller replans.
//! `tests/planning/incremental.rs` checks that the patched plan is the whole-seed plan.

use std::collections::{BTreeMap, BTreeSet};

use super::{AgeKey, ClusterInput, Decision, Plan, Planner, PoolInput, PoolOverride, age_of};
use crate::allocator::PoolAllocator;

/// What a plan left of one pool datacenter.
#[derive(Clone, Debug)]
pub(crate) struct PoolState {
    pub(crate) allocator: Result<PoolAllocator, String>,
    /// New addresses are refused here (an unreadable stored allocation).
    pub(crate) blocked: bool,
    /// The youngest cluster whose request or pin the plan served or failed here.
    pub(crate) youngest_request: Option<AgeKey>,
}

/// The allocators a plan ended with, by (pool, datacenter).
#[derive(Clone, Debug, Default)]
pub struct PoolStates {
    map: BTreeMap<(String, String), PoolState>,
}

impl PoolStates {
    pub(crate) fn from_map(map: BTreeMap<(String, String), PoolState>) -> Self {
        PoolStates { map }
    }

    /// These states with every pool datacenter of `pools` replaced by those of `partial`
    /// (the states of a plan of exactly those pools).
    pub fn replace_pools(&mut self, pools: &BTreeSet<String>, partial: PoolStates) {
        self.map.retain(|(pool, _), _| !pools.contains(pool));
        self.map.extend(partial.map);
    }

    /// Pool datacenters kept.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Serves `new` — clusters absent from the inputs `plan` was made from, holding nothing in
/// any pool — from the allocators in `states`, and adds their decisions to `plan`. Returns
/// the decisions added, or `None` (and changes nothing) when the result could differ from a
/// whole-seed plan; see the module documentation.
pub fn serve_new(
    plan: &mut Plan,
    states: &mut PoolStates,
    pools: &[PoolInput],
    new: &[ClusterInput],
) -> Option<Vec<Decision>> {
    let mut sorted: Vec<&ClusterInput> = new.iter().collect();
    sorted.sort_by(|a, b| a.age_key().cmp(&b.age_key()));
    // Check everything before touching anything.
    let mut youngest: BTreeMap<(String, String), Option<AgeKey>> = BTreeMap::new();
    let mut involved: BTreeSet<&str> = BTreeSet::new();
    for c in &sorted {
        let first = plan
            .decisions
            .partition_point(|d| d.cluster.as_str() < c.name.as_str());
        if plan
            .decisions
            .get(first)
            .is_some_and(|d| d.cluster == c.name)
        {
            return None; // not new: the plan already has decisions for it
        }
        if c.deleting || c.frozen() {
            continue;
        }
        let age = age_of(c);
        for pool in pools {
            if !pool.datacenters.contains_key(&c.datacenter) {
                continue;
            }
            match c.overrides.get(&pool.name) {
                Some(PoolOverride::OptOut) => continue,
                Some(PoolOverride::PinnedAddresses(_)) | Some(PoolOverride::PinnedCidr(_)) => {
                    return None;
                }
                _ => {}
            }
            let key = (pool.name.clone(), c.datacenter.clone());
            let state = states.map.get(&key)?;
            if state.blocked || state.allocator.is_err() {
                return None;
            }
            let last = youngest
                .entry(key)
                .or_insert_with(|| state.youngest_request.clone());
            if last.as_ref().is_some_and(|y| *y >= age) {
                return None;
            }
            *last = Some(age.clone());
            involved.insert(pool.name.as_str());
        }
    }
    if involved.is_empty() {
        return Some(Vec::new());
    }

    let pools_here: Vec<&PoolInput> = pools
        .iter()
        .filter(|p| involved.contains(p.name.as_str()))
        .collect();
    let mut allocators = BTreeMap::new();
    for key in youngest.keys() {
        if let Some(state) = states.map.get_mut(key) {
            let taken = std::mem::replace(&mut state.allocator, Err(String::new()));
            allocators.insert(key.clone(), taken);
        }
    }
    let mut planner = Planner::resume(&pools_here, &sorted, allocators);
    planner.serve_requests();
    let (partial, served) = planner.finish();

    for (key, state) in served.map {
        if let Some(kept) = states.map.get_mut(&key) {
            kept.allocator = state.allocator;
            if let Some(age) = state.youngest_request
                && kept.youngest_request.as_ref().is_none_or(|y| *y < age)
            {
                kept.youngest_request = Some(age);
            }
        }
    }
    for (key, report) in partial.usage {
        plan.usage.insert(key, report);
    }
    let added = partial.decisions;
    insert_sorted(&mut plan.decisions, &added);
    Some(added)
}

/// Puts `added` (sorted by cluster and pool, none of them in `decisions`) into `decisions`,
/// keeping the order. A few clusters' decisions are spliced in where they belong: the vector
/// keeps its allocation, and only its tail moves. Many are merged into a new vector in one
/// sweep instead of one move of the tail per cluster.
fn insert_sorted(decisions: &mut Vec<Decision>, added: &[Decision]) {
    const SPLICE_AT_MOST: usize = 8;
    let groups: Vec<&[Decision]> = added.chunk_by(|a, b| a.cluster == b.cluster).collect();
    if groups.len() <= SPLICE_AT_MOST {
        for group in groups {
            let first = &group[0];
            let at = decisions
                .partition_point(|d| (&d.cluster, &d.pool) < (&first.cluster, &first.pool));
            decisions.splice(at..at, group.iter().cloned());
        }
        return;
    }
    let mut merged = Vec::with_capacity(decisions.len() + added.len());
    let mut old = std::mem::take(decisions).into_iter().peekable();
    for d in added.iter().cloned() {
        while let Some(o) = old.next_if(|o| (&o.cluster, &o.pool) < (&d.cluster, &d.pool)) {
            merged.push(o);
        }
        merged.push(d);
    }
    merged.extend(old);
    *decisions = merged;
}
