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
    if let Some(space) = &pool.spec.address_space {
        errors.check(names::address_space("spec.addressSpace", space));
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
        address_space: space_of(pool.spec.address_space.as_deref()),
    })
}

/// The name of the default address space: `addressSpace: default` is the space of pools that
/// name none, not a space of its own.
pub const DEFAULT_SPACE: &str = "default";

/// The planner's name of an address space: empty for the default one, however it is written.
fn space_of(written: Option<&str>) -> String {
    match written {
        None | Some(DEFAULT_SPACE) => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Every rule: creation rules, and when `old` is given the update rules (`type`,
/// `allocationPrefix` immutable, `poolCidr` only widened, no held address left outside the
/// pool's CIDRs). Exclusions added (compared as address sets with the old
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
    validate_pool_against_state(new, old, stored, clusters, &RecordedPrefixes::new())
}

/// (cluster, pool) -> the pool datacenter's `allocationPrefix` when the cluster's allocation
/// was last planned, as the state records it (`kipam offline` writes it on every allocation of
/// a prefix pool).
pub type RecordedPrefixes = HashMap<(String, String), i32>;

/// [`validate_pool_with_clusters`] with what the state records of the pool: without `old`, an
/// `allocationPrefix` is compared with the length recorded on the stored allocations, which
/// says what the pool said, whatever pins and overrides gave the clusters. Allocations that
/// record none (a state written before kipam recorded it) fall back to the lengths they hold.
pub fn validate_pool_against_state(
    new: &IPAMPool,
    old: Option<&IPAMPool>,
    stored: &[StoredAllocation],
    clusters: Option<&[ClusterInput]>,
    recorded: &RecordedPrefixes,
) -> Result<PoolInput, Vec<FieldError>> {
    let name = new.metadata.name.clone().unwrap_or_default();
    let input = pool_input(new);
    let mut errors = Errors::new(format!("IPAMPool {name}"));
    immutables(new, old, stored, clusters, recorded, &mut errors);
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

/// The IPv4 network an IPv4-mapped IPv6 network (inside `::ffff:0:0/96`) stands for.
fn ipv4_mapped(c: &Cidr) -> Option<Cidr> {
    const MAPPED: u128 = 0xffff << 32;
    let inside = c.family() == crate::address::Family::V6
        && c.first() >= MAPPED
        && c.last() <= (MAPPED | 0xffff_ffff);
    if !inside {
        return None;
    }
    Cidr::new(
        crate::address::Family::V4,
        c.first() & 0xffff_ffff,
        c.prefix_len().saturating_sub(96),
    )
}

fn mapped_reason(v4: &Cidr) -> String {
    format!(
        "is an IPv4-mapped IPv6 network: its addresses are the IPv4 addresses {v4}, which an \
         IPv4 pool could hand out again; write the IPv4 network {v4} instead"
    )
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
    let additional = additional_cidrs(dc, settings, cidr, errors);
    if let Some(c) = cidr
        && let Some(v4) = ipv4_mapped(&c)
    {
        errors.add(
            field(dc, "poolCidr"),
            &settings.pool_cidr,
            mapped_reason(&v4),
        );
    }
    for (i, c) in additional.iter().flatten().enumerate() {
        if let Some(v4) = ipv4_mapped(c) {
            errors.add(
                format!("{}[{i}]", field(dc, "additionalCidrs")),
                c,
                mapped_reason(&v4),
            );
        }
    }
    // Every CIDR of the pool, when all of them parse.
    let cidrs: Option<Vec<Cidr>> = match (cidr, &additional) {
        (Some(c), Some(more)) => Some(std::iter::once(c).chain(more.iter().copied()).collect()),
        _ => None,
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
                    let size = cidrs.as_ref().map(|cs| {
                        cs.iter()
                            .fold(AddressCount::ZERO, |sum, c| sum.saturating_add(c.size()))
                    });
                    match size {
                        Some(size) if AddressCount::from(n as u64) > size => {
                            let of = if settings.additional_cidrs.is_empty() {
                                "poolCidr"
                            } else {
                                "poolCidr and additionalCidrs"
                            };
                            errors.add(
                                field(dc, "allocationRange"),
                                n,
                                format!("exceeds the {size} addresses of {of}"),
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
                cidrs.as_deref(),
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
                cidrs.as_deref(),
                |t| t.parse::<Cidr>().map(|c| c.range()),
                errors,
            );
            (kind, exclusions)
        }
    };
    let reuse_after = match settings.reuse_after.as_deref().map(parse_reuse_after) {
        None => Some(0),
        Some(Ok(seconds)) => Some(seconds),
        Some(Err(why)) => {
            let value = settings.reuse_after.clone().unwrap_or_default();
            errors.add(field(dc, "reuseAfter"), value, why);
            None
        }
    };
    let cidr = cidr?;
    let config = PoolConfig::new(cidr, kind?, strategy)
        .with_label(format!("{pool}/{dc} ({cidr})"))
        .with_additional(additional?);
    let machine_reserved = match config.kind {
        PoolKind::Range { .. } => machine_reserved(&config, dc, settings),
        PoolKind::Prefix { .. } => Vec::new(),
    };
    Some(DatacenterInput {
        config,
        exclusions: exclusions?,
        reuse_after: reuse_after?,
        machine_reserved,
        former: Vec::new(),
    })
}

/// What no machine's claim is given in a `range` pool datacenter, whatever the exclusions: the
/// network address and (IPv4) the broadcast address of the datacenter's `network`, and its
/// gateway; without a `network`, the network and broadcast addresses of each CIDR of the pool
/// (the network a claim's `IPAddress` then shows). A /31 or /32 (/127, /128 in IPv6) has no
/// such addresses: every address of it is a host.
pub fn machine_reserved(
    config: &PoolConfig,
    dc: &str,
    settings: &IPAMPoolDatacenter,
) -> Vec<(AddrRange, String)> {
    let one = |family, a| AddrRange::new(family, a, a);
    let mut out: Vec<(AddrRange, String)> = Vec::new();
    let edges = |net: Cidr, out: &mut Vec<(AddrRange, String)>| {
        let family = net.family();
        if net.prefix_len() + 1 >= family.bits() {
            return;
        }
        if let Some(r) = one(family, net.first()) {
            out.push((r, format!("the network address of {net}")));
        }
        if family == crate::address::Family::V4
            && let Some(r) = one(family, net.last())
        {
            out.push((r, format!("the broadcast address of {net}")));
        }
    };
    match super::datacenter_network(dc, settings) {
        Ok(Some(network)) => {
            edges(network.cidr, &mut out);
            if let Some((family, at)) = network
                .gateway
                .as_deref()
                .and_then(|g| crate::address::parse_address(g).ok())
                && let Some(r) = one(family, at)
            {
                out.push((r, format!("the gateway of {}", network.cidr)));
            }
        }
        _ => {
            for c in config.cidrs() {
                edges(c, &mut out);
            }
        }
    }
    out.sort_by_key(|(r, _)| r.first());
    out.dedup_by_key(|(r, _)| r.first());
    out
}

/// `reuseAfter` in whole seconds, from 0 to 90 days ([`crate::duration::parse`]: `90s`,
/// `10m`, `1h30m`, `7d`, or any span jiff reads such as `1w` or ISO 8601 `PT10M`).
pub fn parse_reuse_after(text: &str) -> Result<u64, String> {
    crate::duration::parse(text, crate::resources::bounds::REUSE_AFTER)
}

/// Parses exclusions and checks family and containment.
fn exclusions(
    dc: &str,
    name: &str,
    texts: &[String],
    cidrs: Option<&[Cidr]>,
    parse: impl Fn(&str) -> Result<AddrRange, AddressError>,
    errors: &mut Errors,
) -> Option<Vec<AddrRange>> {
    let cidr = cidrs.and_then(|cs| cs.first().copied());
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
                Some(c) if !cidrs.is_some_and(|cs| covered(cs, &range)) => {
                    let reason = match cidrs {
                        Some([_, more @ ..]) if !more.is_empty() => {
                            format!("is not inside poolCidr {c} or one of additionalCidrs")
                        }
                        _ => format!("is not inside poolCidr {c}"),
                    };
                    errors.add(path, text, reason);
                    ok = false;
                }
                _ => out.push(range),
            },
        }
    }
    ok.then_some(out)
}

/// The fields of each datacenter that may not change (`type`, `allocationPrefix`) or only
/// grow (`poolCidr`, widened; `additionalCidrs`, whose CIDRs may go only while they hold
/// nothing), compared with the previous pool when there is one, else with what the stored
/// allocations of that pool and datacenter show. One message per field, naming the clusters whose allocations are
/// affected.
fn immutables(
    new: &IPAMPool,
    old: Option<&IPAMPool>,
    stored: &[StoredAllocation],
    clusters: Option<&[ClusterInput]>,
    recorded: &RecordedPrefixes,
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

        // poolCidr and additionalCidrs: every holding must stay inside the pool's CIDRs.
        let new_cidrs: Option<Vec<Cidr>> = new_cidr.and_then(|c| {
            let more: Result<Vec<Cidr>, _> = now
                .additional_cidrs
                .iter()
                .map(|t| t.parse::<Cidr>())
                .collect();
            more.ok()
                .map(|more| std::iter::once(c).chain(more).collect::<Vec<Cidr>>())
        });
        let outside: Vec<(&str, &Allocation)> = held
            .iter()
            .copied()
            .filter(|(_, h)| {
                new_cidrs
                    .as_ref()
                    .is_none_or(|cs| h.ranges().any(|r| !covered(cs, &r)))
            })
            .collect();
        match before {
            Some(b) => {
                let old_cidr = b.pool_cidr.parse::<Cidr>();
                let same = match (new_cidr, &old_cidr) {
                    (Some(a), Ok(b)) => a == *b,
                    _ => now.pool_cidr == b.pool_cidr,
                };
                // Widening: a network that contains the old one.
                let widened = match (new_cidr, &old_cidr) {
                    (Some(a), Ok(b)) => a.contains(&b.range()),
                    _ => false,
                };
                // Holdings this edit would strand: inside the pool before, outside it after (one
                // already outside, such as a conflict kept as stored, blocks no other edit).
                let old_cidrs: Option<Vec<Cidr>> = old_cidr.as_ref().ok().and_then(|c| {
                    let more: Result<Vec<Cidr>, _> = b
                        .additional_cidrs
                        .iter()
                        .map(|t| t.parse::<Cidr>())
                        .collect();
                    more.ok()
                        .map(|more| std::iter::once(*c).chain(more).collect::<Vec<Cidr>>())
                });
                let newly_outside: Vec<(&str, &Allocation)> = outside
                    .iter()
                    .copied()
                    .filter(|(_, h)| {
                        old_cidrs
                            .as_ref()
                            .is_none_or(|cs| h.ranges().all(|r| covered(cs, &r)))
                    })
                    .collect();
                if !same && !widened {
                    widen_only(errors, dc, &now.pool_cidr, &b.pool_cidr, &outside);
                } else if !newly_outside.is_empty() && new_cidrs.is_some() {
                    stranded(errors, dc, now, &newly_outside);
                }
            }
            // An unparsable poolCidr is reported by the creation rules already.
            None if new_cidrs.is_some() && !outside.is_empty() => {
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
                // What the pool said when each allocation was last planned, where the state
                // records it: exact, whatever pins and overrides (now gone) gave the clusters.
                let said = |c: &str| recorded.get(&(c.to_string(), pool.to_string())).copied();
                let recorded_held: Vec<(&str, &Allocation)> = held
                    .iter()
                    .copied()
                    .filter(|(c, _)| said(c).is_some())
                    .collect();
                // Otherwise, allocations that took the pool's length: clusters still listed,
                // without an override of their own length or subnet for this pool.
                let by_name: HashMap<&str, &ClusterInput> =
                    clusters.iter().map(|c| (c.name.as_str(), c)).collect();
                let plain: Vec<(&str, &Allocation)> = if recorded_held.is_empty() {
                    held.iter()
                        .copied()
                        .filter(|(c, _)| {
                            by_name.get(c).is_some_and(|ci| {
                                !matches!(
                                    ci.overrides.get(pool),
                                    Some(PoolOverride::Prefix(_) | PoolOverride::PinnedCidr(_))
                                )
                            })
                        })
                        .collect()
                } else {
                    recorded_held
                };
                let lengths: Vec<i32> = plain
                    .iter()
                    .filter_map(|(c, h)| match h {
                        _ if said(c).is_some() => said(c),
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

/// Parses `additionalCidrs`: each a CIDR of `poolCidr`'s family, overlapping neither
/// `poolCidr` nor an earlier entry, and (prefix pools) large enough for one allocation
/// subnet. `None` when one is refused.
fn additional_cidrs(
    dc: &str,
    settings: &IPAMPoolDatacenter,
    pool: Option<Cidr>,
    errors: &mut Errors,
) -> Option<Vec<Cidr>> {
    let mut out: Vec<Cidr> = Vec::new();
    let mut ok = true;
    for (i, text) in settings.additional_cidrs.iter().enumerate() {
        let path = format!("{}[{i}]", field(dc, "additionalCidrs"));
        let parsed = match text.parse::<Cidr>() {
            Ok(c) => c,
            Err(e) => {
                let reason = match e {
                    AddressError::HostBitsSet { network, .. } => {
                        format!("host bits are set; the network is {network}")
                    }
                    AddressError::InvalidCidr { reason, .. } => reason,
                    other => other.to_string(),
                };
                errors.add(path, text, format!("is not a valid CIDR: {reason}"));
                ok = false;
                continue;
            }
        };
        let Some(pool) = pool else {
            out.push(parsed);
            continue;
        };
        let earlier = std::iter::once((String::from("poolCidr"), pool)).chain(
            out.iter()
                .enumerate()
                .map(|(j, c)| (format!("additionalCidrs[{j}]"), *c)),
        );
        let clash = earlier
            .filter(|(_, c)| c.family() == parsed.family())
            .find(|(_, c)| c.range().overlaps(&parsed.range()));
        if parsed.family() != pool.family() {
            let reason = format!("is {}, poolCidr is {}", parsed.family(), pool.family());
            errors.add(path, text, reason);
            ok = false;
        } else if let Some((name, c)) = clash {
            errors.add(path, text, format!("overlaps {name} {c}"));
            ok = false;
        } else if let (AllocationType::Prefix, Some(p)) =
            (settings.type_, settings.allocation_prefix)
            && i32::from(parsed.prefix_len()) > p
        {
            let reason = format!("is smaller than one /{p} subnet (allocationPrefix)");
            errors.add(path, text, reason);
            ok = false;
        }
        out.push(parsed);
    }
    ok.then_some(out)
}

/// True when every address of `range` lies in one of `cidrs` (adjacent CIDRs together cover a
/// range across their edge).
fn covered(cidrs: &[Cidr], range: &AddrRange) -> bool {
    let mut sorted: Vec<&Cidr> = cidrs
        .iter()
        .filter(|c| c.family() == range.family())
        .collect();
    sorted.sort_by_key(|c| c.first());
    let mut next = range.first();
    for c in sorted {
        if c.last() < next || c.first() > next {
            continue;
        }
        if c.last() >= range.last() {
            return true;
        }
        next = c.last() + 1;
    }
    false
}

/// The allocations `affected` listed for a message: at most ten, then a count.
fn holdings(affected: &[(&str, &Allocation)]) -> String {
    const SHOWN: usize = 10;
    let mut unique: Vec<String> = affected.iter().map(|(c, h)| format!("{c} ({h})")).collect();
    unique.dedup();
    let mut list: String = unique
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if unique.len() > SHOWN {
        list.push_str(&format!(" and {} more", unique.len() - SHOWN));
    }
    list
}

/// `poolCidr` changed to a network that does not contain the old one.
fn widen_only(
    errors: &mut Errors,
    dc: &str,
    now: &str,
    was: &str,
    affected: &[(&str, &Allocation)],
) {
    let mut reason =
        format!("may only be widened to a network that contains the old one (was {was})");
    if !affected.is_empty() {
        reason.push_str("; allocations affected: ");
        reason.push_str(&holdings(affected));
    }
    errors.add(field(dc, "poolCidr"), now, reason);
}

/// An edit of `additionalCidrs` that leaves held addresses outside every CIDR of the pool
/// (a CIDR removed, or replaced, while it holds something).
fn stranded(
    errors: &mut Errors,
    dc: &str,
    now: &IPAMPoolDatacenter,
    affected: &[(&str, &Allocation)],
) {
    let value = format!("[{}]", now.additional_cidrs.join(", "));
    let reason = format!(
        "leaves allocations outside every CIDR of the pool (a CIDR that holds something may \
         not be removed); allocations affected: {}",
        holdings(affected)
    );
    errors.add(field(dc, "additionalCidrs"), value, reason);
}
