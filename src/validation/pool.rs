//! `IPAMPool` rules, for creation and update.

use std::collections::BTreeMap;

use crate::address::{AddrRange, AddressCount, AddressError, Cidr};
use crate::allocator::{PoolConfig, PoolKind, Strategy};
use crate::planner::{DatacenterInput, PoolInput, StoredAllocation};
use crate::resources::{AllocationType, IPAMPool, IPAMPoolDatacenter, PoolStrategy};

use super::{Errors, FieldError, names};

/// Checks a pool on its own (the creation rules) and returns the planner's view of it.
pub fn pool_input(pool: &IPAMPool) -> Result<PoolInput, Vec<FieldError>> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    let mut errors = Errors::new(format!("IPAMPool {name}"));
    errors.check(names::pool_name("metadata.name", &name));
    if pool.spec.datacenters.is_empty() {
        errors.add("spec.datacenters", "", "must list at least one datacenter");
    }
    for dc in pool.spec.datacenters.keys() {
        errors.check(names::datacenter_name("spec.datacenters", dc));
    }
    let mut datacenters = BTreeMap::new();
    for (dc, settings) in &pool.spec.datacenters {
        if let Some(input) = datacenter_input(&name, dc, settings, &mut errors) {
            datacenters.insert(dc.clone(), input);
        }
    }
    errors.check_schema("IPAMPool", &pool.spec);
    errors.into_result(PoolInput {
        name,
        reclaim_policy: pool.spec.reclaim_policy,
        datacenters,
    })
}

/// Every rule: creation rules, and when `old` is given the update rules (`poolCidr`, `type`,
/// `allocationPrefix` immutable). Exclusions added (compared as address sets with the old
/// ones) must not hit an allocation in `stored`, and every allocation in `stored` must stay
/// inside its datacenter's `poolCidr` and keep its type (this also covers a pool created again
/// over allocations it retained).
pub fn validate_pool(
    new: &IPAMPool,
    old: Option<&IPAMPool>,
    stored: &[StoredAllocation],
) -> Result<PoolInput, Vec<FieldError>> {
    let name = new.metadata.name.clone().unwrap_or_default();
    let input = pool_input(new);
    let mut errors = Errors::new(format!("IPAMPool {name}"));
    if let Some(old) = old {
        immutables(new, old, &mut errors);
    }
    if let Ok(input) = &input {
        added_exclusions(new, input, old, stored, &mut errors);
        live_allocations(input, stored, &mut errors);
    }
    match input {
        Ok(input) => errors.into_result(input),
        Err(mut list) => {
            list.extend(errors.into_vec());
            Err(list)
        }
    }
}

fn field(dc: &str, name: &str) -> String {
    format!("spec.datacenters[{dc}].{name}")
}

fn datacenter_input(
    pool: &str,
    dc: &str,
    settings: &IPAMPoolDatacenter,
    errors: &mut Errors,
) -> Option<DatacenterInput> {
    let cidr = match settings.pool_cidr.parse::<Cidr>() {
        Ok(c) => Some(c),
        Err(e) => {
            let reason = match e {
                AddressError::HostBitsSet { network, .. } => {
                    format!("host bits are set; the network is {network}")
                }
                AddressError::InvalidCidr { reason, .. } => reason,
                other => other.to_string(),
            };
            let value = if settings.pool_cidr.is_empty() {
                String::new()
            } else {
                settings.pool_cidr.clone()
            };
            let reason = if value.is_empty() {
                "is required".to_string()
            } else {
                format!("is not a valid CIDR: {reason}")
            };
            errors.add(field(dc, "poolCidr"), value, reason);
            None
        }
    };
    let strategy = match settings.strategy.unwrap_or_default() {
        PoolStrategy::FirstFit => Strategy::FirstFit,
        PoolStrategy::BestFit => Strategy::BestFit,
    };
    let (kind, exclusions) = match settings.type_ {
        AllocationType::Range => {
            if let Some(p) = settings.allocation_prefix {
                errors.add(field(dc, "allocationPrefix"), p, "is only for type prefix");
            }
            for (i, e) in settings.exclude_prefixes.iter().enumerate() {
                errors.add(
                    format!("{}[{i}]", field(dc, "excludePrefixes")),
                    e,
                    "is only for type prefix; range pools use excludeRanges",
                );
            }
            let kind = match settings.allocation_range {
                None => {
                    errors.add(
                        field(dc, "allocationRange"),
                        "",
                        "is required for type range",
                    );
                    None
                }
                Some(n) if n < 1 => {
                    errors.add(field(dc, "allocationRange"), n, "must be at least 1");
                    None
                }
                Some(n) => {
                    let size = cidr.map(|c| c.size());
                    match size {
                        Some(size) if AddressCount::from(n as u64) > size => {
                            errors.add(
                                field(dc, "allocationRange"),
                                n,
                                format!("exceeds the {size} addresses of poolCidr"),
                            );
                            None
                        }
                        _ => Some(PoolKind::Range {
                            allocation_range: n as u128,
                        }),
                    }
                }
            };
            let exclusions = exclusions(
                dc,
                "excludeRanges",
                &settings.exclude_ranges,
                cidr,
                AddrRange::parse_lenient,
                errors,
            );
            (kind, exclusions)
        }
        AllocationType::Prefix => {
            if let Some(n) = settings.allocation_range {
                errors.add(field(dc, "allocationRange"), n, "is only for type range");
            }
            for (i, e) in settings.exclude_ranges.iter().enumerate() {
                errors.add(
                    format!("{}[{i}]", field(dc, "excludeRanges")),
                    e,
                    "is only for type range; prefix pools use excludePrefixes",
                );
            }
            let kind = match (settings.allocation_prefix, cidr) {
                (None, _) => {
                    errors.add(
                        field(dc, "allocationPrefix"),
                        "",
                        "is required for type prefix",
                    );
                    None
                }
                (Some(p), Some(c)) if p < c.prefix_len() as i32 || p > c.family().bits() as i32 => {
                    errors.add(
                        field(dc, "allocationPrefix"),
                        p,
                        format!(
                            "must be between the pool's prefix length {} and {} ({})",
                            c.prefix_len(),
                            c.family().bits(),
                            c.family()
                        ),
                    );
                    None
                }
                (Some(p), Some(_)) => Some(PoolKind::Prefix {
                    allocation_prefix: p as u8,
                }),
                (Some(_), None) => None,
            };
            let exclusions = exclusions(
                dc,
                "excludePrefixes",
                &settings.exclude_prefixes,
                cidr,
                |t| t.parse::<Cidr>().map(|c| c.range()),
                errors,
            );
            (kind, exclusions)
        }
    };
    let cidr = cidr?;
    let config = PoolConfig::new(cidr, kind?, strategy).with_label(format!("{pool}/{dc} ({cidr})"));
    Some(DatacenterInput {
        config,
        exclusions: exclusions?,
    })
}

/// Parses exclusions and checks family and containment.
fn exclusions(
    dc: &str,
    name: &str,
    texts: &[String],
    cidr: Option<Cidr>,
    parse: impl Fn(&str) -> Result<AddrRange, AddressError>,
    errors: &mut Errors,
) -> Option<Vec<AddrRange>> {
    let mut out = Vec::new();
    let mut ok = true;
    for (i, text) in texts.iter().enumerate() {
        let path = format!("{}[{i}]", field(dc, name));
        match parse(text) {
            Err(e) => {
                errors.add(path, text, format!("is not valid: {e}"));
                ok = false;
            }
            Ok(range) => match cidr {
                Some(c) if range.family() != c.family() => {
                    errors.add(
                        path,
                        text,
                        format!("is {}, the pool is {}", range.family(), c.family()),
                    );
                    ok = false;
                }
                Some(c) if !c.contains(&range) => {
                    errors.add(path, text, format!("is not inside poolCidr {c}"));
                    ok = false;
                }
                _ => out.push(range),
            },
        }
    }
    ok.then_some(out)
}

fn immutables(new: &IPAMPool, old: &IPAMPool, errors: &mut Errors) {
    for (dc, now) in &new.spec.datacenters {
        let Some(before) = old.spec.datacenters.get(dc) else {
            continue; // adding a datacenter is allowed
        };
        let same_cidr = match (
            now.pool_cidr.parse::<Cidr>(),
            before.pool_cidr.parse::<Cidr>(),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => now.pool_cidr == before.pool_cidr,
        };
        if !same_cidr {
            errors.add(
                field(dc, "poolCidr"),
                &now.pool_cidr,
                format!("is immutable (was {})", before.pool_cidr),
            );
        }
        if now.type_ != before.type_ {
            errors.add(
                field(dc, "type"),
                now.type_.as_str(),
                format!("is immutable (was {})", before.type_.as_str()),
            );
        }
        if now.type_ == before.type_ && now.allocation_prefix != before.allocation_prefix {
            let show = |p: Option<i32>| p.map(|p| p.to_string()).unwrap_or_else(|| "unset".into());
            errors.add(
                field(dc, "allocationPrefix"),
                show(now.allocation_prefix),
                format!("is immutable (was {})", show(before.allocation_prefix)),
            );
        }
    }
}

/// Exclusions that were not there before must not hit a stored allocation of the pool.
fn added_exclusions(
    pool: &IPAMPool,
    input: &PoolInput,
    old: Option<&IPAMPool>,
    stored: &[StoredAllocation],
    errors: &mut Errors,
) {
    let old_input = old.and_then(|o| pool_input(o).ok());
    for (dc, now) in &input.datacenters {
        let before: Vec<AddrRange> = old_input
            .as_ref()
            .and_then(|o| o.datacenters.get(dc))
            .map(|d| d.exclusions.clone())
            .unwrap_or_default();
        let Some(settings) = pool.spec.datacenters.get(dc) else {
            continue;
        };
        let (list, texts) = match now.config.kind {
            PoolKind::Range { .. } => ("excludeRanges", &settings.exclude_ranges),
            PoolKind::Prefix { .. } => ("excludePrefixes", &settings.exclude_prefixes),
        };
        for (i, exclusion) in now.exclusions.iter().enumerate() {
            for (first, last) in subtract(*exclusion, &before) {
                let hit = stored.iter().find_map(|s| {
                    if s.pool != input.name || &s.datacenter != dc {
                        return None;
                    }
                    let held = s.held.as_ref()?;
                    held.ranges()
                        .any(|r| r.first() <= last && first <= r.last())
                        .then(|| (s.cluster.clone(), held.to_string()))
                });
                if let Some((cluster, held)) = hit {
                    let written = texts
                        .get(i)
                        .cloned()
                        .unwrap_or_else(|| exclusion.to_string());
                    errors.add(
                        format!("{}[{i}]", field(dc, list)),
                        written,
                        format!("hits the allocation of cluster {cluster} ({held})"),
                    );
                    break;
                }
            }
        }
    }
}

/// Every stored allocation of a datacenter of the pool stays inside `poolCidr` and keeps its
/// type: a pool edit never leaves a live allocation outside the pool.
fn live_allocations(input: &PoolInput, stored: &[StoredAllocation], errors: &mut Errors) {
    for (dc, now) in &input.datacenters {
        let cidr = now.config.cidr;
        let want = match now.config.kind {
            PoolKind::Range { .. } => "range",
            PoolKind::Prefix { .. } => "prefix",
        };
        let mut outside = None;
        let mut other_type = None;
        for s in stored
            .iter()
            .filter(|s| s.pool == input.name && &s.datacenter == dc)
        {
            let Some(held) = &s.held else { continue };
            if outside.is_none() && held.ranges().any(|r| !cidr.contains(&r)) {
                outside = Some((s.cluster.clone(), held.to_string()));
            }
            if other_type.is_none() && held.type_name() != want {
                other_type = Some((s.cluster.clone(), held.to_string(), held.type_name()));
            }
        }
        if let Some((cluster, held)) = outside {
            errors.add(
                field(dc, "poolCidr"),
                cidr,
                format!(
                    "does not hold the allocation of cluster {cluster} (IPAMAllocation {}/{}: {held})",
                    crate::resources::cluster_namespace(&cluster),
                    input.name
                ),
            );
        }
        if let Some((cluster, held, was)) = other_type {
            errors.add(
                field(dc, "type"),
                want,
                format!(
                    "the allocation of cluster {cluster} (IPAMAllocation {}/{}: {held}) is of type {was}",
                    crate::resources::cluster_namespace(&cluster),
                    input.name
                ),
            );
        }
    }
}

/// The parts of `range` not covered by `covered`.
fn subtract(range: AddrRange, covered: &[AddrRange]) -> Vec<(u128, u128)> {
    let mut parts = vec![(range.first(), range.last())];
    for c in covered.iter().filter(|c| c.family() == range.family()) {
        let mut next = Vec::new();
        for (f, l) in parts {
            if c.last() < f || c.first() > l {
                next.push((f, l));
                continue;
            }
            if c.first() > f {
                next.push((f, c.first() - 1));
            }
            if c.last() < l {
                next.push((c.last() + 1, l));
            }
        }
        parts = next;
    }
    parts
}
