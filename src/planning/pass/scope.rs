//! Step 2: the plan, whole or incremental, and what of it this pass must look at.
//!
//! The planner is pure; this is where the controller decides what is dirty. A pass replans
//! the pools [`planner::changed_pools`] names (pools, clusters or stored allocations whose
//! planning input changed), the pools of allocations somebody else changed (watch events
//! with new content, re-reads after a conflict), and the pools whose writes did not all land
//! last time. It then writes only the decisions that changed, plus every decision of a pool
//! whose own settings changed or whose writes are retried. The first pass of a term, a pass
//! after a failure and the periodic resync plan and check everything.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::planner::{self, ClusterInput, Decision, Plan, PlanInputs};
use crate::seed::ledger::Key;

/// What the planning loop keeps from one pass to the next.
#[derive(Debug)]
pub struct PassState {
    /// Writes sent at once (`--write-concurrency`, at least 1).
    pub write_concurrency: usize,
    /// Plan and check everything on the next pass.
    full: bool,
    /// The inputs of the last plan, and the plan.
    pub(super) previous: Option<(PlanInputs, Plan)>,
    /// Where each holder of `previous`'s inputs is among them, by name ([`Self::known_input`]),
    /// kept with them: a short pass looks up the one or two holders it is about instead of
    /// indexing thousands.
    known: HashMap<String, usize>,
    /// The pools the last full plan was made on (short passes commit on that plan).
    pub(super) planned_on: crate::planning::records::PlannedOn,
    /// The allocators the last plan ended with (new clusters are served from them).
    pub(super) states: planner::PoolStates,
    /// Pools whose writes did not all land (failed, held back by backoff or the record
    /// fence, or a release whose record entry is still to be trimmed).
    pub(super) retry_pools: BTreeSet<String>,
    /// Clusters whose status write did not land.
    pub(super) retry_clusters: BTreeSet<String>,
    /// Planning passes that replanned only part of the seed (for the log and tests).
    pub incremental_passes: u64,
    /// Passes that served new clusters from the kept allocators without replanning.
    pub fast_passes: u64,
    /// The last pass left something to retry (a failed or conflicting write, a backoff):
    /// only a full pass retries it.
    pub(super) unsettled: bool,
    /// Objects and records already read, by version.
    pub(super) reads: super::inputs::ReadCache,
    /// Pools whose status short passes left for later ([`super::POOL_STATUS_EVERY`]).
    pub(super) status_due: BTreeSet<String>,
    /// When a short pass last wrote pool statuses.
    pub(super) status_written: Option<std::time::Instant>,
    /// kipam's `IPAddress`es showing an older network, as the last full pass counted them:
    /// what short passes write in pool statuses.
    pub(super) outdated: super::statuses::Outdated,
    /// The planning loop's metrics.
    pub metrics: std::sync::Arc<crate::planning::metrics::Metrics>,
    /// Growth refusals last reported, by (cluster, pool or user cluster, reason): reported
    /// again only when they change.
    pub(super) growth_said: std::collections::BTreeMap<(String, String, &'static str), String>,
    /// The demand cache's generation the last growth decision was made at (`None`: none
    /// made yet in this term).
    pub(super) growth_generation: Option<u64>,
    /// When growth is to be decided again although no demand changed: a grown piece may be
    /// given back, or a waiting Service starts to count.
    pub(super) growth_due: Option<std::time::Instant>,
    /// What the demand reader said of each user cluster when statuses last reported it: a
    /// cluster whose entry changed gets its status checked.
    pub(super) demand_seen: std::collections::BTreeMap<String, Option<String>>,
}

impl PassState {
    pub fn new(
        write_concurrency: usize,
        metrics: std::sync::Arc<crate::planning::metrics::Metrics>,
    ) -> Self {
        PassState {
            metrics,
            write_concurrency: write_concurrency.max(1),
            full: true,
            previous: None,
            known: HashMap::new(),
            planned_on: Default::default(),
            states: planner::PoolStates::default(),
            retry_pools: BTreeSet::new(),
            retry_clusters: BTreeSet::new(),
            incremental_passes: 0,
            fast_passes: 0,
            unsettled: true,
            reads: Default::default(),
            status_due: BTreeSet::new(),
            status_written: None,
            outdated: Default::default(),
            growth_said: Default::default(),
            growth_generation: None,
            growth_due: None,
            demand_seen: Default::default(),
        }
    }

    /// The next pass plans and checks the whole seed (a new term, the resync, a failure).
    pub fn replan_all(&mut self) {
        self.full = true;
    }

    /// Plans `pool` again and checks all of its records and objects on the next pass (a
    /// shard of its record went under this replica's copy).
    pub fn recheck_pool(&mut self, pool: String) {
        self.retry_pools.insert(pool);
    }

    /// The last plan is at hand and nothing waits to be retried: a pass may look at the
    /// changed clusters alone.
    pub(super) fn can_skip_planning(&self) -> bool {
        !self.full
            && !self.unsettled
            && self.previous.is_some()
            && self.retry_pools.is_empty()
            && self.retry_clusters.is_empty()
    }

    /// Keeps the plan for the next pass.
    pub(super) fn keep(
        &mut self,
        inputs: PlanInputs,
        mut plan: Plan,
        planned_on: crate::planning::records::PlannedOn,
    ) {
        plan.settle();
        self.known = inputs
            .clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        self.previous = Some((inputs, plan));
        self.planned_on = planned_on;
        self.full = false;
    }

    /// The last plan's input for the holder `name`, if it had one (the last one of that name,
    /// as a map of them would keep).
    pub(super) fn known_input(&self, name: &str) -> Option<&ClusterInput> {
        let (inputs, _) = self.previous.as_ref()?;
        self.known.get(name).and_then(|i| inputs.clusters.get(*i))
    }

    /// Adds holders served from the kept allocators to the last plan's inputs.
    pub(super) fn add_known(&mut self, new: Vec<ClusterInput>) {
        let Some((inputs, _)) = self.previous.as_mut() else {
            return;
        };
        for c in new {
            self.known.insert(c.name.clone(), inputs.clusters.len());
            inputs.clusters.push(c);
        }
    }
}

/// What this pass looks at.
pub(super) struct Scope {
    /// `None`: everything.
    pub pools: Option<BTreeSet<String>>,
    /// (cluster, pool) whose decision changed (incremental passes).
    pub changed: HashSet<(String, String)>,
    /// Pools all of whose decisions are to be checked (settings changed, retries).
    pub whole_pools: BTreeSet<String>,
    /// Clusters whose status is to be checked (incremental passes).
    pub clusters: BTreeSet<String>,
}

impl Scope {
    pub fn is_full(&self) -> bool {
        self.pools.is_none()
    }

    /// This decision is to be turned into an object and compared with the stored one.
    pub fn checks(&self, d: &Decision, ledger_changed: &BTreeSet<Key>) -> bool {
        if self.is_full() || self.whole_pools.contains(&d.pool) {
            return true;
        }
        let key = (d.cluster.clone(), d.pool.clone());
        self.changed.contains(&key)
            || ledger_changed.contains(&(
                crate::resources::cluster_namespace(&d.cluster),
                d.pool.clone(),
            ))
    }

    /// The pool's records and objects are to be checked.
    pub fn covers_pool(&self, pool: &str) -> bool {
        self.pools.as_ref().is_none_or(|p| p.contains(pool))
    }

    /// A decision changed after planning (a growth, a shrink, or new `status.pieces`): its
    /// object is checked, its pool's records committed, its cluster's status checked.
    pub fn add_changed(&mut self, cluster: &str, pool: &str) {
        self.changed.insert((cluster.to_string(), pool.to_string()));
        self.clusters.insert(cluster.to_string());
        if let Some(pools) = self.pools.as_mut() {
            pools.insert(pool.to_string());
        }
    }

    /// The cluster's status is to be checked.
    pub fn covers_cluster(&self, cluster: &str) -> bool {
        self.is_full() || self.clusters.contains(cluster)
    }
}

/// Plans (on the caller's blocking thread): whole when `state` asks for it or has no plan,
/// else only the dirty pools, patched into the previous plan.
pub(super) fn plan(
    state: &mut PassState,
    inputs: &PlanInputs,
    ledger_changed: &BTreeSet<Key>,
) -> (Plan, Scope) {
    // Taken either way: a whole plan does not need the last one, and holding it while the new
    // one is made would double what planning holds.
    let previous = state.previous.take().filter(|_| !state.full);
    let Some((before, mut plan)) = previous else {
        state.retry_pools.clear();
        state.retry_clusters.clear();
        let scope = Scope {
            pools: None,
            changed: HashSet::new(),
            whole_pools: BTreeSet::new(),
            clusters: BTreeSet::new(),
        };
        state.states = planner::PoolStates::default();
        let (plan, states) = inputs.plan_keeping();
        state.states = states;
        return (plan, scope);
    };
    let mut dirty = planner::changed_pools(&before, inputs);
    dirty.extend(ledger_changed.iter().map(|(_, pool)| pool.clone()));
    dirty.extend(state.retry_pools.iter().cloned());
    // Pools sharing addresses (one address space, overlapping networks) are planned, and
    // their records committed, together.
    let groups = planner::space_groups(&inputs.pools);
    let grouped: Vec<String> = dirty
        .iter()
        .filter_map(|p| groups.get(p))
        .flatten()
        .cloned()
        .collect();
    dirty.extend(grouped);

    // Pools whose own settings changed: every object of theirs may need rewriting (the
    // reclaim-policy annotation) even where the decision is the same.
    let mut whole_pools: BTreeSet<String> = std::mem::take(&mut state.retry_pools);
    let mut clusters: BTreeSet<String> = std::mem::take(&mut state.retry_clusters);
    {
        let old_pools: HashMap<&str, &planner::PoolInput> =
            before.pools.iter().map(|p| (p.name.as_str(), p)).collect();
        let new_names: HashSet<&str> = inputs.pools.iter().map(|p| p.name.as_str()).collect();
        for p in &inputs.pools {
            if old_pools.get(p.name.as_str()) != Some(&p) {
                whole_pools.insert(p.name.clone());
            }
        }
        whole_pools.extend(
            old_pools
                .keys()
                .filter(|n| !new_names.contains(*n))
                .map(|n| n.to_string()),
        );

        // Clusters whose input changed: their status is checked whatever their decisions.
        let old_clusters: HashMap<&str, &ClusterInput> = before
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), c))
            .collect();
        let new_cluster_names: HashSet<&str> =
            inputs.clusters.iter().map(|c| c.name.as_str()).collect();
        for c in &inputs.clusters {
            if old_clusters.get(c.name.as_str()) != Some(&c) {
                clusters.insert(c.name.clone());
            }
        }
        clusters.extend(
            old_clusters
                .keys()
                .filter(|n| !new_cluster_names.contains(*n))
                .map(|n| n.to_string()),
        );
    }
    // The last plan's inputs are not needed past this point: freed before planning, which is
    // where a pass holds the most.
    drop(before);

    // One pool at a time (a pool's decisions depend on nothing outside it): the old and the
    // new decisions and allocators of a pool are held together, never those of the whole
    // seed.
    let mut changed = HashSet::new();
    let mut planned: HashSet<&str> = HashSet::new();
    for pool in &dirty {
        if !planned.insert(pool.as_str()) {
            continue;
        }
        let only = match groups.get(pool) {
            Some(group) => {
                planned.extend(
                    group
                        .iter()
                        .filter_map(|g| dirty.get(g))
                        .map(String::as_str),
                );
                group.clone()
            }
            None => BTreeSet::from([pool.clone()]),
        };
        // Its old allocators are replaced below: let them go before the new ones are built.
        state
            .states
            .replace_pools(&only, planner::PoolStates::default());
        let (partial, partial_states) = planner::plan_closed_pools_keeping(inputs, &only);
        state.states.replace_pools(&only, partial_states);
        // Both sides are sorted by (cluster, pool): one merge finds what changed.
        let old: Vec<&Decision> = plan
            .decisions
            .iter()
            .filter(|d| only.contains(&d.pool))
            .collect();
        let (mut i, mut j) = (0, 0);
        let new = &partial.decisions;
        while i < old.len() || j < new.len() {
            let order = match (old.get(i), new.get(j)) {
                (Some(a), Some(b)) => (&a.cluster, &a.pool).cmp(&(&b.cluster, &b.pool)),
                (Some(_), None) => std::cmp::Ordering::Less,
                _ => std::cmp::Ordering::Greater,
            };
            match order {
                std::cmp::Ordering::Less => {
                    changed.insert((old[i].cluster.clone(), old[i].pool.clone()));
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    changed.insert((new[j].cluster.clone(), new[j].pool.clone()));
                    j += 1;
                }
                std::cmp::Ordering::Equal => {
                    if old[i] != &new[j] {
                        changed.insert((new[j].cluster.clone(), new[j].pool.clone()));
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        plan.replace_pools(&only, partial);
    }
    clusters.extend(changed.iter().map(|(c, _)| c.clone()));
    state.incremental_passes += 1;
    let scope = Scope {
        pools: Some(dirty),
        changed,
        whole_pools,
        clusters,
    };
    (plan, scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(name: &str, datacenter: &str) -> ClusterInput {
        ClusterInput::invalid(name, None, datacenter, false, String::new())
    }

    fn inputs(clusters: Vec<ClusterInput>) -> PlanInputs {
        PlanInputs {
            pools: Vec::new(),
            clusters,
            stored: Vec::new(),
            quarantined: Vec::new(),
            now: 0,
            held_elsewhere: Vec::new(),
        }
    }

    #[test]
    fn the_last_plans_inputs_are_found_by_name_as_holders_are_kept_and_added() {
        let seed = crate::seed::metrics::Metrics::new();
        let mut state = PassState::new(1, crate::planning::metrics::Metrics::new(&seed));
        assert_eq!(state.known_input("a"), None, "no plan yet");
        // A name twice: the last one counts, as in a map of them.
        let kept = vec![input("a", "dc-1"), input("b", "dc-1"), input("a", "dc-2")];
        state.keep(inputs(kept), Plan::default(), Default::default());
        assert_eq!(state.known_input("a"), Some(&input("a", "dc-2")));
        assert_eq!(state.known_input("b"), Some(&input("b", "dc-1")));
        assert_eq!(state.known_input("c"), None);
        // Served by a short pass: found from then on.
        state.add_known(vec![input("c", "dc-3")]);
        assert_eq!(state.known_input("c"), Some(&input("c", "dc-3")));
        assert_eq!(
            state.previous.as_ref().map(|(i, _)| i.clusters.len()),
            Some(4)
        );
        // A new plan replaces them all.
        state.keep(
            inputs(vec![input("d", "dc-1")]),
            Plan::default(),
            Default::default(),
        );
        assert_eq!(state.known_input("a"), None);
        assert_eq!(state.known_input("d"), Some(&input("d", "dc-1")));
        // Planning takes the plan away: nothing is found until the next is kept.
        state.previous = None;
        assert_eq!(state.known_input("d"), None);
    }
}
