//! `IPAMAllocation`: what one cluster holds from one pool.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds::*;
use super::{AllocationType, Condition};

/// The addresses one user cluster holds from one pool. Lives in the cluster's namespace
/// (`cluster-<name>`) and is named after the pool.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.kipam.dev",
    version = "v1alpha1",
    kind = "IPAMAllocation",
    plural = "ipamallocations",
    singular = "ipamallocation",
    doc = "The addresses one user cluster holds from one pool.",
    shortname = "ipa",
    namespaced,
    status = "IPAMAllocationStatus",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".metadata.labels.ipam\\.kipam\\.dev/pool"}"#,
    printcolumn = r#"{"name":"DC","type":"string","jsonPath":".spec.dc"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Addresses","type":"string","description":"The addresses held, short (annotation ipam.kipam.dev/addresses).","jsonPath":".metadata.annotations.ipam\\.kipam\\.dev/addresses"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","description":"The phase (label ipam.kipam.dev/phase).","jsonPath":".metadata.labels.ipam\\.kipam\\.dev/phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"description":"Why the allocation is in its phase, when kipam wrote a status.","jsonPath":".status.message"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPAMAllocationSpec {
    /// The pool's allocation type in this datacenter.
    #[serde(rename = "type")]
    pub type_: AllocationType,
    /// The datacenter of the pool the addresses come from.
    #[schemars(length(max = MAX_LABEL), pattern(PATTERN_DNS_LABEL))]
    pub dc: String,
    /// `prefix` allocations: the subnet held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_CIDR), pattern(PATTERN_CIDR))]
    pub cidr: Option<String>,
    /// `range` allocations: the addresses held, as `first-last` pieces. Several disjoint
    /// pieces are normal; growth appends pieces and never rewrites one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_ALLOCATION_PIECES),
        inner(length(max = MAX_ADDRESS_RANGE), pattern(PATTERN_ADDRESS_RANGE))
    )]
    pub addresses: Vec<String>,
}

/// Lifecycle of an allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AllocationPhase {
    /// Not planned yet.
    #[default]
    Pending,
    /// The addresses in `spec` are held.
    Allocated,
    /// The request could not be met (see `message`); retried when capacity frees up.
    Failed,
    /// The addresses were returned to the pool.
    Released,
    /// The stored allocation can no longer be honoured as it is (it overlaps another
    /// allocation or an exclusion, leaves the pool, or cannot be read). kipam keeps it exactly
    /// as stored, keeps its addresses reserved and waits for a human (see `message`).
    Conflict,
}

impl AllocationPhase {
    pub fn as_str(&self) -> &'static str {
        match self {
            AllocationPhase::Pending => "Pending",
            AllocationPhase::Allocated => "Allocated",
            AllocationPhase::Failed => "Failed",
            AllocationPhase::Released => "Released",
            AllocationPhase::Conflict => "Conflict",
        }
    }
}

impl IPAMAllocation {
    /// The allocation's phase as readers should take it. kipam writes a status only when it
    /// says more than the spec: an allocation without one is `Allocated` when its spec holds
    /// addresses (the healthy case, one write per allocation) and `Pending` otherwise (created,
    /// its status not written yet).
    pub fn phase(&self) -> AllocationPhase {
        allocation_phase(&self.spec, self.status.as_ref())
    }
}

/// [`IPAMAllocation::phase`] of an allocation with this spec and status.
pub fn allocation_phase(
    spec: &IPAMAllocationSpec,
    status: Option<&IPAMAllocationStatus>,
) -> AllocationPhase {
    match status.and_then(|s| s.phase) {
        Some(phase) => phase,
        None if spec.cidr.is_some() || !spec.addresses.is_empty() => AllocationPhase::Allocated,
        None => AllocationPhase::Pending,
    }
}

/// What the `ipam.kipam.dev/addresses` annotation says for this spec: the CIDR of a prefix
/// allocation, the pieces of a range one shortened (see [`crate::address::summary`]); `None`
/// when it holds nothing. Pieces that do not parse are shown as written.
pub fn address_summary(spec: &IPAMAllocationSpec) -> Option<String> {
    if let Some(cidr) = &spec.cidr {
        return Some(cidr.clone());
    }
    if spec.addresses.is_empty() {
        return None;
    }
    Some(crate::address::summary::summary_of_text(
        spec.addresses.iter().map(String::as_str),
    ))
}

/// Observed state of an allocation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAMAllocationStatus {
    /// `Pending`, `Allocated`, `Failed`, `Released` or `Conflict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AllocationPhase>,
    /// Why the allocation is in its phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_MESSAGE))]
    pub message: Option<String>,
    /// When the addresses were first handed out (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TIMESTAMP), extend("format" = "date-time"))]
    pub allocated_at: Option<String>,
    /// Detailed conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_CONDITIONS))]
    pub conditions: Vec<Condition>,
    /// Allocations of a pool datacenter with `growth`: every piece of `spec.addresses` and
    /// why it is held (`Initial`, `Grown` by demand, or `Pinned` by the cluster), and for a
    /// grown piece when it was added and since when no LoadBalancer Service uses it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ALLOCATION_PIECES))]
    pub pieces: Vec<PieceStatus>,
}

/// One piece of a range allocation and why it is held.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PieceStatus {
    /// The piece, `first-last` or a single address, as in `spec.addresses`.
    #[schemars(length(max = MAX_ADDRESS_RANGE), pattern(PATTERN_ADDRESS_RANGE))]
    pub addresses: String,
    /// `Initial` (the allocation's own size, never shrunk), `Grown` (added for demand, given
    /// back once unused for the pool's `shrinkAfter`) or `Pinned` (asked for by the cluster).
    pub kind: PieceKind,
    /// Grown pieces: when the piece was added (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TIMESTAMP), extend("format" = "date-time"))]
    pub grown_at: Option<String>,
    /// Grown pieces: since when no LoadBalancer Service of the user cluster holds any of its
    /// addresses (RFC 3339); absent while one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TIMESTAMP), extend("format" = "date-time"))]
    pub unused_since: Option<String>,
}

/// Why a piece of an allocation is held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PieceKind {
    /// The allocation's own size (`allocationRange`); never shrunk by demand.
    #[default]
    Initial,
    /// Added because LoadBalancer Services waited for addresses.
    Grown,
    /// Asked for exactly by the cluster (`addresses` override).
    Pinned,
}
