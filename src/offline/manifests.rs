//! Reading IPAMPool, Cluster, Addon and IPAMAllocation manifests from files and directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::resources::{API_VERSION, Addon, Cluster, IPAMAllocation, IPAMPool};
use crate::validation::strict::{self, Kind, RawNode};

use super::yaml;

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
    #[error("invalid manifests:\n{}", .0.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<String>),
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
///
/// Every document of a kipam kind is checked strictly against its schema first (unknown
/// fields, wrong types, numbers that are not whole or do not fit; see
/// [`crate::validation::strict`]). All problems of all files are reported together.
pub fn load(paths: &[PathBuf]) -> Result<Manifests, ManifestError> {
    let mut files = Vec::new();
    for path in paths {
        collect(path, &mut files)?;
    }
    let mut out = Manifests::default();
    let mut problems = Vec::new();
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    for file in files {
        let text = yaml::read_text(&file).map_err(|source| ManifestError::Read {
            path: file.clone(),
            source,
        })?;
        let docs = parse_documents(&file, &text)?;
        for (index, doc) in docs.into_iter().enumerate() {
            let where_ = match doc.line {
                Some(line) => format!("{}:{line}", file.display()),
                None => format!("{} (document {})", file.display(), index + 1),
            };
            let Some(kind) = doc.get_str("kind").map(str::to_string) else {
                problems.push(format!("{where_}: {}", no_kind(&doc)));
                continue;
            };
            let api_version = doc.get_str("apiVersion").unwrap_or("").to_string();
            let metadata = doc.get("metadata");
            let name = metadata
                .and_then(|m| m.get_str("name"))
                .unwrap_or("")
                .to_string();
            let kipam_kind = Kind::from_name(&kind);
            // KKP's Cluster kind shares the name: a Cluster of another API group is not ours.
            // One without any apiVersion is a mistake in a kipam manifest.
            let Some(kipam_kind) = kipam_kind.filter(|_| {
                kind != "Cluster" || api_version == API_VERSION || api_version.is_empty()
            }) else {
                out.ignored
                    .push(format!("{where_}: {api_version} {kind} {name}"));
                continue;
            };
            if api_version.is_empty() {
                let mut found = vec![format!(
                    "{where_}: {kind} {name}: apiVersion: is required ({API_VERSION})"
                )];
                let object = format!("{kind} {name}");
                found.extend(
                    strict::check_object(kipam_kind, &object, &doc)
                        .iter()
                        .map(|p| located(&file, &where_, p)),
                );
                problems.extend(found);
                continue;
            }
            if api_version != API_VERSION {
                problems.push(format!(
                    "{where_}: {kind} {name}: apiVersion {api_version:?} is not {API_VERSION} \
                     (a KKP manifest works once its apiVersion is changed)"
                ));
                continue;
            }
            let namespace = metadata
                .and_then(|m| m.get_str("namespace"))
                .unwrap_or("")
                .to_string();
            let key = (kind.clone(), format!("{namespace}/{name}"));
            if let Some(first) = seen.get(&key) {
                problems.push(
                    ManifestError::Duplicate {
                        kind,
                        name: if namespace.is_empty() {
                            name
                        } else {
                            format!("{namespace}/{name}")
                        },
                        first: first.clone(),
                        second: where_,
                    }
                    .to_string(),
                );
                continue;
            }
            seen.insert(key, where_.clone());
            let object = if namespace.is_empty() {
                format!("{kind} {name}")
            } else {
                format!("{kind} {namespace}/{name}")
            };
            let found = strict::check_object(kipam_kind, &object, &doc);
            if !found.is_empty() {
                problems.extend(found.iter().map(|p| located(&file, &where_, p)));
                continue;
            }
            let at = |message: String| format!("{where_}: {object}: {message}");
            let json = doc.to_json();
            let result = match kipam_kind {
                Kind::IPAMPool => typed(json).map(|o| out.pools.push(o)),
                Kind::Cluster => typed(json).map(|o| out.clusters.push(o)),
                Kind::Addon => typed(json).map(|o| out.addons.push(o)),
                Kind::IPAMAllocation => typed(json).map(|o| out.allocations.push(o)),
            };
            if let Err(message) = result {
                problems.push(at(message));
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(ManifestError::Invalid(problems))
    }
}

/// Why a document without a `kind` is refused, with the key meant when one is close.
pub(crate) fn no_kind(doc: &RawNode) -> String {
    let mut message = "the document has no kind".to_string();
    if let strict::RawValue::Map(entries) = &doc.value
        && let Some((key, _)) = entries
            .iter()
            .find(|(k, _)| strict::suggest(k, ["kind"]).is_some())
    {
        message.push_str(&format!(" (is `{key}` meant to be `kind`?)"));
    }
    message
}

/// `file:line: message` for a problem found by the strict check (`where_` when the line of
/// the field itself is unknown).
pub(crate) fn located(file: &Path, where_: &str, problem: &strict::Problem) -> String {
    match problem.line {
        Some(line) => format!("{}:{line}: {}", file.display(), problem.error),
        None => format!("{where_}: {}", problem.error),
    }
}

/// The non-empty documents of a YAML stream, scalars kept as written.
pub fn parse_documents(path: &Path, text: &str) -> Result<Vec<RawNode>, ManifestError> {
    yaml::parse_stream(text).map_err(|message| ManifestError::Yaml {
        path: path.to_path_buf(),
        message,
    })
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
