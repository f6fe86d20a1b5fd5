//! The short pass: clusters new to the seed, served without reading the whole seed.
//!
//! When the watches name only clusters (no pool, namespace, deletion or re-list), nobody else
//! changed an allocation, no write waits for a retry and the last plan is at hand, a pass
//! needs nothing but those clusters. Each must be either new — absent from the last plan's
//! inputs and holding nothing in the ledger or any pool record — or unchanged as far as the
//! planner reads it. The new ones are served from the allocators the last plan ended with
//! ([`planner::serve_new`], which gives exactly the whole-seed plan or declines); then the
//! usual fence follows: their entries are committed to the pool records (compare-and-swap)
//! before any object is written. Anything else, or a decline, falls back to the full pass,
//! which looks at everything.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::*;
use crate::planner::ClusterInput;
use crate::planning::records::{self, RecordKey};
use crate::reservations::reservation_of;
use crate::resources::Reservation;
use crate::seed::Context;
use crate::validation;

/// Runs the short pass for `dirty` if it applies; `None` when the full pass must run (and
/// nothing was done).
pub(super) async fn run(
    ctx: &Arc<Context>,
    term: u64,
    state: &mut PassState,
    dirty: &BTreeSet<String>,
) -> Option<Result<PassOutcome, PassError>> {
    tracing::trace!(clusters = ?dirty, "short pass starts");
    let mut steps = Steps::start();
    let limit = state.write_concurrency;

    let mut named = Named::read(ctx, state, dirty).await?;
    let added = serve(state, std::mem::take(&mut named.new))?;
    steps.done("serve");

    let mut outcome = PassOutcome::default();
    let now = crate::resources::now_rfc3339();
    let done = write_newcomers(ctx, term, state, &named, &added, &now, &mut outcome).await;
    steps.done("clusters");

    let uids: HashMap<String, &Cluster> = named
        .clusters
        .iter()
        .map(|c| (c.name_any(), c.as_ref()))
        .collect();
    allocations::publish_cluster_events(ctx, done.notes, &uids, limit).await;
    state.retry_pools.extend(done.retry_pools);
    state.retry_clusters.extend(done.retry_clusters);
    for key in &done.stale {
        allocations::refresh(ctx, key).await;
    }
    steps.done("events");

    note_usage(state, &added);
    settle_newcomers(state, &added);
    steps.done("metrics");
    outcome.status_after = start_statuses(ctx, state, &now);
    steps.done("pool status");

    tracing::debug!(
        clusters = dirty.len(),
        decisions = added.len(),
        writes = outcome.writes,
        "short pass steps (µs since start): {:?}",
        steps.0
    );
    Some(Ok(settle(ctx, state, outcome).await))
}

/// The short pass for machines' claims new to the seed (`holders`, named
/// `claim/<namespace>/<name>`): like the clusters', served from the kept allocators, committed
/// entry by entry to the pool records, then given their finalizer, `IPAddress` and status
/// (`claims::write`). `None` when the full pass must run (nothing was done): a claim that is
/// gone, paused, being deleted, waiting, asking for a particular address, changed, or holding
/// something already.
pub(super) async fn run_claims(
    ctx: &Arc<Context>,
    term: u64,
    state: &mut PassState,
    holders: &BTreeSet<String>,
) -> Option<Result<PassOutcome, PassError>> {
    let mut steps = Steps::start();
    let limit = state.write_concurrency;
    let (new, read) = {
        let (inputs, _) = state.previous.as_ref()?;
        let records = ctx.records.lock().await;
        claims::newcomers(ctx, &inputs.pools, state, &records, holders)?
    };
    let added = serve(state, new)?;
    steps.done("serve");

    let mut outcome = PassOutcome::default();
    let now = crate::resources::now_rfc3339();
    let planned = state.planned_on.clone();
    let committed: Vec<(RecordKey, Option<u64>)> = futures::stream::iter(
        entries_of(&added)
            .into_iter()
            .map(|(key, entries)| commit_one(ctx, key, entries, &planned)),
    )
    .buffer_unordered(limit)
    .collect()
    .await;
    let current = landed(state, committed, &mut outcome);
    steps.done("records");

    let pools = ctx.pools.state();
    let served = planner::Plan {
        decisions: added.clone(),
        usage: state
            .previous
            .as_ref()
            .map(|(_, plan)| plan.usage.clone())
            .unwrap_or_default(),
        quarantined: Vec::new(),
    };
    let inputs = state
        .previous
        .as_ref()
        .map(|(inputs, _)| inputs.pools.clone())
        .unwrap_or_default();
    claims::write(
        ctx,
        term,
        &served,
        &read,
        &current,
        &pools,
        &inputs,
        &now,
        limit,
        &mut outcome,
    )
    .await;
    steps.done("claims");

    note_usage(state, &added);
    settle_newcomers(state, &added);
    outcome.status_after = start_statuses(ctx, state, &now);
    steps.done("pool status");
    tracing::debug!(
        claims = holders.len(),
        decisions = added.len(),
        writes = outcome.writes,
        "short pass steps for claims (µs since start): {:?}",
        steps.0
    );
    Some(Ok(settle(ctx, state, outcome).await))
}

/// The clusters the watches named, each new or unchanged as far as the planner reads it.
struct Named {
    /// Every named cluster.
    clusters: Vec<Arc<Cluster>>,
    /// The new ones (absent from the last plan, holding nothing), as planner inputs.
    new: Vec<ClusterInput>,
    /// The new ones.
    new_clusters: Vec<Arc<Cluster>>,
}

impl Named {
    /// Decides before doing anything: `None` (the full pass runs) when a named cluster is
    /// gone from the cache, invalid, changed, or holds something already.
    async fn read(ctx: &Context, state: &PassState, dirty: &BTreeSet<String>) -> Option<Named> {
        state.previous.as_ref()?;
        let mut named = Named {
            clusters: Vec::new(),
            new: Vec::new(),
            new_clusters: Vec::new(),
        };
        let ledger = ctx.ledger.lock().await;
        let records = ctx.records.lock().await;
        let pools = ctx.pools.state();
        for name in dirty {
            let cluster = ctx.clusters.get(&ObjectRef::new(name))?;
            // A cluster being adopted is planned from what its user cluster serves: the full
            // pass reads that.
            if crate::planner::adopt::reads(crate::planner::adopt::effective_mode(
                &cluster,
                pools.iter().map(AsRef::as_ref),
            )) {
                return None;
            }
            let input = validation::cluster_input(&cluster).ok()?;
            match state.known_input(name) {
                Some(before) if *before == input => {}
                Some(_) => return None,
                None => {
                    if ledger.has_namespace(&cluster_namespace(name)) || records.holds(name) {
                        return None;
                    }
                    named.new.push(input);
                    named.new_clusters.push(cluster.clone());
                }
            }
            named.clusters.push(cluster);
        }
        Some(named)
    }
}

/// Step "serve": the newcomers served from the allocators the last plan ended with, their
/// decisions added to the kept plan; `None` when the planner declines.
fn serve(state: &mut PassState, new: Vec<ClusterInput>) -> Option<Vec<planner::Decision>> {
    let (inputs, plan) = state.previous.as_mut()?;
    let added = planner::serve_new(plan, &mut state.states, &inputs.pools, &new)?;
    state.add_known(new);
    state.fast_passes += 1;
    Some(added)
}

/// Steps "records" and "clusters": the newcomers' entries committed to the pool records (the
/// fence), and beside those commits each named cluster's chain of writes (`pipeline`): its
/// finalizer and, for a newcomer, its namespace; then its objects, once the commits covering
/// them landed; then its status. Objects whose commit did not land are left to the full pass.
async fn write_newcomers(
    ctx: &Arc<Context>,
    term: u64,
    state: &mut PassState,
    named: &Named,
    added: &[planner::Decision],
    now: &str,
    outcome: &mut PassOutcome,
) -> pipeline::Done {
    let limit = state.write_concurrency;
    // Only the newcomers' namespaces matter: looked up, not a set of the whole seed's.
    let new: HashSet<String> = named.new_clusters.iter().map(|c| c.name_any()).collect();
    let existing = |name: &str| {
        ctx.namespaces
            .get(&ObjectRef::new(name))
            .is_some_and(|n| n.metadata.deletion_timestamp.is_none())
    };
    let of_holder = pipeline::by_holder(added);
    let chains: Vec<pipeline::Chain> = named
        .clusters
        .iter()
        .map(|c| {
            let name = c.name_any();
            let mut chain = pipeline::Chain::of(name.clone(), Some(c.clone()));
            chain.finalize = lifecycle::needs_finalizer(c);
            if new.contains(&name) {
                chain.namespace = lifecycle::needs_namespace(c, existing);
                chain.status = true;
                chain.jobs = of_holder.get(name.as_str()).cloned().unwrap_or_default();
            }
            chain
        })
        .filter(|c| c.has_work())
        .collect();

    let policies: HashMap<String, crate::resources::ReclaimPolicy> = state
        .previous
        .as_ref()
        .map(|(inputs, _)| {
            inputs
                .pools
                .iter()
                .map(|p| (p.name.clone(), p.reclaim_policy))
                .collect()
        })
        .unwrap_or_default();
    let build = |d: &planner::Decision| -> Option<AllocationWrite> {
        let desired = allocation_object(d, None, policies.get(d.pool.as_str()).copied(), now);
        AllocationWrite::new(d, None, desired)
    };
    let slots = pipeline::Slots::new(limit);
    let landing = pipeline::Landing::new();
    let demand = ctx.demand.states();
    let no_errors = HashMap::new();
    let no_adoption = Default::default();
    let metrics = state.metrics.clone();
    let env = pipeline::Env {
        ctx,
        term,
        metrics: &metrics,
        slots: &slots,
        landing: &landing,
        decisions: added,
        of_holder: &of_holder,
        build: &build,
        errors: &no_errors,
        demand: &demand,
        // No cluster being adopted takes this path (`Named::read`).
        adoption: &no_adoption,
        now,
    };
    let planned = state.planned_on.clone();
    let (committed, done) = tokio::join!(
        commit_landing(ctx, entries_of(added), &planned, limit, &landing),
        pipeline::run(&env, chains, 2 * limit),
    );
    landed(state, committed, outcome);
    outcome.writes += done.outcome.writes;
    outcome.again |= done.outcome.again;
    done
}

/// Commits `changes` to their pool records, `limit` at once, telling `landing` of each as it
/// lands or is refused (the chains of the objects they fence wait on it); the writes each
/// sent, or `None` where it did not land.
pub(super) async fn commit_landing(
    ctx: &Arc<Context>,
    changes: BTreeMap<RecordKey, BTreeMap<String, Option<Reservation>>>,
    planned: &records::PlannedOn,
    limit: usize,
    landing: &pipeline::Landing,
) -> Vec<(RecordKey, Option<u64>)> {
    let commits = changes
        .into_iter()
        .map(|(key, entries)| commit_one(ctx, key, entries, planned));
    let mut out = Vec::new();
    let mut results = futures::stream::iter(commits).buffer_unordered(limit);
    while let Some((key, sent)) = results.next().await {
        if sent.is_some() {
            landing.landed(key.clone());
        } else {
            landing.refused(key.clone());
        }
        out.push((key, sent));
    }
    landing.over();
    out
}

/// The record entries the newcomers' decisions add, by pool datacenter.
fn entries_of(
    added: &[planner::Decision],
) -> BTreeMap<RecordKey, BTreeMap<String, Option<Reservation>>> {
    let mut changes: BTreeMap<RecordKey, BTreeMap<String, Option<Reservation>>> = BTreeMap::new();
    for d in added {
        if let Some(held) = &d.held {
            changes
                .entry((d.pool.clone(), d.datacenter.clone()))
                .or_default()
                .insert(d.cluster.clone(), Some(reservation_of(held)));
        }
    }
    changes
}

/// The pool datacenters whose commit landed; the others are retried by the full pass.
pub(super) fn landed(
    state: &mut PassState,
    committed: Vec<(RecordKey, Option<u64>)>,
    outcome: &mut PassOutcome,
) -> HashSet<RecordKey> {
    let mut current: HashSet<RecordKey> = HashSet::new();
    for (key, sent) in committed {
        if let Some(n) = sent {
            outcome.writes += n;
            current.insert(key);
        } else {
            outcome.again = true;
            state.retry_pools.insert(key.0);
        }
    }
    current
}

/// Commits new entries to one pool datacenter's record; the writes sent, or `None` when it
/// did not land (reported here).
///
/// `planned`: the pools the plan the newcomers are served from was made on (the last full
/// pass's).
async fn commit_one(
    ctx: &Arc<Context>,
    key: RecordKey,
    entries: BTreeMap<String, Option<Reservation>>,
    planned: &records::PlannedOn,
) -> (RecordKey, Option<u64>) {
    let Some(pool) = ctx.pools.get(&ObjectRef::new(&key.0)) else {
        return (key, None);
    };
    if !ctx.leader.holds() {
        return (key, None);
    }
    let result = records::commit_changes(ctx, &pool, &key, entries, planned).await;
    let name = crate::resources::record_name(&key.0, &key.1);
    let sent = match result {
        Ok(n) => {
            write_succeeded(ctx, "IPAMPoolRecord", &name);
            Some(n)
        }
        Err(records::CommitError::Api(e)) if is_conflict(&e) || is_not_found(&e) => {
            tracing::info!(record = %name, error = %crate::seed::preconditions::short(&e), "pool record changed under us; planning again");
            ctx.metrics
                .write_failed("IPAMPoolRecord", preconditions::reason(&e));
            None
        }
        Err(records::CommitError::Api(e)) => {
            write_failed(ctx, "IPAMPoolRecord", &name, "patch", &e);
            None
        }
        Err(e @ records::CommitError::PoolsBehind { .. }) => {
            tracing::info!(record = %name, "{e}");
            ctx.metrics.write_failed("IPAMPoolRecord", e.reason());
            None
        }
        Err(e) => {
            ctx.metrics.write_failed("IPAMPoolRecord", e.reason());
            tracing::error!("{e}");
            None
        }
    };
    (key, sent)
}

/// Step "metrics": usage changed in the pools that served the newcomers; their statuses are
/// written now, or with the next ones if statuses were written less than `POOL_STATUS_EVERY`
/// ago.
fn note_usage(state: &mut PassState, added: &[planner::Decision]) {
    state
        .status_due
        .extend(added.iter().map(|d| d.pool.clone()));
    if let Some((_, plan)) = state.previous.as_ref() {
        state.metrics.observe_added(plan, added);
    }
}

/// The newcomers' decisions in the kept plan, now that their writes were made, say they hold
/// what they got (`Keep`), as a plan made afresh would: growth decides on held allocations
/// only, and without this a user cluster the short pass served could not be read or grown by a
/// growth pass until a full pass planned it (at 10,000 clusters, seconds of reading the seed
/// that every refusal meanwhile waited for). A write that did not land asks for a full pass,
/// which plans again and keeps its own plan, before any pass reads this one.
fn settle_newcomers(state: &mut PassState, added: &[planner::Decision]) {
    let Some((_, plan)) = state.previous.as_mut() else {
        return;
    };
    let mut last: Option<&str> = None;
    for d in added {
        if last != Some(d.cluster.as_str()) {
            plan.settle_cluster(&d.cluster);
            last = Some(d.cluster.as_str());
        }
    }
}

/// Starts writing the pool statuses short passes left for later, unless they were written
/// less than `POOL_STATUS_EVERY` ago; returns when they are due otherwise. The writes run on a
/// task of their own, so a cluster arriving meanwhile does not wait for them; a status that
/// does not land asks for a full pass, which writes every pool's status.
pub(super) fn start_statuses(
    ctx: &Arc<Context>,
    state: &mut PassState,
    now: &str,
) -> Option<Duration> {
    if state.status_due.is_empty() {
        return None;
    }
    let wait = state
        .status_written
        .map(|t| POOL_STATUS_EVERY.saturating_sub(t.elapsed()))
        .filter(|d| !d.is_zero());
    if wait.is_some() {
        return wait;
    }
    let (inputs, plan) = state.previous.as_ref()?;
    let due = std::mem::take(&mut state.status_due);
    let pools: Vec<Arc<IPAMPool>> = due
        .iter()
        .filter_map(|p| ctx.pools.get(&ObjectRef::new(p)))
        .collect();
    let updates = statuses::pool_status_updates(
        ctx,
        &pools,
        &inputs.pools,
        &HashMap::new(),
        plan,
        &state.outdated,
        now,
    );
    state.status_written = Some(std::time::Instant::now());
    if updates.is_empty() {
        return None;
    }
    let limit = state.write_concurrency;
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let sent = statuses::send_pool_status(&ctx, updates, limit).await;
        if !sent.failed.is_empty() {
            ctx.dirty.other();
            ctx.dirty.wake();
        }
    });
    None
}

/// A pass with nothing to plan: starts the pool status writes short passes left for later,
/// once they are due (otherwise says when they will be).
pub(super) async fn flush_statuses(ctx: &Arc<Context>, state: &mut PassState) -> PassOutcome {
    let now = crate::resources::now_rfc3339();
    let mut status_after = start_statuses(ctx, state, &now);
    if let Some(wait) = super::growth::wake_in(ctx, state) {
        status_after = Some(status_after.map_or(wait, |s| s.min(wait)));
    }
    PassOutcome {
        status_after,
        ..Default::default()
    }
}
