//! Every path `kipam offline` will write, checked before anything is read or written.
//!
//! kipam writes the state file, the files under `--out` and the `--report` page. None of
//! them may be a file kipam reads (a manifest), another of its outputs, or lie where another
//! output goes: `--report state.yaml` would replace the state with an HTML page, `--state`
//! inside `--out` would be overwritten by a rendered addon. Such a command line is a usage
//! error: refused (exit 2) before the first byte is written, as is an output that cannot be
//! one (`--out` naming a file, `--report` naming a directory or in a missing directory).

use std::path::{Component, Path, PathBuf};

use super::files::{self, Target};
use super::manifests;

/// The outputs and inputs of one run.
#[derive(Clone, Copy, Debug)]
pub struct Paths<'a> {
    /// `-f`: files and directories.
    pub inputs: &'a [PathBuf],
    pub state: &'a Path,
    pub out: Option<&'a Path>,
    pub report: Option<&'a Path>,
}

/// Refuses a command line whose outputs collide with an input or with each other, or cannot
/// be written; every problem in one message.
pub fn check(paths: Paths<'_>) -> Result<(), String> {
    let mut problems: Vec<String> = Vec::new();
    let manifests: Vec<(PathBuf, PathBuf)> = match manifests::input_files(paths.inputs) {
        Ok(list) => list.into_iter().map(|f| (full(&f), f)).collect(),
        // Said by the run itself, with the file.
        Err(_) => Vec::new(),
    };
    let state = full(paths.state);
    let is_manifest = |p: &Path| manifests.iter().find(|(m, _)| m == p).map(|(_, f)| f);
    if let Some(f) = is_manifest(&state) {
        problems.push(format!(
            "--state {} is the manifest {} given with -f; the state must be a file of its own",
            paths.state.display(),
            f.display()
        ));
    }
    let out = paths.out.map(|o| (o, full(o)));
    if let Some((given, out_full)) = &out {
        match std::fs::metadata(given) {
            Ok(meta) if !meta.is_dir() => problems.push(format!(
                "--out {}: exists and is not a directory",
                given.display()
            )),
            _ => {}
        }
        if state.starts_with(out_full) {
            problems.push(format!(
                "--state {} lies inside --out {}, where kipam writes and removes rendered \
                 addons; keep the state outside it",
                paths.state.display(),
                given.display()
            ));
        }
    }
    if let Some(report) = paths.report {
        let report_full = full(report);
        if let Err(e) = files::check_existing(report, "report").map(|_: Target| ()) {
            problems.push(format!("--report: {e}"));
        }
        if report_full == state {
            problems.push(format!(
                "--report {} is the state file; the page would replace the state",
                report.display()
            ));
        }
        if let Some(f) = is_manifest(&report_full) {
            problems.push(format!(
                "--report {} is the manifest {} given with -f; the page would replace it",
                report.display(),
                f.display()
            ));
        }
        if let Some((given, out_full)) = &out
            && report_full.starts_with(out_full)
        {
            problems.push(format!(
                "--report {} lies inside --out {}, which holds the rendered addons only",
                report.display(),
                given.display()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "refusing the command line, nothing written:\n{}",
            problems
                .iter()
                .map(|p| format!("  {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        ))
    }
}

/// `path` made absolute, every symlink of the part that exists resolved and `.`/`..` of the
/// rest applied, so that two spellings of one file compare equal.
fn full(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    };
    // The longest part that exists, resolved; the rest appended as written.
    let mut existing = absolute.clone();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        if let Ok(resolved) = std::fs::canonicalize(&existing) {
            let mut out = resolved;
            for part in rest.iter().rev() {
                match Path::new(part).components().next() {
                    Some(Component::ParentDir) => {
                        out.pop();
                    }
                    Some(Component::CurDir) | None => {}
                    _ => out.push(part),
                }
            }
            return out;
        }
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => return absolute,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_path_compare_equal() {
        let dir = std::env::temp_dir().join(format!("kipam-outputs-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let a = full(&dir.join("sub").join("..").join("state.yaml"));
        let b = full(&dir.join("state.yaml"));
        assert_eq!(a, b);
        assert!(
            full(&dir.join("out").join("x").join("y.yaml")).starts_with(full(&dir.join("out")))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
