//! `Cluster`: a user cluster the seed serves.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;
use super::bounds::*;

/// A user cluster served by this seed. kipam gives it the namespace `cluster-<name>` and one
/// `IPAMAllocation` there for every pool that lists its datacenter.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.kipam.dev",
    version = "v1alpha1",
    kind = "Cluster",
    plural = "clusters",
    singular = "cluster",
    doc = "A user cluster served by this seed.",
    status = "ClusterStatus",
    printcolumn = r#"{"name":"Datacenter","type":"string","jsonPath":".spec.datacenter"}"#,
    printcolumn = r#"{"name":"IPAM","type":"string","jsonPath":".status.conditions[?(@.type==\"IPAMReady\")].status"}"#,
    printcolumn = r#"{"name":"Addons","type":"string","jsonPath":".status.conditions[?(@.type==\"AddonsReady\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// The datacenter the cluster runs in; pools listing it serve the cluster.
    #[schemars(length(max = MAX_LABEL), pattern(PATTERN_DNS_LABEL))]
    pub datacenter: String,
    /// Where the cluster's kubeconfig is, to push addons into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<KubeconfigReference>,
    /// Pool name -> how this cluster departs from the pool's defaults.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = MAX_OVERRIDES,
        "x-kubernetes-validations" = [{
            "rule": format!("self.all(pool, size(pool) <= {MAX_LABEL})"),
            "message": format!("pool names must be at most {MAX_LABEL} characters"),
        }]
    ))]
    pub ipam: BTreeMap<String, ClusterPoolOverride>,
    /// When true, kipam leaves the cluster alone (no allocation, growth or release).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pause: bool,
    /// Take over a user cluster that already runs MetalLB (see `docs/adopt.md`): `DryRun`,
    /// `Adopt` or `Disabled`. When left out, the `adopt` of its datacenter in the pools that serve
    /// it applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<super::AdoptMode>,
}

/// A reference to a kubeconfig stored in a Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeconfigReference {
    /// The Secret key holding the kubeconfig.
    pub secret_ref: SecretKeyRef,
}

/// A key of a Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Namespace of the Secret; when left out, the cluster's namespace `cluster-<name>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = MAX_LABEL), pattern(PATTERN_DNS_LABEL))]
    pub namespace: String,
    /// Name of the Secret.
    #[schemars(length(max = MAX_SUBDOMAIN), pattern(PATTERN_DNS_SUBDOMAIN))]
    pub name: String,
    /// Key inside the Secret (default `kubeconfig`).
    #[serde(default = "default_kubeconfig_key")]
    #[schemars(length(max = MAX_SECRET_KEY), pattern(PATTERN_SECRET_KEY))]
    pub key: String,
}

fn default_kubeconfig_key() -> String {
    "kubeconfig".to_string()
}

/// How one cluster departs from a pool's defaults. At most one of `allocationRange`,
/// `allocationPrefix`, `addresses`, `cidr` and `optOut` may be set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPoolOverride {
    /// `range` pools: this many addresses instead of the pool's `allocationRange`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_ALLOCATION_RANGE))]
    pub allocation_range: Option<i64>,
    /// `prefix` pools: a subnet of this length instead of the pool's `allocationPrefix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_PREFIX_LENGTH))]
    pub allocation_prefix: Option<i32>,
    /// `range` pools: exactly these addresses (`a.b.c.d`, `first-last` or CIDR pieces), or a
    /// clear refusal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_OVERRIDE_PIECES),
        inner(length(max = MAX_ADDRESS_RANGE), pattern(PATTERN_ADDRESS_RANGE))
    )]
    pub addresses: Vec<String>,
    /// `prefix` pools: exactly this subnet, or a clear refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_CIDR), pattern(PATTERN_CIDR))]
    pub cidr: Option<String>,
    /// No allocation from this pool; an existing one is released.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opt_out: bool,
    /// Demand-driven growth for this cluster, when the pool datacenter has `growth`: a
    /// lower or higher `max`, or `enabled: false` to keep this cluster at its initial size.
    /// It may go with `allocationRange`, not with `addresses`, `cidr` or `optOut`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<ClusterGrowth>,
}

/// How one cluster departs from a pool datacenter's `growth`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGrowth {
    /// `false`: this cluster never grows (grown pieces it holds are given back once unused).
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The most addresses this cluster may hold from the pool, instead of the pool's
    /// `growth.max`: at least its initial size, at most the pool size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_ALLOCATION_RANGE))]
    pub max: Option<i64>,
}

/// Observed state of a cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The namespace holding the cluster's allocations and addons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_LABEL), pattern(PATTERN_DNS_LABEL))]
    pub namespace: Option<String>,
    /// `IPAMReady`, `AddonsReady`, ...
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_CONDITIONS))]
    pub conditions: Vec<Condition>,
    /// Present while `adopt` (the cluster's or its datacenter's) is `DryRun` or `Adopt`: what
    /// the user cluster serves and what kipam does (or would do) with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption: Option<AdoptionStatus>,
}

/// Where taking over a user cluster that already runs MetalLB stands.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionStatus {
    /// `DryRun` or `Adopt`: the value that applies.
    #[schemars(length(max = MAX_LABEL))]
    pub mode: String,
    /// `Waiting` (not read yet), `NeedsLook` (a person must act first, see `reasons`),
    /// `DryRun` (read; what `Adopt` would do is below), `Adopting` (allocation committed,
    /// the hand-made MetalLB pool not taken over yet) or `Adopted`.
    #[schemars(length(max = MAX_LABEL))]
    pub state: String,
    /// Why it waits or needs a look, one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ADOPTION_LINES), inner(length(max = MAX_ADOPTION_LINE)))]
    pub reasons: Vec<String>,
    /// Every address the user cluster's `LoadBalancer` Services hold, with what kipam does
    /// with it (the first 512; `servedTotal` counts them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ADOPTION_ADDRESSES))]
    pub served: Vec<AdoptionAddress>,
    /// How many addresses the user cluster serves in all.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub served_total: i64,
    /// The MetalLB `IPAddressPool`s kipam did not create.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ADOPTION_LINES))]
    pub hand_made_pools: Vec<AdoptionHandMadePool>,
    /// Other user clusters (or holders) with a claim on the same addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ADOPTION_LINES))]
    pub conflicts: Vec<AdoptionConflict>,
    /// Per pool, the pieces that become (in a dry run: would become) the cluster's
    /// allocation: the same as `spec.ipam.<pool>.addresses` overrides a person could set
    /// instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_OVERRIDES))]
    pub adopt: Vec<AdoptionPool>,
}

/// What one pool's allocation adopts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionPool {
    /// The kipam pool.
    #[schemars(length(max = MAX_SUBDOMAIN))]
    pub pool: String,
    /// The pieces, `a.b.c.d` or `first-last`.
    #[schemars(length(max = MAX_OVERRIDE_PIECES), inner(length(max = MAX_ADDRESS_RANGE)))]
    pub addresses: Vec<String>,
}

/// One address a user cluster serves.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionAddress {
    /// The address.
    #[schemars(length(max = MAX_ADDRESS))]
    pub address: String,
    /// The Services holding it, `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = MAX_ADOPTION_LINE)))]
    pub services: Vec<String>,
    /// `Adopt`, `Held` (already its own), `Outside` (every pool), `Contested`, `Taken` (kipam
    /// gave it to another holder) or `Excluded`.
    #[schemars(length(max = MAX_LABEL))]
    pub verdict: String,
    /// The pool whose datacenter covers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SUBDOMAIN))]
    pub pool: Option<String>,
    /// `Contested`: the other user clusters; `Taken`: the holder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = MAX_ADOPTION_LINE)))]
    pub with: Vec<String>,
}

/// A MetalLB pool typed in by hand in the user cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionHandMadePool {
    /// Its namespace.
    #[schemars(length(max = MAX_LABEL))]
    pub namespace: String,
    /// Its name.
    #[schemars(length(max = MAX_SUBDOMAIN))]
    pub name: String,
    /// Its `spec.addresses`, as written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_OVERRIDE_PIECES), inner(length(max = MAX_ADOPTION_LINE)))]
    pub addresses: Vec<String>,
    /// The kipam pools it overlaps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = MAX_SUBDOMAIN)))]
    pub pools: Vec<String>,
    /// Its pieces outside every kipam pool: kept in it as they are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_OVERRIDE_PIECES), inner(length(max = MAX_ADDRESS_RANGE)))]
    pub outside: Vec<String>,
    /// The kipam pool whose allocation takes it over in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_SUBDOMAIN))]
    pub taken_over_by: Option<String>,
}

/// Addresses another user cluster (or holder) also has a claim on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionConflict {
    /// The other user cluster, or the holder (`claim/<namespace>/<name>` for a machine).
    #[schemars(length(max = MAX_ADOPTION_LINE))]
    pub with: String,
    /// `BothServe`, `Held`, `TheirPoolCovers` or `CoversTheirs`.
    #[schemars(length(max = MAX_LABEL))]
    pub kind: String,
    /// The addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_OVERRIDE_PIECES), inner(length(max = MAX_ADDRESS_RANGE)))]
    pub addresses: Vec<String>,
}
