//! The growth pass: growth decided on the kept plan when only the demand changed.
//!
//! A Service that MetalLB refused, a Service gone, a timer of the last decision come due:
//! none of these changes anything the planner reads, so nothing needs planning again. When
//! the watches saw nothing else change, no write waits for a retry and the last plan is at
//! hand, this pass takes the demand, decides growth on the kept plan and takes each growth
//! from the allocator the last plan left for its pool datacenter ([`growth::step`], as the
//! full pass does). Then the usual fence: the grown entries are committed to the pool records
//! (compare-and-swap) before any object showing them is written. A piece given back is only
//! written out of its object here; its record entry is trimmed by the full pass that writing
//! it asks for, as for every release.
//!
//! It declines, and the full pass runs, when a cluster whose holdings growth looks at changed
//! or is being adopted, or when a pool datacenter involved shares its addresses with another
//! pool, refuses new addresses, or has no usable kept allocator.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;

use super::*;
use crate::planning::records::RecordKey;
use crate::reservations;
use crate::resources::Reservation;
use crate::validation;

/// Runs the growth pass if it applies; `None` when the full pass must run (nothing was done,
/// and the demand was not taken).
pub(super) async fn run(
    ctx: &Arc<Context>,
    term: u64,
    state: &mut PassState,
) -> Option<Result<PassOutcome, PassError>> {
    let mut steps = Steps::start();
    let limit = state.write_concurrency;
    // Read before the demand is taken: a change from now on asks for another decision.
    let generation = ctx.demand.generation();
    let pools = ctx.pools.state();
    let demand = ctx.demand.states();
    let clusters = involved(ctx, state, &pools, &demand)?;
    steps.done("check");

    // What the involved clusters' objects show, in key order, read once.
    let stored: Vec<Arc<Entry>> = {
        let ledger = ctx.ledger.lock().await;
        let mut out: Vec<Arc<Entry>> = clusters
            .iter()
            .flat_map(|c| ledger.in_namespace(&cluster_namespace(&c.name_any())))
            .collect();
        out.sort_by(|a, b| (a.namespace(), a.name()).cmp(&(b.namespace(), b.name())));
        out
    };
    let by_name: HashMap<String, Arc<Cluster>> =
        clusters.iter().map(|c| (c.name_any(), c.clone())).collect();
    let grown = {
        let PassState {
            previous, states, ..
        } = &mut *state;
        let (inputs, plan) = previous.as_mut()?;
        let cluster = |name: &str| by_name.get(name).cloned();
        let recorded = |c: &str, p: &str| growth::recorded_pieces(&stored, c, p);
        let reads = growth::Reads {
            pools: &pools,
            inputs: &inputs.pools,
            cluster: &cluster,
            recorded: &recorded,
        };
        growth::step(ctx, plan, states, &reads)
    };
    growth::decided(state, generation, &grown);
    steps.done("decide");

    // Every decision of the clusters whose growth holdings got news, for their statuses; the
    // objects of those holdings are checked (and written when they differ).
    let (decisions, jobs) = {
        let (_, plan) = state.previous.as_ref()?;
        let mut decisions = Vec::new();
        let mut jobs: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        // Those whose demand reader's word changed too: their `GrowthDemandReadable`.
        let changed = demand_changed(&state.demand_seen, &demand);
        let holders: std::collections::BTreeSet<&str> = grown
            .pieces
            .keys()
            .map(|(c, _)| c.as_str())
            .chain(changed.iter().map(String::as_str))
            .filter(|c| by_name.contains_key(*c))
            .collect();
        for name in holders {
            let first = plan
                .decisions
                .partition_point(|d| d.cluster.as_str() < name);
            for d in plan.decisions[first..]
                .iter()
                .take_while(|d| d.cluster == name)
            {
                if grown
                    .pieces
                    .contains_key(&(d.cluster.clone(), d.pool.clone()))
                {
                    jobs.entry(d.cluster.clone())
                        .or_default()
                        .push(decisions.len());
                }
                decisions.push(d.clone());
            }
            jobs.entry(name.to_string()).or_default();
        }
        (decisions, jobs)
    };
    let changes = entries_of(&decisions, &stored);
    let no_deleting = HashMap::new();
    let mut outcome = PassOutcome::default();
    let now = crate::resources::now_rfc3339();
    let done = {
        let inputs = state
            .previous
            .as_ref()
            .map(|(inputs, _)| inputs.pools.as_slice())
            .unwrap_or_default();
        let mut writes = Writes::new(&stored, inputs, &no_deleting, &now);
        writes.pieces = Some(&grown.pieces);
        let build = |d: &planner::Decision| writes.build(d);
        let chains: Vec<pipeline::Chain> = jobs
            .into_iter()
            .filter_map(|(name, jobs)| {
                let cluster = by_name.get(&name)?.clone();
                let mut chain = pipeline::Chain::of(name, Some(cluster));
                chain.jobs = jobs;
                chain.status = true;
                Some(chain)
            })
            .collect();
        let of_holder = pipeline::by_holder(&decisions);
        let no_errors = HashMap::new();
        let no_adoption = Default::default();
        let metrics = state.metrics.clone();
        let slots = pipeline::Slots::new(limit);
        let landing = pipeline::Landing::new();
        let env = pipeline::Env {
            ctx,
            term,
            metrics: &metrics,
            slots: &slots,
            landing: &landing,
            decisions: &decisions,
            of_holder: &of_holder,
            build: &build,
            errors: &no_errors,
            demand: &demand,
            // No cluster being adopted takes this pass (`involved`).
            adoption: &no_adoption,
            now: &now,
        };
        let planned = state.planned_on.clone();
        let (committed, done) = tokio::join!(
            fast::commit_landing(ctx, changes, &planned, limit, &landing),
            pipeline::run(&env, chains, 2 * limit),
        );
        fast::landed(state, committed, &mut outcome);
        state.demand_seen = demand;
        done
    };
    outcome.writes += done.outcome.writes;
    outcome.again |= done.outcome.again;
    state.retry_pools.extend(done.retry_pools);
    state.retry_clusters.extend(done.retry_clusters);
    for key in &done.stale {
        allocations::refresh(ctx, key).await;
    }
    steps.done("writes");

    let mut notes = done.notes;
    growth::report_refusals(ctx, state, &grown, &mut notes);
    // Refusals may concern clusters without a growing holding (a user cluster that cannot be
    // read): looked up by name.
    let noted: Vec<Arc<Cluster>> = notes
        .keys()
        .filter_map(|name| ctx.clusters.get(&ObjectRef::new(name)))
        .collect();
    let uids: HashMap<String, &Cluster> =
        noted.iter().map(|c| (c.name_any(), c.as_ref())).collect();
    allocations::publish_cluster_events(ctx, notes, &uids, limit).await;
    if let Some((_, plan)) = state.previous.as_mut() {
        plan.settle();
    }
    // Usage changed where something grew or shrank: those pools' statuses.
    state.status_due.extend(
        decisions
            .iter()
            .filter(|d| matches!(d.change, planner::Change::Grow | planner::Change::Shrink))
            .map(|d| d.pool.clone()),
    );
    outcome.status_after = fast::start_statuses(ctx, state, &now);
    if let Some(due) = grown.next_due {
        outcome.status_after = Some(outcome.status_after.map_or(due, |s| s.min(due)));
    }
    steps.done("events");
    tracing::debug!(
        holdings = grown.pieces.len(),
        writes = outcome.writes,
        "growth pass steps (µs since start): {:?}",
        steps.0
    );
    Some(Ok(settle(ctx, state, outcome).await))
}

/// The clusters whose holdings growth looks at, each checked: `None` (the full pass runs)
/// when one is gone from the cache, changed since the last plan read it, or is being adopted,
/// or when a pool datacenter it holds a growing allocation in cannot be grown from its kept
/// allocator ([`planner::PoolStates::growable`]); also when the demand reader's word changed
/// for a cluster without such a holding (its status is the full pass's to write).
fn involved(
    ctx: &Context,
    state: &PassState,
    pools: &[Arc<IPAMPool>],
    demand: &BTreeMap<String, Option<String>>,
) -> Option<Vec<Arc<Cluster>>> {
    let (_, plan) = state.previous.as_ref()?;
    let policies = growth::policies(pools);
    let changed = demand_changed(&state.demand_seen, demand);
    if changed.iter().any(|name| !demand.contains_key(name)) {
        return None;
    }
    let mut out = Vec::new();
    for name in demand.keys() {
        let mut holdings = growth::holdings_of(plan, &policies, name).peekable();
        if holdings.peek().is_none() {
            if changed.contains(name) {
                return None;
            }
            continue;
        }
        for d in holdings {
            if !state.states.growable(&d.pool, &d.datacenter) {
                return None;
            }
        }
        let cluster = ctx.clusters.get(&ObjectRef::new(name))?;
        let mode = crate::planner::adopt::effective_mode(&cluster, pools.iter().map(AsRef::as_ref));
        if crate::planner::adopt::reads(mode) {
            return None;
        }
        let input = validation::cluster_input(&cluster).ok()?;
        if state.known_input(name) != Some(&input) {
            return None;
        }
        out.push(cluster);
    }
    Some(out)
}

/// The record entries the grown decisions change, by pool datacenter: each what the decision
/// holds now, plus whatever its object still shows (the record always covers the objects).
/// Decisions that only give something back or keep what they held change no entry here.
fn entries_of(
    decisions: &[planner::Decision],
    stored: &[Arc<Entry>],
) -> BTreeMap<RecordKey, BTreeMap<String, Option<Reservation>>> {
    let mut changes: BTreeMap<RecordKey, BTreeMap<String, Option<Reservation>>> = BTreeMap::new();
    for d in decisions
        .iter()
        .filter(|d| d.change == planner::Change::Grow)
    {
        let namespace = cluster_namespace(&d.cluster);
        let object = stored
            .binary_search_by(|o| (o.namespace(), o.name()).cmp(&(&namespace, &d.pool)))
            .ok()
            .map(|i| &stored[i]);
        let desired = reservations::desired_reservations(
            &d.pool,
            &d.datacenter,
            [d],
            object
                .into_iter()
                .map(|o| (o.namespace(), o.name(), o.spec())),
        );
        if let Some(entry) = desired.get(&d.cluster) {
            changes
                .entry((d.pool.clone(), d.datacenter.clone()))
                .or_default()
                .insert(d.cluster.clone(), Some(entry.clone()));
        }
    }
    changes
}
