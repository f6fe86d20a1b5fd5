//! One planning pass: read the caches, plan, write the differences (leader only).
//!
//! Every pass plans the whole seed at once from in-memory state — pools and clusters from the
//! watch caches, allocations from the [`Ledger`](super::ledger::Ledger) — so creating 1,000 clusters costs a few
//! passes, not a re-list per cluster. Writes are issued only where the desired object differs
//! from the stored one: a new allocation is one create plus one status update.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::Context;
use super::ledger::Key;
use crate::desired::allocation_object;
use crate::planner::{self, Change, ClusterInput, Decision, PoolInput, StoredAllocation};
use crate::resources::{
    ANNOTATION_RECLAIM_POLICY, Cluster, ClusterStatus, IPAMAllocation, IPAMPool, LABEL_CLUSTER,
    ReclaimPolicy, cluster_namespace,
};
use crate::status::{self, Overlap};
use crate::validation::{self, FieldError};

/// Finalizer on clusters: their allocations are released before they go.
pub const CLUSTER_FINALIZER: &str = "ipam.kipam.dev/release-allocations";
/// Finalizer on pools: their allocations are deleted or retained before they go.
pub const POOL_FINALIZER: &str = "ipam.kipam.dev/reclaim-allocations";

/// How many writes run at once.
const PARALLEL_WRITES: usize = 16;

/// What a pass asks of the loop.
#[derive(Debug, Default)]
pub struct PassOutcome {
    /// Something was stale or failed: run again soon.
    pub again: bool,
    pub writes: u64,
}

/// A write failed because our view was stale: re-read and plan again.
fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Runs one pass. The caller checked leadership just before.
pub async fn run(ctx: &Arc<Context>) -> Result<PassOutcome, kube::Error> {
    let mut outcome = PassOutcome::default();
    let pools: Vec<Arc<IPAMPool>> = ctx.pools.state();
    let clusters: Vec<Arc<Cluster>> = ctx.clusters.state();
    let namespaces: HashSet<String> = ctx
        .namespaces
        .state()
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .map(|n| n.name_any())
        .collect();
    let stored_objects = ctx.ledger.lock().await.snapshot();
    let now = crate::resources::now_rfc3339();

    add_finalizers(ctx, &pools, &clusters, &mut outcome).await;

    // Inputs for the planner. An invalid pool is left out *together with its allocations*
    // (nothing of it is planned, so nothing is handed out or released); an invalid cluster is
    // frozen (below). Either way a bad edit never releases or re-uses anything.
    let mut pool_inputs: Vec<PoolInput> = Vec::new();
    let mut pool_errors: HashMap<String, Vec<FieldError>> = HashMap::new();
    let mut frozen_pools: HashSet<String> = HashSet::new();
    let mut deleting_pools: HashMap<String, ReclaimPolicy> = HashMap::new();
    for pool in &pools {
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
    let mut cluster_inputs: Vec<ClusterInput> = Vec::new();
    let mut cluster_errors: HashMap<String, Vec<FieldError>> = HashMap::new();
    for cluster in &clusters {
        match validation::cluster_input(cluster) {
            Ok(input) => cluster_inputs.push(input),
            Err(errors) => {
                // An invalid cluster is frozen, not forgotten: it keeps what it holds and its
                // addresses stay reserved (the planner must see them, or it would hand them to
                // another cluster); it gets nothing new and nothing of it is written.
                cluster_inputs.push(ClusterInput {
                    name: cluster.name_any(),
                    created: cluster
                        .metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| t.0.to_string()),
                    datacenter: cluster.spec.datacenter.clone(),
                    overrides: BTreeMap::new(),
                    deleting: false,
                    paused: true,
                });
                cluster_errors.insert(cluster.name_any(), errors);
            }
        }
    }
    let mut stored: Vec<StoredAllocation> = Vec::new();
    for obj in &stored_objects {
        match validation::stored_allocation(obj) {
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
                tracing::warn!(
                    errors = ?errors.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
                    "an IPAMAllocation cannot be read; it is left alone"
                );
            }
        }
    }

    let plan = planner::plan(&pool_inputs, &cluster_inputs, &stored);

    // Namespaces first: allocations live in them.
    ensure_namespaces(ctx, &clusters, &namespaces, &mut outcome).await;

    let policies: HashMap<&str, ReclaimPolicy> = pool_inputs
        .iter()
        .map(|p| (p.name.as_str(), p.reclaim_policy))
        .chain(deleting_pools.iter().map(|(k, v)| (k.as_str(), *v)))
        .collect();
    let by_key: HashMap<Key, &IPAMAllocation> = stored_objects
        .iter()
        .map(|o| ((o.namespace().unwrap_or_default(), o.name_any()), o))
        .collect();
    let uids: HashMap<String, &Cluster> = clusters
        .iter()
        .map(|c| (c.name_any(), c.as_ref()))
        .collect();

    // Allocation writes, in parallel; each result goes into the ledger at once.
    let mut jobs = Vec::new();
    for d in &plan.decisions {
        if cluster_errors.contains_key(&d.cluster) {
            continue; // frozen: what it holds is only reserved
        }
        let key = (cluster_namespace(&d.cluster), d.pool.clone());
        let existing = by_key.get(&key).copied();
        let desired = allocation_object(d, existing, policies.get(d.pool.as_str()).copied(), &now);
        if let Some(job) = AllocationWrite::new(d, existing, desired) {
            jobs.push(job);
        }
    }
    let results: Vec<(AllocationWrite, Result<WriteDone, kube::Error>)> =
        futures::stream::iter(jobs)
            .map(|job| async move {
                let r = job.execute(ctx).await;
                (job, r)
            })
            .buffer_unordered(PARALLEL_WRITES)
            .collect()
            .await;
    for (job, result) in results {
        match result {
            Ok(done) => {
                outcome.writes += done.writes;
                publish_allocation_event(ctx, &job, uids.get(&job.decision.cluster).copied()).await;
            }
            Err(e) if is_conflict(&e) || is_not_found(&e) => {
                tracing::info!(key = ?job.key, error = %e, "stale view of an allocation; re-reading");
                refresh(ctx, &job.key).await;
                outcome.again = true;
            }
            Err(e) => {
                tracing::warn!(key = ?job.key, error = %e, "allocation write failed");
                outcome.again = true;
            }
        }
    }

    release_finalizers(ctx, &pools, &clusters, &mut outcome).await;
    write_cluster_status(
        ctx,
        &clusters,
        &plan.decisions,
        &cluster_errors,
        &now,
        &mut outcome,
    )
    .await;
    write_pool_status(
        ctx,
        &pools,
        &pool_inputs,
        &pool_errors,
        &plan,
        &now,
        &mut outcome,
    )
    .await;
    Ok(outcome)
}

/// Re-reads one allocation into the ledger after a conflict.
async fn refresh(ctx: &Context, key: &Key) {
    let api: Api<IPAMAllocation> = Api::namespaced(ctx.client.clone(), &key.0);
    match api.get_opt(&key.1).await {
        Ok(Some(obj)) => ctx.ledger.lock().await.apply(obj),
        Ok(None) => ctx.ledger.lock().await.forget(key),
        Err(e) => tracing::warn!(error = %e, "re-read failed"),
    }
}

/// One allocation to create, update or delete.
struct AllocationWrite {
    key: Key,
    decision: Decision,
    existing: Option<IPAMAllocation>,
    desired: Option<IPAMAllocation>,
    /// The previous status message, to emit failure events only on change.
    previous_message: Option<String>,
}

struct WriteDone {
    writes: u64,
}

impl AllocationWrite {
    fn new(
        decision: &Decision,
        existing: Option<&IPAMAllocation>,
        desired: Option<IPAMAllocation>,
    ) -> Option<Self> {
        let same = match (existing, &desired) {
            (None, None) => true,
            (Some(e), Some(d)) => {
                e.spec == d.spec
                    && e.metadata.labels == d.metadata.labels
                    && e.metadata.annotations == d.metadata.annotations
                    && e.status == d.status
            }
            _ => false,
        };
        if same {
            return None;
        }
        Some(AllocationWrite {
            key: (cluster_namespace(&decision.cluster), decision.pool.clone()),
            decision: decision.clone(),
            existing: existing.cloned(),
            previous_message: existing
                .and_then(|e| e.status.as_ref())
                .and_then(|s| s.message.clone()),
            desired,
        })
    }

    async fn execute(&self, ctx: &Context) -> Result<WriteDone, kube::Error> {
        if !ctx.leader.holds() {
            // Fencing: a replica that cannot show a recent renewal writes nothing.
            return Err(kube::Error::Service(
                std::io::Error::other("leader lease not renewed within the deadline").into(),
            ));
        }
        let api: Api<IPAMAllocation> = Api::namespaced(ctx.client.clone(), &self.key.0);
        let pp = PostParams {
            field_manager: Some("kipam".into()),
            ..Default::default()
        };
        let mut writes = 0;
        match (&self.existing, &self.desired) {
            (Some(existing), None) => {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: existing.resource_version(),
                        uid: existing.uid(),
                    }),
                    ..Default::default()
                };
                ctx.metrics.wrote("delete", "ipamallocations");
                match api.delete(&self.key.1, &dp).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e),
                }
                // The delete response may still carry the object (finalizers); the version
                // it had is enough for the tombstone.
                ctx.ledger.lock().await.remove(existing);
                writes += 1;
            }
            (None, Some(desired)) => {
                let mut create = desired.clone();
                create.status = None;
                ctx.metrics.wrote("create", "ipamallocations");
                let created = api.create(&pp, &create).await?;
                writes += 1;
                ctx.ledger.lock().await.apply(created.clone());
                let mut with_status = created;
                with_status.status = desired.status.clone();
                ctx.metrics.wrote("update", "ipamallocations/status");
                let updated = api.replace_status(&self.key.1, &pp, &with_status).await?;
                writes += 1;
                ctx.ledger.lock().await.apply(updated);
            }
            (Some(existing), Some(desired)) => {
                let mut current = existing.clone();
                let main_changed = existing.spec != desired.spec
                    || existing.metadata.labels != desired.metadata.labels
                    || existing.metadata.annotations != desired.metadata.annotations;
                if main_changed {
                    let mut update = desired.clone();
                    update.metadata.resource_version = existing.resource_version();
                    ctx.metrics.wrote("update", "ipamallocations");
                    current = api.replace(&self.key.1, &pp, &update).await?;
                    writes += 1;
                    ctx.ledger.lock().await.apply(current.clone());
                }
                if current.status != desired.status {
                    let mut with_status = current.clone();
                    with_status.status = desired.status.clone();
                    ctx.metrics.wrote("update", "ipamallocations/status");
                    let updated = api.replace_status(&self.key.1, &pp, &with_status).await?;
                    writes += 1;
                    ctx.ledger.lock().await.apply(updated);
                }
            }
            (None, None) => {}
        }
        Ok(WriteDone { writes })
    }
}

fn cluster_reference(cluster: &Cluster) -> ObjectReference {
    cluster.object_ref(&())
}

async fn publish(
    ctx: &Context,
    reference: &ObjectReference,
    warning: bool,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: "Allocate".into(),
        secondary: None,
    };
    ctx.metrics.wrote("create", "events");
    if let Err(e) = ctx.recorder.publish(&event, reference).await {
        tracing::debug!(error = %e, "event not published");
    }
}

async fn publish_allocation_event(ctx: &Context, job: &AllocationWrite, cluster: Option<&Cluster>) {
    let d = &job.decision;
    let Some(cluster) = cluster else { return };
    let reference = cluster_reference(cluster);
    let held = d.held.as_ref().map(|h| h.to_string()).unwrap_or_default();
    match d.change {
        Change::Create | Change::Grow | Change::Replace => {
            ctx.metrics.allocations_created.inc();
            let reason = match d.change {
                Change::Create => "Allocated",
                Change::Grow => "AllocationGrown",
                _ => "AllocationRepinned",
            };
            publish(
                ctx,
                &reference,
                false,
                reason,
                format!("pool {} ({}): {held}", d.pool, d.datacenter),
            )
            .await;
        }
        Change::Release if job.existing.is_some() => {
            ctx.metrics.allocations_released.inc();
            let previous = d
                .previous
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_default();
            publish(
                ctx,
                &reference,
                false,
                "Released",
                format!("pool {}: {previous} released: {}", d.pool, d.message),
            )
            .await;
        }
        Change::Fail if job.previous_message.as_deref() != Some(d.message.as_str()) => {
            ctx.metrics.allocation_failures.inc();
            let (_, reason, _) = status::cluster_ipam_condition(&[d]);
            publish(
                ctx,
                &reference,
                true,
                &reason,
                format!("pool {}: {}", d.pool, d.message),
            )
            .await;
        }
        _ => {}
    }
}

/// Adds our finalizers to clusters and pools that lack them.
async fn add_finalizers(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    clusters: &[Arc<Cluster>],
    outcome: &mut PassOutcome,
) {
    let cluster_api: Api<Cluster> = Api::all(ctx.client.clone());
    let pool_api: Api<IPAMPool> = Api::all(ctx.client.clone());
    let mut jobs = Vec::new();
    for c in clusters {
        if c.metadata.deletion_timestamp.is_none()
            && !c.finalizers().iter().any(|f| f == CLUSTER_FINALIZER)
        {
            jobs.push(patch_finalizers(
                &cluster_api,
                c.as_ref(),
                CLUSTER_FINALIZER,
                true,
                ctx,
            ));
        }
    }
    let mut pool_jobs = Vec::new();
    for p in pools {
        if p.metadata.deletion_timestamp.is_none()
            && !p.finalizers().iter().any(|f| f == POOL_FINALIZER)
        {
            pool_jobs.push(patch_finalizers(
                &pool_api,
                p.as_ref(),
                POOL_FINALIZER,
                true,
                ctx,
            ));
        }
    }
    let results: Vec<Result<(), kube::Error>> = futures::stream::iter(jobs)
        .buffer_unordered(PARALLEL_WRITES)
        .chain(futures::stream::iter(pool_jobs).buffer_unordered(PARALLEL_WRITES))
        .collect()
        .await;
    for r in results {
        match r {
            Ok(()) => outcome.writes += 1,
            Err(e) => {
                tracing::debug!(error = %e, "finalizer patch failed");
                outcome.again = true;
            }
        }
    }
}

/// Adds or removes one finalizer. The patch carries the `resourceVersion` it was computed
/// from, so a concurrent change to the object fails (409) instead of being overwritten.
async fn patch_finalizers<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    add: bool,
    ctx: &Context,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut next: Vec<String> = obj
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    if add {
        next.push(finalizer.to_string());
    }
    let patch = json!({
        "metadata": {
            "finalizers": next,
            "resourceVersion": obj.resource_version(),
        }
    });
    ctx.metrics.wrote("patch", "finalizers");
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
}

/// Removes our finalizers once the object's allocations are handled.
async fn release_finalizers(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    clusters: &[Arc<Cluster>],
    outcome: &mut PassOutcome,
) {
    let ledger = ctx.ledger.lock().await;
    let mut cluster_done = Vec::new();
    for c in clusters {
        if c.metadata.deletion_timestamp.is_some()
            && c.finalizers().iter().any(|f| f == CLUSTER_FINALIZER)
            && !ledger.has_namespace(&cluster_namespace(&c.name_any()))
        {
            cluster_done.push(c.clone());
        }
    }
    let mut pool_done = Vec::new();
    for p in pools {
        if p.metadata.deletion_timestamp.is_none()
            || !p.finalizers().iter().any(|f| f == POOL_FINALIZER)
        {
            continue;
        }
        let name = p.name_any();
        let pending = ledger.of_pool(&name).any(|a| {
            let retained = a
                .metadata
                .annotations
                .as_ref()
                .and_then(|m| m.get(ANNOTATION_RECLAIM_POLICY))
                .is_some_and(|v| v == "Retain");
            !(retained && p.spec.reclaim_policy == ReclaimPolicy::Retain)
        });
        if !pending {
            pool_done.push(p.clone());
        }
    }
    drop(ledger);
    let cluster_api: Api<Cluster> = Api::all(ctx.client.clone());
    for c in cluster_done {
        match patch_finalizers(&cluster_api, c.as_ref(), CLUSTER_FINALIZER, false, ctx).await {
            Ok(()) => outcome.writes += 1,
            Err(_) => outcome.again = true,
        }
    }
    let pool_api: Api<IPAMPool> = Api::all(ctx.client.clone());
    for p in pool_done {
        match patch_finalizers(&pool_api, p.as_ref(), POOL_FINALIZER, false, ctx).await {
            Ok(()) => outcome.writes += 1,
            Err(_) => outcome.again = true,
        }
    }
}

/// Creates `cluster-<name>` (owned by the Cluster) where it is missing.
async fn ensure_namespaces(
    ctx: &Context,
    clusters: &[Arc<Cluster>],
    existing: &HashSet<String>,
    outcome: &mut PassOutcome,
) {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let mut jobs = Vec::new();
    for c in clusters {
        if c.metadata.deletion_timestamp.is_some() || validation::cluster_input(c).is_err() {
            continue;
        }
        let name = cluster_namespace(&c.name_any());
        if existing.contains(&name) {
            continue;
        }
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(BTreeMap::from([(LABEL_CLUSTER.to_string(), c.name_any())])),
                owner_references: Some(vec![OwnerReference {
                    api_version: Cluster::api_version(&()).into_owned(),
                    kind: Cluster::kind(&()).into_owned(),
                    name: c.name_any(),
                    uid: c.uid().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]),
                ..Default::default()
            },
            ..Default::default()
        };
        let api = api.clone();
        jobs.push(async move {
            ctx.metrics.wrote("create", "namespaces");
            match api.create(&PostParams::default(), &ns).await {
                Ok(_) => Ok(true),
                Err(e) if is_conflict(&e) => {
                    // It exists without our label (made by hand): label it so the namespace
                    // cache sees it and later passes stop trying to create it.
                    let name = ns.metadata.name.clone().unwrap_or_default();
                    let labels = json!({"metadata": {"labels": ns.metadata.labels}});
                    ctx.metrics.wrote("patch", "namespaces");
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&labels))
                        .await
                        .map(|_| true)
                }
                Err(e) => Err(e),
            }
        });
    }
    let results: Vec<Result<bool, kube::Error>> = futures::stream::iter(jobs)
        .buffer_unordered(PARALLEL_WRITES)
        .collect()
        .await;
    for r in results {
        match r {
            Ok(created) => outcome.writes += created as u64,
            Err(e) => {
                tracing::warn!(error = %e, "namespace create failed");
                outcome.again = true;
            }
        }
    }
}

/// `status.namespace` and the `IPAMReady` condition of every cluster, written when changed.
async fn write_cluster_status(
    ctx: &Context,
    clusters: &[Arc<Cluster>],
    decisions: &[Decision],
    errors: &HashMap<String, Vec<FieldError>>,
    now: &str,
    outcome: &mut PassOutcome,
) {
    let mut by_cluster: HashMap<&str, Vec<&Decision>> = HashMap::new();
    for d in decisions {
        by_cluster.entry(d.cluster.as_str()).or_default().push(d);
    }
    let api: Api<Cluster> = Api::all(ctx.client.clone());
    let mut jobs = Vec::new();
    for c in clusters {
        if c.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = c.name_any();
        let previous = c.status.clone().unwrap_or_default();
        let mut next = ClusterStatus {
            namespace: Some(cluster_namespace(&name)),
            conditions: previous.conditions.clone(),
        };
        let (ok, reason, message) = match errors.get(&name) {
            Some(errs) => (
                false,
                "InvalidSpec".to_string(),
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            None => {
                let mine = by_cluster.get(name.as_str()).cloned().unwrap_or_default();
                if mine.is_empty() {
                    (
                        true,
                        "NoPools".to_string(),
                        format!("no pool serves datacenter {}", c.spec.datacenter),
                    )
                } else {
                    status::cluster_ipam_condition(&mine)
                }
            }
        };
        status::set_condition(
            &mut next.conditions,
            "IPAMReady",
            ok,
            &reason,
            message,
            c.metadata.generation,
            now,
        );
        if next == previous {
            continue;
        }
        let api = api.clone();
        jobs.push(async move {
            ctx.metrics.wrote("patch", "clusters/status");
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": next })),
            )
            .await
        });
    }
    let results: Vec<Result<Cluster, kube::Error>> = futures::stream::iter(jobs)
        .buffer_unordered(PARALLEL_WRITES)
        .collect()
        .await;
    for r in results {
        match r {
            Ok(_) => outcome.writes += 1,
            Err(e) => {
                tracing::debug!(error = %e, "cluster status write failed");
                outcome.again = true;
            }
        }
    }
}

/// Pool status (usage, capacity conditions, overlap) written when changed, with an event for
/// every threshold crossed.
async fn write_pool_status(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    inputs: &[PoolInput],
    errors: &HashMap<String, Vec<FieldError>>,
    plan: &planner::Plan,
    now: &str,
    outcome: &mut PassOutcome,
) {
    let overlaps: Vec<Overlap> = status::find_overlaps(inputs);
    let api: Api<IPAMPool> = Api::all(ctx.client.clone());
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    for p in pools {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = p.name_any();
        let reports: Vec<&planner::DatacenterReport> =
            plan.usage.values().filter(|r| r.pool == name).collect();
        for r in &reports {
            let labels = super::metrics::PoolLabels {
                pool: r.pool.clone(),
                datacenter: r.datacenter.clone(),
            };
            seen.insert((r.pool.clone(), r.datacenter.clone()));
            ctx.metrics
                .pool_utilisation
                .get_or_create(&labels)
                .set(r.usage.utilisation_percent() as i64);
            ctx.metrics
                .pool_allocations
                .get_or_create(&labels)
                .set(r.usage.allocations as i64);
        }
        let validation = match errors.get(&name) {
            Some(e) => Err(e.as_slice()),
            None => Ok(()),
        };
        let (next, events) = status::pool_status(
            &name,
            p.metadata.generation,
            validation,
            &reports,
            &overlaps,
            p.status.as_ref(),
            now,
        );
        if p.status.as_ref() != Some(&next) {
            let mut update = p.as_ref().clone();
            update.status = Some(next);
            ctx.metrics.wrote("update", "ipampools/status");
            match api
                .replace_status(&name, &PostParams::default(), &update)
                .await
            {
                Ok(_) => outcome.writes += 1,
                Err(e) => {
                    tracing::debug!(error = %e, "pool status write failed");
                    outcome.again = true;
                    continue;
                }
            }
            let reference = p.object_ref(&());
            for ev in events {
                publish(ctx, &reference, ev.warning, &ev.reason, ev.message).await;
            }
        }
    }
}
