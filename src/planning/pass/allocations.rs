//! Step 4: `IPAMAllocation` writes, each result in the ledger at once, and their events.

use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, ResourceExt};

use super::*;
use crate::planner::{Change, Decision};
use crate::resources::{
    ANNOTATION_ADDRESSES, ANNOTATION_RECLAIM_POLICY, AllocationPhase, Cluster, IPAMAllocation,
    IPAMAllocationStatus, LABEL_PHASE, cluster_namespace,
};
use crate::seed::Context;
use crate::seed::ledger::Key;
use crate::status::{self};

/// Re-reads one allocation into the ledger after a conflict.
pub(super) async fn refresh(ctx: &Context, key: &Key) {
    // RBAC: src/rbac.rs (ipamallocations, ipamallocations/status).
    let api: Api<IPAMAllocation> = Api::namespaced(ctx.writer.clone(), &key.0);
    match api.get_opt(&key.1).await {
        Ok(Some(obj)) => {
            ctx.ledger.lock().await.apply(obj);
        }
        Ok(None) => ctx.ledger.lock().await.forget(key),
        Err(e) => tracing::warn!(error = %crate::seed::preconditions::short(&e), "re-read failed"),
    }
}

/// `map` less `key` (an empty map is no map, as the API server stores it).
fn without<'a>(
    map: &'a Option<std::collections::BTreeMap<String, String>>,
    keys: &[&str],
) -> Vec<(&'a String, &'a String)> {
    map.iter()
        .flatten()
        .filter(|(k, _)| !keys.contains(&k.as_str()))
        .collect()
}

/// One allocation to create, update or delete.
pub(super) struct AllocationWrite {
    pub(super) key: Key,
    pub(super) decision: Decision,
    pub(super) existing: Option<IPAMAllocation>,
    pub(super) desired: Option<IPAMAllocation>,
    /// The previous status message, to emit failure events only on change.
    pub(super) previous_message: Option<String>,
}

pub(super) struct WriteDone {
    pub(super) writes: u64,
}

/// A status that says no more than the spec: `Allocated`, no message, no conditions. Such a
/// status is not written (readers take a missing status as `Allocated` when the spec holds
/// addresses, see `IPAMAllocation::phase`): a healthy allocation costs one write, its create.
fn says_nothing(status: &IPAMAllocationStatus) -> bool {
    status.phase == Some(AllocationPhase::Allocated)
        && status.message.is_none()
        && status.conditions.is_empty()
        && status.pieces.is_empty()
}

/// The status worth storing for `desired`, given what `existing` shows: none for a healthy
/// allocation that shows none (or an equally healthy one, left as it is); the short
/// `Allocated` status where a stored status says something else (a missing status would not
/// replace it).
fn status_to_store(
    existing: Option<&IPAMAllocation>,
    desired: Option<IPAMAllocationStatus>,
) -> Option<IPAMAllocationStatus> {
    let desired = desired?;
    if !says_nothing(&desired) {
        return Some(desired);
    }
    match existing.and_then(|e| e.status.as_ref()) {
        None => None,
        Some(stored) if says_nothing(stored) => Some(stored.clone()),
        Some(_) => Some(desired),
    }
}

impl AllocationWrite {
    pub(super) fn new(
        decision: &Decision,
        stored: Option<IPAMAllocation>,
        mut desired: Option<IPAMAllocation>,
    ) -> Option<Self> {
        let existing = stored.as_ref();
        if desired.is_none() && existing.is_some_and(|e| e.metadata.deletion_timestamp.is_some()) {
            // Deleted already, kept by somebody else's finalizer: nothing to write; its
            // watch event wakes the planner once it is gone.
            return None;
        }
        if let Some(d) = desired.as_mut() {
            d.status = status_to_store(existing, d.status.take());
        }
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
            previous_message: existing
                .and_then(|e| e.status.as_ref())
                .and_then(|s| s.message.clone()),
            existing: stored,
            desired,
        })
    }

    /// `namespace/name` of the object.
    pub(super) fn name(&self) -> String {
        format!("{}/{}", self.key.0, self.key.1)
    }

    pub(super) fn verb(&self) -> &'static str {
        match (&self.existing, &self.desired) {
            (None, _) => "create",
            (_, None) => "delete",
            _ => "update",
        }
    }

    /// Only the status, the phase label, the address annotation or the reclaim-policy
    /// annotation change: nothing is reserved or released by it, so it needs no record commit.
    /// (A pool being deleted gets no commit at all: the rewrite of its allocations' reclaim
    /// policy, which must land before its finalizer goes, would otherwise wait for good.)
    pub(super) fn is_status_only(&self) -> bool {
        const UNFENCED: &[&str] = &[ANNOTATION_ADDRESSES, ANNOTATION_RECLAIM_POLICY];
        match (&self.existing, &self.desired) {
            (Some(e), Some(d)) => {
                e.spec == d.spec
                    && without(&e.metadata.labels, &[LABEL_PHASE])
                        == without(&d.metadata.labels, &[LABEL_PHASE])
                    && without(&e.metadata.annotations, UNFENCED)
                        == without(&d.metadata.annotations, UNFENCED)
            }
            _ => false,
        }
    }

    /// The write deletes the object or takes off it something it showed: another
    /// datacenter (a move), addresses (a pin changed, a piece given back), another subnet.
    /// The pool record still covers what the object showed (the commit keeps whatever the
    /// objects show), so once the write lands a pass must trim it; no watch event asks for that
    /// pass, since the ledger takes the write as this replica's own.
    pub(super) fn gives_up(&self) -> bool {
        let Some(existing) = &self.existing else {
            return false;
        };
        let Some(desired) = &self.desired else {
            return true;
        };
        let shown = |spec: &crate::resources::IPAMAllocationSpec| {
            crate::reservations::allocation_of(&crate::resources::Reservation {
                cidr: spec.cidr.clone(),
                addresses: spec.addresses.clone(),
            })
            .map(|a| a.ranges().collect::<Vec<_>>())
        };
        let (old, new) = (&existing.spec, &desired.spec);
        match (shown(old), shown(new)) {
            // It showed nothing: nothing of it is recorded.
            (Err(_), _) if old.cidr.is_none() && old.addresses.is_empty() => false,
            (Ok(old_ranges), _) if old.dc != new.dc => !old_ranges.is_empty(),
            (Ok(old_ranges), Ok(new_ranges)) => {
                !crate::reservations::subtract_ranges(old_ranges, new_ranges).is_empty()
            }
            (Ok(_), Err(_)) => true,
            // Unreadable before: whatever the record kept for it is looked at again.
            (Err(_), _) => true,
        }
    }

    /// Writes the object; watch events for it meanwhile are taken as its echo.
    pub(super) async fn execute(&self, ctx: &Context, term: u64) -> Result<WriteDone, kube::Error> {
        ctx.ledger.lock().await.begin_own(&self.key);
        let result = self.write(ctx, term).await;
        ctx.ledger.lock().await.end_own(&self.key);
        result
    }

    async fn write(&self, ctx: &Context, term: u64) -> Result<WriteDone, kube::Error> {
        // Planned in `term`: written only while this replica still leads in it. (What makes
        // addresses safe is the pool record committed before; this keeps a deposed replica
        // quiet.)
        let fence = || {
            if ctx.leader.holds_term(term) {
                Ok(())
            } else {
                Err(kube::Error::Service(
                    std::io::Error::other("not the leader of this term any more").into(),
                ))
            }
        };
        fence()?;
        let api: Api<IPAMAllocation> = Api::namespaced(ctx.writer.clone(), &self.key.0);
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
                let still_there = match api.delete(&self.key.1, &dp).await {
                    Ok(answer) => answer.left(),
                    Err(e) if is_not_found(&e) => None,
                    Err(e) => return Err(e),
                };
                writes += 1;
                let mut ledger = ctx.ledger.lock().await;
                match still_there {
                    // Somebody else's finalizer keeps it: it shows its addresses until it is
                    // gone, so the ledger keeps it (being deleted) until the watch says so.
                    Some(obj) => ledger.apply_own(obj),
                    // Gone; the version it had is enough for the tombstone.
                    None => ledger.remove_own(existing),
                }
            }
            (None, Some(desired)) => {
                let mut create = desired.clone();
                create.status = None;
                ctx.metrics.wrote("create", "ipamallocations");
                let created = api.create(&pp, &create).await?;
                writes += 1;
                ctx.ledger.lock().await.apply_own(created.clone());
                if desired.status.is_none() {
                    return Ok(WriteDone { writes });
                }
                fence()?;
                let mut with_status = created;
                with_status.status = desired.status.clone();
                ctx.metrics.wrote("update", "ipamallocations/status");
                let updated = api.replace_status(&self.key.1, &pp, &with_status).await?;
                writes += 1;
                ctx.ledger.lock().await.apply_own(updated);
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
                    ctx.ledger.lock().await.apply_own(current.clone());
                }
                if current.status != desired.status {
                    fence()?;
                    let mut with_status = current.clone();
                    with_status.status = desired.status.clone();
                    ctx.metrics.wrote("update", "ipamallocations/status");
                    let updated = api.replace_status(&self.key.1, &pp, &with_status).await?;
                    writes += 1;
                    ctx.ledger.lock().await.apply_own(updated);
                }
            }
            (None, None) => {}
        }
        Ok(WriteDone { writes })
    }
}

/// One event for a cluster: what happened to one of its allocations.
pub(super) struct ClusterNote {
    pub(super) warning: bool,
    pub(super) reason: String,
    pub(super) note: String,
}

/// The event a finished allocation write deserves, if any (counting it in the metrics). A
/// plain first allocation gets none: the object and the cluster's `IPAMReady` condition say
/// it, and at scale an event per allocation would double the writes.
pub(super) fn allocation_note(metrics: &Metrics, job: &AllocationWrite) -> Option<ClusterNote> {
    let d = &job.decision;
    let held = d.held.as_ref().map(|h| h.to_string()).unwrap_or_default();
    tracing::info!(cluster = %d.cluster, pool = %d.pool, datacenter = %d.datacenter, change = %d.change, held = %held, "allocation written{}{}", if d.message.is_empty() { "" } else { ": " }, d.message);
    let note = |warning: bool, reason: &str, note: String| {
        Some(ClusterNote {
            warning,
            reason: reason.to_string(),
            note,
        })
    };
    match d.change {
        Change::Create | Change::Grow | Change::Replace => {
            metrics.allocation_written(&d.cluster, &d.pool);
            match (d.change, &d.previous) {
                (Change::Create, None) => None,
                (Change::Create, Some(_)) => note(
                    false,
                    "Allocated",
                    format!("pool {} ({}): {held}; {}", d.pool, d.datacenter, d.message),
                ),
                (Change::Grow, _) if !d.message.is_empty() => {
                    if d.message.contains(crate::planner::growth::GREW_FOR_DEMAND) {
                        metrics
                            .growths
                            .get_or_create(&crate::planning::metrics::PoolLabels {
                                pool: d.pool.clone(),
                                datacenter: d.datacenter.clone(),
                            })
                            .inc();
                    }
                    note(
                        false,
                        "AllocationGrown",
                        format!("pool {} ({}): {held}; {}", d.pool, d.datacenter, d.message),
                    )
                }
                (Change::Grow, _) => note(
                    false,
                    "AllocationGrown",
                    format!("pool {} ({}): {held}", d.pool, d.datacenter),
                ),
                _ => note(
                    false,
                    "AllocationRepinned",
                    format!("pool {} ({}): {held}", d.pool, d.datacenter),
                ),
            }
        }
        Change::Shrink => {
            metrics
                .shrinks
                .get_or_create(&crate::planning::metrics::PoolLabels {
                    pool: d.pool.clone(),
                    datacenter: d.datacenter.clone(),
                })
                .inc();
            note(
                false,
                "AllocationShrunk",
                format!("pool {} ({}): {held}; {}", d.pool, d.datacenter, d.message),
            )
        }
        Change::Release if job.existing.is_some() => {
            metrics.allocations_released.inc();
            let previous = d
                .previous
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_default();
            note(
                false,
                "Released",
                format!("pool {}: {previous} released: {}", d.pool, d.message),
            )
        }
        Change::Fail if job.previous_message.as_deref() != Some(d.message.as_str()) => {
            metrics.allocation_failures.inc();
            let (_, reason, _) = status::cluster_ipam_condition(&[d]);
            note(true, &reason, format!("pool {}: {}", d.pool, d.message))
        }
        _ => None,
    }
}

/// Publishes at most one event per cluster for this pass: several notes are joined into one,
/// under the reason of the first warning (else of the first note).
pub(super) async fn publish_cluster_events(
    ctx: &Context,
    notes: std::collections::BTreeMap<String, Vec<ClusterNote>>,
    clusters: &std::collections::HashMap<String, &Cluster>,
    limit: usize,
) {
    let mut jobs = Vec::new();
    for (cluster, notes) in notes {
        let Some(c) = clusters.get(&cluster) else {
            continue;
        };
        let Some(first) = notes.iter().find(|n| n.warning).or(notes.first()) else {
            continue;
        };
        let warning = notes.iter().any(|n| n.warning);
        let reason = first.reason.clone();
        let text = notes
            .iter()
            .map(|n| n.note.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        let reference = cluster_reference(c);
        jobs.push(async move { publish(ctx, &reference, warning, &reason, text).await });
    }
    futures::stream::iter(jobs)
        .buffer_unordered(limit)
        .collect::<Vec<()>>()
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(phase: AllocationPhase, message: Option<&str>) -> IPAMAllocationStatus {
        IPAMAllocationStatus {
            phase: Some(phase),
            message: message.map(str::to_string),
            allocated_at: Some("2026-01-01T00:00:00Z".into()),
            conditions: Vec::new(),
            pieces: Vec::new(),
        }
    }

    fn stored(status: Option<IPAMAllocationStatus>) -> IPAMAllocation {
        let mut o = IPAMAllocation::new("metallb", Default::default());
        o.spec.addresses = vec!["10.0.0.0-10.0.0.3".into()];
        o.status = status;
        o
    }

    /// Issue 39, item 5: the writes after which the pool record can be trimmed (and the pass
    /// that does it is asked for at once).
    #[test]
    fn a_write_gives_up_addresses_only_where_its_object_stops_showing_some() {
        let write =
            |existing: Option<IPAMAllocation>, desired: Option<IPAMAllocation>| AllocationWrite {
                key: ("cluster-a".into(), "metallb".into()),
                decision: Decision {
                    cluster: "a".into(),
                    pool: "metallb".into(),
                    datacenter: "dc-1".into(),
                    type_: Default::default(),
                    change: Change::Keep,
                    previous: None,
                    held: None,
                    message: String::new(),
                },
                existing,
                desired,
                previous_message: None,
            };
        let with = |dc: &str, pieces: &[&str]| {
            let mut o = stored(None);
            o.spec.dc = dc.into();
            o.spec.addresses = pieces.iter().map(|p| p.to_string()).collect();
            o
        };
        let held = with("dc-1", &["10.0.0.0-10.0.0.3"]);
        // Created, or rewritten showing the same or more (a status, growth): nothing given up.
        assert!(!write(None, Some(held.clone())).gives_up());
        let mut failed = held.clone();
        failed.status = Some(status(AllocationPhase::Failed, Some("full")));
        assert!(!write(Some(held.clone()), Some(failed)).gives_up());
        let grown = with("dc-1", &["10.0.0.0-10.0.0.3", "10.0.0.8-10.0.0.9"]);
        assert!(!write(Some(held.clone()), Some(grown.clone())).gives_up());
        // Deleted, moved to another datacenter, pinned elsewhere, shrunk: given up.
        assert!(write(Some(held.clone()), None).gives_up());
        let moved = with("dc-2", &["10.0.0.0-10.0.0.3"]);
        assert!(write(Some(held.clone()), Some(moved)).gives_up());
        let repinned = with("dc-1", &["10.0.0.0-10.0.0.1"]);
        assert!(write(Some(held.clone()), Some(repinned)).gives_up());
        assert!(write(Some(grown), Some(held)).gives_up());
    }

    #[test]
    fn a_healthy_allocation_stores_no_status_but_replaces_a_stale_one() {
        let healthy = status(AllocationPhase::Allocated, None);
        // Created healthy, or healthy without a status: nothing to write.
        assert_eq!(status_to_store(None, Some(healthy.clone())), None);
        assert_eq!(
            status_to_store(Some(&stored(None)), Some(healthy.clone())),
            None
        );
        // An older healthy status is left as it is (no write on upgrade).
        let older = status(AllocationPhase::Allocated, None);
        assert_eq!(
            status_to_store(Some(&stored(Some(older.clone()))), Some(healthy.clone())),
            Some(older)
        );
        // A Failed status must be overwritten once the allocation succeeds.
        let failed = stored(Some(status(AllocationPhase::Failed, Some("full"))));
        assert_eq!(
            status_to_store(Some(&failed), Some(healthy.clone())),
            Some(healthy)
        );
        // Anything that says more than the spec is stored.
        let grown = status(AllocationPhase::Allocated, Some("grew to 8 addresses"));
        assert_eq!(status_to_store(None, Some(grown.clone())), Some(grown));
        let failing = status(AllocationPhase::Failed, Some("full"));
        assert_eq!(status_to_store(None, Some(failing.clone())), Some(failing));
    }

    fn decision(change: Change, held: Option<&str>, message: &str) -> Decision {
        Decision {
            cluster: "a".into(),
            pool: "metallb".into(),
            datacenter: "dc-1".into(),
            type_: crate::resources::AllocationType::Range,
            change,
            held: held
                .map(|h| crate::allocator::Allocation::Range(vec![h.parse().expect("a range")])),
            previous: None,
            message: message.into(),
        }
    }

    /// The job for `d` against `stored`, with the object `allocation_object` asks for.
    fn job(d: &Decision, stored: Option<&IPAMAllocation>) -> Option<AllocationWrite> {
        let desired = crate::desired::allocation_object(d, stored, None, "2026-01-01T00:00:00Z");
        AllocationWrite::new(d, stored.cloned(), desired)
    }

    /// What the API server stores for a create or an update of `job`'s object.
    fn stored_after(job: &AllocationWrite) -> IPAMAllocation {
        let mut o = job.desired.clone().expect("an object");
        o.metadata.resource_version = Some("7".into());
        o
    }

    fn label(o: &IPAMAllocation) -> Option<&str> {
        o.metadata
            .labels
            .as_ref()?
            .get(LABEL_PHASE)
            .map(String::as_str)
    }

    fn addresses(o: &IPAMAllocation) -> Option<&str> {
        o.metadata
            .annotations
            .as_ref()?
            .get(ANNOTATION_ADDRESSES)
            .map(String::as_str)
    }

    /// Issue 25: the create carries the phase and the addresses for `kubectl get ipa`, so a
    /// healthy allocation still costs one write, and the next passes write nothing.
    #[test]
    fn the_create_carries_the_phase_label_and_the_addresses() {
        let create = decision(Change::Create, Some("10.0.0.0-10.0.0.3"), "");
        let first = job(&create, None).expect("a create");
        assert_eq!(first.verb(), "create");
        let created = stored_after(&first);
        assert_eq!(label(&created), Some("Allocated"));
        assert_eq!(addresses(&created), Some("10.0.0.0-.3"));
        // No status to write after the create: one write.
        assert_eq!(created.status, None);
        let keep = decision(Change::Keep, Some("10.0.0.0-10.0.0.3"), "");
        assert!(job(&keep, Some(&created)).is_none());

        // A failed request: the create says Failed (its status, with the message, follows as
        // it always did).
        let fail = decision(Change::Fail, None, "pool metallb/dc-1 is full");
        let failed = stored_after(&job(&fail, None).expect("a create"));
        assert_eq!(label(&failed), Some("Failed"));
        assert_eq!(addresses(&failed), None);
        assert_eq!(
            failed.status.as_ref().and_then(|s| s.phase),
            Some(AllocationPhase::Failed)
        );
        assert!(job(&fail, Some(&failed)).is_none());
    }

    /// A phase change rewrites the label once, with no record commit when the spec stays;
    /// no phase change writes nothing, also for an allocation stored before the label existed.
    #[test]
    fn the_phase_label_changes_with_the_phase_only() {
        let create = decision(Change::Create, Some("10.0.0.0-10.0.0.3"), "");
        let created = stored_after(&job(&create, None).expect("a create"));
        let conflict = decision(Change::Conflict, Some("10.0.0.0-10.0.0.3"), "overlaps b");
        let to_conflict = job(&conflict, Some(&created)).expect("a write");
        assert!(to_conflict.is_status_only(), "no record commit");
        let in_conflict = stored_after(&to_conflict);
        assert_eq!(label(&in_conflict), Some("Conflict"));
        assert_eq!(in_conflict.spec, created.spec);
        assert!(job(&conflict, Some(&in_conflict)).is_none());
        // Resolved: back to Allocated.
        let keep = decision(Change::Keep, Some("10.0.0.0-10.0.0.3"), "");
        let back = job(&keep, Some(&in_conflict)).expect("a write");
        assert!(back.is_status_only());
        assert_eq!(label(&stored_after(&back)), Some("Allocated"));

        // Stored by an earlier kipam: neither label nor annotation. Kept as it is while
        // nothing changes...
        let mut older = created.clone();
        older
            .metadata
            .labels
            .as_mut()
            .map(|l| l.remove(LABEL_PHASE));
        older.metadata.annotations = None;
        assert!(job(&keep, Some(&older)).is_none());
        // ... and given both with its next change.
        let grow = decision(Change::Grow, Some("10.0.0.0-10.0.0.7"), "");
        let grown = stored_after(&job(&grow, Some(&older)).expect("a write"));
        assert_eq!(label(&grown), Some("Allocated"));
        assert_eq!(addresses(&grown), Some("10.0.0.0-.7"));
    }

    /// A write that takes addresses or a datacenter off an object asks for the pass that trims
    /// the pool record (no watch event does); one that only adds or keeps does not. Before, only
    /// a delete did: a cluster moved to another datacenter left its entry in the old
    /// datacenter's record until some other change came by (a lost address).
    #[test]
    fn a_write_taking_addresses_or_a_datacenter_off_an_object_gives_them_up() {
        let create = decision(Change::Create, Some("10.0.0.0-10.0.0.3"), "");
        let first = job(&create, None).expect("a create");
        assert!(!first.gives_up(), "a create gives up nothing");
        let created = stored_after(&first);

        let grow = decision(Change::Grow, Some("10.0.0.0-10.0.0.7"), "");
        assert!(!job(&grow, Some(&created)).expect("a write").gives_up());

        let mut moved = decision(Change::Create, Some("10.1.0.0-10.1.0.3"), "moved");
        moved.datacenter = "dc-2".into();
        let to_dc2 = job(&moved, Some(&created)).expect("a write");
        assert_eq!(to_dc2.verb(), "update");
        assert!(
            to_dc2.gives_up(),
            "a move leaves the old datacenter's entry"
        );
        // Even to the same addresses in the other datacenter.
        let mut same = decision(Change::Create, Some("10.0.0.0-10.0.0.3"), "moved");
        same.datacenter = "dc-2".into();
        assert!(job(&same, Some(&created)).expect("a write").gives_up());

        let repin = decision(Change::Replace, Some("10.0.0.2-10.0.0.5"), "pin changed");
        assert!(job(&repin, Some(&created)).expect("a write").gives_up());

        let fail = decision(Change::Fail, Some("10.0.0.0-10.0.0.3"), "growth refused");
        let status_only = job(&fail, Some(&created)).expect("a status write");
        assert!(!status_only.gives_up(), "a status write gives up nothing");

        let release = decision(Change::Release, None, "opted out");
        let delete = job(&release, Some(&created)).expect("a delete");
        assert_eq!(delete.verb(), "delete");
        assert!(delete.gives_up());
    }

    #[test]
    fn readers_take_a_missing_status_from_the_spec() {
        assert_eq!(stored(None).phase(), AllocationPhase::Allocated);
        let mut empty = stored(None);
        empty.spec.addresses.clear();
        assert_eq!(empty.phase(), AllocationPhase::Pending);
        let conflict = stored(Some(status(AllocationPhase::Conflict, Some("overlap"))));
        assert_eq!(conflict.phase(), AllocationPhase::Conflict);
    }
}
