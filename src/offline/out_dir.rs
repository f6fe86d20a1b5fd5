//! Writing rendered addons under `--out DIR`, and removing the ones no longer rendered.
//!
//! kipam keeps a small index, `DIR/.kipam-index.json`, of the files it wrote. A file listed
//! there that the current run does not render (its Addon or its cluster is gone) is removed;
//! nothing else under `DIR` is ever touched, so hand-written files next to the rendered ones
//! are safe. Every path is `DIR/<cluster>/<addon>.yaml` with both names DNS-1123 labels, is
//! checked again when joined, and is never followed through a symlink: kipam never writes or
//! removes anything outside `DIR`.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::addons::{RenderedFile, is_dns1123_label};
use super::files::write_atomic;

/// The index of the files kipam wrote, relative to `--out`.
pub const INDEX_FILE: &str = ".kipam-index.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    /// What this file is, for whoever opens it.
    #[serde(default)]
    about: String,
    /// `<cluster>/<addon>.yaml` paths, sorted.
    #[serde(default)]
    files: Vec<String>,
}

/// One file under `--out`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutFile {
    pub cluster: String,
    pub addon: String,
    pub path: PathBuf,
    pub objects: usize,
    /// False when the file already held this content (left as it was).
    pub written: bool,
}

/// What writing `--out` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutReport {
    /// The files now in place (written or already up to date).
    pub files: Vec<OutFile>,
    /// Files kipam had written before that are no longer rendered, now removed.
    pub removed: Vec<PathBuf>,
    /// What could not be done, one message each; everything else was done.
    pub errors: Vec<String>,
}

/// Writes every rendered file under `out` (only those whose content changed), removes the
/// files of the previous index that are no longer rendered, then writes the new index.
pub fn write_out(out: &Path, rendered: &[RenderedFile]) -> OutReport {
    let mut report = OutReport::default();
    if let Err(e) = prepare_dir(out) {
        report.errors.push(e);
        return report;
    }
    let index_path = out.join(INDEX_FILE);
    let previous = match read_index(&index_path) {
        Ok(index) => index,
        Err(e) => {
            // Without a trustworthy index nothing is removed; the new one replaces it.
            report.errors.push(e);
            Index::default()
        }
    };
    let mut listed: BTreeSet<String> = BTreeSet::new();
    for file in rendered {
        let relative = format!("{}/{}.yaml", file.cluster, file.addon);
        match write_one(out, &file.cluster, &relative, &file.content) {
            Ok((path, written)) => {
                listed.insert(relative);
                report.files.push(OutFile {
                    cluster: file.cluster.clone(),
                    addon: file.addon.clone(),
                    path,
                    objects: file.objects,
                    written,
                });
            }
            Err(e) => {
                // Still kipam's: keep it listed so a later run can replace or remove it.
                if previous.files.contains(&relative) {
                    listed.insert(relative);
                }
                report.errors.push(e);
            }
        }
    }
    for old in &previous.files {
        if listed.contains(old) {
            continue;
        }
        match remove_one(out, old) {
            Ok(Some(path)) => report.removed.push(path),
            Ok(None) => {}
            Err(e) => {
                listed.insert(old.clone());
                report.errors.push(e);
            }
        }
    }
    let index = Index {
        about: "files written by kipam offline --out; kipam removes the ones it no longer \
                renders and never touches anything else"
            .into(),
        files: listed.into_iter().collect(),
    };
    let text = match serde_json::to_string_pretty(&index) {
        Ok(t) => t + "\n",
        Err(e) => {
            report
                .errors
                .push(format!("cannot serialise {INDEX_FILE}: {e}"));
            return report;
        }
    };
    match std::fs::symlink_metadata(&index_path) {
        // Never written through a symlink: its target could be anywhere.
        Ok(meta) if !meta.file_type().is_file() => {
            report.errors.push(format!(
                "{}: not a regular file; the index was not updated",
                index_path.display()
            ));
            return report;
        }
        Ok(_) if std::fs::read(&index_path).ok().as_deref() == Some(text.as_bytes()) => {
            return report;
        }
        _ => {}
    }
    if let Err(e) = write_atomic(&index_path, text.as_bytes(), "index") {
        report.errors.push(e.to_string());
    }
    report
}

/// Splits an index entry into `(cluster, file name)` when it is exactly
/// `<label>/<label>.yaml`; anything else (absolute, `..`, deeper) is not kipam's and is ignored.
fn entry_parts(entry: &str) -> Option<(&str, &str)> {
    let (cluster, file) = entry.split_once('/')?;
    let addon = file.strip_suffix(".yaml")?;
    (is_dns1123_label(cluster) && is_dns1123_label(addon)).then_some((cluster, file))
}

/// `out` joined with a relative path made only of plain components.
fn inside(out: &Path, relative: &str) -> Result<PathBuf, String> {
    let rel = Path::new(relative);
    if rel.components().all(|c| matches!(c, Component::Normal(_))) {
        Ok(out.join(rel))
    } else {
        Err(format!(
            "{relative}: not a plain path inside {}; refusing to write it",
            out.display()
        ))
    }
}

fn prepare_dir(out: &Path) -> Result<(), String> {
    match std::fs::metadata(out) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(format!(
            "--out {}: exists and is not a directory",
            out.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(out)
            .map_err(|e| format!("--out {}: cannot create it: {e}", out.display())),
        Err(e) => Err(format!("--out {}: {e}", out.display())),
    }
}

/// A cluster directory under `out`: created when absent, refused when it is a symlink or not a
/// directory (writing through it could land outside `out`).
fn cluster_dir(out: &Path, cluster: &str, create: bool) -> Result<Option<PathBuf>, String> {
    let dir = inside(out, cluster)?;
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.file_type().is_dir() => Ok(Some(dir)),
        Ok(_) => Err(format!(
            "{}: is not a plain directory (a symlink or a file); kipam does not write or \
             remove through it",
            dir.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !create {
                return Ok(None);
            }
            std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            Ok(Some(dir))
        }
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

fn write_one(
    out: &Path,
    cluster: &str,
    relative: &str,
    content: &str,
) -> Result<(PathBuf, bool), String> {
    if entry_parts(relative).is_none() {
        return Err(format!(
            "{relative}: not <cluster>/<addon>.yaml with DNS-1123 names; refusing to write it"
        ));
    }
    cluster_dir(out, cluster, true)?;
    let path = inside(out, relative)?;
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_file() => {
            if std::fs::read(&path).ok().as_deref() == Some(content.as_bytes()) {
                return Ok((path, false));
            }
        }
        Ok(_) => {
            return Err(format!(
                "{}: is not a regular file (a symlink, a directory, ...); kipam does not \
                 replace it",
                path.display()
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    write_atomic(&path, content.as_bytes(), "rendered addon").map_err(|e| e.to_string())?;
    Ok((path, true))
}

/// Removes a file kipam wrote before; `None` when it is already gone or the entry is not one
/// kipam could have written.
fn remove_one(out: &Path, entry: &str) -> Result<Option<PathBuf>, String> {
    let Some((cluster, _)) = entry_parts(entry) else {
        return Ok(None);
    };
    let Some(dir) = cluster_dir(out, cluster, false)? else {
        return Ok(None);
    };
    let path = inside(out, entry)?;
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_file() => {
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            // The cluster's directory goes too once nothing is left in it.
            let _ = std::fs::remove_dir(&dir);
            Ok(Some(path))
        }
        Ok(_) => Err(format!(
            "{}: listed in {INDEX_FILE} but no longer a regular file; left alone",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn read_index(path: &Path) -> Result<Index, String> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => {}
        Ok(_) => {
            return Err(format!(
                "{}: not a regular file; ignored, nothing removed",
                path.display()
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Index::default()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: not a kipam index ({e}); ignored, nothing removed",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_entries_are_kipams() {
        assert_eq!(
            entry_parts("alpha/metallb.yaml"),
            Some(("alpha", "metallb.yaml"))
        );
        for bad in [
            "../x/metallb.yaml",
            "/tmp/metallb.yaml",
            "alpha/../../etc.yaml",
            "alpha/sub/metallb.yaml",
            "alpha/metallb.yml",
            "alpha/.yaml",
            "alpha",
        ] {
            assert_eq!(entry_parts(bad), None, "{bad}");
        }
        assert!(inside(Path::new("/o"), "../x").is_err());
        assert!(inside(Path::new("/o"), "/etc/passwd").is_err());
        assert_eq!(
            inside(Path::new("/o"), "a/b.yaml").unwrap(),
            PathBuf::from("/o/a/b.yaml")
        );
    }
}
