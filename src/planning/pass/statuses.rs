//! Cluster and pool status: conditions, usage, capacity events.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::*;
use crate::planner::{self, Change, Decision, PoolInput};
use crate::resources::{Cluster, ClusterStatus, IPAMPool, cluster_namespace};
use crate::seed::Context;
use crate::status::{self, Overlap};
use crate::validation::FieldError;

/// `status.namespace` and the `IPAMReady` condition of the `clusters` given, written when
/// changed. `since` holds the `resourceVersion` of clusters this pass changed itself (their
/// finalizer) after reading them. Returns the clusters whose status is still to be written
/// (failed, changed under the update, or held back).
#[allow(clippy::too_many_arguments)]
pub(super) async fn write_cluster_status(
    ctx: &Context,
    clusters: &[Arc<Cluster>],
    since: &HashMap<String, String>,
    decisions: &[Decision],
    errors: &HashMap<String, Vec<FieldError>>,
    write_failures: &HashMap<String, Vec<String>>,
    now: &str,
    limit: usize,
    outcome: &mut PassOutcome,
) -> Vec<String> {
    let mut unwritten = Vec::new();
    let names: HashSet<String> = clusters.iter().map(|c| c.name_any()).collect();
    let mut by_cluster: HashMap<&str, Vec<&Decision>> = HashMap::new();
    for d in decisions.iter().filter(|d| names.contains(&d.cluster)) {
        by_cluster.entry(d.cluster.as_str()).or_default().push(d);
    }
    // RBAC: src/rbac.rs (clusters/status patch; ipampools/status update below).
    let api: Api<Cluster> = Api::all(ctx.writer.clone());
    // Statuses are built as writes start, not all before: a burst writes the status of every
    // cluster, and building them all at once held every one at the pass's memory peak.
    let not_due: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let demand = ctx.demand.states();
    let jobs = clusters.iter().cloned().filter_map(|c: Arc<Cluster>| {
        if c.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let name = c.name_any();
        let previous = c.status.clone().unwrap_or_default();
        let mut next = ClusterStatus {
            namespace: Some(cluster_namespace(&name)),
            conditions: previous.conditions.clone(),
        };
        let (ok, reason, message) = match (errors.get(&name), write_failures.get(&name)) {
            (_, Some(failed)) => (false, "WriteFailed".to_string(), failed.join("; ")),
            (Some(errs), None) => (
                false,
                "InvalidSpec".to_string(),
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            (None, None) => {
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
        // Demand-driven growth: whether the demand reader can read the user cluster.
        match demand.get(&name) {
            Some(problem) => status::set_condition(
                &mut next.conditions,
                "GrowthDemandReadable",
                problem.is_none(),
                if problem.is_none() {
                    "Watching"
                } else {
                    "Unreadable"
                },
                problem
                    .clone()
                    .unwrap_or_else(|| "LoadBalancer Services are watched".into()),
                c.metadata.generation,
                now,
            ),
            None => next
                .conditions
                .retain(|c| c.type_ != "GrowthDemandReadable"),
        }
        if next == previous {
            return None;
        }
        if !due(ctx, "Cluster", &name) {
            not_due.lock().unwrap_or_else(|p| p.into_inner()).push(name);
            return None;
        }
        let api = api.clone();
        // The conditions were read at this version: the addon applier writes `AddonsReady`
        // in the same list, and a patch from an older copy would put its old value back. A
        // conflict is planned again from the fresher copy the watch brings.
        let read_at = since.get(&name).cloned().or_else(|| c.resource_version());
        Some(async move {
            ctx.metrics.wrote("patch", "clusters/status");
            // The answer (the whole Cluster) is not needed: the watch brings it.
            let r = api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({
                        "metadata": { "resourceVersion": read_at },
                        "status": next,
                    })),
                )
                .await
                .map(drop);
            (name, r)
        })
    });
    // Taken as they come: a burst writes the status of every cluster.
    let mut results = futures::stream::iter(jobs).buffer_unordered(limit);
    while let Some((name, r)) = results.next().await {
        match r {
            Ok(_) => {
                outcome.writes += 1;
                write_succeeded(ctx, "Cluster", &name);
            }
            Err(e) if is_conflict(&e) => {
                tracing::debug!(cluster = %name, "cluster changed under its status update; planning again");
                outcome.again = true;
                unwritten.push(name);
            }
            Err(e) => {
                write_failed(ctx, "Cluster", &name, "patch status of", &e);
                outcome.again = true;
                unwritten.push(name);
            }
        }
    }
    drop(results);
    let not_due = not_due.into_inner().unwrap_or_else(|p| p.into_inner());
    if !not_due.is_empty() {
        outcome.again = true;
        unwritten.extend(not_due);
    }
    unwritten
}

/// Pool status (usage, capacity conditions, overlap) written when changed, with an event for
/// every threshold crossed.
#[allow(clippy::too_many_arguments)]
pub(super) async fn write_pool_status(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    inputs: &[PoolInput],
    errors: &HashMap<String, Vec<FieldError>>,
    plan: &planner::Plan,
    now: &str,
    limit: usize,
    outcome: &mut PassOutcome,
) {
    let updates = pool_status_updates(ctx, pools, inputs, errors, plan, now);
    let sent = send_pool_status(ctx, updates, limit).await;
    outcome.writes += sent.writes;
    outcome.again |= !sent.failed.is_empty();
}

/// One pool status to write, and the events to publish once it is written.
pub(super) struct PoolStatusUpdate {
    pool: Arc<IPAMPool>,
    update: IPAMPool,
    events: Vec<status::StatusEvent>,
}

/// What became of a batch of pool status updates.
#[derive(Debug, Default)]
pub(super) struct PoolStatusSent {
    pub writes: u64,
    /// Pools whose status did not land (stale, or the write failed).
    pub failed: BTreeSet<String>,
}

/// The status each of `pools` should have after `plan`; pools whose status already says it
/// are left out (and their earlier failures forgotten).
pub(super) fn pool_status_updates(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    inputs: &[PoolInput],
    errors: &HashMap<String, Vec<FieldError>>,
    plan: &planner::Plan,
    now: &str,
) -> Vec<PoolStatusUpdate> {
    let overlaps: Vec<Overlap> = status::find_overlaps(inputs);
    // One sweep over the plan, not one per pool.
    let mut conflicts_of: HashMap<&str, Vec<&Decision>> = HashMap::new();
    for d in plan
        .decisions
        .iter()
        .filter(|d| d.change == Change::Conflict)
    {
        conflicts_of.entry(d.pool.as_str()).or_default().push(d);
    }
    // Machines' claims among the holders, by (pool, datacenter).
    let mut claims_of: HashMap<(&str, &str), i64> = HashMap::new();
    for d in plan.decisions.iter().filter(|d| {
        d.held.is_some()
            && d.change != Change::Release
            && crate::resources::capi::claim_of_holder(&d.cluster).is_some()
    }) {
        *claims_of
            .entry((d.pool.as_str(), d.datacenter.as_str()))
            .or_default() += 1;
    }
    let mut updates = Vec::new();
    for p in pools {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = p.name_any();
        let reports: Vec<&planner::DatacenterReport> =
            plan.usage.values().filter(|r| r.pool == name).collect();
        let validation = match errors.get(&name) {
            Some(e) => Err(e.as_slice()),
            None => Ok(()),
        };
        let conflicts = conflicts_of.remove(name.as_str()).unwrap_or_default();
        let (mut next, events) = status::pool_status(
            &name,
            p.metadata.generation,
            validation,
            &reports,
            &overlaps,
            &conflicts,
            p.status.as_ref(),
            now,
        );
        let mut claims = 0;
        for (dc, usage) in next.datacenters.iter_mut() {
            let n = claims_of
                .get(&(name.as_str(), dc.as_str()))
                .copied()
                .unwrap_or(0);
            usage.claims = (n > 0).then_some(n);
            claims += n;
        }
        next.claims = (claims > 0).then_some(claims);
        if p.status.as_ref() == Some(&next) {
            // Nothing to write: an earlier failure is over (its backoff entry would otherwise
            // stay due forever and make every pass ask for another one at once).
            write_succeeded(ctx, "IPAMPool", &name);
        } else {
            let mut update = p.as_ref().clone();
            update.status = Some(next);
            updates.push(PoolStatusUpdate {
                pool: p.clone(),
                update,
                events,
            });
        }
    }
    updates
}

/// Writes `updates` (each pool's status is its own object: at most `limit` at once) and
/// publishes the events of those that landed.
pub(super) async fn send_pool_status(
    ctx: &Context,
    updates: Vec<PoolStatusUpdate>,
    limit: usize,
) -> PoolStatusSent {
    // RBAC: src/rbac.rs (ipampools/status update).
    let api: Api<IPAMPool> = Api::all(ctx.writer.clone());
    let writes: Vec<_> = updates
        .into_iter()
        .map(|u| {
            let api = api.clone();
            async move {
                let name = u.pool.name_any();
                ctx.metrics.wrote("update", "ipampools/status");
                let result = api
                    .replace_status(&name, &PostParams::default(), &u.update)
                    .await;
                (u, name, result)
            }
        })
        .collect();
    let results: Vec<_> = futures::stream::iter(writes)
        .buffer_unordered(limit.max(1))
        .collect()
        .await;
    let mut sent = PoolStatusSent::default();
    for (u, name, result) in results {
        match result {
            Ok(_) => {
                sent.writes += 1;
                write_succeeded(ctx, "IPAMPool", &name);
            }
            Err(e) if is_conflict(&e) => {
                // The pool changed since the cache saw it: written again on the newer version.
                tracing::debug!(pool = %name, "pool changed under its status update; planning again");
                sent.failed.insert(name);
                continue;
            }
            Err(e) => {
                write_failed(ctx, "IPAMPool", &name, "update status of", &e);
                sent.failed.insert(name);
                continue;
            }
        }
        let reference = u.pool.object_ref(&());
        for ev in u.events {
            publish(ctx, &reference, ev.warning, &ev.reason, ev.message).await;
        }
    }
    sent
}
