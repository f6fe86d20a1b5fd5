//! What an Addon's status and its Cluster's `AddonsReady` condition say after a sync (pure:
//! plain data in, plain data out).

use std::collections::BTreeSet;

use crate::resources::bounds::MAX_MESSAGE;
use crate::resources::{AddonStatus, AppliedObject, Condition};
use crate::status::set_condition;

/// Why an Addon is not in sync, as its conditions' `reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The templates failed to render (the message names the file and line).
    TemplateError,
    /// The Cluster names no kubeconfig, or the Secret, its key or its content is unusable.
    KubeconfigInvalid,
    /// The user cluster did not answer (connection refused, timeout, 5xx).
    Unreachable,
    /// The user cluster refused the kubeconfig's credentials (401).
    Unauthorized,
    /// RBAC in the user cluster forbids what the addon applies (403).
    Forbidden,
    /// The user cluster does not serve a kind the addon renders (e.g. MetalLB's CRDs).
    MissingCRD,
    /// The user cluster refused an object for another reason (invalid, missing namespace…).
    ApplyFailed,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TemplateError => "TemplateError",
            Reason::KubeconfigInvalid => "KubeconfigInvalid",
            Reason::Unreachable => "Unreachable",
            Reason::Unauthorized => "Unauthorized",
            Reason::Forbidden => "Forbidden",
            Reason::MissingCRD => "MissingCRD",
            Reason::ApplyFailed => "ApplyFailed",
        }
    }
}

/// A failure, with what to tell the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: Reason,
    pub message: String,
}

/// The outcome of one Addon's sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every rendered object applied and everything no longer rendered pruned.
    Synced {
        /// What is applied now.
        applied: Vec<AppliedObject>,
        /// Hash of the rendered manifests.
        hash: String,
    },
    /// Rendering failed: nothing was applied or pruned.
    RenderFailed(Failure),
    /// Rendered, but applying or pruning failed part way. `applied` are the objects that were
    /// applied in this attempt, `not_pruned` the earlier ones still to delete.
    ApplyFailed {
        failure: Failure,
        applied: Vec<AppliedObject>,
        not_pruned: Vec<AppliedObject>,
    },
}

/// The objects kipam must keep track of after a failed attempt: nothing it may have created is
/// ever forgotten, so a later sync can still prune it. Sorted and without duplicates.
pub fn inventory_after_failure(
    previous: &[AppliedObject],
    applied: &[AppliedObject],
    not_pruned: &[AppliedObject],
) -> Vec<AppliedObject> {
    let all: BTreeSet<&AppliedObject> = previous
        .iter()
        .chain(applied.iter())
        .chain(not_pruned.iter())
        .collect();
    all.into_iter().cloned().collect()
}

/// The objects of `previous` that `current` no longer holds, in a stable order.
pub fn to_prune(previous: &[AppliedObject], current: &[AppliedObject]) -> Vec<AppliedObject> {
    let keep: BTreeSet<&AppliedObject> = current.iter().collect();
    let mut out: Vec<AppliedObject> = previous
        .iter()
        .filter(|o| !keep.contains(o))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Cuts a message to the bound of a condition message, on a character boundary.
pub fn bounded(message: String) -> String {
    let max = MAX_MESSAGE as usize;
    if message.len() <= max {
        return message;
    }
    let mut end = max - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

/// The Addon status after a sync: `Rendered`, `Applied`, `InSync`, the inventory, the hash and
/// the time of the last successful apply. Conditions keep their transition time while their
/// status stays the same, so an unchanged outcome gives an unchanged status.
pub fn addon_status(
    previous: &AddonStatus,
    outcome: &Outcome,
    generation: Option<i64>,
    now: &str,
) -> AddonStatus {
    let mut next = previous.clone();
    next.observed_generation = generation;
    let c = &mut next.conditions;
    match outcome {
        Outcome::Synced { applied, hash } => {
            set_condition(
                c,
                "Rendered",
                true,
                "Rendered",
                String::new(),
                generation,
                now,
            );
            let message = format!("{} objects applied", applied.len());
            set_condition(c, "Applied", true, "Applied", message, generation, now);
            set_condition(
                c,
                "InSync",
                true,
                "InSync",
                "the user cluster holds what the addon renders".into(),
                generation,
                now,
            );
            next.applied_objects = applied.clone();
            next.last_applied_hash = Some(hash.clone());
            next.last_applied_time = Some(now.to_string());
        }
        Outcome::RenderFailed(failure) => {
            let message = bounded(failure.message.clone());
            let reason = failure.reason.as_str();
            set_condition(
                c,
                "Rendered",
                false,
                reason,
                message.clone(),
                generation,
                now,
            );
            set_condition(
                c,
                "Applied",
                false,
                reason,
                "nothing applied: the addon does not render".into(),
                generation,
                now,
            );
            set_condition(c, "InSync", false, reason, message, generation, now);
        }
        Outcome::ApplyFailed {
            failure,
            applied,
            not_pruned,
        } => {
            let message = bounded(failure.message.clone());
            let reason = failure.reason.as_str();
            set_condition(
                c,
                "Rendered",
                true,
                "Rendered",
                String::new(),
                generation,
                now,
            );
            set_condition(
                c,
                "Applied",
                false,
                reason,
                message.clone(),
                generation,
                now,
            );
            set_condition(c, "InSync", false, reason, message, generation, now);
            // Never cut short: an object dropped from the inventory could never be pruned. An
            // inventory over the CRD's bound makes the status write fail (reported), while
            // the applier still remembers every object.
            next.applied_objects =
                inventory_after_failure(&previous.applied_objects, applied, not_pruned);
        }
    }
    next
}

/// The status of an Addon whose user cluster cannot be worked on at all (no usable kubeconfig):
/// rendering still reported truthfully, applying refused with `failure`.
pub fn unreachable_status(
    previous: &AddonStatus,
    rendered: Result<(), &Failure>,
    failure: &Failure,
    generation: Option<i64>,
    now: &str,
) -> AddonStatus {
    match rendered {
        Err(render_failure) => addon_status(
            previous,
            &Outcome::RenderFailed(render_failure.clone()),
            generation,
            now,
        ),
        Ok(()) => addon_status(
            previous,
            &Outcome::ApplyFailed {
                failure: failure.clone(),
                applied: Vec::new(),
                not_pruned: Vec::new(),
            },
            generation,
            now,
        ),
    }
}

/// The Cluster's `AddonsReady` condition from its Addons' statuses, as
/// `(status, reason, message)`: true when every Addon is in sync (or there are none), else the
/// reason of the first Addon (by name) that is not, and one line per such Addon.
pub fn addons_ready(addons: &[(String, AddonStatus)]) -> (bool, String, String) {
    if addons.is_empty() {
        return (true, "NoAddons".into(), "the cluster has no Addons".into());
    }
    let mut sorted: Vec<&(String, AddonStatus)> = addons.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut failing = Vec::new();
    let mut first_reason = None;
    for (name, status) in sorted {
        let in_sync = status.conditions.iter().find(|c| c.type_ == "InSync");
        match in_sync {
            Some(Condition { status: s, .. }) if s == "True" => {}
            Some(c) => {
                first_reason.get_or_insert_with(|| c.reason.clone());
                failing.push(format!("{name}: {} ({})", c.message, c.reason));
            }
            None => {
                first_reason.get_or_insert_with(|| "Pending".to_string());
                failing.push(format!("{name}: not synced yet"));
            }
        }
    }
    match first_reason {
        None => (
            true,
            "InSync".into(),
            format!("{} addons in sync", addons.len()),
        ),
        Some(reason) => (false, reason, bounded(failing.join("; "))),
    }
}

/// A stable 64-bit FNV-1a hash of the rendered manifests, as 16 hex digits (a change detector,
/// not a security measure: the same bytes always give the same hash, across versions too).
pub fn manifest_hash(text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.as_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(kind: &str, name: &str) -> AppliedObject {
        AppliedObject {
            api_version: "metallb.io/v1beta1".into(),
            kind: kind.into(),
            namespace: "metallb-system".into(),
            name: name.into(),
        }
    }

    fn condition<'a>(s: &'a AddonStatus, t: &str) -> &'a Condition {
        s.conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("no {t}"))
    }

    #[test]
    fn synced_then_failed_keeps_every_object_it_may_have_created() {
        let a = obj("IPAddressPool", "a");
        let b = obj("IPAddressPool", "b");
        let l2 = obj("L2Advertisement", "l2");
        let synced = addon_status(
            &AddonStatus::default(),
            &Outcome::Synced {
                applied: vec![a.clone(), l2.clone()],
                hash: "h1".into(),
            },
            Some(3),
            "t1",
        );
        assert_eq!(condition(&synced, "InSync").status, "True");
        assert_eq!(synced.applied_objects, vec![a.clone(), l2.clone()]);
        assert_eq!(synced.last_applied_time.as_deref(), Some("t1"));
        assert_eq!(synced.observed_generation, Some(3));
        // The same outcome later changes nothing but the time of the last apply.
        let again = addon_status(
            &synced,
            &Outcome::Synced {
                applied: vec![a.clone(), l2.clone()],
                hash: "h1".into(),
            },
            Some(3),
            "t2",
        );
        assert_eq!(again.conditions, synced.conditions);

        // b rendered now, a no longer; b applied, then the user cluster went away before a
        // was pruned: a, b and l2 are all still tracked.
        let failed = addon_status(
            &synced,
            &Outcome::ApplyFailed {
                failure: Failure {
                    reason: Reason::Unreachable,
                    message: "connection refused".into(),
                },
                applied: vec![b.clone()],
                not_pruned: vec![a.clone()],
            },
            Some(4),
            "t3",
        );
        assert_eq!(failed.applied_objects, vec![a, b, l2]);
        let in_sync = condition(&failed, "InSync");
        assert_eq!(
            (in_sync.status.as_str(), in_sync.reason.as_str()),
            ("False", "Unreachable")
        );
        assert_eq!(in_sync.last_transition_time.as_deref(), Some("t3"));
        assert_eq!(failed.last_applied_time.as_deref(), Some("t1"));
        assert_eq!(failed.last_applied_hash.as_deref(), Some("h1"));
    }

    #[test]
    fn render_failure_touches_no_inventory() {
        let a = obj("IPAddressPool", "a");
        let previous = AddonStatus {
            applied_objects: vec![a.clone()],
            ..Default::default()
        };
        let s = addon_status(
            &previous,
            &Outcome::RenderFailed(Failure {
                reason: Reason::TemplateError,
                message: "addons/metallb/10.yaml:3: boom".into(),
            }),
            Some(1),
            "t",
        );
        assert_eq!(s.applied_objects, vec![a]);
        assert_eq!(condition(&s, "Rendered").reason, "TemplateError");
        assert_eq!(condition(&s, "Rendered").status, "False");
    }

    #[test]
    fn prune_set_and_summary() {
        let a = obj("IPAddressPool", "a");
        let b = obj("IPAddressPool", "b");
        assert_eq!(
            to_prune(&[a.clone(), b.clone()], std::slice::from_ref(&b)),
            vec![a.clone()]
        );
        assert!(to_prune(std::slice::from_ref(&a), std::slice::from_ref(&a)).is_empty());

        assert!(addons_ready(&[]).0);
        let ok = addon_status(
            &AddonStatus::default(),
            &Outcome::Synced {
                applied: vec![],
                hash: "h".into(),
            },
            None,
            "t",
        );
        let bad = addon_status(
            &AddonStatus::default(),
            &Outcome::ApplyFailed {
                failure: Failure {
                    reason: Reason::MissingCRD,
                    message: "no IPAddressPool".into(),
                },
                applied: vec![],
                not_pruned: vec![],
            },
            None,
            "t",
        );
        assert_eq!(
            addons_ready(&[("m".into(), ok.clone())]),
            (true, "InSync".into(), "1 addons in sync".into())
        );
        let (ready, reason, message) = addons_ready(&[("z".into(), ok), ("m".into(), bad)]);
        assert!(!ready);
        assert_eq!(reason, "MissingCRD");
        assert_eq!(message, "m: no IPAddressPool (MissingCRD)");
    }

    #[test]
    fn hash_is_stable_and_messages_bounded() {
        assert_eq!(manifest_hash(""), "cbf29ce484222325");
        assert_ne!(manifest_hash("a"), manifest_hash("b"));
        let long = "é".repeat(MAX_MESSAGE as usize);
        assert!(bounded(long).len() <= MAX_MESSAGE as usize);
    }
}
