//! Reading IPAMPool, Cluster, Addon and IPAMAllocation manifests from files and directories,
//! and the Namespaces of clusters that may come with them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::resources::{
    API_VERSION, Addon, Cluster, IPAMAllocation, IPAMPool, cluster_of_namespace,
};
use crate::validation::{
    self,
    strict::{self, Kind, RawNode},
};

use super::yaml;

/// Everything read, in file order.
#[derive(Clone, Debug, Default)]
pub struct Manifests {
    pub pools: Vec<IPAMPool>,
    pub clusters: Vec<Cluster>,
    pub addons: Vec<Addon>,
    pub allocations: Vec<IPAMAllocation>,
    /// The clusters' namespaces (`cluster-<name>`) given as `v1` Namespace documents, so that
    /// `kubectl apply` of the same files can create them before the Addons in them. Checked
    /// strictly like kipam's kinds; there is nothing to plan or render for them.
    pub namespaces: Vec<String>,
    /// Documents of other kinds, and Namespaces other than a cluster's, skipped
    /// (`file: kind name`).
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
    let files = input_files(paths)?;
    let mut out = Manifests::default();
    let mut problems = Vec::new();
    let mut seen: BTreeMap<(String, String), String> = BTreeMap::new();
    for file in files {
        let text = yaml::read_text(&file).map_err(|source| ManifestError::Read {
            path: file.clone(),
            source,
        })?;
        let docs: FileDocs = yaml::parse_each(&text).map_err(|message| ManifestError::Yaml {
            path: file.clone(),
            message,
        })?;
        for (index, doc) in docs.0.into_iter().enumerate() {
            let where_ = match doc.line {
                Some(line) => format!("{}:{line}", file.display()),
                None => format!("{} (document {})", file.display(), index + 1),
            };
            match doc.read {
                Read::Ignored(what) => out.ignored.push(format!("{where_}: {what}")),
                Read::Refused(found) => {
                    problems.extend(found.into_iter().map(|(line, message)| match line {
                        Some(line) => format!("{}:{line}: {message}", file.display()),
                        None => format!("{where_}: {message}"),
                    }));
                }
                Read::Object { key, shown, object } => {
                    if let Some(first) = seen.get(&key) {
                        problems.push(
                            ManifestError::Duplicate {
                                kind: key.0.clone(),
                                name: shown,
                                first: first.clone(),
                                second: where_,
                            }
                            .to_string(),
                        );
                        continue;
                    }
                    seen.insert(key, where_);
                    match *object {
                        Typed::Pool(o) => out.pools.push(o),
                        Typed::Cluster(o) => out.clusters.push(o),
                        Typed::Addon(o) => out.addons.push(o),
                        Typed::Allocation(o) => out.allocations.push(o),
                        Typed::Namespace(name) => out.namespaces.push(name),
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(ManifestError::Invalid(problems))
    }
}

/// The documents of one file, each read as soon as it is parsed (so a large file never holds
/// more than one document's tree at a time).
#[derive(Default)]
struct FileDocs(Vec<DocRead>);

struct DocRead {
    line: Option<u64>,
    read: Read,
}

/// What one document turned out to be. Messages carry the line they are about, when known;
/// the file is added by the caller.
enum Read {
    /// Not a kipam kind: `apiVersion kind name`.
    Ignored(String),
    Refused(Vec<(Option<u64>, String)>),
    Object {
        /// `(kind, namespace/name)`, to find an object defined twice.
        key: (String, String),
        /// The name as shown in messages (`namespace/name`, or `name`).
        shown: String,
        object: Box<Typed>,
    },
}

enum Typed {
    Pool(IPAMPool),
    Cluster(Cluster),
    Addon(Addon),
    Allocation(IPAMAllocation),
    /// A cluster's namespace, by name.
    Namespace(String),
}

impl yaml::DocumentSink for FileDocs {
    fn document(&mut self, doc: RawNode) {
        self.0.push(DocRead {
            line: doc.line,
            read: read_document(&doc),
        });
    }
}

/// Checks one document strictly and turns it into its kind's type.
fn read_document(doc: &RawNode) -> Read {
    let at_doc = |message: String| Read::Refused(vec![(doc.line, message)]);
    let Some(kind) = doc.get_str("kind") else {
        return at_doc(no_kind(doc));
    };
    let api_version = doc.get_str("apiVersion").unwrap_or("");
    let metadata = doc.get("metadata");
    let name = metadata.and_then(|m| m.get_str("name")).unwrap_or("");
    // KKP's Cluster kind shares the name: a Cluster of another API group is not ours. One
    // without any apiVersion is a mistake in a kipam manifest. Likewise only the core
    // Namespace is read.
    let Some(kipam_kind) = Kind::from_name(kind).filter(|k| match k {
        Kind::Cluster | Kind::Namespace => api_version == k.api_version() || api_version.is_empty(),
        _ => true,
    }) else {
        return Read::Ignored(format!("{api_version} {kind} {name}"));
    };
    let expected = kipam_kind.api_version();
    if !api_version.is_empty() && api_version != expected {
        return at_doc(format!(
            "{kind} {name}: apiVersion {api_version:?} is not {API_VERSION} \
             (a KKP manifest works once its apiVersion is changed)"
        ));
    }
    let namespace = metadata.and_then(|m| m.get_str("namespace")).unwrap_or("");
    let shown = if namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}/{name}")
    };
    let object = format!("{kind} {shown}");
    let mut found: Vec<(Option<u64>, String)> = Vec::new();
    if api_version.is_empty() {
        found.push((
            doc.line,
            format!("{object}: apiVersion: is required ({expected})"),
        ));
    }
    found.extend(
        strict::check_object(kipam_kind, &object, doc)
            .into_iter()
            .map(|p| (p.line.or(doc.line), p.error.to_string())),
    );
    if name.is_empty() {
        // Said here, where the file and line are known: the object has no name to be
        // found by.
        found.push((
            doc.line,
            format!("{kind}: the object has no name (metadata.name is missing or empty)"),
        ));
    }
    if !found.is_empty() {
        return Read::Refused(found);
    }
    let json = doc.to_json();
    let typed = match kipam_kind {
        Kind::IPAMPool => typed(json).map(Typed::Pool),
        Kind::Cluster => typed(json).map(Typed::Cluster),
        Kind::Addon => typed(json).map(Typed::Addon),
        Kind::IPAMAllocation => typed(json).map(Typed::Allocation),
        // Never returned by `Kind::from_name`: a record is not a manifest.
        Kind::IPAMPoolRecord => return Read::Ignored(format!("{api_version} {kind} {name}")),
        // A cluster's namespace is expected here; any other is not kipam's business.
        Kind::Namespace => match cluster_of_namespace(name) {
            Some(cluster) if validation::names::cluster_name("metadata.name", cluster).is_ok() => {
                Ok(Typed::Namespace(name.to_string()))
            }
            _ => return Read::Ignored(format!("{api_version} {kind} {name}")),
        },
    };
    match typed {
        Ok(object) => Read::Object {
            key: (kind.to_string(), format!("{namespace}/{name}")),
            shown,
            object: Box::new(object),
        },
        Err(message) => at_doc(format!("{object}: {message}")),
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

fn typed<T: DeserializeOwned>(doc: Value) -> Result<T, String> {
    serde_json::from_value(doc).map_err(|e| e.to_string())
}

/// The files `paths` name: files as given, directories' `*.yaml` / `*.yml` files in name
/// order. A file named twice (given twice, or also inside a directory given, or through a
/// symlink) is read once, where it first appears.
pub fn input_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ManifestError> {
    let mut files = Vec::new();
    for path in paths {
        collect(path, &mut files)?;
    }
    let mut seen = std::collections::HashSet::new();
    files.retain(|f| seen.insert(std::fs::canonicalize(f).unwrap_or_else(|_| f.clone())));
    Ok(files)
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
