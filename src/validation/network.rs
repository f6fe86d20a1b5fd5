//! The `network` of a pool datacenter: gateway, prefix length, DNS servers, VLAN and MTU.
//!
//! The network is `poolCidr` widened to `prefixLength` (the pool may be a slice of a wider
//! subnet), or `poolCidr` itself when no length is given. The rules:
//!
//! - `prefixLength` is at most `poolCidr`'s own length: the pool lies inside its network;
//! - `gateway` is an address of the pool's family inside the network, and a host address (not
//!   the network address; not an IPv4 network's broadcast address; both are hosts in an IPv4
//!   /31 or /32 and an IPv6 /127 or /128). One that lies inside `poolCidr` must be excluded,
//!   so that kipam never hands the gateway to a cluster;
//! - `dnsServers` are addresses of either family, each listed once;
//! - `vlanId` is 0 to 4094; `mtu` 576 to 9216, and at least 1280 in an IPv6 pool (the least
//!   IPv6 allows).
//!
//! Nothing here changes what a cluster holds, so the network may be edited at any time.

use crate::address::{AddrRange, Cidr, Family, parse_address};
use crate::planner::HeldElsewhere;
use crate::resources::bounds::{MAX_MTU, MAX_VLAN_ID, MIN_MTU};
use crate::resources::{AllocationType, IPAMPool, IPAMPoolDatacenter};

use super::FieldError;

/// The tag under which a gateway is kept out of the other pools of its datacenter.
pub const GATEWAY_HOLDER: &str = "gateway";

/// The least MTU of an IPv6 link (RFC 8200).
const MIN_MTU_IPV6: i32 = 1280;

/// A pool datacenter's network, checked, with addresses in their canonical text form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatacenterNetwork {
    /// The network: `poolCidr` widened to `prefixLength`.
    pub cidr: Cidr,
    pub gateway: Option<String>,
    /// The network's prefix length (`poolCidr`'s when none is given).
    pub prefix_length: u8,
    pub dns_servers: Vec<String>,
    pub vlan_id: Option<u16>,
    pub mtu: Option<u16>,
}

/// Checks the `network` of pool datacenter `dc`. `Ok(None)` when it has none, or when its
/// `poolCidr` does not parse and nothing else is wrong (that error is the pool's own). The
/// errors name no object: the caller's [`super::Errors`] adds it.
pub fn datacenter_network(
    dc: &str,
    settings: &IPAMPoolDatacenter,
) -> Result<Option<DatacenterNetwork>, Vec<FieldError>> {
    let Some(network) = &settings.network else {
        return Ok(None);
    };
    let mut errors = Vec::new();
    let mut add = |name: &str, value: String, reason: String| {
        errors.push(FieldError {
            object: String::new(),
            field: format!("spec.datacenters[{dc}].network.{name}"),
            value,
            reason,
        });
    };
    let pool = settings.pool_cidr.parse::<Cidr>().ok();

    // prefixLength
    let mut cidr = pool;
    if let (Some(p), Some(pool)) = (network.prefix_length, pool) {
        let widened = u8::try_from(p)
            .ok()
            .filter(|p| *p <= pool.prefix_len())
            .and_then(|p| {
                let mask = match u32::from(pool.family().bits() - p) {
                    128 => 0,
                    host => pool.family().max_address() & !((1u128 << host) - 1),
                };
                Cidr::new(pool.family(), pool.first() & mask, p)
            });
        if widened.is_none() {
            add(
                "prefixLength",
                p.to_string(),
                format!(
                    "must be between 0 and {}, the prefix length of poolCidr {pool}: the pool \
                     lies inside its network",
                    pool.prefix_len()
                ),
            );
        }
        cidr = widened;
    }
    let net_text = |c: &Cidr| {
        if network.prefix_length.is_some() {
            format!("the network {c}")
        } else {
            format!("the network {c} (poolCidr; set prefixLength when the network is wider)")
        }
    };

    // Every further CIDR of the pool datacenter lies in the same network: a machine given an
    // address from one of them is also given this network's gateway and prefix length.
    let mut outside = Vec::new();
    if let Some(net) = cidr {
        for (i, text) in settings.additional_cidrs.iter().enumerate() {
            let Ok(extra) = text.parse::<Cidr>() else {
                continue; // said by the pool's own rules
            };
            if extra.family() == net.family()
                && (extra.first() < net.first() || extra.last() > net.last())
            {
                outside.push(FieldError {
                    object: String::new(),
                    field: format!("spec.datacenters[{dc}].additionalCidrs[{i}]"),
                    value: text.clone(),
                    reason: format!(
                        "is not inside {}, whose gateway and prefix length the pool's \
                         addresses are given",
                        net_text(&net)
                    ),
                });
            }
        }
    }

    // gateway
    let mut gateway = None;
    if let Some(text) = &network.gateway {
        match parse_address(text) {
            Err(_) => add("gateway", text.clone(), "is not an IP address".to_string()),
            Ok((family, address)) => {
                let reason = match (pool, cidr) {
                    (Some(pool), _) if family != pool.family() => {
                        Some(format!("is {family}, the pool is {}", pool.family()))
                    }
                    (Some(pool), Some(net)) => host_problem(net, address)
                        .map(|p| format!("{p} {}", net_text(&net)))
                        .or_else(|| {
                            // Any CIDR of the pool datacenter could hand the gateway out.
                            std::iter::once(pool)
                                .chain(
                                    settings
                                        .additional_cidrs
                                        .iter()
                                        .filter_map(|c| c.parse::<Cidr>().ok()),
                                )
                                .find(|c| address >= c.first() && address <= c.last())
                                .and_then(|c| {
                                    let field = if c == pool {
                                        "poolCidr"
                                    } else {
                                        "additionalCidrs"
                                    };
                                    not_excluded(settings, field, c, family, address)
                                })
                        }),
                    // The pool's CIDR or the prefix length is wrong: said elsewhere.
                    _ => None,
                };
                match reason {
                    Some(r) => add("gateway", text.clone(), r),
                    None => gateway = Some(family.display(address).to_string()),
                }
            }
        }
    }

    // dnsServers
    let mut dns_servers = Vec::new();
    let mut seen: Vec<(Family, u128, usize)> = Vec::new();
    for (i, text) in network.dns_servers.iter().enumerate() {
        let name = format!("dnsServers[{i}]");
        match parse_address(text) {
            Err(_) => add(&name, text.clone(), "is not an IP address".to_string()),
            Ok((family, address)) => {
                if let Some((_, _, first)) =
                    seen.iter().find(|(f, a, _)| *f == family && *a == address)
                {
                    add(
                        &name,
                        text.clone(),
                        format!("is listed twice (also dnsServers[{first}])"),
                    );
                } else {
                    seen.push((family, address, i));
                    dns_servers.push(family.display(address).to_string());
                }
            }
        }
    }

    // vlanId
    let vlan_id = network.vlan_id.and_then(|v| {
        let ok = u16::try_from(v)
            .ok()
            .filter(|v| i32::from(*v) <= MAX_VLAN_ID);
        if ok.is_none() {
            add(
                "vlanId",
                v.to_string(),
                format!("must be between 0 and {MAX_VLAN_ID}"),
            );
        }
        ok
    });

    // mtu
    let mtu = network.mtu.and_then(|m| {
        let least = match pool.map(|p| p.family()) {
            Some(Family::V6) => MIN_MTU_IPV6,
            _ => MIN_MTU,
        };
        if (least..=MAX_MTU).contains(&m) {
            u16::try_from(m).ok()
        } else {
            let why = if least == MIN_MTU_IPV6 && m >= MIN_MTU {
                " (the least an IPv6 link carries)"
            } else {
                ""
            };
            add(
                "mtu",
                m.to_string(),
                format!("must be between {least} and {MAX_MTU}{why}"),
            );
            None
        }
    });

    errors.extend(outside);
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(cidr.map(|cidr| DatacenterNetwork {
        cidr,
        gateway,
        prefix_length: cidr.prefix_len(),
        dns_servers,
        vlan_id,
        mtu,
    }))
}

/// Why `address` is not a host address of `net`, if it is not.
fn host_problem(net: Cidr, address: u128) -> Option<String> {
    if address < net.first() || address > net.last() {
        return Some("is not inside".to_string());
    }
    // In an IPv4 /31 or /32 and an IPv6 /127 or /128 every address is a host address.
    let small = net.host_bits() <= 1;
    if small {
        return None;
    }
    if address == net.first() {
        return Some("is the network address of".to_string());
    }
    if net.family() == Family::V4 && address == net.last() {
        return Some("is the broadcast address of".to_string());
    }
    None
}

/// The complaint about a gateway inside one of the pool's CIDRs (`field` names which list it
/// comes from) that no exclusion covers. Exclusions that
/// do not parse are reported by the pool's own rules.
fn not_excluded(
    settings: &IPAMPoolDatacenter,
    field: &str,
    pool: Cidr,
    family: Family,
    address: u128,
) -> Option<String> {
    let (list, excluded) = match settings.type_ {
        AllocationType::Range => (
            "excludeRanges",
            settings
                .exclude_ranges
                .iter()
                .filter_map(|t| AddrRange::parse_lenient(t).ok())
                .collect::<Vec<_>>(),
        ),
        AllocationType::Prefix => (
            "excludePrefixes",
            settings
                .exclude_prefixes
                .iter()
                .filter_map(|t| t.parse::<Cidr>().ok().map(|c| c.range()))
                .collect(),
        ),
    };
    let covered = excluded
        .iter()
        .any(|r| r.family() == family && r.first() <= address && address <= r.last());
    (!covered).then(|| {
        format!(
            "lies inside {field} {pool} and is not excluded, so kipam could hand it to a \
             cluster: add it to {list}"
        )
    })
}

/// The gateway of every pool datacenter of `pools` that names one (and whose network
/// checks), as held by its pool: `kipam offline`'s clash check and the planner (offline and in
/// the controller) keep it out of every other pool of the datacenter: a pool of the same
/// address space whose CIDR covers it must not hand it to a cluster.
pub fn gateways<'a>(pools: impl IntoIterator<Item = &'a IPAMPool>) -> Vec<HeldElsewhere> {
    let mut out = Vec::new();
    for pool in pools {
        let name = pool.metadata.name.as_deref().unwrap_or_default();
        for (dc, settings) in &pool.spec.datacenters {
            let Ok(Some(network)) = datacenter_network(dc, settings) else {
                continue;
            };
            let Some(gateway) = network.gateway.as_deref() else {
                continue;
            };
            let Ok((family, address)) = parse_address(gateway) else {
                continue;
            };
            out.extend(
                AddrRange::new(family, address, address).map(|r| HeldElsewhere {
                    pool: name.to_string(),
                    datacenter: dc.clone(),
                    holder: GATEWAY_HOLDER.to_string(),
                    addresses: vec![r],
                }),
            );
        }
    }
    out
}
