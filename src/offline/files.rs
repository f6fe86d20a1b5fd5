//! Careful file handling for the files kipam owns: the state file and the rendered addons.
//!
//! - [`check_existing`] looks at a path before anything reads it: a regular file (possibly
//!   behind symlinks) is fine, an absent one may be created, anything else — a dangling
//!   symlink, a missing directory, a FIFO, a directory, a device — is refused with a message
//!   that names the path and what it is. Reading a FIFO would hang and treating a dangling
//!   symlink as "no state yet" would silently start from nothing; both are refused instead.
//! - [`write_atomic`] replaces a file so that a crash leaves either the old or the new
//!   content: a temporary file created exclusively next to the real target, written, flushed
//!   to disk, renamed over the target, then the directory flushed. A symlinked file stays a
//!   symlink (its target is replaced), and the file keeps its permissions.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// How many symlinks a chain may have before it is treated as a loop (as Linux does).
const MAX_SYMLINKS: usize = 40;

/// Why a file cannot be used or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{what} {path} is {kind}; refusing to use it (it must be a regular file)")]
    NotRegular {
        what: &'static str,
        path: PathBuf,
        kind: &'static str,
    },
    #[error(
        "{what} {path} is a symlink to {target}, which does not exist; refusing to start from \
         nothing (create the target or remove the link)"
    )]
    Dangling {
        what: &'static str,
        path: PathBuf,
        target: PathBuf,
    },
    #[error("{what} {path}: its directory {dir} does not exist")]
    MissingDirectory {
        what: &'static str,
        path: PathBuf,
        dir: PathBuf,
    },
    #[error(
        "{what} {path} is in use by another kipam run (it holds the lock {lock}); run again \
         when it has finished"
    )]
    Locked {
        what: &'static str,
        path: PathBuf,
        lock: PathBuf,
    },
    #[error("{what} {path}: too many levels of symlinks")]
    SymlinkLoop { what: &'static str, path: PathBuf },
    #[error(
        "{what} {path} was replaced, but its directory could not be flushed to disk, so the \
         change may not survive a crash: {source}"
    )]
    DirectorySync {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot {action} {what} {path}: {source}")]
    Io {
        action: &'static str,
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What a path leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A regular file, at this path once every symlink is followed.
    Regular(PathBuf),
    /// Nothing, and the directory it would go in exists: the file may be created.
    Absent,
}

/// Follows `path` through its symlinks and checks what is at the end. `what` names the file in
/// messages (`"state file"`).
pub fn check_existing(path: &Path, what: &'static str) -> Result<Target, FileError> {
    let resolved = resolve(path, what)?;
    match std::fs::symlink_metadata(&resolved) {
        Ok(meta) if meta.file_type().is_file() => Ok(Target::Regular(resolved)),
        Ok(meta) => Err(FileError::NotRegular {
            what,
            path: path.to_path_buf(),
            kind: describe(&meta.file_type()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if resolved != path {
                return Err(FileError::Dangling {
                    what,
                    path: path.to_path_buf(),
                    target: resolved,
                });
            }
            let dir = parent_dir(path);
            match std::fs::metadata(&dir) {
                Ok(meta) if meta.is_dir() => Ok(Target::Absent),
                Ok(_) | Err(_) => Err(FileError::MissingDirectory {
                    what,
                    path: path.to_path_buf(),
                    dir,
                }),
            }
        }
        Err(source) => Err(FileError::Io {
            action: "inspect",
            what,
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// An exclusive lock on a file kipam reads and rewrites, held until dropped.
#[derive(Debug)]
pub struct FileLock {
    _file: Option<File>,
}

/// Takes the lock of the file at `path` (after [`check_existing`]): an advisory lock on
/// `.<name>.lock` next to the final target, so two runs on one state file (through any
/// symlink) never both read it and then overwrite each other's allocations. Refused at once
/// when another run holds it. In a directory kipam cannot write, there is no lock (nor any
/// write to protect).
pub fn lock(path: &Path, what: &'static str) -> Result<FileLock, FileError> {
    let target = match check_existing(path, what)? {
        Target::Regular(resolved) => resolved,
        Target::Absent => path.to_path_buf(),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let lock_path = parent_dir(&target).join(format!(".{name}.lock"));
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
    {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            return Ok(FileLock { _file: None });
        }
        Err(source) => {
            return Err(FileError::Io {
                action: "create the lock of",
                what,
                path: path.to_path_buf(),
                source,
            });
        }
    };
    match file.try_lock() {
        Ok(()) => Ok(FileLock { _file: Some(file) }),
        Err(std::fs::TryLockError::WouldBlock) => Err(FileError::Locked {
            what,
            path: path.to_path_buf(),
            lock: lock_path,
        }),
        Err(std::fs::TryLockError::Error(source)) => Err(FileError::Io {
            action: "lock",
            what,
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Replaces the content of the file at `path` atomically (see the module docs). The file
/// must be a regular file or absent; when `path` is a symlink, its final target is replaced
/// and the link is left as it is. The new file keeps the old one's permissions.
pub fn write_atomic(path: &Path, content: &[u8], what: &'static str) -> Result<(), FileError> {
    let target = match check_existing(path, what)? {
        Target::Regular(resolved) => resolved,
        Target::Absent => path.to_path_buf(),
    };
    let io = |action: &'static str, source: std::io::Error| FileError::Io {
        action,
        what,
        path: path.to_path_buf(),
        source,
    };
    let permissions = match std::fs::metadata(&target) {
        Ok(meta) => Some(meta.permissions()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("inspect", e)),
    };
    let dir = parent_dir(&target);
    let (tmp, mut file) =
        create_temporary(&dir, &target).map_err(|e| io("create a temporary file for", e))?;
    let result = (|| {
        if let Some(permissions) = permissions {
            file.set_permissions(permissions)
                .map_err(|e| io("copy the permissions of", e))?;
        }
        file.write_all(content).map_err(|e| io("write", e))?;
        file.sync_all().map_err(|e| io("flush", e))?;
        drop(file);
        std::fs::rename(&tmp, &target).map_err(|e| io("replace", e))?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return result;
    }
    // The rename is durable once the directory itself is flushed.
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| FileError::DirectorySync {
            what,
            path: path.to_path_buf(),
            source,
        })
}

/// Follows the symlink chain of `path`, returning the final path (which may not exist).
fn resolve(path: &Path, what: &'static str) -> Result<PathBuf, FileError> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_SYMLINKS {
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let link = std::fs::read_link(&current).map_err(|source| FileError::Io {
                    action: "read the symlink",
                    what,
                    path: current.clone(),
                    source,
                })?;
                current = if link.is_absolute() {
                    link
                } else {
                    parent_dir(&current).join(link)
                };
            }
            Ok(_) => return Ok(current),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(current),
            Err(source) => {
                return Err(FileError::Io {
                    action: "inspect",
                    what,
                    path: current,
                    source,
                });
            }
        }
    }
    Err(FileError::SymlinkLoop {
        what,
        path: path.to_path_buf(),
    })
}

/// Removes the temporary files a run stopped mid-write (killed, or the machine went down)
/// left next to the file at `path`: `.<name>.kipam-tmp-<pid>-<n>`, of a process `pid` that
/// no longer exists. Those of a live process, and every other file, are left alone. Returns
/// what was removed. Call it while holding the file's [`lock`].
pub fn remove_leftovers(path: &Path, what: &'static str) -> Vec<PathBuf> {
    let target = match check_existing(path, what) {
        Ok(Target::Regular(resolved)) => resolved,
        _ => path.to_path_buf(),
    };
    let Some(name) = target.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return Vec::new();
    };
    let prefix = format!(".{name}.kipam-tmp-");
    let Ok(entries) = std::fs::read_dir(parent_dir(&target)) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = file_name.strip_prefix(&prefix) else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), true) = (pid.parse::<u32>(), n.parse::<u64>().is_ok()) else {
            continue;
        };
        if pid == std::process::id() || process_exists(pid) {
            continue;
        }
        // Only a regular file: never follow or remove anything else.
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        if is_file && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed.sort();
    removed
}

/// Whether a process `pid` exists (when unsure, it does).
fn process_exists(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return true;
        };
        if pid <= 0 {
            return true;
        }
        // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
        let found = unsafe { libc::kill(pid, 0) };
        found == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// A new file next to `target`, created exclusively (never opening something that is
/// already there, whoever put it there).
fn create_temporary(dir: &Path, target: &Path) -> std::io::Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let mut last = None;
    for _ in 0..16 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.kipam-tmp-{}-{n}", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free temporary file name")))
}

/// The directory a path sits in (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// What a non-regular file is, in words.
fn describe(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_char_device() {
            return "a character device";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symlink"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);

    impl Dir {
        fn new(name: &str) -> Dir {
            let dir =
                std::env::temp_dir().join(format!("kipam-files-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Dir(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn absent_file_in_an_existing_directory_may_be_created() {
        let d = Dir::new("absent");
        let p = d.0.join("state.yaml");
        assert_eq!(check_existing(&p, "state file").unwrap(), Target::Absent);
        write_atomic(&p, b"hello", "state file").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "hello");
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&d.0).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn missing_directory_is_refused() {
        let d = Dir::new("nodir");
        let p = d.0.join("nope").join("state.yaml");
        let err = check_existing(&p, "state file").unwrap_err().to_string();
        assert!(err.contains("does not exist"), "{err}");
        assert!(write_atomic(&p, b"x", "state file").is_err());
    }

    #[cfg(unix)]
    #[test]
    fn symlink_chain_is_followed_and_kept() {
        let d = Dir::new("chain");
        let real = d.0.join("real.yaml");
        std::fs::write(&real, "old").unwrap();
        std::os::unix::fs::symlink("real.yaml", d.0.join("one")).unwrap();
        std::os::unix::fs::symlink(d.0.join("one"), d.0.join("two")).unwrap();
        let two = d.0.join("two");
        assert_eq!(
            check_existing(&two, "state file").unwrap(),
            Target::Regular(real.clone())
        );
        write_atomic(&two, b"new", "state file").unwrap();
        assert!(
            std::fs::symlink_metadata(&two)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(
            std::fs::symlink_metadata(d.0.join("one"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
    }

    #[cfg(unix)]
    #[test]
    fn symlink_loop_is_refused() {
        let d = Dir::new("loop");
        std::os::unix::fs::symlink("b", d.0.join("a")).unwrap();
        std::os::unix::fs::symlink("a", d.0.join("b")).unwrap();
        let err = check_existing(&d.0.join("a"), "state file").unwrap_err();
        assert!(matches!(err, FileError::SymlinkLoop { .. }), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn mode_is_kept() {
        use std::os::unix::fs::PermissionsExt;
        let d = Dir::new("mode");
        let p = d.0.join("state.yaml");
        std::fs::write(&p, "old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&p, b"new", "state file").unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o640);
    }

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let d = Dir::new("lock");
        let p = d.0.join("state.yaml");
        let first = lock(&p, "state file").unwrap();
        let err = lock(&p, "state file").unwrap_err().to_string();
        assert!(err.contains("in use by another kipam run"), "{err}");
        assert!(err.contains(".state.yaml.lock"), "{err}");
        drop(first);
        assert!(lock(&p, "state file").is_ok());
    }

    #[test]
    fn a_directory_is_not_a_file() {
        let d = Dir::new("isdir");
        let err = check_existing(&d.0, "state file").unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
    }
}
