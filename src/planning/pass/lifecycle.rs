//! Finalizers on clusters and pools, and the clusters' namespaces.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::*;
use crate::resources::{
    ANNOTATION_RECLAIM_POLICY, Cluster, IPAMPool, LABEL_CLUSTER, ReclaimPolicy, cluster_namespace,
};
use crate::seed::Context;
use crate::validation::{self};

/// Adds our finalizers to clusters and pools that lack them. Returns the `resourceVersion`
/// each cluster it patched has now, by name: the cluster's status is written later in the same
/// pass from the copy read before, and that version says nothing else changed since.
pub(super) async fn add_finalizers(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    clusters: &[Arc<Cluster>],
    limit: usize,
    outcome: &mut PassOutcome,
) -> HashMap<String, String> {
    let cluster_api: Api<Cluster> = Api::all(ctx.writer.clone());
    let pool_api: Api<IPAMPool> = Api::all(ctx.writer.clone());
    let mut jobs = Vec::new();
    for c in clusters {
        if c.metadata.deletion_timestamp.is_none()
            && !c.finalizers().iter().any(|f| f == CLUSTER_FINALIZER)
        {
            let api = cluster_api.clone();
            jobs.push(async move {
                let r = patch_finalizers(&api, c.as_ref(), CLUSTER_FINALIZER, true, ctx).await;
                (Some(c.name_any()), r)
            });
        }
    }
    let mut pool_jobs = Vec::new();
    for p in pools {
        if p.metadata.deletion_timestamp.is_none()
            && !p.finalizers().iter().any(|f| f == POOL_FINALIZER)
        {
            let api = pool_api.clone();
            pool_jobs.push(async move {
                let r = patch_finalizers(&api, p.as_ref(), POOL_FINALIZER, true, ctx).await;
                (None, r)
            });
        }
    }
    // (the cluster patched, or none for a pool; the version after the patch)
    type Finalized = (Option<String>, Result<Option<String>, kube::Error>);
    let results: Vec<Finalized> = futures::stream::iter(jobs)
        .buffer_unordered(limit)
        .chain(futures::stream::iter(pool_jobs).buffer_unordered(limit))
        .collect()
        .await;
    let mut versions = HashMap::new();
    for (cluster, r) in results {
        match r {
            Ok(version) => {
                outcome.writes += 1;
                if let (Some(cluster), Some(version)) = (cluster, version) {
                    versions.insert(cluster, version);
                }
            }
            Err(e) if is_conflict(&e) => outcome.again = true,
            Err(e) => {
                write_failed(ctx, "finalizer", "", "patch", &e);
                outcome.again = true;
            }
        }
    }
    versions
}

/// How often kipam's finalizer patch of a Cluster that meets a conflict is tried again on a
/// fresh copy.
const FINALIZER_ATTEMPTS: usize = 3;

/// What adding kipam's finalizer to a Cluster came to ([`add_cluster_finalizer`]).
pub(super) struct Finalized {
    /// Writes made (0 or 1).
    pub writes: u64,
    /// The Cluster's version after the patch: nothing but the finalizer changed between the
    /// copy the patch was made on and it.
    pub version: Option<String>,
    /// That copy, when it is not the cached one the pass read (a conflict made kipam read the
    /// Cluster again): the Cluster's status is to be built on it, not on the cached copy.
    pub fresh: Option<Arc<Cluster>>,
    /// The Cluster was gone when read again.
    pub gone: bool,
}

/// Adds kipam's finalizer to a Cluster read from the cache. The patch carries the version it
/// was computed from (the finalizer list is replaced whole); when somebody wrote the Cluster
/// since (the applier's `AddonsReady` on a new cluster that comes with its Addons), the Cluster
/// is read again and the patch made on that copy, a few times, instead of leaving it to a
/// pass that plans again.
pub(super) async fn add_cluster_finalizer(
    ctx: &Context,
    cluster: &Cluster,
) -> Result<Finalized, kube::Error> {
    // RBAC: src/rbac.rs (patch and get of clusters).
    let api: Api<Cluster> = Api::all(ctx.writer.clone());
    let mut fresh: Option<Arc<Cluster>> = None;
    let mut attempt = 0;
    loop {
        let current = fresh.as_deref().unwrap_or(cluster);
        if current.metadata.deletion_timestamp.is_some()
            || current.finalizers().iter().any(|f| f == CLUSTER_FINALIZER)
        {
            return Ok(Finalized {
                writes: 0,
                version: current.resource_version(),
                fresh,
                gone: false,
            });
        }
        attempt += 1;
        match patch_finalizers(&api, current, CLUSTER_FINALIZER, true, ctx).await {
            Ok(version) => {
                return Ok(Finalized {
                    writes: 1,
                    version,
                    fresh,
                    gone: false,
                });
            }
            Err(e) if is_conflict(&e) && attempt < FINALIZER_ATTEMPTS => {
                tracing::debug!(cluster = %cluster.name_any(), "cluster changed under its finalizer patch; patching the fresh copy");
                match read_cluster(ctx, &cluster.name_any()).await? {
                    // The same Cluster, not one created again under its name since (the pass
                    // planned the one it read; the next plans the new one).
                    Some(c) if c.uid() == cluster.uid() => fresh = Some(Arc::new(c)),
                    Some(_) => return Err(e),
                    None => {
                        return Ok(Finalized {
                            writes: 0,
                            version: None,
                            fresh: None,
                            gone: true,
                        });
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The Cluster as the API server holds it now (a write from the cached copy met a conflict).
pub(super) async fn read_cluster(
    ctx: &Context,
    name: &str,
) -> Result<Option<Cluster>, kube::Error> {
    // RBAC: src/rbac.rs (clusters get).
    let api: Api<Cluster> = Api::all(ctx.writer.clone());
    api.get_opt(name).await
}

/// Adds or removes one finalizer. The patch carries the `resourceVersion` it was computed
/// from, so a concurrent change to the object fails (409) instead of being overwritten.
/// Returns the object's `resourceVersion` after the patch.
// RBAC: src/rbac.rs (patch of ipampools and clusters).
pub(super) async fn patch_finalizers<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    add: bool,
    ctx: &Context,
) -> Result<Option<String>, kube::Error>
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
    .map(|o| o.resource_version())
}

/// Removes our finalizers once the object's allocations are handled.
pub(super) async fn release_finalizers(
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
            let retained = a.annotation(ANNOTATION_RECLAIM_POLICY).as_deref() == Some("Retain");
            !(retained && p.spec.reclaim_policy == ReclaimPolicy::Retain)
        });
        // Machines' addresses of the pool are released (their `IPAddress`es deleted) first,
        // whatever the reclaim policy: an `IPAddress` is owned by its pool (Cluster API's
        // contract), so Kubernetes' garbage collector deletes it with the pool anyway.
        let claims_pending =
            ctx.capi.addresses.state().iter().any(|a| {
                a.spec.pool_ref.kipam_pool() == Some(name.as_str()) && a.written_by_kipam()
            });
        if !pending && !claims_pending {
            pool_done.push(p.clone());
        }
    }
    drop(ledger);
    let cluster_api: Api<Cluster> = Api::all(ctx.writer.clone());
    for c in cluster_done {
        match patch_finalizers(&cluster_api, c.as_ref(), CLUSTER_FINALIZER, false, ctx).await {
            Ok(_) => outcome.writes += 1,
            Err(_) => outcome.again = true,
        }
    }
    let pool_api: Api<IPAMPool> = Api::all(ctx.writer.clone());
    for p in pool_done {
        match patch_finalizers(&pool_api, p.as_ref(), POOL_FINALIZER, false, ctx).await {
            Ok(_) => outcome.writes += 1,
            Err(_) => outcome.again = true,
        }
    }
}

/// Creates `cluster-<name>`, owned by the Cluster; one that exists without kipam's label
/// (made by hand) is labelled instead, so the namespace cache sees it and later passes stop
/// trying to create it. Returns whether a write was sent that landed.
pub(super) async fn create_namespace(ctx: &Context, c: &Cluster) -> Result<bool, kube::Error> {
    // RBAC: src/rbac.rs (namespaces: create, patch; clusters/finalizers: update, for the
    // owner reference with blockOwnerDeletion).
    let api: Api<Namespace> = Api::all(ctx.writer.clone());
    let name = cluster_namespace(&c.name_any());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
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
    ctx.metrics.wrote("create", "namespaces");
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(true),
        Err(e) if is_conflict(&e) => {
            let labels = json!({"metadata": {"labels": ns.metadata.labels}});
            ctx.metrics.wrote("patch", "namespaces");
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&labels))
                .await
                .map(|_| true)
        }
        Err(e) => Err(e),
    }
}

/// Whether `c` needs its namespace created: it is missing from `existing`, and the cluster
/// is valid and not being deleted.
pub(super) fn needs_namespace(c: &Cluster, existing: impl Fn(&str) -> bool) -> bool {
    c.metadata.deletion_timestamp.is_none()
        && !existing(&cluster_namespace(&c.name_any()))
        && validation::cluster_input(c).is_ok()
}

/// Whether `c` needs kipam's finalizer added.
pub(super) fn needs_finalizer(c: &Cluster) -> bool {
    c.metadata.deletion_timestamp.is_none()
        && !c.finalizers().iter().any(|f| f == CLUSTER_FINALIZER)
}
