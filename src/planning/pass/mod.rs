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
mod claims;
mod commit;
mod fast;
mod growth;
mod inputs;
mod lifecycle;
mod pipeline;
mod regrow;
mod report;
mod scope;
mod statuses;

pub use scope::PassState;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use crate::desired::allocation_object;
use crate::planner::{self};
use crate::planning::metrics::Metrics;
use crate::resources::{Cluster, IPAMAllocation, IPAMPool, ReclaimPolicy, cluster_namespace};
use crate::seed::Context;
use crate::seed::ledger::{Entry, Key};
use crate::seed::preconditions;
use crate::seed::records::RecordKey;

use allocations::{AllocationWrite, WriteDone};
pub(crate) use report::write_failed;
use report::{cluster_reference, due, is_conflict, is_not_found, publish, write_succeeded};

pub use crate::resources::{CLUSTER_FINALIZER, POOL_FINALIZER};

/// Writes a pass sends at once unless `--write-concurrency` says otherwise.
pub const DEFAULT_WRITE_CONCURRENCY: usize = 64;

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
    #[error(
        "cannot confirm whether cluster {cluster} still exists: {}",
        preconditions::short(source)
    )]
    ConfirmCluster {
        cluster: String,
        source: kube::Error,
    },
    #[error("the planner stopped: {0}")]
    Planner(String),
    /// A layout record could not be brought up to the pools (another writer, or a view of
    /// the pools older than a layout record's): planned again once it is.
    #[error("layout records not brought up to the pools: {0}")]
    Layout(String),
}

/// What is left of an allocation write once it is over: what the report needs.
struct Finished {
    key: Key,
    name: String,
    verb: &'static str,
    cluster: String,
    pool: String,
    datacenter: String,
    /// The write deleted the object, or took addresses (or a datacenter) off it: the record
    /// holds what it showed until a later pass trims it.
    gives_up: bool,
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
            gives_up: job.gives_up(),
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
///
/// Reads as its steps: what changed decides between the growth pass ([`regrow`]), the status
/// flush, the short pass for new clusters ([`fast`]) and the full pass ([`full`]).
pub async fn run(
    ctx: &Arc<Context>,
    term: u64,
    state: &mut PassState,
) -> Result<PassOutcome, PassError> {
    // Every write already due is retried by this pass if it is still wanted; one that is not
    // (its cluster or pool is gone) must not keep asking for another pass.
    if let Ok(mut backoff) = ctx.backoff.lock() {
        backoff.start_round();
    }
    let changed = Changed::take(ctx).await;
    let growth_due = growth::due(ctx, state);
    if changed.nothing()
        && state.can_skip_planning()
        && growth_due
        && let Some(result) = regrow::run(ctx, term, state).await
    {
        // Only the demand changed (or a growth timer came due): growth is decided on the
        // kept plan, without reading or planning the rest of the seed.
        state.metrics.pass_kind("growth");
        return result;
    }
    if changed.nothing() && state.can_skip_planning() && !state.status_due.is_empty() && !growth_due
    {
        // Nothing changed, but pool statuses wait: they are written (when due) without
        // planning.
        state.metrics.pass_kind("statuses");
        return Ok(fast::flush_statuses(ctx, state).await);
    }
    if changed.only_clusters() && state.can_skip_planning() {
        // Machines' claims are named by their holder name (`claim/<ns>/<name>`): a short pass
        // serves either new clusters or new claims; both at once take the full pass.
        let (claims, clusters): (BTreeSet<String>, BTreeSet<String>) = changed
            .clusters
            .iter()
            .cloned()
            .partition(|n| crate::resources::capi::claim_of_holder(n).is_some());
        let short = if clusters.is_empty() {
            fast::run_claims(ctx, term, state, &claims).await
        } else if claims.is_empty() {
            fast::run(ctx, term, state, &clusters).await
        } else {
            None
        };
        if let Some(result) = short {
            state.metrics.pass_kind("new");
            if growth_due {
                // The growth decision is the next pass's: new clusters do not wait for it.
                ctx.dirty.wake();
            }
            return result;
        }
    }
    if changed.nothing()
        && state.can_skip_planning()
        && !growth_due
        && state.status_due.is_empty()
        && !timers_due(state)
    {
        // A wake that finds nothing to do (one wake noted while a pass ran, taken after
        // it): every change marks what it concerns, a release that frees addresses marks
        // everything, a retry leaves the state unsettled. Nothing is read or planned.
        state.metrics.pass_kind("idle");
        return Ok(settle(ctx, state, PassOutcome::default()).await);
    }
    tracing::debug!(
        other = changed.other,
        foreign = changed.foreign,
        clusters = changed.clusters.len(),
        settled = state.can_skip_planning(),
        growth_due,
        "full pass"
    );
    full(ctx, term, state).await
}

/// A timer of the last plan came due: a quarantine ended, or the grace of a hand-made
/// `IPAddress`'s entry. The full pass looks again (`settle` set the wake-up for it).
fn timers_due(state: &PassState) -> bool {
    let now = inputs::unix_now();
    let quarantine = state
        .previous
        .as_ref()
        .and_then(|(inputs, plan)| quarantine_end(inputs, plan))
        .is_some_and(|end| end <= now);
    quarantine || state.reads.hand_made_due().is_some_and(|due| due <= now)
}

/// The full pass: the whole seed read, the part a change concerns planned again (everything
/// on a resync), the pool records committed, then objects, events and statuses written.
async fn full(
    ctx: &Arc<Context>,
    term: u64,
    state: &mut PassState,
) -> Result<PassOutcome, PassError> {
    let limit = state.write_concurrency;
    let mut outcome = PassOutcome::default();
    let mut steps = Steps::start();
    // Read before the demand is taken: a change from now on asks for another decision.
    let growth_generation = ctx.demand.generation();

    let mut view = View::read(ctx, state).await;
    steps.done("snapshot");
    // Every pool datacenter's layout record up to the pools as read, before anything is
    // planned on them: a pool narrowed stays fenced over where it reached
    // (`records::keep_layout`). Refused or conflicting: the pass is tried again.
    {
        let planned =
            crate::planning::records::PlannedOn::pools(view.pools.iter().map(|p| p.as_ref()));
        if let Err(e) = crate::planning::records::keep_layouts(ctx, &view.pools, &planned).await {
            return Err(PassError::Layout(e.to_string()));
        }
    }

    let gathered = gather(ctx, state, &mut view).await?;
    let ledger_changed = std::mem::take(&mut view.ledger_changed);
    let mut planned = plan(state, gathered.plan_inputs, ledger_changed).await?;
    // Growth, decided on this plan (the kept allocators hold everything, whatever part of
    // the seed was planned again); what it changed is checked and written like the rest.
    let grown = {
        let stored = &view.stored_objects;
        let by_name = |name: &str| ctx.clusters.get(&ObjectRef::new(name));
        let recorded = |cluster: &str, pool: &str| growth::recorded_pieces(stored, cluster, pool);
        let reads = growth::Reads {
            pools: &view.pools,
            inputs: &planned.inputs.pools,
            cluster: &by_name,
            recorded: &recorded,
        };
        growth::step(ctx, &mut planned.plan, &mut state.states, &reads)
    };
    growth::decided(state, growth_generation, &grown);
    for (cluster, pool) in grown.pieces.keys() {
        planned.scope.add_changed(cluster, pool);
    }
    // Clusters whose demand reader's word changed: their `GrowthDemandReadable` condition.
    let demand = ctx.demand.states();
    for name in demand_changed(&state.demand_seen, &demand) {
        planned.scope.clusters.insert(name);
    }
    state.demand_seen = demand.clone();
    state.metrics.pass_kind(if planned.scope.is_full() {
        "whole"
    } else {
        "partial"
    });
    state.metrics.observe_plan(&planned.plan);
    steps.done("plan");

    let mut writes = Writes::new(
        &view.stored_objects,
        &planned.inputs.pools,
        &gathered.deleting_pools,
        &view.now,
    );
    writes.pieces = Some(&grown.pieces);
    writes.adoption = Some(&gathered.adoption);
    let mut jobs = writes.select(&planned);
    for (record, holders) in claims::to_create(&planned.plan, &gathered.claims) {
        jobs.to_write.entry(record).or_default().extend(holders);
    }
    let chains = chains_of(&view, &planned, &jobs.pending, &gathered.adoption);
    steps.done("jobs");

    // The record commits (the fence: one compare-and-swap per pool datacenter that is to get
    // objects written) run beside every cluster's chain of writes — finalizer and namespace,
    // then allocations once their commit landed, then status — all sharing the pass's write
    // slots (`pipeline`).
    let slots = pipeline::Slots::new(limit);
    let landing = pipeline::Landing::new();
    let of_holder = pipeline::by_holder(&planned.plan.decisions);
    let build = |d: &planner::Decision| writes.build(d);
    let metrics = state.metrics.clone();
    let env = pipeline::Env {
        ctx,
        term,
        metrics: &metrics,
        slots: &slots,
        landing: &landing,
        decisions: &planned.plan.decisions,
        of_holder: &of_holder,
        build: &build,
        errors: &gathered.cluster_errors,
        demand: &demand,
        adoption: &gathered.adoption,
        now: &view.now,
    };
    let mut retry_pools = BTreeSet::new();
    let (mut commit_outcome, mut pool_outcome) = (PassOutcome::default(), PassOutcome::default());
    let (committed, done, _) = tokio::join!(
        async {
            let committed = commit::commit_records(
                ctx,
                &view.pools,
                &planned.inputs.pools,
                &planned.scope,
                &planned.plan,
                &view.stored_objects,
                &view.records,
                &jobs.to_write,
                &gathered.hand_made,
                limit,
                &mut retry_pools,
                &mut commit_outcome,
                &landing,
            )
            .await;
            landing.over();
            committed
        },
        pipeline::run(&env, chains, 2 * limit),
        lifecycle::add_finalizers(ctx, &view.pools, &[], limit, &mut pool_outcome),
    );
    for o in [commit_outcome, pool_outcome, done.outcome] {
        outcome.writes += o.writes;
        outcome.again |= o.again;
    }
    state.retry_pools.extend(retry_pools);
    state.retry_pools.extend(done.retry_pools);
    state.retry_clusters.extend(done.retry_clusters);
    // Re-read once every write is over.
    for key in &done.stale {
        allocations::refresh(ctx, key).await;
    }
    steps.done("clusters");

    claims::write(
        ctx,
        term,
        &planned.plan,
        &gathered.claims,
        &committed,
        &view.pools,
        &planned.inputs.pools,
        &view.now,
        limit,
        &mut outcome,
    )
    .await;
    steps.done("claims");

    let mut notes = done.notes;
    growth::report_refusals(ctx, state, &grown, &mut notes);
    adoption_notes(&view.clusters, &gathered.adoption, &mut notes);
    if let Some(due) = grown.next_due {
        outcome.status_after = Some(outcome.status_after.map_or(due, |s| s.min(due)));
    }
    allocations::publish_cluster_events(ctx, notes, &view.uids(), limit).await;
    lifecycle::release_finalizers(ctx, &view.pools, &view.clusters, &mut outcome).await;
    steps.done("events");
    // Counted here, over every claim's `IPAddress`, and kept for the short passes' pool
    // statuses: they write no `IPAddress` that changes the count (a pool's network edit or an
    // `IPAddress` deleted brings a full pass), and a walk over thousands of objects once a
    // second is what a new claim would wait behind.
    state.outdated = claims::outdated_addresses(ctx, &view.pools, &planned.inputs.pools);
    statuses::write_pool_status(
        ctx,
        &view.pools,
        &planned.inputs.pools,
        &gathered.pool_errors,
        &planned.plan,
        &state.outdated,
        &view.now,
        limit,
        &mut outcome,
    )
    .await;
    // Every pool's status was just brought up to date.
    state.status_due.clear();
    steps.done("pool status");

    tracing::debug!(
        full = planned.scope.is_full(),
        pools = planned.scope.pools.as_ref().map_or(0, |p| p.len()),
        writes = outcome.writes,
        "pass steps (µs since start): {:?}",
        steps.0
    );
    let planned_on =
        crate::planning::records::PlannedOn::pools(view.pools.iter().map(|p| p.as_ref()));
    state.keep(planned.inputs, planned.plan, planned_on);
    Ok(settle(ctx, state, outcome).await)
}

/// What the watches saw change since the last pass, taken before anything is read: whatever
/// changes from now on is left for the next pass.
struct Changed {
    /// Clusters whose planned content changed, by name.
    clusters: BTreeSet<String>,
    /// Anything else (a pool, a namespace, a deletion, a re-list, a watch error).
    other: bool,
    /// Somebody else changed an allocation.
    foreign: bool,
}

impl Changed {
    async fn take(ctx: &Context) -> Changed {
        let (clusters, other) = ctx.dirty.take();
        let foreign = ctx.ledger.lock().await.has_changes();
        Changed {
            clusters,
            other,
            foreign,
        }
    }

    fn nothing(&self) -> bool {
        !self.other && self.clusters.is_empty() && !self.foreign
    }

    /// Only clusters changed, each named: a wake for anything else (a timer, a retry) is a
    /// full pass.
    fn only_clusters(&self) -> bool {
        !self.other && !self.clusters.is_empty() && !self.foreign
    }
}

/// When each step of a pass ended, for the debug log.
struct Steps(Vec<(&'static str, u128)>, std::time::Instant);

impl Steps {
    fn start() -> Steps {
        Steps(Vec::new(), std::time::Instant::now())
    }

    fn done(&mut self, step: &'static str) {
        self.0.push((step, self.1.elapsed().as_micros()));
    }
}

/// Step "snapshot": what a full pass reads of the caches, the ledger and the pool records.
struct View {
    pools: Vec<Arc<IPAMPool>>,
    clusters: Vec<Arc<Cluster>>,
    /// kipam's namespaces that are not being deleted.
    namespaces: HashSet<String>,
    /// Every allocation in the ledger, in key order (namespace, name).
    stored_objects: Vec<Arc<Entry>>,
    /// The allocations that changed since the last pass took them.
    ledger_changed: BTreeSet<Key>,
    /// The records' versions.
    records: BTreeMap<RecordKey, String>,
    now: String,
}

impl View {
    async fn read(ctx: &Context, state: &mut PassState) -> View {
        let namespaces = ctx
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
        // The records that changed are read again into the read cache here, so a pass never
        // copies every record.
        let records = {
            let held = ctx.records.lock().await;
            let versions = held.versions();
            state
                .reads
                .refresh_records(&versions, |key| held.joined(key));
            versions
        };
        View {
            pools: ctx.pools.state(),
            clusters: ctx.clusters.state(),
            namespaces,
            stored_objects,
            ledger_changed,
            records,
            now: crate::resources::now_rfc3339(),
        }
    }

    /// The clusters by name.
    fn uids(&self) -> HashMap<String, &Cluster> {
        self.clusters
            .iter()
            .map(|c| (c.name_any(), c.as_ref()))
            .collect()
    }
}

/// Step "inputs": what [`inputs::gather`] made of the view, the planner's part bundled.
struct Gathered {
    plan_inputs: planner::PlanInputs,
    pool_errors: HashMap<String, Vec<crate::validation::FieldError>>,
    deleting_pools: HashMap<String, ReclaimPolicy>,
    cluster_errors: HashMap<String, Vec<crate::validation::FieldError>>,
    claims: claims::ClaimsRead,
    hand_made: inputs::HandMadeEntries,
    adoption: crate::planner::adopt::AdoptionPlan,
}

async fn gather(
    ctx: &Arc<Context>,
    state: &mut PassState,
    view: &mut View,
) -> Result<Gathered, PassError> {
    let gathered = inputs::gather(
        ctx,
        &view.pools,
        &mut view.clusters,
        &view.stored_objects,
        &view.records,
        &mut state.reads,
    )
    .await;
    match gathered {
        Ok(i) => Ok(Gathered {
            plan_inputs: planner::PlanInputs {
                pools: i.pool_inputs,
                clusters: i.cluster_inputs,
                stored: i.stored,
                quarantined: i.quarantined,
                now: inputs::unix_now(),
                held_elsewhere: i.held_elsewhere,
            },
            pool_errors: i.pool_errors,
            deleting_pools: i.deleting_pools,
            cluster_errors: i.cluster_errors,
            claims: i.claims,
            hand_made: i.hand_made,
            adoption: i.adoption,
        }),
        Err(e) => {
            // The changes taken from the ledger are not planned: plan everything next time.
            state.replan_all();
            Err(e)
        }
    }
}

/// Step "plan": its inputs, the plan and what it covers.
struct Planned {
    inputs: planner::PlanInputs,
    plan: planner::Plan,
    scope: scope::Scope,
    ledger_changed: BTreeSet<Key>,
}

/// Plans the part of the seed a change concerns ([`scope::plan`]). Planning is CPU work that
/// grows with the seed: it runs on a blocking thread, so the watches, the REST API, the
/// webhook and the lease renewals never wait behind it.
async fn plan(
    state: &mut PassState,
    inputs: planner::PlanInputs,
    ledger_changed: BTreeSet<Key>,
) -> Result<Planned, PassError> {
    let fresh = PassState::new(state.write_concurrency, state.metrics.clone());
    let mut taken = std::mem::replace(state, fresh);
    let (taken, planned) = tokio::task::spawn_blocking(move || {
        let (plan, scope) = scope::plan(&mut taken, &inputs, &ledger_changed);
        let planned = Planned {
            inputs,
            plan,
            scope,
            ledger_changed,
        };
        (taken, planned)
    })
    .await
    .map_err(|e| PassError::Planner(e.to_string()))?;
    *state = taken;
    Ok(planned)
}

/// Builds the `IPAMAllocation` write a decision asks for, when that write starts: a burst of
/// 100,000 allocations never holds 100,000 desired objects (and their stored copies) at once.
struct Writes<'a> {
    /// The ledger's snapshot, in key order: an object is found by binary search, without a
    /// second index of every allocation.
    stored: &'a [Arc<Entry>],
    policies: HashMap<&'a str, ReclaimPolicy>,
    now: &'a str,
    /// What the growth step says `status.pieces` should be, by (cluster, pool).
    pieces: Option<&'a HashMap<(String, String), Vec<crate::resources::PieceStatus>>>,
    /// The adoption plan: a new allocation of a cluster taking over a hand-made MetalLB pool
    /// names that pool.
    adoption: Option<&'a crate::planner::adopt::AdoptionPlan>,
}

/// Step "jobs": the decisions that need a write, by index, and which of them the fence
/// covers; and the clusters each pool datacenter is to get objects written for.
struct Jobs {
    pending: Vec<(usize, bool)>,
    to_write: HashMap<RecordKey, BTreeSet<String>>,
}

impl<'a> Writes<'a> {
    fn new(
        stored: &'a [Arc<Entry>],
        pools: &'a [planner::PoolInput],
        deleting: &'a HashMap<String, ReclaimPolicy>,
        now: &'a str,
    ) -> Self {
        let policies = pools
            .iter()
            .map(|p| (p.name.as_str(), p.reclaim_policy))
            .chain(deleting.iter().map(|(k, v)| (k.as_str(), *v)))
            .collect();
        Writes {
            stored,
            policies,
            now,
            pieces: None,
            adoption: None,
        }
    }

    fn stored_object(&self, namespace: &str, name: &str) -> Option<IPAMAllocation> {
        self.stored
            .binary_search_by(|o| (o.namespace(), o.name()).cmp(&(namespace, name)))
            .ok()
            .map(|i| self.stored[i].to_object())
    }

    fn build(&self, d: &planner::Decision) -> Option<AllocationWrite> {
        let existing = self.stored_object(&cluster_namespace(&d.cluster), &d.pool);
        let mut desired = allocation_object(
            d,
            existing.as_ref(),
            self.policies.get(d.pool.as_str()).copied(),
            self.now,
        );
        if let (Some(obj), Some(pieces)) = (
            desired.as_mut(),
            self.pieces
                .and_then(|p| p.get(&(d.cluster.clone(), d.pool.clone()))),
        ) && d.change != planner::Change::Conflict
        {
            obj.status.get_or_insert_with(Default::default).pieces = pieces.clone();
        }
        // Set once, on the object that adoption creates; kept with the rest of its metadata
        // afterwards (the rendering keeps taking the same MetalLB pool over).
        if existing.is_none()
            && let Some(obj) = desired.as_mut()
            && let Some(t) = self
                .adoption
                .and_then(|a| a.get(&d.cluster))
                .and_then(|a| a.takeover.get(&d.pool))
        {
            let annotations = obj
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            annotations.insert(
                crate::resources::ANNOTATION_METALLB_POOL.into(),
                t.metallb_pool.clone(),
            );
            if !t.kept.is_empty() {
                annotations.insert(
                    crate::resources::ANNOTATION_METALLB_KEPT.into(),
                    t.kept.join(","),
                );
            }
        }
        AllocationWrite::new(d, existing, desired)
    }

    fn select(&self, planned: &Planned) -> Jobs {
        let mut jobs = Jobs {
            pending: Vec::new(),
            to_write: HashMap::new(),
        };
        for (i, d) in planned.plan.decisions.iter().enumerate() {
            // Machines' claims get `IPAddress`es (`claims`), not `IPAMAllocation`s.
            if crate::resources::capi::claim_of_holder(&d.cluster).is_some() {
                continue;
            }
            if !planned.scope.checks(d, &planned.ledger_changed) {
                continue;
            }
            if let Some(job) = self.build(d) {
                let fenced = job.desired.is_some() && !job.is_status_only();
                if fenced {
                    jobs.to_write
                        .entry((d.pool.clone(), d.datacenter.clone()))
                        .or_default()
                        .insert(d.cluster.clone());
                }
                jobs.pending.push((i, fenced));
            }
        }
        jobs
    }
}

/// Step "jobs", per cluster: what each cluster's chain writes — its finalizer and namespace
/// where missing, the objects of its decisions in `pending`, and its status where the plan
/// covers it — in name order; holders gone from the cache get a chain for their releases.
fn chains_of(
    view: &View,
    planned: &Planned,
    pending: &[(usize, bool)],
    adoption: &crate::planner::adopt::AdoptionPlan,
) -> Vec<pipeline::Chain> {
    let mut chains: BTreeMap<String, pipeline::Chain> = BTreeMap::new();
    for c in &view.clusters {
        let name = c.name_any();
        let mut chain = pipeline::Chain::of(name.clone(), Some(c.clone()));
        chain.finalize = lifecycle::needs_finalizer(c);
        chain.namespace = lifecycle::needs_namespace(c, |ns| view.namespaces.contains(ns));
        // A cluster being adopted is looked at on every pass: what its user cluster serves
        // may change without anything to plan.
        chain.status = planned.scope.covers_cluster(&name) || adoption.get(&name).is_some();
        chains.insert(name, chain);
    }
    for &(i, _) in pending {
        let holder = &planned.plan.decisions[i].cluster;
        chains
            .entry(holder.clone())
            .or_insert_with(|| pipeline::Chain::of(holder.clone(), None))
            .jobs
            .push(i);
    }
    chains.into_values().filter(|c| c.has_work()).collect()
}

/// An event for every cluster whose adoption moved on (its `Adopted` condition is about to
/// change): a warning when it needs a look, naming the other clusters and the addresses.
fn adoption_notes(
    clusters: &[Arc<Cluster>],
    adoption: &crate::planner::adopt::AdoptionPlan,
    notes: &mut BTreeMap<String, Vec<allocations::ClusterNote>>,
) {
    if adoption.clusters.is_empty() {
        return;
    }
    for c in clusters {
        let name = c.name_any();
        let Some(a) = adoption.get(&name) else {
            continue;
        };
        let (_, reason, message) = crate::status::adoption_condition(a);
        let shown = c
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|x| x.type_ == "Adopted"));
        if shown.is_some_and(|x| x.reason == reason && x.message == message) {
            continue;
        }
        notes
            .entry(name)
            .or_default()
            .push(allocations::ClusterNote {
                warning: reason == "NeedsLook",
                reason: format!("Adoption{reason}"),
                note: message,
            });
    }
}

/// The clusters whose entry in the demand reader's word (read or not, and why) differs
/// between `before` and `now`.
fn demand_changed(
    before: &BTreeMap<String, Option<String>>,
    now: &BTreeMap<String, Option<String>>,
) -> Vec<String> {
    let mut out: Vec<String> = now
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(before.keys().filter(|k| !now.contains_key(*k)).cloned());
    out
}

/// The end of every pass: whether to run again soon, and when a held-back write is due.
async fn settle(ctx: &Context, state: &mut PassState, mut outcome: PassOutcome) -> PassOutcome {
    // Somebody else changed an allocation while this pass was writing it (its watch event
    // woke nobody then): look again at once.
    if ctx.ledger.lock().await.has_changes() {
        outcome.again = true;
    }
    outcome.retry_after = ctx.backoff.lock().ok().and_then(|b| b.next_due());
    state.unsettled = outcome.again || outcome.retry_after.is_some();
    // A quarantine that ends frees its addresses (clusters may be waiting for them): the next
    // pass comes by then, not only at the resync. Not a retry: nothing failed.
    if let Some((inputs, plan)) = &state.previous
        && let Some(wait) = next_quarantine_end(inputs, plan, inputs::unix_now())
    {
        outcome.status_after = Some(outcome.status_after.map_or(wait, |s| s.min(wait)));
    }
    // Growth is decided again when its timer comes due, whichever pass took the wake-up
    // meant for it.
    if let Some(wait) = growth::wake_in(ctx, state) {
        outcome.status_after = Some(outcome.status_after.map_or(wait, |s| s.min(wait)));
    }
    // A hand-made `IPAddress`'s entry kept for its grace is looked at again when it ends.
    if let Some(due) = state.reads.hand_made_due() {
        let seconds = u64::try_from(due.saturating_sub(inputs::unix_now())).unwrap_or(0);
        let wait = Duration::from_secs(seconds.max(1));
        outcome.status_after = Some(outcome.status_after.map_or(wait, |s| s.min(wait)));
    }
    outcome
}

/// How long until the first quarantine of `plan` ends (at least a second), if it keeps any.
fn next_quarantine_end(
    inputs: &planner::PlanInputs,
    plan: &planner::Plan,
    now: i64,
) -> Option<Duration> {
    let end = quarantine_end(inputs, plan)?;
    let seconds = u64::try_from(end.saturating_sub(now)).unwrap_or(0).max(1);
    Some(Duration::from_secs(seconds))
}

/// When the first quarantine of `plan` ends (seconds since the epoch), if it keeps any.
fn quarantine_end(inputs: &planner::PlanInputs, plan: &planner::Plan) -> Option<i64> {
    if plan.quarantined.is_empty() {
        return None;
    }
    let pools: HashMap<&str, &planner::PoolInput> =
        inputs.pools.iter().map(|p| (p.name.as_str(), p)).collect();
    plan.quarantined
        .iter()
        .filter_map(|q| {
            let reuse = pools
                .get(q.pool.as_str())?
                .datacenters
                .get(&q.datacenter)?
                .reuse_after;
            Some(q.until(reuse))
        })
        .min()
}
