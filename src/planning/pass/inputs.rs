//! Step 1: the planner's input from the caches, the ledger and the pool records.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use kube::{Api, ResourceExt};

use super::*;
use crate::planner::{ClusterInput, HeldElsewhere, PoolInput, Quarantined, StoredAllocation};
use crate::planning::records::RecordKey;
use crate::reservations;
use crate::resources::Reservation;
use crate::resources::{Cluster, IPAMPool, LABEL_DATACENTER, ReclaimPolicy};
use crate::seed::Context;
use crate::seed::ledger::Entry;
use crate::validation::{self, FieldError};

/// What the planner is given, and what the status writers report.
pub(super) struct Inputs {
    pub pool_inputs: Vec<PoolInput>,
    pub pool_errors: HashMap<String, Vec<FieldError>>,
    pub deleting_pools: HashMap<String, ReclaimPolicy>,
    pub cluster_inputs: Vec<ClusterInput>,
    pub cluster_errors: HashMap<String, Vec<FieldError>>,
    pub stored: Vec<StoredAllocation>,
    /// The quarantine the pool records keep.
    pub quarantined: Vec<Quarantined>,
    /// What the pools left out of the plan (invalid) hold, in their objects and records.
    pub held_elsewhere: Vec<HeldElsewhere>,
    /// Machines' claims (they are among `cluster_inputs` too).
    pub claims: super::claims::ClaimsRead,
    /// The record entries of hand-made `IPAddress`es that stay (`commit` keeps them).
    pub hand_made: HandMadeEntries,
    /// The adoption of user clusters that already run MetalLB (`spec.adopt`).
    pub adoption: crate::planner::adopt::AdoptionPlan,
}

/// Record entries of hand-made `IPAddress`es the webhook committed, by pool datacenter:
/// (entry, what it holds, the holder of the claim the object names, when it is known).
pub type HandMadeEntries = HashMap<RecordKey, Vec<(String, Reservation, Option<String>)>>;

/// How long after its admission a hand-made `IPAddress`'s entry is kept without its object
/// being seen: the webhook commits before the object is stored, and the watch may lag.
const HAND_MADE_GRACE: i64 = 60;
/// Seconds until a hand-made `IPAddress` that could not be confirmed gone is asked about again.
const HAND_MADE_RECHECK: i64 = 5;

/// A reading and the `resourceVersion` it was made at.
type Versioned<T> = (String, T);
/// An object read, or what is wrong with it.
type Read<T> = Result<T, Vec<FieldError>>;
/// One cluster's entry of a pool record, parsed.
type RecordEntry = (String, Result<crate::allocator::Allocation, String>);

/// What reading an object gave, kept by its `resourceVersion` so that an unchanged object is
/// not parsed again on every pass. (Allocations keep their reading in their ledger entry.)
#[derive(Debug, Default)]
pub struct ReadCache {
    records: HashMap<RecordKey, Versioned<Vec<RecordEntry>>>,
    clusters: HashMap<String, Versioned<Read<ClusterInput>>>,
    /// Record entries of hand-made `IPAddress`es whose object this replica has seen: one no
    /// longer seen was deleted, and its entry goes once a read confirms it.
    hand_made_seen: HashSet<String>,
    /// When the first entry kept only for its grace ([`HAND_MADE_GRACE`]) is to be looked at
    /// again (seconds since the Unix epoch): a pass comes by then.
    hand_made_due: Option<i64>,
}

impl ReadCache {
    /// When a pass should look again at a hand-made `IPAddress`'s entry kept for its grace.
    pub(super) fn hand_made_due(&self) -> Option<i64> {
        self.hand_made_due
    }

    fn cluster(&mut self, cluster: &Cluster) -> Result<ClusterInput, Vec<FieldError>> {
        let rv = cluster
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let name = cluster.name_any();
        if rv.is_empty() {
            return validation::cluster_input(cluster);
        }
        match self.clusters.get(&name) {
            Some((seen, read)) if *seen == rv => read.clone(),
            _ => {
                let read = validation::cluster_input(cluster);
                self.clusters.insert(name, (rv, read.clone()));
                read
            }
        }
    }

    /// Forgets records no longer present.
    fn retain(&mut self, records: &BTreeMap<RecordKey, String>) {
        self.records.retain(|k, _| records.contains_key(k));
    }

    /// Reads again the pool datacenters whose record changed since the last reading
    /// (`versions`, from [`Records::versions`](crate::seed::records::Records::versions));
    /// `joined` gives one's reservations by cluster.
    pub(super) fn refresh_records<I>(
        &mut self,
        versions: &BTreeMap<RecordKey, String>,
        joined: impl Fn(&RecordKey) -> I,
    ) where
        I: Iterator<Item = (String, Reservation)>,
    {
        for (key, version) in versions {
            let current = matches!(self.records.get(key), Some((seen, _)) if seen == version && !version.is_empty());
            if current {
                continue;
            }
            let read = joined(key)
                .map(|(cluster, entry)| {
                    let parsed = reservations::allocation_of(&entry);
                    (cluster, parsed)
                })
                .collect();
            self.records.insert(key.clone(), (version.clone(), read));
        }
    }

    fn retain_clusters(&mut self, clusters: &[Arc<Cluster>]) {
        if self.clusters.len() > clusters.len() {
            let present: HashSet<String> = clusters.iter().map(|c| c.name_any()).collect();
            self.clusters.retain(|k, _| present.contains(k));
        }
    }
}

/// The stored allocation an entry shows. A readable entry is parsed once (its reading
/// stays with it); an unreadable one is read again on every pass.
fn stored_of(obj: &Entry) -> Result<StoredAllocation, Vec<FieldError>> {
    let (held, reclaim_policy) = obj.reading(|| {
        validation::stored_allocation_of(&obj.parts()).map(|s| (s.held, s.reclaim_policy))
    })?;
    Ok(StoredAllocation {
        cluster: obj.cluster().unwrap_or_default().to_string(),
        pool: obj.name().to_string(),
        datacenter: obj.spec().dc.clone(),
        held: held.clone(),
        reclaim_policy: *reclaim_policy,
        unreadable: None,
    })
}

/// Builds the planner's input. `clusters` gains every cluster the cache lacks but the API
/// server still has.
pub(super) async fn gather(
    ctx: &Arc<Context>,
    pools: &[Arc<IPAMPool>],
    clusters: &mut Vec<Arc<Cluster>>,
    stored_objects: &[Arc<Entry>],
    records: &BTreeMap<RecordKey, String>,
    cache: &mut ReadCache,
) -> Result<Inputs, PassError> {
    cache.retain(records);
    cache.retain_clusters(clusters);
    // Inputs for the planner. An invalid pool is left out *together with its allocations*
    // (nothing is planned in it, so nothing is released); an invalid cluster keeps what it
    // holds and gets nothing new.
    let mut pool_inputs: Vec<PoolInput> = Vec::new();
    let mut pool_errors: HashMap<String, Vec<FieldError>> = HashMap::new();
    let mut frozen_pools: HashSet<String> = HashSet::new();
    let mut deleting_pools: HashMap<String, ReclaimPolicy> = HashMap::new();
    let records_held = ctx.records.lock().await;
    for pool in pools {
        let name = pool.name_any();
        if pool.metadata.deletion_timestamp.is_some() {
            deleting_pools.insert(name, pool.spec.reclaim_policy);
            continue;
        }
        match validation::pool_input(pool) {
            Ok(mut input) => {
                records_held.add_former(&mut input);
                pool_inputs.push(input)
            }
            Err(errors) => {
                frozen_pools.insert(name.clone());
                pool_errors.insert(name, errors);
            }
        }
    }

    drop(records_held);
    // A cluster that holds addresses but is missing from the cache is released only once the
    // API server confirms it is gone: a lagging cache must never free an address.
    let known: HashSet<String> = clusters.iter().map(|c| c.name_any()).collect();
    let mut holders: BTreeSet<String> = stored_objects
        .iter()
        .filter_map(|o| o.cluster())
        .map(str::to_string)
        .collect();
    // Machines' claims are looked up with the claims (`claims::inputs`).
    let is_claim = |name: &str| crate::resources::capi::claim_of_holder(name).is_some();
    for key in records.keys() {
        if let Some((_, entries)) = cache.records.get(key) {
            // Quarantine entries name a former holder, not a cluster to look up.
            holders.extend(
                entries
                    .iter()
                    .filter(|(key, _)| {
                        reservations::parse_quarantine_key(key).is_none()
                            && !is_claim(key)
                            && crate::resources::capi::hand_made_of_holder(key).is_none()
                    })
                    .map(|(cluster, _)| cluster.clone()),
            );
        }
    }
    // RBAC: src/rbac.rs (clusters get).
    let cluster_api: Api<Cluster> = Api::all(ctx.writer.clone());
    for name in holders.into_iter().filter(|n| !known.contains(n)) {
        match cluster_api.get_opt(&name).await {
            Ok(Some(c)) => {
                tracing::info!(cluster = %name, "cluster missing from the cache exists; keeping its allocations");
                clusters.push(Arc::new(c));
            }
            Ok(None) => {}
            Err(source) => {
                return Err(PassError::ConfirmCluster {
                    cluster: name,
                    source,
                });
            }
        }
    }

    let mut cluster_inputs: Vec<ClusterInput> = Vec::new();
    let mut cluster_errors: HashMap<String, Vec<FieldError>> = HashMap::new();
    for cluster in clusters.iter() {
        match cache.cluster(cluster) {
            Ok(input) => cluster_inputs.push(input),
            Err(errors) => {
                let why = errors
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; ");
                cluster_inputs.push(ClusterInput::invalid(
                    &cluster.name_any(),
                    cluster
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string()),
                    &cluster.spec.datacenter,
                    cluster.metadata.deletion_timestamp.is_some(),
                    why,
                ));
                cluster_errors.insert(cluster.name_any(), errors);
            }
        }
    }
    let mut stored: Vec<StoredAllocation> = Vec::with_capacity(stored_objects.len());
    // A pool's gateway is its network's: no other pool of the datacenter (one of its address
    // space whose CIDR covers it) hands it to a cluster.
    let mut held_elsewhere: Vec<HeldElsewhere> =
        validation::gateways(pools.iter().map(AsRef::as_ref));
    for obj in stored_objects {
        match stored_of(obj) {
            Ok(mut s) => {
                if frozen_pools.contains(&s.pool) {
                    // Left out of the plan, but nobody gets its addresses through another
                    // pool of the datacenter.
                    if let Some(held) = &s.held {
                        held_elsewhere.push(HeldElsewhere {
                            pool: s.pool.clone(),
                            datacenter: s.datacenter.clone(),
                            holder: s.cluster.clone(),
                            addresses: held.ranges().collect(),
                        });
                    }
                    continue;
                }
                if let Some(policy) = deleting_pools.get(&s.pool) {
                    s.reclaim_policy = Some(*policy);
                }
                stored.push(s);
            }
            Err(errors) => {
                let pool = obj.name().to_string();
                if frozen_pools.contains(&pool) {
                    continue;
                }
                let why = format!(
                    "IPAMAllocation {}/{} cannot be read: {}",
                    obj.namespace(),
                    pool,
                    errors
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("; ")
                );
                tracing::warn!(
                    cluster = obj.cluster().unwrap_or_default(),
                    pool = %pool,
                    "{why}; no new address is handed out in its pool until it is fixed or removed"
                );
                let cluster = obj.cluster().unwrap_or_default().to_string();
                let datacenter = obj
                    .label(LABEL_DATACENTER)
                    .filter(|dc| *dc == obj.spec().dc)
                    .unwrap_or_default()
                    .to_string();
                stored.push(StoredAllocation {
                    cluster,
                    pool,
                    datacenter,
                    held: None,
                    reclaim_policy: None,
                    unreadable: Some(why),
                });
            }
        }
    }
    let (addresses, shown, hand_made) = super::claims::stored_addresses(ctx, &pool_inputs);
    stored.extend(
        shown
            .into_iter()
            .filter(|s| !frozen_pools.contains(&s.pool)),
    );
    held_elsewhere.extend(merge_records(&mut stored, records, &frozen_pools, cache));
    let (claim_inputs, claims, hand_made) = super::claims::inputs(
        ctx,
        &pool_inputs,
        &pool_errors,
        &deleting_pools,
        clusters,
        &stored,
        addresses,
        hand_made,
    )
    .await?;
    held_elsewhere.extend(hand_made);
    cluster_inputs.extend(claim_inputs);
    // Machines' addresses in a pool being deleted stay theirs until their claims are deleted
    // (the pool waits for them): left out of the plan, so never released by it, and set aside
    // in every other pool of the datacenter while anything shows them.
    if !deleting_pools.is_empty() {
        stored.retain(|s| {
            let keep = !(deleting_pools.contains_key(&s.pool)
                && crate::resources::capi::claim_of_holder(&s.cluster).is_some());
            if !keep && let Some(held) = &s.held {
                held_elsewhere.push(HeldElsewhere {
                    pool: s.pool.clone(),
                    datacenter: s.datacenter.clone(),
                    holder: s.cluster.clone(),
                    addresses: held.ranges().collect(),
                });
            }
            keep
        });
    }
    held_elsewhere.extend(being_released(&pool_inputs, &cluster_inputs, &stored));
    let (hand_made_entries, aside) = hand_made_entries(ctx, records, &frozen_pools, cache).await;
    cache
        .hand_made_seen
        .retain(|e| hand_made_entries.values().flatten().any(|(k, ..)| k == e));
    held_elsewhere.extend(aside);
    let quarantined = quarantine_of_records(records, &frozen_pools, cache);
    for (pool, dc) in records.keys() {
        if !frozen_pools.contains(pool) {
            continue;
        }
        let Some((_, entries)) = cache.records.get(&(pool.clone(), dc.clone())) else {
            continue;
        };
        for (holder, recorded) in entries {
            if let Ok(held) = recorded {
                held_elsewhere.push(HeldElsewhere {
                    pool: pool.clone(),
                    datacenter: dc.clone(),
                    holder: holder.clone(),
                    addresses: held.ranges().collect(),
                });
            }
        }
    }
    // Adoption last: it sees every holder, and holds or overrides the clusters it concerns.
    let adoption = adoption_plan(ctx, pools, clusters, &pool_inputs, &stored);
    crate::planner::adopt::apply(&adoption, &mut cluster_inputs, &pool_inputs);
    held_elsewhere.extend(adoption.set_aside.iter().cloned());
    held_elsewhere.sort();
    Ok(Inputs {
        adoption,
        hand_made: hand_made_entries,
        claims,
        quarantined,
        held_elsewhere,
        pool_inputs,
        pool_errors,
        deleting_pools,
        cluster_inputs,
        cluster_errors,
        stored,
    })
}

/// The adoption plan of the clusters `spec.adopt` (theirs or their datacenter's) has discovery
/// read, from what the discovery reader found in their user clusters.
fn adoption_plan(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    clusters: &[Arc<Cluster>],
    pool_inputs: &[PoolInput],
    stored: &[StoredAllocation],
) -> crate::planner::adopt::AdoptionPlan {
    use crate::planner::adopt::{self, Candidate, Reading};
    use crate::seed::discovered::Discovery;
    let modes: Vec<(&Cluster, crate::resources::AdoptMode)> = clusters
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| {
            let mode = adopt::effective_mode(c, pools.iter().map(AsRef::as_ref));
            adopt::reads(mode).then_some((c.as_ref(), mode?))
        })
        .collect();
    if modes.is_empty() {
        return Default::default();
    }
    let seen = ctx.discovered.snapshot();
    let names: Vec<String> = modes.iter().map(|(c, _)| c.name_any()).collect();
    let candidates: Vec<Candidate<'_>> = modes
        .iter()
        .zip(&names)
        .map(|((c, mode), name)| Candidate {
            name,
            datacenter: &c.spec.datacenter,
            mode: *mode,
            reading: match seen.get(name) {
                _ if c.spec.kubeconfig.is_none() => {
                    Reading::Unreadable("the Cluster names no kubeconfig (spec.kubeconfig)")
                }
                None => Reading::NotYet,
                Some(Discovery::Unreadable { reason, .. }) => Reading::Unreadable(reason),
                Some(d) => d.complete().map_or(Reading::NotYet, Reading::Read),
            },
        })
        .collect();
    adopt::plan(pool_inputs, stored, &candidates)
}

/// What the objects this plan releases still show, in pool datacenters without a quarantine:
/// set aside for this plan in every pool of the datacenter. Every release the planner makes
/// for an explicit reason (`planner::settle`: a cluster deleted or gone, moved to another
/// datacenter, opted out, a claim asking another pool, a pool or datacenter removed) and what
/// a changed pin gives up (`planner::given_up_by_pin`) is deleted or rewritten by the pass
/// that plans it; were the addresses free in that same plan, a waiting holder's new object
/// could be written while the old one still shows them. Once no object shows them, the next
/// plan hands them out. (With `reuseAfter`, the quarantine keeps them from others already.)
///
/// Also what allocations kept by `reclaimPolicy: Retain` hold after their pool or datacenter
/// went: they stay holders until a person deletes them, so they are set aside in every pool of
/// the datacenter for as long as they exist.
fn being_released(
    pools: &[PoolInput],
    clusters: &[ClusterInput],
    stored: &[StoredAllocation],
) -> Vec<HeldElsewhere> {
    let clusters: HashMap<&str, &ClusterInput> =
        clusters.iter().map(|c| (c.name.as_str(), c)).collect();
    let pools: HashMap<&str, &PoolInput> = pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let quarantined = |pool: &str, dc: &str| {
        pools
            .get(pool)
            .and_then(|p| p.datacenters.get(dc))
            .is_some_and(|d| d.reuse_after > 0)
    };
    let mut out = Vec::new();
    for s in stored {
        let Some(held) = &s.held else {
            continue;
        };
        if quarantined(&s.pool, &s.datacenter) {
            continue;
        }
        let cluster = clusters.get(s.cluster.as_str()).copied();
        let pool = pools.get(s.pool.as_str()).copied();
        let (why, addresses) = match planner::settle(s, cluster, pool) {
            Some(planner::Settle::Release(_)) => ("being released", held.ranges().collect()),
            // Kept for a pool (or datacenter) that is gone: still a holder, which no pool
            // of the datacenter plans any more, so every pool of it keeps clear of it.
            Some(planner::Settle::Retain(_)) => {
                ("kept by reclaimPolicy Retain", held.ranges().collect())
            }
            None => match cluster {
                Some(c) => ("given up by a pin", planner::given_up_by_pin(s, c)),
                None => continue,
            },
        };
        if addresses.is_empty() {
            continue;
        }
        out.push(HeldElsewhere {
            // Not a pool name: set aside in this pool too.
            pool: format!("{} ({why} by {})", s.pool, s.cluster),
            datacenter: s.datacenter.clone(),
            holder: s.cluster.clone(),
            addresses,
        });
    }
    out
}

/// Adds what the pool records hold to the stored allocations: an entry whose object was never
/// written (a crash between the record and the object) is held like a stored allocation, and
/// an entry holding more than its object (a crash before the object grew) keeps the extra
/// addresses. Entries of another datacenter than the object's are stale and left to trimming.
/// A subnet's entry holding more than its object's subnet keeps the object's, and the rest is
/// returned to be set aside while the commit trims it ([`reservations::merge_recorded`]).
pub(super) fn merge_records(
    stored: &mut Vec<StoredAllocation>,
    records: &BTreeMap<RecordKey, String>,
    frozen_pools: &HashSet<String>,
    cache: &ReadCache,
) -> Vec<HeldElsewhere> {
    let mut aside = Vec::new();
    // The stored allocations are found by binary search (by cluster, then pool: the order
    // the ledger gives them in already), without a second index of every allocation; the
    // few that records add are indexed on their own.
    // Sorting allocates a scratch buffer the size of half the list (8 MB at 100,000
    // allocations, at the moment a pass holds the most): skipped when the order is right.
    if !stored.is_sorted_by(|a, b| (&a.cluster, &a.pool) <= (&b.cluster, &b.pool)) {
        stored.sort_by(|a, b| (&a.cluster, &a.pool).cmp(&(&b.cluster, &b.pool)));
    }
    let from_objects = stored.len();
    let mut added: HashMap<(String, String), usize> = HashMap::new();
    for (pool, dc) in records.keys() {
        if frozen_pools.contains(pool) {
            continue;
        }
        let Some((_, entries)) = cache.records.get(&(pool.clone(), dc.clone())) else {
            continue;
        };
        for (cluster, recorded) in entries {
            if reservations::parse_quarantine_key(cluster).is_some() {
                continue; // quarantine: see `quarantine_of_records`
            }
            if crate::resources::capi::hand_made_of_holder(cluster).is_some() {
                continue; // a hand-made `IPAddress`: see `hand_made_entries`
            }
            let recorded = match recorded.clone() {
                Ok(a) => a,
                Err(why) => {
                    tracing::warn!(pool = %pool, datacenter = %dc, cluster = %cluster, "unreadable pool record entry ignored: {why}");
                    continue;
                }
            };
            let found = stored[..from_objects]
                .binary_search_by(|s| (s.cluster.as_str(), s.pool.as_str()).cmp(&(cluster, pool)))
                .ok()
                .filter(|&i| stored[i].unreadable.is_none())
                .or_else(|| added.get(&(cluster.clone(), pool.clone())).copied());
            match found {
                Some(i) if stored[i].datacenter == *dc => {
                    let s = &mut stored[i];
                    s.held = Some(match &s.held {
                        Some(h) if *h == recorded => recorded,
                        Some(h) => {
                            let (held, beyond) = reservations::merge_recorded(h, &recorded);
                            if !beyond.is_empty() {
                                aside.push(HeldElsewhere {
                                    // Not a pool name: set aside in its own pool too.
                                    pool: format!("{pool} (recorded for {cluster})"),
                                    datacenter: dc.clone(),
                                    holder: cluster.clone(),
                                    addresses: beyond,
                                });
                            }
                            held
                        }
                        None => recorded,
                    });
                }
                Some(_) => {}
                None => {
                    added.insert((cluster.clone(), pool.clone()), stored.len());
                    stored.push(StoredAllocation {
                        cluster: cluster.clone(),
                        pool: pool.clone(),
                        datacenter: dc.clone(),
                        held: Some(recorded),
                        reclaim_policy: None,
                        unreadable: None,
                    });
                }
            }
        }
    }
    aside
}

/// The quarantine entries of the pool records (`reservations::QUARANTINE_PREFIX`). An entry
/// whose key does not read keeps its addresses quarantined from now on; one whose addresses do
/// not read is left out (and trimmed by the next commit), like an unreadable cluster entry.
pub(super) fn quarantine_of_records(
    records: &BTreeMap<RecordKey, String>,
    frozen_pools: &HashSet<String>,
    cache: &ReadCache,
) -> Vec<Quarantined> {
    let now = unix_now();
    let mut out = Vec::new();
    for (pool, dc) in records.keys() {
        if frozen_pools.contains(pool) {
            continue;
        }
        let Some((_, entries)) = cache.records.get(&(pool.clone(), dc.clone())) else {
            continue;
        };
        for (key, recorded) in entries {
            let Some(parsed) = reservations::parse_quarantine_key(key) else {
                continue;
            };
            let Ok(held) = recorded else {
                tracing::warn!(pool = %pool, datacenter = %dc, entry = %key, "unreadable quarantine entry ignored");
                continue;
            };
            let (holder, released_at) = match parsed {
                Ok((holder, at)) => (holder.to_string(), at),
                Err(why) => {
                    tracing::warn!(pool = %pool, datacenter = %dc, "{why}; quarantined from now on");
                    let holder = key
                        .strip_prefix(reservations::QUARANTINE_PREFIX)
                        .unwrap_or(key)
                        .split('@')
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    (holder, now)
                }
            };
            out.push(Quarantined {
                pool: pool.clone(),
                datacenter: dc.clone(),
                holder,
                released_at,
                addresses: held.ranges().collect(),
            });
        }
    }
    out
}

/// The record entries of hand-made `IPAddress`es (written by the webhook as it admitted them)
/// that stay, and what is set aside for them. An entry stays while its object exists as a
/// hand-made one (the object is then set aside by `claims::stored_addresses`, in a way its
/// claim's adoption lifts); while its object is not seen, it stays for [`HAND_MADE_GRACE`]
/// after its admission, and after that until a read of the API server confirms the object
/// gone — set aside meanwhile in every pool of the datacenter, its own included. One whose
/// object kipam has adopted goes: the claim's own entry holds the address now.
async fn hand_made_entries(
    ctx: &Context,
    records: &BTreeMap<RecordKey, String>,
    frozen_pools: &HashSet<String>,
    cache: &mut ReadCache,
) -> (HandMadeEntries, Vec<HeldElsewhere>) {
    use kube::runtime::reflector::ObjectRef;
    let now = unix_now();
    let listed = ctx
        .capi
        .addresses_listed
        .load(std::sync::atomic::Ordering::Acquire);
    let mut kept: HandMadeEntries = HashMap::new();
    let mut aside = Vec::new();
    let mut seen_now = Vec::new();
    let mut due_at = None;
    for key in records.keys() {
        let Some((_, entries)) = cache.records.get(key) else {
            continue;
        };
        for (entry, recorded) in entries {
            let Some((namespace, name, admitted)) =
                crate::resources::capi::hand_made_of_holder(entry)
            else {
                continue;
            };
            // Unreadable (edited by hand): ignored, as a cluster's unreadable entry is.
            let Ok(h) = recorded else { continue };
            let held = Some(h);
            let reservation = reservations::reservation_of(h);
            let found = ctx
                .capi
                .addresses
                .get(&ObjectRef::new(name).within(namespace));
            let seen = cache.hand_made_seen.contains(entry);
            let stays = match &found {
                Some(a) if a.written_by_kipam() => false,
                Some(_) => true,
                None if !listed => true,
                // Not seen yet: maybe not stored yet (the webhook commits before the API server
                // stores the object), or not yet in the cache.
                None if !seen && admitted.is_some_and(|at| now - at < HAND_MADE_GRACE) => {
                    let due = admitted.unwrap_or(now) + HAND_MADE_GRACE;
                    due_at = Some(due_at.map_or(due, |d: i64| d.min(due)));
                    true
                }
                None => {
                    let api: Api<crate::resources::capi::IPAddress> =
                        Api::namespaced(ctx.writer.clone(), namespace);
                    match api.get_opt(name).await {
                        Ok(None) => {
                            tracing::info!(pool = %key.0, datacenter = %key.1, entry = %entry, "hand-made IPAddress gone; its record entry is released");
                            false
                        }
                        Ok(Some(_)) => true,
                        Err(e) => {
                            tracing::warn!(pool = %key.0, datacenter = %key.1, entry = %entry, error = %crate::seed::preconditions::short(&e), "cannot confirm a hand-made IPAddress gone; its address stays held");
                            // Asked again by a pass of its own: no other change may come.
                            let again = now + HAND_MADE_RECHECK;
                            due_at = Some(due_at.map_or(again, |d: i64| d.min(again)));
                            true
                        }
                    }
                }
            };
            if !stays {
                continue;
            }
            if found.is_some() {
                seen_now.push(entry.clone());
            }
            let claim = found
                .as_ref()
                .map(|a| crate::resources::capi::claim_holder(namespace, &a.spec.claim_ref.name));
            if found.is_none()
                && !frozen_pools.contains(&key.0)
                && let Some(h) = held
            {
                aside.push(HeldElsewhere {
                    // Not a pool name: set aside in its own pool too.
                    pool: format!("{} (IPAddress {namespace}/{name})", key.0),
                    datacenter: key.1.clone(),
                    holder: format!("{namespace}/{name}"),
                    addresses: h.ranges().collect(),
                });
            }
            kept.entry(key.clone())
                .or_default()
                .push((entry.clone(), reservation, claim));
        }
    }
    cache.hand_made_seen.extend(seen_now);
    cache.hand_made_due = due_at;
    (kept, aside)
}

/// The wall clock, in seconds since the Unix epoch: the planner's `now`.
pub(super) fn unix_now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}
