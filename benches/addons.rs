//! Addon applier benchmark: `cargo bench --bench addons [-- SIZES…]` (default `100 1000`).
//!
//! For each size N: one seed stand-in and N user-cluster stand-ins (each with MetalLB's CRDs)
//! in this process, one `kipam controller` (release build) in another. Every cluster's
//! namespace, kubeconfig Secret and `metallb` Addon exist first; then the N Clusters are created
//! at once and the benchmark measures the **first apply**: the time until every user cluster
//! holds its `IPAddressPool` with exactly its allocation. For N ≤ 100 it then grows the
//! allocation of each cluster in turn and measures, per cluster, the time from the grown
//! `IPAMAllocation` appearing on the seed to the grown `IPAddressPool` in the user cluster
//! (median and worst). Prints the controller's peak resident memory and the requests the user
//! clusters served. Exits non-zero when a user cluster does not get its objects.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_standin::ApiServer;
use serde_json::{Value, json};

const METALLB_CRDS: &str = include_str!("../tests/render/fixtures/metallb-crds.yaml");

const POOL: &str = "
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
";

/// A self-signed CA certificate (public part only, made for this benchmark), put into every
/// user cluster's kubeconfig as `certificate-authority-data`, as real kubeconfigs carry one.
/// The stand-ins speak plain HTTP, so it is never used to verify anything; it matters because a
/// kubeconfig without a CA makes every client load the system's root store (about 3 ms per
/// client, where building one with a CA takes about 10 µs), and kipam builds a client per sync.
const CA_DATA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJjekNDQVJtZ0F3SUJBZ0lVRTNIbnkrTjl2UzM4N096dmh6NDB5NmUwTWpFd0NnWUlLb1pJemowRUF3SXcKRHpFTk1Bc0dBMVVFQXd3RWRHVnpkREFlRncweU5qRXhNak13T1RJMU5ESmFGdzB6TmpFeE1qQXdPVEkxTkRKYQpNQTh4RFRBTEJnTlZCQU1NQkhSbGMzUXdXVEFUQmdjcWhrak9QUUlCQmdncWhrak9QUU1CQndOQ0FBVEFpMU5UCndDeWxxeDJ6RElMZ3Y1d294bitJMURsbkRaNC90OHVVS1dDS1JyVU5MT0ZFYnRma1lUSlhjdFI0Q2pHN2cya2IKakRlTmR4UHd1clJCdG0rbG8xTXdVVEFkQmdOVkhRNEVGZ1FVdkNaODBjaU1mV0dGN01rWjU3OTNqY0JFU0VNdwpId1lEVlIwakJCZ3dGb0FVdkNaODBjaU1mV0dGN01rWjU3OTNqY0JFU0VNd0R3WURWUjBUQVFIL0JBVXdBd0VCCi96QUtCZ2dxaGtqT1BRUURBZ05JQURCRkFpQmpPMzh4YktTU24wV2ZJRDhYczJFUEZNUDBzTXE2WHpZdXQ1bHUKY21INkRRSWhBT2U2eGxoRDFheWFWRWo1Tk9KMncycTh3TGVsaXlWN29GS1NrMkQxRXZDVAotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

/// The stand-in's kubeconfig with [`CA_DATA`].
fn kubeconfig_with_ca(user: &ApiServer) -> String {
    let text = user.kubeconfig_yaml();
    let server = format!("    server: {}\n", user.url());
    let with_ca = text.replace(
        &server,
        &format!("{server}    certificate-authority-data: {CA_DATA}\n"),
    );
    assert!(
        with_ca != text,
        "the stand-in's kubeconfig changed shape: no CA added"
    );
    with_ca
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn held(seed: &ApiServer, cluster: &str) -> Option<Vec<Value>> {
    seed.get(
        "ipamallocations",
        Some(&format!("cluster-{cluster}")),
        "metallb",
    )
    // A healthy allocation carries no status (its spec holds the addresses).
    .filter(|a| {
        a.pointer("/status/phase")
            .is_none_or(|p| p == &json!("Allocated"))
    })
    .and_then(|a| {
        a.pointer("/spec/addresses")
            .and_then(Value::as_array)
            .cloned()
    })
}

fn in_user_cluster(user: &ApiServer) -> Option<Vec<Value>> {
    user.get(
        "ipaddresspools.metallb.io",
        Some("metallb-system"),
        "kipam-managed-pool",
    )
    .and_then(|p| {
        p.pointer("/spec/addresses")
            .and_then(Value::as_array)
            .cloned()
    })
}

fn name(i: usize) -> String {
    format!("c{i:04}")
}

fn run(size: usize) -> bool {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let seed = rt.block_on(ApiServer::start()).expect("seed starts");
    for crd in kipam::resources::crds() {
        seed.apply(&serde_json::to_value(&crd).expect("CRD JSON"))
            .expect("CRD registers");
    }
    seed.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "kipam-system"}}))
        .expect("namespace");
    seed.apply_yaml(POOL).expect("pool");
    let setup = Instant::now();
    let mut users = Vec::with_capacity(size);
    for i in 0..size {
        let user = rt
            .block_on(ApiServer::start())
            .expect("user cluster starts");
        user.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "metallb-system"}}))
            .expect("namespace");
        user.apply_yaml(METALLB_CRDS).expect("CRDs");
        let cluster = name(i);
        let ns = format!("cluster-{cluster}");
        seed.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"ipam.kipam.dev/cluster": cluster}}}))
            .expect("cluster namespace");
        seed.apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "kubeconfig", "namespace": ns},
            "stringData": {"kubeconfig": kubeconfig_with_ca(&user)}}))
            .expect("secret");
        seed.create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "metallb", "namespace": ns},
            "spec": {"name": "metallb"}}),
        )
        .expect("addon");
        users.push(user);
    }
    println!(
        "{size} user-cluster stand-ins ready in {:.1} s",
        setup.elapsed().as_secs_f64()
    );
    let dir = std::env::temp_dir().join(format!("kipam-bench-addons-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    seed.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .args(["controller", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--metrics-addr", "127.0.0.1:0", "--identity", "bench"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("controller starts");
    let pid = child.id();
    let start = Instant::now();
    while seed
        .get("leases", Some("kipam-system"), "kipam-seed")
        .is_none()
        && start.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_secs(1));
    for u in &users {
        u.reset_stats();
    }

    // First apply: N clusters created at once.
    let start = Instant::now();
    for i in 0..size {
        seed.create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name(i)},
            "spec": {"datacenter": "dc-1",
                     "kubeconfig": {"secretRef": {"name": "kubeconfig"}}}}),
        )
        .expect("cluster");
    }
    let mut pending: Vec<usize> = (0..size).collect();
    while !pending.is_empty() && start.elapsed() < Duration::from_secs(600) {
        pending.retain(|&i| {
            let want = held(&seed, &name(i));
            want.is_none() || in_user_cluster(&users[i]) != want
        });
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let first_apply = start.elapsed();
    let mut ok = pending.is_empty();
    println!(
        "first apply, {size} clusters created at once: every user cluster holds its \
         IPAddressPool after {:.2} s{}",
        first_apply.as_secs_f64(),
        if ok {
            String::new()
        } else {
            format!(" — {} still missing (FAILED)", pending.len())
        }
    );
    let requests: u64 = users.iter().map(|u| u.stats().total).sum();
    println!(
        "  requests served by the user clusters: {requests} ({:.1} per cluster)",
        requests as f64 / size as f64
    );

    // Allocation to object, one cluster at a time.
    if ok && size <= 100 {
        let mut latencies = Vec::with_capacity(size);
        for (i, user) in users.iter().enumerate() {
            let cluster = name(i);
            let before = held(&seed, &cluster);
            seed.apply(
                &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
                "metadata": {"name": cluster},
                "spec": {"ipam": {"metallb": {"allocationRange": 16}}}}),
            )
            .expect("grow");
            let deadline = Instant::now() + Duration::from_secs(30);
            let grown = loop {
                let now = held(&seed, &cluster);
                if now.is_some() && now != before {
                    break now;
                }
                if Instant::now() > deadline {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            let t0 = Instant::now();
            let Some(grown) = grown else {
                println!("  {cluster}: the allocation did not grow (FAILED)");
                ok = false;
                break;
            };
            while in_user_cluster(user).as_ref() != Some(&grown) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if in_user_cluster(user).as_ref() != Some(&grown) {
                println!("  {cluster}: the grown pool never reached the user cluster (FAILED)");
                ok = false;
                break;
            }
            latencies.push(t0.elapsed());
        }
        if !latencies.is_empty() {
            latencies.sort();
            let median = latencies[latencies.len() / 2];
            let worst = latencies[latencies.len() - 1];
            println!(
                "allocation grown on the seed -> IPAddressPool in the user cluster, {} clusters \
                 one at a time: median {:.0} ms, worst {:.0} ms",
                latencies.len(),
                median.as_secs_f64() * 1e3,
                worst.as_secs_f64() * 1e3
            );
        }
    }

    match peak_rss_kib(pid) {
        Some(kib) => println!(
            "  controller peak resident memory: {:.1} MiB",
            kib as f64 / 1024.0
        ),
        None => println!("  controller peak resident memory: unavailable"),
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    for u in &users {
        u.shutdown();
    }
    seed.shutdown();
    println!();
    ok
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![100, 1000]
    } else {
        sizes
    };
    println!("kipam addon applier benchmark (release build, default --tenant-concurrency 16)\n");
    let mut ok = true;
    for size in sizes {
        ok &= run(size);
    }
    if !ok {
        std::process::exit(1);
    }
}
