//! `IPAMPool` rules, for creation and update.

use std::collections::{BTreeMap, HashMap};

use crate::address::{AddrRange, AddressCount, AddressError, Cidr};
use crate::allocator::{Allocation, PoolConfig, PoolKind, Strategy};
use crate::planner::{ClusterInput, DatacenterInput, PoolInput, PoolOverride, StoredAllocation};
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
    for (dc, settings) in &pool.spec.datacenters {
        if let Err(list) = super::datacenter_network(dc, settings) {
            list.into_iter().for_each(|e| errors.check(Err(e)));
        }
    }
    for (dc, settings) in &pool.spec.datacenters {
        if let Err(list) = super::datacenter_growth(dc, settings) {
            list.into_iter().for_each(|e| errors.check(Err(e)));
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
/// ones) must not hit an allocation in `stored`.
///
/// The immutable fields are also checked against `stored` itself, so a changed pool is
/// caught even without `old` (the offline mode, which keeps no copy of the previous pools):
/// see [`validate_pool_with_clusters`].
pub fn validate_pool(
    new: &IPAMPool,
    old: Option<&IPAMPool>,
    stored: &[StoredAllocation],
) -> Result<PoolInput, Vec<FieldError>> {
    validate_pool_with_clusters(new, old, stored, None)
}

/// [`validate_pool`] with the clusters known. Stored allocations of the pool must still fit it:
/// of the pool's `type`, inside its `poolCidr`, and — when `clusters` is given, so that a
/// cluster's own `allocationPrefix` or `cidr` override can be told apart — of its
/// `allocationPrefix` when every such allocation agrees on another length. A mismatch is
/// reported like an immutable field changed under `old`, naming the clusters affected.
pub fn validate_pool_with_clusters(
    new: &IPAMPool,
    old: Option<&IPAMPool>,
    stored: &[StoredAllocation],
    clusters: Option<&[ClusterInput]>,
) -> Result<PoolInput, Vec<FieldError>> {
    let name = new.metadata.name.clone().unwrap_or_default();
    let input = pool_input(new);
    let mut errors = Errors::new(format!("IPAMPool {name}"));
    immutables(new, old, stored, clusters, &mut errors);
    if let Ok(input) = &input {
        added_exclusions(new, input, old, stored, &mut errors);
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

/// The immutable fields of each datacenter (`type`, `poolCidr`, `allocationPrefix`), compared
/// with the previous pool when there is one, else with what the stored allocations of that
/// pool and datacenter show. One message per field, naming the clusters whose allocations are
/// affected.
fn immutables(
    new: &IPAMPool,
    old: Option<&IPAMPool>,
    stored: &[StoredAllocation],
    clusters: Option<&[ClusterInput]>,
    errors: &mut Errors,
) {
    let pool = new.metadata.name.as_deref().unwrap_or_default();
    for (dc, now) in &new.spec.datacenters {
        let before = old.and_then(|o| o.spec.datacenters.get(dc));
        // What this pool datacenter holds now.
        let held: Vec<(&str, &Allocation)> = stored
            .iter()
            .filter(|s| s.pool == pool && &s.datacenter == dc)
            .filter_map(|s| s.held.as_ref().map(|h| (s.cluster.as_str(), h)))
            .collect();
        let new_cidr = now.pool_cidr.parse::<Cidr>().ok();

        // type
        let wrong_type: Vec<(&str, &Allocation)> = held
            .iter()
            .copied()
            .filter(|(_, h)| allocation_type(h) != now.type_)
            .collect();
        let was_type = match before {
            Some(b) if b.type_ != now.type_ => Some((b.type_, held.clone())),
            Some(_) => None,
            None => wrong_type
                .first()
                .map(|(_, h)| (allocation_type(h), wrong_type.clone())),
        };
        if let Some((was, affected)) = &was_type {
            immutable(
                errors,
                dc,
                "type",
                now.type_.as_str(),
                Some(was.as_str()),
                affected,
            );
        }

        // poolCidr
        let outside: Vec<(&str, &Allocation)> = held
            .iter()
            .copied()
            .filter(|(_, h)| new_cidr.is_none_or(|c| h.ranges().any(|r| !c.contains(&r))))
            .collect();
        match before {
            Some(b) => {
                let same = match (new_cidr, b.pool_cidr.parse::<Cidr>()) {
                    (Some(a), Ok(b)) => a == b,
                    _ => now.pool_cidr == b.pool_cidr,
                };
                if !same {
                    immutable(
                        errors,
                        dc,
                        "poolCidr",
                        &now.pool_cidr,
                        Some(&b.pool_cidr),
                        &outside,
                    );
                }
            }
            // An unparsable poolCidr is reported by the creation rules already.
            None if new_cidr.is_some() && !outside.is_empty() => {
                immutable(errors, dc, "poolCidr", &now.pool_cidr, None, &outside);
            }
            None => {}
        }

        // allocationPrefix (prefix pools whose type did not change)
        if was_type.is_some() || now.type_ != AllocationType::Prefix {
            continue;
        }
        let show = |p: Option<i32>| p.map(|p| p.to_string()).unwrap_or_else(|| "unset".into());
        match (before, clusters) {
            (Some(b), _) => {
                if now.allocation_prefix != b.allocation_prefix {
                    immutable(
                        errors,
                        dc,
                        "allocationPrefix",
                        &show(now.allocation_prefix),
                        Some(&show(b.allocation_prefix)),
                        &held,
                    );
                }
            }
            (None, Some(clusters)) => {
                // Allocations that took the pool's length: clusters still listed, without an
                // override of their own length or subnet for this pool.
                let by_name: HashMap<&str, &ClusterInput> =
                    clusters.iter().map(|c| (c.name.as_str(), c)).collect();
                let plain: Vec<(&str, &Allocation)> = held
                    .iter()
                    .copied()
                    .filter(|(c, _)| {
                        by_name.get(c).is_some_and(|ci| {
                            !matches!(
                                ci.overrides.get(pool),
                                Some(PoolOverride::Prefix(_) | PoolOverride::PinnedCidr(_))
                            )
                        })
                    })
                    .collect();
                let lengths: Vec<i32> = plain
                    .iter()
                    .filter_map(|(_, h)| match h {
                        Allocation::Prefix(c) => Some(i32::from(c.prefix_len())),
                        Allocation::Range(_) => None,
                    })
                    .collect();
                if let Some(&was) = lengths.first()
                    && lengths.iter().all(|l| *l == was)
                    && Some(was) != now.allocation_prefix
                {
                    immutable(
                        errors,
                        dc,
                        "allocationPrefix",
                        &show(now.allocation_prefix),
                        Some(&was.to_string()),
                        &plain,
                    );
                }
            }
            (None, None) => {}
        }
    }
}

fn allocation_type(held: &Allocation) -> AllocationType {
    match held {
        Allocation::Range(_) => AllocationType::Range,
        Allocation::Prefix(_) => AllocationType::Prefix,
    }
}

/// One immutable field that changed. `was` is the previous value when known; `affected` the
/// allocations the change would strand.
fn immutable(
    errors: &mut Errors,
    dc: &str,
    name: &str,
    now: &str,
    was: Option<&str>,
    affected: &[(&str, &Allocation)],
) {
    let mut reason = match was {
        Some(was) => format!("is immutable (was {was})"),
        None => "is immutable: stored allocations lie outside it (made from an earlier \
                 poolCidr)"
            .to_string(),
    };
    // The same holding may come twice (an object and its pool record entry): list it once.
    let mut unique: Vec<String> = affected.iter().map(|(c, h)| format!("{c} ({h})")).collect();
    unique.dedup();
    let affected = unique;
    if !affected.is_empty() {
        const SHOWN: usize = 10;
        let list: Vec<String> = affected.iter().take(SHOWN).cloned().collect();
        reason.push_str("; allocations affected: ");
        reason.push_str(&list.join(", "));
        if affected.len() > SHOWN {
            reason.push_str(&format!(" and {} more", affected.len() - SHOWN));
        }
    }
    errors.add(field(dc, name), now, reason);
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
