//! The quarantine in the offline state file: one `IPAMPoolRecord` document per pool
//! datacenter with quarantined addresses, holding only quarantine entries
//! (`quarantined/<former holder>@<release time>`, as the controller's pool records do). The
//! allocations themselves stay `IPAMAllocation` documents. A state file written before
//! quarantine existed has no such documents: nothing is quarantined, nothing released.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::planner::Quarantined;
use crate::reservations::{add_quarantine, allocation_of, parse_quarantine_key};
use crate::resources::{IPAMPoolRecord, IPAMPoolRecordSpec, record_name};

/// Seconds since the Unix epoch of an RFC 3339 time (`--now`).
pub fn seconds_of(text: &str) -> Result<i64, String> {
    text.trim()
        .parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second())
        .map_err(|_| "is not an RFC 3339 time such as 2026-11-25T18:00:00Z".to_string())
}

/// An RFC 3339 time of seconds since the Unix epoch.
pub fn time_text(seconds: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(seconds)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| seconds.to_string())
}

/// The quarantine the state file's records keep; `Err` names the entry that does not read.
pub fn of_records(records: &[IPAMPoolRecord]) -> Result<Vec<Quarantined>, String> {
    let mut out = Vec::new();
    for r in records {
        for (key, entry) in &r.spec.reservations {
            let where_ = format!(
                "IPAMPoolRecord {} entry {key}",
                r.metadata.name.as_deref().unwrap_or_default()
            );
            let (holder, released_at) = match parse_quarantine_key(key) {
                Some(Ok(parsed)) => parsed,
                Some(Err(why)) => return Err(format!("{where_}: {why}")),
                None => {
                    return Err(format!(
                        "{where_}: the state file keeps only quarantine entries (quarantined/<cluster>@<time>) in its records"
                    ));
                }
            };
            let held = allocation_of(entry).map_err(|why| format!("{where_}: {why}"))?;
            out.push(Quarantined {
                pool: r.spec.pool.clone(),
                datacenter: r.spec.datacenter.clone(),
                holder: holder.to_string(),
                released_at,
                addresses: held.ranges().collect(),
            });
        }
    }
    Ok(out)
}

/// The records that keep `quarantined`, one per pool datacenter, sorted by name.
pub fn records(quarantined: &[Quarantined]) -> Vec<IPAMPoolRecord> {
    let mut by_key: BTreeMap<(String, String), IPAMPoolRecordSpec> = BTreeMap::new();
    for q in quarantined {
        let spec = by_key
            .entry((q.pool.clone(), q.datacenter.clone()))
            .or_insert_with(|| IPAMPoolRecordSpec {
                pool: q.pool.clone(),
                datacenter: q.datacenter.clone(),
                ..Default::default()
            });
        // The one rule for a record's quarantine entries (the controller's too): two
        // releases of one holder in the same second share an entry and are merged.
        add_quarantine(&mut spec.reservations, &q.pool, &q.datacenter, [q]);
    }
    by_key
        .into_iter()
        .map(|((pool, dc), spec)| IPAMPoolRecord {
            metadata: ObjectMeta {
                name: Some(record_name(&pool, &dc)),
                ..Default::default()
            },
            spec,
        })
        .collect()
}
