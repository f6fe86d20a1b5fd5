//! Why an allocator operation was refused.
//!
//! Every variant names the pool (its label), the cluster or exclusion concerned, the request
//! and the reason, so the message can be shown to a user as it is.

use std::fmt;

use crate::address::{AddressCount, Family};

/// Where addresses offered to the allocator come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimOrigin {
    /// Taken exactly as a cluster asked (`addresses` / `cidr` overrides).
    Pinned,
    /// Loaded back from a stored `IPAMAllocation`.
    Stored,
}

impl fmt::Display for ClaimOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClaimOrigin::Pinned => "pinned",
            ClaimOrigin::Stored => "stored",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("pool {pool} has {free} free addresses, {requested} requested by {owner}")]
    Exhausted {
        pool: String,
        owner: String,
        requested: AddressCount,
        free: AddressCount,
    },
    #[error(
        "pool {pool} has no free aligned /{length} subnet for {owner} \
         ({free} free addresses, largest free block {largest})"
    )]
    NoFreeSubnet {
        pool: String,
        owner: String,
        length: u8,
        free: AddressCount,
        largest: AddressCount,
    },
    #[error("pool {pool} already holds {existing} for {owner}")]
    AlreadyAllocated {
        pool: String,
        owner: String,
        existing: String,
    },
    #[error("pool {pool} holds no allocation for {owner}")]
    NotAllocated { pool: String, owner: String },
    #[error("pool {pool} is a {pool_type} pool: {owner} cannot have {request}")]
    WrongType {
        pool: String,
        owner: String,
        pool_type: &'static str,
        request: String,
    },
    #[error("pool {pool}: {request} for {owner} is invalid: {reason}")]
    InvalidRequest {
        pool: String,
        owner: String,
        request: String,
        reason: String,
    },
    #[error("pool {pool}: {value} is {found}, the pool is {expected} ({context})")]
    FamilyMismatch {
        pool: String,
        value: String,
        found: Family,
        expected: Family,
        context: String,
    },
    #[error("pool {pool}: {origin} {value} of {owner} is outside the pool")]
    OutsidePool {
        pool: String,
        owner: String,
        origin: ClaimOrigin,
        value: String,
    },
    #[error("pool {pool}: {origin} {value} of {owner} is excluded (exclusion {exclusion})")]
    Excluded {
        pool: String,
        owner: String,
        origin: ClaimOrigin,
        value: String,
        exclusion: String,
    },
    #[error("pool {pool}: {origin} {value} of {owner} is already taken by {holder}")]
    Taken {
        pool: String,
        owner: String,
        origin: ClaimOrigin,
        value: String,
        holder: String,
    },
    #[error("pool {pool}: exclusion {exclusion} is outside the pool")]
    ExclusionOutsidePool { pool: String, exclusion: String },
    #[error("pool {pool}: exclusion {exclusion} hits the allocation of {holder} ({held})")]
    ExclusionHitsAllocation {
        pool: String,
        exclusion: String,
        holder: String,
        held: String,
    },
    #[error("pool {pool}: {field} {value} is invalid: {reason}")]
    InvalidConfig {
        pool: String,
        field: &'static str,
        value: String,
        reason: String,
    },
}
