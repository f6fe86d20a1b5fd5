//! Reading stored `IPAMAllocation`s back.

use crate::address::{AddrRange, Cidr};
use crate::allocator::Allocation;
use crate::planner::StoredAllocation;
use crate::resources::{
    ANNOTATION_RECLAIM_POLICY, AllocationPhase, AllocationType, IPAMAllocation, IPAMAllocationSpec,
    IPAMAllocationStatus, ReclaimPolicy, cluster_of_namespace,
};

use super::{Errors, FieldError};

/// Parses a stored allocation exactly as it was written. An allocation without addresses (a
/// failed or pending request) holds nothing.
pub fn stored_allocation(obj: &IPAMAllocation) -> Result<StoredAllocation, Vec<FieldError>> {
    stored_allocation_of(&AllocationParts {
        namespace: obj.metadata.namespace.as_deref().unwrap_or_default(),
        name: obj.metadata.name.as_deref().unwrap_or_default(),
        spec: &obj.spec,
        status: obj.status.as_ref(),
        reclaim_policy: obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_RECLAIM_POLICY))
            .map(String::as_str),
    })
}

/// What [`stored_allocation_of`] reads of a stored allocation, however it is held.
pub struct AllocationParts<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub spec: &'a IPAMAllocationSpec,
    pub status: Option<&'a IPAMAllocationStatus>,
    /// The reclaim-policy annotation.
    pub reclaim_policy: Option<&'a str>,
}

/// [`stored_allocation`] over the parts of an allocation.
pub fn stored_allocation_of(
    parts: &AllocationParts<'_>,
) -> Result<StoredAllocation, Vec<FieldError>> {
    let namespace = parts.namespace.to_string();
    let pool = parts.name.to_string();
    let spec = parts.spec;
    let mut errors = Errors::new(format!("IPAMAllocation {namespace}/{pool}"));
    let cluster = match cluster_of_namespace(&namespace) {
        Some(c) => c.to_string(),
        None => {
            errors.add(
                "metadata.namespace",
                &namespace,
                "must be cluster-<cluster name>",
            );
            String::new()
        }
    };
    if pool.is_empty() {
        errors.add("metadata.name", "", "is required (the pool name)");
    }
    if spec.dc.is_empty() {
        errors.add("spec.dc", "", "is required");
    }
    let released = parts
        .status
        .and_then(|s| s.phase)
        .is_some_and(|p| p == AllocationPhase::Released);
    // An entry whose data disagrees with its type is not read as something else (and never
    // silently dropped: the planner would give the cluster other addresses).
    match spec.type_ {
        AllocationType::Range => {
            if let Some(cidr) = &spec.cidr {
                errors.add(
                    "spec.cidr",
                    cidr,
                    "a range allocation holds spec.addresses, not a cidr: the entry disagrees \
                     with its type (type: range)",
                );
            }
        }
        AllocationType::Prefix => {
            if !spec.addresses.is_empty() {
                errors.add(
                    "spec.addresses",
                    spec.addresses.join(","),
                    "a prefix allocation holds spec.cidr, not addresses: the entry disagrees \
                     with its type (type: prefix)",
                );
            }
        }
    }
    let held = match spec.type_ {
        AllocationType::Range => {
            let mut pieces = Vec::new();
            for (i, text) in spec.addresses.iter().enumerate() {
                match text.parse::<AddrRange>() {
                    Ok(r) => pieces.push(r),
                    Err(e) => errors.add(format!("spec.addresses[{i}]"), text, e.to_string()),
                }
            }
            // Kept for as long as the allocation is stored: no spare room.
            pieces.shrink_to_fit();
            (!pieces.is_empty()).then_some(Allocation::Range(pieces))
        }
        AllocationType::Prefix => match &spec.cidr {
            None => None,
            Some(text) => match text.parse::<Cidr>() {
                Ok(c) => Some(Allocation::Prefix(c)),
                Err(e) => {
                    errors.add("spec.cidr", text, e.to_string());
                    None
                }
            },
        },
    };
    let reclaim_policy = parts.reclaim_policy.and_then(|v| match v {
        "Retain" => Some(ReclaimPolicy::Retain),
        "Delete" => Some(ReclaimPolicy::Delete),
        _ => None,
    });
    errors.into_result(StoredAllocation {
        cluster,
        pool,
        datacenter: spec.dc.clone(),
        held: if released { None } else { held },
        reclaim_policy,
        unreadable: None,
    })
}
