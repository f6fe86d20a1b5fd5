//! The offline state file: a multi-document YAML stream of `IPAMAllocation` objects.
//!
//! Written atomically (a temporary file in the same directory, flushed to disk, then renamed
//! over the old one), so a crash leaves either the old or the new state, never half of one.
//! A state file that cannot be read or parsed is refused, never overwritten.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::resources::{API_VERSION, IPAMAllocation, IPAMPoolRecord};
use crate::validation::strict::{self, Kind, RawNode};

use super::manifests::{ManifestError, no_kind};
use super::yaml;

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
    #[error(
        "state file {path} exists but holds no state (it is empty, or only comments or `---`): \
         refusing to start every cluster over from nothing; restore the state (from Git, for \
         instance), or, to start from an empty state on purpose, run again with \
         --allow-empty-state"
    )]
    Empty { path: PathBuf },
    #[error(
        "the new state would be {size} bytes, more than the {limit} bytes (256 MiB) kipam reads \
         back; nothing written (split the clusters over several state files)"
    )]
    TooLarge { size: usize, limit: u64 },
}

/// What kipam writes for a state that holds nothing (every allocation released): a file
/// that says so, unlike one emptied by a merge or by hand, which is refused.
pub const EMPTY_STATE: &str = "# kipam offline state: one IPAMAllocation per cluster and pool.\n\
# This state is empty: it holds no allocation and no quarantine.\n";

/// The largest state kipam writes: what it reads back ([`super::yaml::MAX_FILE_BYTES`]).
pub const MAX_STATE_BYTES: u64 = super::yaml::MAX_FILE_BYTES;

/// The stored allocations; an absent file is an empty state.
///
/// Read as strictly as manifests: every document must be an `IPAMAllocation` of
/// `ipam.kipam.dev/v1alpha1` with only known fields of the right types (see
/// [`crate::validation::strict`]). Any problem refuses the whole file; it is never rewritten
/// by a refused run.
///
/// A file that exists must hold a state: one without any document (empty, only comments or
/// `---`, as a bad merge or a truncation leaves it) is refused, unless it is the
/// [`EMPTY_STATE`] kipam writes.
pub fn read(path: &Path) -> Result<Vec<IPAMAllocation>, StateError> {
    read_state(path, false).map(|(allocations, _)| allocations)
}

/// [`read`], also giving the quarantine records (`IPAMPoolRecord` documents holding only
/// quarantine entries; see [`super::quarantine`]). With `allow_empty`, a file without any
/// document is an empty state.
pub fn read_state(
    path: &Path,
    allow_empty: bool,
) -> Result<(Vec<IPAMAllocation>, Vec<IPAMPoolRecord>), StateError> {
    let text = match yaml::read_text(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
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
    let docs: StateDocs = yaml::parse_each(&text).map_err(|message| {
        corrupt(
            ManifestError::Yaml {
                path: path.to_path_buf(),
                message,
            }
            .to_string(),
        )
    })?;
    if docs.0.is_empty() && !allow_empty && text.trim_end() != EMPTY_STATE.trim_end() {
        return Err(StateError::Empty {
            path: path.to_path_buf(),
        });
    }
    let mut out = Vec::with_capacity(docs.0.len());
    let mut records: Vec<IPAMPoolRecord> = Vec::new();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, (line, read)) in docs.0.into_iter().enumerate() {
        let where_ = match line {
            Some(line) => format!("{}:{line}", path.display()),
            None => format!("{} (document {})", path.display(), i + 1),
        };
        let obj = match read {
            Ok(Doc::Allocation(obj)) => obj,
            Ok(Doc::Record(record)) => {
                records.push(record);
                continue;
            }
            Err(found) => {
                problems.extend(found.into_iter().map(|(line, message)| match line {
                    Some(line) => format!("{}:{line}: {message}", path.display()),
                    None => format!("{where_}: {message}"),
                }));
                continue;
            }
        };
        let key = (obj.metadata.namespace.clone(), obj.metadata.name.clone());
        if !seen.insert(key.clone()) {
            problems.push(format!(
                "{where_}: IPAMAllocation {}/{} appears twice",
                key.0.unwrap_or_default(),
                key.1.unwrap_or_default()
            ));
            continue;
        }
        out.push(obj);
    }
    if problems.is_empty() {
        Ok((out, records))
    } else {
        Err(corrupt(problems.join("\n  ")))
    }
}

/// The documents of a state file, each checked and typed as soon as it is parsed: the line it
/// starts on, and the allocation or the problems (with their lines).
#[derive(Default)]
struct StateDocs(Vec<(Option<u64>, DocResult)>);

type DocResult = Result<Doc, Vec<(Option<u64>, String)>>;

/// One document of the state file.
#[allow(clippy::large_enum_variant)] // nearly every document is an allocation
enum Doc {
    Allocation(IPAMAllocation),
    /// The quarantine of one pool datacenter.
    Record(IPAMPoolRecord),
}

impl yaml::DocumentSink for StateDocs {
    fn document(&mut self, doc: RawNode) {
        let index = self.0.len() + 1;
        self.0.push((doc.line, read_document(&doc, index)));
    }
}

fn read_document(doc: &RawNode, index: usize) -> DocResult {
    let at_doc = |message: String| Err(vec![(doc.line, message)]);
    let Some(kind) = doc.get_str("kind") else {
        return at_doc(no_kind(doc));
    };
    let api_version = doc.get_str("apiVersion").unwrap_or("");
    if kind == "IPAMPoolRecord" && api_version == API_VERSION {
        // As strict as the allocations: a misspelt field would drop the quarantine it holds.
        let name = doc
            .get("metadata")
            .and_then(|m| m.get_str("name"))
            .unwrap_or("");
        let object = format!("IPAMPoolRecord {name} (quarantine)");
        let found = strict::check_object(Kind::IPAMPoolRecord, &object, doc);
        if !found.is_empty() {
            return Err(found
                .into_iter()
                .map(|p| (p.line.or(doc.line), p.error.to_string()))
                .collect());
        }
        return serde_json::from_value::<IPAMPoolRecord>(doc.to_json())
            .map(Doc::Record)
            .or_else(|e| at_doc(format!("{object}: {e}")));
    }
    if kind != "IPAMAllocation" {
        return at_doc(format!(
            "document {index} is a {kind:?}, not an IPAMAllocation (or the IPAMPoolRecord of a quarantine)"
        ));
    }
    if api_version != API_VERSION {
        return at_doc(format!("apiVersion {api_version:?} is not {API_VERSION}"));
    }
    let metadata = doc.get("metadata");
    let name = |key: &str| metadata.and_then(|m| m.get_str(key)).unwrap_or("");
    let object = format!("IPAMAllocation {}/{}", name("namespace"), name("name"));
    let found = strict::check_object(Kind::IPAMAllocation, &object, doc);
    if !found.is_empty() {
        return Err(found
            .into_iter()
            .map(|p| (p.line.or(doc.line), p.error.to_string()))
            .collect());
    }
    serde_json::from_value(doc.to_json())
        .map(Doc::Allocation)
        .or_else(|e| at_doc(format!("{object}: {e}")))
}

/// The file content for a state: objects sorted by namespace and name.
pub fn render(objects: &[IPAMAllocation]) -> Result<String, StateError> {
    render_state(objects, &[])
}

/// [`render`], then the quarantine records (sorted by name), if any.
pub fn render_state(
    objects: &[IPAMAllocation],
    records: &[IPAMPoolRecord],
) -> Result<String, StateError> {
    if objects.is_empty() && records.is_empty() {
        return Ok(EMPTY_STATE.to_string());
    }
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
    let mut records: Vec<&IPAMPoolRecord> = records.iter().collect();
    records.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for record in records {
        out.push_str("---\n");
        let yaml =
            serde_saphyr::to_string(record).map_err(|e| StateError::Serialise(e.to_string()))?;
        out.push_str(&yaml);
    }
    Ok(out)
}

/// Replaces the file at `path` with `content`, atomically (see [`super::files::write_atomic`]:
/// exclusive temporary file next to the real target, flushed, renamed, directory flushed; a
/// symlink stays a symlink and the mode is kept). A state larger than kipam reads back
/// ([`MAX_STATE_BYTES`]) is refused before anything is written.
pub fn write_atomic(path: &Path, content: &str) -> Result<(), StateError> {
    check_size(content)?;
    super::files::write_atomic(path, content.as_bytes(), "state file").map_err(StateError::from)
}

/// Refuses a state kipam could not read back.
pub fn check_size(content: &str) -> Result<(), StateError> {
    if content.len() as u64 > MAX_STATE_BYTES {
        return Err(StateError::TooLarge {
            size: content.len(),
            limit: MAX_STATE_BYTES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 37, item 12: kipam never writes a state it would refuse to read back.
    #[test]
    fn a_state_kipam_could_not_read_back_is_not_written() {
        let dir = std::env::temp_dir().join(format!("kipam-state-size-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.yaml");
        let big = "#".repeat(super::super::yaml::MAX_FILE_BYTES as usize + 1);
        let result = write_atomic(&path, &big);
        let written = path.exists();
        let _ = std::fs::remove_dir_all(&dir);
        let err = result.expect_err("refused").to_string();
        assert!(
            err.contains("more than the 268435456 bytes (256 MiB) kipam reads"),
            "{err}"
        );
        assert!(!written, "nothing written");
    }
}
