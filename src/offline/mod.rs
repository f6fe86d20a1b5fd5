//! `kipam offline`: the same planning as the controller, over manifests on disk, with the
//! allocations persisted in a state file.
//!
//! Nothing is written unless every input is valid and the state file could be read; the state
//! file is then replaced atomically, and only when its content changes, so running it twice
//! changes nothing.

pub mod addons;
pub mod manifests;
pub mod overlaps;
pub mod state_file;
pub mod yaml;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;

use crate::desired::allocation_object;
use crate::planner::{self, Change, Plan};
use crate::resources::{Addon, Cluster, IPAMAllocation, IPAMPool, cluster_namespace};
use crate::validation::{self, FieldError};

pub use manifests::{ManifestError, Manifests};
pub use state_file::StateError;

/// What `kipam offline` is asked to do.
#[derive(Clone, Debug)]
pub struct OfflineOptions {
    /// Manifest files or directories.
    pub files: Vec<PathBuf>,
    /// The state file (created when missing).
    pub state: PathBuf,
    /// RFC 3339 time stamped on new allocations.
    pub now: String,
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct OfflineReport {
    pub plan: Plan,
    /// The allocations now stored.
    pub allocations: Vec<IPAMAllocation>,
    /// The inputs, for rendering addons.
    pub pools: Vec<IPAMPool>,
    pub clusters: Vec<Cluster>,
    pub addons: Vec<Addon>,
    /// Whether the state file was (re)written.
    pub state_written: bool,
    /// Documents skipped because kipam does not read their kind.
    pub ignored: Vec<String>,
    /// Things that are allowed but likely wrong: pools overlapping in one datacenter, and the
    /// addresses held through both.
    pub warnings: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("invalid input, nothing written:\n{}", list(.0))]
    Invalid(Vec<FieldError>),
}

fn list(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reads, validates, plans and writes the state. Refuses (writing nothing) on any invalid
/// input or unreadable state.
pub fn run(options: &OfflineOptions) -> Result<OfflineReport, OfflineError> {
    let manifests = manifests::load(&options.files)?;
    let stored_objects = state_file::read(&options.state)?;

    let mut errors = Vec::new();
    let mut stored = Vec::new();
    for obj in &stored_objects {
        match validation::stored_allocation(obj) {
            Ok(s) => stored.push(s),
            Err(e) => errors.extend(e),
        }
    }
    if !errors.is_empty() {
        return Err(StateError::Corrupt {
            path: options.state.clone(),
            message: list(&errors),
        }
        .into());
    }
    // Clusters are read first (the pool checks against the state need their overrides), but
    // their messages come after the pools'.
    let mut clusters = Vec::new();
    let mut cluster_errors = Vec::new();
    for cluster in &manifests.clusters {
        match validation::cluster_input(cluster) {
            Ok(c) => clusters.push(c),
            Err(e) => cluster_errors.extend(e),
        }
    }
    let pool_names: Vec<&str> = manifests
        .pools
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    for cluster in &manifests.clusters {
        cluster_errors.extend(validation::override_pools(
            cluster,
            pool_names.iter().copied(),
        ));
    }
    let mut pools = Vec::new();
    for pool in &manifests.pools {
        match validation::validate_pool_with_clusters(pool, None, &stored, Some(&clusters)) {
            Ok(p) => pools.push(p),
            Err(e) => errors.extend(e),
        }
    }
    errors.extend(cluster_errors);
    if !errors.is_empty() {
        return Err(OfflineError::Invalid(errors));
    }

    let plan = planner::plan(&pools, &clusters, &stored);
    let warnings = overlaps::overlap_warnings(&pools, &plan.decisions);

    let existing: HashMap<(String, String), &IPAMAllocation> = stored_objects
        .iter()
        .map(|o| {
            (
                (
                    o.metadata.namespace.clone().unwrap_or_default(),
                    o.metadata.name.clone().unwrap_or_default(),
                ),
                o,
            )
        })
        .collect();
    let policies: HashMap<&str, _> = pools
        .iter()
        .map(|p| (p.name.as_str(), p.reclaim_policy))
        .collect();
    let mut next: BTreeMap<(String, String), IPAMAllocation> = BTreeMap::new();
    let mut decided = std::collections::HashSet::new();
    for d in &plan.decisions {
        let key = (cluster_namespace(&d.cluster), d.pool.clone());
        decided.insert(key.clone());
        let before = existing.get(&key).copied();
        let policy = policies.get(d.pool.as_str()).copied();
        if let Some(obj) = allocation_object(d, before, policy, &options.now) {
            next.insert(key, obj);
        }
    }
    // Never drop what the plan did not speak about.
    for (key, obj) in &existing {
        if !decided.contains(key) {
            next.insert(key.clone(), (*obj).clone());
        }
    }
    let allocations: Vec<IPAMAllocation> = next.into_values().collect();
    let content = state_file::render(&allocations)?;
    let current = std::fs::read_to_string(&options.state).ok();
    let state_written = current.as_deref() != Some(content.as_str());
    if state_written {
        state_file::write_atomic(&options.state, &content)?;
    }
    Ok(OfflineReport {
        plan,
        allocations,
        pools: manifests.pools,
        clusters: manifests.clusters,
        addons: manifests.addons,
        state_written,
        ignored: manifests.ignored,
        warnings,
    })
}

/// The result table: one row per (cluster, pool), then the pools' usage.
pub fn summary_table(plan: &Plan) -> String {
    let mut rows = vec![[
        "CLUSTER".to_string(),
        "POOL".into(),
        "DATACENTER".into(),
        "TYPE".into(),
        "ALLOCATION".into(),
        "STATUS".into(),
    ]];
    for d in &plan.decisions {
        let allocation = d
            .held
            .as_ref()
            .map(|a| a.to_string())
            .unwrap_or_else(|| "-".into());
        let status = if d.message.is_empty() {
            d.change.to_string()
        } else {
            format!("{}: {}", d.change, d.message)
        };
        rows.push([
            d.cluster.clone(),
            d.pool.clone(),
            d.datacenter.clone(),
            d.type_.as_str().to_string(),
            allocation,
            status,
        ]);
    }
    let mut out = table(&rows);
    out.push('\n');
    let mut usage = vec![[
        "POOL".to_string(),
        "DATACENTER".into(),
        "USED".into(),
        "ALLOCATED".into(),
        "EXCLUDED".into(),
        "AVAILABLE".into(),
        "ALLOCATIONS".into(),
        "LARGEST FREE".into(),
    ]];
    for r in plan.usage.values() {
        let u = &r.usage;
        usage.push([
            r.pool.clone(),
            r.datacenter.clone(),
            format!("{}%", u.utilisation_percent()),
            u.allocated.to_string(),
            u.excluded.to_string(),
            u.available.to_string(),
            u.allocations.to_string(),
            u.largest_free_block.to_string(),
        ]);
    }
    out.push_str(&table(&usage));
    out
}

fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// True when any decision failed (the exit status of `kipam offline`).
pub fn has_failures(plan: &Plan) -> bool {
    plan.decisions.iter().any(|d| d.change == Change::Fail)
}
