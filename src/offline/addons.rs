//! `kipam offline --out DIR`: each cluster's Addons rendered to `DIR/<cluster>/<addon>.yaml`.

use std::path::{Path, PathBuf};

use crate::desired::template_data;
use crate::render::Renderer;
use crate::resources::{Addon, Cluster, IPAMAllocation, cluster_of_namespace};

use super::state_file::write_atomic;

/// One Addon's outcome.
#[derive(Debug)]
pub struct RenderedFile {
    pub cluster: String,
    pub addon: String,
    /// The file written, or why nothing was.
    pub result: Result<(PathBuf, usize), String>,
}

/// Renders every Addon with its cluster's allocations and writes one file per Addon (written
/// atomically, and only when the content changed).
pub fn render_all(
    renderer: &Renderer,
    addons: &[Addon],
    clusters: &[Cluster],
    allocations: &[IPAMAllocation],
    out: &Path,
) -> Vec<RenderedFile> {
    let mut results = Vec::new();
    for addon in addons {
        let namespace = addon.metadata.namespace.clone().unwrap_or_default();
        let name = addon.metadata.name.clone().unwrap_or_default();
        let cluster_name = cluster_of_namespace(&namespace)
            .unwrap_or_default()
            .to_string();
        let result = render_one(renderer, addon, &cluster_name, clusters, allocations, out);
        results.push(RenderedFile {
            cluster: cluster_name,
            addon: name,
            result,
        });
    }
    results
}

fn render_one(
    renderer: &Renderer,
    addon: &Addon,
    cluster_name: &str,
    clusters: &[Cluster],
    allocations: &[IPAMAllocation],
    out: &Path,
) -> Result<(PathBuf, usize), String> {
    let name = addon.metadata.name.clone().unwrap_or_default();
    let namespace = addon.metadata.namespace.clone().unwrap_or_default();
    if cluster_name.is_empty() {
        return Err(format!(
            "Addon {namespace}/{name}: its namespace must be cluster-<cluster name>"
        ));
    }
    let cluster = clusters
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(cluster_name))
        .ok_or_else(|| format!("Addon {namespace}/{name}: no Cluster {cluster_name}"))?;
    let data = template_data(
        cluster_name,
        &cluster.spec.datacenter,
        allocations,
        addon.spec.variables.clone(),
    );
    let rendered = renderer
        .render(&addon.spec.name, &data)
        .map_err(|e| e.to_string())?;
    let dir = out.join(cluster_name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{name}.yaml"));
    let content = rendered.to_yaml();
    if std::fs::read_to_string(&path).ok().as_deref() != Some(content.as_str()) {
        write_atomic(&path, &content).map_err(|e| e.to_string())?;
    }
    Ok((path, rendered.objects.len()))
}
