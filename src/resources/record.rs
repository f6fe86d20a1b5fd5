//! `IPAMPoolRecord`: the authoritative record of what one pool holds in one datacenter.
//!
//! kipam commits every allocation here first, as one compare-and-swap on the record's
//! `resourceVersion`, and only then writes the `IPAMAllocation` objects. A replica that lost
//! the leader Lease holds an outdated `resourceVersion`, so the API server refuses its record
//! write (409 Conflict) and it never gets to hand those addresses out. See `docs/design.md`.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Largest serialised record kipam writes. etcd refuses values over 1.5 MiB; the rest is
/// headroom for metadata.
pub const MAX_RECORD_BYTES: usize = 1_000_000;

pub use super::bounds::MAX_RECORD_ENTRIES;
use super::bounds::{
    MAX_ADDRESS_RANGE, MAX_ALLOCATION_PIECES, MAX_CIDR, MAX_LABEL, MAX_LAYOUT_NETWORKS,
    PATTERN_CIDR,
};

/// The addresses every cluster holds from one pool in one datacenter, written by kipam only.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ipam.kipam.dev",
    version = "v1alpha1",
    kind = "IPAMPoolRecord",
    plural = "ipampoolrecords",
    singular = "ipampoolrecord",
    shortname = "ipr",
    doc = "The authoritative record of the addresses one pool holds in one datacenter, written by kipam only.",
    printcolumn = r#"{"name":"Pool","type":"string","jsonPath":".spec.pool"}"#,
    printcolumn = r#"{"name":"DC","type":"string","jsonPath":".spec.datacenter"}"#,
    printcolumn = r#"{"name":"Block","type":"string","jsonPath":".spec.block"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.pool == oldSelf.pool", "message": "pool is immutable"},
    {"rule": "self.datacenter == oldSelf.datacenter", "message": "datacenter is immutable"},
    {
        "rule": "has(self.block) == has(oldSelf.block) && (!has(self.block) || self.block == oldSelf.block)",
        "message": "block is immutable"
    },
    {
        "rule": "has(self.blockLength) == has(oldSelf.blockLength) && (!has(self.blockLength) || self.blockLength == oldSelf.blockLength)",
        "message": "blockLength is immutable"
    }
]))]
pub struct IPAMPoolRecordSpec {
    /// The pool.
    #[schemars(length(min = 1, max = MAX_LABEL))]
    pub pool: String,
    /// The datacenter of the pool.
    #[schemars(length(min = 1, max = MAX_LABEL))]
    pub datacenter: String,
    /// The block of the pool's addresses this shard of the record covers (every address held
    /// there lies in it); absent on a record written before records were sharded, which
    /// covers the whole pool datacenter. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_CIDR), pattern(PATTERN_CIDR))]
    pub block: Option<String>,
    /// Cluster name -> the part of its addresses that lies in this record's block. An address listed here is never handed to
    /// another cluster.
    ///
    /// Entries named `quarantined/<cluster>@<release time>` hold addresses released by that
    /// cluster and quarantined (`reuseAfter`): handed to nobody else, and back to that cluster
    /// if it returns before the period ends.
    #[serde(default)]
    #[schemars(extend("maxProperties" = MAX_RECORD_ENTRIES))]
    pub reservations: BTreeMap<String, Reservation>,
    /// Raised by a commit of *another* pool of the same address space that hands out
    /// addresses lying in this shard's block: a commit of this pool planned on an older
    /// version of the shard is then refused, so two pools sharing addresses cannot hand the
    /// same one out. Absent until the first such commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub fence: Option<i64>,
    /// The highest `resourceVersion` of the `IPAMPool`s that the last writer of this shard
    /// had seen when it planned (the API server's revision is one counter across resources).
    /// A replica whose view of the pools is older refuses to write the shard until its view
    /// has caught up, so a replica that has not seen an edit of the pools (an `addressSpace`
    /// that joins two of them, a pool turned invalid) cannot commit past a replica that has.
    /// Absent on shards written before this field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub pools_seen: Option<i64>,
    /// Set only on the pool datacenter's *layout record* (`<pool>.<datacenter>.layout`,
    /// no entries): the prefix length of the blocks its record is divided into. Created once,
    /// before the first shard, and never changed (immutable): every replica divides the pool
    /// datacenter's addresses by it, whatever version of the pool it reads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 128))]
    pub block_length: Option<i32>,
    /// Set only on the layout record: every network (`poolCidr`, `additionalCidrs`) its pool
    /// datacenter has had since the layout record was made, those inside another one listed
    /// left out. A pool narrowed stays grouped with, and fenced by, the pools of its space
    /// over these as well as its current networks: a replica that has not seen the narrowing
    /// may still commit there. Grows only, while the pool datacenter lives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_LAYOUT_NETWORKS),
        inner(length(max = MAX_CIDR), pattern(PATTERN_CIDR))
    )]
    pub networks: Vec<String>,
    /// Set only on the layout record: the pool's `metadata.generation` whose networks
    /// `networks` holds, written by the leader before it plans on that generation. A replica
    /// whose view of the pool is older refuses to write the pool datacenter's records (it has
    /// not seen an edit the leader has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub pool_generation: Option<i64>,
    /// The format of the record's rules that its last writer knew: stamped on every shard
    /// kipam creates or commits into, and on every layout record. Absent on records written
    /// before formats were stamped, which are format 1. A kipam refuses to write a record of a
    /// newer format than it knows (during a rolling upgrade, an older replica never commits
    /// under rules it does not know) and says so on the pool's conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub format: Option<i32>,
}

/// The record format this kipam writes and knows. A release raises it when it changes what
/// a record's fields mean or how replicas must read them; every release from the first that
/// stamps it refuses to write a record of a newer format (`docs/operations.md`, "Upgrades").
/// Format 2: a new shard is created empty and confirmed by a raise of its layout record
/// before entries go in (a format-1 replica creates it with its entries, which the fence of
/// a pool datacenter made again does not cover); the layout record keeps the pool
/// datacenter's networks and the pool generation they are of (`networks`,
/// `poolGeneration`), by which a narrowed pool stays fenced.
pub const RECORD_FORMAT: i32 = 2;

impl IPAMPoolRecordSpec {
    /// The record's format when it is newer than this kipam knows.
    pub fn newer_format(&self) -> Option<i32> {
        self.format.filter(|f| *f > RECORD_FORMAT)
    }
}

/// What one cluster holds: a subnet (`prefix` pools) or address pieces (`range` pools).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The subnet held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_CIDR))]
    pub cidr: Option<String>,
    /// The address pieces held, as `first-last`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_ALLOCATION_PIECES), inner(length(max = MAX_ADDRESS_RANGE)))]
    pub addresses: Vec<String>,
}

/// The owner reference every record of `pool` carries (`controller: true`): deleting the pool
/// removes its records (allocations a `Retain` pool leaves behind are still reserved by their
/// objects, and the records are rebuilt from them).
pub fn record_owner(
    pool: &super::IPAMPool,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    use kube::{Resource, ResourceExt};
    k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: super::IPAMPool::api_version(&()).into_owned(),
        kind: super::IPAMPool::kind(&()).into_owned(),
        name: pool.name_any(),
        uid: pool.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The name of a record written before records were sharded: `<pool>.<datacenter>` (pool and
/// datacenter names are DNS labels: neither holds a dot).
pub fn record_name(pool: &str, datacenter: &str) -> String {
    format!("{pool}.{datacenter}")
}
