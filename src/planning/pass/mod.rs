//! One planning pass: read the caches, plan, write the differences (leader only).
//!
//! Every pass plans the whole seed at once from in-memory state — pools and clusters from the
//! watch caches, allocations from the [`Ledger`](super::ledger::Ledger), pool records from
//! [`Records`](super::records::Records) — so creating 1,000 clusters costs a few passes, not a
//! re-list per cluster. The steps, each in its own file:
//!
//! 1. [`inputs`]: the planner's input, confirming with the API server any cluster that holds
//!    addresses but is missing from the cache, and adding what the pool records hold;
//! 2. the plan (pure, `crate::planner`);
//! 3. [`commit`]: the pool records, one compare-and-swap per pool datacenter — the fence;
//! 4. [`allocations`]: the `IPAMAllocation` writes, only where the record is current;
//! 5. [`lifecycle`] and [`statuses`]: finalizers, namespaces, conditions, usage, events.
//!
//! Failed writes are reported ([`report`]) and retried with per-object backoff.

mod allocations;
mod commit;
mod fast;
mod inputs;
mod lifecycle;
mod report;
mod scope;
mod statuses;

pub use scope::PassState;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;

use crate::desired::allocation_object;
use crate::planner::{self};
use crate::planning::metrics::Metrics;
use crate::resources::{Cluster, IPAMAllocation, IPAMPool, ReclaimPolicy, cluster_namespace};
use crate::seed::Context;
use crate::seed::ledger::Key;
use crate::seed::preconditions;

use allocations::{AllocationWrite, WriteDone};
pub(crate) use report::write_failed;
use report::{cluster_reference, due, is_conflict, is_not_found, publish, write_succeeded};

pub use crate::resources::{CLUSTER_FINALIZER, POOL_FINALIZER};

/// Writes a pass sends at once unless `--write-concurrency` says otherwise.
pub const DEFAULT_WRITE_CONCURRENCY: usize = 16;

/// What a pass asks of the loop.
#[derive(Debug, Default)]
pub struct PassOutcome {
    /// Something was stale or failed: run again soon.
    pub again: bool,
    /// The earliest moment a write held back by its backoff may be tried again.
    pub retry_after: Option<Duration>,
    /// Pool statuses a short pass left for later are due then (not a retry: nothing failed).
    pub status_after: Option<Duration>,
    pub writes: u64,
}

/// While new clusters stream in, short passes write the pool statuses (allocation counts,
/// capacity conditions) at most this often; the allocations themselves are never held back.
pub const POOL_STATUS_EVERY: Duration = Duration::from_secs(1);

/// The pass's error: the view could not be completed, so nothing was planned.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("cannot confirm whether cluster {cluster} still exists: {source}")]
    ConfirmCluster {
        cluster: String,
        source: kube::Error,
    },
    #[error("the planner stopped: {0}")]
    Planner(String),
}

/// What is left of an allocation write once it is over: what the report needs.
struct Finished {
    key: Key,
    name: String,
    verb: &'static str,
    cluster: String,
    pool: String,
    datacenter: String,
    /// The write deleted the object.
    release: bool,
    note: Option<allocations::ClusterNote>,
}

impl Finished {
    fn of(job: &AllocationWrite, note: Option<allocations::ClusterNote>) -> Self {
        Finished {
            key: job.key.clone(),
            name: job.name(),
            verb: job.verb(),
            cluster: job.decision.cluster.clone(),
            pool: job.decision.pool.clone(),
            datacenter: job.decision.datacenter.clone(),
            release: job.desired.is_none(),
            note,
        }
    }
}

/// Writes one allocation and keeps what the report needs of it.
async fn write_one(
    ctx: &Context,
    metrics: &Metrics,
    term: u64,
    job: AllocationWrite,
) -> (Finished, Result<WriteDone, kube::Error>) {
    let r = job.execute(ctx, term).await;
    let note = match &r {
        Ok(_) => allocations::allocation_note(metrics, &job),
        Err(_) => None,
    };
    (Finished::of(&job, note), r)
}

/// Runs one pass. The caller checked leadership (in `term`) just before.
pub async fn run(
    ctx: &Arc<Context>,
    term: u64,
    state: &mut PassState,
) -> Result<PassOutcome, PassError> {
    // What the watches saw change, taken before anything is read: whatever changes from now
    // on is left for the next pass.
    let (dirty, dirty_other) = ctx.dirty.take();
    let foreign_changes = ctx.ledger.lock().await.has_changes();
    // Nothing changed, but pool statuses wait: they are written (when due) without planning.
    if !dirty_other
        && dirty.is_empty()
        && !foreign_changes
        && state.can_skip_planning()
        && !state.status_due.is_empty()
    {
        return Ok(fast::flush_statuses(ctx, state).await);
    }
    // Only changed clusters, named: a wake for anything else (a timer, a retry) is a full pass.
    if !dirty_other
        && !dirty.is_empty()
        && !foreign_changes
        && state.can_skip_planning()
        && let Some(result) = fast::run(ctx, term, state, &dirty).await
    {
        return result;
    }
    let limit = state.write_concurrency;
    let mut outcome = PassOutcome::default();
    let started = std::time::Instant::now();
    let mut steps: Vec<(&str, u128)> = Vec::new();
    let mut step = |name: &'static str| steps.push((name, started.elapsed().as_micros()));
    let pools: Vec<Arc<IPAMPool>> = ctx.pools.state();
    let mut clusters: Vec<Arc<Cluster>> = ctx.clusters.state();
    let namespaces: HashSet<String> = ctx
        .namespaces
        .state()
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .map(|n| n.name_any())
        .collect();
    let (stored_objects, ledger_changed) = {
        let mut ledger = ctx.ledger.lock().await;
        (ledger.snapshot(), ledger.take_changed())
    };
    // The records' versions; those that changed are read again into the read cache here, so
    // a pass never copies every record.
    let records = {
        let held = ctx.records.lock().await;
        let versions = held.versions();
        state
            .reads
            .refresh_records(&versions, |key| held.joined(key));
        versions
    };
    let now = crate::resources::now_rfc3339();

    step("snapshot");
    lifecycle::add_finalizers(ctx, &pools, &clusters, limit, &mut outcome).await;
    step("finalizers");

    let gathered = inputs::gather(
        ctx,
        &pools,
        &mut clusters,
        &stored_objects,
        &records,
        &mut state.reads,
    )
    .await;
    let inputs::Inputs {
        pool_inputs,
        pool_errors,
        deleting_pools,
        cluster_inputs,
        cluster_errors,
        stored,
    } = match gathered {
        Ok(i) => i,
        Err(e) => {
            // The changes taken from the ledger are not planned: plan everything next time.
            state.replan_all();
            return Err(e);
        }
    };

    // Planning is CPU work that grows with the seed: it runs on a blocking thread, so the
    // watches, the REST API, the webhook and the lease renewals never wait behind it.
    let plan_inputs = planner::PlanInputs {
        pools: pool_inputs,
        clusters: cluster_inputs,
        stored,
    };
    let mut taken = std::mem::replace(state, PassState::new(limit, state.metrics.clone()));
    let (taken, plan, scope, plan_inputs, ledger_changed) =
        tokio::task::spawn_blocking(move || {
            let (plan, scope) = scope::plan(&mut taken, &plan_inputs, &ledger_changed);
            (taken, plan, scope, plan_inputs, ledger_changed)
        })
        .await
        .map_err(|e| PassError::Planner(e.to_string()))?;
    *state = taken;
    let pool_inputs = &plan_inputs.pools;
    state.metrics.observe_plan(&plan);
    step("plan");

    // Namespaces first: allocations live in them.
    lifecycle::ensure_namespaces(ctx, &clusters, &namespaces, limit, &mut outcome).await;

    let policies: HashMap<&str, ReclaimPolicy> = pool_inputs
        .iter()
        .map(|p| (p.name.as_str(), p.reclaim_policy))
        .chain(deleting_pools.iter().map(|(k, v)| (k.as_str(), *v)))
        .collect();
    // The ledger's snapshot is in key order (namespace, name): an object is found by binary
    // search, without a second index of every allocation.
    let stored_object = |namespace: &str, name: &str| -> Option<IPAMAllocation> {
        stored_objects
            .binary_search_by(|o| (o.namespace(), o.name()).cmp(&(namespace, name)))
            .ok()
            .map(|i| stored_objects[i].to_object())
    };
    let uids: HashMap<String, &Cluster> = clusters
        .iter()
        .map(|c| (c.name_any(), c.as_ref()))
        .collect();

    // Which decisions need a write, remembered by index only: the objects themselves are
    // built again when their write starts, so a burst of 100,000 allocations never holds
    // 100,000 desired objects (and their stored copies) at once.
    let build = |d: &planner::Decision| -> Option<AllocationWrite> {
        let existing = stored_object(&cluster_namespace(&d.cluster), &d.pool);
        let desired = allocation_object(
            d,
            existing.as_ref(),
            policies.get(d.pool.as_str()).copied(),
            &now,
        );
        AllocationWrite::new(d, existing, desired)
    };
    let mut pending: Vec<(usize, bool)> = Vec::new();
    let mut to_write: HashMap<(String, String), std::collections::BTreeSet<String>> =
        HashMap::new();
    for (i, d) in plan.decisions.iter().enumerate() {
        if !scope.checks(d, &ledger_changed) {
            continue;
        }
        if let Some(job) = build(d) {
            let fenced = job.desired.is_some() && !job.is_status_only();
            if fenced {
                to_write
                    .entry((d.pool.clone(), d.datacenter.clone()))
                    .or_default()
                    .insert(d.cluster.clone());
            }
            pending.push((i, fenced));
        }
    }

    step("jobs");
    // Commit the pool records first: one compare-and-swap per pool datacenter that is to get
    // objects written. Only where it succeeded are the objects written.
    let mut write_failures: HashMap<String, Vec<String>> = HashMap::new();
    let committed = commit::commit_records(
        ctx,
        &pools,
        pool_inputs,
        &scope,
        &plan,
        &stored_objects,
        &records,
        &to_write,
        limit,
        &mut state.retry_pools,
        &mut outcome,
    )
    .await;
    step("records");
    let mut allowed = Vec::new();
    for (i, fenced) in pending {
        let d = &plan.decisions[i];
        let record = (d.pool.clone(), d.datacenter.clone());
        if fenced && !committed.contains(&record) {
            outcome.again = true;
            state.retry_pools.insert(d.pool.clone());
            continue;
        }
        let name = format!("{}/{}", cluster_namespace(&d.cluster), d.pool);
        if !due(ctx, "IPAMAllocation", &name) {
            outcome.again = true;
            state.retry_pools.insert(d.pool.clone());
            continue;
        }
        allowed.push(i);
    }

    // Allocation writes, in parallel; each result goes into the ledger at once. A job is built
    // when its write starts and reduced to what the report needs when it ends.
    let build = &build;
    let decisions = &plan.decisions;
    let metrics = &*state.metrics.clone();
    // Each result is taken as it comes instead of being collected: a burst pass may write
    // 100,000 objects.
    let mut results =
        futures::stream::iter(allowed.into_iter().filter_map(|i| build(&decisions[i])))
            .map(|job| write_one(ctx, metrics, term, job))
            .buffer_unordered(limit);
    let mut notes: BTreeMap<String, Vec<allocations::ClusterNote>> = BTreeMap::new();
    let mut stale: Vec<Key> = Vec::new();
    while let Some((job, result)) = results.next().await {
        match result {
            Ok(done) => {
                outcome.writes += done.writes;
                write_succeeded(ctx, "IPAMAllocation", &job.name);
                if job.release {
                    // A release: the next pass trims the pool record once no object shows
                    // the addresses any more.
                    state.retry_pools.insert(job.pool.clone());
                    outcome.again = true;
                }
                if let Some(note) = job.note {
                    notes.entry(job.cluster.clone()).or_default().push(note);
                }
            }
            Err(e) if is_conflict(&e) || is_not_found(&e) => {
                tracing::info!(cluster = %job.cluster, pool = %job.pool, datacenter = %job.datacenter, error = %e, "stale view of an allocation; re-reading");
                ctx.metrics
                    .write_failed("IPAMAllocation", preconditions::reason(&e));
                stale.push(job.key);
                state.retry_pools.insert(job.pool.clone());
                outcome.again = true;
            }
            Err(e) => {
                let message = write_failed(ctx, "IPAMAllocation", &job.name, job.verb, &e);
                state.retry_pools.insert(job.pool.clone());
                outcome.again = true;
                notes
                    .entry(job.cluster.clone())
                    .or_default()
                    .push(allocations::ClusterNote {
                        warning: true,
                        reason: "WriteFailed".into(),
                        note: format!("IPAMAllocation {}: {message}", job.name),
                    });
                write_failures
                    .entry(job.cluster.clone())
                    .or_default()
                    .push(format!("IPAMAllocation {}: {message}", job.name));
            }
        }
    }

    drop(results);
    // Re-read once every write is over, as before any result was taken one by one.
    for key in &stale {
        allocations::refresh(ctx, key).await;
    }

    step("allocations");
    allocations::publish_cluster_events(ctx, notes, &uids, limit).await;

    lifecycle::release_finalizers(ctx, &pools, &clusters, &mut outcome).await;
    let checked: Vec<Arc<Cluster>> = clusters
        .iter()
        .filter(|c| {
            let name = c.name_any();
            scope.covers_cluster(&name) || write_failures.contains_key(&name)
        })
        .cloned()
        .collect();
    let unwritten = statuses::write_cluster_status(
        ctx,
        &checked,
        &plan.decisions,
        &cluster_errors,
        &write_failures,
        &now,
        limit,
        &mut outcome,
    )
    .await;
    state.retry_clusters.extend(unwritten);
    step("cluster status");
    statuses::write_pool_status(
        ctx,
        &pools,
        pool_inputs,
        &pool_errors,
        &plan,
        &now,
        limit,
        &mut outcome,
    )
    .await;
    // Every pool's status was just brought up to date.
    state.status_due.clear();
    step("pool status");
    tracing::debug!(
        full = scope.is_full(),
        pools = scope.pools.as_ref().map_or(0, |p| p.len()),
        writes = outcome.writes,
        "pass steps (µs since start): {steps:?}"
    );
    state.keep(plan_inputs, plan);
    // Somebody else changed an allocation while this pass was writing it (its watch event
    // woke nobody then): look again at once.
    if ctx.ledger.lock().await.has_changes() {
        outcome.again = true;
    }
    outcome.retry_after = ctx.backoff.lock().ok().and_then(|b| b.next_due());
    state.unsettled = outcome.again || outcome.retry_after.is_some();
    Ok(outcome)
}
