//! Controller scale benchmark: `cargo bench --bench controller`.
//!
//! Starts the API stand-in, one `kipam controller` process (release build), two pools, then
//! creates 1,000 clusters at once and measures how long until every cluster holds both
//! allocations, how many API requests that took (by verb and resource), and the controller's
//! peak resident memory. Exits non-zero when an allocation is missing or overlaps.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_standin::ApiServer;
use serde_json::json;

const CLUSTERS: usize = 1_000;

const POOLS: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/16
      allocationRange: 8
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb-ipv6
spec:
  datacenters:
    dc-1:
      type: prefix
      poolCidr: 2001:db8::/48
      allocationPrefix: 64
";

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn allocated(api: &ApiServer) -> usize {
    api.list("ipamallocations", None)
        .iter()
        .filter(|a| a.pointer("/status/phase") == Some(&json!("Allocated")))
        .count()
}

fn main() {
    let api = ApiServer::start_detached().expect("stand-in starts");
    for crd in kipam::resources::crds() {
        api.apply(&serde_json::to_value(&crd).expect("CRD JSON"))
            .expect("CRD registers");
    }
    api.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kipam-system"}}),
    )
    .expect("namespace");
    api.apply_yaml(POOLS).expect("pools");
    let dir = std::env::temp_dir().join(format!("kipam-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");

    let mut child = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .args(["controller", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--metrics-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0"])
        .args(["--identity", "bench"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("controller starts");
    let pid = child.id();

    // Let it become leader and settle on the empty seed.
    let start = Instant::now();
    while api
        .get("leases", Some("kipam-system"), "kipam-seed")
        .is_none()
        && start.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(1));
    api.reset_stats();

    println!("kipam controller scale benchmark: {CLUSTERS} clusters created at once, 2 pools\n");
    let start = Instant::now();
    for i in 0..CLUSTERS {
        api.create(&json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": format!("c{i:04}")},
            "spec": {"datacenter": "dc-1"},
        }))
        .expect("cluster created");
    }
    let created_in = start.elapsed();
    let want = CLUSTERS * 2;
    let mut done = false;
    while start.elapsed() < Duration::from_secs(300) {
        if allocated(&api) == want {
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let elapsed = start.elapsed();
    // Settle: cluster and pool statuses follow the allocations.
    std::thread::sleep(Duration::from_secs(2));
    let stats = api.stats();
    let peak = peak_rss_kib(pid);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);

    println!(
        "clusters created in the store: {:.2} s",
        created_in.as_secs_f64()
    );
    println!(
        "all {want} allocations Allocated after {:.2} s ({:.0} allocations/s)",
        elapsed.as_secs_f64(),
        want as f64 / elapsed.as_secs_f64()
    );
    println!("API requests from the controller: {} in total", stats.total);
    let mut by_verb: BTreeMap<&str, u64> = BTreeMap::new();
    for ((verb, resource), n) in &stats.by_request {
        *by_verb.entry(verb.as_str()).or_default() += n;
        println!("  {verb:<7} {resource:<28} {n}");
    }
    let allocation_writes = stats.count("create", "ipamallocations")
        + stats.count("update", "ipamallocations")
        + stats.count("update", "ipamallocations/status")
        + stats.count("patch", "ipamallocations/status");
    println!(
        "allocation writes per allocation: {:.2} (create {} + status {})",
        allocation_writes as f64 / want as f64,
        stats.count("create", "ipamallocations"),
        stats.count("update", "ipamallocations/status")
    );
    println!(
        "requests per cluster: {:.2}; list requests: {}",
        stats.total as f64 / CLUSTERS as f64,
        by_verb.get("list").copied().unwrap_or(0)
    );
    match peak {
        Some(kib) => println!(
            "controller peak resident memory: {:.1} MiB",
            kib as f64 / 1024.0
        ),
        None => println!("controller peak resident memory: unavailable"),
    }

    // Correctness of what was measured.
    let mut pieces: Vec<(String, String)> = api
        .list("ipamallocations", None)
        .iter()
        .filter(|a| a.pointer("/metadata/name") == Some(&json!("metallb")))
        .filter_map(|a| {
            a.pointer("/spec/addresses/0")
                .and_then(|v| v.as_str())
                .map(|s| (s.to_string(), String::new()))
        })
        .collect();
    pieces.sort();
    pieces.dedup();
    if !done || pieces.len() != CLUSTERS {
        println!(
            "FAILED: {} of {want} allocations, {} distinct metallb ranges",
            allocated(&api),
            pieces.len()
        );
        std::process::exit(1);
    }
    if allocation_writes > 2 * want as u64 {
        println!("FAILED: more than one create plus one status update per allocation");
        std::process::exit(1);
    }
}
