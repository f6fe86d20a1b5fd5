//! `Cluster` rules.

use std::collections::BTreeMap;

use crate::address::{AddrRange, Cidr};
use crate::planner::{ClusterInput, PoolOverride};
use crate::resources::{Cluster, ClusterPoolOverride};

use super::{Errors, FieldError, names};

/// Checks a cluster and returns the planner's view of it.
pub fn cluster_input(cluster: &Cluster) -> Result<ClusterInput, Vec<FieldError>> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut errors = Errors::new(format!("Cluster {name}"));
    errors.check(names::cluster_name("metadata.name", &name));
    errors.check(names::datacenter_name(
        "spec.datacenter",
        &cluster.spec.datacenter,
    ));
    let mut overrides = BTreeMap::new();
    for (pool, o) in &cluster.spec.ipam {
        errors.check(names::pool_name("spec.ipam", pool));
        if let Some(parsed) = pool_override(pool, o, &mut errors) {
            overrides.insert(pool.clone(), parsed);
        }
        errors.check(super::growth::override_growth(pool, o));
    }
    errors.check_schema("Cluster", &cluster.spec);
    errors.into_result(ClusterInput {
        name,
        created: cluster
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string()),
        datacenter: cluster.spec.datacenter.clone(),
        overrides,
        deleting: cluster.metadata.deletion_timestamp.is_some(),
        paused: cluster.spec.pause,
        invalid: None,
        only_pool: None,
        hold: None,
    })
}

fn pool_override(pool: &str, o: &ClusterPoolOverride, errors: &mut Errors) -> Option<PoolOverride> {
    let path = |f: &str| format!("spec.ipam[{pool}].{f}");
    let set: Vec<&str> = [
        ("allocationRange", o.allocation_range.is_some()),
        ("allocationPrefix", o.allocation_prefix.is_some()),
        ("addresses", !o.addresses.is_empty()),
        ("cidr", o.cidr.is_some()),
        ("optOut", o.opt_out),
    ]
    .into_iter()
    .filter_map(|(n, on)| on.then_some(n))
    .collect();
    if set.len() > 1 {
        errors.add(
            format!("spec.ipam[{pool}]"),
            set.join(", "),
            "set at most one of allocationRange, allocationPrefix, addresses, cidr, optOut",
        );
        return None;
    }
    if o.opt_out {
        return Some(PoolOverride::OptOut);
    }
    if let Some(n) = o.allocation_range {
        if n < 1 {
            errors.add(path("allocationRange"), n, "must be at least 1");
            return None;
        }
        return Some(PoolOverride::Addresses(n as u128));
    }
    if let Some(p) = o.allocation_prefix {
        if !(0..=128).contains(&p) {
            errors.add(path("allocationPrefix"), p, "must be between 0 and 128");
            return None;
        }
        return Some(PoolOverride::Prefix(p as u8));
    }
    if let Some(text) = &o.cidr {
        return match text.parse::<Cidr>() {
            Ok(c) => Some(PoolOverride::PinnedCidr(c)),
            Err(e) => {
                errors.add(path("cidr"), text, format!("is not valid: {e}"));
                None
            }
        };
    }
    if !o.addresses.is_empty() {
        let mut pieces = Vec::new();
        for (i, text) in o.addresses.iter().enumerate() {
            match AddrRange::parse_lenient(text) {
                Ok(r) => pieces.push(r),
                Err(e) => errors.add(
                    format!("{}[{i}]", path("addresses")),
                    text,
                    format!("is not valid: {e}"),
                ),
            }
        }
        if pieces.len() != o.addresses.len() {
            return None;
        }
        // The pieces of one pin are one allocation: one family, no address twice (the
        // planner would refuse them on every run).
        let mut sorted: Vec<(usize, AddrRange)> = pieces.iter().copied().enumerate().collect();
        sorted.sort_by_key(|(_, r)| (r.family(), r.first(), r.last()));
        let mut ok = true;
        if let Some((_, first)) = sorted.first()
            && let Some((i, _)) = sorted.iter().find(|(_, r)| r.family() != first.family())
        {
            errors.add(
                format!("{}[{i}]", path("addresses")),
                &o.addresses[*i],
                format!("mixes address families with {first}: a pin is of one family"),
            );
            ok = false;
        }
        for pair in sorted.windows(2) {
            let ((_, a), (j, b)) = (pair[0], pair[1]);
            if a.overlaps(&b) {
                errors.add(
                    format!("{}[{j}]", path("addresses")),
                    &o.addresses[j],
                    format!("overlaps {a}, another piece of the pin: list each address once"),
                );
                ok = false;
            }
        }
        return ok.then_some(PoolOverride::PinnedAddresses(pieces));
    }
    None
}
