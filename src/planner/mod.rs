//! The desired-state planner shared by every front end (offline mode, controller).
//!
//! Given the pools, the clusters and the allocations already stored, it decides for every
//! (cluster, pool) whether to create, grow, keep, replace, release, retain or fail, each with a
//! reason. It is pure and deterministic: the same input gives the same plan.
//!
//! Order of work, per pool datacenter:
//! 1. stored allocations are settled first (released when their cluster, pool or datacenter is
//!    gone, kept otherwise), so what a cluster holds is never handed to another;
//! 2. pinned requests (`addresses` / `cidr` overrides) are placed next, oldest cluster first;
//! 3. the remaining requests (new allocations and growth) are served oldest cluster first
//!    (`creationTimestamp`, then name). A request that does not fit fails without blocking
//!    younger clusters whose smaller requests still fit; the next plan serves the oldest
//!    waiting cluster first again.
//!
//! One pool's failure never touches the cluster's other pools: each pool datacenter has its
//! own allocator.

pub mod adopt;
mod fast;
pub mod growth;
pub mod incremental;
mod input;
mod output;
mod spaces;

pub use fast::{PoolStates, serve_new};
pub use incremental::{
    PlanInputs, changed_pools, plan_closed_pools_keeping, plan_pools, plan_pools_keeping,
};
pub use input::{
    ClusterInput, DatacenterInput, HeldElsewhere, PoolInput, PoolOverride, Quarantined,
    StoredAllocation,
};
pub use output::{Change, DatacenterReport, Decision, Plan};
pub use spaces::{close_over_spaces, space_groups, space_siblings};

use std::collections::{BTreeMap, HashMap};

use crate::address::AddrRange;
use crate::allocator::PoolKind;
use crate::allocator::{AllocError, Allocation, Growth, PoolAllocator, Request};
use crate::resources::{AllocationType, ReclaimPolicy};

/// Plans every allocation. See the module documentation for the rules.
pub fn plan(pools: &[PoolInput], clusters: &[ClusterInput], stored: &[StoredAllocation]) -> Plan {
    plan_keeping(pools, clusters, stored).0
}

/// [`plan`], also giving what each pool datacenter's allocator ended with, so that clusters
/// new to the seed can later be served without replanning ([`serve_new`]).
pub fn plan_keeping(
    pools: &[PoolInput],
    clusters: &[ClusterInput],
    stored: &[StoredAllocation],
) -> (Plan, PoolStates) {
    let pools: Vec<&PoolInput> = pools.iter().collect();
    let clusters: Vec<&ClusterInput> = clusters.iter().collect();
    let stored: Vec<&StoredAllocation> = stored.iter().collect();
    plan_keeping_of(&pools, &clusters, &stored, &[], 0, &[])
}

/// [`plan`] at time `now` (seconds since the Unix epoch) with the quarantine kept so far:
/// addresses released with a `reuseAfter` stay with their former holder until it ends.
pub fn plan_at(
    pools: &[PoolInput],
    clusters: &[ClusterInput],
    stored: &[StoredAllocation],
    quarantined: &[Quarantined],
    now: i64,
) -> (Plan, PoolStates) {
    let pools: Vec<&PoolInput> = pools.iter().collect();
    let clusters: Vec<&ClusterInput> = clusters.iter().collect();
    let stored: Vec<&StoredAllocation> = stored.iter().collect();
    let quarantined: Vec<&Quarantined> = quarantined.iter().collect();
    plan_keeping_of(&pools, &clusters, &stored, &quarantined, now, &[])
}

/// [`plan_keeping`] over borrowed inputs: a plan of part of the seed picks its inputs out of
/// the whole seed's without copying them.
pub(crate) fn plan_keeping_of(
    pools: &[&PoolInput],
    clusters: &[&ClusterInput],
    stored: &[&StoredAllocation],
    quarantined: &[&Quarantined],
    now: i64,
    elsewhere: &[&HeldElsewhere],
) -> (Plan, PoolStates) {
    let mut planner = Planner::new(pools, clusters);
    planner.now = now;
    for s in stored {
        if let Some(why) = &s.unreadable {
            planner
                .blocked
                .entry((s.pool.clone(), s.datacenter.clone()))
                .or_insert_with(|| why.clone());
        }
    }
    // What lies outside the pool it is held through is nobody else's either.
    let outside = spaces::outside_their_pools(pools.iter().copied(), stored.iter().copied());
    let elsewhere: Vec<&HeldElsewhere> = elsewhere.iter().copied().chain(&outside).collect();
    let elsewhere = elsewhere.as_slice();
    planner.settle_stored(stored);
    planner.set_aside_elsewhere(elsewhere);
    planner.settle_quarantine(quarantined);
    planner.place_pins();
    // Again: what a changed pin gave up is free only now, and it must not go to anybody else
    // while its object still shows it (the inputs list it, see `given_up_by_pin`). What is
    // set aside already is not taken twice.
    planner.set_aside_elsewhere(elsewhere);
    planner.serve_requests();
    planner.finish()
}

/// A cluster's place in the oldest-first order, owned.
pub(crate) type AgeKey = (bool, String, String);

fn age_of(c: &ClusterInput) -> AgeKey {
    let (missing, created, name) = c.age_key();
    (missing, created.to_string(), name.to_string())
}

type Key = (String, String);

struct Planner<'a> {
    pools: BTreeMap<&'a str, &'a PoolInput>,
    /// Oldest first.
    clusters: Vec<&'a ClusterInput>,
    by_name: HashMap<&'a str, &'a ClusterInput>,
    /// (pool, datacenter) -> allocator, or why the pool could not be set up.
    allocators: BTreeMap<Key, Result<PoolAllocator, String>>,
    /// (cluster, pool) -> decision.
    decisions: BTreeMap<Key, Decision>,
    /// (pool, datacenter; empty for all) -> why no new address may be handed out there: a
    /// stored allocation that cannot be read might hold any of them.
    blocked: BTreeMap<Key, String>,
    /// The plan's time, seconds since the Unix epoch.
    now: i64,
    /// (pool, datacenter) -> the other pool datacenters of its address space it overlaps.
    siblings: HashMap<Key, Vec<Key>>,
    /// Tag of addresses set aside for another pool of the space -> (pool, cluster).
    shared_tags: HashMap<String, Key>,
    /// (pool, datacenter) -> former holder -> its quarantined addresses.
    quarantine: BTreeMap<Key, BTreeMap<String, spaces::Entries>>,
    /// Claim holder -> the tag under which the hand-made `IPAddress` it may adopt is set
    /// aside: its pin lifts that set in the pool it pins in, nobody else's does.
    adoptable: HashMap<String, String>,
}

/// The tag under which the addresses no machine gets are set aside while a claim is served.
const MACHINE_RESERVED_TAG: &str = "reserved for the network (no machine gets it)";

/// A holder is a machine's claim (it asks one pool and never grows).
fn is_machine(cluster: &ClusterInput) -> bool {
    cluster.only_pool.is_some() && crate::resources::capi::claim_of_holder(&cluster.name).is_some()
}

impl<'a> Planner<'a> {
    fn new(pools: &[&'a PoolInput], clusters: &[&'a ClusterInput]) -> Self {
        let mut allocators = BTreeMap::new();
        for pool in pools {
            for (dc, input) in &pool.datacenters {
                allocators.insert((pool.name.clone(), dc.clone()), build_allocator(input));
            }
        }
        Planner::resume(pools, clusters, allocators)
    }

    /// Step 1: decide the fate of every stored allocation, loading the ones that stay.
    fn settle_stored(&mut self, stored: &[&StoredAllocation]) {
        let mut order: Vec<&StoredAllocation> = stored.to_vec();
        order.sort_by(|a, b| {
            let ka = self.by_name.get(a.cluster.as_str()).map(|c| c.age_key());
            let kb = self.by_name.get(b.cluster.as_str()).map(|c| c.age_key());
            (ka.is_none(), ka, &a.cluster, &a.pool).cmp(&(kb.is_none(), kb, &b.cluster, &b.pool))
        });
        for s in order {
            let key = (s.cluster.clone(), s.pool.clone());
            if self.decisions.contains_key(&key) {
                continue;
            }
            if let Some(decision) = self.settle_one(s) {
                self.decisions.insert(key, decision);
            }
        }
    }

    fn settle_one(&mut self, s: &StoredAllocation) -> Option<Decision> {
        let decide = |change: Change, held: Option<Allocation>, message: String| Decision {
            cluster: s.cluster.clone(),
            pool: s.pool.clone(),
            datacenter: s.datacenter.clone(),
            type_: AllocationType::Range,
            change,
            previous: if change == Change::Release {
                s.held.clone()
            } else {
                None
            },
            held,
            message,
        };
        if let Some(why) = &s.unreadable {
            // Left exactly as it is (the writer touches its status only) and reported.
            return Some(decide(Change::Conflict, None, why.clone()));
        }
        let cluster = self.by_name.get(s.cluster.as_str()).copied();
        let pool = self.pools.get(s.pool.as_str()).copied();
        match settle(s, cluster, pool) {
            Some(Settle::Release(why)) => return Some(decide(Change::Release, None, why)),
            Some(Settle::Retain(why)) => return Some(decide(Change::Retain, s.held.clone(), why)),
            None => {}
        }
        let Some(cluster) = cluster else {
            return None; // `settle` releases what a cluster that is gone holds
        };
        let Some(held) = s.held.clone() else {
            // A request that failed or waits: the later steps try again, unless paused.
            return cluster
                .frozen()
                .then(|| decide(Change::Keep, None, frozen_message(cluster)));
        };
        let key = (s.pool.clone(), s.datacenter.clone());
        let mut other_holder = None;
        let has_allocator = matches!(self.allocators.get(&key), Some(Ok(_)));
        let loaded = match self.allocators.get_mut(&key) {
            Some(Ok(allocator)) => match allocator.load(&s.cluster, held.clone()) {
                Ok(_) => Ok(()),
                Err(e) => {
                    if let AllocError::Taken { holder, .. } = &e {
                        other_holder = Some(holder.clone());
                    }
                    // Whatever else is wrong, none of its addresses goes to anybody else.
                    allocator.reserve(&s.cluster, &held);
                    Err(e.to_string())
                }
            },
            Some(Err(why)) => Err(why.clone()),
            None => Err(format!(
                "pool {} has no datacenter {}",
                s.pool, s.datacenter
            )),
        };
        if let Some(others) = self.siblings.get(&key).cloned() {
            if has_allocator {
                self.mirror(&key, &s.cluster);
            } else {
                self.mirror_ranges(&key, &s.cluster, held.ranges().collect(), others);
            }
        }
        // A holder through another pool of the address space: that pool's decision.
        let other_holder = other_holder.map(|h| match self.shared_tags.get(&h) {
            Some((pool, cluster)) => (cluster.clone(), pool.clone()),
            None => (h, s.pool.clone()),
        });
        if let Some((holder, holder_pool)) = other_holder {
            // Both sides of an overlap are reported; neither is released or moved.
            let across = if holder_pool != s.pool {
                format!(" from pool {} (same address space)", s.pool)
            } else {
                String::new()
            };
            if let Some(d) = self.decisions.get_mut(&(holder.clone(), holder_pool)) {
                d.change = Change::Conflict;
                d.message = format!(
                    "overlaps the allocation of cluster {}{across} ({held}); both are kept as stored",
                    s.cluster
                );
            }
        }
        Some(match loaded {
            Ok(()) if cluster.frozen() => decide(Change::Keep, Some(held), frozen_message(cluster)),
            Ok(()) => decide(Change::Keep, Some(held), String::new()),
            Err(why) => decide(
                Change::Conflict,
                Some(held),
                format!(
                    "kept as stored, every free address of it reserved, but it cannot be honoured: {why}"
                ),
            ),
        })
    }

    /// Step 2: pinned requests, oldest cluster first.
    fn place_pins(&mut self) {
        for cluster in self.clusters.clone() {
            if cluster.deleting || cluster.frozen() {
                continue;
            }
            for (pool_name, ov) in &cluster.overrides {
                let wanted = match ov {
                    PoolOverride::PinnedAddresses(pieces) => Allocation::Range(pieces.clone()),
                    PoolOverride::PinnedCidr(cidr) => Allocation::Prefix(*cidr),
                    // Adopted once, while nothing is held; then kept like any allocation.
                    PoolOverride::Adopt(pieces)
                        if !pieces.is_empty()
                            && matches!(self.prior(cluster, pool_name), Some((None, None))) =>
                    {
                        Allocation::Range(pieces.clone())
                    }
                    _ => continue,
                };
                if self.serves(pool_name, &cluster.datacenter) {
                    self.place_pin(cluster, pool_name, wanted);
                }
            }
        }
    }

    fn place_pin(&mut self, cluster: &ClusterInput, pool: &str, wanted: Allocation) {
        let dc = cluster.datacenter.clone();
        let Some((held, moved_from)) = self.prior(cluster, pool) else {
            return;
        };
        if let Some(why) = self.blocked_reason(pool, &dc) {
            let keep = held.as_ref().is_some_and(|h| same_addresses(h, &wanted));
            let change = if keep { Change::Keep } else { Change::Fail };
            self.decide(cluster, pool, change, held, moved_from, why);
            return;
        }
        let key = (pool.to_string(), dc.clone());
        if !matches!(self.allocators.get(&key), Some(Ok(_))) {
            let why = self.unusable(pool, &dc);
            self.decide(cluster, pool, Change::Fail, held, moved_from, why);
            return;
        }
        // No machine is pinned to its network's network, broadcast or gateway address.
        if is_machine(cluster) && held.is_none() {
            let reserved = self
                .pools
                .get(pool)
                .and_then(|p| p.datacenters.get(&dc))
                .and_then(|d| {
                    d.machine_reserved
                        .iter()
                        .find(|(r, _)| wanted.ranges().any(|w| w.overlaps(r)))
                });
            if let Some((r, what)) = reserved {
                let why = format!("pinned {wanted} refused: {r} is {what}; no machine gets it");
                self.decide(cluster, pool, Change::Fail, None, moved_from, why);
                return;
            }
        }
        // Its own quarantined addresses are its to pin.
        let lifted = self.lift_quarantine(&key, &cluster.name);
        let adoptable = self.adoptable.get(&cluster.name).cloned();
        let Some(Ok(allocator)) = self.allocators.get_mut(&key) else {
            return;
        };
        // The hand-made `IPAddress` it adopts is set aside under its name: lifted for its own
        // pin only, and set aside again if the pin is refused.
        let adopting = adoptable.map(|tag| {
            let ranges = allocator.give_back(&tag);
            (tag, ranges)
        });
        let decision = match held {
            Some(current) if same_addresses(&current, &wanted) => {
                (Change::Keep, Some(current), None, "pinned".to_string())
            }
            Some(current) => {
                allocator.release(&cluster.name);
                match allocator.pin(&cluster.name, wanted.clone()) {
                    // The message says why the allocation is as it is, the same on every
                    // run that keeps it: what the change released is the decision's
                    // `previous` (the summary table and events show it).
                    Ok(_) => (
                        Change::Replace,
                        Some(wanted),
                        Some(current.clone()),
                        "pinned".to_string(),
                    ),
                    Err(e) => {
                        // Put the old addresses back: nothing else moved since they left.
                        let restored = allocator.load(&cluster.name, current.clone()).is_ok();
                        let kept = if restored {
                            format!("; keeping {current}")
                        } else {
                            String::new()
                        };
                        (
                            Change::Fail,
                            restored.then_some(current),
                            None,
                            format!("pinned {wanted} refused: {e}{kept}"),
                        )
                    }
                }
            }
            None => match allocator.pin(&cluster.name, wanted.clone()) {
                Ok(_) => (
                    Change::Create,
                    Some(wanted),
                    moved_from,
                    "pinned".to_string(),
                ),
                Err(e) => (
                    Change::Fail,
                    None,
                    moved_from,
                    format!("pinned {wanted} refused: {e}"),
                ),
            },
        };
        let (change, held, previous, message) = decision;
        if let Some((tag, ranges)) = adopting
            && change == Change::Fail
            && let Some(Ok(allocator)) = self.allocators.get_mut(&key)
        {
            allocator.set_aside(&tag, crate::allocator::Aside::Shared, ranges);
        }
        if change == Change::Replace
            && let (Some(old), Some(new)) = (&previous, &held)
        {
            let released = spaces::minus(
                &old.ranges().collect::<Vec<_>>(),
                &new.ranges().collect::<Vec<_>>(),
            );
            self.add_released(&key, &cluster.name, released, lifted);
        } else if let Some(entries) = lifted {
            self.restore_quarantine(&key, &cluster.name, entries);
        } else {
            self.mirror(&key, &cluster.name);
        }
        self.decide(cluster, pool, change, held, previous, message);
    }

    /// After a pin moved: quarantines what `cluster` let go in `key`, puts back what it had
    /// quarantined already and did not take again, and tells the space.
    fn add_released(
        &mut self,
        key: &Key,
        cluster: &str,
        released: Vec<AddrRange>,
        lifted: Option<spaces::Entries>,
    ) {
        let mut entries = lifted.unwrap_or_default();
        if self
            .pools
            .get(key.0.as_str())
            .and_then(|p| p.datacenters.get(&key.1))
            .is_some_and(|d| d.reuse_after > 0)
        {
            let known: Vec<AddrRange> = entries
                .iter()
                .flat_map(|(_, r)| r.iter().copied())
                .collect();
            let new = spaces::minus(&released, &known);
            if !new.is_empty() {
                entries.push((self.now, new));
            }
        }
        self.restore_quarantine(key, cluster, entries);
    }

    /// Step 3: new allocations and growth, oldest cluster first.
    fn serve_requests(&mut self) {
        let pools: Vec<&PoolInput> = self.pools.values().copied().collect();
        for cluster in self.clusters.clone() {
            if cluster.deleting || cluster.frozen() {
                continue;
            }
            for pool in &pools {
                let Some(dc) = pool.datacenters.get(&cluster.datacenter) else {
                    continue;
                };
                if !cluster.asks(&pool.name) {
                    continue;
                }
                let request = match cluster.overrides.get(&pool.name) {
                    Some(PoolOverride::OptOut)
                    | Some(PoolOverride::PinnedAddresses(_))
                    | Some(PoolOverride::PinnedCidr(_)) => continue,
                    Some(PoolOverride::Addresses(n)) => Request::Addresses(*n),
                    Some(PoolOverride::Prefix(len)) => Request::Prefix(*len),
                    Some(PoolOverride::Adopt(_)) => {
                        // What it adopted (or holds already) is its size; a pool it serves
                        // nothing from is served as for any cluster.
                        let key = (cluster.name.clone(), pool.name.clone());
                        match self.decisions.get(&key) {
                            Some(d) if d.change == Change::Keep => match &d.held {
                                Some(held @ Allocation::Range(_)) => {
                                    Request::Addresses(held.size().to_u128().unwrap_or(u128::MAX))
                                }
                                _ => dc.config.kind.default_request(),
                            },
                            Some(d) if d.change != Change::Release => continue,
                            _ => dc.config.kind.default_request(),
                        }
                    }
                    None => dc.config.kind.default_request(),
                };
                self.serve(cluster, &pool.name, request);
            }
        }
    }

    fn serve(&mut self, cluster: &ClusterInput, pool: &str, request: Request) {
        let dc = cluster.datacenter.clone();
        let Some((held, moved_from)) = self.prior(cluster, pool) else {
            return;
        };
        if let Some(why) = self.blocked_reason(pool, &dc) {
            // What it holds stays; nothing new (no growth either) until the pool is readable.
            let change = if held.is_some() {
                Change::Keep
            } else {
                Change::Fail
            };
            self.decide(cluster, pool, change, held, moved_from, why);
            return;
        }
        let key = (pool.to_string(), dc.clone());
        if !matches!(self.allocators.get(&key), Some(Ok(_))) {
            let why = self.unusable(pool, &dc);
            self.decide(cluster, pool, Change::Fail, held, moved_from, why);
            return;
        }
        // A former holder asking again gets its quarantined addresses first, the newest
        // release first: what it held last, whatever order the record lists them in.
        let lifted = if held.is_none() {
            self.lift_quarantine(&key, &cluster.name)
        } else {
            None
        };
        let mut newest_first: Vec<&(i64, Vec<AddrRange>)> = lifted.iter().flatten().collect();
        newest_first.sort_by_key(|(at, r)| (std::cmp::Reverse(*at), r.first().copied()));
        let preferred: Vec<AddrRange> = newest_first
            .into_iter()
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        // A machine never gets its network's network, broadcast or gateway address: set aside
        // for this request only (the same allocator; clusters' ranges may still take them).
        let reserved: Vec<AddrRange> = if is_machine(cluster) && held.is_none() {
            self.pools
                .get(pool)
                .and_then(|p| p.datacenters.get(&dc))
                .map(|d| d.machine_reserved.iter().map(|(r, _)| *r).collect())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let Some(Ok(allocator)) = self.allocators.get_mut(&key) else {
            return;
        };
        let set_aside = !reserved.is_empty()
            && !allocator
                .set_aside(
                    MACHINE_RESERVED_TAG,
                    crate::allocator::Aside::Shared,
                    reserved,
                )
                .is_empty();
        let (change, now, previous, message) = match (held, request) {
            (Some(current @ Allocation::Range(_)), Request::Addresses(n)) => {
                match allocator.grow(&cluster.name, n) {
                    Ok(Growth::Unchanged) => (Change::Keep, Some(current), None, String::new()),
                    Ok(Growth::Appended(added)) => {
                        let grown = allocator.get(&cluster.name).cloned();
                        match grown.as_ref().map(pieces).unwrap_or(0) {
                            count if count > MAX_PIECES => {
                                // Put it back as it was: an object that large would be refused.
                                allocator.release(&cluster.name);
                                let _ = allocator.load(&cluster.name, current.clone());
                                let message = format!(
                                    "growth to {n} addresses refused: the pool is so fragmented that it would take {count} pieces, more than the {MAX_PIECES} an IPAMAllocation holds; keeping {current}"
                                );
                                (Change::Fail, Some(current), None, message)
                            }
                            _ => {
                                let message = format!("grew to {n} addresses (+{})", join(&added));
                                (Change::Grow, grown, Some(current), message)
                            }
                        }
                    }
                    Err(e) => (
                        Change::Fail,
                        Some(current.clone()),
                        None,
                        format!("growth to {n} addresses refused: {e}; keeping {current}"),
                    ),
                }
            }
            // Prefix allocations keep their subnet; a new allocationPrefix applies to new
            // allocations only.
            (Some(current), _) => (Change::Keep, Some(current), None, String::new()),
            (None, request) => {
                match allocator.allocate_preferring(&cluster.name, request, &preferred) {
                    Ok(got) if pieces(got) > MAX_PIECES => {
                        let count = pieces(got);
                        allocator.release(&cluster.name);
                        let message = format!(
                            "the pool is so fragmented that {request} would take {count} pieces, more than the {MAX_PIECES} an IPAMAllocation holds"
                        );
                        (Change::Fail, None, moved_from, message)
                    }
                    Ok(got) => {
                        let message = match &moved_from {
                            Some(old) => format!("moved to datacenter {dc}; {old} released"),
                            None => String::new(),
                        };
                        (Change::Create, Some(got.clone()), moved_from, message)
                    }
                    Err(e) if set_aside => (
                        Change::Fail,
                        None,
                        moved_from,
                        format!(
                            "{e} (a machine is never given its network's network, broadcast or gateway address)"
                        ),
                    ),
                    Err(e) => (Change::Fail, None, moved_from, e.to_string()),
                }
            }
        };
        if set_aside {
            allocator.give_back(MACHINE_RESERVED_TAG);
        }
        match lifted {
            Some(entries) => self.restore_quarantine(&key, &cluster.name, entries),
            None => self.mirror(&key, &cluster.name),
        }
        self.decide(cluster, pool, change, now, previous, message);
    }

    /// What step 1 left for (cluster, pool): `(held, moved_from)` — the addresses kept, or
    /// the ones released because the cluster changed datacenter. `None` when the stored
    /// allocation cannot be used and is left for a human.
    fn prior(
        &self,
        cluster: &ClusterInput,
        pool: &str,
    ) -> Option<(Option<Allocation>, Option<Allocation>)> {
        let existing = self
            .decisions
            .get(&(cluster.name.clone(), pool.to_string()));
        match existing {
            Some(d) if matches!(d.change, Change::Fail | Change::Conflict) => None,
            Some(d) if d.change == Change::Keep => Some((d.held.clone(), None)),
            Some(d) if d.change == Change::Release => Some((None, d.previous.clone())),
            _ => Some((None, None)),
        }
    }

    /// Why no new address may be handed out in (pool, dc), if so.
    fn blocked_reason(&self, pool: &str, dc: &str) -> Option<String> {
        let why = self
            .blocked
            .get(&(pool.to_string(), dc.to_string()))
            .or_else(|| self.blocked.get(&(pool.to_string(), String::new())))?;
        Some(format!(
            "no new addresses from pool {pool} in datacenter {dc} until this is fixed or removed: {why}"
        ))
    }

    fn serves(&self, pool: &str, dc: &str) -> bool {
        self.pools
            .get(pool)
            .is_some_and(|p| p.datacenters.contains_key(dc))
    }

    fn unusable(&self, pool: &str, dc: &str) -> String {
        match self.allocators.get(&(pool.to_string(), dc.to_string())) {
            Some(Err(why)) => why.clone(),
            _ => format!("pool {pool} does not serve datacenter {dc}"),
        }
    }

    fn decide(
        &mut self,
        cluster: &ClusterInput,
        pool: &str,
        change: Change,
        held: Option<Allocation>,
        previous: Option<Allocation>,
        message: String,
    ) {
        self.decisions.insert(
            (cluster.name.clone(), pool.to_string()),
            Decision {
                cluster: cluster.name.clone(),
                pool: pool.to_string(),
                datacenter: cluster.datacenter.clone(),
                type_: AllocationType::Range,
                change,
                held,
                previous,
                message,
            },
        );
    }

    /// A planner over `allocators` (fresh ones, or those a plan kept: see [`serve_new`]).
    fn resume(
        pools: &[&'a PoolInput],
        clusters: &[&'a ClusterInput],
        allocators: BTreeMap<Key, Result<PoolAllocator, String>>,
    ) -> Self {
        let mut sorted: Vec<&'a ClusterInput> = clusters.to_vec();
        sorted.sort_by(|a, b| a.age_key().cmp(&b.age_key()));
        Planner {
            pools: pools.iter().map(|p| (p.name.as_str(), *p)).collect(),
            by_name: clusters.iter().map(|c| (c.name.as_str(), *c)).collect(),
            clusters: sorted,
            siblings: spaces::siblings(pools),
            allocators,
            decisions: BTreeMap::new(),
            blocked: BTreeMap::new(),
            now: 0,
            shared_tags: HashMap::new(),
            quarantine: BTreeMap::new(),
            adoptable: HashMap::new(),
        }
    }

    /// The plan, and the allocators with what they say about each pool datacenter.
    fn finish(self) -> (Plan, PoolStates) {
        let mut youngest: BTreeMap<Key, AgeKey> = BTreeMap::new();
        for d in self.decisions.values() {
            if !matches!(
                d.change,
                Change::Create | Change::Grow | Change::Replace | Change::Fail
            ) {
                continue;
            }
            let Some(c) = self.by_name.get(d.cluster.as_str()) else {
                continue;
            };
            let age = age_of(c);
            let slot = youngest
                .entry((d.pool.clone(), d.datacenter.clone()))
                .or_insert_with(|| age.clone());
            if age > *slot {
                *slot = age;
            }
        }
        let usage = self
            .allocators
            .iter()
            .filter_map(|((pool, dc), a)| {
                let allocator = a.as_ref().ok()?;
                Some((
                    (pool.clone(), dc.clone()),
                    DatacenterReport {
                        pool: pool.clone(),
                        datacenter: dc.clone(),
                        usage: allocator.usage(),
                        cidrs: allocator.cidr_usage(),
                    },
                ))
            })
            .collect();
        let quarantined = self.quarantine_list();
        let pools = self.pools;
        let decisions = self
            .decisions
            .into_values()
            .map(|mut d| {
                d.type_ = decision_type(&d, &pools);
                d
            })
            .collect();
        let blocked = self.blocked;
        let siblings = self.siblings;
        let quarantine = self.quarantine;
        let states = self
            .allocators
            .into_iter()
            .map(|(key, allocator)| {
                let state = fast::PoolState {
                    blocked: blocked.contains_key(&key)
                        || blocked.contains_key(&(key.0.clone(), String::new())),
                    youngest_request: youngest.remove(&key),
                    shared: siblings.contains_key(&key),
                    quarantine: quarantine.get(&key).is_some_and(|h| !h.is_empty()),
                    allocator,
                };
                (key, state)
            })
            .collect();
        (
            Plan {
                decisions,
                usage,
                quarantined,
            },
            PoolStates::from_map(states),
        )
    }
}

/// What step 1 does with a stored allocation for an explicit reason, if it does not simply
/// keep it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Released, for this reason: its cluster is gone or being deleted, its pool or
    /// datacenter is gone, the cluster moved to another datacenter, opted out, or (a claim)
    /// asks another pool now.
    Release(String),
    /// Kept by `reclaimPolicy: Retain` although its pool or datacenter is gone.
    Retain(String),
}

/// The one rule deciding whether a stored allocation is released or retained (`None`: it
/// stays with its cluster, which may still grow, shrink or re-pin it). `cluster` and `pool`
/// are the cluster and pool it names, if they exist. The planner settles stored allocations
/// by it, and the controller uses it to know, before planning, which addresses the plan will
/// release while objects still show them (they must not go to another holder in the same
/// plan: see `docs/design.md`, "A released address waits for its object").
pub fn settle(
    s: &StoredAllocation,
    cluster: Option<&ClusterInput>,
    pool: Option<&PoolInput>,
) -> Option<Settle> {
    if s.unreadable.is_some() {
        return None;
    }
    let Some(cluster) = cluster else {
        return Some(Settle::Release(format!(
            "cluster {} no longer exists",
            s.cluster
        )));
    };
    // Before the pool's reclaim policy: `Retain` keeps addresses for clusters that stay, and
    // a cluster being deleted waits for every allocation it holds to go.
    if cluster.deleting {
        return Some(Settle::Release(format!(
            "cluster {} is being deleted",
            s.cluster
        )));
    }
    // A move releases, what `Retain` keeps included: `Retain` keeps addresses for a cluster
    // that stays in the datacenter, and a cluster that moved is served (and its addons
    // rendered) in its new datacenter only, where nothing would ever show the kept ones.
    // A frozen cluster keeps everything until it is resumed.
    if !cluster.frozen() && cluster.datacenter != s.datacenter {
        return Some(Settle::Release(format!(
            "cluster {} moved from datacenter {} to {}",
            s.cluster, s.datacenter, cluster.datacenter
        )));
    }
    let Some(pool) = pool else {
        return Some(
            if s.reclaim_policy == Some(ReclaimPolicy::Retain) && s.held.is_some() {
                Settle::Retain(format!(
                    "pool {} no longer exists; kept by reclaimPolicy Retain",
                    s.pool
                ))
            } else {
                Settle::Release(format!("pool {} no longer exists", s.pool))
            },
        );
    };
    if !pool.datacenters.contains_key(&s.datacenter) {
        let why = format!(
            "datacenter {} was removed from pool {}",
            s.datacenter, s.pool
        );
        return Some(
            if pool.reclaim_policy == ReclaimPolicy::Retain && s.held.is_some() {
                Settle::Retain(format!("{why}; kept by reclaimPolicy Retain"))
            } else {
                Settle::Release(why)
            },
        );
    }
    if cluster.frozen() {
        return None;
    }
    if cluster.overrides.get(&s.pool) == Some(&PoolOverride::OptOut) {
        return Some(Settle::Release(format!(
            "cluster {} opted out of pool {}",
            s.cluster, s.pool
        )));
    }
    if let Some(only) = cluster.only_pool.as_deref().filter(|p| *p != s.pool) {
        return Some(Settle::Release(format!(
            "{} now asks pool {only}, not {}",
            s.cluster, s.pool
        )));
    }
    None
}

/// What of `s` a pin of its cluster gives up in this plan: the stored addresses the pin no
/// longer covers, when its cluster pins (`addresses` / `cidr`) other addresses of the same
/// pool datacenter. The pin may still be refused, in which case nothing is given up.
pub fn given_up_by_pin(s: &StoredAllocation, cluster: &ClusterInput) -> Vec<AddrRange> {
    let Some(held) = &s.held else {
        return Vec::new();
    };
    if cluster.deleting || cluster.frozen() || cluster.datacenter != s.datacenter {
        return Vec::new();
    }
    let wanted = match cluster.overrides.get(&s.pool) {
        Some(PoolOverride::PinnedAddresses(pieces)) => Allocation::Range(pieces.clone()),
        Some(PoolOverride::PinnedCidr(cidr)) => Allocation::Prefix(*cidr),
        _ => return Vec::new(),
    };
    spaces::minus(
        &held.ranges().collect::<Vec<_>>(),
        &wanted.ranges().collect::<Vec<_>>(),
    )
}

fn frozen_message(cluster: &ClusterInput) -> String {
    match &cluster.invalid {
        Some(why) => format!("cluster spec is invalid, keeping what it holds: {why}"),
        None if cluster.paused => "cluster is paused".into(),
        None => cluster.hold.clone().unwrap_or_default(),
    }
}

/// Most pieces one allocation may have: the object holding it must stay storable.
const MAX_PIECES: usize = crate::resources::bounds::MAX_ALLOCATION_PIECES as usize;

fn pieces(a: &Allocation) -> usize {
    match a {
        Allocation::Range(p) => p.len(),
        Allocation::Prefix(_) => 1,
    }
}

/// The type of what is (or was) held, else of the pool datacenter.
fn decision_type(d: &Decision, pools: &BTreeMap<&str, &PoolInput>) -> AllocationType {
    let from_allocation = |a: &Allocation| match a {
        Allocation::Range(_) => AllocationType::Range,
        Allocation::Prefix(_) => AllocationType::Prefix,
    };
    if let Some(a) = d.held.as_ref().or(d.previous.as_ref()) {
        return from_allocation(a);
    }
    match pools
        .get(d.pool.as_str())
        .and_then(|p| p.datacenters.get(&d.datacenter))
        .map(|dc| dc.config.kind)
    {
        Some(PoolKind::Prefix { .. }) => AllocationType::Prefix,
        _ => AllocationType::Range,
    }
}

/// An allocator with the exclusions applied, or why it cannot be built.
fn build_allocator(input: &DatacenterInput) -> Result<PoolAllocator, String> {
    let mut allocator = PoolAllocator::new(input.config.clone()).map_err(|e| e.to_string())?;
    for exclusion in &input.exclusions {
        allocator.exclude(*exclusion).map_err(|e| e.to_string())?;
    }
    Ok(allocator)
}

/// Two allocations cover the same addresses (pieces compared as sets, not strings).
fn same_addresses(a: &Allocation, b: &Allocation) -> bool {
    match (a, b) {
        (Allocation::Prefix(x), Allocation::Prefix(y)) => x == y,
        (Allocation::Range(_), Allocation::Range(_)) => {
            normalise(a.ranges().collect()) == normalise(b.ranges().collect())
        }
        _ => false,
    }
}

/// Sorted, merged (first, last) pairs.
fn normalise(mut ranges: Vec<AddrRange>) -> Vec<(u128, u128)> {
    ranges.sort();
    let mut out: Vec<(u128, u128)> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(last) if last.1 == u128::MAX || r.first() <= last.1 + 1 => {
                last.1 = last.1.max(r.last());
            }
            _ => out.push((r.first(), r.last())),
        }
    }
    out
}

fn join(pieces: &[AddrRange]) -> String {
    pieces
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
