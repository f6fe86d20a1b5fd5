//! Reading IPAMPool, Cluster, Addon and IPAMAllocation manifests from files and directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::resources::{API_VERSION, Addon, Cluster, IPAMAllocation, IPAMPool};

/// Everything read, in file order.
#[derive(Clone, Debug, Default)]
pub struct Manifests {
    pub pools: Vec<IPAMPool>,
    pub clusters: Vec<Cluster>,
    pub addons: Vec<Addon>,
    pub allocations: Vec<IPAMAllocation>,
    /// Documents of other kinds, skipped (`file: kind name`).
    pub ignored: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML: {message}")]
    Yaml { path: PathBuf, message: String },
    #[error("{path}: document {index}: {message}")]
    Document {
        path: PathBuf,
        index: usize,
        message: String,
    },
    #[error("{kind} {name} is defined twice: in {first} and in {second}")]
    Duplicate {
        kind: String,
        name: String,
        first: String,
        second: String,
    },
}

/// Reads every path: a file, or a directory whose `*.yaml` / `*.yml` files are read in name
/// order (subdirectories included).
pub fn load(paths: &[PathBuf]) -> Result<Manifests, ManifestError> {
    let mut files = Vec::new();
    for path in paths {
        collect(path, &mut files)?;
    }
    let mut out = Manifests::default();
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|source| ManifestError::Read {
            path: file.clone(),
            source,
        })?;
        let docs = parse_documents(&file, &text)?;
        for (index, doc) in docs.into_iter().enumerate() {
            let where_ = format!("{} (document {})", file.display(), index + 1);
            let Some(kind) = doc.get("kind").and_then(Value::as_str).map(str::to_string) else {
                return Err(ManifestError::Document {
                    path: file.clone(),
                    index: index + 1,
                    message: "has no kind".into(),
                });
            };
            let ours = matches!(
                kind.as_str(),
                "IPAMPool" | "Cluster" | "Addon" | "IPAMAllocation"
            );
            let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
            let name = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if !ours || (kind == "Cluster" && api_version != API_VERSION) {
                out.ignored
                    .push(format!("{where_}: {api_version} {kind} {name}"));
                continue;
            }
            if api_version != API_VERSION {
                return Err(ManifestError::Document {
                    path: file.clone(),
                    index: index + 1,
                    message: format!(
                        "{kind} {name}: apiVersion {api_version:?} is not {API_VERSION} \
                         (a KKP manifest works once its apiVersion is changed)"
                    ),
                });
            }
            let namespace = doc
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let key = (kind.clone(), format!("{namespace}/{name}"));
            if let Some(first) = seen.get(&key) {
                return Err(ManifestError::Duplicate {
                    kind,
                    name: if namespace.is_empty() {
                        name
                    } else {
                        format!("{namespace}/{name}")
                    },
                    first: first.clone(),
                    second: where_,
                });
            }
            seen.insert(key, where_);
            let at = |message: String| ManifestError::Document {
                path: file.clone(),
                index: index + 1,
                message: format!("{kind} {name}: {message}"),
            };
            match kind.as_str() {
                "IPAMPool" => out.pools.push(typed(doc).map_err(at)?),
                "Cluster" => out.clusters.push(typed(doc).map_err(at)?),
                "Addon" => out.addons.push(typed(doc).map_err(at)?),
                _ => out.allocations.push(typed(doc).map_err(at)?),
            }
        }
    }
    Ok(out)
}

/// The non-empty documents of a YAML stream.
pub fn parse_documents(path: &Path, text: &str) -> Result<Vec<Value>, ManifestError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| ManifestError::Yaml {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn typed<T: DeserializeOwned>(doc: Value) -> Result<T, String> {
    serde_json::from_value(doc).map_err(|e| e.to_string())
}

fn collect(path: &Path, files: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    let meta = std::fs::metadata(path).map_err(|source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.is_dir() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let entries = std::fs::read_dir(path).map_err(|source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    for child in children {
        if child.is_dir() {
            collect(&child, files)?;
        } else if child.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(child);
        }
    }
    Ok(())
}
