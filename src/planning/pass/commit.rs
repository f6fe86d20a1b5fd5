//! Step 3: commit the pool records — the compare-and-swap that fences every allocation.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;

use super::*;
use crate::planner::{self, PoolInput};
use crate::planning::records::{self, RecordKey};
use crate::reservations;
use crate::resources::{IPAMPool, record_name};
use crate::seed::Context;
use crate::seed::ledger::Entry;
use crate::seed::preconditions;

/// Record commits in flight at once: each holds a pool datacenter's whole desired record and
/// its shard writes (in a burst, every cluster of the pool), so a pass with many pools to
/// commit does not hold all of them at the same moment.
const RECORDS_AT_ONCE: usize = 4;

/// Writes every pool record shard the plan changes, and a no-op compare-and-swap on the
/// shards of the clusters in `to_write`, whose objects are about to be written; returns the
/// records that are current. The
/// pools of records that could not be written go into `retry` (checked again next pass).
#[allow(clippy::too_many_arguments)]
pub(super) async fn commit_records(
    ctx: &Arc<Context>,
    pools: &[Arc<IPAMPool>],
    inputs: &[PoolInput],
    scope: &scope::Scope,
    plan: &planner::Plan,
    objects: &[Arc<Entry>],
    records: &BTreeMap<RecordKey, String>,
    to_write: &HashMap<RecordKey, BTreeSet<String>>,
    limit: usize,
    retry: &mut BTreeSet<String>,
    outcome: &mut PassOutcome,
) -> HashSet<RecordKey> {
    let pool_objects: HashMap<String, &Arc<IPAMPool>> =
        pools.iter().map(|p| (p.name_any(), p)).collect();
    // Objects and decisions by pool, once (not once per pool datacenter).
    let mut objects_of: HashMap<&str, Vec<&Entry>> = HashMap::new();
    for o in objects {
        objects_of.entry(o.name()).or_default().push(o.as_ref());
    }
    let mut decisions_of: HashMap<&str, Vec<&planner::Decision>> = HashMap::new();
    for d in &plan.decisions {
        if scope.covers_pool(&d.pool) {
            decisions_of.entry(d.pool.as_str()).or_default().push(d);
        }
    }
    // Pools sharing addresses: a commit handing out addresses also raises the fence of the
    // overlapping pools' shards.
    let siblings = planner::space_siblings(inputs);
    let mut current = HashSet::new();
    let no_decisions: Vec<&planner::Decision> = Vec::new();
    let no_objects: Vec<&Entry> = Vec::new();
    let mut commits = Vec::new();
    for input in inputs {
        let Some(pool) = pool_objects.get(&input.name) else {
            continue;
        };
        if !scope.covers_pool(&input.name) {
            // Nothing of it changed since its record was last committed or found current.
            for dc in input.datacenters.keys() {
                current.insert((input.name.clone(), dc.clone()));
            }
            continue;
        }
        let pool_decisions = decisions_of
            .get(input.name.as_str())
            .unwrap_or(&no_decisions);
        let pool_objects_here = objects_of.get(input.name.as_str()).unwrap_or(&no_objects);
        for dc in input.datacenters.keys() {
            let key = (input.name.clone(), dc.clone());
            let check = to_write.get(&key).cloned().unwrap_or_default();
            let kind = input.datacenters.get(dc).map(|d| &d.config.kind);
            let pool = (*pool).clone();
            let fences: Vec<(IPAMPool, RecordKey)> = siblings
                .get(&key)
                .into_iter()
                .flatten()
                .filter_map(|k| Some(((*pool_objects.get(&k.0)?).as_ref().clone(), k.clone())))
                .collect();
            commits.push(async move {
                if !ctx.leader.holds() {
                    return (key, Err(None));
                }
                // Built when the commit starts, not before: only the commits in flight hold
                // their desired record (a whole pool's, in a burst).
                let mut desired = reservations::desired_reservations(
                    &key.0,
                    &key.1,
                    pool_decisions.iter().copied(),
                    pool_objects_here
                        .iter()
                        .map(|o| (o.namespace(), o.name(), o.spec())),
                );
                for (holder, shown) in super::claims::shown_in(ctx, &key.0, &key.1, kind) {
                    reservations::keep_shown(&mut desired, &holder, &shown);
                }
                reservations::add_quarantine(&mut desired, &key.0, &key.1, &plan.quarantined);
                let r = records::commit_shared(ctx, &pool, &key, desired, check, &fences).await;
                (key, r.map_err(Some))
            });
        }
    }
    // Records of datacenters a pool no longer has, once no object is left there.
    let served: HashSet<RecordKey> = inputs
        .iter()
        .flat_map(|p| {
            p.datacenters
                .keys()
                .map(move |dc| (p.name.clone(), dc.clone()))
        })
        .collect();
    for key in records.keys() {
        if !scope.covers_pool(&key.0) {
            continue;
        }
        let pool_valid = inputs.iter().any(|p| p.name == key.0);
        let objects_left = objects_of
            .get(key.0.as_str())
            .is_some_and(|list| list.iter().any(|o| o.spec().dc == key.1));
        if pool_valid && !served.contains(key) && !objects_left {
            match records::remove(ctx, key).await {
                Err(e) => {
                    write_failed(
                        ctx,
                        "IPAMPoolRecord",
                        &record_name(&key.0, &key.1),
                        "delete",
                        &e,
                    );
                    outcome.again = true;
                    retry.insert(key.0.clone());
                }
                Ok(n) => outcome.writes += n,
            }
        }
    }
    let results: Vec<(RecordKey, Result<u64, Option<records::CommitError>>)> =
        futures::stream::iter(commits)
            .buffer_unordered(limit.clamp(1, RECORDS_AT_ONCE))
            .collect()
            .await;
    for (key, result) in results {
        let name = record_name(&key.0, &key.1);
        match result {
            Ok(n) => {
                outcome.writes += n;
                if n > 0 {
                    write_succeeded(ctx, "IPAMPoolRecord", &name);
                }
                current.insert(key);
            }
            Err(None) => {
                outcome.again = true;
                retry.insert(key.0.clone());
            }
            Err(Some(records::CommitError::Api(e))) if is_conflict(&e) || is_not_found(&e) => {
                // Somebody else wrote a shard (a newer leader, or a human): re-read, replan.
                tracing::info!(record = %name, error = %crate::seed::preconditions::short(&e), "pool record changed under us; planning again");
                ctx.metrics
                    .write_failed("IPAMPoolRecord", preconditions::reason(&e));
                outcome.again = true;
                retry.insert(key.0.clone());
            }
            Err(Some(records::CommitError::Api(e))) => {
                write_failed(ctx, "IPAMPoolRecord", &name, "patch", &e);
                outcome.again = true;
                retry.insert(key.0.clone());
            }
            Err(Some(e)) => {
                ctx.metrics.write_failed("IPAMPoolRecord", e.reason());
                tracing::error!("{e}");
                outcome.again = true;
                retry.insert(key.0.clone());
            }
        }
    }
    current
}
