//! `kipam adopt`: the adoption plan of a fleet that already runs MetalLB, offline, as a dry
//! run. It reads the pools and Clusters like `kipam offline` does, reads what each user cluster
//! serves (from exported manifests, or through a kubeconfig: list only, nothing is ever
//! written to a user cluster), runs the planner's adoption plan
//! ([`crate::planner::adopt::plan`], the one the controller runs) and reports it, with the
//! Cluster overrides (`spec.ipam.<pool>.addresses`) that would pin the same addresses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use crate::planner::StoredAllocation;
use crate::planner::adopt::{
    self, AdoptState, AdoptionPlan, Candidate, ClusterAdoption, Discovered, Reading, Verdict, short,
};
use crate::resources::{AdoptMode, Cluster};
use crate::validation::{self, FieldError};

use super::{manifests, state_file, yaml};

/// Where one user cluster's objects come from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A directory of exported manifests (`kubectl get ipaddresspools.metallb.io,services -A
    /// -o yaml`: Lists or multi-document YAML, `.yaml`, `.yml` or `.json`).
    Export(PathBuf),
    /// Read through this kubeconfig (list only).
    Kubeconfig(PathBuf),
}

/// What `kipam adopt` is asked to do.
#[derive(Clone, Debug, Default)]
pub struct AdoptOptions {
    /// IPAMPool and Cluster manifests (files or directories).
    pub pools: Vec<PathBuf>,
    /// IPAMAllocation state file of `kipam offline`, if any: what kipam already gave.
    pub state: Option<PathBuf>,
    /// `--kubeconfig FILE --cluster NAME` pairs, by cluster.
    pub kubeconfigs: Vec<(String, PathBuf)>,
    /// `--from DIR`: one sub-directory per user cluster, named as its Cluster.
    pub from: Option<PathBuf>,
}

/// What a run found.
#[derive(Clone, Debug)]
pub struct AdoptReport {
    pub plan: AdoptionPlan,
    /// Things skipped or worth knowing, one line each.
    pub notes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error(transparent)]
    Manifests(#[from] manifests::ManifestError),
    #[error(transparent)]
    State(#[from] state_file::StateError),
    #[error("invalid input:\n{}", .0.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<String>),
}

/// Reads everything, reads the user clusters and plans. Nothing is written anywhere.
pub fn run(options: &AdoptOptions) -> Result<AdoptReport, AdoptError> {
    let manifests = manifests::load(&options.pools)?;
    let mut problems: Vec<String> = Vec::new();
    let mut objects = manifests.allocations.clone();
    if let Some(state) = &options.state {
        objects.extend(state_file::read(state)?);
    }
    let mut stored: Vec<StoredAllocation> = Vec::new();
    for obj in &objects {
        match validation::stored_allocation(obj) {
            Ok(s) => stored.push(s),
            Err(e) => problems.extend(e.iter().map(FieldError::to_string)),
        }
    }
    let mut pools = Vec::new();
    for pool in &manifests.pools {
        match validation::validate_pool_with_clusters(pool, None, &stored, None) {
            Ok(p) => pools.push(p),
            Err(e) => problems.extend(e.iter().map(FieldError::to_string)),
        }
    }
    let clusters: BTreeMap<&str, &Cluster> = manifests
        .clusters
        .iter()
        .filter_map(|c| Some((c.metadata.name.as_deref()?, c)))
        .collect();
    let mut sources: BTreeMap<String, Source> = BTreeMap::new();
    let mut notes = Vec::new();
    for (name, path) in &options.kubeconfigs {
        if !clusters.contains_key(name.as_str()) {
            problems.push(format!(
                "--cluster {name}: no Cluster {name} in the manifests given with --pools"
            ));
        }
        if sources
            .insert(name.clone(), Source::Kubeconfig(path.clone()))
            .is_some()
        {
            problems.push(format!("--cluster {name}: given twice"));
        }
    }
    if let Some(dir) = &options.from {
        match export_dirs(dir) {
            Ok(dirs) => {
                for (name, path) in dirs {
                    if !clusters.contains_key(name.as_str()) {
                        notes.push(format!(
                            "skipped {}: no Cluster {name} in the manifests given with --pools",
                            path.display()
                        ));
                        continue;
                    }
                    if sources.contains_key(&name) {
                        problems.push(format!(
                            "{}: cluster {name} is also read with --kubeconfig",
                            path.display()
                        ));
                        continue;
                    }
                    sources.insert(name, Source::Export(path));
                }
            }
            Err(e) => problems.push(e),
        }
    }
    if !problems.is_empty() {
        return Err(AdoptError::Invalid(problems));
    }
    // Read every user cluster; one that cannot be read waits, and says why.
    let mut readings: BTreeMap<&str, Result<Discovered, String>> = BTreeMap::new();
    let mut modes: BTreeMap<&str, AdoptMode> = BTreeMap::new();
    for (name, cluster) in &clusters {
        // Offline, an unset `adopt` counts as `Adopt`: the run itself is the dry run.
        let mode =
            adopt::effective_mode(cluster, manifests.pools.iter()).unwrap_or(AdoptMode::Adopt);
        if mode == AdoptMode::Disabled {
            notes.push(format!("cluster {name}: adopt is Disabled, not read"));
            continue;
        }
        modes.insert(name, mode);
        let reading = match sources.get(*name) {
            Some(Source::Export(dir)) => read_export(dir),
            Some(Source::Kubeconfig(path)) => read_kubeconfig(path),
            None => Err(format!(
                "no source given for it (a sub-directory {name} of --from, or --kubeconfig with --cluster {name})"
            )),
        };
        readings.insert(name, reading);
    }
    let candidates: Vec<Candidate<'_>> = readings
        .iter()
        .map(|(name, reading)| Candidate {
            name,
            datacenter: &clusters[name].spec.datacenter,
            mode: modes[name],
            reading: match reading {
                Ok(d) => Reading::Read(d),
                Err(why) => Reading::Unreadable(why),
            },
        })
        .collect();
    let plan = adopt::plan(&pools, &stored, &candidates);
    Ok(AdoptReport { plan, notes })
}

/// `DIR`'s sub-directories, by name (hidden ones left out).
fn export_dirs(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("--from {}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("--from {}: {e}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if path.is_dir() && !name.starts_with('.') {
            out.push((name, path));
        }
    }
    out.sort();
    Ok(out)
}

/// The exported objects under `dir` (every `.yaml`, `.yml` and `.json` file, in name order,
/// sub-directories included), read as discovery reads them.
pub fn read_export(dir: &Path) -> Result<Discovered, String> {
    let mut files = Vec::new();
    collect(dir, &mut files)?;
    let mut objects: Vec<Value> = Vec::new();
    for file in files {
        let text =
            yaml::read_text(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let docs = yaml::parse_stream(&text)
            .map_err(|e| format!("{}: not valid YAML: {e}", file.display()))?;
        objects.extend(docs.iter().map(|d| d.to_json()));
    }
    Ok(adopt::from_objects(&objects))
}

fn collect(path: &Path, files: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    for child in children {
        if child.is_dir() {
            collect(&child, files)?;
        } else if child
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        {
            files.push(child);
        }
    }
    Ok(())
}

/// Lists the user cluster's MetalLB pools and Services through `kubeconfig` (its current
/// context). MetalLB not installed (404) is no hand-made pool, not an error.
pub fn read_kubeconfig(kubeconfig: &Path) -> Result<Discovered, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the reader: {e}"))?;
    runtime.block_on(read_through(kubeconfig))
}

/// Objects per list request.
const PAGE: u32 = 500;

async fn read_through(path: &Path) -> Result<Discovered, String> {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, ApiResource, DynamicObject, ListParams};
    let shown = path.display();
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| format!("kubeconfig {shown}: {e}"))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| format!("kubeconfig {shown}: {e}"))?;
    let client = kube::Client::try_from(config).map_err(|e| format!("kubeconfig {shown}: {e}"))?;
    let resource = ApiResource {
        group: "metallb.io".into(),
        version: "v1beta1".into(),
        api_version: "metallb.io/v1beta1".into(),
        kind: "IPAddressPool".into(),
        plural: "ipaddresspools".into(),
    };
    let pools: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut found = Discovered::default();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        match pools.list(&params).await {
            Ok(list) => {
                for p in &list.items {
                    let value = serde_json::to_value(p).map_err(|e| e.to_string())?;
                    found.pools.extend(adopt::hand_made_pool(&value));
                }
                token = list.metadata.continue_.filter(|t| !t.is_empty());
                if token.is_none() {
                    break;
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => break,
            Err(e) => return Err(format!("listing ipaddresspools.metallb.io: {e}")),
        }
    }
    let services: Api<Service> = Api::all(client);
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(PAGE);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let list = services
            .list(&params)
            .await
            .map_err(|e| format!("listing services: {e}"))?;
        for s in &list.items {
            let value = serde_json::to_value(s).map_err(|e| e.to_string())?;
            found.services.extend(adopt::served_service(&value));
        }
        token = list.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    found
        .pools
        .sort_by(|a, b| (&a.name, &a.namespace).cmp(&(&b.name, &b.namespace)));
    found.services.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

/// The state a cluster's adoption is in: `Ready`, `NeedsLook` or `Waiting`.
pub fn state_name(a: &ClusterAdoption) -> &'static str {
    match a.state {
        AdoptState::Ready => "Ready",
        AdoptState::NeedsLook(_) => "NeedsLook",
        AdoptState::Waiting(_) => "Waiting",
    }
}

fn verdict_name(v: &Verdict) -> &'static str {
    match v {
        Verdict::Adopt { .. } => "adopt",
        Verdict::Held { .. } => "held",
        Verdict::Outside => "outside",
        Verdict::Contested { .. } => "contested",
        Verdict::Taken { .. } => "taken",
        Verdict::Excluded { .. } => "excluded",
    }
}

/// Figures over the fleet.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub clusters: usize,
    /// Clusters per state (`Ready`, `NeedsLook`, `Waiting`).
    pub states: BTreeMap<String, usize>,
    /// Served addresses per verdict.
    pub verdicts: BTreeMap<String, usize>,
    /// The clusters needing a look or waiting, by name.
    pub needs_look: Vec<String>,
}

pub fn summary(plan: &AdoptionPlan) -> Summary {
    let mut s = Summary {
        clusters: plan.clusters.len(),
        ..Summary::default()
    };
    for a in &plan.clusters {
        *s.states.entry(state_name(a).to_string()).or_default() += 1;
        for address in &a.served {
            *s.verdicts
                .entry(verdict_name(&address.verdict).to_string())
                .or_default() += 1;
        }
        if a.state != AdoptState::Ready {
            s.needs_look.push(a.cluster.clone());
        }
    }
    s
}

/// 0 when every cluster is `Ready`; 1 when one needs a look or could not be read.
pub fn exit_code(plan: &AdoptionPlan) -> u8 {
    if plan.clusters.iter().all(|a| a.state == AdoptState::Ready) {
        0
    } else {
        1
    }
}

/// The Cluster override a cluster's adoption stands for: `{spec: {ipam: {<pool>: {addresses:
/// [...]}}}}` (`None` when it adopts nothing).
pub fn override_of(a: &ClusterAdoption) -> Option<Value> {
    if a.overrides.is_empty() {
        return None;
    }
    let ipam: serde_json::Map<String, Value> = a
        .overrides
        .iter()
        .map(|(pool, pieces)| {
            let pieces: Vec<String> = pieces.iter().map(short).collect();
            (pool.clone(), json!({"addresses": pieces}))
        })
        .collect();
    Some(json!({"spec": {"ipam": ipam}}))
}

/// The whole report as JSON (`-o json`): the plan, figures, and per cluster the overrides.
pub fn report_json(report: &AdoptReport, code: u8) -> Value {
    let overrides: serde_json::Map<String, Value> = report
        .plan
        .clusters
        .iter()
        .filter_map(|a| Some((a.cluster.clone(), override_of(a)?)))
        .collect();
    json!({
        "dryRun": true,
        "summary": summary(&report.plan),
        "clusters": report.plan.clusters,
        "overrides": overrides,
        "notes": report.notes,
        "exitCode": code,
    })
}

/// The report for a person.
pub fn report_text(report: &AdoptReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for a in &report.plan.clusters {
        let _ = writeln!(
            out,
            "cluster {} (datacenter {}, adopt {}): {}",
            a.cluster,
            a.datacenter,
            a.mode.as_str(),
            state_name(a)
        );
        match &a.state {
            AdoptState::Waiting(why) => {
                let _ = writeln!(out, "  waits: {why}");
            }
            AdoptState::NeedsLook(why) => {
                let _ = writeln!(out, "  needs a look:");
                for w in why {
                    let _ = writeln!(out, "    - {w}");
                }
            }
            AdoptState::Ready => {}
        }
        if !a.served.is_empty() {
            let _ = writeln!(out, "  serves:");
            let width = a.served.iter().map(|s| s.address.len()).max().unwrap_or(0);
            for s in &a.served {
                let what = match &s.verdict {
                    Verdict::Adopt { pool } => format!("adopt into pool {pool}"),
                    Verdict::Held { pool } => format!("already its own in pool {pool}"),
                    Verdict::Outside => "outside every pool (left as it is)".to_string(),
                    Verdict::Contested { pool, clusters } => format!(
                        "pool {pool}, contested: also served by {}",
                        clusters.join(", ")
                    ),
                    Verdict::Taken { pool, holder } => {
                        format!("pool {pool}, already given to {holder}")
                    }
                    Verdict::Excluded { pool } => format!("in an exclusion of pool {pool}"),
                };
                let _ = writeln!(
                    out,
                    "    {:<width$}  {what}  ({})",
                    s.address,
                    s.services.join(", ")
                );
            }
        }
        if !a.hand_made.is_empty() {
            let _ = writeln!(out, "  hand-made MetalLB pools:");
            for h in &a.hand_made {
                let fate = match (&h.taken_over_by, h.pools.is_empty()) {
                    (Some(pool), _) => format!("to be taken over by pool {pool}"),
                    (None, true) => "outside every pool, left as it is".to_string(),
                    (None, false) => format!("in pool(s) {}, not taken over", h.pools.join(", ")),
                };
                let kept = if h.outside.is_empty() || h.pools.is_empty() {
                    String::new()
                } else {
                    format!("; kept as they are: {}", h.outside.join(", "))
                };
                let _ = writeln!(
                    out,
                    "    {}/{} [{}]: {fate}{kept}",
                    h.namespace,
                    h.name,
                    h.addresses.join(", ")
                );
            }
        }
        if !a.conflicts.is_empty() {
            let _ = writeln!(out, "  conflicts:");
            for c in &a.conflicts {
                let what = match c.kind {
                    adopt::ConflictKind::BothServe => "serves them too",
                    adopt::ConflictKind::Held => "holds them in kipam",
                    adopt::ConflictKind::TheirPoolCovers => "has a MetalLB pool covering them",
                    adopt::ConflictKind::CoversTheirs => {
                        "serves them, inside a hand-made MetalLB pool of this cluster"
                    }
                };
                let _ = writeln!(out, "    {} {what}: {}", c.with, c.addresses.join(", "));
            }
        }
        if let Some(o) = override_of(a) {
            let _ = writeln!(out, "  overrides it would set (Cluster {}):", a.cluster);
            for line in override_yaml(&o).lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
        out.push('\n');
    }
    let s = summary(&report.plan);
    let states: Vec<String> = s.states.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let verdicts: Vec<String> = s.verdicts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let _ = writeln!(
        out,
        "{} cluster(s): {}; served addresses: {}",
        s.clusters,
        if states.is_empty() {
            "none".into()
        } else {
            states.join(", ")
        },
        if verdicts.is_empty() {
            "none".into()
        } else {
            verdicts.join(", ")
        }
    );
    out.push_str("dry run: nothing was written, here or in any user cluster\n");
    out
}

/// `spec.ipam.<pool>.addresses` as YAML lines.
fn override_yaml(o: &Value) -> String {
    let mut out = String::from("spec:\n  ipam:\n");
    if let Some(ipam) = o["spec"]["ipam"].as_object() {
        for (pool, v) in ipam {
            let pieces: Vec<&str> = v["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            out.push_str(&format!(
                "    {pool}:\n      addresses: [{}]\n",
                pieces
                    .iter()
                    .map(|p| format!("\"{p}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    out
}
