//! `IPAMPool`: the address space admins hand out, per datacenter.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;
use super::bounds::*;

/// An IP pool that kipam divides between the user clusters of each listed datacenter.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.kipam.dev",
    version = "v1alpha1",
    kind = "IPAMPool",
    plural = "ipampools",
    singular = "ipampool",
    shortname = "ipp",
    doc = "An IP pool that kipam divides between the user clusters of each listed datacenter.",
    status = "IPAMPoolStatus",
    printcolumn = r#"{"name":"Reclaim","type":"string","jsonPath":".spec.reclaimPolicy"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Max Used %","type":"integer","jsonPath":".status.maxUtilisationPercent"}"#,
    printcolumn = r#"{"name":"Allocations","type":"integer","jsonPath":".status.allocations"}"#,
    printcolumn = r#"{"name":"Claims","type":"integer","jsonPath":".status.claims"}"#,
    printcolumn = r#"{"name":"Quarantined","type":"string","jsonPath":".status.quarantined"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct IPAMPoolSpec {
    /// Datacenter name -> the pool's settings in that datacenter. Must not be empty.
    #[schemars(extend(
        "minProperties" = 1,
        "maxProperties" = MAX_DATACENTERS,
        "x-kubernetes-validations" = [{
            "rule": format!("self.all(dc, size(dc) <= {MAX_LABEL})"),
            "message": format!("datacenter names must be at most {MAX_LABEL} characters"),
        }]
    ))]
    pub datacenters: BTreeMap<String, IPAMPoolDatacenter>,
    /// What deleting the pool (or removing a datacenter from it) does to its allocations:
    /// `Delete` (the default, as KKP) removes them, `Retain` keeps them, unmanaged but still
    /// reserved should the pool be created again.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,
    /// The address space (routing domain, VRF) the pool's networks live in. Pools that list
    /// the same datacenter and name the same space (or none: one shared default space) share
    /// that datacenter's addresses: an address held through any of them is taken for all of
    /// them. Name another space only for pools whose networks are truly separate, so that the
    /// same address may be handed out once in each. A DNS label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_LABEL), pattern(PATTERN_DNS_LABEL))]
    pub address_space: Option<String>,
}

/// The pool's settings in one datacenter.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.type == oldSelf.type", "message": "type is immutable"},
    {
        "rule": "has(self.allocationPrefix) == has(oldSelf.allocationPrefix) && (!has(self.allocationPrefix) || self.allocationPrefix == oldSelf.allocationPrefix)",
        "message": "allocationPrefix is immutable"
    }
]))]
pub struct IPAMPoolDatacenter {
    /// `range`: each cluster gets `allocationRange` addresses; `prefix`: each cluster gets one
    /// aligned subnet of length `allocationPrefix`.
    #[serde(rename = "type")]
    pub type_: AllocationType,
    /// The pool's network in CIDR notation, IPv4 or IPv6 (`192.168.1.0/26`, `2001:db8::/64`).
    /// Host bits must be zero. On update it may only be widened to a network that contains it
    /// (`10.0.0.0/24` to `10.0.0.0/23`); every address held stays where it is.
    #[schemars(length(max = MAX_CIDR), pattern(PATTERN_CIDR))]
    pub pool_cidr: String,
    /// `range` pools: addresses per cluster, at least 1 and at most the pool size. Raising it
    /// grows existing allocations; lowering it releases nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_ALLOCATION_RANGE))]
    pub allocation_range: Option<i64>,
    /// `prefix` pools: the subnet length per cluster, between the pool's prefix length and 32
    /// (IPv4) or 128 (IPv6). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_PREFIX_LENGTH))]
    pub allocation_prefix: Option<i32>,
    /// `range` pools: addresses (`192.168.1.1`), ranges (`192.168.1.5-192.168.1.7`) or CIDRs
    /// kept out of allocations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_EXCLUSIONS),
        inner(length(max = MAX_ADDRESS_RANGE), pattern(PATTERN_ADDRESS_RANGE))
    )]
    pub exclude_ranges: Vec<String>,
    /// `prefix` pools: subnets (`192.168.1.0/30`) kept out of allocations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_EXCLUSIONS),
        inner(length(max = MAX_CIDR), pattern(PATTERN_CIDR))
    )]
    pub exclude_prefixes: Vec<String>,
    /// How free space is chosen: `FirstFit` (default, KKP's behaviour: lowest free addresses)
    /// or `BestFit` (Butler's: the smallest free block that fits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<PoolStrategy>,
    /// What a machine or a VIP needs besides its address: the gateway, prefix length, VLAN,
    /// DNS servers and MTU of the network the pool lies in. Optional; it changes no
    /// allocation, so it may be edited at any time. Addon templates see it as
    /// `Cluster.Network.IPAMAllocations.<pool>.Gateway`, `.PrefixLength`, `.VLAN`, `.DNS` and
    /// `.MTU`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<PoolNetwork>,
    /// Further CIDRs of the pool in this datacenter, of `poolCidr`'s family, used in order
    /// after it: new allocations come from `poolCidr` while it can serve them, then from the
    /// first CIDR here that can, and so on. No two CIDRs of a pool datacenter may overlap;
    /// exclusions may lie in any of them. A `range` allocation may take pieces from several
    /// CIDRs (one piece never spans a gap between them); a `prefix` subnet always lies inside
    /// one. A CIDR may be added at any time; one may be removed only while it holds no
    /// allocation. At most 15.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_ADDITIONAL_CIDRS),
        inner(length(max = MAX_CIDR), pattern(PATTERN_CIDR))
    )]
    pub additional_cidrs: Vec<String>,
    /// How long an address released here (cluster deleted, override shrunk, datacenter moved)
    /// stays quarantined before it is handed to anybody else, as a duration (`30s`, `10m`,
    /// `24h`, `7d`; at most 90 days). The former holder, coming back within that time, gets
    /// its addresses back. Default `0`: released addresses are free at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DURATION))]
    pub reuse_after: Option<String>,
    /// `range` pools: grow a cluster's allocation when its user cluster has LoadBalancer
    /// Services that MetalLB cannot serve, and give the extra addresses back once they stay
    /// unused. `allocationRange` is then the initial size, never shrunk. Optional; without
    /// it allocations keep `allocationRange` addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth: Option<PoolGrowth>,
    /// Take over user clusters of this datacenter that already run MetalLB with pools typed
    /// in by hand (see `docs/adopt.md`): `DryRun` reads and reports what each serves,
    /// `Adopt` also makes exactly that its allocation. A Cluster's own `spec.adopt` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<AdoptMode>,
}

/// How kipam takes over a user cluster that already serves addresses through MetalLB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AdoptMode {
    /// Read the user cluster's hand-made MetalLB pools and Services and report; write
    /// nothing for the cluster (no allocation, no addon) until it is `Adopt`.
    DryRun,
    /// Make what the user cluster serves inside the pool its allocation, then take over the
    /// hand-made MetalLB pool in place.
    Adopt,
    /// Start from nothing, as for a new cluster: a Cluster's way to leave its datacenter's
    /// `adopt` setting (not `Off`: YAML 1.1, which kubectl speaks, reads that as `false`).
    Disabled,
}

impl AdoptMode {
    pub fn as_str(&self) -> &'static str {
        match self {
            AdoptMode::DryRun => "DryRun",
            AdoptMode::Adopt => "Adopt",
            AdoptMode::Disabled => "Disabled",
        }
    }
}

/// Demand-driven growth of a range pool datacenter's allocations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolGrowth {
    /// Addresses added per step (at least 1, default 1). A cluster short of N addresses gets
    /// as many steps as cover N at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_ALLOCATION_RANGE))]
    pub increment: Option<i64>,
    /// The most addresses a cluster may hold from this pool datacenter, initial ones
    /// included: at least `allocationRange`, at most the pool size.
    #[schemars(range(min = 1, max = MAX_ALLOCATION_RANGE))]
    pub max: i64,
    /// How long a grown piece must stay unused, without a break, before it is given back:
    /// a duration written as for `reuseAfter` (`90s`, `10m`, `1h30m`, `2d`, `1w`, ISO 8601
    /// `PT10M`), between 1m and 30d (default 10m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DURATION))]
    pub shrink_after: Option<String>,
}

/// The network a pool datacenter lies in. Every field is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolNetwork {
    /// The default gateway, of the pool's family: a host address inside the network (not its
    /// network address, nor an IPv4 network's broadcast address). When it lies inside
    /// `poolCidr` it must be excluded (`excludeRanges` / `excludePrefixes`), so that it is
    /// never handed to a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_ADDRESS), pattern(PATTERN_ADDRESS))]
    pub gateway: Option<String>,
    /// The prefix length of the network (`24` for a pool that is a slice of a /24). The pool
    /// lies inside the network, so it is at most the prefix length of `poolCidr`; unset, the
    /// network is `poolCidr` itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_PREFIX_LENGTH))]
    pub prefix_length: Option<i32>,
    /// DNS servers, IPv4 or IPv6 addresses, in order of preference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_DNS_SERVERS),
        inner(length(max = MAX_ADDRESS), pattern(PATTERN_ADDRESS))
    )]
    pub dns_servers: Vec<String>,
    /// The 802.1Q VLAN ID, 0 to 4094 (0: untagged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = MAX_VLAN_ID))]
    pub vlan_id: Option<i32>,
    /// The MTU in bytes, 576 to 9216 (jumbo frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_MTU, max = MAX_MTU))]
    pub mtu: Option<i32>,
}

/// The allocation type of a pool datacenter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AllocationType {
    /// A number of addresses per cluster, possibly in several pieces.
    #[default]
    Range,
    /// One aligned subnet per cluster.
    Prefix,
}

impl AllocationType {
    pub fn as_str(&self) -> &'static str {
        match self {
            AllocationType::Range => "range",
            AllocationType::Prefix => "prefix",
        }
    }
}

/// How free space is chosen for new allocations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PoolStrategy {
    /// Lowest free addresses first (KKP).
    #[default]
    FirstFit,
    /// Smallest free block that fits (Butler).
    BestFit,
}

/// What happens to allocations when their pool or pool datacenter goes away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ReclaimPolicy {
    /// Remove the allocations.
    #[default]
    Delete,
    /// Keep the allocations (unmanaged, still reserved if the pool comes back).
    Retain,
}

impl ReclaimPolicy {
    pub fn as_str(&self) -> &'static str {
        match self {
            ReclaimPolicy::Delete => "Delete",
            ReclaimPolicy::Retain => "Retain",
        }
    }
}

/// Observed state of a pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IPAMPoolStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// `Ready`, `CapacityWarning` (>= 70 % used), `CapacityCritical` (>= 85 %),
    /// `CapacityExhausted` (>= 95 %), `Overlap`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_CONDITIONS))]
    pub conditions: Vec<Condition>,
    /// Usage per datacenter.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_DATACENTERS))]
    pub datacenters: BTreeMap<String, DatacenterUsage>,
    /// The highest `utilisationPercent` over all datacenters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_utilisation_percent: Option<i32>,
    /// Number of allocations over all datacenters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub allocations: Option<i64>,
    /// Addresses quarantined over all datacenters (`reuseAfter`), exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub quarantined: Option<String>,
    /// Of `allocations`, those held by machines' Cluster API `IPAddressClaim`s, over all
    /// datacenters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub claims: Option<i64>,
}

/// Usage of the pool in one datacenter. Address counts are exact decimal strings: an IPv6
/// pool can hold far more addresses than a 64-bit integer (a /48 has 2^80).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatacenterUsage {
    /// Addresses in `poolCidr` and the `additionalCidrs`.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub total: String,
    /// Addresses held by allocations.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub allocated: String,
    /// Addresses removed by exclusions.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub excluded: String,
    /// Addresses free to allocate.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub available: String,
    /// Number of allocations.
    #[schemars(range(min = 0))]
    pub allocations: i64,
    /// The largest contiguous run of free addresses.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub largest_free_block: String,
    /// `100 * (1 - largestFreeBlock / available)`, floored; 0 when nothing is free.
    #[schemars(range(min = 0, max = 100))]
    pub fragmentation_percent: i32,
    /// `100 * allocated / (total - excluded)`, floored.
    #[schemars(range(min = 0, max = 100))]
    pub utilisation_percent: i32,
    /// For a datacenter of several CIDRs, the same figures for each CIDR (`poolCidr`, then
    /// `additionalCidrs`), in the order they are used. The datacenter's figures above are
    /// their sums, except
    /// `largestFreeBlock` (the largest of theirs: a free run is never counted across the edge
    /// of two CIDRs) and the percentages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ADDITIONAL_CIDRS + 1))]
    pub cidrs: Vec<PoolCidrUsage>,
    /// Addresses released but quarantined (`reuseAfter`): held for their former holder and
    /// handed to nobody else until the period ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub quarantined: Option<String>,
    /// Of `allocations`, those held by machines' Cluster API `IPAddressClaim`s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub claims: Option<i64>,
}

/// Usage of one CIDR of a pool datacenter. Counts are exact decimal strings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolCidrUsage {
    /// The CIDR, as the pool names it.
    #[schemars(length(max = MAX_CIDR), pattern(PATTERN_CIDR))]
    pub cidr: String,
    /// Addresses in the CIDR.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub total: String,
    /// Addresses of the CIDR held by allocations.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub allocated: String,
    /// Addresses of the CIDR removed by exclusions.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub excluded: String,
    /// Addresses of the CIDR free to allocate.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub available: String,
    /// The largest contiguous run of free addresses inside the CIDR.
    #[schemars(length(max = MAX_COUNT_DIGITS), pattern(PATTERN_COUNT))]
    pub largest_free_block: String,
    /// `100 * (1 - largestFreeBlock / available)`, floored; 0 when nothing is free.
    #[schemars(range(min = 0, max = 100))]
    pub fragmentation_percent: i32,
}
