//! Which addresses are quarantined, address by address, for the page: from the pool records
//! (`IPAMPoolRecord` entries `quarantined/<former holder>@<release time>`), which every
//! replica watches, or from the offline state file's quarantine. Pure: the time is an input.

use std::collections::BTreeMap;

use crate::address::AddrRange;
use crate::planner::Quarantined;
use crate::reservations::{allocation_of, parse_quarantine_key, shards};
use crate::resources::{IPAMPool, IPAMPoolRecord, Reservation};

use super::Quarantine;

/// A quarantine entry as the page shows it: kept for its former holder until its release
/// time plus the pool datacenter's `reuseAfter` (`reuse_after` seconds).
pub fn entry(q: &Quarantined, reuse_after: u64) -> Quarantine {
    Quarantine {
        pool: q.pool.clone(),
        datacenter: q.datacenter.clone(),
        holder: q.holder.clone(),
        until: time_text(q.until(reuse_after)),
        ranges: q.addresses.clone(),
    }
}

/// An RFC 3339 time of seconds since the Unix epoch.
pub fn time_text(seconds: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| seconds.to_string())
}

/// What `records` (any shards, of any pool) keep quarantined in `pool` at `now` (seconds
/// since the Unix epoch), as the planner keeps it: an entry's parts in several shards are
/// joined, and entries of a datacenter without a readable `reuseAfter` above zero, or past
/// their end, are left out (the next pass drops them; their addresses are free). An entry
/// whose key or addresses do not read is left out too: the leader's status count still
/// counts it (see [`super::PoolDc::quarantined_count`]).
pub fn of_records<'a>(
    pool: &IPAMPool,
    records: impl IntoIterator<Item = &'a IPAMPoolRecord>,
    now: i64,
) -> Vec<Quarantine> {
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let mut parts: BTreeMap<(&str, &str), Vec<&Reservation>> = BTreeMap::new();
    for r in records {
        if r.spec.pool != name {
            continue;
        }
        for (key, entry) in &r.spec.reservations {
            if key.starts_with(crate::reservations::QUARANTINE_PREFIX) {
                parts
                    .entry((r.spec.datacenter.as_str(), key.as_str()))
                    .or_default()
                    .push(entry);
            }
        }
    }
    let mut out = Vec::new();
    for ((dc, key), pieces) in parts {
        let Some(spec) = pool.spec.datacenters.get(dc) else {
            continue;
        };
        let reuse_after = match spec.reuse_after.as_deref() {
            Some(text) => crate::validation::parse_reuse_after(text).unwrap_or(0),
            None => 0,
        };
        let Some(Ok((holder, released_at))) = parse_quarantine_key(key) else {
            continue;
        };
        let Ok(held) = allocation_of(&shards::join(pieces)) else {
            continue;
        };
        let q = Quarantined {
            pool: name.to_string(),
            datacenter: dc.to_string(),
            holder: holder.to_string(),
            released_at,
            addresses: held.ranges().collect::<Vec<AddrRange>>(),
        };
        if reuse_after == 0 || q.until(reuse_after) <= now {
            continue;
        }
        out.push(entry(&q, reuse_after));
    }
    out
}
