//! Step 4: `IPAMAllocation` writes, each result in the ledger at once, and their events.

use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, ResourceExt};

use super::*;
use crate::controller::Context;
use crate::controller::ledger::Key;
use crate::planner::{Change, Decision};
use crate::resources::{Cluster, IPAMAllocation, cluster_namespace};
use crate::status::{self};

/// Re-reads one allocation into the ledger after a conflict.
pub(super) async fn refresh(ctx: &Context, key: &Key) {
    // RBAC: src/rbac.rs (ipamallocations, ipamallocations/status).
    let api: Api<IPAMAllocation> = Api::namespaced(ctx.writer.clone(), &key.0);
    match api.get_opt(&key.1).await {
        Ok(Some(obj)) => ctx.ledger.lock().await.apply(obj),
        Ok(None) => ctx.ledger.lock().await.forget(key),
        Err(e) => tracing::warn!(error = %e, "re-read failed"),
    }
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

impl AllocationWrite {
    pub(super) fn new(
        decision: &Decision,
        existing: Option<&IPAMAllocation>,
        desired: Option<IPAMAllocation>,
    ) -> Option<Self> {
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
            existing: existing.cloned(),
            previous_message: existing
                .and_then(|e| e.status.as_ref())
                .and_then(|s| s.message.clone()),
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

    /// Only the status changes (nothing is reserved or released by it).
    pub(super) fn is_status_only(&self) -> bool {
        match (&self.existing, &self.desired) {
            (Some(e), Some(d)) => {
                e.spec == d.spec
                    && e.metadata.labels == d.metadata.labels
                    && e.metadata.annotations == d.metadata.annotations
            }
            _ => false,
        }
    }

    pub(super) async fn execute(&self, ctx: &Context, term: u64) -> Result<WriteDone, kube::Error> {
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
                match api.delete(&self.key.1, &dp).await {
                    Ok(_) => {}
                    Err(e) if is_not_found(&e) => {}
                    Err(e) => return Err(e),
                }
                // The delete response may still carry the object (finalizers); the version
                // it had is enough for the tombstone.
                ctx.ledger.lock().await.remove(existing);
                writes += 1;
            }
            (None, Some(desired)) => {
                let mut create = desired.clone();
                create.status = None;
                ctx.metrics.wrote("create", "ipamallocations");
                let created = api.create(&pp, &create).await?;
                writes += 1;
                ctx.ledger.lock().await.apply(created.clone());
                fence()?;
                let mut with_status = created;
                with_status.status = desired.status.clone();
                ctx.metrics.wrote("update", "ipamallocations/status");
                let updated = api.replace_status(&self.key.1, &pp, &with_status).await?;
                writes += 1;
                ctx.ledger.lock().await.apply(updated);
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
                    ctx.ledger.lock().await.apply(current.clone());
                }
                if current.status != desired.status {
                    fence()?;
                    let mut with_status = current.clone();
                    with_status.status = desired.status.clone();
                    ctx.metrics.wrote("update", "ipamallocations/status");
                    let updated = api.replace_status(&self.key.1, &pp, &with_status).await?;
                    writes += 1;
                    ctx.ledger.lock().await.apply(updated);
                }
            }
            (None, None) => {}
        }
        Ok(WriteDone { writes })
    }
}

pub(super) async fn publish_allocation_event(
    ctx: &Context,
    job: &AllocationWrite,
    cluster: Option<&Cluster>,
) {
    let d = &job.decision;
    let Some(cluster) = cluster else { return };
    let reference = cluster_reference(cluster);
    let held = d.held.as_ref().map(|h| h.to_string()).unwrap_or_default();
    tracing::info!(cluster = %d.cluster, pool = %d.pool, datacenter = %d.datacenter, change = %d.change, held = %held, "allocation written{}{}", if d.message.is_empty() { "" } else { ": " }, d.message);
    match d.change {
        Change::Create | Change::Grow | Change::Replace => {
            ctx.metrics.allocation_written(&d.cluster, &d.pool);
            let reason = match d.change {
                Change::Create => "Allocated",
                Change::Grow => "AllocationGrown",
                _ => "AllocationRepinned",
            };
            publish(
                ctx,
                &reference,
                false,
                reason,
                format!("pool {} ({}): {held}", d.pool, d.datacenter),
            )
            .await;
        }
        Change::Release if job.existing.is_some() => {
            ctx.metrics.allocations_released.inc();
            let previous = d
                .previous
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_default();
            publish(
                ctx,
                &reference,
                false,
                "Released",
                format!("pool {}: {previous} released: {}", d.pool, d.message),
            )
            .await;
        }
        Change::Fail if job.previous_message.as_deref() != Some(d.message.as_str()) => {
            ctx.metrics.allocation_failures.inc();
            let (_, reason, _) = status::cluster_ipam_condition(&[d]);
            publish(
                ctx,
                &reference,
                true,
                &reason,
                format!("pool {}: {}", d.pool, d.message),
            )
            .await;
        }
        _ => {}
    }
}
