//! Reading addon and shared templates from disk.
//!
//! Layout:
//! - `<addons_dir>/<addon>/*.yaml` (or `*.yml`): the templates of one addon, rendered in file
//!   name order; other files and subdirectories in an addon directory are ignored;
//! - `<templates_dir>/**`: shared templates (macros), importable from any addon by their path
//!   relative to `<templates_dir>`; a missing templates directory simply means there are none.
//!
//! Hidden entries (names starting with `.`) are skipped everywhere.

use std::fs;
use std::path::{Path, PathBuf};

use super::RenderError;
use super::error::DirectoryProblem;

/// One template read from disk.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct SourceFile {
    /// Name inside the engine: `<addon>/<file>` or the path under the templates directory.
    pub name: String,
    /// The path shown in messages.
    pub display: String,
    pub source: String,
}

/// The templates of one addon, in rendering order.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct AddonFiles {
    pub addon: String,
    pub files: Vec<SourceFile>,
}

/// Checks that `path`, given with `flag`, is a directory; the error names the flag, the path
/// as given and, for a relative path, where it led.
pub fn check_directory(path: &Path, flag: &'static str) -> Result<(), RenderError> {
    let problem = match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => DirectoryProblem::NotADirectory,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => DirectoryProblem::Missing,
        Err(e) => DirectoryProblem::Unreadable(e.to_string()),
    };
    let resolved = if path.is_absolute() {
        None
    } else {
        std::env::current_dir().ok().map(|cwd| cwd.join(path))
    };
    Err(RenderError::Directory {
        flag,
        path: path.to_path_buf(),
        resolved,
        problem,
    })
}

/// Reads every addon directory under `addons_dir`, sorted by name.
pub(crate) fn read_addons(addons_dir: &Path) -> Result<Vec<AddonFiles>, RenderError> {
    check_directory(addons_dir, "--addons-dir")?;
    let mut addons = Vec::new();
    for (addon, dir) in sorted_entries(addons_dir)? {
        if !dir.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        for (file, path) in sorted_entries(&dir)? {
            if !path.is_file() || !(file.ends_with(".yaml") || file.ends_with(".yml")) {
                continue;
            }
            files.push(SourceFile {
                name: format!("{addon}/{file}"),
                display: path.display().to_string(),
                source: read(&path)?,
            });
        }
        if files.is_empty() {
            return Err(RenderError::Layout {
                path: dir,
                reason: "the addon directory holds no *.yaml templates".to_string(),
            });
        }
        addons.push(AddonFiles { addon, files });
    }
    Ok(addons)
}

/// Reads every shared template under `templates_dir`, recursively.
pub(crate) fn read_shared(templates_dir: &Path) -> Result<Vec<SourceFile>, RenderError> {
    let mut out = Vec::new();
    if templates_dir.is_dir() {
        walk(templates_dir, "", &mut out)?;
    }
    Ok(out)
}

fn walk(dir: &Path, prefix: &str, out: &mut Vec<SourceFile>) -> Result<(), RenderError> {
    for (name, path) in sorted_entries(dir)? {
        let relative = format!("{prefix}{name}");
        if path.is_dir() {
            walk(&path, &format!("{relative}/"), out)?;
        } else if path.is_file() {
            out.push(SourceFile {
                name: relative,
                display: path.display().to_string(),
                source: read(&path)?,
            });
        }
    }
    Ok(())
}

/// The visible entries of a directory as (UTF-8 name, path), sorted by name.
fn sorted_entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, RenderError> {
    let io = |source| RenderError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            return Err(RenderError::Layout {
                path,
                reason: "file names of templates must be UTF-8".to_string(),
            });
        };
        if name.starts_with('.') {
            continue;
        }
        entries.push((name.to_string(), path.clone()));
    }
    entries.sort();
    Ok(entries)
}

fn read(path: &Path) -> Result<String, RenderError> {
    fs::read_to_string(path).map_err(|source| RenderError::Io {
        path: path.to_path_buf(),
        source,
    })
}
