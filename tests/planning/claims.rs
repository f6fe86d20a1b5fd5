//! Cluster API claims served from the pools user clusters are served from, over random
//! sequences of cluster and claim creates and deletes, claims asking for an address (free,
//! held, quarantined, excluded or outside the pool) and clock steps, each replanned from what
//! the previous plan stored and quarantined:
//!
//! - no address is held by two holders at once (claims, clusters, quarantine entries of
//!   others), in one pool or across the pools of one address space and datacenter;
//! - every address handed out lies in its pool datacenter's CIDRs and outside its exclusions;
//! - a claim holds exactly one address (range pool) or one subnet of `allocationPrefix`
//!   (prefix pool), of its one pool only, keeps it while it lives, and waits only when
//!   nothing is free for it;
//! - a requested address is honoured exactly when it is free for the claim;
//! - a claim deleted and created again within `reuseAfter` gets its address back, and nobody
//!   else gets it before the period ends;
//! - the incremental planner (`changed_pools` + `plan_pools`) gives exactly the whole plan.
//!
//! Claims are read the way the planning pass reads them: `validation::claim_input` over an
//! `IPAddressClaim`, with what the previous plan stored for it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use kipam::allocator::{Allocation, PoolKind};
use kipam::planner::{
    Change, ClusterInput, Plan, PlanInputs, PoolInput, PoolOverride, Quarantined, StoredAllocation,
    changed_pools, plan_pools,
};
use kipam::resources::capi::{
    ANNOTATION_CLAIM_DATACENTER, ANNOTATION_REQUESTED_ADDRESS, IPAddressClaim, claim_holder,
};
use kipam::validation::{ClaimHeld, ClaimPool, claim_input};
use proptest::prelude::*;

use super::{cluster_in, pool_input, stored_after};

const CLUSTERS: usize = 4;
const CLAIMS: usize = 6;
const DATACENTERS: [&str; 2] = ["dc-1", "dc-2"];
/// Claims ask dc-1; `lan` also serves dc-2 (clusters only).
const CLAIM_DC: &str = "dc-1";
const POOLS: [&str; 4] = ["lan", "shared", "nets", "vrf"];
const T0: i64 = 1_800_000_000;

/// `lan` (range, an exclusion) and `shared` (range) overlap in dc-1 in the default space;
/// `nets` is a prefix pool with an exclusion; `vrf` reuses `lan`'s network in another space.
fn pools() -> Vec<PoolInput> {
    [
        (
            "lan",
            "datacenters:\n    dc-1: {type: range, poolCidr: 10.1.0.0/27, allocationRange: 3, excludeRanges: [10.1.0.4-10.1.0.5], reuseAfter: 1h}\n    dc-2: {type: range, poolCidr: 10.1.1.0/29, allocationRange: 2, reuseAfter: 1h}\n",
        ),
        (
            "shared",
            "datacenters:\n    dc-1: {type: range, poolCidr: 10.1.0.16/28, allocationRange: 2, reuseAfter: 30m, strategy: BestFit}\n",
        ),
        (
            "nets",
            "datacenters:\n    dc-1: {type: prefix, poolCidr: 10.2.0.0/26, allocationPrefix: 29, excludePrefixes: [10.2.0.24/29], reuseAfter: 1h}\n",
        ),
        (
            "vrf",
            "addressSpace: vrf-b\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.1.0.0/27, allocationRange: 2, reuseAfter: 20m}\n",
        ),
    ]
    .iter()
    .map(|(name, body)| {
        pool_input(&format!(
            "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: {name}\nspec:\n  {body}"
        ))
    })
    .collect()
}

/// What a new claim asks for.
#[derive(Clone, Debug)]
enum Ask {
    /// The pool's default request.
    Anything,
    /// The address at this offset from the pool's network (some lie outside the pool).
    Address(u32),
    /// One of the addresses held or quarantined in the pool's space (by index).
    Taken(usize),
    /// The `/29` at this index of `nets` (the last lies outside it), as a CIDR.
    Subnet(u32),
}

#[derive(Clone, Debug)]
enum Step {
    AddCluster {
        c: usize,
        dc: usize,
        day: u32,
    },
    /// `remove`: the object is gone at once; else it is marked deleting first.
    DeleteCluster {
        c: usize,
        remove: bool,
    },
    AddClaim {
        k: usize,
        pool: usize,
        day: u32,
        ask: Ask,
    },
    DeleteClaim {
        k: usize,
        remove: bool,
    },
    Tick {
        minutes: i64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let ask = prop_oneof![
        4 => Just(Ask::Anything),
        2 => (0..40u32).prop_map(Ask::Address),
        2 => (0..64usize).prop_map(Ask::Taken),
        1 => (0..9u32).prop_map(Ask::Subnet),
    ];
    prop_oneof![
        3 => (0..CLUSTERS, 0..4usize, 1..28u32)
            .prop_map(|(c, dc, day)| Step::AddCluster { c, dc: dc / 3, day }),
        1 => (0..CLUSTERS, any::<bool>()).prop_map(|(c, remove)| Step::DeleteCluster { c, remove }),
        // Mostly each claim's own pool, so that claims come back to it.
        6 => (0..CLAIMS, 0..2 * POOLS.len(), 1..28u32, ask).prop_map(|(k, pool, day, ask)| {
            let pool = if pool < POOLS.len() { pool } else { k % POOLS.len() };
            Step::AddClaim { k, pool, day, ask }
        }),
        4 => (0..CLAIMS, any::<bool>()).prop_map(|(k, remove)| Step::DeleteClaim { k, remove }),
        2 => (1..45i64).prop_map(|minutes| Step::Tick { minutes }),
    ]
}

fn claim_object(k: usize, pool: &str, day: u32, requested: Option<&str>) -> IPAddressClaim {
    let mut annotations = serde_json::Map::new();
    annotations.insert(ANNOTATION_CLAIM_DATACENTER.into(), CLAIM_DC.into());
    if let Some(r) = requested {
        annotations.insert(ANNOTATION_REQUESTED_ADDRESS.into(), r.into());
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {
            "name": format!("m{k}"),
            "namespace": "capi",
            "creationTimestamp": format!("2026-01-{day:02}T00:00:00Z"),
            "annotations": annotations,
        },
        "spec": {
            "clusterName": "edge",
            "poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": pool},
        },
    }))
    .expect("claim parses")
}

fn marked_deleting(claim: &IPAddressClaim) -> IPAddressClaim {
    let mut v = serde_json::to_value(claim).expect("claim serialises");
    v["metadata"]["deletionTimestamp"] = "2026-02-01T00:00:00Z".into();
    serde_json::from_value(v).expect("claim parses")
}

fn addresses(a: &Allocation) -> BTreeSet<u128> {
    a.ranges().flat_map(|r| r.first()..=r.last()).collect()
}

fn ip(a: u128) -> Ipv4Addr {
    Ipv4Addr::from(a as u32)
}

/// (address space, datacenter, address).
type Slot = (String, String, u128);

struct World {
    pools: Vec<PoolInput>,
    clusters: BTreeMap<String, ClusterInput>,
    /// Holder -> (pool, claim object).
    claims: BTreeMap<String, (String, IPAddressClaim)>,
    stored: Vec<StoredAllocation>,
    quarantined: Vec<Quarantined>,
    now: i64,
}

impl World {
    fn pool(&self, name: &str) -> &PoolInput {
        self.pools.iter().find(|p| p.name == name).expect("pool")
    }

    fn space(&self, pool: &str, dc: &str) -> (String, String) {
        (self.pool(pool).address_space.clone(), dc.to_string())
    }

    /// Whether `a` lies in a CIDR of (pool, dc) and outside its exclusions.
    fn inside(&self, pool: &str, dc: &str, a: u128) -> bool {
        let Some(d) = self.pool(pool).datacenters.get(dc) else {
            return false;
        };
        let in_cidr = std::iter::once(&d.config.cidr)
            .chain(d.config.additional.iter())
            .any(|c| c.first() <= a && a <= c.last());
        in_cidr && !d.exclusions.iter().any(|x| x.first() <= a && a <= x.last())
    }

    fn reuse_after(&self, pool: &str, dc: &str) -> i64 {
        self.pool(pool)
            .datacenters
            .get(dc)
            .map_or(0, |d| d.reuse_after as i64)
    }

    fn stored_for(&self, holder: &str) -> Option<&StoredAllocation> {
        self.stored
            .iter()
            .find(|s| s.cluster == holder && s.held.is_some())
    }

    /// The planner's input, read as the planning pass reads it. Objects being deleted that
    /// hold nothing any more are gone first (their finalizers dropped).
    fn inputs(&mut self) -> PlanInputs {
        let held: BTreeSet<String> = self
            .stored
            .iter()
            .filter(|s| s.held.is_some())
            .map(|s| s.cluster.clone())
            .collect();
        self.clusters
            .retain(|name, c| !c.deleting || held.contains(name));
        let mut clusters: Vec<ClusterInput> = self.clusters.values().cloned().collect();
        let mut gone = Vec::new();
        for (holder, (pool, claim)) in &self.claims {
            let holding = self.stored_for(holder).map(|s| ClaimHeld {
                datacenter: &s.datacenter,
                held: s.held.as_ref().expect("held"),
            });
            let read = claim_input(
                claim,
                pool,
                ClaimPool::Ready(self.pool(pool)),
                None,
                false,
                holding,
            );
            match read.input {
                Some(input) => clusters.push(input),
                None => {
                    assert!(
                        claim.metadata.deletion_timestamp.is_some(),
                        "{holder} not served: {:?}",
                        read.wait
                    );
                    gone.push(holder.clone());
                }
            }
        }
        for holder in gone {
            self.claims.remove(&holder);
        }
        PlanInputs {
            pools: self.pools.clone(),
            clusters,
            stored: self.stored.clone(),
            quarantined: self.quarantined.clone(),
            now: self.now,
            held_elsewhere: Vec::new(),
        }
    }

    /// What the plan's writes store: cluster allocations as IPAMAllocations read back, claim
    /// holdings as the pool record keeps them.
    fn land(&mut self, plan: &Plan) {
        let clusters_only = Plan {
            decisions: plan
                .decisions
                .iter()
                .filter(|d| !d.cluster.starts_with("claim/"))
                .cloned()
                .collect(),
            ..Plan::default()
        };
        let mut stored = stored_after(&clusters_only, &self.pools);
        stored.extend(
            plan.decisions
                .iter()
                .filter(|d| d.cluster.starts_with("claim/") && d.change != Change::Release)
                .filter(|d| d.held.is_some())
                .map(|d| StoredAllocation {
                    cluster: d.cluster.clone(),
                    pool: d.pool.clone(),
                    datacenter: d.datacenter.clone(),
                    held: d.held.clone(),
                    reclaim_policy: None,
                    unreadable: None,
                }),
        );
        self.stored = stored;
        self.quarantined = plan.quarantined.clone();
    }

    /// Who holds each address after `plan`, per address space and datacenter.
    fn holders(&self, plan: &Plan) -> Result<BTreeMap<Slot, (String, String)>, TestCaseError> {
        let mut out: BTreeMap<Slot, (String, String)> = BTreeMap::new();
        for d in &plan.decisions {
            let Some(held) = d.held.as_ref().filter(|_| d.change != Change::Release) else {
                continue;
            };
            let (space, dc) = self.space(&d.pool, &d.datacenter);
            for a in addresses(held) {
                if let Some(other) = out.insert(
                    (space.clone(), dc.clone(), a),
                    (d.cluster.clone(), d.pool.clone()),
                ) {
                    prop_assert!(
                        false,
                        "{} ({space}, {dc}) held by {:?} and {}/{}",
                        ip(a),
                        other,
                        d.cluster,
                        d.pool
                    );
                }
            }
        }
        Ok(out)
    }

    /// Quarantined addresses per slot -> (former holder, pool it was released from).
    fn quarantine(
        &self,
        list: &[Quarantined],
    ) -> Result<BTreeMap<Slot, (String, String)>, TestCaseError> {
        let mut out: BTreeMap<Slot, (String, String)> = BTreeMap::new();
        for q in list {
            let (space, dc) = self.space(&q.pool, &q.datacenter);
            for r in &q.addresses {
                for a in r.first()..=r.last() {
                    if let Some((other, _)) = out.insert(
                        (space.clone(), dc.clone(), a),
                        (q.holder.clone(), q.pool.clone()),
                    ) {
                        prop_assert!(
                            other == q.holder,
                            "{} quarantined for both {} and {}",
                            ip(a),
                            other,
                            q.holder
                        );
                    }
                }
            }
        }
        Ok(out)
    }

    /// Whether the addresses `wanted` of (pool, dc) are free for `holder` after `plan`: its
    /// own quarantined addresses are, when released from this very pool.
    fn free_for(&self, plan: &Plan, holder: &str, pool: &str, wanted: &BTreeSet<u128>) -> bool {
        let (space, dc) = self.space(pool, CLAIM_DC);
        let Ok(held) = self.holders(plan) else {
            return false;
        };
        let Ok(quarantined) = self.quarantine(&plan.quarantined) else {
            return false;
        };
        let reserved = &self.pool(pool).datacenters[CLAIM_DC].machine_reserved;
        wanted.iter().all(|a| {
            let slot = (space.clone(), dc.clone(), *a);
            // No machine gets its network's network, broadcast or gateway address.
            !reserved
                .iter()
                .any(|(r, _)| r.first() <= *a && *a <= r.last())
                && self.inside(pool, CLAIM_DC, *a)
                && held.get(&slot).is_none_or(|(h, _)| h == holder)
                && quarantined
                    .get(&slot)
                    .is_none_or(|(h, p)| h == holder && p == pool)
        })
    }
}

/// The address or CIDR a new claim asks for, as written in its annotation, and what that
/// means in its pool.
fn requested(w: &World, plan: &Plan, pool: &str, ask: &Ask) -> Option<(String, Allocation)> {
    let d = &w.pool(pool).datacenters[CLAIM_DC];
    let prefix = match d.config.kind {
        PoolKind::Prefix { allocation_prefix } => Some(allocation_prefix),
        PoolKind::Range { .. } => None,
    };
    let network = d.config.cidr.first();
    let address = match ask {
        Ask::Anything => return None,
        Ask::Address(offset) => {
            network + u128::from(*offset) * if prefix.is_some() { 2 } else { 1 }
        }
        Ask::Taken(i) => {
            let (space, dc) = w.space(pool, CLAIM_DC);
            let held = w.holders(plan).ok()?;
            let quarantined = w.quarantine(&plan.quarantined).ok()?;
            let taken: Vec<u128> = held
                .keys()
                .chain(quarantined.keys())
                .filter(|(s, c, _)| *s == space && *c == dc)
                .map(|(_, _, a)| *a)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            *taken.get(i % taken.len().max(1))?
        }
        Ask::Subnet(i) => {
            let len = prefix?;
            let cidr = format!("{}/{len}", ip(network + u128::from(*i) * 8));
            let parsed: kipam::address::Cidr = cidr.parse().expect("cidr");
            return Some((cidr, Allocation::Prefix(parsed)));
        }
    };
    let text = ip(address).to_string();
    let wanted = match prefix {
        Some(len) => {
            let size = 1u128 << (32 - len);
            let cidr: kipam::address::Cidr = format!("{}/{len}", ip(address & !(size - 1)))
                .parse()
                .expect("cidr");
            Allocation::Prefix(cidr)
        }
        None => Allocation::Range(vec![format!("{text}-{text}").parse().expect("range")]),
    };
    Some((text, wanted))
}

/// A claim that went away holding something: (pool, what it held, when).
type Gone = (String, Allocation, i64);

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let mut w = World {
        pools: pools(),
        clusters: BTreeMap::new(),
        claims: BTreeMap::new(),
        stored: Vec::new(),
        quarantined: Vec::new(),
        now: T0,
    };
    let mut plan = Plan::default();
    let mut incremental = Plan::default();
    let mut before = PlanInputs::default();
    // Slot -> (former holder, released at, reuseAfter of its pool datacenter).
    let mut released: BTreeMap<Slot, (String, i64, i64)> = BTreeMap::new();
    let mut gone: BTreeMap<String, Gone> = BTreeMap::new();
    // Live claim -> what it holds.
    let mut holding: BTreeMap<String, Allocation> = BTreeMap::new();
    for (n, step) in steps.iter().enumerate() {
        // A new claim's request: (holder, pool, what it asked, whether that was free).
        let mut asked: Option<(String, Allocation, bool)> = None;
        let mut returning: Option<(String, Allocation, i64)> = None;
        match step {
            Step::AddCluster { c, dc, day } => {
                let name = format!("c{c}");
                w.clusters
                    .entry(name.clone())
                    .or_insert_with(|| cluster_in(&name, DATACENTERS[*dc], *day));
            }
            Step::DeleteCluster { c, remove } => {
                let name = format!("c{c}");
                if *remove {
                    w.clusters.remove(&name);
                } else if let Some(x) = w.clusters.get_mut(&name) {
                    x.deleting = true;
                }
            }
            Step::AddClaim { k, pool, day, ask } => {
                let holder = claim_holder("capi", &format!("m{k}"));
                let pool = POOLS[*pool];
                if !w.claims.contains_key(&holder) {
                    let request = requested(&w, &plan, pool, ask);
                    if let Some((_, wanted)) = &request {
                        let free = w.free_for(&plan, &holder, pool, &addresses(wanted));
                        asked = Some((holder.clone(), wanted.clone(), free));
                    }
                    if let Some((p, old, at)) = gone.remove(&holder)
                        && p == pool
                        && w.now < at + w.reuse_after(pool, CLAIM_DC)
                        && request.as_ref().is_none_or(|(_, wanted)| *wanted == old)
                    {
                        returning = Some((holder.clone(), old, at));
                    }
                    let obj = claim_object(*k, pool, *day, request.as_ref().map(|r| r.0.as_str()));
                    w.claims.insert(holder, (pool.to_string(), obj));
                }
            }
            Step::DeleteClaim { k, remove } => {
                let holder = claim_holder("capi", &format!("m{k}"));
                if *remove {
                    w.claims.remove(&holder);
                } else if let Some((_, claim)) = w.claims.get_mut(&holder) {
                    *claim = marked_deleting(claim);
                }
            }
            Step::Tick { minutes } => w.now += minutes * 60,
        }
        let inputs = w.inputs();
        let previous = std::mem::replace(&mut plan, inputs.plan());
        let ctx = format!("step {n} ({step:?}) at {}", w.now - T0);

        // The incremental planner gives the whole plan.
        let dirty = changed_pools(&before, &inputs);
        incremental.replace_pools(&dirty, plan_pools(&inputs, &dirty));
        prop_assert_eq!(&incremental, &plan, "{}: replanned {:?}", ctx, dirty);
        before = inputs.clone();

        // One holder per address; quarantined addresses are nobody else's.
        let holders = w
            .holders(&plan)
            .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
        let quarantined = w
            .quarantine(&plan.quarantined)
            .map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
        for (slot, (former, _)) in &quarantined {
            if let Some((h, p)) = holders.get(slot) {
                prop_assert!(
                    h == former,
                    "{}: {} quarantined for {} but held by {}/{}",
                    ctx,
                    ip(slot.2),
                    former,
                    h,
                    p
                );
            }
        }
        // Inside the pool, outside its exclusions.
        for d in &plan.decisions {
            let Some(held) = d.held.as_ref().filter(|_| d.change != Change::Release) else {
                continue;
            };
            for a in addresses(held) {
                prop_assert!(
                    w.inside(&d.pool, &d.datacenter, a),
                    "{}: {}/{} holds {} outside pool {} in {} or excluded",
                    ctx,
                    d.cluster,
                    d.pool,
                    ip(a),
                    d.pool,
                    d.datacenter
                );
            }
        }

        // Claims: one address or one subnet, of their one pool, kept while they live; they
        // wait only when nothing is free for them.
        let claims: BTreeMap<&str, &ClusterInput> = inputs
            .clusters
            .iter()
            .filter(|c| c.is_claim())
            .map(|c| (c.name.as_str(), c))
            .collect();
        for d in plan
            .decisions
            .iter()
            .filter(|d| d.cluster.starts_with("claim/"))
        {
            let pool = w.claims.get(&d.cluster).map(|(p, _)| p.as_str());
            let was = previous
                .decision(&d.cluster, &d.pool)
                .and_then(|p| p.held.clone());
            prop_assert!(
                pool == Some(d.pool.as_str()) || (d.change == Change::Release && was.is_some()),
                "{}: claim {} of pool {:?} has a decision in pool {}: {:?}",
                ctx,
                d.cluster,
                pool,
                d.pool,
                d
            );
        }
        for (holder, input) in &claims {
            let pool = input.only_pool.as_deref().expect("a claim asks one pool");
            let d = plan.decision(holder, pool);
            if input.deleting {
                prop_assert!(
                    d.is_some_and(|d| d.change == Change::Release && d.held.is_none()),
                    "{}: deleting claim {} not released: {:?}",
                    ctx,
                    holder,
                    d
                );
                continue;
            }
            let Some(d) = d else {
                return Err(TestCaseError::fail(format!(
                    "{ctx}: claim {holder} has no decision"
                )));
            };
            let kind = w.pool(pool).datacenters[CLAIM_DC].config.kind;
            match (&d.held, kind) {
                (Some(Allocation::Range(pieces)), PoolKind::Range { .. }) => {
                    prop_assert!(
                        addresses(&Allocation::Range(pieces.clone())).len() == 1,
                        "{}: claim {} holds {:?}",
                        ctx,
                        holder,
                        pieces
                    );
                }
                (Some(Allocation::Prefix(c)), PoolKind::Prefix { allocation_prefix }) => {
                    prop_assert_eq!(c.prefix_len(), allocation_prefix, "{}: {}", ctx, holder);
                }
                (Some(other), _) => {
                    prop_assert!(false, "{}: claim {} holds {}", ctx, holder, other)
                }
                (None, _) => {
                    prop_assert_eq!(d.change, Change::Fail, "{}: {} holds nothing", ctx, holder);
                    let pinned = match input.overrides.get(pool) {
                        Some(PoolOverride::PinnedAddresses(pieces)) => {
                            Some(Allocation::Range(pieces.clone()))
                        }
                        Some(PoolOverride::PinnedCidr(c)) => Some(Allocation::Prefix(*c)),
                        _ => None,
                    };
                    if let Some(wanted) = &pinned {
                        // Refused only while what it asks is not free for it.
                        prop_assert!(
                            !w.free_for(&plan, holder, pool, &addresses(wanted)),
                            "{}: claim {} refused {} ({}) though it is free",
                            ctx,
                            holder,
                            wanted,
                            d_message(&plan, holder, pool)
                        );
                    } else {
                        // Nothing free for it: every address (range) or every aligned subnet
                        // (prefix) of the pool has one that is not.
                        let d = &w.pool(pool).datacenters[CLAIM_DC];
                        let cidr = d.config.cidr;
                        let size = match kind {
                            PoolKind::Prefix { allocation_prefix } => {
                                1u128 << (32 - allocation_prefix)
                            }
                            PoolKind::Range { .. } => 1,
                        };
                        let mut start = cidr.first();
                        while start <= cidr.last() {
                            let block: BTreeSet<u128> = (start..start + size).collect();
                            prop_assert!(
                                !w.free_for(&plan, holder, pool, &block),
                                "{}: claim {} waits ({}) though {}+{} is free",
                                ctx,
                                holder,
                                d_message(&plan, holder, pool),
                                ip(start),
                                size
                            );
                            start += size;
                        }
                    }
                }
            }
            if let Some(h) = &d.held {
                let reserved = &w.pool(pool).datacenters[CLAIM_DC].machine_reserved;
                for a in addresses(h) {
                    prop_assert!(
                        !reserved
                            .iter()
                            .any(|(r, _)| r.first() <= a && a <= r.last()),
                        "{}: claim {} holds {}, which no machine may have",
                        ctx,
                        holder,
                        ip(a)
                    );
                }
                if let Some(before) = holding.get(*holder) {
                    prop_assert_eq!(before, h, "{}: claim {} moved", ctx, holder);
                }
                holding.insert(holder.to_string(), h.clone());
            }
        }
        holding.retain(|h, _| claims.get(h.as_str()).is_some_and(|c| !c.deleting));

        // A requested address is honoured exactly when it was free.
        if let Some((holder, wanted, free)) = &asked {
            let pool = &w.claims[holder].0;
            let d = plan.decision(holder, pool);
            let honoured = d.is_some_and(|d| d.held.as_ref() == Some(wanted));
            prop_assert_eq!(
                honoured,
                *free,
                "{}: {} asked {} ({}): {:?}",
                ctx,
                holder,
                wanted,
                if *free { "free" } else { "not free" },
                d
            );
        }
        // A claim back within the period gets what it held last. (Released in the same
        // second as other addresses of its, any of those will do: the record cannot tell.)
        if let Some((holder, old, at)) = &returning {
            let pool = &w.claims[holder].0;
            let d = plan.decision(holder, pool);
            let mut last = addresses(old);
            for q in &previous.quarantined {
                if q.holder == *holder && q.pool == *pool && q.released_at == *at {
                    last.extend(q.addresses.iter().flat_map(|r| r.first()..=r.last()));
                }
            }
            prop_assert!(
                d.and_then(|d| d.held.as_ref()).is_some_and(|h| {
                    std::mem::discriminant(h) == std::mem::discriminant(old)
                        && addresses(h).len() == addresses(old).len()
                        && addresses(h).is_subset(&last)
                }),
                "{}: {} back within reuseAfter should get {} again: {:?}",
                ctx,
                holder,
                old,
                d
            );
        }

        // Nothing released goes to another holder before its period ends.
        for (slot, (h, p)) in &holders {
            if let Some((former, at, period)) = released.get(slot)
                && former != h
            {
                prop_assert!(
                    w.now >= at + period,
                    "{}: {} released by {} at {} (reuseAfter {}s) held by {}/{}",
                    ctx,
                    ip(slot.2),
                    former,
                    at - T0,
                    period,
                    h,
                    p
                );
            }
        }
        let old_holders = w.holders(&previous)?;
        for (slot, (h, p)) in old_holders {
            if holders.get(&slot).is_none_or(|(now, _)| *now != h) {
                let period = w.reuse_after(&p, &slot.1);
                released.insert(slot, (h, w.now, period));
            }
        }
        released.retain(|slot, (former, _, _)| holders.get(slot).is_none_or(|(h, _)| h != former));
        for d in &plan.decisions {
            if d.change == Change::Release
                && d.cluster.starts_with("claim/")
                && let Some(old) = &d.previous
            {
                gone.insert(d.cluster.clone(), (d.pool.clone(), old.clone(), w.now));
            }
        }

        w.land(&plan);
    }
    Ok(())
}

fn d_message(plan: &Plan, holder: &str, pool: &str) -> String {
    plan.decision(holder, pool)
        .map(|d| d.message.clone())
        .unwrap_or_default()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn claims_and_clusters_share_pools_and_keep_the_promise(
        steps in proptest::collection::vec(step(), 1..50)
    ) {
        run(steps)?;
    }
}

/// Found by the property above: a claim deleted, re-created asking another address, deleted
/// again a minute later and re-created within `reuseAfter` got the address of its first life
/// (the oldest quarantine entry) rather than the one it held last.
#[test]
fn a_claim_back_gets_the_address_it_held_last() {
    let steps = vec![
        Step::AddClaim {
            k: 3,
            pool: 3,
            day: 1,
            ask: Ask::Anything,
        },
        Step::DeleteClaim {
            k: 3,
            remove: false,
        },
        Step::Tick { minutes: 1 },
        Step::AddCluster {
            c: 0,
            dc: 0,
            day: 1,
        },
        Step::AddClaim {
            k: 3,
            pool: 3,
            day: 1,
            ask: Ask::Address(3),
        },
        Step::DeleteClaim { k: 3, remove: true },
        Step::AddClaim {
            k: 3,
            pool: 3,
            day: 1,
            ask: Ask::Anything,
        },
    ];
    run(steps).expect("the claim gets 10.1.0.3 back");
}

/// A former holder with several quarantine entries gets the newest first, whatever order the
/// record lists them in: a claim its last address, a cluster its last addresses.
#[test]
fn quarantine_gives_back_the_newest_release_first() {
    let pools = pools();
    let holder = claim_holder("capi", "m3");
    let entry = |holder: &str, at: i64, range: &str| Quarantined {
        pool: "vrf".into(),
        datacenter: CLAIM_DC.into(),
        holder: holder.into(),
        released_at: at,
        addresses: vec![range.parse().expect("range")],
    };
    let claim = claim_input(
        &claim_object(3, "vrf", 1, None),
        "vrf",
        ClaimPool::Ready(&pools[3]),
        None,
        false,
        None,
    )
    .input
    .expect("served");
    let cluster = cluster_in("c0", CLAIM_DC, 2);
    let mut quarantined = vec![
        entry(&holder, T0, "10.1.0.0-10.1.0.0"),
        entry(&holder, T0 + 60, "10.1.0.3-10.1.0.3"),
        entry("c0", T0, "10.1.0.10-10.1.0.11"),
        entry("c0", T0 + 60, "10.1.0.20-10.1.0.21"),
    ];
    for _ in 0..2 {
        let plan = PlanInputs {
            pools: pools.clone(),
            clusters: vec![claim.clone(), cluster.clone()],
            quarantined: quarantined.clone(),
            now: T0 + 120,
            ..PlanInputs::default()
        }
        .plan();
        let held = |c: &str| {
            plan.decision(c, "vrf")
                .and_then(|d| d.held.as_ref())
                .map(|h| h.to_string())
        };
        assert_eq!(held(&holder).as_deref(), Some("10.1.0.3-10.1.0.3"));
        assert_eq!(held("c0").as_deref(), Some("10.1.0.20-10.1.0.21"));
        // What they did not take again stays theirs until its end.
        let left: Vec<(String, String)> = plan
            .quarantined
            .iter()
            .map(|q| (q.holder.clone(), q.addresses[0].to_string()))
            .collect();
        assert_eq!(
            left,
            vec![
                ("c0".to_string(), "10.1.0.10-10.1.0.11".to_string()),
                (holder.clone(), "10.1.0.0-10.1.0.0".to_string()),
            ]
        );
        quarantined.reverse();
    }
}
