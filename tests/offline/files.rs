//! Issue 11, the file half: the state file is precious (atomic, symlinks, non-regular files
//! refused, mass releases guarded), `--out` stays inside its directory and is all or nothing,
//! and what kipam prints is readable by people and parseable by scripts.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{POOL, Workdir, clusters, kipam, text};

fn kipam_with(args: &[&str], extra: &[&Path]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kipam"));
    cmd.args(args);
    for p in extra {
        cmd.arg(p);
    }
    cmd.output().expect("run kipam")
}

/// `kipam offline -f FILE --state STATE [more...]`.
fn offline_with(file: &Path, state: &Path, more: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kipam"));
    cmd.arg("offline")
        .arg("-f")
        .arg(file)
        .arg("--state")
        .arg(state);
    cmd.args(more);
    cmd.output().expect("run kipam")
}

fn addon(cluster: &str, name: &str, addon: &str) -> String {
    format!(
        "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Addon\nmetadata:\n  name: {name}\n  namespace: cluster-{cluster}\nspec:\n  name: {addon}\n"
    )
}

/// An addon directory with one addon `cm` rendering a ConfigMap with the cluster's name,
/// failing for a cluster named `broken`, and an addon `big` whose output is 1,000 lines.
fn addons_dir(w: &Workdir) -> PathBuf {
    let dir = w.path("addons");
    std::fs::create_dir_all(dir.join("cm")).unwrap();
    std::fs::create_dir_all(dir.join("big")).unwrap();
    std::fs::write(
        dir.join("cm").join("10_cm.yaml"),
        "{% if Cluster.Name == \"broken\" %}{{ fail(\"cannot render for broken\") }}{% endif %}\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ipam-{{ Cluster.Name }}\ndata:\n  cluster: {{ Cluster.Name }}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("big").join("10_big.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: big\ndata:\n{% for i in range(1000) %}  k{{ i }}: \"{{ 'x' * 100 }}\"\n{% endfor %}",
    )
    .unwrap();
    dir
}

fn out_args<'a>(out: &'a str, addons: &'a str) -> Vec<&'a str> {
    // No shared templates: a templates directory that does not exist.
    vec![
        "--out",
        out,
        "--addons-dir",
        addons,
        "--templates-dir",
        "/nonexistent/kipam",
    ]
}

#[cfg(unix)]
#[test]
fn symlinked_state_stays_a_symlink_and_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let w = Workdir::new("symlink-state");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a"])));
    std::fs::create_dir_all(w.path("real")).unwrap();
    let real = w.path("real/state.yaml");
    // An existing state, read-write for its owner and readable by its group only.
    assert_eq!(offline_with(&files, &real, &[]).status.code(), Some(0));
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
    let link = w.path("state.yaml");
    std::os::unix::fs::symlink("real/state.yaml", &link).unwrap();

    std::fs::write(&files, format!("{POOL}{}", clusters(&["a", "b"]))).unwrap();
    let run = offline_with(&files, &link, &[]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let meta = std::fs::symlink_metadata(&link).unwrap();
    assert!(
        meta.file_type().is_symlink(),
        "the link was replaced by a file"
    );
    let saved = std::fs::read_to_string(&real).unwrap();
    assert!(saved.contains("namespace: cluster-b"), "{saved}");
    let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o640, "the mode of the state file is kept");
    // No temporary file is left next to the target (only the state and its lock).
    let mut left: Vec<String> = std::fs::read_dir(w.path("real"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, [".state.yaml.lock", "state.yaml"]);
}

#[test]
fn a_concurrent_run_on_the_same_state_is_refused() {
    let w = Workdir::new("locked");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a"])));
    let state = w.path("state.yaml");
    assert_eq!(offline_with(&files, &state, &[]).status.code(), Some(0));
    let saved = w.read("state.yaml");
    // Another run holds the lock.
    let held = std::fs::File::open(w.path(".state.yaml.lock")).expect("lock file");
    held.lock().expect("lock");
    std::fs::write(&files, format!("{POOL}{}", clusters(&["a", "b"]))).unwrap();
    let run = offline_with(&files, &state, &[]);
    assert_eq!(run.status.code(), Some(2));
    let err = text(&run.stderr);
    assert!(err.contains("in use by another kipam run"), "{err}");
    assert_eq!(w.read("state.yaml"), saved);
    drop(held);
    assert_eq!(offline_with(&files, &state, &[]).status.code(), Some(0));
}

#[cfg(unix)]
#[test]
fn dangling_symlink_is_refused_not_a_fresh_start() {
    let w = Workdir::new("dangling");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a"])));
    let link = w.path("state.yaml");
    std::os::unix::fs::symlink("gone/state.yaml", &link).unwrap();
    let run = offline_with(&files, &link, &[]);
    assert_eq!(run.status.code(), Some(2));
    let err = text(&run.stderr);
    assert!(err.contains("which does not exist"), "{err}");
    assert!(err.contains("state.yaml"), "{err}");
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(!w.path("gone").exists());
}

#[cfg(unix)]
#[test]
fn fifo_state_is_refused_without_hanging() {
    let w = Workdir::new("fifo");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a"])));
    let fifo = w.path("state.yaml");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .arg("offline")
        .arg("-f")
        .arg(&files)
        .arg("--state")
        .arg(&fifo)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kipam");
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("kipam hung on a FIFO state file");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("is a FIFO"), "{err}");
}

#[test]
fn missing_directory_is_refused_and_missing_file_is_announced() {
    let w = Workdir::new("missing");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a"])));
    let run = offline_with(&files, &w.path("no/such/dir/state.yaml"), &[]);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        text(&run.stderr).contains("does not exist"),
        "{}",
        text(&run.stderr)
    );
    assert!(!w.path("no").exists());

    let state = w.path("state.yaml");
    let run = offline_with(&files, &state, &[]);
    assert_eq!(run.status.code(), Some(0));
    let out = text(&run.stdout);
    assert!(
        out.contains(&format!(
            "state {}: written (a new file: there was no state file, so kipam started from an empty state)",
            state.display()
        )),
        "{out}"
    );
    let again = text(&offline_with(&files, &state, &[]).stdout);
    assert!(
        again.contains("unchanged") && !again.contains("new file"),
        "{again}"
    );
}

#[test]
fn releasing_most_of_the_state_needs_allow_release() {
    let w = Workdir::new("guard");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a", "b", "c"])));
    let state = w.path("state.yaml");
    offline_with(&files, &state, &[]);
    let saved = w.read("state.yaml");

    // The clusters file forgotten: every allocation would go.
    let pools_only = w.write("pools.yaml", POOL);
    let run = offline_with(&pools_only, &state, &[]);
    assert_eq!(run.status.code(), Some(2), "{}", text(&run.stdout));
    let err = text(&run.stderr);
    assert!(
        err.contains("this run would release every allocation of the state"),
        "{err}"
    );
    assert!(
        err.contains("clusters missing from the input: a ("),
        "{err}"
    );
    assert!(err.contains("--allow-release"), "{err}");
    assert_eq!(w.read("state.yaml"), saved, "nothing written");

    // Two of three clusters gone: more than half.
    std::fs::write(&files, format!("{POOL}{}", clusters(&["a"]))).unwrap();
    let run = offline_with(&files, &state, &[]);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        text(&run.stderr).contains("more than half"),
        "{}",
        text(&run.stderr)
    );
    assert_eq!(w.read("state.yaml"), saved);

    // Every pool forgotten.
    let clusters_only = w.write("clusters.yaml", &clusters(&["a", "b", "c"]));
    let run = offline_with(&clusters_only, &state, &[]);
    assert_eq!(run.status.code(), Some(2));
    assert!(
        text(&run.stderr).contains("pools missing from the input: big ("),
        "{}",
        text(&run.stderr)
    );
    assert_eq!(w.read("state.yaml"), saved);

    // Asked for: released.
    let run = offline_with(&files, &state, &["--allow-release"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let now = w.read("state.yaml");
    assert!(
        !now.contains("cluster-b") && !now.contains("cluster-c"),
        "{now}"
    );
}

#[test]
fn a_datacenter_typo_does_not_release() {
    let w = Workdir::new("dc-typo");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a", "b", "c"])));
    let state = w.path("state.yaml");
    offline_with(&files, &state, &[]);
    let saved = w.read("state.yaml");
    let typo = clusters(&["a", "b", "c"]).replacen("datacenter: dc-1", "datacenter: dc-l", 1);
    std::fs::write(&files, format!("{POOL}{typo}")).unwrap();
    let run = offline_with(&files, &state, &[]);
    assert_eq!(run.status.code(), Some(2), "{}", text(&run.stdout));
    let err = text(&run.stderr);
    assert!(
        err.contains("no pool serves datacenter `dc-l`; did you mean `dc-1`?"),
        "{err}"
    );
    assert_eq!(w.read("state.yaml"), saved);
}

#[test]
fn addon_names_cannot_leave_out() {
    let w = Workdir::new("escape");
    let addons = addons_dir(&w);
    let out = w.path("out");
    let escaped = w.path("escaped");
    for name in [
        "../../x".to_string(),
        escaped.display().to_string(),
        "UPPER".to_string(),
        "x".repeat(64),
    ] {
        let files = w.write(
            "in.yaml",
            &format!("{POOL}{}{}", clusters(&["a"]), addon("a", &name, "cm")),
        );
        let state = w.path("state.yaml");
        let run = offline_with(
            &files,
            &state,
            &out_args(out.to_str().unwrap(), addons.to_str().unwrap()),
        );
        assert_eq!(run.status.code(), Some(2), "{name}: {}", text(&run.stdout));
        let err = text(&run.stderr);
        assert!(err.contains("metadata.name"), "{err}");
        assert!(err.contains("DNS-1123 label"), "{err}");
        assert!(!w.path("escaped.yaml").exists(), "{name} escaped --out");
        assert!(!out.exists(), "nothing written for {name}");
        assert!(!state.exists(), "nothing written for {name}");
        // `kipam validate` applies the same rule.
        let run = kipam(&["validate", "-f", files.to_str().unwrap()]);
        assert_eq!(run.status.code(), Some(1));
        assert!(text(&run.stderr).contains("DNS-1123 label"), "{name}");
    }
}

#[test]
fn out_removes_only_what_kipam_wrote() {
    let w = Workdir::new("prune");
    let addons = addons_dir(&w);
    let out = w.path("out");
    let state = w.path("state.yaml");
    let args = out_args(out.to_str().unwrap(), addons.to_str().unwrap());
    let pool = POOL.replace("10.0.0.0/29", "10.0.0.0/28");
    let files = w.write(
        "in.yaml",
        &format!(
            "{pool}{}{}{}{}",
            clusters(&["a", "b", "c"]),
            addon("a", "cm", "cm"),
            addon("b", "cm", "cm"),
            addon("c", "cm", "cm")
        ),
    );
    let run = offline_with(&files, &state, &args);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    assert!(out.join("b/cm.yaml").exists());
    // Files kipam did not write, next to the rendered ones.
    std::fs::write(out.join("b/notes.yaml"), "mine").unwrap();
    std::fs::create_dir_all(out.join("z")).unwrap();
    std::fs::write(out.join("z/cm.yaml"), "mine too").unwrap();

    // b's Addon removed, c's cluster removed (with its Addon).
    std::fs::write(
        &files,
        format!("{pool}{}{}", clusters(&["a", "b"]), addon("a", "cm", "cm")),
    )
    .unwrap();
    let run = offline_with(&files, &state, &args);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let printed = text(&run.stdout);
    assert!(printed.contains("removed"), "{printed}");
    assert!(out.join("a/cm.yaml").exists());
    assert!(!out.join("b/cm.yaml").exists(), "{printed}");
    assert!(!out.join("c/cm.yaml").exists(), "{printed}");
    assert!(
        !out.join("c").exists(),
        "an emptied cluster directory goes too"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("b/notes.yaml")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("z/cm.yaml")).unwrap(),
        "mine too"
    );
    let index = std::fs::read_to_string(out.join(".kipam-index.json")).unwrap();
    assert!(
        index.contains("a/cm.yaml") && !index.contains("b/cm.yaml"),
        "{index}"
    );

    // A tampered index never leads outside --out.
    let victim = w.write("victim.yaml", "keep me");
    std::fs::write(
        out.join(".kipam-index.json"),
        format!(
            "{{\"files\": [\"../victim.yaml\", \"{}\", \"a/../../victim.yaml\"]}}",
            victim.display()
        ),
    )
    .unwrap();
    let run = offline_with(&files, &state, &args);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");

    // Nor does a symlinked index or cluster directory.
    #[cfg(unix)]
    {
        std::fs::remove_file(out.join(".kipam-index.json")).unwrap();
        std::os::unix::fs::symlink(&victim, out.join(".kipam-index.json")).unwrap();
        let elsewhere = w.path("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::remove_dir_all(out.join("a")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, out.join("a")).unwrap();
        let run = offline_with(&files, &state, &args);
        assert_eq!(run.status.code(), Some(1));
        let err = text(&run.stderr);
        assert!(err.contains("is not a plain directory"), "{err}");
        assert!(err.contains("the index was not updated"), "{err}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}

#[test]
fn a_failed_render_writes_nothing() {
    let w = Workdir::new("all-or-nothing");
    let addons = addons_dir(&w);
    let out = w.path("out");
    let state = w.path("state.yaml");
    let args = out_args(out.to_str().unwrap(), addons.to_str().unwrap());
    let files = w.write(
        "in.yaml",
        &format!("{POOL}{}{}", clusters(&["a"]), addon("a", "cm", "cm")),
    );
    assert_eq!(offline_with(&files, &state, &args).status.code(), Some(0));
    let saved = w.read("state.yaml");
    let rendered = std::fs::read_to_string(out.join("a/cm.yaml")).unwrap();

    // A new cluster whose addon fails: its allocation is not stored, a's file stays.
    std::fs::write(
        &files,
        format!(
            "{POOL}{}{}{}",
            clusters(&["a", "broken"]),
            addon("a", "cm", "cm"),
            addon("broken", "cm", "cm")
        ),
    )
    .unwrap();
    let run = offline_with(&files, &state, &args);
    assert_eq!(run.status.code(), Some(1));
    let err = text(&run.stderr);
    assert!(err.contains("cannot render for broken"), "{err}");
    assert!(err.contains("nothing written"), "{err}");
    assert_eq!(w.read("state.yaml"), saved, "the state is unchanged");
    assert_eq!(
        std::fs::read_to_string(out.join("a/cm.yaml")).unwrap(),
        rendered
    );
    assert!(!out.join("broken").exists());
}

#[test]
fn a_template_that_builds_an_ever_larger_string_is_stopped_by_the_memory_bound() {
    let w = Workdir::new("memory");
    let addons = addons_dir(&w);
    // 16 bytes doubled 25 times: 512 MiB that is never printed, so neither fuel nor the
    // output bound sees it.
    std::fs::create_dir_all(addons.join("grow")).unwrap();
    std::fs::write(
        addons.join("grow").join("10_grow.yaml"),
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}\n\
         {% for i in range(25) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: grow\n",
    )
    .unwrap();
    let out = w.path("out");
    let state = w.path("state.yaml");
    let files = w.write(
        "in.yaml",
        &format!(
            "{POOL}{}{}{}",
            clusters(&["a"]),
            addon("a", "cm", "cm"),
            addon("a", "grow", "grow")
        ),
    );
    let mut args = out_args(out.to_str().unwrap(), addons.to_str().unwrap());
    args.extend(["--max-render-memory", "64MiB"]);
    let run = offline_with(&files, &state, &args);
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stderr));
    let err = text(&run.stderr);
    assert!(
        err.contains(
            "Addon cluster-a/grow: addon grow: rendering needed more than 64 MiB of memory \
             (--max-render-memory) and was stopped"
        ),
        "{err}"
    );
    // All or nothing: the other addon of the run is not written, nor the state.
    assert!(!state.exists() && !out.join("a").exists());

    // `kipam render` says the same and exits 1.
    let one = kipam_with(
        &[
            "render",
            "--addon",
            "grow",
            "--name",
            "a",
            "--addons-dir",
            addons.to_str().unwrap(),
            "--templates-dir",
            "/nonexistent/kipam",
            "--max-render-memory",
            "64MiB",
            "--cluster",
        ],
        &[&files],
    );
    assert_eq!(one.status.code(), Some(1), "{}", text(&one.stderr));
    assert!(
        text(&one.stderr).contains("addon grow: rendering needed more than 64 MiB"),
        "{}",
        text(&one.stderr)
    );
}

#[test]
fn an_addon_over_the_size_bound_fails_with_its_name() {
    let w = Workdir::new("size");
    let addons = addons_dir(&w);
    let out = w.path("out");
    let state = w.path("state.yaml");
    let files = w.write(
        "in.yaml",
        &format!("{POOL}{}{}", clusters(&["a"]), addon("a", "big", "big")),
    );
    let mut args = out_args(out.to_str().unwrap(), addons.to_str().unwrap());
    args.extend(["--max-addon-size", "64KiB"]);
    let run = offline_with(&files, &state, &args);
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stdout));
    let err = text(&run.stderr);
    assert!(err.contains("addon big"), "{err}");
    assert!(err.contains("65536-byte bound"), "{err}");
    assert!(!state.exists() && !out.join("a").exists());

    // The default bound (4 MiB) lets its ~110 KB through.
    let args = out_args(out.to_str().unwrap(), addons.to_str().unwrap());
    let run = offline_with(&files, &state, &args);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));

    let bad = run_bad_size(&files, &state);
    assert_eq!(bad.status.code(), Some(2));
}

fn run_bad_size(files: &Path, state: &Path) -> Output {
    offline_with(files, state, &["--out", "x", "--max-addon-size", "lots"])
}

#[test]
fn single_addresses_and_big_counts_read_well() {
    let w = Workdir::new("readable");
    let pool = "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: one
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/24
      allocationRange: 1
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: wide
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 2001:db8::/64
      allocationRange: 16
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: nets
spec:
  datacenters:
    dc-1:
      type: prefix
      poolCidr: 2001:db8:1::/48
      allocationPrefix: 64
";
    let files = w.write("in.yaml", &format!("{pool}{}", clusters(&["a", "b"])));
    let state = w.path("state.yaml");
    let run = offline_with(&files, &state, &[]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let out = text(&run.stdout);
    assert!(out.contains("  10.0.0.0  "), "{out}");
    assert!(!out.contains("10.0.0.0-10.0.0.0"), "{out}");
    assert!(!out.contains("18446744073709551584"), "{out}");
    assert!(out.contains("1.8e19"), "{out}");
    assert!(out.contains("65534 /64s"), "{out}");
    // Stored as before: `first-last`, as KKP writes it.
    let saved = w.read("state.yaml");
    assert!(saved.contains("10.0.0.0-10.0.0.0"), "{saved}");
    // A state holding the short form is read too, and the cluster keeps its address.
    std::fs::write(&state, saved.replace("10.0.0.0-10.0.0.0", "10.0.0.0")).unwrap();
    let run = offline_with(&files, &state, &[]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let out = text(&run.stdout);
    assert!(
        out.contains("one   dc-1        range   10.0.0.0  "),
        "{out}"
    );
    assert!(!out.contains("created"), "{out}");
}

#[test]
fn json_and_yaml_for_scripts() {
    let w = Workdir::new("json");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a", "b", "c"])));
    let state = w.path("state.yaml");
    let run = offline_with(&files, &state, &["-o", "json"]);
    assert_eq!(run.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON on stdout");
    assert_eq!(v["exitCode"], 1);
    assert_eq!(v["state"]["written"], true);
    assert_eq!(v["state"]["created"], true);
    let allocations = v["allocations"].as_array().unwrap();
    assert_eq!(allocations.len(), 6);
    let a_small = allocations
        .iter()
        .find(|d| d["cluster"] == "a" && d["pool"] == "small")
        .unwrap();
    assert_eq!(a_small["change"], "created");
    assert_eq!(a_small["allocation"]["addresses"][0], "10.0.0.0-10.0.0.3");
    assert_eq!(a_small["allocation"]["count"], "4");
    let c_small = allocations
        .iter()
        .find(|d| d["cluster"] == "c" && d["pool"] == "small")
        .unwrap();
    assert_eq!(c_small["change"], "failed");
    let big = v["usage"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["pool"] == "big")
        .unwrap();
    // 2^80 addresses in the /48, exact, as a string.
    assert_eq!(big["total"], "1208925819614629174706176");
    assert_eq!(big["allocated"], "55340232221128654848");

    let run = offline_with(&files, &state, &["-o", "yaml"]);
    let y: serde_json::Value = serde_saphyr::from_str(&text(&run.stdout)).expect("YAML on stdout");
    assert_eq!(y["usage"], v["usage"]);

    // Refused runs say so in JSON too.
    let pools_only = w.write("pools.yaml", POOL);
    let run = offline_with(&pools_only, &state, &["-o", "json"]);
    assert_eq!(run.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON on stdout");
    assert_eq!(v["exitCode"], 2);
    assert!(v["error"].as_str().unwrap().contains("--allow-release"));

    // validate and render.
    let run = kipam(&["validate", "-f", files.to_str().unwrap(), "-o", "json"]);
    assert_eq!(run.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(v["valid"], true);
    assert_eq!(v["pools"], 2);
    let bad = w.write(
        "bad.yaml",
        &POOL.replace("allocationRange: 4", "allocationRange: 400"),
    );
    let run = kipam(&["validate", "-f", bad.to_str().unwrap(), "-o", "json"]);
    assert_eq!(run.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(v["valid"], false);
    assert!(v["errors"][0].as_str().unwrap().contains("allocationRange"));

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let examples_state = w.path("examples-state.yaml");
    let _ = kipam_with(
        &[
            "offline",
            "-f",
            root.join("examples").to_str().unwrap(),
            "--state",
        ],
        &[&examples_state],
    );
    let one = kipam_with(
        &[
            "render",
            "--addon",
            "metallb",
            "--cluster",
            root.join("examples/clusters.yaml").to_str().unwrap(),
            "--name",
            "echo",
            "--addons-dir",
            root.join("addons").to_str().unwrap(),
            "--templates-dir",
            root.join("templates").to_str().unwrap(),
            "-o",
            "json",
            "--state",
        ],
        &[&examples_state],
    );
    assert_eq!(one.status.code(), Some(0), "{}", text(&one.stderr));
    let v: serde_json::Value = serde_json::from_slice(&one.stdout).unwrap();
    assert_eq!(v["addon"], "metallb");
    assert_eq!(v["cluster"], "echo");
    assert_eq!(v["objects"].as_array().unwrap().len(), 3);
}

#[test]
fn a_failed_write_under_out_says_exactly_what_was_written() {
    let w = Workdir::new("partial");
    let addons = addons_dir(&w);
    let out = w.path("out");
    let state = w.path("state.yaml");
    let args = out_args(out.to_str().unwrap(), addons.to_str().unwrap());
    let files = w.write(
        "in.yaml",
        &format!(
            "{POOL}{}{}{}",
            clusters(&["a", "b"]),
            addon("a", "cm", "cm"),
            addon("b", "cm", "cm")
        ),
    );
    // `b` cannot be a directory: a file is in the way.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("b"), "in the way").unwrap();
    let run = offline_with(&files, &state, &args);
    assert_eq!(run.status.code(), Some(1));
    let printed = text(&run.stdout);
    let err = text(&run.stderr);
    assert!(
        printed.contains(&format!(
            "rendered {} (1 objects)",
            out.join("a/cm.yaml").display()
        )),
        "{printed}"
    );
    assert!(!printed.contains("b/cm.yaml"), "{printed}");
    assert!(err.contains(&out.join("b").display().to_string()), "{err}");
    assert!(err.contains("is not a plain directory"), "{err}");
    assert!(out.join("a/cm.yaml").exists());
    assert_eq!(
        std::fs::read_to_string(out.join("b")).unwrap(),
        "in the way"
    );
    let index = std::fs::read_to_string(out.join(".kipam-index.json")).unwrap();
    assert!(
        index.contains("a/cm.yaml") && !index.contains("b/cm.yaml"),
        "{index}"
    );
}

#[cfg(unix)]
#[test]
fn output_piped_into_a_reader_that_stops_early_ends_quietly_after_the_state_is_written() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let w = Workdir::new("closed-pipe");
    let clusters: String = (0..2000)
        .map(|i| {
            format!(
                "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  \
                 name: c{i:04}\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\nspec:\n  \
                 datacenter: dc-1\n"
            )
        })
        .collect();
    let pool = "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: wide\n\
                spec:\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/16\n      \
                allocationRange: 1\n";
    let files = w.write("in.yaml", &format!("{pool}{clusters}"));
    let state = w.path("state.yaml");
    // As `kipam offline ... | head -c 100`: the table is far larger than a pipe's buffer.
    let mut child = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .arg("offline")
        .arg("-f")
        .arg(&files)
        .arg("--state")
        .arg(&state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(w.path("stderr.txt")).expect("stderr file"))
        .spawn()
        .expect("run kipam");
    let mut first = [0u8; 100];
    child
        .stdout
        .take()
        .expect("stdout")
        .read_exact(&mut first)
        .expect("the table starts");
    let status = child.wait().expect("kipam ends");
    let err = w.read("stderr.txt");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        status.signal(),
        Some(13),
        "stopped by SIGPIPE: {status:?} {err}"
    );
    // The state was written before the table was printed.
    let saved = w.read("state.yaml");
    assert!(
        saved.contains("namespace: cluster-c1999"),
        "the state is complete"
    );
}
