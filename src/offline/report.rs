//! What `kipam offline`, `validate` and `render` print: short forms for people, the full
//! result (`-o json`, `-o yaml`) for scripts.
//!
//! For people: a single address is shown as `10.0.0.5`, not `10.0.0.5-10.0.0.5`; address
//! counts too long to read are shown as `2^64` or `1.8e19`, and the counts of IPv6 prefix
//! pools as numbers of subnets (`65534 /64s`). For scripts: every count exact, as a decimal
//! string (IPv6 counts do not fit in a JSON number).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::address::{AddrRange, AddressCount};
use crate::allocator::{Allocation, PoolUsage};
use crate::planner::{Decision, Plan};
use crate::resources::{AllocationType, IPAMPool};

use super::{OfflineReport, OutReport};

/// Counts below this are printed in full.
const EXACT_BELOW: u128 = 10_000_000_000;

/// A range as people read it: `10.0.0.5` for one address, `10.0.0.0-10.0.0.7` otherwise.
pub fn short_range(range: &AddrRange) -> String {
    if range.first() == range.last() {
        range.family().display(range.first()).to_string()
    } else {
        range.to_string()
    }
}

/// An allocation as people read it: its pieces (short form) separated by commas, or its CIDR.
pub fn short_allocation(allocation: &Allocation) -> String {
    match allocation {
        Allocation::Range(pieces) => pieces.iter().map(short_range).collect::<Vec<_>>().join(","),
        Allocation::Prefix(cidr) => cidr.to_string(),
    }
}

/// A count as people read it: in full below ten billion, `2^N` for a power of two, else two
/// significant digits (`1.8e19`). Exact figures are in `-o json`.
pub fn human_count(count: AddressCount) -> String {
    if let Some(n) = count.to_u128() {
        if n < EXACT_BELOW {
            return n.to_string();
        }
        if n.is_power_of_two() {
            return format!("2^{}", n.trailing_zeros());
        }
    } else if count == AddressCount::pow2(128) {
        return "2^128".into();
    }
    let digits = count.to_string();
    let exponent = digits.len() - 1;
    let bytes = digits.as_bytes();
    let mut mantissa = u32::from(bytes[0] - b'0') * 10 + u32::from(bytes[1] - b'0');
    if bytes.get(2).is_some_and(|d| *d >= b'5') {
        mantissa += 1;
    }
    if mantissa == 100 {
        return format!("1.0e{}", exponent + 1);
    }
    format!("{}.{}e{exponent}", mantissa / 10, mantissa % 10)
}

/// A count of a pool whose allocations are `/len` subnets, as a number of such subnets when
/// it is a whole number of them (`65534 /64s`), else as addresses.
pub fn subnet_count(count: AddressCount, host_bits: u32) -> String {
    // Nothing is nothing in any unit; and subnets of length /0 are the whole address space,
    // better read as addresses.
    if count == AddressCount::ZERO || host_bits >= 128 {
        return human_count(count);
    }
    let whole = match count.to_u128() {
        Some(n) if host_bits >= 128 => (n == 0).then_some(0),
        Some(n) => {
            let size = 1u128 << host_bits;
            (n % size == 0).then_some(n / size)
        }
        None => (host_bits > 0 && host_bits <= 128).then(|| 1u128 << (128 - host_bits)),
    };
    match whole {
        Some(n) => format!(
            "{} /{}s",
            human_count(AddressCount::from_u128(n)),
            128 - host_bits
        ),
        None => human_count(count),
    }
}

/// The host bits of the subnets an IPv6 prefix pool hands out in a datacenter, if it is one.
fn ipv6_subnet_bits(pools: &[IPAMPool], pool: &str, datacenter: &str) -> Option<u32> {
    let dc = pools
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(pool))?
        .spec
        .datacenters
        .get(datacenter)?;
    if dc.type_ != AllocationType::Prefix || !dc.pool_cidr.contains(':') {
        return None;
    }
    let len = u32::try_from(dc.allocation_prefix?).ok()?;
    (len <= 128).then(|| 128 - len)
}

/// The usage cells of one pool datacenter for the table, in the column order
/// ALLOCATED, EXCLUDED, AVAILABLE, LARGEST FREE.
pub fn usage_cells(
    pools: &[IPAMPool],
    pool: &str,
    datacenter: &str,
    usage: &PoolUsage,
) -> [String; 4] {
    let show = |c: AddressCount| match ipv6_subnet_bits(pools, pool, datacenter) {
        Some(bits) => subnet_count(c, bits),
        None => human_count(c),
    };
    [
        show(usage.allocated),
        show(usage.excluded),
        show(usage.available),
        show(usage.largest_free_block),
    ]
}

fn allocation_json(allocation: Option<&Allocation>) -> Value {
    match allocation {
        None => Value::Null,
        Some(Allocation::Range(pieces)) => json!({
            "addresses": pieces.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "count": allocation_count(allocation).to_string(),
        }),
        Some(Allocation::Prefix(cidr)) => json!({
            "cidr": cidr.to_string(),
            "count": cidr.size().to_string(),
        }),
    }
}

fn allocation_count(allocation: Option<&Allocation>) -> AddressCount {
    match allocation {
        Some(Allocation::Range(pieces)) => pieces
            .iter()
            .fold(AddressCount::ZERO, |sum, p| sum.saturating_add(p.size())),
        Some(Allocation::Prefix(cidr)) => cidr.size(),
        None => AddressCount::ZERO,
    }
}

fn decision_json(d: &Decision) -> Value {
    json!({
        "cluster": d.cluster,
        "pool": d.pool,
        "datacenter": d.datacenter,
        "type": d.type_.as_str(),
        "change": d.change.as_str(),
        "allocation": allocation_json(d.held.as_ref()),
        "previous": allocation_json(d.previous.as_ref()),
        "message": d.message,
    })
}

/// The plan as data: every decision and every pool datacenter's usage, counts exact.
pub fn plan_json(plan: &Plan) -> Value {
    let usage: Vec<Value> = plan
        .usage
        .values()
        .map(|r| {
            let u = &r.usage;
            let mut v = json!({
                "pool": r.pool,
                "datacenter": r.datacenter,
                "total": u.total.to_string(),
                "allocated": u.allocated.to_string(),
                "excluded": u.excluded.to_string(),
                "available": u.available.to_string(),
                "allocations": u.allocations,
                "largestFreeBlock": u.largest_free_block.to_string(),
                "fragmentationPercent": u.fragmentation_percent,
                "utilisationPercent": u.utilisation_percent(),
                "quarantined": u.quarantined.to_string(),
                "shared": u.shared.to_string(),
            });
            // Pool datacenters of several CIDRs: each CIDR's figures, in fill order.
            if r.cidrs.len() > 1 {
                v["cidrs"] = r
                    .cidrs
                    .iter()
                    .map(|c| {
                        json!({
                            "cidr": c.cidr.to_string(),
                            "total": c.total.to_string(),
                            "allocated": c.allocated.to_string(),
                            "excluded": c.excluded.to_string(),
                            "available": c.available.to_string(),
                            "largestFreeBlock": c.largest_free_block.to_string(),
                            "fragmentationPercent": c.fragmentation_percent,
                        })
                    })
                    .collect();
            }
            v
        })
        .collect();
    let quarantined: Vec<Value> = plan
        .quarantined
        .iter()
        .map(|q| {
            json!({
                "pool": q.pool,
                "datacenter": q.datacenter,
                "holder": q.holder,
                "releasedAt": crate::offline::quarantine::time_text(q.released_at),
                "addresses": q.addresses.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "allocations": plan.decisions.iter().map(decision_json).collect::<Vec<_>>(),
        "usage": usage,
        "quarantined": quarantined,
    })
}

fn out_json(dir: &str, out: &OutReport) -> Value {
    json!({
        "dir": dir,
        "files": out.files.iter().map(|f| json!({
            "cluster": f.cluster,
            "addon": f.addon,
            "path": f.path.display().to_string(),
            "objects": f.objects,
            "written": f.written,
        })).collect::<Vec<_>>(),
        "removed": out.removed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "errors": out.errors,
    })
}

/// The whole result of a `kipam offline` run.
pub fn offline_json(
    report: &OfflineReport,
    state: &str,
    out: Option<&str>,
    exit_code: u8,
) -> Value {
    let mut value = plan_json(&report.plan);
    let fields: BTreeMap<&str, Value> = BTreeMap::from([
        ("exitCode", json!(exit_code)),
        (
            "state",
            json!({
                "path": state,
                "written": report.state_written,
                "created": report.state_created && report.state_written,
            }),
        ),
        ("renderErrors", json!(report.render_errors)),
        ("warnings", json!(report.warnings)),
        (
            "skipped",
            json!(
                report
                    .ignored
                    .iter()
                    .chain(&report.render_skipped)
                    .collect::<Vec<_>>()
            ),
        ),
        (
            "out",
            match (out, &report.out) {
                (Some(dir), Some(o)) => out_json(dir, o),
                _ => Value::Null,
            },
        ),
    ]);
    if let Value::Object(map) = &mut value {
        for (k, v) in fields {
            map.insert(k.to_string(), v);
        }
    }
    value
}

/// A run that stopped before doing anything (invalid input, unreadable state, refused
/// release): the exit code and the message.
pub fn error_json(exit_code: u8, message: &str) -> Value {
    json!({ "exitCode": exit_code, "error": message })
}

/// Prints a value in the requested machine format (`json` or `yaml`).
pub fn to_text(value: &Value, format: Format) -> String {
    match format {
        Format::Json => serde_json::to_string_pretty(value).unwrap_or_default() + "\n",
        Format::Yaml => serde_saphyr::to_string(value)
            .unwrap_or_else(|_| serde_json::to_string_pretty(value).unwrap_or_default() + "\n"),
    }
}

/// A machine-readable output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_is_shown_alone() {
        let one: AddrRange = "10.0.0.5-10.0.0.5".parse().unwrap();
        assert_eq!(short_range(&one), "10.0.0.5");
        let two: AddrRange = "10.0.0.5-10.0.0.6".parse().unwrap();
        assert_eq!(short_range(&two), "10.0.0.5-10.0.0.6");
        let six: AddrRange = "2001:db8::1".parse().unwrap();
        assert_eq!(short_range(&six), "2001:db8::1");
        let a = Allocation::Range(vec![one, "10.0.0.8-10.0.0.9".parse().unwrap()]);
        assert_eq!(short_allocation(&a), "10.0.0.5,10.0.0.8-10.0.0.9");
    }

    #[test]
    fn counts_for_people() {
        assert_eq!(human_count(AddressCount::from_u128(248)), "248");
        assert_eq!(
            human_count(AddressCount::from_u128(4_294_967_296)),
            "4294967296"
        );
        assert_eq!(human_count(AddressCount::pow2(64)), "2^64");
        assert_eq!(human_count(AddressCount::pow2(128)), "2^128");
        assert_eq!(
            human_count(AddressCount::from_u128((1u128 << 64) - 32)),
            "1.8e19"
        );
        assert_eq!(
            human_count(AddressCount::from_u128(4_685_472_994_722_226_110_464)),
            "4.7e21"
        );
        assert_eq!(
            human_count(AddressCount::from_u128(99_960_000_000)),
            "1.0e11"
        );
        assert_eq!(
            human_count(AddressCount::from_u128(12_340_000_000)),
            "1.2e10"
        );
    }

    #[test]
    fn subnets_of_prefix_pools() {
        // A /48 with two /64s taken: 65534 /64s left.
        let free = AddressCount::pow2(80).saturating_sub(AddressCount::pow2(65));
        assert_eq!(subnet_count(free, 64), "65534 /64s");
        assert_eq!(subnet_count(AddressCount::pow2(65), 64), "2 /64s");
        assert_eq!(subnet_count(AddressCount::ZERO, 64), "0");
        // Not a whole number of subnets: addresses.
        assert_eq!(subnet_count(AddressCount::from_u128(16), 64), "16");
        // The whole IPv6 space.
        assert_eq!(subnet_count(AddressCount::pow2(128), 64), "2^64 /64s");
    }
}
