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
    /// It shares addresses with another pool of its address space.
    pub(crate) shared: bool,
    /// Addresses are quarantined here.
    pub(crate) quarantine: bool,
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
        // A plan of some pools also plans the pools they share addresses with.
        let planned: BTreeSet<&String> = partial.map.keys().map(|(p, _)| p).collect();
        self.map.retain(|(pool, _), _| !planned.contains(pool));
        self.map.extend(partial.map);
    }

    /// States holding one pool datacenter's allocator (tests).
    #[cfg(test)]
    pub(crate) fn single(pool: &str, dc: &str, allocator: PoolAllocator) -> Self {
        let state = PoolState {
            allocator: Ok(allocator),
            blocked: false,
            youngest_request: None,
            shared: false,
            quarantine: false,
        };
        PoolStates::from_map(BTreeMap::from([(
            (pool.to_string(), dc.to_string()),
            state,
        )]))
    }

    /// The allocator a plan left for (pool, datacenter), to change it in place (growth).
    pub(crate) fn allocator_mut(&mut self, pool: &str, dc: &str) -> Option<&mut PoolAllocator> {
        self.map
            .get_mut(&(pool.to_string(), dc.to_string()))
            .and_then(|s| s.allocator.as_mut().ok())
    }

    /// Whether a growth may be taken from the allocator kept for (`pool`, `dc`) without
    /// planning again: it is usable, takes new addresses, and shares them with no other pool
    /// (whose records a commit would have to fence too).
    pub fn growable(&self, pool: &str, dc: &str) -> bool {
        self.map
            .get(&(pool.to_string(), dc.to_string()))
            .is_some_and(|s| s.allocator.is_ok() && !s.blocked && !s.shared)
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
            if !pool.datacenters.contains_key(&c.datacenter) || !c.asks(&pool.name) {
                continue;
            }
            match c.overrides.get(&pool.name) {
                Some(PoolOverride::OptOut) => continue,
                Some(PoolOverride::PinnedAddresses(_))
                | Some(PoolOverride::PinnedCidr(_))
                | Some(PoolOverride::Adopt(_)) => {
                    return None;
                }
                _ => {}
            }
            let key = (pool.name.clone(), c.datacenter.clone());
            let state = states.map.get(&key)?;
            // Shared or quarantined addresses are settled by a plan of the whole group (and
            // with the time): the caller replans.
            if state.blocked || state.allocator.is_err() || state.shared || state.quarantine {
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
/// keeping the order, in place: the vector grows by exactly `added.len()` (never to twice its
/// size, as pushing or splicing into a full vector would: at 100,000 decisions that doubling
/// alone was 20 MB), and the two sorted runs are merged from the back, so only the decisions
/// after the first insertion point move.
fn insert_sorted(decisions: &mut Vec<Decision>, added: &[Decision]) {
    if added.is_empty() {
        return;
    }
    let old_len = decisions.len();
    decisions.reserve_exact(added.len());
    // The new slots at the end start as copies of `added`; each is overwritten or swapped
    // below before the merge is over.
    decisions.extend(added.iter().cloned());
    let mut old = old_len; // decisions[..old] are the old ones not placed yet
    let mut new = added.len(); // added[..new] are not placed yet
    let mut at = decisions.len(); // decisions[at..] are final
    while new > 0 {
        at -= 1;
        let take_old = old > 0 && {
            let (o, a) = (&decisions[old - 1], &added[new - 1]);
            (&o.cluster, &o.pool) >= (&a.cluster, &a.pool)
        };
        if take_old {
            decisions.swap(old - 1, at);
            old -= 1;
        } else {
            decisions[at] = added[new - 1].clone();
            new -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::Change;
    use crate::resources::AllocationType;

    fn decision(cluster: &str, pool: &str) -> Decision {
        Decision {
            cluster: cluster.into(),
            pool: pool.into(),
            datacenter: "dc".into(),
            type_: AllocationType::Range,
            change: Change::Keep,
            held: None,
            previous: None,
            message: String::new(),
        }
    }

    fn names(ds: &[Decision]) -> Vec<String> {
        ds.iter()
            .map(|d| format!("{}/{}", d.cluster, d.pool))
            .collect()
    }

    #[test]
    fn added_decisions_land_in_order_wherever_they_belong() {
        let old = ["b", "d", "f"].map(|c| decision(c, "p"));
        for added in [
            vec![],
            vec![decision("a", "p")],
            vec![decision("g", "p"), decision("g", "q")],
            vec![
                decision("a", "q"),
                decision("c", "p"),
                decision("e", "p"),
                decision("h", "p"),
            ],
            vec![decision("c", "p"), decision("c", "q"), decision("d", "q")],
        ] {
            let mut decisions = old.to_vec();
            insert_sorted(&mut decisions, &added);
            let mut expected = names(&old);
            expected.extend(names(&added));
            expected.sort();
            assert_eq!(names(&decisions), expected, "adding {:?}", names(&added));
        }
        let mut empty = Vec::new();
        insert_sorted(&mut empty, &old);
        assert_eq!(names(&empty), names(&old));
    }
}
