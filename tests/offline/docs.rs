//! The `console` blocks of the operator guides run as written: each `$ ` line is run with
//! `sh` in a fresh copy of `docs/examples/` (the real `kipam` binary first on `PATH`), and
//! what it prints (stdout and stderr together) must be the lines that follow it. Blocks of
//! one page share the copy, in order, so a state file written by one command is read by the
//! next. `KIPAM_UPDATE_DOCS=1` writes the real output into the pages instead.

use std::path::{Path, PathBuf};
use std::process::Command;

const PAGES: [&str; 3] = ["pools.md", "operations.md", "migrate-from-kkp.md"];

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("work dir");
    for entry in std::fs::read_dir(from).expect("docs/examples").flatten() {
        if entry.path().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy example");
        }
    }
}

fn run(command: &str, dir: &Path) -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_kipam"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("{command} 2>&1"))
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .output()
        .expect("sh runs");
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// The page with every command's output replaced by what it prints now.
fn rerun(page: &str, dir: &Path) -> String {
    let mut out = Vec::new();
    let mut in_console = false;
    let mut skipping = false;
    for line in page.lines() {
        if !in_console {
            in_console = line.trim_end() == "```console";
            out.push(line.to_string());
            continue;
        }
        if line.trim_end() == "```" {
            in_console = false;
            skipping = false;
            out.push(line.to_string());
        } else if let Some(command) = line.strip_prefix("$ ") {
            out.push(line.to_string());
            let printed = run(command, dir);
            if !printed.is_empty() {
                out.extend(printed.lines().map(str::to_string));
            }
            skipping = true;
        } else if !skipping {
            out.push(line.to_string());
        }
    }
    let mut text = out.join("\n");
    text.push('\n');
    text
}

#[test]
fn console_examples_in_the_operator_guides_print_what_they_show() {
    let update = std::env::var_os("KIPAM_UPDATE_DOCS").is_some();
    let mut stale = Vec::new();
    for name in PAGES {
        let path = docs().join(name);
        let page = std::fs::read_to_string(&path).expect("page exists");
        assert!(page.contains("```console"), "{name} runs no example");
        let dir = std::env::temp_dir().join(format!(
            "kipam-docs-{}-{}",
            std::process::id(),
            name.trim_end_matches(".md")
        ));
        let _ = std::fs::remove_dir_all(&dir);
        copy_dir(&docs().join("examples"), &dir);
        let fresh = rerun(&page, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        if fresh != page {
            if update {
                std::fs::write(&path, &fresh).expect("page written");
            } else {
                let diff: Vec<String> = page
                    .lines()
                    .zip(fresh.lines())
                    .filter(|(a, b)| a != b)
                    .take(5)
                    .map(|(a, b)| format!("  doc:  {a}\n  real: {b}"))
                    .collect();
                stale.push(format!("docs/{name}:\n{}", diff.join("\n")));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "examples whose output changed (KIPAM_UPDATE_DOCS=1 cargo test --test offline docs \
         writes the real output):\n{}",
        stale.join("\n")
    );
}

/// The README's quick start prints what the README shows, on standard output and standard
/// error together: `examples/` as a seed would take it (with each cluster's Namespace before
/// its Addon) is read without a note, and the table is the one the controller walkthrough
/// checks too (`tests/controller/walkthrough.rs`).
#[test]
fn the_readme_quick_start_prints_what_it_shows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let command = readme
        .lines()
        .find(|l| l.starts_with("cargo run --release -- offline "))
        .expect("the quick start's command")
        .replace("cargo run --release --", "kipam");
    let shown: Vec<&str> = readme
        .lines()
        .skip_while(|l| !l.starts_with("CLUSTER  POOL"))
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert!(shown.len() > 10, "the README shows no output");
    let dir = std::env::temp_dir().join(format!("kipam-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("work dir");
    for name in ["examples", "addons", "templates"] {
        std::os::unix::fs::symlink(root.join(name), dir.join(name)).expect("symlink");
    }
    let printed = run(&command, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(printed, shown.join("\n").trim_end(), "`{command}`");
}

/// The example alerts parse, and every `kipam_…` series they query is one kipam exports.
#[test]
fn the_example_alerts_query_metrics_kipam_exports() {
    let text = std::fs::read_to_string(docs().join("examples/prometheusrule.yaml"))
        .expect("prometheusrule.yaml");
    let rule: serde_json::Value = serde_saphyr::from_str(&text).expect("the rule parses");
    let exported: Vec<String> = every_metric()
        .encode()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    let known = |series: &str| {
        exported.iter().any(|name| {
            series == name
                || ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .any(|suffix| series == format!("{name}{suffix}"))
        })
    };
    let mut alerts = 0;
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for r in group["rules"].as_array().expect("rules") {
            let expr = r["expr"].as_str().expect("expr");
            assert!(r["alert"].is_string() && r["for"].is_string(), "{r}");
            alerts += 1;
            let series: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|t| t.starts_with("kipam_"))
                .collect();
            assert!(!series.is_empty(), "{expr} queries no kipam metric");
            for s in series {
                assert!(
                    known(s),
                    "{s} (in {expr}) is not exported; exported: {exported:?}"
                );
            }
        }
    }
    assert!(alerts >= 10);
}

/// A registry in which every family has a series (empty families are not listed): the
/// seed's core and every room that registers metrics in it.
fn every_metric() -> std::sync::Arc<kipam::seed::metrics::Metrics> {
    use kipam::seed::metrics::{HttpLabels, HttpMetrics, HttpRouteLabels, Metrics};
    let m = Metrics::new();
    let planning = kipam::planning::metrics::Metrics::new(&m);
    let applier = kipam::applier::metrics::Metrics::new(&m);
    let api = HttpMetrics::register(&m, "api", "REST API");
    let webhook = HttpMetrics::register(&m, "webhook", "Admission webhook");
    let pool: kipam::resources::IPAMPool = serde_saphyr::from_str(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: p}\nspec:\n  datacenters:\n    dc: {type: range, poolCidr: 10.0.0.0/30, allocationRange: 1}\n",
    )
    .expect("pool parses");
    let input = kipam::validation::pool_input(&pool).expect("valid pool");
    planning.observe_plan(&kipam::planner::plan(&[input], &[], &[]));
    m.wrote("create", "x");
    m.write_failed("X", "Invalid");
    applier.addon_sync(true, std::time::Duration::ZERO);
    applier.addon_failed("Unreachable");
    applier.addon_request("apply", true, std::time::Duration::ZERO);
    applier.drift_watches("failing");
    for http in [&api, &webhook] {
        let (route, method) = ("/".to_string(), "GET".to_string());
        http.requests
            .get_or_create(&HttpLabels {
                route: route.clone(),
                method: method.clone(),
                code: "200".into(),
            })
            .inc();
        http.duration
            .get_or_create(&HttpRouteLabels { route, method })
            .observe(0.0);
    }
    m
}
