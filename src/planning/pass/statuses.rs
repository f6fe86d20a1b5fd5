//! Cluster and pool status: conditions, usage, capacity events.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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

/// The merge patch of a Cluster's status: `adoption` is written as `null` when absent, so
/// that it goes once the cluster no longer adopts (a merge patch keeps a field it leaves out).
fn status_patch(next: &ClusterStatus) -> serde_json::Value {
    let mut v = serde_json::to_value(next).unwrap_or_default();
    if next.adoption.is_none()
        && let Some(m) = v.as_object_mut()
    {
        m.insert("adoption".into(), serde_json::Value::Null);
    }
    v
}

/// The status `c` should have — `status.namespace`, the `IPAMReady` condition from `mine`
/// (its decisions), `errors` (its spec's) or `failed` (its writes that failed), the
/// `GrowthDemandReadable` condition from `demand`, and `status.adoption` with the `Adopted`
/// condition from `adopting` (its adoption plan, if it adopts) — or `None` when it has it
/// already, or is being deleted.
#[allow(clippy::too_many_arguments)]
pub(super) fn next_cluster_status(
    c: &Cluster,
    mine: &[&Decision],
    errors: Option<&Vec<FieldError>>,
    failed: Option<&Vec<String>>,
    demand: &BTreeMap<String, Option<String>>,
    adopting: Option<&crate::planner::adopt::ClusterAdoption>,
    now: &str,
) -> Option<ClusterStatus> {
    if c.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let name = c.name_any();
    let previous = c.status.clone().unwrap_or_default();
    let mut next = ClusterStatus {
        namespace: Some(cluster_namespace(&name)),
        conditions: previous.conditions.clone(),
        adoption: adopting.map(status::adoption_status),
    };
    let (ok, reason, message) = match (errors, failed) {
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
            let held_back = adopting.filter(|a| {
                !matches!(a.state, crate::planner::adopt::AdoptState::Ready)
                    || a.mode != crate::resources::AdoptMode::Adopt
            });
            if let Some(a) = held_back.filter(|_| mine.iter().all(|d| d.held.is_none())) {
                let (_, state, message) = status::adoption_condition(a);
                (false, format!("Adoption{state}"), message)
            } else if mine.is_empty() {
                (
                    true,
                    "NoPools".to_string(),
                    format!("no pool serves datacenter {}", c.spec.datacenter),
                )
            } else {
                status::cluster_ipam_condition(mine)
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
    match adopting {
        Some(a) => {
            let (ok, reason, message) = status::adoption_condition(a);
            status::set_condition(
                &mut next.conditions,
                "Adopted",
                ok,
                reason,
                message,
                c.metadata.generation,
                now,
            );
        }
        None => next.conditions.retain(|c| c.type_ != "Adopted"),
    }
    (next != previous).then_some(next)
}

/// Writes a cluster's status. `read_at`: the `resourceVersion` its conditions were read at
/// (or the one its finalizer patch left, made by this pass): the addon applier writes
/// `AddonsReady` in the same list, and a patch from an older copy would put its old value
/// back. A conflict is planned again from the fresher copy the watch brings.
pub(super) async fn patch_cluster_status(
    ctx: &Context,
    name: &str,
    read_at: Option<String>,
    next: ClusterStatus,
) -> Result<(), kube::Error> {
    // RBAC: src/rbac.rs (clusters/status patch).
    let api: Api<Cluster> = Api::all(ctx.writer.clone());
    ctx.metrics.wrote("patch", "clusters/status");
    // The answer (the whole Cluster) is not needed: the watch brings it.
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": { "resourceVersion": read_at },
            "status": status_patch(&next),
        })),
    )
    .await
    .map(drop)
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
    outdated: &Outdated,
    now: &str,
    limit: usize,
    outcome: &mut PassOutcome,
) {
    let updates = pool_status_updates(ctx, pools, inputs, errors, plan, outdated, now);
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

/// kipam's `IPAddress`es that show an older network than their pool datacenter's, by pool
/// then datacenter (`claims::outdated_addresses`).
pub(super) type Outdated = HashMap<String, BTreeMap<String, usize>>;

/// The status each of `pools` should have after `plan`; pools whose status already says it
/// are left out (and their earlier failures forgotten). `outdated`: see [`Outdated`].
pub(super) fn pool_status_updates(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    inputs: &[PoolInput],
    errors: &HashMap<String, Vec<FieldError>>,
    plan: &planner::Plan,
    outdated: &Outdated,
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
    let newer = newer_records(ctx);
    let mut updates = Vec::new();
    for p in pools {
        if p.metadata.deletion_timestamp.is_some() {
            // A pool being deleted waits for the claims that hold its addresses; its status
            // says which.
            if let Some(update) = deleting_pool_status(ctx, p, now) {
                updates.push(update);
            }
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
        machine_conditions(
            &mut next,
            inputs.iter().find(|i| i.name == name),
            outdated.get(&name),
            p.metadata.generation,
            now,
        );
        format_condition(
            &mut next,
            newer.get(name.as_str()),
            p.metadata.generation,
            now,
        );
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

/// Condition type: the pool is being deleted and waits for claims holding its addresses.
pub const CONDITION_DELETING: &str = "Deleting";
/// Condition type, present only while it is so: some datacenter leaves a machine's claim no
/// address (every one is excluded or reserved: network, broadcast, gateway).
pub const CONDITION_MACHINE_ROOM: &str = "MachineAddressesAvailable";
/// Condition type, present only while it is so: a record of the pool was written in a newer
/// record format than the replica writing the status knows (a rolling upgrade under way).
pub const CONDITION_NEWER_RECORDS: &str = "RecordsOfNewerFormat";
/// Condition type, present only while it is so: `IPAddress`es written before the last
/// `network` edit still show the old prefix length or gateway.
pub const CONDITION_OUTDATED: &str = "IPAddressesOutdated";

/// The conditions about machines' claims on a live pool's status: no room left by the
/// reserved addresses, and `IPAddress`es showing an earlier network. Each is present only
/// while it holds.
fn machine_conditions(
    next: &mut crate::resources::IPAMPoolStatus,
    input: Option<&PoolInput>,
    outdated: Option<&BTreeMap<String, usize>>,
    generation: Option<i64>,
    now: &str,
) {
    let full: Vec<&str> = input
        .map(|i| {
            i.datacenters
                .iter()
                .filter(|(_, d)| status::no_machine_room(d))
                .map(|(dc, _)| dc.as_str())
                .collect()
        })
        .unwrap_or_default();
    next.conditions
        .retain(|c| c.type_ != CONDITION_MACHINE_ROOM);
    if !full.is_empty() {
        status::set_condition(
            &mut next.conditions,
            CONDITION_MACHINE_ROOM,
            false,
            "AllReserved",
            format!(
                "datacenter {}: every address is excluded or is one no machine gets (the network's network, broadcast or gateway address); no claim can be served there",
                full.join(", ")
            ),
            generation,
            now,
        );
    }
    next.conditions.retain(|c| c.type_ != CONDITION_OUTDATED);
    if let Some(by_dc) = outdated.filter(|m| !m.is_empty()) {
        let total: usize = by_dc.values().sum();
        let each: Vec<String> = by_dc.iter().map(|(dc, n)| format!("{dc}: {n}")).collect();
        status::set_condition(
            &mut next.conditions,
            CONDITION_OUTDATED,
            true,
            "NetworkChanged",
            format!(
                "{total} IPAddresses still show an earlier network ({}); an IPAddress's spec never changes, so they keep it until their claims are re-created, and new claims get the current network",
                each.join(", ")
            ),
            generation,
            now,
        );
    }
}

/// Pool -> one of its records written in a newer record format than this kipam knows, as
/// (record, format), from the record watch's view (every replica's, the leader's included).
fn newer_records(ctx: &Context) -> HashMap<String, (String, i32)> {
    let mut out = HashMap::new();
    for r in ctx.record_view.store.state() {
        if let Some(format) = r.spec.newer_format() {
            out.entry(r.spec.pool.clone())
                .or_insert_with(|| (r.name_any(), format));
        }
    }
    out
}

/// The condition of a pool with a record of a newer format (`newer`), present only while so:
/// this replica commits nothing there until the upgrade is finished.
fn format_condition(
    next: &mut crate::resources::IPAMPoolStatus,
    newer: Option<&(String, i32)>,
    generation: Option<i64>,
    now: &str,
) {
    next.conditions
        .retain(|c| c.type_ != CONDITION_NEWER_RECORDS);
    if let Some((record, format)) = newer {
        status::set_condition(
            &mut next.conditions,
            CONDITION_NEWER_RECORDS,
            true,
            "UpgradeInProgress",
            format!(
                "pool record {record} was written in record format {format} by a newer kipam; the replica writing this status knows format {} and commits nothing into this pool's records until the upgrade is finished (docs/operations.md, Upgrades)",
                crate::resources::RECORD_FORMAT
            ),
            generation,
            now,
        );
    }
}

/// The status of a pool being deleted while claims still hold its addresses: `Deleting`, with
/// how many and which. `None` when nothing is to be written.
fn deleting_pool_status(ctx: &Context, p: &Arc<IPAMPool>, now: &str) -> Option<PoolStatusUpdate> {
    let holding = super::claims::holding_in(ctx, &p.name_any());
    if holding.is_empty() {
        return None;
    }
    let mut next = p.status.clone().unwrap_or_default();
    let shown: Vec<&str> = holding.iter().take(10).map(String::as_str).collect();
    let more = holding.len().saturating_sub(shown.len());
    status::set_condition(
        &mut next.conditions,
        CONDITION_DELETING,
        true,
        "ClaimsHoldAddresses",
        format!(
            "being deleted: waits for {} IPAddressClaims that still hold its addresses ({}{}); their machines keep them until the claims are deleted, then the pool goes",
            holding.len(),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ),
        p.metadata.generation,
        now,
    );
    if p.status.as_ref() == Some(&next) {
        return None;
    }
    let mut update = p.as_ref().clone();
    update.status = Some(next);
    Some(PoolStatusUpdate {
        pool: p.clone(),
        update,
        events: Vec::new(),
    })
}

/// How often a pool status update that meets a conflict is sent again on a fresh version.
const POOL_STATUS_ATTEMPTS: usize = 3;

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
                let mut update = u.update.clone();
                let mut attempt = 0;
                let result = loop {
                    attempt += 1;
                    ctx.metrics.wrote("update", "ipampools/status");
                    let result = api
                        .replace_status(&name, &PostParams::default(), &update)
                        .await;
                    match result {
                        Err(e) if is_conflict(&e) && attempt < POOL_STATUS_ATTEMPTS => {
                            // Written since the cache saw it, most often by kipam itself (the
                            // pool's finalizer, added in the same pass, or the last status
                            // whose echo has not come): the status is kipam's alone, so it is
                            // written again on the version the server holds, unless the
                            // spec changed (then the pool is planned again).
                            match api.get_opt(&name).await {
                                Ok(Some(fresh))
                                    if fresh.uid() == u.pool.uid()
                                        && fresh.metadata.generation
                                            == u.pool.metadata.generation =>
                                {
                                    tracing::debug!(pool = %name, "pool changed under its status update; writing it again on the newer version");
                                    update.metadata.resource_version = fresh.resource_version();
                                }
                                _ => break Err(e),
                            }
                        }
                        other => break other,
                    }
                };
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
                // The pool's spec changed since the cache saw it, or it keeps changing: the
                // next pass plans it again and writes its status on the newer version.
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
