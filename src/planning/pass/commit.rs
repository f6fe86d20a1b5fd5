//! Step 3: commit the pool records — the compare-and-swap that fences every allocation.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;

use super::*;
use crate::address::AddrRange;
use crate::planner::{self, PoolInput};
use crate::planning::records::{self, RecordKey};
use crate::reservations;
use crate::resources::{IPAMPool, Reservation, record_name};
use crate::seed::Context;
use crate::seed::ledger::Entry;
use crate::seed::preconditions;

/// Record commits in flight at once: each holds a pool datacenter's whole desired record and
/// its shard writes (in a burst, every cluster of the pool), so a pass with many pools to
/// commit does not hold all of them at the same moment.
const RECORDS_AT_ONCE: usize = 4;

/// Writes every pool record shard the plan changes, and a no-op compare-and-swap on the
/// shards of the clusters in `to_write`, whose objects are about to be written; returns the
/// records that are current, and tells `landing` of each as it is found current or refused
/// (the clusters' chains wait on it). The pools of records that could not be written go into
/// `retry` (checked again next pass).
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
    hand_made: &inputs::HandMadeEntries,
    limit: usize,
    retry: &mut BTreeSet<String>,
    outcome: &mut PassOutcome,
    landing: &pipeline::Landing,
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
    // Invalid pools are left out of the plan, and what they hold is set aside in every pool
    // of their datacenters whatever the address space: a commit there raises their fences
    // too (a replica that still reads such a pool as valid may commit into it).
    let frozen = frozen_by_datacenter(pools, inputs);
    // What this pass planned on: the pools it read, and the records as it read them (no
    // shard has been read again since: nothing commits between the snapshot and here).
    let planned = {
        let mark = ctx.records.lock().await.rereads;
        records::PlannedOn::pools(pools.iter().map(|p| p.as_ref())).with_rereads(mark)
    };
    let planned = &planned;
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
                landing.landed((input.name.clone(), dc.clone()));
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
            let fences = fence_targets(&key, &siblings, &pool_objects, &frozen);
            commits.push(async move {
                if !ctx.leader.holds() {
                    return (key, Err(None), false);
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
                // What the webhook committed for hand-made `IPAddress`es stays, unless this
                // commit gives the object's claim exactly that (its adoption).
                for (entry, held, claim) in hand_made.get(&key).into_iter().flatten() {
                    let adopted = claim.as_ref().is_some_and(|c| desired.get(c) == Some(held));
                    if !adopted {
                        desired.insert(entry.clone(), held.clone());
                    }
                }
                let frees = frees(ctx.records.lock().await.joined(&key), &desired);
                let r = records::commit_shared(ctx, &pool, &key, desired, check, &fences, planned)
                    .await;
                (key, r.map_err(Some), frees)
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
        // Hand-made `IPAddress`es whose entries the record keeps count as objects: their
        // addresses stay recorded until the objects go.
        let objects_left = objects_of
            .get(key.0.as_str())
            .is_some_and(|list| list.iter().any(|o| o.spec().dc == key.1))
            || hand_made.get(key).is_some_and(|kept| !kept.is_empty());
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
                Ok(n) => {
                    outcome.writes += n;
                    if n > 0 {
                        freed(ctx);
                    }
                }
            }
        }
    }
    // Taken as each lands: the allocations it fences go out at once.
    let mut results =
        futures::stream::iter(commits).buffer_unordered(limit.clamp(1, RECORDS_AT_ONCE));
    while let Some((key, result, frees)) = results.next().await {
        let name = record_name(&key.0, &key.1);
        if result.is_ok() {
            landing.landed(key.clone());
        } else {
            landing.refused(key.clone());
        }
        match result {
            Ok(n) => {
                outcome.writes += n;
                if n > 0 {
                    write_succeeded(ctx, "IPAMPoolRecord", &name);
                    if frees {
                        freed(ctx);
                    }
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
            Err(Some(e @ records::CommitError::PoolsBehind { .. })) => {
                // Another replica saw newer pools: planned again once the pool watch has
                // caught up (its event wakes the loop).
                tracing::info!(record = %name, "{e}");
                ctx.metrics.write_failed("IPAMPoolRecord", e.reason());
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

/// Whether a commit of `desired` over `held` (the record as this replica holds it) frees
/// addresses: an entry it drops or shrinks lists some that no entry of `desired` lists (a
/// released holder's entry trimmed once no object shows it, a quarantine that ended). An
/// entry that does not read, dropped, counts as freeing.
fn frees(
    held: impl IntoIterator<Item = (String, Reservation)>,
    desired: &BTreeMap<String, Reservation>,
) -> bool {
    let mut dropped: Vec<AddrRange> = Vec::new();
    for (entry, was) in held {
        if desired.get(&entry) == Some(&was) {
            continue;
        }
        match reservations::allocation_of(&was) {
            Ok(a) => dropped.extend(a.ranges()),
            Err(_) => return true,
        }
    }
    if dropped.is_empty() {
        return false;
    }
    let kept: Vec<AddrRange> = desired
        .values()
        .filter_map(|r| reservations::allocation_of(r).ok())
        .flat_map(|a| a.ranges().collect::<Vec<_>>())
        .collect();
    !reservations::subtract_ranges(dropped, kept).is_empty()
}

/// A commit freed addresses: a holder may be waiting for them, and nothing else would bring
/// the pass that hands them out (no object changes, the record's own watch wakes nobody).
/// The next pass looks at everything changed, at once.
fn freed(ctx: &Context) {
    ctx.dirty.other();
    ctx.dirty.wake();
}

/// The pools whose fences a commit of `key` that adds addresses raises (with their record
/// keys): the overlapping pools of its address space, and every invalid pool of its
/// datacenter.
fn fence_targets(
    key: &RecordKey,
    siblings: &HashMap<RecordKey, Vec<RecordKey>>,
    pools: &HashMap<String, &Arc<IPAMPool>>,
    frozen: &HashMap<&str, Vec<&Arc<IPAMPool>>>,
) -> Vec<(IPAMPool, RecordKey)> {
    let mut out: Vec<(IPAMPool, RecordKey)> = siblings
        .get(key)
        .into_iter()
        .flatten()
        .filter_map(|k| Some(((*pools.get(&k.0)?).as_ref().clone(), k.clone())))
        .collect();
    for other in frozen.get(key.1.as_str()).into_iter().flatten() {
        out.push((other.as_ref().clone(), (other.name_any(), key.1.clone())));
    }
    out
}

/// Datacenter -> the pools that list it and are left out of the plan as invalid (not being
/// deleted, absent from `inputs`).
fn frozen_by_datacenter<'a>(
    pools: &'a [Arc<IPAMPool>],
    inputs: &[PoolInput],
) -> HashMap<&'a str, Vec<&'a Arc<IPAMPool>>> {
    let valid: HashSet<&str> = inputs.iter().map(|p| p.name.as_str()).collect();
    let mut out: HashMap<&str, Vec<&Arc<IPAMPool>>> = HashMap::new();
    for pool in pools {
        let name = pool.metadata.name.as_deref().unwrap_or_default();
        if valid.contains(name) || pool.metadata.deletion_timestamp.is_some() {
            continue;
        }
        for dc in pool.spec.datacenters.keys() {
            out.entry(dc.as_str()).or_default().push(pool);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, cidr: &str, space: &str) -> Arc<IPAMPool> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
                "metadata": {"name": name},
                "spec": {
                    "addressSpace": space,
                    "datacenters": {"dc-1": {"type": "range", "poolCidr": cidr, "allocationRange": 4}},
                },
            }))
            .unwrap(),
        )
    }

    fn range(addresses: &[&str]) -> Reservation {
        Reservation {
            cidr: None,
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
        }
    }

    /// Issue 39, item 5: a commit that trims a released holder's entry frees its addresses,
    /// and the loop must plan again for whoever waits for them; one that only adds, keeps, or
    /// moves addresses to another entry (a quarantine, a new holder) frees nothing.
    #[test]
    fn a_commit_frees_addresses_only_where_no_entry_lists_them_any_more() {
        let held = |entries: &[(&str, Reservation)]| -> Vec<(String, Reservation)> {
            entries
                .iter()
                .map(|(k, r)| (k.to_string(), r.clone()))
                .collect()
        };
        let desired = |entries: &[(&str, Reservation)]| -> BTreeMap<String, Reservation> {
            entries
                .iter()
                .map(|(k, r)| (k.to_string(), r.clone()))
                .collect()
        };
        let a = range(&["10.9.0.0-10.9.0.3"]);
        let b = range(&["10.9.0.4-10.9.0.7"]);
        // a's entry trimmed: freed.
        assert!(frees(
            held(&[("a", a.clone()), ("b", b.clone())]),
            &desired(&[("b", b.clone())])
        ));
        // Nothing dropped: a new holder added, the rest unchanged.
        assert!(!frees(
            held(&[("b", b.clone())]),
            &desired(&[("a", a.clone()), ("b", b.clone())])
        ));
        // a's addresses handed to c in the same commit, or kept in quarantine for a.
        assert!(!frees(
            held(&[("a", a.clone())]),
            &desired(&[("c", a.clone())])
        ));
        assert!(!frees(
            held(&[("a", a.clone())]),
            &desired(&[("quarantined/a@1", a.clone())])
        ));
        // Growth appends a piece: nothing freed; a pin moved within the pool: the rest freed.
        let grown = range(&["10.9.0.0-10.9.0.3", "10.9.0.8-10.9.0.9"]);
        assert!(!frees(held(&[("a", a.clone())]), &desired(&[("a", grown)])));
        let repinned = range(&["10.9.0.0-10.9.0.1"]);
        assert!(frees(
            held(&[("a", a.clone())]),
            &desired(&[("a", repinned)])
        ));
        // An entry that does not read, dropped: counted as freeing.
        assert!(frees(
            held(&[("a", range(&["not an address"]))]),
            &desired(&[])
        ));
    }

    /// Issue 35, item 4: an invalid pool is left out of the plan, and what it holds is set
    /// aside in every pool of its datacenter; a commit into any of them raises its fences as
    /// well, whatever its address space — a replica that still reads it as valid may commit
    /// into it. Before, only the overlapping valid pools of the space were fenced.
    #[test]
    fn a_commit_fences_the_invalid_pools_of_its_datacenter() {
        let pools = vec![
            pool("a", "10.0.0.0/16", "red"),
            pool("sibling", "10.0.0.0/24", "red"),
            pool("apart", "10.0.0.0/16", "blue"),
            pool("broken", "10.0.0.1/16", "blue"),
        ];
        let inputs: Vec<PoolInput> = pools
            .iter()
            .filter_map(|p| crate::validation::pool_input(p).ok())
            .collect();
        assert_eq!(inputs.len(), 3, "the pool with host bits set is invalid");
        let siblings = planner::space_siblings(&inputs);
        let by_name: HashMap<String, &Arc<IPAMPool>> =
            pools.iter().map(|p| (p.name_any(), p)).collect();
        let frozen = frozen_by_datacenter(&pools, &inputs);
        let key: RecordKey = ("a".into(), "dc-1".into());
        let mut targets: Vec<String> = fence_targets(&key, &siblings, &by_name, &frozen)
            .into_iter()
            .map(|(p, k)| format!("{}:{}/{}", p.name_any(), k.0, k.1))
            .collect();
        targets.sort();
        assert_eq!(targets, vec!["broken:broken/dc-1", "sibling:sibling/dc-1"]);
    }
}
