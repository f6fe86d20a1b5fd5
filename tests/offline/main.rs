//! `kipam offline`, `kipam validate` and `kipam crds` run as a user runs them: the real
//! binary over files in a temporary directory.

mod adopt;
mod adversarial;
mod docs;
mod files;
mod leaks;
mod mutations;
mod network;
mod quarantine;
mod report;
mod strict;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Workdir(PathBuf);

impl Workdir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kipam-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Workdir(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, content).expect("write fixture");
        p
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `kipam::offline::run` in this test process. Other tests of this binary spawn processes:
/// one forked between a run's open of the state's lock file and its exec briefly shares the
/// lock. That is a run "in use", not a failure: wait for it (a second at most).
fn run_in_process(
    options: &kipam::offline::OfflineOptions,
) -> Result<kipam::offline::OfflineReport, kipam::offline::OfflineError> {
    let mut attempt = 0;
    loop {
        match kipam::offline::run(options) {
            Err(kipam::offline::OfflineError::File(kipam::offline::FileError::Locked {
                ..
            })) if attempt < 50 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn kipam(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kipam"))
        .args(args)
        .output()
        .expect("run kipam")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn examples() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .display()
        .to_string()
}

fn offline(files: &[&str], state: &Path) -> Output {
    let mut args = vec!["offline"];
    for f in files {
        args.push("-f");
        args.push(f);
    }
    args.push("--state");
    let state = state.display().to_string();
    args.push(&state);
    kipam(&args)
}

const POOL: &str = "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: small
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/29
      allocationRange: 4
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: big
spec:
  datacenters:
    dc-1:
      type: prefix
      poolCidr: 2001:db8::/48
      allocationPrefix: 64
";

fn clusters(names: &[&str]) -> String {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            format!(
                "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {n}\n  creationTimestamp: \"2026-01-{:02}T00:00:00Z\"\nspec:\n  datacenter: dc-1\n",
                i + 1
            )
        })
        .collect()
}

#[test]
fn examples_run_and_rerun_changes_nothing() {
    let w = Workdir::new("examples");
    let state = w.path("state.yaml");
    let first = offline(&[&examples()], &state);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let out = text(&first.stdout);
    assert!(out.contains("alpha    metallb       azure-westeurope   range   192.168.1.0,192.168.1.2-192.168.1.4,192.168.1.8-192.168.1.11  created"), "{out}");
    assert!(
        out.contains("echo     metallb       aws-eu-central-1a  prefix  192.168.2.128/28"),
        "{out}"
    );
    assert!(out.contains("written"));
    let saved = w.read("state.yaml");
    assert_eq!(saved.matches("kind: IPAMAllocation").count(), 14);

    let second = offline(&[&examples()], &state);
    assert_eq!(second.status.code(), Some(0));
    let out = text(&second.stdout);
    assert!(out.contains("state") && out.contains("unchanged"), "{out}");
    assert!(!out.contains("created"), "{out}");
    assert_eq!(w.read("state.yaml"), saved, "a re-run rewrites nothing");
}

#[test]
fn exhaustion_exits_non_zero_and_keeps_other_pools() {
    let w = Workdir::new("exhaust");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a", "b", "c"])));
    let state = w.path("state.yaml");
    let run = offline(&[files.to_str().unwrap()], &state);
    assert_eq!(run.status.code(), Some(1));
    let out = text(&run.stdout);
    assert!(
        out.contains(
            "failed: pool small/dc-1 (10.0.0.0/29) has 0 free addresses, 4 requested by c"
        ),
        "{out}"
    );
    assert!(out.contains("c        big"), "{out}");
    let saved = w.read("state.yaml");
    assert!(saved.contains("phase: Failed"), "{saved}");
    assert!(
        saved.contains("2001:db8:0:2::/64"),
        "c still gets its IPv6 subnet: {saved}"
    );

    // b leaves: c gets b's addresses on the next run.
    std::fs::write(&files, format!("{POOL}{}", clusters(&["a", "c"]))).unwrap();
    let run = offline(&[files.to_str().unwrap()], &state);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stdout));
    let out = text(&run.stdout);
    assert!(
        out.contains("b        small  dc-1        range   -"),
        "{out}"
    );
    assert!(
        out.contains("released: cluster b no longer exists"),
        "{out}"
    );
    assert!(
        out.contains("c        small  dc-1        range   10.0.0.4-10.0.0.7"),
        "{out}"
    );
    let saved = w.read("state.yaml");
    assert!(!saved.contains("namespace: cluster-b"), "{saved}");
}

/// A state edited (or merged) so that two clusters hold the same addresses is refused before
/// anything is planned: exit 2, both holders and the way out named, the state untouched.
#[test]
fn a_conflict_in_the_state_is_refused() {
    let w = Workdir::new("conflict");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a", "b"])));
    let state = w.path("state.yaml");
    let run = offline(&[files.to_str().unwrap()], &state);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let saved = w.read("state.yaml");
    assert!(saved.contains("10.0.0.4-10.0.0.7"), "{saved}");
    let edited = saved.replace("10.0.0.4-10.0.0.7", "10.0.0.2-10.0.0.5");
    std::fs::write(&state, &edited).unwrap();

    let run = offline(&[files.to_str().unwrap()], &state);
    let err = text(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cluster a (pool small, IPAMAllocation cluster-a/small) and cluster b (pool small, IPAMAllocation cluster-b/small) both hold 10.0.0.2-10.0.0.3 in datacenter dc-1"),
        "{err}"
    );
    assert_eq!(w.read("state.yaml"), edited, "the state is untouched");

    let run = kipam(&[
        "offline",
        "-f",
        files.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(run.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON on stdout");
    assert_eq!(v["exitCode"], 2);

    // --help says so.
    let help = text(&kipam(&["offline", "--help"]).stdout);
    assert!(help.contains("Exit status:"), "{help}");
    assert!(help.contains("1  an allocation failed"), "{help}");
    assert!(help.contains("one that holds an address"), "{help}");
}

#[test]
fn corrupt_or_unreadable_state_is_refused_and_not_overwritten() {
    let w = Workdir::new("corrupt");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a"])));
    let cases = [
        ("not: [valid", "is corrupt"),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n",
            "not an IPAMAllocation",
        ),
        (
            "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMAllocation\nmetadata:\n  name: small\n  namespace: cluster-a\nspec:\n  type: range\n  dc: dc-1\n  addresses: [\"10.0.0.9-10.0.0.1\"]\n",
            "spec.addresses[0]",
        ),
    ];
    for (content, expected) in cases {
        let state = w.write("state.yaml", content);
        let run = offline(&[files.to_str().unwrap()], &state);
        assert_eq!(run.status.code(), Some(2), "{content}");
        let err = text(&run.stderr);
        assert!(err.contains(expected), "{err}");
        assert_eq!(w.read("state.yaml"), content, "the state file is untouched");
    }
    // A state path that cannot be read as a file.
    let dir = w.path("state-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let run = offline(&[files.to_str().unwrap()], &dir);
    assert_eq!(run.status.code(), Some(2));
    let err = text(&run.stderr);
    assert!(err.contains("is a directory"), "{err}");
}

#[test]
fn invalid_input_writes_nothing() {
    let w = Workdir::new("invalid");
    let files = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a"])));
    let state = w.path("state.yaml");
    assert_eq!(
        offline(&[files.to_str().unwrap()], &state).status.code(),
        Some(0)
    );
    let saved = w.read("state.yaml");
    let bad = POOL.replace("allocationRange: 4", "allocationRange: 400");
    std::fs::write(&files, format!("{bad}{}", clusters(&["a", "b"]))).unwrap();
    let run = offline(&[files.to_str().unwrap()], &state);
    assert_eq!(run.status.code(), Some(2));
    assert_eq!(
        text(&run.stderr),
        "error: invalid input, nothing written:\n  IPAMPool small: spec.datacenters[dc-1].allocationRange \"400\": exceeds the 8 addresses of poolCidr\n"
    );
    assert_eq!(w.read("state.yaml"), saved);

    let kkp = POOL.replace("ipam.kipam.dev/v1alpha1", "kubermatic.k8c.io/v1");
    std::fs::write(&files, kkp).unwrap();
    let run = offline(&[files.to_str().unwrap()], &state);
    assert_eq!(run.status.code(), Some(2));
    assert!(text(&run.stderr).contains("a KKP manifest works once its apiVersion is changed"));
    assert_eq!(w.read("state.yaml"), saved);
}

#[test]
fn validate_command() {
    let w = Workdir::new("validate");
    let good = w.write("good.yaml", POOL);
    let run = kipam(&["validate", "-f", good.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(0));
    assert_eq!(text(&run.stdout), "valid: 2 pools, 0 clusters\n");

    let changed = w.write("changed.yaml", &POOL.replace("10.0.0.0/29", "10.0.1.0/29"));
    let run = kipam(&[
        "validate",
        "-f",
        changed.to_str().unwrap(),
        "--old",
        good.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    assert_eq!(
        text(&run.stderr),
        "IPAMPool small: spec.datacenters[dc-1].poolCidr \"10.0.1.0/29\": may only be widened to a network that contains the old one (was 10.0.0.0/29)\n"
    );

    // An exclusion over an existing allocation.
    let clusters_file = w.write("clusters.yaml", &clusters(&["a"]));
    let state = w.path("state.yaml");
    offline(
        &[good.to_str().unwrap(), clusters_file.to_str().unwrap()],
        &state,
    );
    let excluded = w.write(
        "excluded.yaml",
        &POOL.replace(
            "allocationRange: 4",
            "allocationRange: 4\n      excludeRanges: [\"10.0.0.2\"]",
        ),
    );
    let run = kipam(&[
        "validate",
        "-f",
        excluded.to_str().unwrap(),
        "--old",
        good.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    assert_eq!(
        text(&run.stderr),
        "IPAMPool small: spec.datacenters[dc-1].excludeRanges[0] \"10.0.0.2\": hits the allocation of cluster a (10.0.0.0-10.0.0.3)\n"
    );
}

/// `kipam validate` enforces the CRDs' bounds and the name rules, so a file it accepts is one
/// a real API server accepts too.
#[test]
fn validate_enforces_the_crd_bounds_and_names() {
    let w = Workdir::new("validate-bounds");
    // 44 characters, a well-formed CIDR of the right shape: only the bound refuses it.
    let long = "0000:0000:0000:0000:0000:0000:100.10.0.0/112";
    let file = w.write(
        "pools.yaml",
        &format!(
            "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: long
spec:
  datacenters:
    dc-1:
      type: prefix
      poolCidr: \"{long}\"
      allocationPrefix: 120
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: spaced
spec:
  datacenters:
    eu west:
      type: range
      poolCidr: 10.0.0.0/24
      allocationRange: 4
"
        ),
    );
    let run = kipam(&["validate", "-f", file.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1));
    assert_eq!(
        text(&run.stderr),
        format!(
            "IPAMPool long: spec.datacenters[dc-1].poolCidr \"{long}\": must be at most 43 characters, is 44\n\
             IPAMPool spaced: spec.datacenters \"eu west\": must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit (it is the value of label ipam.kipam.dev/datacenter and part of object names)\n"
        )
    );
}

#[test]
fn crds_command_prints_what_crds_holds() {
    let run = kipam(&["crds"]);
    assert_eq!(run.status.code(), Some(0));
    let printed = text(&run.stdout);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    for name in [
        "ipampools.ipam.kipam.dev.yaml",
        "ipamallocations.ipam.kipam.dev.yaml",
        "clusters.ipam.kipam.dev.yaml",
        "addons.ipam.kipam.dev.yaml",
    ] {
        let on_disk = std::fs::read_to_string(dir.join(name)).expect("crd file");
        assert!(
            printed.contains(&on_disk),
            "{name} differs from `kipam crds`"
        );
    }
}

#[test]
fn offline_out_renders_every_addon_and_render_prints_one() {
    let w = Workdir::new("render");
    let state = w.path("state.yaml");
    let out = w.path("out");
    let root = env!("CARGO_MANIFEST_DIR");
    let run = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .current_dir(root)
        .args(["offline", "-f", "examples", "--state"])
        .arg(&state)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run kipam");
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    for cluster in ["alpha", "bravo", "charlie", "delta", "echo"] {
        let file = out.join(cluster).join("metallb.yaml");
        let yaml = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(
            yaml.contains("name: kipam-managed-pool\n"),
            "{cluster}: {yaml}"
        );
        assert!(
            yaml.contains("ipam.kipam.dev/addon: metallb"),
            "{cluster}: {yaml}"
        );
    }
    let echo = std::fs::read_to_string(out.join("echo").join("metallb.yaml")).unwrap();
    assert!(echo.contains("- 192.168.2.128/28"), "{echo}");
    assert!(
        echo.contains("- 10.30.0.4-10.30.0.7\n  - 2001:db8:30:1::/64"),
        "{echo}"
    );
    let charlie = std::fs::read_to_string(out.join("charlie").join("metallb.yaml")).unwrap();
    assert!(
        !charlie.contains("dualstack"),
        "charlie opted out of IPv6: {charlie}"
    );

    // `kipam render` prints the same document for one cluster.
    let one = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .current_dir(root)
        .args([
            "render",
            "--addon",
            "metallb",
            "--cluster",
            "examples/clusters.yaml",
            "--name",
            "echo",
            "--state",
        ])
        .arg(&state)
        .output()
        .expect("run kipam render");
    assert_eq!(one.status.code(), Some(0), "{}", text(&one.stderr));
    assert_eq!(text(&one.stdout), echo);

    // A broken addon stops the run before the state is touched.
    let broken = w.path("addons");
    std::fs::create_dir_all(broken.join("metallb")).unwrap();
    std::fs::write(broken.join("metallb").join("pool.yaml"), "{% if %}\n").unwrap();
    let saved = w.read("state.yaml");
    let run = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .current_dir(root)
        .args(["offline", "-f", "examples", "--state"])
        .arg(&state)
        .arg("--out")
        .arg(&out)
        .arg("--addons-dir")
        .arg(&broken)
        .output()
        .expect("run kipam");
    assert_eq!(run.status.code(), Some(2));
    let err = text(&run.stderr);
    assert!(err.contains("pool.yaml:1"), "{err}");
    assert_eq!(w.read("state.yaml"), saved);
}

/// Issue 25: outside the repository, `kipam offline --out` and `kipam render` find no
/// `addons/`; they stop before writing anything and say which flag and which path.
#[test]
fn a_missing_addons_directory_is_named_with_its_flag() {
    let w = Workdir::new("no-addons");
    let input = w.write("in.yaml", &format!("{POOL}{}", clusters(&["a"])));
    let state = w.path("state.yaml");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kipam"))
            .current_dir(&w.0)
            .args(args)
            .output()
            .expect("run kipam")
    };
    let state_arg = state.display().to_string();
    let input_arg = input.display().to_string();
    let resolved = w.path("addons").display().to_string();

    // The default, relative to the working directory.
    let offline = run(&[
        "offline", "-f", &input_arg, "--state", &state_arg, "--out", "out",
    ]);
    assert_eq!(offline.status.code(), Some(2), "{}", text(&offline.stderr));
    assert_eq!(
        text(&offline.stderr),
        format!("error: --addons-dir addons: no such directory (looked in {resolved})\n")
    );
    assert!(!state.exists() && !w.path("out").exists());

    // Given, and absolute.
    let offline = run(&[
        "offline",
        "-f",
        &input_arg,
        "--state",
        &state_arg,
        "--out",
        "out",
        "--addons-dir",
        "/nonexistent/kipam-addons",
    ]);
    assert_eq!(offline.status.code(), Some(2), "{}", text(&offline.stderr));
    assert_eq!(
        text(&offline.stderr),
        "error: --addons-dir /nonexistent/kipam-addons: no such directory\n"
    );

    let render = run(&["render", "--addon", "metallb", "--cluster", &input_arg]);
    assert_eq!(render.status.code(), Some(1), "{}", text(&render.stderr));
    assert_eq!(
        text(&render.stderr),
        format!("error: --addons-dir addons: no such directory (looked in {resolved})\n")
    );
}

/// Offline, a full pool grows in place: the state file keeps every old allocation as it was,
/// the waiting cluster gets addresses of the new CIDR, the JSON output has each CIDR's
/// figures, a re-run changes nothing, and removing the CIDR again is refused with the state
/// file untouched.
#[test]
fn a_full_pool_grows_in_place_in_the_state_file() {
    let w = Workdir::new("grow");
    let small = POOL.split("---").next().unwrap_or_default();
    let pool = w.write("pool.yaml", small);
    let cl = w.write("clusters.yaml", &clusters(&["a", "b", "c"]));
    let state = w.path("state.yaml");
    let first = offline(&[pool.to_str().unwrap(), cl.to_str().unwrap()], &state);
    assert_eq!(
        first.status.code(),
        Some(1),
        "c waits: {}",
        text(&first.stdout)
    );
    let before = w.read("state.yaml");
    assert!(before.contains("10.0.0.0-10.0.0.3") && before.contains("10.0.0.4-10.0.0.7"));

    let grown = w.write(
        "grown.yaml",
        &small.replace(
            "      allocationRange: 4\n",
            "      allocationRange: 4\n      additionalCidrs: [10.5.0.0/30]\n",
        ),
    );
    let files = [grown.to_str().unwrap(), cl.to_str().unwrap()];
    let second = offline(&files, &state);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    let out = text(&second.stdout);
    assert!(
        out.contains("c        small  dc-1        range   10.5.0.0-10.5.0.3")
            || out.contains("10.5.0.0-10.5.0.3  created"),
        "{out}"
    );
    let after = w.read("state.yaml");
    // The old allocations are the same documents, byte for byte.
    let held = before
        .split("\n---\n")
        .filter(|d| d.contains("kind: IPAMAllocation") && d.contains("addresses:"));
    assert_eq!(held.clone().count(), 2, "{before}");
    for doc in held {
        assert!(after.contains(doc.trim()), "{doc} changed:\n{after}");
    }
    // The same plan as data: each CIDR's figures.
    let mut args = vec!["offline", "-o", "json", "--state", state.to_str().unwrap()];
    for f in files {
        args.extend(["-f", f]);
    }
    let json: serde_json::Value = serde_json::from_slice(&kipam(&args).stdout).expect("json");
    let cidrs = &json["usage"][0]["cidrs"];
    assert_eq!(cidrs[1]["cidr"], "10.5.0.0/30", "{json}");
    assert_eq!(cidrs[1]["allocated"], "4", "{json}");
    assert_eq!(w.read("state.yaml"), after, "a re-run rewrites nothing");

    // The CIDR that now holds c cannot go: refused, nothing written.
    let third = offline(&[pool.to_str().unwrap(), cl.to_str().unwrap()], &state);
    assert_ne!(third.status.code(), Some(0));
    let err = text(&third.stderr);
    assert!(err.contains("c (10.5.0.0-10.5.0.3)"), "{err}");
    assert_eq!(w.read("state.yaml"), after);
}

/// Offline mode reads no user cluster: a Cluster that adopts is held with the reason, never
/// given a fresh range that may hold what its user cluster serves; the others are served.
#[test]
fn a_cluster_that_adopts_is_held_offline_and_told_to_use_kipam_adopt() {
    let w = Workdir::new("adopt-held");
    let adopting = clusters(&["a"]).replace(
        "  datacenter: dc-1\n",
        "  datacenter: dc-1\n  adopt: Adopt\n",
    );
    let files = w.write(
        "in.yaml",
        &format!(
            "{POOL}{adopting}{}",
            clusters(&["b"]).replace("name: a", "name: b")
        ),
    );
    let state = w.path("state.yaml");
    let run = kipam(&[
        "offline",
        "-f",
        files.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "-o",
        "json",
    ]);
    let out = text(&run.stdout);
    let saved = w.read("state.yaml");
    assert!(!saved.contains("cluster-a"), "a got an allocation: {saved}");
    assert!(saved.contains("cluster-b"), "b is served: {saved}");
    assert!(out.contains("kipam adopt"), "{out}\n{}", text(&run.stderr));
}
