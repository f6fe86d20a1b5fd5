//! What can go wrong while loading or rendering addons.
//!
//! Every message names the file (as the operator wrote its path) and, where one exists, the
//! line, followed by the cause in plain words: these texts end up in Addon conditions and on
//! the terminal of whoever is writing the template, so they must be enough to fix it.

use std::fmt;
use std::path::PathBuf;

/// An error while loading addon templates or rendering one addon for one cluster.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// A file or directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The addons or templates directory is not laid out as expected.
    #[error("{}: {reason}", path.display())]
    Layout { path: PathBuf, reason: String },

    /// A directory given by a flag (`--addons-dir`, `--templates-dir`) is missing or is not a
    /// directory. `resolved` is where a relative path led from the working directory.
    #[error(
        "{flag} {}: {problem}{}",
        path.display(),
        Resolved(resolved.as_deref())
    )]
    Directory {
        flag: &'static str,
        path: PathBuf,
        resolved: Option<PathBuf>,
        problem: DirectoryProblem,
    },

    /// A template does not parse; reported when the addons are loaded.
    #[error("{file}:{line}: syntax error: {cause}")]
    Syntax {
        file: String,
        line: usize,
        cause: String,
    },

    /// `render` was asked for an addon that has no directory.
    #[error("unknown addon {addon:?} (known addons: {})", KnownList(known))]
    UnknownAddon { addon: String, known: Vec<String> },

    /// A template failed while rendering: an undefined value, an unknown filter, a filter
    /// refusing its input, a missing import...
    ///
    /// `file` and `line` point at the failing expression, which may sit in a shared macro;
    /// `rendering` is the addon file whose rendering reached it.
    #[error("addon {addon}: {}: {cause}", Location { file, line: *line, rendering })]
    Template {
        addon: String,
        file: String,
        line: Option<usize>,
        rendering: String,
        cause: String,
    },

    /// A template used up its fuel: almost always a loop that does not end when it should.
    #[error(
        "addon {addon}: {}: the template ran out of fuel after {fuel} instructions (a runaway loop?)",
        Location { file, line: *line, rendering }
    )]
    OutOfFuel {
        addon: String,
        file: String,
        line: Option<usize>,
        rendering: String,
        fuel: u64,
    },

    /// An addon rendered more than the size bound (`--max-addon-size`), or a filter was asked
    /// to build a string larger than that.
    #[error(
        "addon {addon}: {file}: the rendered addon is larger than the {limit}-byte bound \
         (--max-addon-size); rendering stopped"
    )]
    TooLarge {
        addon: String,
        file: String,
        limit: usize,
    },

    /// A template rendered text that is not YAML.
    #[error(
        "addon {addon}: {file}: the rendered output is not valid YAML: {cause}{}",
        RenderedLine { line: *line, text }
    )]
    BadYaml {
        addon: String,
        file: String,
        /// Line in the rendered output (not in the template), when the parser knows it.
        line: Option<usize>,
        /// That line of rendered output, to show what the template produced.
        text: String,
        cause: String,
    },

    /// A rendered YAML document is not a Kubernetes object kipam can apply.
    #[error("addon {addon}: {file}: rendered document {document} {reason}")]
    BadObject {
        addon: String,
        file: String,
        /// 1-based position among the file's non-empty documents.
        document: usize,
        reason: String,
    },

    /// Two rendered documents are one object (API group, kind, namespace and name): applied
    /// in a user cluster, the second would silently replace the first.
    #[error(
        "addon {addon}: {object} is rendered twice: by {first_file} (document {first_document}) \
         and by {second_file} (document {second_document}); the second would silently replace \
         the first in the user cluster: render each object once"
    )]
    Duplicate {
        addon: String,
        /// `kind namespace/name` (the API group added when there is one).
        object: String,
        first_file: String,
        first_document: usize,
        second_file: String,
        second_document: usize,
    },

    /// Rendering needed more memory than the render sandbox allows (`--max-render-memory`):
    /// a template building ever larger strings or lists. The sandbox process was stopped; the
    /// controller and the command line are unaffected.
    #[error(
        "addon {addon}: rendering needed more than {} of memory (--max-render-memory) and was \
         stopped; does a template build ever larger strings or lists?",
        Bytes(*limit)
    )]
    MemoryExceeded { addon: String, limit: u64 },

    /// The render sandbox process could not be started, did not answer in time, or failed in
    /// a way that is not the template's fault.
    #[error("addon {addon}: the render sandbox failed: {reason}")]
    Sandbox { addon: String, reason: String },

    /// An error reported by the render sandbox, as it worded it.
    #[error("{message}")]
    Reported { message: String },
}

/// What is wrong with a directory given by a flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectoryProblem {
    /// Nothing exists at the path.
    Missing,
    /// Something other than a directory is there.
    NotADirectory,
    /// The path could not be examined (permissions, for example).
    Unreadable(String),
}

impl fmt::Display for DirectoryProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirectoryProblem::Missing => f.write_str("no such directory"),
            DirectoryProblem::NotADirectory => f.write_str("not a directory"),
            DirectoryProblem::Unreadable(why) => write!(f, "cannot be read: {why}"),
        }
    }
}

impl RenderError {
    /// The error says that a flag's directory does not exist at all.
    pub fn is_missing_directory(&self) -> bool {
        matches!(
            self,
            RenderError::Directory {
                problem: DirectoryProblem::Missing,
                ..
            }
        )
    }
}

/// ` (/the/absolute/path)` after a relative path, nothing after an absolute one.
struct Resolved<'a>(Option<&'a std::path::Path>);

impl fmt::Display for Resolved<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => write!(f, " (looked in {})", p.display()),
            None => Ok(()),
        }
    }
}

/// `file:line`, plus the addon file being rendered when the failure sits in another template.
struct Location<'a> {
    file: &'a str,
    line: Option<usize>,
    rendering: &'a str,
}

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if self.rendering != self.file {
            write!(f, " (rendering {})", self.rendering)?;
        }
        Ok(())
    }
}

struct RenderedLine<'a> {
    line: Option<usize>,
    text: &'a str,
}

impl fmt::Display for RenderedLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, " (rendered line {line}: {:?})", self.text),
            None => Ok(()),
        }
    }
}

/// A byte count as people write it: `256 MiB`, `1 GiB`, else bytes.
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KIB: u64 = 1024;
        for (unit, size) in [("GiB", KIB * KIB * KIB), ("MiB", KIB * KIB), ("KiB", KIB)] {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{} {unit}", self.0 / size);
            }
        }
        write!(f, "{} bytes", self.0)
    }
}

struct KnownList<'a>(&'a [String]);

impl fmt::Display for KnownList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.0.join(", "))
    }
}
