//! Failed writes made visible (warn log, metric, backoff) and events.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType};

use crate::resources::Cluster;
use crate::seed::Context;
use crate::seed::preconditions;

/// A write failed because our view was stale: re-read and plan again.
pub(super) fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

pub(super) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Reports a failed write: warn log, `kipam_write_errors_total{kind,reason}`, and a capped
/// per-object backoff. Returns the message to show on the object it concerns.
pub(crate) fn write_failed(
    ctx: &Context,
    kind: &str,
    name: &str,
    verb: &str,
    e: &kube::Error,
) -> String {
    let reason = preconditions::reason(e);
    ctx.metrics.write_failed(kind, reason);
    let wait = ctx
        .backoff
        .lock()
        .map(|mut b| b.failed(&format!("{kind}/{name}")))
        .unwrap_or_default();
    let message = preconditions::explain(e, verb, kind, name);
    // The cluster and pool the object is about, as their own log fields.
    let (cluster, pool) = match kind {
        "Cluster" => (name, ""),
        "IPAMPool" => ("", name),
        "IPAMAllocation" => name
            .split_once('/')
            .map(|(ns, pool)| {
                (
                    crate::resources::cluster_of_namespace(ns).unwrap_or(""),
                    pool,
                )
            })
            .unwrap_or(("", "")),
        _ => ("", ""),
    };
    tracing::warn!(
        kind,
        name,
        cluster,
        pool,
        reason,
        retry_in_ms = wait.as_millis() as u64,
        "{message}"
    );
    message
}

pub(super) fn write_succeeded(ctx: &Context, kind: &str, name: &str) {
    if let Ok(mut b) = ctx.backoff.lock() {
        b.succeeded(&format!("{kind}/{name}"));
    }
}

/// True when the object's backoff allows a try now.
pub(super) fn due(ctx: &Context, kind: &str, name: &str) -> bool {
    ctx.backoff
        .lock()
        .map(|b| b.due(&format!("{kind}/{name}")))
        .unwrap_or(true)
}

pub(super) fn cluster_reference(cluster: &Cluster) -> ObjectReference {
    cluster.object_ref(&())
}

// RBAC: src/rbac.rs (events.k8s.io events: create, patch).
pub(super) async fn publish(
    ctx: &Context,
    reference: &ObjectReference,
    warning: bool,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: "Allocate".into(),
        secondary: None,
    };
    ctx.metrics.wrote("create", "events");
    if let Err(e) = ctx.recorder.publish(&event, reference).await {
        tracing::debug!(error = %crate::seed::preconditions::short(&e), "event not published");
    }
}
