//! References between objects that only make sense together: a cluster's per-pool override
//! must name a pool that exists, and ask that pool for something it can give.

use crate::address::Family;
use crate::allocator::PoolKind;
use crate::planner::{ClusterInput, PoolInput, PoolOverride};
use crate::resources::Cluster;

use super::{Errors, FieldError, strict::suggest};

/// Overrides under `spec.ipam` of `cluster` that name none of `pools`. Such an override would
/// otherwise do nothing, silently (a typo in a pool name, or a pool that was removed).
pub fn override_pools<'p>(
    cluster: &Cluster,
    pools: impl IntoIterator<Item = &'p str> + Clone,
) -> Vec<FieldError> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut errors = Errors::new(format!("Cluster {name}"));
    for pool in cluster.spec.ipam.keys() {
        if pools.clone().into_iter().any(|p| p == pool) {
            continue;
        }
        let reason = match suggest(pool, pools.clone()) {
            Some(close) => format!("names no IPAMPool, did you mean {close}?"),
            None => "names no IPAMPool".to_string(),
        };
        errors.add(format!("spec.ipam[{pool}]"), "", reason);
    }
    errors.into_vec()
}

/// Overrides of `cluster` that the pool they name cannot honour in the cluster's datacenter:
/// a `cidr` pin or an `allocationPrefix` on a range pool, `addresses` or an
/// `allocationRange` on a prefix pool, a pin of the other address family. The planner would
/// refuse each of them on every run; `kipam validate` and `kipam offline` refuse them first,
/// with the same rule. Pools that do not serve the cluster's datacenter are not asked.
pub fn override_fits(cluster: &ClusterInput, pools: &[PoolInput]) -> Vec<FieldError> {
    let mut errors = Errors::new(format!("Cluster {}", cluster.name));
    for (pool_name, ov) in &cluster.overrides {
        let Some(dc) = pools
            .iter()
            .find(|p| &p.name == pool_name)
            .and_then(|p| p.datacenters.get(&cluster.datacenter))
        else {
            continue;
        };
        let path = |f: &str| format!("spec.ipam[{pool_name}].{f}");
        let kind = dc.config.kind.type_name();
        let family = dc.config.cidr.family();
        let served = format!(
            "pool {pool_name} is a {kind} pool ({}) in datacenter {}",
            dc.config.cidr, cluster.datacenter
        );
        let family_name = |f: Family| match f {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        };
        match (ov, dc.config.kind) {
            (PoolOverride::PinnedCidr(c), PoolKind::Range { .. }) => errors.add(
                path("cidr"),
                c,
                format!("{served}: pin its addresses with `addresses` instead"),
            ),
            (PoolOverride::Prefix(p), PoolKind::Range { .. }) => errors.add(
                path("allocationPrefix"),
                p,
                format!("{served}: ask a number of addresses with `allocationRange` instead"),
            ),
            (PoolOverride::PinnedAddresses(_), PoolKind::Prefix { .. }) => errors.add(
                path("addresses"),
                "",
                format!("{served}: pin a subnet with `cidr` instead"),
            ),
            (PoolOverride::Addresses(n), PoolKind::Prefix { .. }) => errors.add(
                path("allocationRange"),
                n,
                format!("{served}: ask a subnet length with `allocationPrefix` instead"),
            ),
            (PoolOverride::PinnedCidr(c), _) if c.family() != family => errors.add(
                path("cidr"),
                c,
                format!(
                    "is {}, and {served} is {}",
                    family_name(c.family()),
                    family_name(family)
                ),
            ),
            (PoolOverride::PinnedAddresses(pieces), _) => {
                for (i, piece) in pieces.iter().enumerate() {
                    if piece.family() != family {
                        errors.add(
                            format!("{}[{i}]", path("addresses")),
                            piece,
                            format!(
                                "is {}, and {served} is {}",
                                family_name(piece.family()),
                                family_name(family)
                            ),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    errors.into_vec()
}
