//! `kipam offline --report FILE.html`: the pool page of the controller, as one self-contained
//! file (data, script and style inlined; no network), from the allocations of this run.

use std::path::Path;

use crate::page::{Holding, Quarantine, html, report};
use crate::resources::{IPAMAllocation, IPAMPool};
use crate::validation::parse_reuse_after;

use super::OfflineReport;
use super::files::{FileError, write_atomic};

/// The page of `report` (`label` names where it comes from, `now` when it was made).
pub fn page(report: &OfflineReport, label: &str, now: &str) -> Result<String, String> {
    let holdings: Vec<Holding> = report.allocations.iter().map(holding).collect();
    let quarantine = quarantine_of(report, &report.pools);
    let data = report::report(label, now, &report.pools, &holdings, &quarantine);
    data.packed()
        .map(|packed| html::offline(&packed))
        .map_err(|e| e.to_string())
}

/// What stays quarantined after this run, with the end of each entry's period (the pool
/// datacenter's `reuseAfter` after the release).
fn quarantine_of(report: &OfflineReport, pools: &[IPAMPool]) -> Vec<Quarantine> {
    report
        .plan
        .quarantined
        .iter()
        .map(|q| {
            let reuse_after = pools
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(q.pool.as_str()))
                .and_then(|p| p.spec.datacenters.get(&q.datacenter))
                .and_then(|dc| dc.reuse_after.as_deref())
                .and_then(|text| parse_reuse_after(text).ok())
                .unwrap_or(0);
            crate::page::quarantine::entry(q, reuse_after)
        })
        .collect()
}

fn holding(obj: &IPAMAllocation) -> Holding {
    Holding::of(
        obj.metadata.namespace.as_deref().unwrap_or_default(),
        obj.metadata.name.as_deref().unwrap_or_default(),
        &obj.spec,
        obj.status.as_ref(),
    )
}

/// Writes the page to `path` (atomically: a reader never sees half a file).
pub fn write(path: &Path, content: &str) -> Result<(), FileError> {
    write_atomic(path, content.as_bytes(), "report")
}
