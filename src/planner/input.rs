//! What the planner is given: pools, clusters and stored allocations as plain values, already
//! parsed and checked (see `crate::validation`).

use std::collections::BTreeMap;

use crate::address::{AddrRange, Cidr};
use crate::allocator::{Allocation, PoolConfig};
use crate::resources::ReclaimPolicy;

/// One pool over all its datacenters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolInput {
    pub name: String,
    pub reclaim_policy: ReclaimPolicy,
    pub datacenters: BTreeMap<String, DatacenterInput>,
    /// `spec.addressSpace`; empty for the default space. Pools of one space listing the same
    /// datacenter share its addresses.
    pub address_space: String,
}

/// A pool in one datacenter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatacenterInput {
    pub config: PoolConfig,
    pub exclusions: Vec<AddrRange>,
    /// `reuseAfter`, in seconds: how long a released address stays quarantined.
    pub reuse_after: u64,
    /// Addresses no machine's claim is ever given, whatever the exclusions say, each with what
    /// it is (`the network address of 10.0.0.0/24`): the network address, the IPv4 broadcast
    /// address and the gateway of the datacenter's `network` (without one, of each CIDR).
    /// Clusters' ranges may still hold them. Empty for `prefix` pools (a claim there gets a
    /// subnet, not a host address).
    pub machine_reserved: Vec<(AddrRange, String)>,
    /// Networks the pool datacenter had before it was narrowed, as its layout record
    /// remembers them (none offline): nothing is handed out there any more, but a replica
    /// that has not seen the narrowing may still commit there, so the pool stays grouped with
    /// the pools of its space over them, and their commits raise its fences there.
    pub former: Vec<Cidr>,
}

/// One user cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterInput {
    pub name: String,
    /// `metadata.creationTimestamp` (RFC 3339, UTC); clusters without one come after those
    /// with one.
    pub created: Option<String>,
    pub datacenter: String,
    /// Pool name -> override.
    pub overrides: BTreeMap<String, PoolOverride>,
    /// The cluster is being deleted: release everything.
    pub deleting: bool,
    /// `spec.pause`: keep what it holds, change nothing.
    pub paused: bool,
    /// The cluster's spec is invalid (why): like a pause, it keeps what it holds and gets
    /// nothing new. An invalid edit never releases an address.
    pub invalid: Option<String>,
    /// A machine's claim (Cluster API's `IPAddressClaim`, named
    /// `crate::resources::capi::claim_holder`): it asks this one pool only, with the request
    /// in `overrides`, and never grows. `None` for a user cluster, which asks every pool of its
    /// datacenter.
    pub only_pool: Option<String>,
    /// Kept as it is for a reason of its own (why): adoption waits for its user cluster to be
    /// read, runs dry, or needs a person. Like a pause: it keeps what it holds and gets nothing
    /// new.
    pub hold: Option<String>,
}

impl ClusterInput {
    /// A cluster whose spec cannot be used: it keeps what it holds until it is fixed or
    /// deleted.
    pub fn invalid(
        name: &str,
        created: Option<String>,
        datacenter: &str,
        deleting: bool,
        why: String,
    ) -> Self {
        ClusterInput {
            name: name.to_string(),
            created,
            datacenter: datacenter.to_string(),
            overrides: BTreeMap::new(),
            deleting,
            paused: false,
            invalid: Some(why),
            only_pool: None,
            hold: None,
        }
    }

    /// Whether it asks pool `pool` for addresses at all (claims ask one pool; an opt-out
    /// asks none).
    pub fn asks(&self, pool: &str) -> bool {
        self.only_pool.as_deref().is_none_or(|p| p == pool)
            && self.overrides.get(pool) != Some(&PoolOverride::OptOut)
    }

    /// A machine's claim rather than a user cluster.
    pub fn is_claim(&self) -> bool {
        self.only_pool.is_some()
    }

    /// Keeps what it holds and gets nothing new (paused or invalid).
    pub fn frozen(&self) -> bool {
        self.paused || self.invalid.is_some() || self.hold.is_some()
    }

    /// Oldest first: creation time, then name.
    pub fn age_key(&self) -> (bool, &str, &str) {
        (
            self.created.is_none(),
            self.created.as_deref().unwrap_or(""),
            &self.name,
        )
    }
}

/// How a cluster departs from a pool's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolOverride {
    /// `allocationRange`.
    Addresses(u128),
    /// `allocationPrefix`.
    Prefix(u8),
    /// `addresses`: exactly these pieces.
    PinnedAddresses(Vec<AddrRange>),
    /// `cidr`: exactly this subnet.
    PinnedCidr(Cidr),
    /// `optOut: true`.
    OptOut,
    /// Adoption (`spec.adopt: Adopt`): while the cluster holds nothing from the pool, exactly
    /// these pieces, which its user cluster already serves (placed like a pin); once it holds
    /// something, it keeps that at its size (growth may add to it). Never written by a person:
    /// the planning pass sets it from the adoption plan.
    Adopt(Vec<AddrRange>),
}

/// An allocation read back from storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAllocation {
    pub cluster: String,
    pub pool: String,
    pub datacenter: String,
    /// What it holds; `None` for a request that failed or is pending.
    pub held: Option<Allocation>,
    /// The pool's `reclaimPolicy` recorded on the allocation, for pools that are gone.
    pub reclaim_policy: Option<ReclaimPolicy>,
    /// The stored object cannot be read (why): what it holds is unknown, so no new address
    /// is handed out in its pool and datacenter (every datacenter of the pool when
    /// `datacenter` is empty) until it is fixed or removed.
    pub unreadable: Option<String>,
}

/// Addresses released from a pool datacenter and quarantined for their former holder
/// (`reuseAfter`), as the fenced record (or the offline state file) keeps them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quarantined {
    pub pool: String,
    pub datacenter: String,
    /// The cluster that held them.
    pub holder: String,
    /// When they were released, in seconds since the Unix epoch.
    pub released_at: i64,
    /// The addresses, sorted and merged.
    pub addresses: Vec<AddrRange>,
}

impl Quarantined {
    /// The end of the quarantine under `reuse_after` seconds.
    pub fn until(&self, reuse_after: u64) -> i64 {
        self.released_at
            .saturating_add(i64::try_from(reuse_after).unwrap_or(i64::MAX))
    }
}

/// Addresses held through a pool the planner does not plan (its spec is invalid, so it is
/// left out with its allocations): nobody gets them through another pool of the datacenter
/// either, whatever its address space (the invalid pool's own may not be readable).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeldElsewhere {
    /// The pool it is held through; empty for addresses held outside kipam (what a user
    /// cluster being adopted serves), set aside in every pool of the datacenter.
    pub pool: String,
    pub datacenter: String,
    /// The cluster (or quarantine entry) holding them.
    pub holder: String,
    pub addresses: Vec<AddrRange>,
}
