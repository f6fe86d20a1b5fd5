//! Step 1: the planner's input from the caches, the ledger and the pool records.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use kube::{Api, ResourceExt};

use super::*;
use crate::controller::Context;
use crate::controller::ledger::Entry;
use crate::controller::records::RecordKey;
use crate::planner::{ClusterInput, PoolInput, StoredAllocation};
use crate::reservations;
use crate::resources::{
    ANNOTATION_RECLAIM_POLICY, Cluster, IPAMPool, IPAMPoolRecord, LABEL_DATACENTER, ReclaimPolicy,
    cluster_of_namespace,
};
use crate::validation::{self, FieldError};

/// What the planner is given, and what the status writers report.
pub(super) struct Inputs {
    pub pool_inputs: Vec<PoolInput>,
    pub pool_errors: HashMap<String, Vec<FieldError>>,
    pub deleting_pools: HashMap<String, ReclaimPolicy>,
    pub cluster_inputs: Vec<ClusterInput>,
    pub cluster_errors: HashMap<String, Vec<FieldError>>,
    pub stored: Vec<StoredAllocation>,
}

/// A reading and the `resourceVersion` it was made at.
type Versioned<T> = (String, T);
/// An object read, or what is wrong with it.
type Read<T> = Result<T, Vec<FieldError>>;
/// One cluster's entry of a pool record, parsed.
type RecordEntry = (String, Result<crate::allocator::Allocation, String>);

/// What reading an object gave, kept by its `resourceVersion` so that an unchanged object is
/// not parsed again on every pass.
#[derive(Debug, Default)]
pub struct ReadCache {
    /// Readable allocations by `resourceVersion`, as a number (an etcd revision; an object
    /// whose version is not one is read again on every pass). No key is kept beside a reading:
    /// it names its own object (the cluster of its namespace and the pool of its name), and
    /// that is checked before it is used. Unreadable ones are read again on every pass.
    allocations: HashMap<u64, StoredAllocation>,
    records: HashMap<RecordKey, Versioned<Vec<RecordEntry>>>,
    clusters: HashMap<String, Versioned<Read<ClusterInput>>>,
}

impl ReadCache {
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

    fn allocation(&mut self, obj: &Entry) -> Result<StoredAllocation, Vec<FieldError>> {
        let parts = validation::AllocationParts {
            namespace: obj.namespace(),
            name: obj.name(),
            spec: obj.spec(),
            status: obj.status(),
            reclaim_policy: obj.annotation(ANNOTATION_RECLAIM_POLICY),
        };
        let Some(rv) = obj.version() else {
            return validation::stored_allocation_of(&parts);
        };
        let namespace = obj.namespace();
        let name = obj.name();
        if let Some(read) = self.allocations.get(&rv)
            && read.pool == name
            && cluster_of_namespace(namespace) == Some(read.cluster.as_str())
        {
            return Ok(read.clone());
        }
        let read = validation::stored_allocation_of(&parts);
        if let Ok(stored) = &read {
            self.allocations.insert(rv, stored.clone());
        }
        read
    }

    /// Forgets objects no longer present.
    fn retain(&mut self, objects: &[Arc<Entry>], records: &BTreeMap<RecordKey, IPAMPoolRecord>) {
        // Every write gives an object a new version: drop the readings of versions gone.
        if self.allocations.len() > objects.len() {
            let present: HashSet<u64> = objects.iter().filter_map(|o| o.version()).collect();
            self.allocations.retain(|rv, _| present.contains(rv));
        }
        self.records.retain(|k, _| records.contains_key(k));
    }

    fn retain_clusters(&mut self, clusters: &[Arc<Cluster>]) {
        if self.clusters.len() > clusters.len() {
            let present: HashSet<String> = clusters.iter().map(|c| c.name_any()).collect();
            self.clusters.retain(|k, _| present.contains(k));
        }
    }
}

/// Builds the planner's input. `clusters` gains every cluster the cache lacks but the API
/// server still has.
pub(super) async fn gather(
    ctx: &Arc<Context>,
    pools: &[Arc<IPAMPool>],
    clusters: &mut Vec<Arc<Cluster>>,
    stored_objects: &[Arc<Entry>],
    records: &BTreeMap<RecordKey, IPAMPoolRecord>,
    cache: &mut ReadCache,
) -> Result<Inputs, PassError> {
    cache.retain(stored_objects, records);
    cache.retain_clusters(clusters);
    // Inputs for the planner. An invalid pool is left out *together with its allocations*
    // (nothing is planned in it, so nothing is released); an invalid cluster keeps what it
    // holds and gets nothing new.
    let mut pool_inputs: Vec<PoolInput> = Vec::new();
    let mut pool_errors: HashMap<String, Vec<FieldError>> = HashMap::new();
    let mut frozen_pools: HashSet<String> = HashSet::new();
    let mut deleting_pools: HashMap<String, ReclaimPolicy> = HashMap::new();
    for pool in pools {
        let name = pool.name_any();
        if pool.metadata.deletion_timestamp.is_some() {
            deleting_pools.insert(name, pool.spec.reclaim_policy);
            continue;
        }
        match validation::pool_input(pool) {
            Ok(input) => pool_inputs.push(input),
            Err(errors) => {
                frozen_pools.insert(name.clone());
                pool_errors.insert(name, errors);
            }
        }
    }

    // A cluster that holds addresses but is missing from the cache is released only once the
    // API server confirms it is gone: a lagging cache must never free an address.
    let known: HashSet<String> = clusters.iter().map(|c| c.name_any()).collect();
    let mut holders: BTreeSet<String> = stored_objects
        .iter()
        .filter_map(|o| o.cluster())
        .map(str::to_string)
        .collect();
    for r in records.values() {
        holders.extend(r.spec.reservations.keys().cloned());
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
    let mut stored: Vec<StoredAllocation> = Vec::new();
    for obj in stored_objects {
        match cache.allocation(obj) {
            Ok(mut s) => {
                if frozen_pools.contains(&s.pool) {
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
    merge_records(&mut stored, records, &frozen_pools, cache);
    Ok(Inputs {
        pool_inputs,
        pool_errors,
        deleting_pools,
        cluster_inputs,
        cluster_errors,
        stored,
    })
}

/// Adds what the pool records hold to the stored allocations: an entry whose object was never
/// written (a crash between the record and the object) is held like a stored allocation, and
/// an entry holding more than its object (a crash before the object grew) keeps the extra
/// addresses. Entries of another datacenter than the object's are stale and left to trimming.
pub(super) fn merge_records(
    stored: &mut Vec<StoredAllocation>,
    records: &BTreeMap<RecordKey, IPAMPoolRecord>,
    frozen_pools: &HashSet<String>,
    cache: &mut ReadCache,
) {
    let mut index: HashMap<(String, String), usize> = stored
        .iter()
        .enumerate()
        .filter(|(_, s)| s.unreadable.is_none())
        .map(|(i, s)| ((s.cluster.clone(), s.pool.clone()), i))
        .collect();
    for ((pool, dc), record) in records {
        if frozen_pools.contains(pool) {
            continue;
        }
        let rv = record.metadata.resource_version.clone().unwrap_or_default();
        let fresh = !matches!(cache.records.get(&(pool.clone(), dc.clone())), Some((seen, _)) if *seen == rv && !rv.is_empty());
        if fresh {
            let read = record
                .spec
                .reservations
                .iter()
                .map(|(cluster, entry)| (cluster.clone(), reservations::allocation_of(entry)))
                .collect();
            cache.records.insert((pool.clone(), dc.clone()), (rv, read));
        }
        let Some((_, entries)) = cache.records.get(&(pool.clone(), dc.clone())) else {
            continue;
        };
        for (cluster, recorded) in entries {
            let recorded = match recorded.clone() {
                Ok(a) => a,
                Err(why) => {
                    tracing::warn!(pool = %pool, datacenter = %dc, cluster = %cluster, "unreadable pool record entry ignored: {why}");
                    continue;
                }
            };
            match index.get(&(cluster.clone(), pool.clone())) {
                Some(&i) if stored[i].datacenter == *dc => {
                    let s = &mut stored[i];
                    s.held = Some(match &s.held {
                        Some(h) if *h == recorded => recorded,
                        Some(h) => reservations::with_recorded(h, &recorded),
                        None => recorded,
                    });
                }
                Some(_) => {}
                None => {
                    index.insert((cluster.clone(), pool.clone()), stored.len());
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
}
