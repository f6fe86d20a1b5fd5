//! `kipam offline`: the same planning as the controller, over manifests on disk, with the
//! allocations persisted in a state file.
//!
//! Nothing is written unless every input is valid and the state file could be read; the state
//! file is then replaced atomically, and only when its content changes, so running it twice
//! changes nothing.

pub mod addons;
pub mod adopt;
pub mod files;
pub mod guard;
pub mod holders;
pub mod manifests;
pub mod out_dir;
pub mod outputs;
pub mod overlaps;
pub mod page;
pub mod quarantine;
pub mod report;
pub mod state_file;
pub mod yaml;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::desired::allocation_object;
use crate::planner::{Change, Plan, PlanInputs};
use crate::render::Renderer;
use crate::resources::{
    ANNOTATION_ADDRESS_SPACE, ANNOTATION_POOL_ALLOCATION_PREFIX, Addon, Cluster, IPAMAllocation,
    IPAMPool, cluster_namespace,
};
use crate::validation::{self, FieldError};

pub use files::FileError;
pub use guard::Concern;
pub use manifests::{ManifestError, Manifests};
pub use out_dir::OutReport;
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
    /// Let releases through that look like a mistake (see [`guard`]).
    pub allow_release: bool,
    /// Take a state file that exists but holds no document (empty, only comments or `---`)
    /// as an empty state; without it such a file is refused.
    pub allow_empty_state: bool,
}

/// Where and with what to render the Addons (`--out`).
#[derive(Clone, Copy, Debug)]
pub struct OutTarget<'a> {
    pub renderer: &'a Renderer,
    pub dir: &'a Path,
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
    /// Whether the state file did not exist before this run (and was created).
    pub state_created: bool,
    /// With `--out`: Addons that failed to render. When there are any, nothing at all was
    /// written (neither the state nor `--out`).
    pub render_errors: Vec<String>,
    /// With `--out`: Addons not rendered because their cluster is not in the input.
    pub render_skipped: Vec<String>,
    /// With `--out`, when everything rendered: what was written there.
    pub out: Option<OutReport>,
    /// Documents skipped because kipam does not read their kind.
    pub ignored: Vec<String>,
    /// Things that are allowed but likely wrong: pools overlapping in one datacenter, and the
    /// addresses held through both.
    /// Also: clusters held because they adopt (offline mode reads no user cluster).
    pub warnings: Vec<String>,
    /// Temporary files of the state that runs stopped mid-write had left (named after a
    /// process that no longer exists), removed by this run.
    pub leftovers: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("invalid input, nothing written:\n{}", list(.0))]
    Invalid(Vec<FieldError>),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(
        "refusing to release allocations, nothing written:\n{}\n(if this is intended, run again with --allow-release)",
        concerns(.0)
    )]
    Release(Vec<Concern>),
    #[error(
        "state file {} holds addresses twice, nothing planned, rendered or written:\n{}",
        path.display(),
        lines(messages)
    )]
    Clash {
        path: PathBuf,
        messages: Vec<String>,
    },
}

fn lines(list: &[String]) -> String {
    list.iter()
        .map(|m| format!("  {m}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn concerns(list: &[Concern]) -> String {
    list.iter()
        .map(|c| format!("  {c}"))
        .collect::<Vec<_>>()
        .join("\n")
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
    run_with_out(options, None)
}

/// [`run`], then, with `out`, every Addon rendered into `out.dir`. All Addons are rendered in
/// memory before anything is written: when one fails, neither the state nor `out.dir` is
/// touched.
pub fn run_with_out(
    options: &OfflineOptions,
    out: Option<OutTarget<'_>>,
) -> Result<OfflineReport, OfflineError> {
    let manifests = manifests::load(&options.files)?;
    // Before reading: a FIFO would hang the read, a dangling symlink would look like a new
    // state; both are refused here with what they are.
    let state_created =
        files::check_existing(&options.state, "state file")? == files::Target::Absent;
    // Held until the run ends: a concurrent run on the same state is refused rather than
    // allowed to overwrite this one's allocations.
    let _lock = files::lock(&options.state, "state file")?;
    // Under the lock: no other run is writing, so a temporary file of the state named after a
    // process that is gone is a leftover of a run stopped mid-write.
    let leftovers = files::remove_leftovers(&options.state, "state file");
    let (stored_objects, kept_records) =
        state_file::read_state(&options.state, options.allow_empty_state)?;
    let now = quarantine::seconds_of(&options.now).map_err(|why| {
        OfflineError::Invalid(vec![FieldError {
            object: "kipam offline".into(),
            field: "--now".into(),
            value: options.now.clone(),
            reason: why,
        }])
    })?;
    let kept_quarantine =
        quarantine::of_records(&kept_records).map_err(|message| StateError::Corrupt {
            path: options.state.clone(),
            message,
        })?;

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
            Ok(mut c) => {
                // Offline mode reads no user cluster: one that adopts is held, not given a
                // fresh range that may hold what it serves (`kipam adopt` reports what it
                // serves and the overrides to pin instead).
                let mode = crate::planner::adopt::effective_mode(cluster, &manifests.pools);
                if crate::planner::adopt::reads(mode) {
                    c.hold = Some(format!(
                        "adopt is {}: offline mode reads no user cluster; run `kipam adopt` and pin what it reports (spec.ipam.<pool>.addresses), or remove adopt",
                        mode.map(|m| m.as_str()).unwrap_or_default()
                    ));
                }
                clusters.push(c)
            }
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
    let recorded_prefixes = holders::recorded_prefixes(&stored_objects);
    for pool in &manifests.pools {
        match validation::validate_pool_against_state(
            pool,
            None,
            &stored,
            Some(&clusters),
            &recorded_prefixes,
        ) {
            Ok(p) => pools.push(p),
            Err(e) => errors.extend(e),
        }
    }
    for cluster in &clusters {
        cluster_errors.extend(validation::override_fits(cluster, &pools));
    }
    errors.extend(cluster_errors);
    for addon in &manifests.addons {
        errors.extend(addons::check_addon(addon));
    }
    if !errors.is_empty() {
        return Err(OfflineError::Invalid(errors));
    }
    // Before planning: a state that shows two holders of one address (a Git merge of two
    // branches that each allocated) is refused, never planned or rendered from.
    let gateways = crate::validation::gateways(&manifests.pools);
    let recorded = holders::recorded_spaces(&stored_objects);
    let clashes = holders::state_clashes(&stored, &pools, &gateways, &recorded, true);
    if !clashes.is_empty() {
        return Err(OfflineError::Clash {
            path: options.state.clone(),
            messages: holders::clash_messages(&clashes),
        });
    }

    let held_elsewhere = holders::held_elsewhere(&pools, &clusters, &stored, gateways);
    let inputs = PlanInputs {
        pools,
        clusters,
        stored,
        quarantined: kept_quarantine,
        now,
        held_elsewhere,
    };
    let (mut plan, _) = inputs.plan_keeping();
    let PlanInputs {
        pools,
        clusters,
        stored,
        ..
    } = inputs;
    explain_moves_while_frozen(&mut plan, &clusters);
    if !options.allow_release {
        let concerns = guard::suspicious_releases(&plan, &stored, &pools, &clusters);
        if !concerns.is_empty() {
            return Err(OfflineError::Release(concerns));
        }
    }
    let mut warnings = overlaps::overlap_warnings(&pools, &plan.decisions);
    warnings.extend(
        clusters
            .iter()
            .filter_map(|c| Some(format!("cluster {} is held: {}", c.name, c.hold.as_ref()?))),
    );

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
    let spaces: HashMap<&str, &str> = pools
        .iter()
        .map(|p| (p.name.as_str(), p.address_space.as_str()))
        .collect();
    let prefixes: HashMap<(&str, &str), i32> = manifests
        .pools
        .iter()
        .flat_map(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            p.spec
                .datacenters
                .iter()
                .filter_map(move |(dc, d)| Some(((name, dc.as_str()), d.allocation_prefix?)))
        })
        .collect();
    let mut next: BTreeMap<(String, String), IPAMAllocation> = BTreeMap::new();
    let mut decided = std::collections::HashSet::new();
    for d in &plan.decisions {
        let key = (cluster_namespace(&d.cluster), d.pool.clone());
        decided.insert(key.clone());
        let before = existing.get(&key).copied();
        let policy = policies.get(d.pool.as_str()).copied();
        if let Some(mut obj) = allocation_object(d, before, policy, &options.now) {
            // The state holds why an allocation is as it is, never what this run did to it
            // (that is the summary table's): a run that changes nothing must write nothing.
            if let Some(status) = obj.status.as_mut()
                && event_only(d)
            {
                status.message = None;
            }
            // The space its addresses count in, kept for when the pool is gone.
            if let Some(space) = spaces.get(d.pool.as_str()) {
                let space = if space.is_empty() {
                    validation::DEFAULT_SPACE
                } else {
                    space
                };
                obj.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(ANNOTATION_ADDRESS_SPACE.into(), space.to_string());
            }
            // What the pool's allocationPrefix was, against which the next run checks it.
            if let Some(length) = prefixes.get(&(d.pool.as_str(), d.datacenter.as_str())) {
                obj.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(ANNOTATION_POOL_ALLOCATION_PREFIX.into(), length.to_string());
            }
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
    let content = state_file::render_state(&allocations, &quarantine::records(&plan.quarantined))?;
    let rendering = out.map(|target| {
        addons::render_all(
            target.renderer,
            &manifests.addons,
            &manifests.clusters,
            &allocations,
            &manifests.pools,
        )
    });
    let mut report = OfflineReport {
        plan,
        allocations,
        pools: manifests.pools,
        clusters: manifests.clusters,
        addons: manifests.addons,
        state_written: false,
        state_created,
        render_errors: Vec::new(),
        render_skipped: Vec::new(),
        out: None,
        ignored: manifests.ignored,
        warnings,
        leftovers,
    };
    if let Some(rendering) = &rendering {
        report.render_skipped = rendering.skipped.clone();
        if !rendering.errors.is_empty() {
            // All or nothing: the state and --out stay as they were.
            report.render_errors = rendering.errors.clone();
            return Ok(report);
        }
    }
    // Checked before anything is written (the state goes first, then --out).
    state_file::check_size(&content)?;
    let current = std::fs::read_to_string(&options.state).ok();
    report.state_written = current.as_deref() != Some(content.as_str());
    if report.state_written {
        state_file::write_atomic(&options.state, &content)?;
    }
    if let (Some(target), Some(rendering)) = (out, &rendering) {
        report.out = Some(out_dir::write_out(target.dir, &rendering.files));
    }
    Ok(report)
}

/// Whether `d`'s message tells only what this run did (a growth, a move, a new or changed
/// allocation), which the next run, keeping the allocation, would not say again. A pin is
/// said on every run ("pinned").
fn event_only(d: &crate::planner::Decision) -> bool {
    matches!(d.change, Change::Create | Change::Grow | Change::Replace) && d.message != "pinned"
}

/// A paused (or invalid) cluster keeps what it holds, even in a datacenter it no longer is in:
/// say so, and what happens when it is resumed, instead of only "cluster is paused".
fn explain_moves_while_frozen(plan: &mut Plan, clusters: &[crate::planner::ClusterInput]) {
    let by_name: HashMap<&str, &crate::planner::ClusterInput> =
        clusters.iter().map(|c| (c.name.as_str(), c)).collect();
    for d in &mut plan.decisions {
        let Some(c) = by_name.get(d.cluster.as_str()) else {
            continue;
        };
        if d.change != Change::Keep || !c.frozen() || c.datacenter == d.datacenter {
            continue;
        }
        let how = if c.paused {
            "while it is paused"
        } else {
            "while its spec is invalid"
        };
        let held = d
            .held
            .as_ref()
            .map(|h| h.to_string())
            .unwrap_or_else(|| "nothing".into());
        let (old, new) = (&d.datacenter, &c.datacenter);
        d.message = format!(
            "{}; its datacenter changed from {old} to {new} {how}: it keeps {held} in {old} \
             until it is resumed, but its addons, rendered for {new}, do not show them; once \
             resumed, these are released and it gets new addresses from the pools serving {new}",
            d.message
        );
    }
}

/// The result table: one row per (cluster, pool), then the pools' usage (`pools` tells which
/// are IPv6 prefix pools, whose counts are shown in subnets).
pub fn summary_table(plan: &Plan, pools: &[IPAMPool]) -> String {
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
            .map(report::short_allocation)
            .unwrap_or_else(|| "-".into());
        let mut status = if d.message.is_empty() {
            d.change.to_string()
        } else {
            format!("{}: {}", d.change, d.message)
        };
        let given_up = d.given_up();
        if !given_up.is_empty() {
            let shown: Vec<String> = given_up.iter().map(|r| r.to_string()).collect();
            status.push_str(&format!("; {} released", shown.join(",")));
        }
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
        "QUARANTINED".into(),
    ]];
    for r in plan.usage.values() {
        let u = &r.usage;
        let [allocated, excluded, available, largest] =
            report::usage_cells(pools, &r.pool, &r.datacenter, u);
        usage.push([
            r.pool.clone(),
            r.datacenter.clone(),
            format!("{}%", u.utilisation_percent()),
            allocated,
            excluded,
            available,
            u.allocations.to_string(),
            largest,
            report::human_count(u.quarantined),
        ]);
    }
    out.push_str(&table(&usage));
    out.push_str(&cidr_table(pools, plan));
    out
}

/// For pool datacenters of several CIDRs, the figures of each CIDR in fill order (nothing
/// when every pool datacenter has one CIDR).
fn cidr_table(pools: &[IPAMPool], plan: &Plan) -> String {
    let mut rows = vec![[
        "POOL".to_string(),
        "DATACENTER".into(),
        "CIDR".into(),
        "ALLOCATED".into(),
        "EXCLUDED".into(),
        "AVAILABLE".into(),
        "LARGEST FREE".into(),
    ]];
    for r in plan.usage.values().filter(|r| r.cidrs.len() > 1) {
        for c in &r.cidrs {
            let as_pool = crate::allocator::PoolUsage {
                total: c.total,
                allocated: c.allocated,
                excluded: c.excluded,
                available: c.available,
                allocations: 0,
                largest_free_block: c.largest_free_block,
                fragmentation_percent: c.fragmentation_percent,
                quarantined: crate::address::AddressCount::ZERO,
                shared: crate::address::AddressCount::ZERO,
            };
            let [allocated, excluded, available, largest] =
                report::usage_cells(pools, &r.pool, &r.datacenter, &as_pool);
            rows.push([
                r.pool.clone(),
                r.datacenter.clone(),
                c.cidr.to_string(),
                allocated,
                excluded,
                available,
                largest,
            ]);
        }
    }
    if rows.len() == 1 {
        return String::new();
    }
    format!("\n{}", table(&rows))
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

/// True when any allocation failed or is in conflict (kept as stored, but it cannot be
/// honoured): either way a cluster does not hold what it should.
pub fn has_failures(plan: &Plan) -> bool {
    plan.decisions.iter().any(|d| !d.is_ok())
}

/// True when the run did not do everything asked (exit 1): an allocation failed or is in
/// conflict, an Addon did not render, or a file under `--out` could not be written or removed.
pub fn report_failed(report: &OfflineReport) -> bool {
    has_failures(&report.plan)
        || !report.render_errors.is_empty()
        || report.out.as_ref().is_some_and(|o| !o.errors.is_empty())
}
