//! The `growth` of a range pool datacenter and a cluster's `growth` override.
//!
//! - `growth` is for `range` pools only;
//! - `increment` is at least 1 and at most `max`;
//! - `max` is at least `allocationRange` and at most the pool size;
//! - `shrinkAfter` is a duration (`10m`, `1h30m`, `2d`) between 1m and 30d;
//! - a cluster's `growth` goes with `allocationRange` or nothing, never with `addresses`,
//!   `cidr` or `optOut`, and its `max` is at least 1.
//!
//! A cluster's `max` below its initial size keeps the initial size (nothing is released for
//! it); the pool's free space, not this check, bounds a cluster's `max` above the pool size.

use std::collections::BTreeMap;

use crate::address::{AddressCount, Cidr};
use crate::planner::growth::{DEFAULT_SHRINK_AFTER, GrowthOverride, GrowthPolicy};
use crate::resources::{AllocationType, Cluster, ClusterPoolOverride, IPAMPoolDatacenter};

use super::FieldError;

/// Checks the `growth` of pool datacenter `dc`: `Ok(None)` when it has none. The errors name
/// no object: the caller's [`super::Errors`] adds it.
pub fn datacenter_growth(
    dc: &str,
    settings: &IPAMPoolDatacenter,
) -> Result<Option<GrowthPolicy>, Vec<FieldError>> {
    let Some(growth) = &settings.growth else {
        return Ok(None);
    };
    let mut errors = Vec::new();
    let mut add = |name: &str, value: String, reason: String| {
        errors.push(FieldError {
            object: String::new(),
            field: format!("spec.datacenters[{dc}].growth{name}"),
            value,
            reason,
        });
    };
    if settings.type_ != AllocationType::Range {
        add(
            "",
            String::new(),
            "is only for type range: a prefix allocation is one subnet and cannot grow by pieces"
                .into(),
        );
        return Err(errors);
    }
    let increment = growth.increment.unwrap_or(1);
    if increment < 1 {
        add(
            ".increment",
            increment.to_string(),
            "must be at least 1".into(),
        );
    } else if increment > growth.max {
        add(
            ".increment",
            increment.to_string(),
            format!("must be at most max ({})", growth.max),
        );
    }
    if let Some(initial) = settings.allocation_range
        && growth.max < initial
    {
        add(
            ".max",
            growth.max.to_string(),
            format!("must be at least allocationRange ({initial})"),
        );
    } else if growth.max < 1 {
        add(".max", growth.max.to_string(), "must be at least 1".into());
    }
    // The pool's size over all its CIDRs (`poolCidr` and `additionalCidrs`); a CIDR that does
    // not parse is reported by the pool's own rules.
    let cidrs: Vec<Cidr> = std::iter::once(&settings.pool_cidr)
        .chain(settings.additional_cidrs.iter())
        .filter_map(|t| t.parse::<Cidr>().ok())
        .collect();
    let size = cidrs
        .iter()
        .fold(AddressCount::ZERO, |n, c| n.saturating_add(c.size()));
    if !cidrs.is_empty() && growth.max >= 1 && AddressCount::from(growth.max as u64) > size {
        let of = if cidrs.len() > 1 {
            "the pool's CIDRs"
        } else {
            "poolCidr"
        };
        add(
            ".max",
            growth.max.to_string(),
            format!("exceeds the {size} addresses of {of}"),
        );
    }
    let shrink_after = match &growth.shrink_after {
        None => Some(DEFAULT_SHRINK_AFTER),
        Some(text) => match crate::duration::parse(text, crate::resources::bounds::SHRINK_AFTER) {
            Ok(s) => Some(s),
            Err(why) => {
                add(".shrinkAfter", text.clone(), why);
                None
            }
        },
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(shrink_after.map(|shrink_after| GrowthPolicy {
        increment: increment as u128,
        max: growth.max as u128,
        shrink_after,
    }))
}

/// Checks a cluster's `growth` override for `pool`.
pub(super) fn override_growth(pool: &str, o: &ClusterPoolOverride) -> Result<(), FieldError> {
    let Some(growth) = &o.growth else {
        return Ok(());
    };
    let error = |field: &str, value: String, reason: &str| FieldError {
        object: String::new(),
        field: format!("spec.ipam[{pool}].growth{field}"),
        value,
        reason: reason.into(),
    };
    let with: Vec<&str> = [
        ("addresses", !o.addresses.is_empty()),
        ("cidr", o.cidr.is_some()),
        ("optOut", o.opt_out),
        ("allocationPrefix", o.allocation_prefix.is_some()),
    ]
    .into_iter()
    .filter_map(|(n, on)| on.then_some(n))
    .collect();
    if !with.is_empty() {
        return Err(error(
            "",
            with.join(", "),
            "cannot go with addresses, cidr, optOut or allocationPrefix: only a range allocation kipam sizes can grow",
        ));
    }
    if let Some(max) = growth.max
        && max < 1
    {
        return Err(error(".max", max.to_string(), "must be at least 1"));
    }
    Ok(())
}

/// Pool name -> the cluster's `growth` override, for the pools it names one for (the cluster
/// already checked by [`super::cluster_input`]).
pub fn cluster_growth(cluster: &Cluster) -> BTreeMap<String, GrowthOverride> {
    cluster
        .spec
        .ipam
        .iter()
        .filter_map(|(pool, o)| {
            let g = o.growth.as_ref()?;
            Some((
                pool.clone(),
                GrowthOverride {
                    disabled: g.enabled == Some(false),
                    max: g.max.filter(|m| *m >= 1).map(|m| m as u128),
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::PoolGrowth;

    fn dc(growth: PoolGrowth) -> IPAMPoolDatacenter {
        IPAMPoolDatacenter {
            pool_cidr: "192.168.1.0/26".into(),
            allocation_range: Some(2),
            growth: Some(growth),
            ..Default::default()
        }
    }

    fn fields(r: Result<Option<GrowthPolicy>, Vec<FieldError>>) -> Vec<(String, String)> {
        r.unwrap_err()
            .into_iter()
            .map(|e| (e.field, e.reason))
            .collect()
    }

    #[test]
    fn good_growth_reads_with_defaults() {
        let g = datacenter_growth(
            "dc",
            &dc(PoolGrowth {
                max: 32,
                ..Default::default()
            }),
        );
        assert_eq!(
            g,
            Ok(Some(GrowthPolicy {
                increment: 1,
                max: 32,
                shrink_after: 600
            }))
        );
    }

    #[test]
    fn bad_growth_names_field_and_value() {
        let f = fields(datacenter_growth(
            "dc",
            &dc(PoolGrowth {
                increment: Some(0),
                max: 1,
                shrink_after: Some("10s".into()),
            }),
        ));
        assert!(f.contains(&(
            "spec.datacenters[dc].growth.increment".into(),
            "must be at least 1".into()
        )));
        assert!(f.contains(&(
            "spec.datacenters[dc].growth.max".into(),
            "must be at least allocationRange (2)".into()
        )));
        assert!(f.contains(&(
            "spec.datacenters[dc].growth.shrinkAfter".into(),
            "is too small: it must be between 1m and 30d".into()
        )));
        let f = fields(datacenter_growth(
            "dc",
            &dc(PoolGrowth {
                max: 65,
                shrink_after: Some("1x".into()),
                ..Default::default()
            }),
        ));
        assert!(
            f.iter()
                .any(|(k, r)| k.ends_with("growth.max") && r.contains("64"))
        );
        assert!(f.iter().any(|(k, _)| k.ends_with("growth.shrinkAfter")));
        let mut prefix = dc(PoolGrowth {
            max: 4,
            ..Default::default()
        });
        prefix.type_ = AllocationType::Prefix;
        let f = fields(datacenter_growth("dc", &prefix));
        assert_eq!(f[0].0, "spec.datacenters[dc].growth");
    }
}
