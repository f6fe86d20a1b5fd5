//! Issue 25, item 3: `kipam controller` started outside the repository. Allocation needs no
//! addons, so a missing *default* addons directory turns the addon applier off (said once);
//! a directory given with `--addons-dir` that is missing stops the controller, naming it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::support::{POOLS, Seed};

const WAIT: Duration = Duration::from_secs(30);

/// Runs `kipam controller` with `args` in `cwd` until it exits (at most 20 s, then it is
/// killed): its exit code (`None` when it had to be killed) and its stderr.
fn run_to_exit(seed: &Seed, cwd: &Path, args: &[&str]) -> (Option<i32>, String) {
    let stderr = seed.dir().join("exit.log");
    let file = std::fs::File::create(&stderr).expect("log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .current_dir(cwd)
        .arg("controller")
        .arg("--kubeconfig")
        .arg(seed.dir().join("kubeconfig"))
        .args(["--metrics-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("controller starts");
    let started = Instant::now();
    let code = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (code, std::fs::read_to_string(&stderr).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_default_addons_directory_the_seed_allocates_and_says_so_once() {
    let seed = Seed::start("addons-off").await;
    // A working directory without `addons/` (nor `templates/`).
    let elsewhere = seed.dir().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("working directory");
    let mut ctl = seed.controller_in("ctl", &elsewhere, &[]);
    seed.apply(POOLS);
    seed.cluster("a", "dc-1");
    seed.wait_for("a allocated", WAIT, "ctl", |s| {
        s.phase("a", "metallb") == "Allocated"
    })
    .await;
    assert!(ctl.is_running(), "{}", seed.log("ctl"));

    // An Addon is left alone: no finalizer, no status (nothing would ever remove either).
    seed.api
        .create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "metallb", "namespace": "cluster-a"},
            "spec": {"name": "metallb"}}),
        )
        .expect("addon");
    seed.cluster("b", "dc-1");
    seed.wait_for("b allocated", WAIT, "ctl", |s| {
        s.phase("b", "metallb") == "Allocated"
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let addon = seed
        .get("addons", Some("cluster-a"), "metallb")
        .expect("the Addon is there");
    assert!(
        addon["metadata"]["finalizers"].is_null() && addon["status"].is_null(),
        "the Addon was touched: {addon}"
    );

    // One line says why, naming the path looked at and the flag.
    let log = seed.full_log("ctl");
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("addon applier off"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    let looked_at = elsewhere.join("addons").display().to_string();
    assert!(
        lines[0].contains("WARN")
            && lines[0].contains(&looked_at)
            && lines[0].contains("--addons-dir"),
        "{}",
        lines[0]
    );
    assert!(!log.contains("addon applier ready"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_addons_directory_given_on_the_command_line_stops_the_controller() {
    let seed = Seed::start("addons-given").await;
    let (code, stderr) = run_to_exit(
        &seed,
        seed.dir(),
        &["--addons-dir", "/nonexistent/kipam-addons"],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--addons-dir /nonexistent/kipam-addons: no such directory"),
        "{stderr}"
    );

    // A relative one: the message says where it led.
    let (code, stderr) = run_to_exit(&seed, seed.dir(), &["--addons-dir", "my-addons"]);
    assert_eq!(code, Some(2), "{stderr}");
    let resolved = seed.dir().join("my-addons").display().to_string();
    assert!(
        stderr.contains(&format!(
            "--addons-dir my-addons: no such directory (looked in {resolved})"
        )),
        "{stderr}"
    );

    // The default names a file, not a directory: that is no reason to run without addons.
    std::fs::write(seed.dir().join("addons"), "not a directory").expect("file");
    let (code, stderr) = run_to_exit(&seed, seed.dir(), &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--addons-dir addons: not a directory"),
        "{stderr}"
    );
}
