//! The JSON model of the REST API: KKP's `IPAMPool` (`name`, `datacenters` with `type`,
//! `poolCidr`, `allocationRange`, `allocationPrefix`, `excludeRanges`, `excludePrefixes`) plus
//! kipam's `strategy`, `reclaimPolicy` and `additionalCidrs`, and read-only usage. Separate from the CRD types:
//! bodies refuse unknown fields here without changing how the CRDs decode.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::resources::AdoptMode;
use crate::resources::PoolGrowth;
use crate::resources::PoolNetwork;
use crate::resources::capi::IPAddress;
use crate::resources::{
    AllocationPhase, AllocationType, IPAMAllocation, IPAMPool, IPAMPoolDatacenter, IPAMPoolSpec,
    LABEL_CLUSTER, PoolStrategy, ReclaimPolicy, cluster_of_namespace,
};

/// A pool as clients write it (`POST`, and the document a `PATCH` is merged into).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolBody {
    /// The pool's name (required on `POST`; on `PATCH` it may only repeat the path's).
    #[serde(default)]
    pub name: String,
    /// Datacenter name -> the pool's settings there.
    #[serde(default)]
    pub datacenters: BTreeMap<String, DatacenterBody>,
    /// `Delete` (default) or `Retain`: what removing the pool does to its allocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_policy: Option<ReclaimPolicy>,
    /// Read-only: accepted so that a pool read with `GET` can be sent back, and ignored.
    #[serde(default, skip_serializing)]
    #[schemars(with = "Option<bool>")]
    pub deleting: Option<serde::de::IgnoredAny>,
    /// The address space (routing domain) the pool's networks live in; absent for the
    /// default space shared by every pool of a datacenter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_space: Option<String>,
}

/// The pool's settings in one datacenter, as written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DatacenterBody {
    #[serde(rename = "type")]
    pub type_: AllocationType,
    pub pool_cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_range: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_prefix: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_ranges: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude_prefixes: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<PoolStrategy>,
    /// Read-only: accepted so that a pool read with `GET` can be sent back, and ignored.
    #[serde(default, skip_serializing)]
    #[schemars(with = "Option<UsageView>")]
    pub usage: Option<serde::de::IgnoredAny>,
    /// The network the pool lies in (gateway, prefix length, DNS, VLAN, MTU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// Further CIDRs after `poolCidr`, used in this order (at most 15). On `PATCH`, absent
    /// keeps them as they are; a CIDR that holds something may not be removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_cidrs: Option<Vec<String>>,
    /// How long a released address stays quarantined (`10m`, `24h`, `7d`; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_after: Option<String>,
    /// `range` pools: demand-driven growth (increment, max, shrinkAfter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<Growth>,
    /// Take over this datacenter's user clusters that already run MetalLB: `DryRun`,
    /// `Adopt` or `Disabled` (a Cluster's own `spec.adopt` wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<AdoptMode>,
}

/// Demand-driven growth of a range pool datacenter, as written and as answered; the rules
/// are the CRD's (`spec.datacenters.<dc>.growth`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Growth {
    /// Addresses added per step, at least 1 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub increment: Option<i64>,
    /// The most addresses a cluster may hold, at least `allocationRange`.
    pub max: i64,
    /// How long a grown piece stays unused before it is given back, 1m to 30d (default 10m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrink_after: Option<String>,
}

impl Growth {
    pub fn of(g: &PoolGrowth) -> Growth {
        Growth {
            increment: g.increment,
            max: g.max,
            shrink_after: g.shrink_after.clone(),
        }
    }

    /// The CRD's form of this growth.
    pub fn growth(&self) -> PoolGrowth {
        PoolGrowth {
            increment: self.increment,
            max: self.max,
            shrink_after: self.shrink_after.clone(),
        }
    }
}

/// The network a pool datacenter lies in, as written and as answered. Every field is optional;
/// the rules are the CRD's (`spec.datacenters.<dc>.network`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Network {
    /// The default gateway: a host address of the pool's family inside the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The network's prefix length, at most `poolCidr`'s (unset: the network is `poolCidr`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_length: Option<i32>,
    /// DNS servers, IPv4 or IPv6, in order of preference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_servers: Vec<String>,
    /// The 802.1Q VLAN ID, 0 to 4094.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<i32>,
    /// The MTU in bytes, 576 to 9216.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<i32>,
}

impl Network {
    pub fn of(n: &PoolNetwork) -> Network {
        Network {
            gateway: n.gateway.clone(),
            prefix_length: n.prefix_length,
            dns_servers: n.dns_servers.clone(),
            vlan_id: n.vlan_id,
            mtu: n.mtu,
        }
    }

    /// The CRD's form of this network.
    pub fn network(&self) -> PoolNetwork {
        PoolNetwork {
            gateway: self.gateway.clone(),
            prefix_length: self.prefix_length,
            dns_servers: self.dns_servers.clone(),
            vlan_id: self.vlan_id,
            mtu: self.mtu,
        }
    }
}

/// A pool as the API answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolView {
    pub name: String,
    pub datacenters: BTreeMap<String, DatacenterView>,
    pub reclaim_policy: ReclaimPolicy,
    /// The pool is being deleted (its allocations are being released).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_space: Option<String>,
}

/// One datacenter of a pool, with its usage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatacenterView {
    #[serde(rename = "type")]
    pub type_: AllocationType,
    pub pool_cidr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_range: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_prefix: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_ranges: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_prefixes: Vec<String>,
    pub strategy: PoolStrategy,
    /// Read-only, as last computed by the controller; absent until it has looked at the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageView>,
    /// The network the pool lies in; absent when the pool names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// Further CIDRs after `poolCidr`, used in this order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_cidrs: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_after: Option<String>,
    /// Demand-driven growth; absent when the pool datacenter does not grow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<Growth>,
    /// Takeover of user clusters that already run MetalLB; absent when not set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<AdoptMode>,
}

/// Usage of a pool in one datacenter. Address counts are exact decimal strings (an IPv6
/// pool holds more addresses than a JSON number can carry exactly).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageView {
    pub total: String,
    pub allocated: String,
    pub excluded: String,
    pub available: String,
    pub largest_free_block: String,
    pub utilisation_percent: i32,
    pub fragmentation_percent: i32,
    pub allocations: i64,
    /// For a datacenter of several CIDRs, the same figures per CIDR (`poolCidr`, then
    /// `additionalCidrs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<CidrUsageView>,
    /// Addresses quarantined for their former holders (`reuseAfter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
    /// Of `allocations`, those held by machines' Cluster API `IPAddressClaim`s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claims: Option<i64>,
}

/// Usage of one CIDR of a pool datacenter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CidrUsageView {
    pub cidr: String,
    pub total: String,
    pub allocated: String,
    pub excluded: String,
    pub available: String,
    pub largest_free_block: String,
    pub fragmentation_percent: i32,
}

impl CidrUsageView {
    fn of(c: &crate::resources::PoolCidrUsage) -> CidrUsageView {
        CidrUsageView {
            cidr: c.cidr.clone(),
            total: c.total.clone(),
            allocated: c.allocated.clone(),
            excluded: c.excluded.clone(),
            available: c.available.clone(),
            largest_free_block: c.largest_free_block.clone(),
            fragmentation_percent: c.fragmentation_percent,
        }
    }
}

/// One cluster's allocation from a pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AllocationView {
    pub cluster: String,
    pub datacenter: String,
    #[serde(rename = "type")]
    pub type_: AllocationType,
    /// `prefix` allocations: the subnet held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// `range` allocations: the address ranges held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AllocationPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Held by a machine's Cluster API `IPAddressClaim` (rather than a user cluster); its
    /// `cluster` is the claim's Cluster API cluster, if it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimView>,
}

/// The claim holding an address.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClaimView {
    pub namespace: String,
    pub name: String,
}

impl PoolView {
    pub fn of(pool: &IPAMPool) -> PoolView {
        let usage = pool.status.as_ref().map(|s| &s.datacenters);
        let datacenters = pool
            .spec
            .datacenters
            .iter()
            .map(|(dc, s)| {
                let usage = usage.and_then(|u| u.get(dc)).map(|u| UsageView {
                    total: u.total.clone(),
                    allocated: u.allocated.clone(),
                    excluded: u.excluded.clone(),
                    available: u.available.clone(),
                    largest_free_block: u.largest_free_block.clone(),
                    utilisation_percent: u.utilisation_percent,
                    fragmentation_percent: u.fragmentation_percent,
                    allocations: u.allocations,
                    cidrs: u.cidrs.iter().map(CidrUsageView::of).collect(),
                    quarantined: u.quarantined.clone(),
                    claims: u.claims,
                });
                let view = DatacenterView {
                    type_: s.type_,
                    pool_cidr: s.pool_cidr.clone(),
                    allocation_range: s.allocation_range,
                    allocation_prefix: s.allocation_prefix,
                    exclude_ranges: s.exclude_ranges.clone(),
                    exclude_prefixes: s.exclude_prefixes.clone(),
                    strategy: s.strategy.unwrap_or_default(),
                    usage,
                    network: s.network.as_ref().map(Network::of),
                    additional_cidrs: s.additional_cidrs.clone(),
                    reuse_after: s.reuse_after.clone(),
                    growth: s.growth.as_ref().map(Growth::of),
                    adopt: s.adopt,
                };
                (dc.clone(), view)
            })
            .collect();
        PoolView {
            name: pool.metadata.name.clone().unwrap_or_default(),
            datacenters,
            reclaim_policy: pool.spec.reclaim_policy,
            deleting: pool.metadata.deletion_timestamp.is_some(),
            address_space: pool.spec.address_space.clone(),
        }
    }
}

/// Serialises a cached pool exactly as [`PoolView`] would, without copying it first: a list
/// of every pool is the API's hot path.
pub struct PoolViewRef<'a>(pub &'a IPAMPool);

struct DatacentersRef<'a>(&'a IPAMPool);

struct DatacenterRef<'a> {
    settings: &'a IPAMPoolDatacenter,
    usage: Option<&'a crate::resources::DatacenterUsage>,
}

struct UsageRef<'a>(&'a crate::resources::DatacenterUsage);

impl Serialize for PoolViewRef<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let pool = self.0;
        let deleting = pool.metadata.deletion_timestamp.is_some();
        let space = pool.spec.address_space.as_ref();
        let mut out = serializer.serialize_struct(
            "PoolView",
            3 + usize::from(deleting) + usize::from(space.is_some()),
        )?;
        out.serialize_field("name", pool.metadata.name.as_deref().unwrap_or_default())?;
        out.serialize_field("datacenters", &DatacentersRef(pool))?;
        out.serialize_field("reclaimPolicy", &pool.spec.reclaim_policy)?;
        if deleting {
            out.serialize_field("deleting", &true)?;
        }
        if let Some(space) = space {
            out.serialize_field("addressSpace", space)?;
        }
        out.end()
    }
}

impl Serialize for DatacentersRef<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let usage = self.0.status.as_ref().map(|s| &s.datacenters);
        let mut out = serializer.serialize_map(Some(self.0.spec.datacenters.len()))?;
        for (dc, settings) in &self.0.spec.datacenters {
            let view = DatacenterRef {
                settings,
                usage: usage.and_then(|u| u.get(dc)),
            };
            out.serialize_entry(dc, &view)?;
        }
        out.end()
    }
}

impl Serialize for DatacenterRef<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let s = self.settings;
        let mut out = serializer.serialize_struct("DatacenterView", 11)?;
        out.serialize_field("type", &s.type_)?;
        out.serialize_field("poolCidr", &s.pool_cidr)?;
        if let Some(r) = s.allocation_range {
            out.serialize_field("allocationRange", &r)?;
        }
        if let Some(p) = s.allocation_prefix {
            out.serialize_field("allocationPrefix", &p)?;
        }
        if !s.exclude_ranges.is_empty() {
            out.serialize_field("excludeRanges", &s.exclude_ranges)?;
        }
        if !s.exclude_prefixes.is_empty() {
            out.serialize_field("excludePrefixes", &s.exclude_prefixes)?;
        }
        out.serialize_field("strategy", &s.strategy.unwrap_or_default())?;
        if let Some(u) = self.usage {
            out.serialize_field("usage", &UsageRef(u))?;
        }
        // `PoolNetwork` serialises exactly as the model's `Network`.
        if let Some(n) = &s.network {
            out.serialize_field("network", n)?;
        }
        if !s.additional_cidrs.is_empty() {
            out.serialize_field("additionalCidrs", &s.additional_cidrs)?;
        }
        if let Some(r) = &s.reuse_after {
            out.serialize_field("reuseAfter", r)?;
        }
        // `PoolGrowth` serialises exactly as the model's `Growth`.
        if let Some(g) = &s.growth {
            out.serialize_field("growth", g)?;
        }
        if let Some(a) = &s.adopt {
            out.serialize_field("adopt", a)?;
        }
        out.end()
    }
}

impl Serialize for UsageRef<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let u = self.0;
        let mut out = serializer.serialize_struct("UsageView", 8)?;
        out.serialize_field("total", &u.total)?;
        out.serialize_field("allocated", &u.allocated)?;
        out.serialize_field("excluded", &u.excluded)?;
        out.serialize_field("available", &u.available)?;
        out.serialize_field("largestFreeBlock", &u.largest_free_block)?;
        out.serialize_field("utilisationPercent", &u.utilisation_percent)?;
        out.serialize_field("fragmentationPercent", &u.fragmentation_percent)?;
        out.serialize_field("allocations", &u.allocations)?;
        if !u.cidrs.is_empty() {
            let cidrs: Vec<CidrUsageView> = u.cidrs.iter().map(CidrUsageView::of).collect();
            out.serialize_field("cidrs", &cidrs)?;
        }
        if let Some(q) = &u.quarantined {
            out.serialize_field("quarantined", q)?;
        }
        out.end()
    }
}

impl PoolBody {
    /// The writable part of a stored pool: what a `PATCH` is merged into.
    pub fn of(pool: &IPAMPool) -> PoolBody {
        let datacenters = pool
            .spec
            .datacenters
            .iter()
            .map(|(dc, s)| {
                let body = DatacenterBody {
                    type_: s.type_,
                    pool_cidr: s.pool_cidr.clone(),
                    allocation_range: s.allocation_range,
                    allocation_prefix: s.allocation_prefix,
                    exclude_ranges: (!s.exclude_ranges.is_empty())
                        .then(|| s.exclude_ranges.clone()),
                    exclude_prefixes: (!s.exclude_prefixes.is_empty())
                        .then(|| s.exclude_prefixes.clone()),
                    strategy: s.strategy,
                    usage: None,
                    network: s.network.as_ref().map(Network::of),
                    additional_cidrs: (!s.additional_cidrs.is_empty())
                        .then(|| s.additional_cidrs.clone()),
                    reuse_after: s.reuse_after.clone(),
                    growth: s.growth.as_ref().map(Growth::of),
                    adopt: s.adopt,
                };
                (dc.clone(), body)
            })
            .collect();
        PoolBody {
            name: pool.metadata.name.clone().unwrap_or_default(),
            datacenters,
            reclaim_policy: Some(pool.spec.reclaim_policy),
            deleting: None,
            address_space: pool.spec.address_space.clone(),
        }
    }

    /// The CRD spec this body asks for.
    pub fn spec(&self) -> IPAMPoolSpec {
        IPAMPoolSpec {
            datacenters: self
                .datacenters
                .iter()
                .map(|(dc, b)| {
                    let settings = IPAMPoolDatacenter {
                        type_: b.type_,
                        pool_cidr: b.pool_cidr.clone(),
                        allocation_range: b.allocation_range,
                        allocation_prefix: b.allocation_prefix,
                        exclude_ranges: b.exclude_ranges.clone().unwrap_or_default(),
                        exclude_prefixes: b.exclude_prefixes.clone().unwrap_or_default(),
                        strategy: b.strategy,
                        network: b.network.as_ref().map(Network::network),
                        additional_cidrs: b.additional_cidrs.clone().unwrap_or_default(),
                        reuse_after: b.reuse_after.clone(),
                        growth: b.growth.as_ref().map(Growth::growth),
                        adopt: b.adopt,
                    };
                    (dc.clone(), settings)
                })
                .collect(),
            reclaim_policy: self.reclaim_policy.unwrap_or_default(),
            address_space: self.address_space.clone(),
        }
    }
}

impl AllocationView {
    pub fn of(obj: &IPAMAllocation) -> AllocationView {
        let namespace = obj.metadata.namespace.clone().unwrap_or_default();
        let cluster = obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_CLUSTER).cloned())
            .or_else(|| cluster_of_namespace(&namespace).map(str::to_string))
            .unwrap_or(namespace);
        AllocationView {
            cluster,
            datacenter: obj.spec.dc.clone(),
            type_: obj.spec.type_,
            cidr: obj.spec.cidr.clone(),
            addresses: obj.spec.addresses.clone(),
            phase: Some(obj.phase()),
            message: obj.status.as_ref().and_then(|s| s.message.clone()),
            claim: None,
        }
    }

    /// The address kipam wrote for a claim (`None` for an `IPAddress` kipam did not write);
    /// `prefix_pool`: its pool datacenter hands out subnets.
    pub fn of_claim(
        address: &IPAddress,
        claim: Option<&crate::resources::capi::IPAddressClaim>,
        prefix_pool: bool,
    ) -> Option<AllocationView> {
        if !address.written_by_kipam() {
            return None;
        }
        let labels = address.metadata.labels.as_ref()?;
        let datacenter = labels.get(crate::resources::LABEL_DATACENTER)?.clone();
        let ready = claim.and_then(|c| {
            c.status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .cloned()
        });
        Some(AllocationView {
            cluster: claim
                .and_then(|c| c.cluster_name())
                .unwrap_or_default()
                .to_string(),
            datacenter,
            type_: if prefix_pool {
                AllocationType::Prefix
            } else {
                AllocationType::Range
            },
            cidr: prefix_pool.then(|| format!("{}/{}", address.spec.address, address.spec.prefix)),
            addresses: if prefix_pool {
                Vec::new()
            } else {
                vec![address.spec.address.clone()]
            },
            phase: Some(if ready.as_ref().is_some_and(|r| r.status == "True") {
                AllocationPhase::Allocated
            } else {
                AllocationPhase::Pending
            }),
            message: ready.map(|r| r.message).filter(|m| !m.is_empty()),
            claim: Some(ClaimView {
                namespace: address.metadata.namespace.clone().unwrap_or_default(),
                name: address.spec.claim_ref.name.clone(),
            }),
        })
    }
}

/// RFC 7396 JSON merge patch: objects merge key by key, `null` removes a key, anything else
/// replaces the target.
pub fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    use serde_json::Value;
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_follows_rfc7396_examples() {
        // The examples of RFC 7396, appendix A.
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (mut target, patch, want) in cases {
            merge_patch(&mut target, &patch);
            assert_eq!(target, want, "patch {patch}");
        }
    }

    #[test]
    fn bodies_refuse_unknown_fields_at_every_level() {
        let top =
            serde_json::from_str::<PoolBody>(r#"{"name": "p", "datacenters": {}, "colour": 1}"#);
        assert!(
            top.unwrap_err()
                .to_string()
                .contains("unknown field `colour`")
        );
        let dc = serde_json::from_str::<PoolBody>(
            r#"{"name": "p", "datacenters": {"dc": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRnage": 4}}}"#,
        );
        assert!(
            dc.unwrap_err()
                .to_string()
                .contains("unknown field `allocationRnage`")
        );
    }

    fn properties<T: JsonSchema>() -> std::collections::BTreeSet<String> {
        let schema = schemars::schema_for!(T);
        schema
            .get("properties")
            .and_then(|p| p.as_object())
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// A PATCH rebuilds the spec from this model: a CRD field it does not carry would be
    /// dropped by every PATCH. This fails as soon as the CRD gains a field the model lacks.
    #[test]
    fn the_model_carries_every_field_of_the_crd_spec() {
        let spec = properties::<IPAMPoolSpec>();
        assert!(spec.contains("reclaimPolicy"), "{spec:?}");
        let body = properties::<PoolBody>();
        for field in &spec {
            assert!(body.contains(field), "PoolBody lacks spec.{field}");
        }
        let dc = properties::<IPAMPoolDatacenter>();
        assert!(
            dc.contains("excludePrefixes") && dc.contains("strategy"),
            "{dc:?}"
        );
        let dc_body = properties::<DatacenterBody>();
        for field in &dc {
            assert!(dc_body.contains(field), "DatacenterBody lacks {field}");
        }
        let dc_view = properties::<DatacenterView>();
        for field in &dc {
            assert!(dc_view.contains(field), "DatacenterView lacks {field}");
        }
    }

    /// The same guard one level down: a network field the model lacks would be dropped by
    /// every PATCH.
    #[test]
    fn the_model_carries_every_field_of_the_network() {
        let crd = properties::<PoolNetwork>();
        assert!(
            crd.contains("dnsServers") && crd.contains("vlanId"),
            "{crd:?}"
        );
        assert_eq!(properties::<Network>(), crd);
        let unknown = serde_json::from_str::<PoolBody>(
            r#"{"name": "p", "datacenters": {"dc": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4, "network": {"vlan": 7}}}}"#,
        );
        assert!(
            unknown
                .unwrap_err()
                .to_string()
                .contains("unknown field `vlan`")
        );
    }

    #[test]
    fn the_borrowed_view_serialises_exactly_as_the_view() {
        let mut pools = Vec::new();
        let plain: IPAMPool = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "plain"},
            "spec": {"datacenters": {"dc": {"type": "prefix", "poolCidr": "10.0.0.0/24", "allocationPrefix": 28}}}
        }))
        .unwrap();
        pools.push(plain);
        let full: IPAMPool = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "full", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"reclaimPolicy": "Retain", "datacenters": {
                "a": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4,
                      "excludeRanges": ["10.0.0.1"], "strategy": "BestFit"},
                "b": {"type": "prefix", "poolCidr": "2001:db8::/48", "allocationPrefix": 64,
                      "excludePrefixes": ["2001:db8::/64"],
                      "network": {"gateway": "2001:db8::1", "prefixLength": 32,
                                  "dnsServers": ["2001:db8::53", "192.0.2.53"], "vlanId": 7, "mtu": 9000}}
            }},
            "status": {"datacenters": {"a": {
                "total": "256", "allocated": "4", "excluded": "1", "available": "251",
                "allocations": 1, "largestFreeBlock": "248", "fragmentationPercent": 1,
                "utilisationPercent": 1
            }}}
        }))
        .unwrap();
        pools.push(full);
        let spaced: IPAMPool = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "spaced"},
            "spec": {"addressSpace": "vrf-b", "datacenters": {
                "a": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4,
                      "reuseAfter": "10m"}
            }},
            "status": {"datacenters": {"a": {
                "total": "256", "allocated": "4", "excluded": "0", "available": "248",
                "allocations": 1, "largestFreeBlock": "248", "fragmentationPercent": 0,
                "utilisationPercent": 3, "quarantined": "4"
            }}}
        }))
        .unwrap();
        pools.push(spaced);
        for pool in &pools {
            let by_ref = serde_json::to_string(&PoolViewRef(pool)).unwrap();
            let by_view = serde_json::to_string(&PoolView::of(pool)).unwrap();
            assert_eq!(by_ref, by_view);
        }
        let view = serde_json::to_value(PoolView::of(&pools[2])).unwrap();
        assert_eq!(view["addressSpace"], "vrf-b");
        assert_eq!(view["datacenters"]["a"]["reuseAfter"], "10m");
        assert_eq!(view["datacenters"]["a"]["usage"]["quarantined"], "4");
    }

    #[test]
    fn a_pool_read_back_as_a_body_keeps_every_writable_field() {
        let body: PoolBody = serde_json::from_value(json!({
            "name": "p",
            "reclaimPolicy": "Retain",
            "addressSpace": "vrf-b",
            "datacenters": {"dc": {
                "type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4,
                "excludeRanges": ["10.0.0.1"], "strategy": "BestFit", "reuseAfter": "1h",
                "usage": {"total": "256"},
                "network": {"gateway": "10.0.0.1", "prefixLength": 16, "dnsServers": ["10.0.0.53"],
                            "vlanId": 0, "mtu": 1500}
            }}
        }))
        .unwrap();
        let pool = IPAMPool::new("p", body.spec());
        assert_eq!(PoolBody::of(&pool).spec(), body.spec());
        assert_eq!(PoolBody::of(&pool).name, "p");
    }
}
