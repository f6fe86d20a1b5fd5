//! `kipam offline --report FILE.html`: the pool page of the controller, as one self-contained
//! file (data, script and style inlined; no network), from the allocations of this run.

use std::path::Path;

use crate::page::{Holding, html, view};
use crate::resources::IPAMAllocation;

use super::OfflineReport;
use super::files::{FileError, write_atomic};

/// The page of `report` (`label` names where it comes from, `now` when it was made).
pub fn page(report: &OfflineReport, label: &str, now: &str) -> Result<String, String> {
    let holdings: Vec<Holding> = report.allocations.iter().map(holding).collect();
    let data = view::report(label, now, &report.pools, &holdings);
    html::offline(&data).map_err(|e| format!("cannot write the report: {e}"))
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
