//! The shape of the code (`ARCHITECTURE.md`), checked: every `crate::…` path between the
//! top-level modules of `src/` runs downward through the layers below, and no two files of
//! one directory import each other, directly or round a longer circle.
//!
//! `cargo test --test architecture -- --nocapture` prints the module graph.
//! `KIPAM_ARCH_SRC=DIR` reads another `src/` (an older checkout, to compare).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may import only modules of a lower layer: modules of
/// one layer are siblings and know nothing of each other.
const LAYERS: &[&[&str]] = &[
    // Pure leaves: address arithmetic, durations, RBAC rules, the TLS server.
    &["address", "duration", "rbac", "tls"],
    &["allocator", "render"],
    &["resources"],
    &["planner"],
    &["validation"],
    &["reservations", "status"],
    &["desired"],
    // The shared core of the running seed: clients, caches, ledger, records, leader, metrics;
    // and beside it, the pure pool page that the API and the offline report both draw.
    &["seed", "page"],
    // Adapters: each a room of its own over the pure core (and, when it runs in the
    // controller, over the seed's core).
    &[
        "planning", "applier", "api", "webhook", "offline", "demand", "discover",
    ],
    // The composition root of `kipam controller`.
    &["controller"],
];

fn src_dir() -> PathBuf {
    match std::env::var_os("KIPAM_ARCH_SRC") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The source without comments (line, block and doc comments) and string literals, so a
/// path named in prose or a message is not an import.
fn code_of(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|c| *c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let start = 2 + hashes;
            i += rest[start..]
                .find(&close)
                .map_or(rest.len(), |e| start + e + close.len());
            out.push_str("\"\"");
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() {
                match rest.as_bytes()[j] {
                    b'\\' => j += 2,
                    b'"' => break,
                    _ => j += 1,
                }
            }
            i += (j + 1).min(rest.len());
            out.push_str("\"\"");
        } else if rest.starts_with("'\"'") {
            i += 3;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn ident_after(code: &str, at: usize) -> Option<&str> {
    let rest = &code[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// Every name `prefix` is followed by in `code` (`crate::` → top-level modules).
fn names_after<'a>(code: &'a str, prefix: &str) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    let mut from = 0;
    while let Some(found) = code[from..].find(prefix) {
        let at = from + found;
        // `crate::x` only, not `kube_standin_crate::x` or `$crate::x`.
        let before = code[..at].chars().next_back();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            if let Some(name) = ident_after(code, at + prefix.len()) {
                names.insert(name);
            }
            // `crate::{a, b::c}`.
            if code[at + prefix.len()..].starts_with('{') {
                let group = &code[at + prefix.len() + 1..];
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for part in group.split(',') {
                    if let Some(name) = part.trim().split("::").next() {
                        let name = name.trim();
                        if !name.is_empty() && name != "self" {
                            names.insert(name);
                        }
                    }
                }
            }
        }
        from = at + prefix.len();
    }
    names
}

/// The top-level module a file belongs to, and its place inside it: `src/a/b/c.rs` →
/// (`a`, [`b`, `c`]); `src/a/mod.rs` → (`a`, []).
fn module_of(src: &Path, file: &Path) -> (String, Vec<String>) {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    let top = parts.first().cloned().unwrap_or_default();
    (top, parts.into_iter().skip(1).collect())
}

struct Graph {
    /// Top-level module → the top-level modules it names.
    top: BTreeMap<String, BTreeSet<String>>,
    /// Directory (as a module path) → file → sibling files of that directory it names.
    siblings: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
}

/// The graph of the crate whose `src/` is `src`; an error when that is not one (unreadable,
/// no `lib.rs` nor `main.rs`, no top-level module): an empty graph would pass every check.
fn graph(src: &Path) -> Result<Graph, String> {
    let mut files = Vec::new();
    rust_files(src, &mut files).map_err(|e| format!("cannot read the source tree: {e}"))?;
    files.sort();
    if !["lib.rs", "main.rs"].iter().any(|f| src.join(f).is_file()) {
        return Err(format!(
            "{} has no lib.rs nor main.rs: not a crate's src/ (KIPAM_ARCH_SRC?)",
            src.display()
        ));
    }
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(src, f).0).collect();
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut siblings: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in &files {
        let (module, inner) = module_of(src, file);
        if module == "main" || module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let code = code_of(&text);
        let edges = top.entry(module.clone()).or_default();
        for name in names_after(&code, "crate::") {
            if name != module && modules.contains(name) {
                edges.insert(name.to_string());
            }
        }
        // Files of one directory naming each other: `super::x` from a file, or
        // `crate::<path>::x` naming the directory.
        if let Some((name, dir)) = inner.split_last() {
            let dir_path: Vec<&str> = std::iter::once(module.as_str())
                .chain(dir.iter().map(String::as_str))
                .collect();
            let dir_key = dir_path.join("::");
            let entry = siblings
                .entry(dir_key.clone())
                .or_default()
                .entry(name.clone())
                .or_default();
            let mut named = names_after(&code, "super::");
            named.extend(names_after(&code, &format!("crate::{dir_key}::")));
            for other in named {
                if other != name {
                    entry.insert(other.to_string());
                }
            }
        }
    }
    // Keep only the names that are files (or directories) of the same directory.
    for (dir, files) in siblings.iter_mut() {
        let known: BTreeSet<String> = files.keys().cloned().collect();
        let _ = dir;
        for named in files.values_mut() {
            named.retain(|n| known.contains(n));
        }
    }
    if top.is_empty() {
        return Err(format!(
            "{} has no top-level module besides lib.rs and main.rs: nothing to check",
            src.display()
        ));
    }
    Ok(Graph { top, siblings })
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// What is wrong with `from` naming `to`, if anything: `to` must sit in a lower layer than
/// `from` (a module outside `LAYERS` is reported on its own, see [`problems`]).
fn edge_problem(from: &str, to: &str) -> Option<String> {
    let (Some(from_layer), Some(to_layer)) = (layer_of(from), layer_of(to)) else {
        return None;
    };
    if to_layer < from_layer {
        return None;
    }
    let how = if to_layer == from_layer {
        "a sideways import: they are siblings of one layer"
    } else {
        "an upward import"
    };
    Some(format!(
        "{from} imports {to}: {to} is not in a lower layer ({how})"
    ))
}

/// Everything wrong with the graph: modules missing from `LAYERS`, imports that do not run
/// downward, circles between top-level modules and between files of one directory.
fn problems(g: &Graph) -> Vec<String> {
    let mut problems = Vec::new();
    for (module, edges) in &g.top {
        if layer_of(module).is_none() {
            problems.push(format!(
                "src/{module}: a top-level module missing from LAYERS (tests/architecture.rs) \
                 and ARCHITECTURE.md"
            ));
            continue;
        }
        problems.extend(edges.iter().filter_map(|to| edge_problem(module, to)));
    }
    for module in g.top.keys() {
        if let Some(circle) = circle_from(&g.top, module) {
            problems.push(format!("import circle: {}", circle.join(" -> ")));
        }
    }
    for (dir, files) in &g.siblings {
        for file in files.keys() {
            if let Some(circle) = circle_from(files, file) {
                problems.push(format!("import circle in {dir}: {}", circle.join(" -> ")));
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

/// A circle through `start` in `edges`, if there is one.
fn circle_from(edges: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        edges: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in edges.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(edges, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    walk(edges, start, start, &mut path, &mut seen).then_some(path)
}

#[test]
fn imports_run_downward_and_close_no_circle() {
    let src = src_dir();
    let g = match graph(&src) {
        Ok(g) => g,
        Err(e) => panic!("{e}"),
    };
    println!("module graph of {}:", src.display());
    for (module, edges) in &g.top {
        let edges: Vec<&str> = edges.iter().map(String::as_str).collect();
        println!("  {module} -> {}", edges.join(", "));
    }
    let problems = problems(&g);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_sees_an_upward_import_and_a_circle() {
    let dir = std::env::temp_dir().join(format!("kipam-arch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("render")).expect("temp dir");
    std::fs::create_dir_all(dir.join("seed")).expect("temp dir");
    let write = |path: &str, text: &str| {
        std::fs::write(dir.join(path), text).expect("write");
    };
    write("address.rs", "pub fn f() {}\n");
    // `seed` naming `planning` runs upward; a comment or a string naming it does not count.
    write(
        "seed/mod.rs",
        "use crate::planning::x; // crate::api\nconst S: &str = \"crate::webhook\";\n",
    );
    write("planning.rs", "use crate::seed::Context;\n");
    write("render/engine.rs", "use super::sandbox::Sandbox;\n");
    write("render/sandbox.rs", "use super::engine::Renderer;\n");
    write("lib.rs", "pub mod address;\n");
    write("api.rs", "use crate::address::f;\n");
    write("frobnicate.rs", "pub fn g() {}\n");
    let g = graph(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let g = match g {
        Ok(g) => g,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        g.top.get("seed").cloned().unwrap_or_default(),
        BTreeSet::from(["planning".to_string()])
    );
    assert!(circle_from(&g.top, "seed").is_some());
    let render = g.siblings.get("render").cloned().unwrap_or_default();
    assert!(circle_from(&render, "engine").is_some(), "{render:?}");
    // The whole verdict: the upward import, both circles, the module outside LAYERS; the
    // downward import of `api` passes.
    assert_eq!(
        problems(&g),
        vec![
            "import circle in render: engine -> sandbox -> engine".to_string(),
            "import circle in render: sandbox -> engine -> sandbox".to_string(),
            "import circle: planning -> seed -> planning".to_string(),
            "import circle: seed -> planning -> seed".to_string(),
            "seed imports planning: planning is not in a lower layer (an upward import)"
                .to_string(),
            "src/frobnicate: a top-level module missing from LAYERS (tests/architecture.rs) \
             and ARCHITECTURE.md"
                .to_string(),
        ]
    );
}

/// The decision on one import, against the layers as they are: downward passes; upward,
/// sideways (one layer) and onto itself do not; a module outside `LAYERS` is left to the
/// check of its own.
#[test]
fn an_import_passes_only_when_it_runs_down_a_layer() {
    for (from, to) in [
        ("allocator", "address"),
        ("controller", "planning"),
        ("planning", "seed"),
        ("seed", "desired"),
        ("page", "resources"),
    ] {
        assert_eq!(edge_problem(from, to), None, "{from} -> {to}");
    }
    for (from, to, how) in [
        ("address", "allocator", "an upward import"),
        ("seed", "planning", "an upward import"),
        ("resources", "controller", "an upward import"),
        (
            "seed",
            "page",
            "a sideways import: they are siblings of one layer",
        ),
        (
            "planning",
            "api",
            "a sideways import: they are siblings of one layer",
        ),
        (
            "render",
            "allocator",
            "a sideways import: they are siblings of one layer",
        ),
        (
            "status",
            "status",
            "a sideways import: they are siblings of one layer",
        ),
    ] {
        assert_eq!(
            edge_problem(from, to),
            Some(format!(
                "{from} imports {to}: {to} is not in a lower layer ({how})"
            )),
            "{from} -> {to}"
        );
    }
    assert_eq!(edge_problem("frobnicate", "address"), None);
    assert_eq!(edge_problem("address", "frobnicate"), None);
}

/// A `KIPAM_ARCH_SRC` that names no crate's sources is an error, not an empty graph that
/// passes: a directory that does not exist, an empty one, one without `lib.rs`/`main.rs`, and
/// one with only `lib.rs`.
#[test]
fn a_source_tree_that_is_not_a_crate_is_an_error() {
    let dir = std::env::temp_dir().join(format!("kipam-arch-empty-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let missing = graph(&dir).err();
    std::fs::create_dir_all(&dir).expect("temp dir");
    let empty = graph(&dir).err();
    std::fs::write(dir.join("address.rs"), "pub fn f() {}\n").expect("write");
    let no_root = graph(&dir).err();
    std::fs::remove_file(dir.join("address.rs")).expect("remove");
    std::fs::write(dir.join("lib.rs"), "\n").expect("write");
    let only_root = graph(&dir).err();
    let _ = std::fs::remove_dir_all(&dir);
    let missing = missing.expect("a missing directory is an error");
    assert!(
        missing.starts_with("cannot read the source tree: "),
        "{missing}"
    );
    let empty = empty.expect("an empty directory is an error");
    assert!(
        empty.ends_with("has no lib.rs nor main.rs: not a crate's src/ (KIPAM_ARCH_SRC?)"),
        "{empty}"
    );
    let no_root = no_root.expect("a directory without lib.rs is an error");
    assert!(no_root.contains("has no lib.rs nor main.rs"), "{no_root}");
    let only_root = only_root.expect("a lib.rs alone is an error");
    assert!(
        only_root.ends_with("has no top-level module besides lib.rs and main.rs: nothing to check"),
        "{only_root}"
    );
}
