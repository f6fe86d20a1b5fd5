//! Planning only what changed.
//!
//! The plan decomposes by pool: the decisions of pool `P` (every datacenter of it) depend
//! only on `P`'s own input, the stored allocations named after `P`, and the clusters that `P`
//! serves or that hold something in `P`. Each pool has its own allocators, and a cluster's
//! place in the oldest-first order is the same whichever other clusters are planned beside
//! it. So planning a set of pools on their own gives exactly the decisions and usage a
//! whole-seed plan gives for them, and a previous plan whose other pools saw no change can be
//! patched with it ([`Plan::replace_pools`]).
//!
//! [`changed_pools`] says which pools an input change touches; the controller adds what only
//! it can know (objects changed behind its back, writes to retry) and calls [`plan_pools`].
//! `tests/planning/incremental.rs` checks over random event sequences that patching a plan
//! this way always gives the whole-seed plan.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{
    ClusterInput, HeldElsewhere, Plan, PoolInput, PoolStates, Quarantined, StoredAllocation,
    plan_keeping_of,
    spaces::{close_over_spaces, outside_their_pools},
};

/// Everything the planner is given, kept between passes to find what changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanInputs {
    pub pools: Vec<PoolInput>,
    pub clusters: Vec<ClusterInput>,
    pub stored: Vec<StoredAllocation>,
    /// The quarantine kept so far (the pool records', or the state file's).
    pub quarantined: Vec<Quarantined>,
    /// The plan's time, seconds since the Unix epoch.
    pub now: i64,
    /// What pools left out of the plan (invalid) hold.
    pub held_elsewhere: Vec<HeldElsewhere>,
}

impl PlanInputs {
    /// The whole-seed plan of these inputs.
    pub fn plan(&self) -> Plan {
        self.plan_keeping().0
    }

    /// The whole-seed plan and the allocators it ended with.
    pub fn plan_keeping(&self) -> (Plan, PoolStates) {
        let pools: Vec<&PoolInput> = self.pools.iter().collect();
        let clusters: Vec<&ClusterInput> = self.clusters.iter().collect();
        let stored: Vec<&StoredAllocation> = self.stored.iter().collect();
        let quarantined: Vec<&Quarantined> = self.quarantined.iter().collect();
        let elsewhere: Vec<&HeldElsewhere> = self.held_elsewhere.iter().collect();
        plan_keeping_of(
            &pools,
            &clusters,
            &stored,
            &quarantined,
            self.now,
            &elsewhere,
        )
    }

    /// Every pool name the inputs mention (pools and stored allocations of pools now gone).
    pub fn pool_names(&self) -> BTreeSet<String> {
        self.pools
            .iter()
            .map(|p| p.name.clone())
            .chain(self.stored.iter().map(|s| s.pool.clone()))
            .chain(self.quarantined.iter().map(|q| q.pool.clone()))
            .collect()
    }
}

/// Plans the named pools only — widened to the pools they share addresses with
/// ([`close_over_spaces`]) — : their decisions and usage are exactly those of the whole-seed
/// plan of the same inputs.
pub fn plan_pools(inputs: &PlanInputs, only: &BTreeSet<String>) -> Plan {
    plan_pools_keeping(inputs, only).0
}

/// [`plan_pools`], also giving the allocators those pools ended with.
pub fn plan_pools_keeping(inputs: &PlanInputs, only: &BTreeSet<String>) -> (Plan, PoolStates) {
    let mut widened = only.clone();
    if !only.is_empty() {
        close_over_spaces(&inputs.pools, &inputs.pools, &mut widened);
    }
    plan_closed_pools_keeping(inputs, &widened)
}

/// [`plan_pools_keeping`] of a set of pools already closed over the address spaces (every
/// pool sharing addresses with one of them is in it; see [`close_over_spaces`] and
/// [`space_groups`](super::space_groups)): nothing is widened, so a caller planning many
/// pools one group at a time pays nothing per group for finding the groups.
pub fn plan_closed_pools_keeping(
    inputs: &PlanInputs,
    only: &BTreeSet<String>,
) -> (Plan, PoolStates) {
    // Borrowed, not copied: a burst replans every pool, and a copy of every stored
    // allocation would be held beside the original while the plan is made.
    let pools: Vec<&PoolInput> = inputs
        .pools
        .iter()
        .filter(|p| only.contains(&p.name))
        .collect();
    let stored: Vec<&StoredAllocation> = inputs
        .stored
        .iter()
        .filter(|s| only.contains(&s.pool))
        .collect();
    // Only clusters a planned pool can concern: served by it, or holding something in it.
    let datacenters: BTreeSet<&str> = pools
        .iter()
        .flat_map(|p| p.datacenters.keys().map(String::as_str))
        .collect();
    let holders: BTreeSet<&str> = stored.iter().map(|s| s.cluster.as_str()).collect();
    let clusters: Vec<&ClusterInput> = inputs
        .clusters
        .iter()
        .filter(|c| {
            datacenters.contains(c.datacenter.as_str()) || holders.contains(c.name.as_str())
        })
        .collect();
    let quarantined: Vec<&Quarantined> = inputs
        .quarantined
        .iter()
        .filter(|q| only.contains(&q.pool))
        .collect();
    // What the pools not planned hold outside their networks is set aside here as the whole
    // plan sets it aside (the planned pools' own, the planner finds).
    let outside = outside_their_pools(
        &inputs.pools,
        inputs
            .stored
            .iter()
            .filter(|s| !only.contains(&s.pool) && datacenters.contains(s.datacenter.as_str())),
    );
    let elsewhere: Vec<&HeldElsewhere> = inputs
        .held_elsewhere
        .iter()
        .filter(|e| datacenters.contains(e.datacenter.as_str()))
        .chain(&outside)
        .collect();
    plan_keeping_of(
        &pools,
        &clusters,
        &stored,
        &quarantined,
        inputs.now,
        &elsewhere,
    )
}

impl Plan {
    /// This plan with every decision and usage report of the `pools` replaced by those of
    /// `partial` (a plan of exactly those pools).
    pub fn replace_pools(&mut self, pools: &BTreeSet<String>, partial: Plan) {
        // A plan of some pools also plans the pools they share addresses with.
        let mut widened;
        let pools = if partial
            .decisions
            .iter()
            .map(|d| &d.pool)
            .chain(partial.usage.keys().map(|(p, _)| p))
            .chain(partial.quarantined.iter().map(|q| &q.pool))
            .all(|p| pools.contains(p))
        {
            pools
        } else {
            widened = pools.clone();
            widened.extend(partial.decisions.iter().map(|d| d.pool.clone()));
            widened.extend(partial.usage.keys().map(|(p, _)| p.clone()));
            widened.extend(partial.quarantined.iter().map(|q| q.pool.clone()));
            &widened
        };
        self.quarantined.retain(|q| !pools.contains(&q.pool));
        self.quarantined.extend(partial.quarantined);
        self.quarantined.sort();
        self.decisions.retain(|d| !pools.contains(&d.pool));
        self.decisions.extend(partial.decisions);
        // One decision per (cluster, pool), so an unstable sort gives the same order, without
        // the scratch copy of half the decisions a stable sort takes.
        self.decisions
            .sort_unstable_by(|a, b| (&a.cluster, &a.pool).cmp(&(&b.cluster, &b.pool)));
        self.usage.retain(|(pool, _), _| !pools.contains(pool));
        self.usage.extend(partial.usage);
    }
}

/// The pools whose decisions may differ between a plan of `before` and one of `after`.
pub fn changed_pools<'a>(before: &'a PlanInputs, after: &'a PlanInputs) -> BTreeSet<String> {
    let mut changed = BTreeSet::new();

    // Pools added, removed or edited.
    let old_pools: HashMap<&str, &PoolInput> =
        before.pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let new_pools: HashMap<&str, &PoolInput> =
        after.pools.iter().map(|p| (p.name.as_str(), p)).collect();
    for (name, p) in &new_pools {
        if old_pools.get(name) != Some(p) {
            changed.insert(name.to_string());
        }
    }
    for name in old_pools.keys() {
        if !new_pools.contains_key(name) {
            changed.insert(name.to_string());
        }
    }

    // Stored allocations added, removed or changed, per pool.
    fn group(stored: &[StoredAllocation]) -> BTreeMap<&str, Vec<&StoredAllocation>> {
        let mut by_pool: BTreeMap<&str, Vec<&StoredAllocation>> = BTreeMap::new();
        for s in stored {
            by_pool.entry(s.pool.as_str()).or_default().push(s);
        }
        for list in by_pool.values_mut() {
            list.sort_by(|a, b| {
                (&a.cluster, &a.datacenter, &a.unreadable).cmp(&(
                    &b.cluster,
                    &b.datacenter,
                    &b.unreadable,
                ))
            });
        }
        by_pool
    }
    let old_stored = group(&before.stored);
    let new_stored = group(&after.stored);
    for (pool, list) in &new_stored {
        if old_stored.get(pool) != Some(list) {
            changed.insert(pool.to_string());
        }
    }
    for pool in old_stored.keys() {
        if !new_stored.contains_key(pool) {
            changed.insert(pool.to_string());
        }
    }

    // Clusters added, removed or edited: every pool serving their old or new datacenter, and
    // every pool they hold something in.
    let old_clusters: HashMap<&str, &ClusterInput> = before
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c))
        .collect();
    let new_clusters: HashMap<&str, &ClusterInput> = after
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c))
        .collect();
    let mut touched_datacenters: BTreeSet<&str> = BTreeSet::new();
    let mut touched_clusters: BTreeSet<&str> = BTreeSet::new();
    // A machine's claim asks one pool: only that pool (and what it holds) is touched.
    let mut touch = |c: &'a ClusterInput, changed: &mut BTreeSet<String>| match &c.only_pool {
        Some(pool) => {
            changed.insert(pool.clone());
        }
        None => {
            touched_datacenters.insert(c.datacenter.as_str());
        }
    };
    for (name, c) in &new_clusters {
        match old_clusters.get(name) {
            Some(old) if old == c => {}
            Some(old) => {
                touch(old, &mut changed);
                touch(c, &mut changed);
                touched_clusters.insert(name);
            }
            None => {
                touch(c, &mut changed);
                touched_clusters.insert(name);
            }
        }
    }
    for (name, old) in &old_clusters {
        if !new_clusters.contains_key(name) {
            touch(old, &mut changed);
            touched_clusters.insert(name);
        }
    }
    if !touched_clusters.is_empty() {
        for p in before.pools.iter().chain(after.pools.iter()) {
            if p.datacenters
                .keys()
                .any(|dc| touched_datacenters.contains(dc.as_str()))
            {
                changed.insert(p.name.clone());
            }
        }
        for s in before.stored.iter().chain(after.stored.iter()) {
            if touched_clusters.contains(s.cluster.as_str()) {
                changed.insert(s.pool.clone());
            }
        }
    }
    // Quarantine entries added, removed or changed, per pool; and with a new time, every
    // pool that quarantines (an entry may have ended, and what it releases is dated now).
    {
        let group = |list: &[Quarantined]| {
            let mut by_pool: BTreeMap<String, Vec<Quarantined>> = BTreeMap::new();
            for q in list {
                by_pool.entry(q.pool.clone()).or_default().push(q.clone());
            }
            for l in by_pool.values_mut() {
                l.sort();
            }
            by_pool
        };
        let (old_q, new_q) = (group(&before.quarantined), group(&after.quarantined));
        for (pool, list) in &new_q {
            if old_q.get(pool) != Some(list) {
                changed.insert(pool.clone());
            }
        }
        for pool in old_q.keys() {
            if !new_q.contains_key(pool) {
                changed.insert(pool.clone());
            }
        }
        if before.now != after.now {
            for p in before.pools.iter().chain(after.pools.iter()) {
                if p.datacenters.values().any(|d| d.reuse_after > 0) {
                    changed.insert(p.name.clone());
                }
            }
            changed.extend(new_q.into_keys());
        }
    }
    // What invalid pools hold, per datacenter: every pool of a datacenter where it changed.
    {
        let group = |list: &[HeldElsewhere]| {
            let mut by_dc: BTreeMap<String, Vec<HeldElsewhere>> = BTreeMap::new();
            for e in list {
                by_dc
                    .entry(e.datacenter.clone())
                    .or_default()
                    .push(e.clone());
            }
            for l in by_dc.values_mut() {
                l.sort();
            }
            by_dc
        };
        // And what stored holdings hold outside their own pools, set aside the same way.
        let with_outside = |inputs: &PlanInputs| {
            let mut all = inputs.held_elsewhere.clone();
            all.extend(outside_their_pools(&inputs.pools, &inputs.stored));
            all
        };
        let (old_e, new_e) = (group(&with_outside(before)), group(&with_outside(after)));
        let dcs: BTreeSet<&String> = old_e
            .keys()
            .chain(new_e.keys())
            .filter(|dc| old_e.get(*dc) != new_e.get(*dc))
            .collect();
        if !dcs.is_empty() {
            for p in before.pools.iter().chain(after.pools.iter()) {
                if p.datacenters.keys().any(|dc| dcs.contains(dc)) {
                    changed.insert(p.name.clone());
                }
            }
        }
    }
    // A pool's plan depends on the pools it shares addresses with.
    close_over_spaces(&before.pools, &after.pools, &mut changed);
    changed
}
