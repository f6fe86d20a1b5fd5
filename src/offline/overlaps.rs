//! Warnings about pools that overlap in one datacenter.
//!
//! Pools of one address space (`addressSpace`, default one per datacenter) whose `poolCidr`s
//! intersect in a datacenter share those addresses: the planner hands each out once. Pools of
//! different address spaces may hand out the same address once each (that is what separate
//! spaces are for). Either way the overlap is a warning naming both pools and saying which
//! it is, and every address actually held through both pools (only allocations stored before
//! the pools shared their space can do that in one space) is listed with its holders. The controller reports the same
//! overlaps as the pools' `Overlap` condition ([`crate::status::find_overlaps`]).

use std::collections::BTreeMap;

use crate::address::AddrRange;
use crate::planner::{Decision, PoolInput};
use crate::status::find_overlaps;

/// Most collisions listed per pair of pools; the rest are counted.
const SHOWN: usize = 20;

/// Warnings for every pair of different pools that overlap in one datacenter, then for every
/// address held through both of them by `decisions` (empty for `kipam validate`).
pub fn overlap_warnings(pools: &[PoolInput], decisions: &[Decision]) -> Vec<String> {
    let cidr = |pool: &str, dc: &str| {
        pools
            .iter()
            .find(|p| p.name == pool)
            .and_then(|p| p.datacenters.get(dc))
            .map(|d| {
                let cidrs: Vec<String> = d.config.cidrs().map(|c| c.to_string()).collect();
                cidrs.join(", ")
            })
            .unwrap_or_default()
    };
    // Held ranges per (pool, datacenter), sorted by first address.
    let mut held: BTreeMap<(&str, &str), Vec<(AddrRange, &str)>> = BTreeMap::new();
    for d in decisions {
        if let Some(h) = &d.held {
            let list = held
                .entry((d.pool.as_str(), d.datacenter.as_str()))
                .or_default();
            list.extend(h.ranges().map(|r| (r, d.cluster.as_str())));
        }
    }
    for list in held.values_mut() {
        list.sort_by_key(|(r, _)| (r.first(), r.last()));
    }
    let mut out = Vec::new();
    for o in find_overlaps(pools) {
        if o.datacenter != o.other_datacenter || o.pool >= o.other_pool {
            continue; // one pool across datacenters, or the mirror of a pair already seen
        }
        let dc = o.datacenter.as_str();
        let how = if o.shared {
            "in one address space: they share its addresses, each handed out through one of \
             them only"
                .to_string()
        } else {
            format!(
                "across address spaces ({} and {}): both can hand out the same addresses",
                space_name(pools, &o.pool),
                space_name(pools, &o.other_pool)
            )
        };
        out.push(format!(
            "pools {} ({}) and {} ({}) overlap in datacenter {dc} {how}",
            o.pool,
            cidr(&o.pool, dc),
            o.other_pool,
            cidr(&o.other_pool, dc),
        ));
        let empty = Vec::new();
        let a = held.get(&(o.pool.as_str(), dc)).unwrap_or(&empty);
        let b = held.get(&(o.other_pool.as_str(), dc)).unwrap_or(&empty);
        let mut collisions = 0usize;
        for (ra, ca) in a {
            // Ranges of one pool never overlap each other, so `b` is sorted by both bounds.
            let start = b.partition_point(|(rb, _)| rb.last() < ra.first());
            for (rb, cb) in b[start..]
                .iter()
                .take_while(|(rb, _)| rb.first() <= ra.last())
            {
                if !ra.overlaps(rb) {
                    continue;
                }
                collisions += 1;
                if collisions <= SHOWN {
                    let first = ra.first().max(rb.first());
                    let last = ra.last().min(rb.last());
                    let shared = AddrRange::new(ra.family(), first, last)
                        .map(|r| r.to_string())
                        .unwrap_or_default();
                    out.push(format!(
                        "cluster {ca} (pool {}) and cluster {cb} (pool {}) both hold {shared} \
                         in datacenter {dc}",
                        o.pool, o.other_pool
                    ));
                }
            }
        }
        if collisions > SHOWN {
            out.push(format!(
                "... and {} more ranges held through both {} and {} in datacenter {dc}",
                collisions - SHOWN,
                o.pool,
                o.other_pool
            ));
        }
    }
    out
}

/// The address space a pool names, as people read it.
fn space_name(pools: &[PoolInput], pool: &str) -> String {
    match pools.iter().find(|p| p.name == pool) {
        Some(p) if !p.address_space.is_empty() => format!("space {}", p.address_space),
        _ => "the default space".to_string(),
    }
}
