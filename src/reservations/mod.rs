//! What an `IPAMPoolRecord` must hold after a plan (pure: no client).
//!
//! The record of a pool datacenter is the commit point of every allocation: kipam writes it
//! (compare-and-swap) before any `IPAMAllocation` object, and trims an entry only once no object
//! shows those addresses any more. So at every moment the record covers every address that any
//! object kipam wrote shows, and a replica that lost the Lease cannot commit anything.

use std::collections::BTreeMap;

pub mod shards;

use crate::address::AddrRange;
use crate::allocator::Allocation;
use crate::planner::{Change, Decision, Quarantined};
use crate::resources::{IPAMAllocationSpec, Reservation, cluster_of_namespace};

/// The record entry for what a cluster holds.
pub fn reservation_of(held: &Allocation) -> Reservation {
    match held {
        Allocation::Prefix(cidr) => Reservation {
            cidr: Some(cidr.to_string()),
            addresses: Vec::new(),
        },
        Allocation::Range(pieces) => Reservation {
            cidr: None,
            addresses: pieces.iter().map(|p| p.to_string()).collect(),
        },
    }
}

/// What a record entry holds; an error names the piece that does not parse.
pub fn allocation_of(r: &Reservation) -> Result<Allocation, String> {
    let mut pieces = Vec::new();
    if let Some(cidr) = &r.cidr {
        let parsed = cidr
            .parse::<crate::address::Cidr>()
            .map_err(|e| format!("cidr {cidr:?}: {e}"))?;
        if r.addresses.is_empty() {
            return Ok(Allocation::Prefix(parsed));
        }
        pieces.push(parsed.range());
    }
    for a in &r.addresses {
        pieces.push(AddrRange::parse_lenient(a).map_err(|e| format!("address {a:?}: {e}"))?);
    }
    if pieces.is_empty() {
        return Err("the entry holds no address".into());
    }
    // Kept for as long as the record is (one per cluster and pool): no spare room.
    pieces.shrink_to_fit();
    Ok(Allocation::Range(pieces))
}

/// `held` plus whatever of `recorded` it lacks, appended as further pieces (what `held` shows is
/// never rewritten). Equal address sets give `held` back unchanged.
pub fn with_recorded(held: &Allocation, recorded: &Allocation) -> Allocation {
    let missing = subtract(recorded.ranges().collect(), held.ranges().collect());
    if missing.is_empty() {
        return held.clone();
    }
    let mut pieces: Vec<AddrRange> = held.ranges().collect();
    pieces.extend(missing);
    Allocation::Range(pieces)
}

/// What a holder holds for the planner, given what its object shows (`held`) and what its
/// pool record entry holds (`recorded`), and the addresses the entry holds beyond that which
/// are only set aside (for one plan, from everyone) while the commit trims them.
///
/// A range holding takes the entry's extra addresses, appended ([`with_recorded`]): an entry
/// ahead of its object is a commit whose object write did not land, and the object is written
/// again with them. A subnet cannot take a second subnet: an entry holding more than the
/// object's subnet is a pin changed whose record is behind (the object shows the new subnet,
/// the entry both) or ahead (the write of the new subnet did not land); a holding of both
/// would be neither a subnet nor loadable, and would stay `Conflict` with the record never
/// trimmed. So the subnet shown is held and the rest set aside.
pub fn merge_recorded(held: &Allocation, recorded: &Allocation) -> (Allocation, Vec<AddrRange>) {
    match held {
        Allocation::Prefix(_) => {
            let beyond = subtract(recorded.ranges().collect(), held.ranges().collect());
            (held.clone(), beyond)
        }
        Allocation::Range(_) => (with_recorded(held, recorded), Vec::new()),
    }
}

/// The addresses of `from` that are not in `minus`, sorted and merged.
pub fn subtract_ranges(from: Vec<AddrRange>, minus: Vec<AddrRange>) -> Vec<AddrRange> {
    subtract(from, minus)
}

/// The addresses of `from` that are not in `minus`, sorted and merged.
fn subtract(from: Vec<AddrRange>, minus: Vec<AddrRange>) -> Vec<AddrRange> {
    let minus = merged(minus);
    let mut out = Vec::new();
    for r in merged(from) {
        let (family, mut first, last) = (r.family(), r.first(), r.last());
        let mut done = false;
        for m in minus.iter().filter(|m| m.overlaps(&r)) {
            if m.first() > first {
                out.extend(AddrRange::new(family, first, m.first() - 1));
            }
            if m.last() >= last {
                done = true;
                break;
            }
            first = first.max(m.last() + 1);
        }
        if !done {
            out.extend(AddrRange::new(family, first, last));
        }
    }
    out
}

/// Sorted, overlapping or adjacent pieces of one family merged.
pub(crate) fn merged(mut ranges: Vec<AddrRange>) -> Vec<AddrRange> {
    ranges.sort();
    let mut out: Vec<AddrRange> = Vec::new();
    for r in ranges {
        if let Some(last) = out.last_mut()
            && last.family() == r.family()
            && (last.last() == u128::MAX || r.first() <= last.last() + 1)
        {
            if r.last() > last.last() {
                *last = AddrRange::new(r.family(), last.first(), r.last()).unwrap_or(*last);
            }
            continue;
        }
        out.push(r);
    }
    out
}

/// The record of (`pool`, `datacenter`) a plan asks for: every cluster's addresses held there
/// after the plan, plus every address an existing object still shows there (dropped only once
/// the object stops showing it, so the record always covers the objects). `objects` are the
/// stored allocation objects as (namespace, name, spec).
pub fn desired_reservations<'a, 'b>(
    pool: &str,
    datacenter: &str,
    decisions: impl IntoIterator<Item = &'b Decision>,
    objects: impl IntoIterator<Item = (&'a str, &'a str, &'a IPAMAllocationSpec)>,
) -> BTreeMap<String, Reservation> {
    let mut held: BTreeMap<String, Allocation> = BTreeMap::new();
    for d in decisions {
        if d.pool != pool || d.datacenter != datacenter || d.change == Change::Release {
            continue;
        }
        if let Some(h) = &d.held {
            held.insert(d.cluster.clone(), h.clone());
        }
    }
    for (namespace, name, spec) in objects {
        if name != pool || spec.dc != datacenter {
            continue;
        }
        let Some(cluster) = cluster_of_namespace(namespace) else {
            continue;
        };
        let Ok(shown) = allocation_of(&Reservation {
            cidr: spec.cidr.clone(),
            addresses: spec.addresses.clone(),
        }) else {
            continue;
        };
        let next = match held.get(cluster) {
            Some(h) => with_recorded(h, &shown),
            None => shown,
        };
        held.insert(cluster.to_string(), next);
    }
    held.into_iter()
        .map(|(c, a)| (c, reservation_of(&a)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(text: &str) -> Allocation {
        Allocation::Range(text.split(',').map(|p| p.parse().unwrap()).collect())
    }

    #[test]
    fn recorded_addresses_are_appended_never_rewritten() {
        let held = range("10.0.0.8-10.0.0.15,10.0.0.0-10.0.0.3");
        assert_eq!(with_recorded(&held, &range("10.0.0.0-10.0.0.3")), held);
        assert_eq!(
            with_recorded(&held, &range("10.0.0.2-10.0.0.5,10.0.0.14-10.0.0.20")).to_string(),
            "10.0.0.8-10.0.0.15,10.0.0.0-10.0.0.3,10.0.0.4-10.0.0.5,10.0.0.16-10.0.0.20"
        );
        let prefix = Allocation::Prefix("10.0.1.0/30".parse().unwrap());
        assert_eq!(with_recorded(&prefix, &prefix), prefix);
    }

    /// A range holding takes what its entry holds beyond it; a subnet keeps the subnet its
    /// object shows, and what the entry holds beyond it is only set aside. Before, the two
    /// subnets of a changed pin were joined into a range no prefix pool could load: the
    /// allocation stayed `Conflict` and the old subnet in the record for good.
    #[test]
    fn a_subnet_never_takes_a_second_subnet_from_its_record_entry() {
        let held = range("10.0.0.0-10.0.0.3");
        let (merged, aside) = merge_recorded(&held, &range("10.0.0.0-10.0.0.7"));
        assert_eq!(merged.to_string(), "10.0.0.0-10.0.0.3,10.0.0.4-10.0.0.7");
        assert!(aside.is_empty());

        let new = Allocation::Prefix("10.0.1.4/30".parse().unwrap());
        let both = with_recorded(&new, &Allocation::Prefix("10.0.1.0/30".parse().unwrap()));
        let (merged, aside) = merge_recorded(&new, &both);
        assert_eq!(merged, new);
        assert_eq!(
            aside,
            vec!["10.0.1.0-10.0.1.3".parse::<AddrRange>().unwrap()]
        );
        // The entry as the object: nothing set aside.
        assert_eq!(merge_recorded(&new, &new), (new.clone(), Vec::new()));
    }

    #[test]
    fn entries_round_trip() {
        for a in [
            range("10.0.0.0-10.0.0.7,10.0.0.9-10.0.0.9"),
            Allocation::Prefix("2001:db8::/64".parse().unwrap()),
        ] {
            assert_eq!(allocation_of(&reservation_of(&a)).unwrap(), a);
        }
        assert!(allocation_of(&Reservation::default()).is_err());
    }
}

/// Adds to `desired` (a record's entries after a plan) what an object of `holder` still shows:
/// the entry keeps covering it, appended, until the object is gone.
pub fn keep_shown(desired: &mut BTreeMap<String, Reservation>, holder: &str, shown: &Allocation) {
    let next = match desired.get(holder).map(allocation_of) {
        Some(Ok(h)) => with_recorded(&h, shown),
        _ => shown.clone(),
    };
    desired.insert(holder.to_string(), reservation_of(&next));
}

/// How a record names a quarantine entry: `quarantined/<former holder>@<release time, RFC 3339>`.
/// A `/` never appears in a cluster name, so no cluster's entry can be taken for one.
pub const QUARANTINE_PREFIX: &str = "quarantined/";

/// The record key of addresses quarantined for `holder` since `released_at` (seconds since
/// the Unix epoch).
pub fn quarantine_key(holder: &str, released_at: i64) -> String {
    let when = k8s_openapi::jiff::Timestamp::from_second(released_at)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| released_at.to_string());
    format!("{QUARANTINE_PREFIX}{holder}@{when}")
}

/// The former holder and release time a record key names, if it is a quarantine entry;
/// `Err` for a quarantine key that does not read (its addresses are then kept, see callers).
pub fn parse_quarantine_key(key: &str) -> Option<Result<(&str, i64), String>> {
    let rest = key.strip_prefix(QUARANTINE_PREFIX)?;
    let Some((holder, when)) = rest.rsplit_once('@') else {
        return Some(Err(format!(
            "quarantine entry {key:?} names no release time"
        )));
    };
    let at = when
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second())
        .or_else(|_| when.parse::<i64>())
        .map_err(|_| format!("quarantine entry {key:?}: {when:?} is not a time"));
    Some(at.map(|at| (holder, at)))
}

/// Adds to `desired` (a record's entries after a plan) the quarantine the plan keeps in
/// (`pool`, `datacenter`).
pub fn add_quarantine<'a>(
    desired: &mut BTreeMap<String, Reservation>,
    pool: &str,
    datacenter: &str,
    quarantined: impl IntoIterator<Item = &'a Quarantined>,
) {
    for q in quarantined {
        if q.pool != pool || q.datacenter != datacenter {
            continue;
        }
        let key = quarantine_key(&q.holder, q.released_at);
        let held = Allocation::Range(q.addresses.clone());
        let entry = match desired.remove(&key) {
            Some(old) => match allocation_of(&old) {
                Ok(o) => reservation_of(&with_recorded(&o, &held)),
                Err(_) => reservation_of(&held),
            },
            None => reservation_of(&held),
        };
        desired.insert(key, entry);
    }
}

#[cfg(test)]
mod quarantine_tests {
    use super::*;

    #[test]
    fn quarantine_keys_round_trip_and_never_read_as_a_cluster() {
        let key = quarantine_key("web", 1_764_093_600);
        assert_eq!(key, "quarantined/web@2025-11-25T18:00:00Z");
        assert_eq!(parse_quarantine_key(&key), Some(Ok(("web", 1_764_093_600))));
        assert_eq!(parse_quarantine_key("web"), None);
        assert!(matches!(
            parse_quarantine_key("quarantined/web@yesterday"),
            Some(Err(_))
        ));
    }
}
