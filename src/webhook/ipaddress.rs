//! The rule for Cluster API's `IPAddress` (`ipam.cluster.x-k8s.io`, any version) when it names
//! a kipam pool, written by anyone but kipam: [`check`], pure.
//!
//! kipam writes an `IPAddress` only after it has committed the address to the pool record
//! under the claim's holder name (`claim/<namespace>/<name>`, [`claim_holder`]). A hand-made
//! one is refused when the pool does not exist, when `spec.address` does not parse or lies in
//! none of the pool's datacenters' CIDRs, or when the address is held by anyone else: an entry
//! of the pool's records other than the claim's own (a quarantine entry counts as held, the
//! claim's own included: kipam hands it back itself), an `IPAMAllocation` of the pool, or an
//! exclusion.
//!
//! The object is read as JSON, so `v1alpha1`, `v1beta1` and `v1beta2` (same shape for the
//! fields read here) all pass; a `poolRef` without `apiGroup` (optional in `v1beta1`) names the
//! core group, never a kipam pool. Nothing here needs Cluster API's CRDs: what is held comes
//! from kipam's own records and ledger.

use serde_json::Value;

use crate::address::{AddrRange, parse_address};
use crate::allocator::Allocation;
use crate::reservations::{allocation_of, parse_quarantine_key};
use crate::resources::capi::{
    IPAddress, LABEL_ADDRESS_DATACENTER, PoolReference, claim_holder, claim_of_holder,
    hand_made_of_holder,
};
use crate::resources::{AllocationType, IPAMAllocation, IPAMPool, IPAMPoolRecord};
use crate::validation::{self, FieldError};

use super::review::Verdict;

/// Cluster API's IPAM group, whose `ipaddresses` the webhook reviews.
pub use crate::resources::capi::CAPI_IPAM_GROUP as GROUP;

/// The plural resource reviewed.
pub const RESOURCE: &str = "ipaddresses";

/// The kipam pool an `IPAddress` object (JSON) names in `spec.poolRef`, if it names one.
pub fn kipam_pool(object: &Value) -> Option<String> {
    let pool_ref = object.get("spec")?.get("poolRef")?;
    // An unreadable reference names no kipam pool; Cluster API's schema judges it.
    let pool_ref: PoolReference = serde_json::from_value(pool_ref.clone()).ok()?;
    pool_ref.kipam_pool().map(str::to_string)
}

/// Whether the pool a hand-made `IPAddress` names still serves it: `pool` (as the caller's
/// cache shows it; `None` when it is gone) is valid and has a datacenter whose CIDRs hold the
/// address — the one its datacenter label names, when it has the label. One its pool no
/// longer serves (the datacenter removed from the pool, the pool deleted or invalid) still
/// shows its address, so it still holds it: in the datacenter its label names, or without
/// one in every datacenter, whatever the address space, until it is deleted
/// ([`outlived_holds_in`]). An address that does not read holds nothing: served.
pub fn served_by(address: &IPAddress, pool: Option<&IPAMPool>) -> bool {
    let Ok((family, at)) = parse_address(address.spec.address.trim()) else {
        return true;
    };
    let Some(single) = AddrRange::new(family, at, at) else {
        return true;
    };
    let Some(input) = pool.and_then(|p| validation::pool_input(p).ok()) else {
        return false;
    };
    let label = datacenter_label(address);
    input.datacenters.iter().any(|(dc, d)| {
        label.is_none_or(|l| l == dc) && d.config.cidrs().any(|c| c.contains(&single))
    })
}

/// For a hand-made `IPAddress` its pool no longer serves ([`served_by`]): whether it holds
/// its address in datacenter `dc` — the one its label names, or every one without a label.
pub fn outlived_holds_in(address: &IPAddress, dc: &str) -> bool {
    datacenter_label(address).is_none_or(|l| l == dc)
}

fn datacenter_label(address: &IPAddress) -> Option<&str> {
    address
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_ADDRESS_DATACENTER))
        .map(String::as_str)
        .filter(|l| !l.is_empty())
}

/// What the pool holds, as the webhook's caches show it.
#[derive(Clone, Copy, Debug)]
pub struct Held<'a> {
    /// The pool `spec.poolRef` names, when it exists.
    pub pool: Option<&'a IPAMPool>,
    /// The `IPAMAllocation`s of that pool (the ledger).
    pub allocations: &'a [IPAMAllocation],
    /// The `IPAMPoolRecord`s of that pool.
    pub records: &'a [IPAMPoolRecord],
    /// The other pools of its address space; `allocations` and `records` hold theirs too.
    pub space: &'a [IPAMPool],
    /// The `IPAMAllocation`s whose pool no longer serves them: of pools that no longer exist
    /// (kept by `reclaimPolicy: Retain`, or not deleted yet), or of a datacenter removed from
    /// their pool. Held in every pool of their datacenter, whatever the address space, until
    /// their objects go.
    pub retained: &'a [IPAMAllocation],
    /// The hand-made `IPAddress`es (not kipam's) of the pool and of its address space: one
    /// whose record entry went with its pool's record (a datacenter removed and added again, a
    /// pool made again) still holds its address. Also those of any pool that no longer serves
    /// them ([`served_by`]): held in their datacenter whatever the address space.
    pub hand_made: &'a [IPAddress],
}

fn text<'a>(value: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_str)
}

fn joined(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The holder a record entry's name (or a planner holder's) stands for: `cluster c1`,
/// `claim ns/name`.
fn holder(entry: &str) -> String {
    if let Some((namespace, name, _)) = hand_made_of_holder(entry) {
        return format!("hand-made IPAddress {namespace}/{name}");
    }
    match claim_of_holder(entry) {
        Some((namespace, name)) => format!("claim {namespace}/{name}"),
        None => format!("cluster {entry}"),
    }
}

/// What a record entry does with its addresses: `held by <holder>`, or `quarantined for
/// <former holder> (<entry>)`.
fn holding(entry: &str) -> String {
    match parse_quarantine_key(entry) {
        Some(Ok((former, _))) => format!("quarantined for {} ({entry})", holder(former)),
        Some(Err(_)) => format!("quarantined ({entry})"),
        None => format!("held by {}", holder(entry)),
    }
}

/// The piece of `held` overlapping `shown` (the address, or the subnet of a prefix pool's
/// `IPAddress`), as a message shows it: the subnet of a prefix allocation, an address alone,
/// or `first-last`.
fn piece_holding(held: &Allocation, shown: &AddrRange) -> Option<String> {
    let family = shown.family();
    if let Allocation::Prefix(cidr) = held {
        return cidr.range().overlaps(shown).then(|| cidr.to_string());
    }
    let piece = held
        .ranges()
        .find(|r| r.family() == family && r.overlaps(shown))?;
    Some(if piece.first() == piece.last() {
        family.display(piece.first()).to_string()
    } else {
        piece.to_string()
    })
}

/// The decision for a create or update of `object` (an `IPAddress`, as JSON) in `namespace`
/// (the request's, used when the object does not say), given what its pool holds. Admitted,
/// it gives what the object shows in each datacenter of its pool it lies in (the address, or
/// in a `prefix` datacenter its subnet): what [`super::pin`] commits to the record. Nothing
/// when it names no kipam pool.
pub fn check(
    object: &Value,
    namespace: Option<&str>,
    held: Held<'_>,
) -> Result<Vec<(String, AddrRange)>, Verdict> {
    let Some(pool_name) = kipam_pool(object) else {
        return Ok(Vec::new());
    };
    let namespace = text(object, &["metadata", "namespace"])
        .filter(|n| !n.is_empty())
        .or(namespace)
        .unwrap_or("");
    let name = text(object, &["metadata", "name"]).unwrap_or("");
    let label = format!("IPAddress {namespace}/{name}");
    let Some(pool) = held.pool else {
        return Err(Verdict::invalid(format!(
            "{label}: spec.poolRef.name {pool_name:?}: no IPAMPool {pool_name} exists"
        )));
    };
    let address = match object.get("spec").and_then(|s| s.get("address")) {
        Some(Value::String(a)) => a.as_str(),
        None | Some(Value::Null) => {
            return Err(Verdict::invalid(format!(
                "{label}: spec.address: missing; an IPAddress of IPAMPool {pool_name} names one address"
            )));
        }
        Some(other) => {
            return Err(Verdict::invalid(format!(
                "{label}: spec.address {other}: is not a string"
            )));
        }
    };
    let (family, at) = parse_address(address).map_err(|e| {
        Verdict::invalid(format!(
            "{label}: spec.address {address:?}: {e} (one address, no prefix length: that is spec.prefix)"
        ))
    })?;
    let input = validation::pool_input(pool).map_err(|e| {
        Verdict::invalid(format!(
            "{label}: IPAMPool {pool_name} is invalid, so nothing can be checked against it: {}",
            joined(&e)
        ))
    })?;
    let Some(single) = AddrRange::new(family, at, at) else {
        return Err(Verdict::invalid(format!(
            "{label}: spec.address {address:?}: is not an address"
        )));
    };
    // What it shows in a `prefix` datacenter: the subnet `spec.address/spec.prefix`, checked
    // whole (a subnet that only starts free may still cover somebody's addresses).
    let subnet = |dc: &str| -> Result<AddrRange, Verdict> {
        let prefix_dc = pool
            .spec
            .datacenters
            .get(dc)
            .is_some_and(|s| s.type_ == AllocationType::Prefix);
        if !prefix_dc {
            return Ok(single);
        }
        let prefix = object
            .get("spec")
            .and_then(|s| s.get("prefix"))
            .and_then(Value::as_i64);
        prefix
            .and_then(|p| u8::try_from(p).ok())
            .and_then(|len| crate::address::Cidr::new(family, at, len))
            .map(|c| c.range())
            .ok_or_else(|| {
                Verdict::invalid(format!(
                    "{label}: spec.address {address:?} with spec.prefix {}: is not a subnet (IPAMPool {pool_name}/{dc} hands out subnets: the first address and the length)",
                    prefix.map_or("missing".to_string(), |p| p.to_string())
                ))
            })
    };
    // The datacenters whose CIDRs hold the address; the datacenter label kipam writes narrows
    // them when it names one of these (datacenters of one pool may share CIDRs).
    let mut dcs: Vec<&str> = input
        .datacenters
        .iter()
        .filter(|(_, dc)| dc.config.cidrs().any(|c| c.contains(&single)))
        .map(|(dc, _)| dc.as_str())
        .collect();
    if dcs.is_empty() {
        let cidrs: Vec<String> = pool
            .spec
            .datacenters
            .iter()
            .map(|(dc, s)| {
                let mut all = vec![s.pool_cidr.clone()];
                all.extend(s.additional_cidrs.iter().cloned());
                format!("{dc}: {}", all.join(", "))
            })
            .collect();
        return Err(Verdict::invalid(format!(
            "{label}: spec.address {address:?}: lies in none of the CIDRs of IPAMPool {pool_name} ({})",
            cidrs.join("; ")
        )));
    }
    if let Some(dc) = text(object, &["metadata", "labels", LABEL_ADDRESS_DATACENTER])
        && dcs.contains(&dc)
    {
        dcs = vec![dc];
    }
    let own = claim_holder(
        namespace,
        text(object, &["spec", "claimRef", "name"]).unwrap_or(""),
    );
    let refuse = |what: String| {
        Err(Verdict::invalid(format!(
            "{label}: spec.address {address:?}: {what}"
        )))
    };
    // Its own entry (the webhook committed it when the object was created): not a holder
    // against itself.
    let itself = |entry: &str| {
        hand_made_of_holder(entry).is_some_and(|(ns, n, _)| ns == namespace && n == name)
    };
    let mut placed = Vec::new();
    for dc in &dcs {
        let (Some(settings), Some(dc_input)) =
            (pool.spec.datacenters.get(*dc), input.datacenters.get(*dc))
        else {
            continue;
        };
        let shown = subnet(dc)?;
        if !dc_input.config.cidrs().any(|c| c.contains(&shown)) {
            return refuse(format!(
                "the subnet {shown} does not lie in one CIDR of IPAMPool {pool_name}/{dc}"
            ));
        }
        let (field, written) = match settings.type_ {
            AllocationType::Range => ("excludeRanges", &settings.exclude_ranges),
            AllocationType::Prefix => ("excludePrefixes", &settings.exclude_prefixes),
        };
        for (i, e) in dc_input.exclusions.iter().enumerate() {
            if e.family() == family && e.overlaps(&shown) {
                let shown = written.get(i).cloned().unwrap_or_else(|| e.to_string());
                return refuse(format!(
                    "is excluded from IPAMPool {pool_name}/{dc} (spec.datacenters[{dc}].{field}[{i}] {shown:?})"
                ));
            }
        }
        // Its own pool, then every other pool of the address space serving this datacenter.
        let others = held
            .space
            .iter()
            .filter(|p| p.spec.datacenters.contains_key(*dc))
            .filter_map(|p| p.metadata.name.as_deref());
        for holder_pool in std::iter::once(pool_name.as_str()).chain(others) {
            let through = if holder_pool == pool_name {
                format!("IPAMPool {pool_name}/{dc}")
            } else {
                format!(
                    "IPAMPool {holder_pool}/{dc}, which shares IPAMPool {pool_name}'s addresses"
                )
            };
            for record in held
                .records
                .iter()
                .filter(|r| r.spec.pool == holder_pool && r.spec.datacenter == *dc)
            {
                for (entry, reservation) in &record.spec.reservations {
                    if (*entry == own || itself(entry)) && holder_pool == pool_name {
                        continue;
                    }
                    let Ok(recorded) = allocation_of(reservation) else {
                        continue;
                    };
                    if let Some(piece) = piece_holding(&recorded, &shown) {
                        return refuse(format!(
                            "{} in {through} (IPAMPoolRecord {}: {piece})",
                            holding(entry),
                            record.metadata.name.as_deref().unwrap_or_default()
                        ));
                    }
                }
            }
            for allocation in held.allocations {
                let Ok(stored) = validation::stored_allocation(allocation) else {
                    continue;
                };
                if stored.pool != holder_pool || stored.datacenter != *dc {
                    continue;
                }
                if let Some(piece) = stored.held.as_ref().and_then(|h| piece_holding(h, &shown)) {
                    return refuse(format!(
                        "held by cluster {} in {through} (IPAMAllocation {}/{}: {piece})",
                        stored.cluster,
                        allocation.metadata.namespace.as_deref().unwrap_or_default(),
                        allocation.metadata.name.as_deref().unwrap_or_default(),
                    ));
                }
            }
        }
        for other in held.hand_made {
            let (other_ns, other_name) = (
                other.metadata.namespace.as_deref().unwrap_or_default(),
                other.metadata.name.as_deref().unwrap_or_default(),
            );
            if (other_ns, other_name) == (namespace, name) {
                continue;
            }
            let Some(other_pool) = other.spec.pool_ref.kipam_pool() else {
                continue;
            };
            // Its pool as the caches show it: this one or one of its address space; any
            // other is here only because it no longer serves the object.
            let known = held
                .space
                .iter()
                .chain(std::iter::once(pool))
                .find(|p| p.metadata.name.as_deref() == Some(other_pool));
            let serves = other_pool == pool_name.as_str()
                || known.is_some_and(|p| p.spec.datacenters.contains_key(*dc))
                || (!served_by(other, known) && outlived_holds_in(other, dc));
            let Ok((f, a)) = parse_address(other.spec.address.trim()) else {
                continue;
            };
            let prefix = u8::try_from(other.spec.prefix).ok();
            let theirs = prefix
                .and_then(|len| crate::address::Cidr::new(f, a, len))
                .map(|c| c.range())
                .filter(|_| {
                    held.space
                        .iter()
                        .chain(std::iter::once(pool))
                        .find(|p| p.metadata.name.as_deref() == Some(other_pool))
                        .and_then(|p| p.spec.datacenters.get(*dc))
                        .is_some_and(|s| s.type_ == AllocationType::Prefix)
                })
                .or_else(|| AddrRange::new(f, a, a));
            if serves && theirs.is_some_and(|t| t.overlaps(&shown)) {
                return refuse(format!(
                    "held by hand-made IPAddress {other_ns}/{other_name} of IPAMPool {other_pool} ({})",
                    other.spec.address
                ));
            }
        }
        for allocation in held.retained {
            let Ok(stored) = validation::stored_allocation(allocation) else {
                continue;
            };
            if stored.datacenter != *dc {
                continue;
            }
            if let Some(piece) = stored.held.as_ref().and_then(|h| piece_holding(h, &shown)) {
                let how = if stored.reclaim_policy == Some(crate::resources::ReclaimPolicy::Retain)
                {
                    "kept by reclaimPolicy Retain until a person deletes it"
                } else {
                    "not deleted yet"
                };
                return refuse(format!(
                    "held by cluster {} through IPAMPool {}, which no longer serves {dc} (the pool deleted or the datacenter removed from it); its IPAMAllocation {}/{} is {how} ({piece})",
                    stored.cluster,
                    stored.pool,
                    allocation.metadata.namespace.as_deref().unwrap_or_default(),
                    allocation.metadata.name.as_deref().unwrap_or_default(),
                ));
            }
        }
        // The record a pool of the address space still keeps of this datacenter after the
        // datacenter was removed from it: its entries are held until the planner trims them
        // (once their objects, refused above, are gone), and should the datacenter come back to
        // the pool first, each is a holding again.
        let removed_from = held
            .space
            .iter()
            .filter(|p| !p.spec.datacenters.contains_key(*dc))
            .filter_map(|p| p.metadata.name.as_deref());
        for holder_pool in removed_from {
            for record in held
                .records
                .iter()
                .filter(|r| r.spec.pool == holder_pool && r.spec.datacenter == *dc)
            {
                for (entry, reservation) in &record.spec.reservations {
                    let Ok(recorded) = allocation_of(reservation) else {
                        continue;
                    };
                    if let Some(piece) = piece_holding(&recorded, &shown) {
                        return refuse(format!(
                            "{} in the record IPAMPool {holder_pool} keeps of {dc}, which it no longer serves (IPAMPoolRecord {}: {piece}): held until kipam releases the entry",
                            holding(entry),
                            record.metadata.name.as_deref().unwrap_or_default()
                        ));
                    }
                }
            }
        }
        placed.push((dc.to_string(), shown));
    }
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pool(dcs: Value) -> IPAMPool {
        serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPool",
            "metadata": {"name": "lan"},
            "spec": {"datacenters": dcs},
        }))
        .unwrap()
    }

    /// `lan`: dc-1 range 10.0.0.0/24 plus 10.9.0.0/28, excluding 10.0.0.250; dc-2 prefix
    /// 10.1.0.0/16 in /28s.
    fn lan() -> IPAMPool {
        pool(json!({
            "dc-1": {"type": "range", "poolCidr": "10.0.0.0/24", "additionalCidrs": ["10.9.0.0/28"],
                     "allocationRange": 8, "excludeRanges": ["10.0.0.250"]},
            "dc-2": {"type": "prefix", "poolCidr": "10.1.0.0/16", "allocationPrefix": 28},
        }))
    }

    fn record(dc: &str, entries: Value) -> IPAMPoolRecord {
        serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPoolRecord",
            "metadata": {"name": format!("lan.{dc}")},
            "spec": {"pool": "lan", "datacenter": dc, "reservations": entries},
        }))
        .unwrap()
    }

    fn records() -> Vec<IPAMPoolRecord> {
        vec![
            record(
                "dc-1",
                json!({
                    "c1": {"addresses": ["10.0.0.0-10.0.0.7"]},
                    "claim/machines/web-0": {"addresses": ["10.0.0.8"]},
                    "quarantined/claim/machines/web-1@2026-11-25T18:00:00Z": {"addresses": ["10.0.0.9"]},
                    "quarantined/c2@2026-11-25T18:00:00Z": {"addresses": ["10.0.0.16-10.0.0.23"]},
                }),
            ),
            record(
                "dc-2",
                json!({"claim/machines/db-0": {"cidr": "10.1.0.16/28"}}),
            ),
        ]
    }

    fn allocations() -> Vec<IPAMAllocation> {
        vec![
            serde_json::from_value(json!({
                "apiVersion": "ipam.kipam.dev/v1alpha1",
                "kind": "IPAMAllocation",
                "metadata": {"name": "lan", "namespace": "cluster-c3"},
                "spec": {"type": "range", "dc": "dc-1", "addresses": ["10.0.0.32-10.0.0.39"]},
            }))
            .unwrap(),
        ]
    }

    /// An `IPAddress` in `machines` for claim `claim`, as `version` writes it: prefix 24, or in
    /// `lan`'s prefix datacenter (10.1.0.0/16) the /28 subnet starting at the address.
    fn address(version: &str, claim: &str, address: Value) -> Value {
        let prefix = if address.as_str().is_some_and(|a| a.starts_with("10.1.")) {
            28
        } else {
            24
        };
        json!({
            "apiVersion": format!("ipam.cluster.x-k8s.io/{version}"),
            "kind": "IPAddress",
            "metadata": {"name": claim, "namespace": "machines"},
            "spec": {
                "claimRef": {"name": claim},
                "poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": "lan"},
                "address": address,
                "prefix": prefix,
            },
        })
    }

    fn judge(object: &Value, pool: Option<&IPAMPool>) -> Result<(), Verdict> {
        let records = records();
        let allocations = allocations();
        check(
            object,
            Some("machines"),
            Held {
                pool,
                allocations: &allocations,
                records: &records,
                space: &[],
                retained: &[],
                hand_made: &[],
            },
        )
        .map(|_| ())
    }

    #[track_caller]
    fn refused(result: Result<(), Verdict>, parts: &[&str]) {
        let v = result.expect_err("expected a refusal");
        assert_eq!(v.code, 422, "{v:?}");
        for p in parts {
            assert!(v.message.contains(p), "{:?} lacks {p:?}", v.message);
        }
    }

    #[test]
    fn a_free_address_inside_the_pool_is_admitted_in_every_version() {
        let lan = lan();
        for version in ["v1alpha1", "v1beta1", "v1beta2"] {
            for a in ["10.0.0.100", "10.9.0.3", "10.1.0.48"] {
                assert_eq!(
                    judge(&address(version, "web-9", json!(a)), Some(&lan)),
                    Ok(())
                );
            }
        }
    }

    #[test]
    fn the_claims_own_record_entry_is_not_a_collision() {
        let lan = lan();
        assert_eq!(
            judge(&address("v1beta2", "web-0", json!("10.0.0.8")), Some(&lan)),
            Ok(())
        );
        // In a prefix datacenter, an address of the claim's subnet.
        assert_eq!(
            judge(&address("v1beta1", "db-0", json!("10.1.0.16")), Some(&lan)),
            Ok(())
        );
    }

    #[test]
    fn an_address_held_by_another_claim_or_a_cluster_is_refused_naming_the_holder() {
        let lan = lan();
        let v = judge(&address("v1beta2", "web-5", json!("10.0.0.8")), Some(&lan))
            .expect_err("another claim's address");
        assert_eq!(
            v.message,
            "IPAddress machines/web-5: spec.address \"10.0.0.8\": held by claim machines/web-0 \
             in IPAMPool lan/dc-1 (IPAMPoolRecord lan.dc-1: 10.0.0.8)"
        );
        refused(
            judge(&address("v1beta2", "web-5", json!("10.0.0.3")), Some(&lan)),
            &[
                "spec.address \"10.0.0.3\"",
                "held by cluster c1",
                "10.0.0.0-10.0.0.7",
            ],
        );
        let mut inside = address("v1beta2", "web-5", json!("10.1.0.20"));
        inside["spec"]["prefix"] = json!(30);
        refused(
            judge(&inside, Some(&lan)),
            &["held by claim machines/db-0", "lan/dc-2", "10.1.0.16/28"],
        );
        // The same claim name in another namespace is another holder.
        let mut elsewhere = address("v1beta2", "web-0", json!("10.0.0.8"));
        elsewhere["metadata"]["namespace"] = json!("other");
        refused(
            judge(&elsewhere, Some(&lan)),
            &["held by claim machines/web-0"],
        );
    }

    #[test]
    fn quarantined_addresses_count_as_held_even_for_their_former_claim() {
        let lan = lan();
        refused(
            judge(&address("v1beta2", "web-1", json!("10.0.0.9")), Some(&lan)),
            &[
                "spec.address \"10.0.0.9\"",
                "quarantined for claim machines/web-1",
            ],
        );
        refused(
            judge(&address("v1beta2", "web-5", json!("10.0.0.20")), Some(&lan)),
            &["quarantined for cluster c2"],
        );
    }

    #[test]
    fn an_address_of_an_allocation_object_only_is_refused() {
        let lan = lan();
        refused(
            judge(&address("v1beta2", "web-5", json!("10.0.0.33")), Some(&lan)),
            &[
                "spec.address \"10.0.0.33\"",
                "held by cluster c3",
                "IPAMAllocation cluster-c3/lan",
            ],
        );
    }

    #[test]
    fn an_excluded_address_is_refused_naming_the_exclusion() {
        let lan = lan();
        refused(
            judge(
                &address("v1beta2", "web-5", json!("10.0.0.250")),
                Some(&lan),
            ),
            &[
                "spec.address \"10.0.0.250\"",
                "excluded from IPAMPool lan/dc-1",
                "spec.datacenters[dc-1].excludeRanges[0] \"10.0.0.250\"",
            ],
        );
    }

    #[test]
    fn an_address_outside_every_cidr_or_unreadable_is_refused() {
        let lan = lan();
        refused(
            judge(
                &address("v1beta2", "web-5", json!("192.168.0.1")),
                Some(&lan),
            ),
            &[
                "spec.address \"192.168.0.1\"",
                "lies in none of the CIDRs of IPAMPool lan",
                "dc-1: 10.0.0.0/24, 10.9.0.0/28",
                "dc-2: 10.1.0.0/16",
            ],
        );
        refused(
            judge(
                &address("v1beta2", "web-5", json!("10.0.0.300")),
                Some(&lan),
            ),
            &["spec.address \"10.0.0.300\"", "is not an IP address"],
        );
        refused(
            judge(
                &address("v1beta2", "web-5", json!("10.0.0.5/24")),
                Some(&lan),
            ),
            &["spec.address \"10.0.0.5/24\""],
        );
        refused(
            judge(&address("v1beta2", "web-5", json!(17)), Some(&lan)),
            &["spec.address 17", "is not a string"],
        );
        let mut none = address("v1beta2", "web-5", Value::Null);
        none["spec"].as_object_mut().unwrap().remove("address");
        refused(judge(&none, Some(&lan)), &["spec.address: missing"]);
    }

    #[test]
    fn a_missing_pool_is_refused_and_other_pools_are_left_alone() {
        refused(
            judge(&address("v1beta2", "web-5", json!("10.0.0.100")), None),
            &["spec.poolRef.name \"lan\"", "no IPAMPool lan exists"],
        );
        // v1beta1 without apiGroup names the core group: not kipam's.
        let mut core = address("v1beta1", "web-5", json!("10.0.0.3"));
        core["spec"]["poolRef"]
            .as_object_mut()
            .unwrap()
            .remove("apiGroup");
        assert_eq!(judge(&core, None), Ok(()));
        let mut other = address("v1beta2", "web-5", json!("10.0.0.3"));
        other["spec"]["poolRef"] =
            json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "lan"});
        assert_eq!(judge(&other, None), Ok(()));
        let mut unreadable = address("v1beta2", "web-5", json!("10.0.0.3"));
        unreadable["spec"]["poolRef"] = json!("lan");
        assert_eq!(judge(&unreadable, None), Ok(()));
    }

    #[test]
    fn the_datacenter_label_narrows_datacenters_that_share_cidrs() {
        // dc-1 and dc-2 are separate networks with the same CIDR; c1 holds .3 in dc-1 only.
        let shared = pool(json!({
            "dc-1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 8},
            "dc-2": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 8},
        }));
        let mut a = address("v1beta2", "web-5", json!("10.0.0.3"));
        refused(
            judge(&a, Some(&shared)),
            &["held by cluster c1", "lan/dc-1"],
        );
        a["metadata"]["labels"] = json!({"ipam.kipam.dev/datacenter": "dc-2"});
        assert_eq!(judge(&a, Some(&shared)), Ok(()));
        a["metadata"]["labels"] = json!({"ipam.kipam.dev/datacenter": "dc-1"});
        refused(judge(&a, Some(&shared)), &["held by cluster c1"]);
    }

    #[test]
    fn the_namespace_comes_from_the_request_when_the_object_lacks_it() {
        let lan = lan();
        let mut a = address("v1beta2", "web-0", json!("10.0.0.8"));
        a["metadata"].as_object_mut().unwrap().remove("namespace");
        assert_eq!(judge(&a, Some(&lan)), Ok(()));
    }

    #[test]
    fn a_prefix_pools_address_is_checked_as_its_whole_subnet() {
        let lan = lan();
        // 10.1.0.0/27 starts free but covers db-0's 10.1.0.16/28.
        let mut a = address("v1beta2", "web-5", json!("10.1.0.0"));
        a["spec"]["prefix"] = json!(27);
        refused(
            judge(&a, Some(&lan)),
            &["held by claim machines/db-0", "10.1.0.16/28"],
        );
        a["spec"]["prefix"] = json!(28);
        assert_eq!(judge(&a, Some(&lan)), Ok(()), "10.1.0.0/28 is free");
        a["spec"]["address"] = json!("10.1.0.3");
        refused(judge(&a, Some(&lan)), &["is not a subnet"]);
    }

    #[test]
    fn an_address_held_through_another_pool_of_the_space_is_refused() {
        let lan = lan();
        let other: IPAMPool = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPool",
            "metadata": {"name": "other"},
            "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 8}}},
        }))
        .unwrap();
        let mut allocations = allocations();
        allocations.push(
            serde_json::from_value(json!({
                "apiVersion": "ipam.kipam.dev/v1alpha1",
                "kind": "IPAMAllocation",
                "metadata": {"name": "other", "namespace": "cluster-c9"},
                "spec": {"type": "range", "dc": "dc-1", "addresses": ["10.0.0.100-10.0.0.107"]},
            }))
            .unwrap(),
        );
        let records = records();
        let object = address("v1beta2", "web-5", json!("10.0.0.101"));
        let verdict = check(
            &object,
            Some("machines"),
            Held {
                pool: Some(&lan),
                allocations: &allocations,
                records: &records,
                space: std::slice::from_ref(&other),
                retained: &[],
                hand_made: &[],
            },
        )
        .map(|_| ());
        refused(
            verdict,
            &[
                "held by cluster c9",
                "IPAMPool other/dc-1",
                "shares IPAMPool lan",
            ],
        );
        // Without the other pool in its space, the same address is free in lan.
        let alone = check(
            &object,
            Some("machines"),
            Held {
                pool: Some(&lan),
                allocations: &allocations,
                records: &records,
                space: &[],
                retained: &[],
                hand_made: &[],
            },
        );
        let dc1 = AddrRange::parse_lenient("10.0.0.101").unwrap();
        assert_eq!(alone, Ok(vec![("dc-1".to_string(), dc1)]));
    }

    /// An address a pool of the address space held in a datacenter removed from it stays held
    /// while that record keeps it: the planner holds it until the entry is trimmed, and were
    /// the datacenter added back first, the entry would be a holding again — the history test
    /// saw a hand-made `IPAddress` admitted there and the entry's cluster then served the same
    /// address. Before, only the records of pools still serving the datacenter were read.
    #[test]
    fn an_address_in_the_record_of_a_datacenter_removed_from_a_pool_of_the_space_is_refused() {
        let lan = lan();
        // `vip` shares lan's addresses, but no longer serves dc-1; its record of dc-1 is left.
        let vip: IPAMPool = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPool",
            "metadata": {"name": "vip"},
            "spec": {"datacenters": {"dc-2": {"type": "range", "poolCidr": "10.1.0.0/24", "allocationRange": 1}}},
        }))
        .unwrap();
        let mut records = records();
        records.push(
            serde_json::from_value(json!({
                "apiVersion": "ipam.kipam.dev/v1alpha1",
                "kind": "IPAMPoolRecord",
                "metadata": {"name": "vip.dc-1.0a000000-24"},
                "spec": {"pool": "vip", "datacenter": "dc-1",
                         "reservations": {"c23": {"addresses": ["10.0.0.140"]}}},
            }))
            .unwrap(),
        );
        let held = |records: &[IPAMPoolRecord]| {
            check(
                &address("v1beta2", "web-4", json!("10.0.0.140")),
                Some("machines"),
                Held {
                    pool: Some(&lan),
                    allocations: &[],
                    records,
                    space: std::slice::from_ref(&vip),
                    retained: &[],
                    hand_made: &[],
                },
            )
            .map(|_| ())
        };
        refused(
            held(&records),
            &[
                "held by cluster c23",
                "the record IPAMPool vip keeps of dc-1",
                "no longer serves",
                "vip.dc-1.0a000000-24",
            ],
        );
        // Once the planner trimmed it, the address is free.
        records.pop();
        assert_eq!(held(&records), Ok(()));
    }

    #[test]
    fn an_address_kept_by_a_deleted_retain_pool_is_refused() {
        let lan = lan();
        let kept: IPAMAllocation = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMAllocation",
            "metadata": {"name": "gone", "namespace": "cluster-c7",
                "annotations": {"ipam.kipam.dev/reclaim-policy": "Retain"}},
            "spec": {"type": "range", "dc": "dc-1", "addresses": ["10.0.0.120-10.0.0.123"]},
        }))
        .unwrap();
        let records = records();
        let object = address("v1beta2", "web-6", json!("10.0.0.121"));
        let verdict = check(
            &object,
            Some("machines"),
            Held {
                pool: Some(&lan),
                allocations: &[],
                records: &records,
                space: &[],
                retained: std::slice::from_ref(&kept),
                hand_made: &[],
            },
        )
        .map(|_| ());
        refused(
            verdict,
            &[
                "held by cluster c7",
                "IPAMPool gone",
                "Retain",
                "cluster-c7/gone",
            ],
        );
    }

    #[test]
    fn an_address_another_hand_made_ip_address_shows_is_refused() {
        let lan = lan();
        let records = records();
        let first: crate::resources::capi::IPAddress =
            serde_json::from_value(address("v1beta2", "web-7", json!("10.0.0.121"))).unwrap();
        let object = address("v1beta2", "web-8", json!("10.0.0.121"));
        let held = |hand_made| Held {
            pool: Some(&lan),
            allocations: &[],
            records: &records,
            space: &[],
            retained: &[],
            hand_made,
        };
        refused(
            check(
                &object,
                Some("machines"),
                held(std::slice::from_ref(&first)),
            )
            .map(|_| ()),
            &["held by hand-made IPAddress machines/web-7"],
        );
        // Itself is no holder against itself (an update of the same object).
        let itself: crate::resources::capi::IPAddress =
            serde_json::from_value(object.clone()).unwrap();
        assert!(
            check(
                &object,
                Some("machines"),
                held(std::slice::from_ref(&itself))
            )
            .is_ok()
        );
    }

    #[test]
    fn a_hand_made_ip_address_whose_pool_no_longer_serves_it_still_holds_its_address() {
        // `vip` served dc-1 over lan's network; dc-1 was removed from it, so it serves dc-3
        // only now. Its hand-made `web-7` still shows 10.0.0.121 in dc-1.
        let lan = lan();
        let records = records();
        let vip: IPAMPool = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPool",
            "metadata": {"name": "vip"},
            "spec": {"datacenters": {"dc-3": {"type": "range", "poolCidr": "10.7.0.0/24", "allocationRange": 1}}},
        }))
        .unwrap();
        let made = |labels: Value| -> IPAddress {
            let mut v = address("v1beta2", "web-7", json!("10.0.0.121"));
            v["spec"]["poolRef"]["name"] = json!("vip");
            v["metadata"]["labels"] = labels;
            serde_json::from_value(v).unwrap()
        };
        let object = address("v1beta2", "web-8", json!("10.0.0.121"));
        let judge = |space: &[IPAMPool], other: &IPAddress| {
            check(
                &object,
                Some("machines"),
                Held {
                    pool: Some(&lan),
                    allocations: &[],
                    records: &records,
                    space,
                    retained: &[],
                    hand_made: std::slice::from_ref(other),
                },
            )
            .map(|_| ())
        };
        let in_dc1 = made(json!({"ipam.kipam.dev/datacenter": "dc-1"}));
        assert!(!served_by(&in_dc1, Some(&vip)));
        refused(
            judge(std::slice::from_ref(&vip), &in_dc1),
            &[
                "spec.address \"10.0.0.121\"",
                "held by hand-made IPAddress machines/web-7 of IPAMPool vip",
            ],
        );
        // Its pool gone altogether (deleted): the same.
        assert!(!served_by(&in_dc1, None));
        refused(judge(&[], &in_dc1), &["hand-made IPAddress machines/web-7"]);
        // Without a datacenter label it holds its address in every datacenter.
        refused(
            judge(std::slice::from_ref(&vip), &made(Value::Null)),
            &["hand-made IPAddress machines/web-7"],
        );
        // Labelled for another datacenter, it holds nothing in dc-1.
        assert_eq!(
            judge(
                std::slice::from_ref(&vip),
                &made(json!({"ipam.kipam.dev/datacenter": "dc-2"}))
            ),
            Ok(())
        );
        // Served by its pool, it is judged as before: held where its pool serves it.
        assert!(served_by(&made(Value::Null), Some(&lan)));
    }

    #[test]
    fn kipam_pool_reads_the_reference_of_any_version() {
        assert_eq!(
            kipam_pool(&address("v1beta1", "x", json!("10.0.0.1"))),
            Some("lan".to_string())
        );
        assert_eq!(kipam_pool(&json!({"spec": {}})), None);
        assert_eq!(kipam_pool(&Value::Null), None);
    }
}
