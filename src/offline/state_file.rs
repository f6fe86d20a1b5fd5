//! The offline state file: a multi-document YAML stream of `IPAMAllocation` objects.
//!
//! Written atomically (a temporary file in the same directory, flushed to disk, then renamed
//! over the old one), so a crash leaves either the old or the new state, never half of one.
//! A state file that cannot be read or parsed is refused, never overwritten.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::resources::IPAMAllocation;

use super::manifests::parse_documents;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read state file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("state file {path} is corrupt, refusing to use or overwrite it: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("cannot write state file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot serialise the state: {0}")]
    Serialise(String),
    #[error(transparent)]
    File(#[from] super::files::FileError),
}

/// The stored allocations; an absent file is an empty state.
pub fn read(path: &Path) -> Result<Vec<IPAMAllocation>, StateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(StateError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let corrupt = |message: String| StateError::Corrupt {
        path: path.to_path_buf(),
        message,
    };
    let docs = parse_documents(path, &text).map_err(|e| corrupt(e.to_string()))?;
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, doc) in docs.into_iter().enumerate() {
        let kind = doc.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        if kind != "IPAMAllocation" {
            return Err(corrupt(format!(
                "document {} is a {kind:?}, not an IPAMAllocation",
                i + 1
            )));
        }
        let obj: IPAMAllocation =
            serde_json::from_value(doc).map_err(|e| corrupt(format!("document {}: {e}", i + 1)))?;
        let key = (obj.metadata.namespace.clone(), obj.metadata.name.clone());
        if !seen.insert(key.clone()) {
            return Err(corrupt(format!(
                "IPAMAllocation {}/{} appears twice",
                key.0.unwrap_or_default(),
                key.1.unwrap_or_default()
            )));
        }
        out.push(obj);
    }
    Ok(out)
}

/// The file content for a state: objects sorted by namespace and name.
pub fn render(objects: &[IPAMAllocation]) -> Result<String, StateError> {
    let mut sorted: Vec<&IPAMAllocation> = objects.iter().collect();
    sorted.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let mut out = String::from("# kipam offline state: one IPAMAllocation per cluster and pool.\n");
    for obj in sorted {
        out.push_str("---\n");
        let yaml =
            serde_saphyr::to_string(obj).map_err(|e| StateError::Serialise(e.to_string()))?;
        out.push_str(&yaml);
    }
    Ok(out)
}

/// Replaces the file at `path` with `content`, atomically (see [`super::files::write_atomic`]:
/// exclusive temporary file next to the real target, flushed, renamed, directory flushed; a
/// symlink stays a symlink and the mode is kept).
pub fn write_atomic(path: &Path, content: &str) -> Result<(), StateError> {
    super::files::write_atomic(path, content.as_bytes(), "state file").map_err(StateError::from)
}
