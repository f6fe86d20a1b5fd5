//! The custom resources of API group `ipam.kipam.dev`, version `v1alpha1`.
//!
//! The Rust types are the source of truth: the CRD manifests under `crds/` are generated from
//! them (`kipam crds`) and a test fails when they are stale. Field names follow KKP so a KKP
//! manifest works after changing its `apiVersion`.

mod addon;
mod allocation;
pub mod bounds;
pub mod capi;
mod cluster;
mod condition;
mod pool;
mod record;

pub use addon::{Addon, AddonSpec, AddonStatus, AppliedObject};
pub use allocation::{
    AllocationPhase, IPAMAllocation, IPAMAllocationSpec, IPAMAllocationStatus, address_summary,
    allocation_phase,
};
pub use allocation::{PieceKind, PieceStatus};
pub use cluster::ClusterGrowth;
pub use cluster::{
    AdoptionAddress, AdoptionConflict, AdoptionHandMadePool, AdoptionPool, AdoptionStatus, Cluster,
    ClusterPoolOverride, ClusterSpec, ClusterStatus, KubeconfigReference, SecretKeyRef,
};
pub use condition::Condition;
pub use pool::AdoptMode;
pub use pool::PoolCidrUsage;
pub use pool::PoolGrowth;
pub use pool::PoolNetwork;
pub use pool::{
    AllocationType, DatacenterUsage, IPAMPool, IPAMPoolDatacenter, IPAMPoolSpec, IPAMPoolStatus,
    PoolStrategy, ReclaimPolicy,
};
pub use record::{
    IPAMPoolRecord, IPAMPoolRecordSpec, MAX_RECORD_BYTES, MAX_RECORD_ENTRIES, RECORD_FORMAT,
    Reservation, record_name, record_owner,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group.
pub const GROUP: &str = "ipam.kipam.dev";
/// The API version of every kind, `group/version`.
pub const API_VERSION: &str = "ipam.kipam.dev/v1alpha1";

/// Label on an `IPAMAllocation`: the pool it was taken from.
pub const LABEL_POOL: &str = "ipam.kipam.dev/pool";
/// Label on an `IPAMAllocation`: the cluster that holds it.
pub const LABEL_CLUSTER: &str = "ipam.kipam.dev/cluster";
/// Label on an `IPAMAllocation`: the datacenter of the pool.
pub const LABEL_DATACENTER: &str = "ipam.kipam.dev/datacenter";
/// Label on an `IPAMAllocation`: its phase (`Allocated`, `Failed`, `Conflict`, ...), set in
/// the request that creates it and changed only with the phase, so that `kubectl get ipa`
/// shows a phase without a status write for every healthy allocation.
pub const LABEL_PHASE: &str = "ipam.kipam.dev/phase";
/// Annotation on an `IPAMAllocation`: its addresses in a short form for people
/// (`192.168.1.0, .2-.4`), read by the `ADDRESSES` column; derived from `spec`.
pub const ANNOTATION_ADDRESSES: &str = "ipam.kipam.dev/addresses";
/// Annotation on an `IPAMAllocation`: the pool's `reclaimPolicy` when it was last planned, so a
/// pool that disappears without a controller watching (offline mode) is still honoured.
pub const ANNOTATION_RECLAIM_POLICY: &str = "ipam.kipam.dev/reclaim-policy";
/// Annotation on an `IPAMAllocation` written by `kipam offline`: the `addressSpace` of its
/// pool when it was last planned (`default` for the default one), so that once the pool is
/// gone (kept by `reclaimPolicy: Retain`) the state file still says in which space its
/// addresses count.
pub const ANNOTATION_ADDRESS_SPACE: &str = "ipam.kipam.dev/address-space";
/// Annotation on an `IPAMAllocation` of a prefix pool written by `kipam offline`: the pool
/// datacenter's `allocationPrefix` when the allocation was last planned, so that the state
/// tells a changed `allocationPrefix` from a subnet a pin or an override (since removed) gave.
pub const ANNOTATION_POOL_ALLOCATION_PREFIX: &str = "ipam.kipam.dev/pool-allocation-prefix";
/// Annotation on an `IPAMAllocation` made by adoption: `namespace/name` of the hand-made
/// MetalLB `IPAddressPool` in the user cluster that the allocation's MetalLB pool takes over in place
/// (the addon renders its pool under that name). Set once, when the allocation is created.
pub const ANNOTATION_METALLB_POOL: &str = "ipam.kipam.dev/metallb-pool";
/// Annotation beside [`ANNOTATION_METALLB_POOL`]: the pieces of that hand-made pool outside
/// every kipam pool, comma-separated, written back into it unchanged.
pub const ANNOTATION_METALLB_KEPT: &str = "ipam.kipam.dev/metallb-kept";
/// Finalizer on clusters: their allocations are released before they go.
pub const CLUSTER_FINALIZER: &str = "ipam.kipam.dev/release-allocations";
/// Finalizer on pools: their allocations are deleted or retained before they go.
pub const POOL_FINALIZER: &str = "ipam.kipam.dev/reclaim-allocations";

/// The current time as Kubernetes writes timestamps (RFC 3339, UTC, whole seconds).
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The namespace kipam keeps a cluster's allocations and addons in.
pub fn cluster_namespace(cluster: &str) -> String {
    format!("{}{cluster}", bounds::CLUSTER_NAMESPACE_PREFIX)
}

/// The cluster a `cluster-<name>` namespace belongs to.
pub fn cluster_of_namespace(namespace: &str) -> Option<&str> {
    namespace
        .strip_prefix(bounds::CLUSTER_NAMESPACE_PREFIX)
        .filter(|n| !n.is_empty())
}

/// Every CRD, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        with_name_rule(
            IPAMPool::crd(),
            bounds::MAX_LABEL,
            "the pool name is the name of its IPAMAllocations and a label value",
        ),
        IPAMAllocation::crd(),
        with_name_rule(
            Cluster::crd(),
            bounds::MAX_CLUSTER_NAME,
            "the namespace cluster-<name> must be a DNS-1123 label",
        ),
        Addon::crd(),
        IPAMPoolRecord::crd(),
    ]
}

/// Adds a CEL rule on the object's root that narrows `metadata.name` from the DNS-1123
/// subdomain the server already requires to a label of at most `max` characters. A name
/// without dots that is a subdomain is a label, so the rule needs no regular expression and
/// costs next to nothing.
fn with_name_rule(
    mut crd: CustomResourceDefinition,
    max: u32,
    why: &str,
) -> CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema
                .x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(ValidationRule {
                    rule: format!(
                        "size(self.metadata.name) <= {max} && !self.metadata.name.contains('.')"
                    ),
                    message: Some(format!(
                        "metadata.name must be a DNS-1123 label of at most {max} characters: {why}"
                    )),
                    ..Default::default()
                });
        }
    }
    crd
}

/// Every CRD as `(file name, YAML)`, the layout of `crds/` (`<plural>.<group>.yaml`).
pub fn crd_files() -> Result<Vec<(String, String)>, serde_saphyr::ser::Error> {
    crds()
        .into_iter()
        .map(|crd| {
            let name = format!("{}.yaml", crd.metadata.name.clone().unwrap_or_default());
            serde_saphyr::to_string(&crd).map(|yaml| (name, yaml))
        })
        .collect()
}

/// Every CRD as one multi-document YAML stream, ready for `kubectl apply -f -`.
pub fn crds_yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for (_, yaml) in crd_files()? {
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    Ok(out)
}

/// Schema of a free-form object (`x-kubernetes-preserve-unknown-fields`).
pub(crate) fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}
