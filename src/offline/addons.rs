//! `kipam offline --out DIR`: each cluster's Addons rendered, in memory first, for
//! `DIR/<cluster>/<addon>.yaml`.
//!
//! Rendering and writing are separate steps so that a run whose rendering fails writes
//! nothing at all (see [`super::out_dir`] for the writing).

use std::path::PathBuf;

use crate::desired::{add_networks, template_data};
use crate::render::Renderer;
use crate::resources::{Addon, Cluster, IPAMAllocation, IPAMPool, cluster_of_namespace};
use crate::validation::FieldError;

/// The longest name a path component written under `--out` may have (a DNS-1123 label).
pub const MAX_NAME: usize = 63;

/// One Addon rendered in memory.
#[derive(Clone, Debug)]
pub struct RenderedFile {
    pub cluster: String,
    pub addon: String,
    /// `<cluster>/<addon>.yaml`, relative to `--out`.
    pub relative: PathBuf,
    /// The YAML to write.
    pub content: String,
    /// How many objects it holds.
    pub objects: usize,
}

/// The outcome of rendering every Addon.
#[derive(Debug, Default)]
pub struct Rendering {
    pub files: Vec<RenderedFile>,
    /// One message per Addon that failed to render.
    pub errors: Vec<String>,
    /// Addons not rendered because their cluster is not in the input.
    pub skipped: Vec<String>,
}

/// Whether `name` is a DNS-1123 label of at most 63 characters: a single, plain path
/// component (no `/`, no `.`, never `..`).
pub fn is_dns1123_label(name: &str) -> bool {
    crate::validation::names::is_dns1123_label(name, crate::resources::bounds::MAX_LABEL)
}

/// The problems of an Addon's name and namespace, which end up in a file path under `--out`:
/// the name must be a DNS-1123 label, the namespace `cluster-<cluster>` with a cluster name
/// that is one too.
pub fn check_addon(addon: &Addon) -> Vec<FieldError> {
    let name = addon.metadata.name.clone().unwrap_or_default();
    let namespace = addon.metadata.namespace.clone().unwrap_or_default();
    let object = if namespace.is_empty() {
        format!("Addon {name}")
    } else {
        format!("Addon {namespace}/{name}")
    };
    let mut errors = Vec::new();
    if !is_dns1123_label(&name) {
        errors.push(FieldError {
            object: object.clone(),
            field: "metadata.name".into(),
            value: name.clone(),
            reason: format!(
                "must be a DNS-1123 label (at most {MAX_NAME} lower-case letters, digits and \
                 '-', starting and ending with a letter or digit); it names the file \
                 <cluster>/<name>.yaml under --out"
            ),
        });
    }
    match cluster_of_namespace(&namespace) {
        Some(cluster) if is_dns1123_label(&namespace) && is_dns1123_label(cluster) => {}
        _ => errors.push(FieldError {
            object,
            field: "metadata.namespace".into(),
            value: namespace,
            reason: "must be cluster-<cluster name>, a DNS-1123 label of at most 63 characters"
                .into(),
        }),
    }
    errors
}

/// Renders every Addon with its cluster's allocations (and their pools' networks), in memory.
/// Addons are expected to have passed [`check_addon`]; one that did not is reported as an
/// error here all the same.
pub fn render_all(
    renderer: &Renderer,
    addons: &[Addon],
    clusters: &[Cluster],
    allocations: &[IPAMAllocation],
    pools: &[IPAMPool],
) -> Rendering {
    let mut out = Rendering::default();
    for addon in addons {
        let name = addon.metadata.name.clone().unwrap_or_default();
        let namespace = addon.metadata.namespace.clone().unwrap_or_default();
        if let Some(e) = check_addon(addon).first() {
            out.errors.push(e.to_string());
            continue;
        }
        let cluster_name = cluster_of_namespace(&namespace)
            .unwrap_or_default()
            .to_string();
        let Some(cluster) = clusters
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(cluster_name.as_str()))
        else {
            out.skipped.push(format!(
                "Addon {namespace}/{name}: no Cluster {cluster_name} in the input, not rendered"
            ));
            continue;
        };
        // Only what the cluster holds in its datacenter: a paused cluster moved elsewhere
        // keeps its old addresses, which its addons must not announce in the new one.
        let datacenter = &cluster.spec.datacenter;
        let mut data = template_data(
            &cluster_name,
            datacenter,
            allocations.iter().filter(|a| &a.spec.dc == datacenter),
            addon.spec.variables.clone(),
        );
        add_networks(&mut data, pools);
        match renderer.render(&addon.spec.name, &data) {
            Ok(rendered) => out.files.push(RenderedFile {
                relative: PathBuf::from(&cluster_name).join(format!("{name}.yaml")),
                cluster: cluster_name,
                addon: name,
                content: rendered.to_yaml(),
                objects: rendered.objects.len(),
            }),
            Err(e) => out.errors.push(format!("Addon {namespace}/{name}: {e}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for good in ["a", "metallb", "a-1", &"x".repeat(63)] {
            assert!(is_dns1123_label(good), "{good}");
        }
        for bad in [
            "",
            "../../x",
            "/tmp/x",
            "..",
            ".",
            "a/b",
            "A",
            "-a",
            "a-",
            "a.b",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
    }
}
