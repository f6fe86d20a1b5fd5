//! Cluster API's IPAM kinds, as kipam reads and writes them (`ipam.cluster.x-k8s.io/v1beta2`),
//! and the one field of Cluster API's `Cluster` it honours (`spec.paused`).
//!
//! kipam does not define or ship these kinds: Cluster API installs their CRDs. The types are
//! written here with no schema of their own, and hold only the fields kipam uses; anything
//! else an object carries is left alone, because kipam writes claims with merge patches of
//! the fields it owns and creates `IPAddress`es whole.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::Condition;

/// Cluster API's IPAM API group.
pub const CAPI_IPAM_GROUP: &str = "ipam.cluster.x-k8s.io";
/// The version kipam reads and writes (the stored one). A claim written as `v1beta1` is
/// served through it: the API server hands it out in the version asked for.
pub const CAPI_IPAM_VERSION: &str = "ipam.cluster.x-k8s.io/v1beta2";
/// The kind a claim's `spec.poolRef` names for a kipam pool (with group [`super::GROUP`]).
pub const POOL_KIND: &str = "IPAMPool";
/// The contract's finalizer on a claim: the address is released before the claim goes.
pub const CLAIM_FINALIZER: &str = "ipam.cluster.x-k8s.io/ReleaseAddress";
/// The contract's finalizer on an `IPAddress`: it stays while its claim does.
pub const ADDRESS_FINALIZER: &str = "ipam.cluster.x-k8s.io/ProtectAddress";
/// Annotation on a claim: the datacenter of the pool to take its address from.
pub const ANNOTATION_CLAIM_DATACENTER: &str = "ipam.kipam.dev/datacenter";
/// Annotation on a claim: the one address (or, in a `prefix` pool, the subnet) it asks for.
pub const ANNOTATION_REQUESTED_ADDRESS: &str = "ipam.kipam.dev/requested-address";
/// Cluster API's pause annotation (on a `Cluster`, and on any object it pauses).
pub const ANNOTATION_CAPI_PAUSED: &str = "cluster.x-k8s.io/paused";
/// The older way a claim names its Cluster API cluster (before `spec.clusterName`).
pub const LABEL_CAPI_CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";
/// `app.kubernetes.io/managed-by: kipam` on every `IPAddress` kipam writes.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kipam");
/// Label on an `IPAddress` kipam wrote: the datacenter of the pool it came from.
pub use super::LABEL_DATACENTER as LABEL_ADDRESS_DATACENTER;

/// The record and planner name of a claim as a holder of addresses: `claim/<namespace>/<name>`.
/// A `/` never appears in a cluster name, so no cluster can be taken for a claim (nor a claim
/// for a quarantine entry, whose prefix is `quarantined/`).
pub fn claim_holder(namespace: &str, name: &str) -> String {
    format!("{CLAIM_HOLDER_PREFIX}{namespace}/{name}")
}

/// The prefix of every claim holder's name.
pub const CLAIM_HOLDER_PREFIX: &str = "claim/";

/// The (namespace, name) of the claim a holder's name stands for, if it is a claim's.
pub fn claim_of_holder(holder: &str) -> Option<(&str, &str)> {
    holder.strip_prefix(CLAIM_HOLDER_PREFIX)?.split_once('/')
}

/// The prefix of a pool record entry holding the address of a hand-made `IPAddress` (one that
/// kipam did not write) that the admission webhook admitted:
/// `ipaddress/<namespace>/<name>@<admission time>`. The webhook commits it behind the record's
/// fence before it answers, so no commit planned without the object can hand the address out
/// while the object shows it; the planner keeps the entry while the object exists.
pub const HAND_MADE_PREFIX: &str = "ipaddress/";

/// The record entry of hand-made `IPAddress` `namespace`/`name`, admitted at `admitted_at`
/// (seconds since the Unix epoch).
pub fn hand_made_holder(namespace: &str, name: &str, admitted_at: i64) -> String {
    let when = k8s_openapi::jiff::Timestamp::from_second(admitted_at)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| admitted_at.to_string());
    format!("{HAND_MADE_PREFIX}{namespace}/{name}@{when}")
}

/// The hand-made `IPAddress` a record entry stands for: (namespace, name, admission time),
/// the time `None` when it does not read (the entry is then kept while its object exists, and
/// dropped only once a read confirms the object gone).
pub fn hand_made_of_holder(holder: &str) -> Option<(&str, &str, Option<i64>)> {
    let rest = holder.strip_prefix(HAND_MADE_PREFIX)?;
    let (object, when) = rest.rsplit_once('@').unwrap_or((rest, ""));
    let (namespace, name) = object.split_once('/')?;
    let at = when
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second())
        .or_else(|_| when.parse::<i64>())
        .ok();
    Some((namespace, name, at))
}

/// The prefix of the holder name under which a hand-made `IPAddress` that a claim may adopt is
/// set aside (`adoptable/claim/<namespace>/<name>`): the claim's own pin may take its address,
/// nobody else.
pub const ADOPTABLE_PREFIX: &str = "adoptable/";

/// A reference to a pool (`spec.poolRef`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolReference {
    /// Optional in `v1beta1`: a claim written then may lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

impl PoolReference {
    /// The kipam pool it names, if it names one.
    pub fn kipam_pool(&self) -> Option<&str> {
        (self.api_group.as_deref() == Some(super::GROUP) && self.kind == POOL_KIND)
            .then_some(self.name.as_str())
    }

    /// A reference to the kipam pool `name`.
    pub fn to_pool(name: &str) -> Self {
        PoolReference {
            api_group: Some(super::GROUP.to_string()),
            kind: POOL_KIND.to_string(),
            name: name.to_string(),
        }
    }
}

/// A reference to an object of the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalReference {
    #[serde(default)]
    pub name: String,
}

/// A machine's request for an address.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "IPAddressClaim",
    plural = "ipaddressclaims",
    namespaced,
    status = "IPAddressClaimStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimSpec {
    /// The Cluster API cluster the claim belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    pub pool_ref: PoolReference,
}

/// What the provider reports on a claim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_ref: Option<LocalReference>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The address a provider handed to a claim.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "IPAddress",
    plural = "ipaddresses",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressSpec {
    pub claim_ref: LocalReference,
    pub pool_ref: PoolReference,
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub prefix: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// Cluster API's `Cluster`, reduced to what pauses its claims.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    root = "CapiCluster",
    plural = "clusters",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CapiClusterSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// An object (a pool) carries Cluster API's pause annotation.
pub fn has_pause_annotation(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    has_key(&meta.annotations, ANNOTATION_CAPI_PAUSED)
}

impl CapiCluster {
    /// Its reconciliation is paused (`spec.paused` or the pause annotation).
    pub fn is_paused(&self) -> bool {
        self.spec.paused == Some(true)
            || has_key(&self.metadata.annotations, ANNOTATION_CAPI_PAUSED)
    }
}

fn has_key(map: &Option<BTreeMap<String, String>>, key: &str) -> bool {
    map.as_ref().is_some_and(|m| m.contains_key(key))
}

impl IPAddress {
    /// kipam wrote it (its `managed-by` label): its address is what a pool record holds for
    /// its claim.
    pub fn written_by_kipam(&self) -> bool {
        self.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY.0))
            .is_some_and(|v| v == MANAGED_BY.1)
    }
}

impl IPAddressClaim {
    /// The Cluster API cluster it belongs to: `spec.clusterName`, else the older label.
    pub fn cluster_name(&self) -> Option<&str> {
        self.spec
            .cluster_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .or_else(|| {
                self.metadata
                    .labels
                    .as_ref()?
                    .get(LABEL_CAPI_CLUSTER_NAME)
                    .map(String::as_str)
                    .filter(|n| !n.is_empty())
            })
    }

    /// The claim itself carries the pause annotation.
    pub fn is_paused(&self) -> bool {
        has_key(&self.metadata.annotations, ANNOTATION_CAPI_PAUSED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_made_holders_round_trip_and_are_never_claims_or_clusters() {
        let h = hand_made_holder("machines", "web-0", 1_764_000_000);
        assert_eq!(h, "ipaddress/machines/web-0@2025-11-24T16:00:00Z");
        assert_eq!(
            hand_made_of_holder(&h),
            Some(("machines", "web-0", Some(1_764_000_000)))
        );
        assert_eq!(claim_of_holder(&h), None);
        assert_eq!(
            hand_made_of_holder("ipaddress/machines/web-0@soon"),
            Some(("machines", "web-0", None))
        );
        assert_eq!(hand_made_of_holder("claim/machines/web-0"), None);
        assert_eq!(hand_made_of_holder("ipaddress/nonamespace"), None);
    }

    #[test]
    fn claim_holders_round_trip_and_are_never_cluster_names() {
        let h = claim_holder("machines", "web-0-eth0");
        assert_eq!(h, "claim/machines/web-0-eth0");
        assert_eq!(claim_of_holder(&h), Some(("machines", "web-0-eth0")));
        assert_eq!(claim_of_holder("web"), None);
        assert_eq!(
            claim_of_holder("quarantined/web@2025-01-01T00:00:00Z"),
            None
        );
    }

    #[test]
    fn a_pool_reference_names_a_kipam_pool_only_with_group_and_kind() {
        assert_eq!(PoolReference::to_pool("lan").kipam_pool(), Some("lan"));
        let v1beta1 = PoolReference {
            api_group: None,
            kind: POOL_KIND.into(),
            name: "lan".into(),
        };
        assert_eq!(v1beta1.kipam_pool(), None);
        let other = PoolReference {
            api_group: Some("ipam.cluster.x-k8s.io".into()),
            kind: "InClusterIPPool".into(),
            name: "lan".into(),
        };
        assert_eq!(other.kipam_pool(), None);
    }
}
