//! Adoption at fleet scale, offline: `cargo bench --bench adopt`.
//!
//! Generates the exports of `KIPAM_BENCH_ADOPT_CLUSTERS` (default 1,000) user clusters that
//! already run MetalLB — one directory each, as `kubectl get ipaddresspools.metallb.io,services
//! -A -o yaml` writes it: a hand-made `IPAddressPool` of 32 addresses and
//! `KIPAM_BENCH_ADOPT_SERVICES` (default 20) `LoadBalancer` Services inside it, one more
//! outside every kipam pool, and every 100th cluster also serving an address of its
//! neighbour (a conflict) — all in ONE pool datacenter, the worst case for the conflict
//! checks. Then it runs `kipam adopt --from` (release build) over them, as a dry run with
//! `-o json`, and reports the wall time to the complete report and the process's peak
//! resident memory (`ru_maxrss` of the child). It checks the report: every cluster
//! planned, the expected conflicts found on both sides, every other cluster `Ready` with its
//! served addresses as its overrides.
//!
//! Through kubeconfigs instead of exports, each user cluster costs two list requests (MetalLB
//! pools, Services), one more per 500 objects of either.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The `n`th address of 10.0.0.0/12 (the kipam pool).
fn addr(n: usize) -> String {
    let v = (10u32 << 24) + n as u32;
    std::net::Ipv4Addr::from(v).to_string()
}

fn name(i: usize) -> String {
    format!("c-{i:05}")
}

fn generate(root: &Path, clusters: usize, services: usize) {
    let mut pools = String::from(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: metallb\nspec:\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/12\n      allocationRange: 32\n",
    );
    for i in 0..clusters {
        let _ = write!(
            pools,
            "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {}\nspec:\n  datacenter: dc-1\n",
            name(i)
        );
    }
    std::fs::write(root.join("pools.yaml"), pools).expect("pools");
    for i in 0..clusters {
        let dir = root.join("from").join(name(i));
        std::fs::create_dir_all(&dir).expect("dir");
        let base = i * 32;
        let mut out = format!(
            "apiVersion: v1\nkind: List\nitems:\n- apiVersion: metallb.io/v1beta1\n  kind: IPAddressPool\n  metadata:\n    name: legacy\n    namespace: metallb-system\n  spec:\n    addresses:\n    - {}-{}\n",
            addr(base),
            addr(base + 31)
        );
        let mut served: Vec<String> = (1..=services.min(30)).map(|k| addr(base + k)).collect();
        // Outside every kipam pool.
        served.push(format!("172.16.{}.{}", i / 250, i % 250 + 1));
        // Every 100th cluster also serves its neighbour's first address.
        if i % 100 == 0 && i + 1 < clusters {
            served.push(addr((i + 1) * 32 + 1));
        }
        for (k, ip) in served.iter().enumerate() {
            let _ = write!(
                out,
                "- apiVersion: v1\n  kind: Service\n  metadata:\n    name: svc-{k}\n    namespace: apps\n  spec:\n    type: LoadBalancer\n  status:\n    loadBalancer:\n      ingress:\n      - ip: {ip}\n"
            );
        }
        std::fs::write(dir.join("export.yaml"), out).expect("export");
    }
}

/// The largest resident set of any child waited for so far, in KiB.
fn children_maxrss_kib() -> i64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct it is given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    if rc == 0 { usage.ru_maxrss } else { -1 }
}

fn main() {
    let clusters = env_usize("KIPAM_BENCH_ADOPT_CLUSTERS", 1000);
    let services = env_usize("KIPAM_BENCH_ADOPT_SERVICES", 20);
    let root = std::env::temp_dir().join(format!("kipam-bench-adopt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("temp dir");
    let started = Instant::now();
    generate(&root, clusters, services);
    println!(
        "adopt: {clusters} user clusters × {services} Services (+1 outside every pool; every 100th serving its neighbour's address), one pool datacenter; exports written in {:.2?}",
        started.elapsed()
    );
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .arg("adopt")
        .arg("--pools")
        .arg(root.join("pools.yaml"))
        .arg("--from")
        .arg(root.join("from"))
        .args(["--dry-run", "-o", "json"])
        .stderr(Stdio::inherit())
        .output()
        .expect("run kipam adopt");
    let elapsed = started.elapsed();
    let peak = children_maxrss_kib();
    let _ = std::fs::remove_dir_all(&root);
    let report: serde_json::Value = match serde_json::from_slice(&output.stdout) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("kipam adopt did not print JSON ({e})");
            std::process::exit(1);
        }
    };
    println!(
        "  kipam adopt --from (dry run, -o json): {elapsed:.2?} to the complete report, peak resident {:.1} MiB, exit {:?}, report {:.1} MiB",
        peak as f64 / 1024.0,
        output.status.code(),
        output.stdout.len() as f64 / (1024.0 * 1024.0)
    );
    println!("  summary: {}", report["summary"]);
    // The report is checked, not only timed.
    let planned = report["clusters"].as_array().map_or(0, Vec::len);
    let conflicted: Vec<usize> = (0..clusters)
        .filter(|i| i % 100 == 0 && i + 1 < clusters)
        .collect();
    let mut wrong = Vec::new();
    if planned != clusters {
        wrong.push(format!("{planned} clusters planned, not {clusters}"));
    }
    for c in report["clusters"].as_array().into_iter().flatten() {
        let n: usize = c["cluster"].as_str().unwrap_or("c-x")[2..]
            .parse()
            .unwrap_or(usize::MAX);
        let in_conflict = conflicted.contains(&n) || (n > 0 && conflicted.contains(&(n - 1)));
        let state = c["state"].as_str().unwrap_or_default();
        if in_conflict != (state == "NeedsLook") {
            wrong.push(format!("{} is {state}", name(n)));
        }
        if !in_conflict {
            let pinned = &report["overrides"][name(n)]["spec"]["ipam"]["metallb"]["addresses"];
            let expected = format!("{}-{}", addr(n * 32 + 1), addr(n * 32 + services.min(30)));
            if pinned != &serde_json::json!([expected]) {
                wrong.push(format!("{} pins {pinned}", name(n)));
            }
        }
    }
    let expected_code = if conflicted.is_empty() { 0 } else { 1 };
    if output.status.code() != Some(expected_code) {
        wrong.push(format!("exit {:?}", output.status.code()));
    }
    if !wrong.is_empty() {
        eprintln!("adopt bench: wrong report: {}", wrong.join("; "));
        std::process::exit(1);
    }
    println!(
        "  checked: every cluster planned, conflicts on both sides, the rest pinned to what they serve"
    );
}
