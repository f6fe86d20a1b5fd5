//! Cluster API's `IPAddressClaim` as planner input: which pool datacenter it asks, for what,
//! or why it cannot be served yet. Pure: the adapter looks up the pool, the kipam `Cluster` of
//! the claim's cluster and what the claim already holds, and passes them in.

use crate::address::{AddrRange, Cidr, parse_address};
use crate::allocator::{Allocation, PoolKind};
use crate::planner::{ClusterInput, PoolInput, PoolOverride};
use crate::resources::capi::{
    ANNOTATION_CLAIM_DATACENTER, ANNOTATION_REQUESTED_ADDRESS, IPAddressClaim, claim_holder,
};

/// The contract's reason for a claim whose pool is missing, invalid, being deleted or paused
/// (kipam's detail is in the message).
pub const POOL_NOT_READY: &str = "PoolNotReady";
/// The reason of a claim whose Cluster API `Cluster` does not exist (yet).
pub const CLUSTER_NOT_FOUND: &str = "ClusterNotFound";
/// The reason of a claim whose `IPAddress` was made before it and cannot be adopted.
pub const ADDRESS_NOT_ADOPTABLE: &str = "AddressNotAdoptable";

/// Why a claim is not served, as its `Ready=False` condition says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimWait {
    /// The condition's reason (CamelCase).
    pub reason: &'static str,
    /// What is wrong and what to do about it.
    pub message: String,
}

impl ClaimWait {
    fn new(reason: &'static str, message: String) -> Self {
        ClaimWait { reason, message }
    }
}

/// The pool a claim names, as the adapter found it.
pub enum ClaimPool<'a> {
    /// Valid and not being deleted.
    Ready(&'a PoolInput),
    /// Exists but its spec is invalid (why).
    Invalid(String),
    /// Being deleted.
    Deleting,
    /// Not there (yet).
    Missing,
}

/// What a claim already holds: the pool datacenter and the addresses.
pub struct ClaimHeld<'a> {
    pub datacenter: &'a str,
    pub held: &'a Allocation,
}

/// A claim read for the planner: its input, and (when it is not served) why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRead {
    /// `None` when it holds nothing and cannot be served: nothing to plan.
    pub input: Option<ClusterInput>,
    pub wait: Option<ClaimWait>,
    /// The requested-address annotation could not be honoured as written and was left
    /// aside (the claim already holds another address): said in the status message.
    pub note: Option<String>,
}

/// Reads claim `claim` (whose `spec.poolRef` names pool `pool_name`). `cluster_datacenter` is
/// the `spec.datacenter` of the kipam `Cluster` named like the claim's cluster, if there is
/// one; `paused` says its Cluster API cluster (or the claim) is paused; `held` what the pool
/// record or its `IPAddress` shows it holds.
pub fn claim_input(
    claim: &IPAddressClaim,
    pool_name: &str,
    pool: ClaimPool<'_>,
    cluster_datacenter: Option<&str>,
    paused: bool,
    held: Option<ClaimHeld<'_>>,
) -> ClaimRead {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let holder = claim_holder(namespace, name);
    let deleting = claim.metadata.deletion_timestamp.is_some();
    let created = claim
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string());
    let input = |datacenter: &str, overrides, invalid: Option<String>| ClusterInput {
        name: holder.clone(),
        created: created.clone(),
        datacenter: datacenter.to_string(),
        overrides,
        // A paused claim keeps what it holds, even while being deleted: the contract leaves a
        // paused claim alone.
        deleting: deleting && !paused,
        paused,
        invalid,
        only_pool: Some(pool_name.to_string()),
        hold: None,
    };
    let no_overrides = std::collections::BTreeMap::new;
    // A claim that holds addresses keeps them where they are: its datacenter and request are
    // what it got, whatever its annotations say now (a machine's address does not move).
    if let Some(h) = held {
        let mut overrides = no_overrides();
        let keep = match h.held {
            Allocation::Range(pieces) => PoolOverride::Addresses(
                pieces
                    .iter()
                    .filter_map(|p| p.size().to_u128())
                    .sum::<u128>()
                    .max(1),
            ),
            Allocation::Prefix(cidr) => PoolOverride::PinnedCidr(*cidr),
        };
        overrides.insert(pool_name.to_string(), keep);
        let invalid = match &pool {
            ClaimPool::Invalid(why) => Some(why.clone()),
            _ => None,
        };
        let note = annotation(claim, ANNOTATION_REQUESTED_ADDRESS)
            .filter(|asked| !holds_exactly(h.held, asked))
            .map(|asked| {
                format!(
                    "{ANNOTATION_REQUESTED_ADDRESS} {asked:?} is not what the claim holds ({}): a held address is never moved",
                    h.held
                )
            });
        return ClaimRead {
            input: Some(input(h.datacenter, overrides, invalid)),
            wait: None,
            note,
        };
    }
    let waiting = |wait: ClaimWait| ClaimRead {
        input: None,
        wait: Some(wait),
        note: None,
    };
    if deleting {
        // Nothing held: nothing to release.
        return ClaimRead {
            input: None,
            wait: None,
            note: None,
        };
    }
    let pool = match pool {
        ClaimPool::Ready(p) => p,
        ClaimPool::Missing => {
            return waiting(ClaimWait::new(
                POOL_NOT_READY,
                format!(
                    "IPAMPool {pool_name} does not exist; the claim is served once it is created"
                ),
            ));
        }
        ClaimPool::Deleting => {
            return waiting(ClaimWait::new(
                POOL_NOT_READY,
                format!("IPAMPool {pool_name} is being deleted; point the claim at another pool"),
            ));
        }
        ClaimPool::Invalid(why) => {
            return waiting(ClaimWait::new(
                POOL_NOT_READY,
                format!(
                    "IPAMPool {pool_name} is invalid ({why}); the claim is served once it is fixed"
                ),
            ));
        }
    };
    let datacenter = match datacenter_of(claim, pool, cluster_datacenter) {
        Ok(dc) => dc,
        Err(wait) => return waiting(wait),
    };
    let Some(dc) = pool.datacenters.get(&datacenter) else {
        return waiting(ClaimWait::new(
            "AllocationFailed",
            format!("pool {pool_name} has no datacenter {datacenter}"),
        ));
    };
    let mut overrides = no_overrides();
    let request = match requested(claim, pool_name, &dc.config.kind) {
        Ok(Some(pin)) => Some(pin),
        Ok(None) => match dc.config.kind {
            PoolKind::Range { .. } => Some(PoolOverride::Addresses(1)),
            PoolKind::Prefix { .. } => None,
        },
        Err(wait) => return waiting(wait),
    };
    if let Some(r) = request {
        overrides.insert(pool_name.to_string(), r);
    }
    ClaimRead {
        input: Some(input(&datacenter, overrides, None)),
        wait: None,
        note: None,
    }
}

fn annotation<'a>(claim: &'a IPAddressClaim, key: &str) -> Option<&'a str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(|v| v.trim())
}

fn holds_exactly(held: &Allocation, asked: &str) -> bool {
    match held {
        Allocation::Prefix(c) => asked.parse::<Cidr>().map(|a| a == *c).unwrap_or_else(|_| {
            parse_address(asked).is_ok_and(|(f, a)| f == c.family() && a == c.first())
        }),
        Allocation::Range(pieces) => {
            pieces.len() == 1
                && parse_address(asked).is_ok_and(|(f, a)| {
                    f == pieces[0].family() && a == pieces[0].first() && a == pieces[0].last()
                })
        }
    }
}

/// The datacenter a claim asks: its annotation, else its kipam cluster's, else the pool's
/// only one.
fn datacenter_of(
    claim: &IPAddressClaim,
    pool: &PoolInput,
    cluster_datacenter: Option<&str>,
) -> Result<String, ClaimWait> {
    let known = || {
        pool.datacenters
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(dc) = annotation(claim, ANNOTATION_CLAIM_DATACENTER) {
        if pool.datacenters.contains_key(dc) {
            return Ok(dc.to_string());
        }
        return Err(ClaimWait::new(
            "DatacenterUnknown",
            format!(
                "annotation {ANNOTATION_CLAIM_DATACENTER}: {dc:?} is not a datacenter of pool {} (it has: {}); name one of them",
                pool.name,
                known()
            ),
        ));
    }
    if let Some(dc) = cluster_datacenter {
        if pool.datacenters.contains_key(dc) {
            return Ok(dc.to_string());
        }
        return Err(ClaimWait::new(
            "DatacenterUnknown",
            format!(
                "cluster {} is in datacenter {dc:?}, which pool {} does not serve (it has: {}); set annotation {ANNOTATION_CLAIM_DATACENTER} or use a pool of that datacenter",
                claim.cluster_name().unwrap_or_default(),
                pool.name,
                known()
            ),
        ));
    }
    let mut dcs = pool.datacenters.keys();
    match (dcs.next(), dcs.next()) {
        (Some(only), None) => Ok(only.clone()),
        _ => Err(ClaimWait::new(
            "DatacenterAmbiguous",
            format!(
                "pool {} has several datacenters ({}) and nothing names one: set annotation {ANNOTATION_CLAIM_DATACENTER} on the claim, or create a kipam Cluster named like the claim's cluster",
                pool.name,
                known()
            ),
        )),
    }
}

/// The requested-address annotation as a pin: one address in a range pool; in a prefix pool
/// the subnet of `allocationPrefix` holding the address, or the CIDR as written.
fn requested(
    claim: &IPAddressClaim,
    pool_name: &str,
    kind: &PoolKind,
) -> Result<Option<PoolOverride>, ClaimWait> {
    let Some(asked) = annotation(claim, ANNOTATION_REQUESTED_ADDRESS) else {
        return Ok(None);
    };
    let invalid = |why: String| {
        ClaimWait::new(
            "RequestedAddressInvalid",
            format!("annotation {ANNOTATION_REQUESTED_ADDRESS}: {asked:?} {why}"),
        )
    };
    match kind {
        PoolKind::Range { .. } => {
            let (family, a) = parse_address(asked).map_err(|e| {
                invalid(format!(
                    "is not an address ({e}); pool {pool_name} hands out single addresses"
                ))
            })?;
            let one = AddrRange::new(family, a, a)
                .ok_or_else(|| invalid("is not an address".to_string()))?;
            Ok(Some(PoolOverride::PinnedAddresses(vec![one])))
        }
        PoolKind::Prefix { allocation_prefix } => {
            if let Ok(cidr) = asked.parse::<Cidr>() {
                return Ok(Some(PoolOverride::PinnedCidr(cidr)));
            }
            let (family, a) = parse_address(asked)
                .map_err(|e| invalid(format!("is neither an address nor a CIDR ({e})")))?;
            let len = (*allocation_prefix).min(family.bits());
            let host_bits = u32::from(family.bits() - len);
            let network = if host_bits >= 128 {
                0
            } else {
                a & !((1u128 << host_bits) - 1)
            };
            let cidr = Cidr::new(family, network, len)
                .ok_or_else(|| invalid(format!("has no /{len} subnet")))?;
            Ok(Some(PoolOverride::PinnedCidr(cidr)))
        }
    }
}

/// A claim that holds nothing and is not being deleted waits while the Cluster API `Cluster`
/// it names (`spec.clusterName`, or the older label) does not exist: the contract says to stop
/// there (a mistyped name, a `clusterctl move` half done, or a claim seen before its Cluster).
/// `found` says whether that Cluster exists in the claim's namespace. A claim that holds an
/// address keeps it (a cache that lags must never free a machine's address), and a claim being
/// deleted is still released: neither gets a wait here.
pub fn cluster_wait(claim: &IPAddressClaim, holds: bool, found: bool) -> Option<ClaimWait> {
    let cluster = claim.cluster_name()?;
    if found || holds || claim.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    Some(ClaimWait::new(
        CLUSTER_NOT_FOUND,
        format!(
            "Cluster API Cluster {namespace}/{cluster} (the claim's cluster) does not exist; the claim is served once it exists and is not paused"
        ),
    ))
}

/// An `IPAddress` found under a claim's name that kipam did not write: what the claim would
/// adopt.
pub struct Found<'a> {
    /// `metadata.name`, `spec.claimRef.name`, the kipam pool `spec.poolRef` names (if any),
    /// `spec.address` and `spec.prefix`.
    pub name: &'a str,
    pub claim_ref: &'a str,
    pub pool: Option<&'a str>,
    pub address: &'a str,
    pub prefix: i32,
}

/// The pin that adopts `found` for a claim of pool `pool` served from `datacenter`: its own
/// address (in a `prefix` pool, its subnet), so the planner commits exactly that address to the
/// record through the same allocator as any request. `Err` says, for the claim's condition,
/// why it cannot be adopted: it names another claim or pool, does not read, or lies outside
/// the pool datacenter. Whether somebody else holds it is the allocator's to say.
pub fn adoption(
    claim_name: &str,
    pool_name: &str,
    pool: &PoolInput,
    datacenter: &str,
    found: &Found<'_>,
) -> Result<PoolOverride, ClaimWait> {
    let not = |why: String| {
        ClaimWait::new(
            ADDRESS_NOT_ADOPTABLE,
            format!(
                "IPAddress {} exists under the claim's name but cannot be adopted: {why}; delete it or correct it, and the claim is served",
                found.name
            ),
        )
    };
    if found.claim_ref != claim_name {
        return Err(not(format!(
            "its spec.claimRef.name is {:?}, not {claim_name:?}",
            found.claim_ref
        )));
    }
    if found.pool != Some(pool_name) {
        return Err(not(format!(
            "its spec.poolRef names {}, not IPAMPool {pool_name}",
            found
                .pool
                .map_or("no kipam pool".to_string(), |p| format!("IPAMPool {p}"))
        )));
    }
    let Some(dc) = pool.datacenters.get(datacenter) else {
        return Err(not(format!(
            "pool {pool_name} has no datacenter {datacenter}"
        )));
    };
    let (family, at) = parse_address(found.address.trim())
        .map_err(|e| not(format!("spec.address {:?}: {e}", found.address)))?;
    let wanted = match dc.config.kind {
        PoolKind::Range { .. } => {
            let one = AddrRange::new(family, at, at).ok_or_else(|| {
                not(format!(
                    "spec.address {:?} is not an address",
                    found.address
                ))
            })?;
            Allocation::Range(vec![one])
        }
        PoolKind::Prefix { .. } => {
            let cidr = u8::try_from(found.prefix)
                .ok()
                .and_then(|len| Cidr::new(family, at, len))
                .ok_or_else(|| {
                    not(format!(
                        "spec.address {:?} with spec.prefix {} is not a subnet",
                        found.address, found.prefix
                    ))
                })?;
            Allocation::Prefix(cidr)
        }
    };
    let inside = wanted
        .ranges()
        .all(|r| dc.config.cidrs().any(|c| c.contains(&r)));
    if !inside {
        let cidrs: Vec<String> = dc.config.cidrs().map(|c| c.to_string()).collect();
        return Err(not(format!(
            "{wanted} lies outside pool {pool_name} in datacenter {datacenter} ({})",
            cidrs.join(", ")
        )));
    }
    Ok(match wanted {
        Allocation::Range(pieces) => PoolOverride::PinnedAddresses(pieces),
        Allocation::Prefix(cidr) => PoolOverride::PinnedCidr(cidr),
    })
}

#[cfg(test)]
mod tests;
