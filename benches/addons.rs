//! Addon applier benchmark: `cargo bench --bench addons [-- SIZES…]` (default `100 1000`).
//!
//! For each size N: one seed stand-in and N user-cluster stand-ins (each with MetalLB's CRDs)
//! in this process, one `kipam controller` (release build) in another. Every cluster's
//! namespace, kubeconfig Secret and `metallb` Addon exist first; then the N Clusters are created
//! at once and the benchmark measures the **first apply**: the time until every user cluster
//! holds its `IPAddressPool` with exactly its allocation. For N ≤ 100 it then grows the
//! allocation of each cluster in turn and measures, per cluster, the time from the grown
//! `IPAMAllocation` appearing on the seed to the grown `IPAddressPool` in the user cluster
//! (median and worst).
//!
//! Then the **drift** phase: once every user cluster has kipam's drift watches open, it states
//! their cost (watches and sockets the controller holds, its resident memory over what it held
//! before any Cluster existed), edits the `IPAddressPool` of up to 100 clusters by hand, one at
//! a time, and measures each edit-to-repair time (median, p99, worst), then edits every
//! cluster's pool at once and measures how long until all are repaired. The controller runs
//! with the default `--addon-resync` (300 s), so every repair comes from the watches.
//!
//! Prints the controller's peak resident memory and the requests the user clusters served.
//! Exits non-zero when a user cluster does not get its objects or a hand edit is not repaired.
//!
//! The user clusters are served over TLS with ALPN offering HTTP/2 and HTTP/1.1, as a real API
//! server is (`KIPAM_BENCH_PLAIN=1`: plain HTTP/1.1 instead), and the drift phase counts the
//! connections each one holds from kipam. `KIPAM_BENCH_GROWTH=1` gives the pool `growth`, so the
//! demand reader watches every user cluster's Services and Events too.
//! `KIPAM_BENCH_BEFORE=<path to another kipam binary>` runs every size with that binary first,
//! then with this build's, so both sets of figures come from one run.
//!
//! `KIPAM_BENCH_ADOPT=1` measures the **adoption dry run** instead (`docs/adopt.md`): the pool
//! datacenter says `adopt: DryRun`, every user cluster has a hand-made MetalLB pool and two
//! LoadBalancer Services holding addresses, and the figure is the time from creating the N
//! Clusters to every one showing its complete report (`status.adoption.state: DryRun`), with
//! the requests the user clusters served for it. Nothing may be written into a user cluster or
//! allocated meanwhile.

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
      poolCidr: 10.0.0.0/12
      allocationRange: 8
";

/// [`POOL`] with demand-driven growth (`KIPAM_BENCH_GROWTH=1`).
const GROWTH: &str = "      growth: {increment: 8, max: 32, shrinkAfter: 10m}\n";

fn tls() -> bool {
    std::env::var_os("KIPAM_BENCH_PLAIN").is_none()
}

fn growth() -> bool {
    std::env::var_os("KIPAM_BENCH_GROWTH").is_some()
}

fn adopt() -> bool {
    std::env::var_os("KIPAM_BENCH_ADOPT").is_some()
}

/// The first address of user cluster `i`'s hand-made pool, inside [`POOL`]'s CIDR.
fn hand_made_base(i: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)) + (i as u32) * 16)
}

/// A hand-made MetalLB pool of 8 addresses and two Services holding the first two.
fn brownfield(user: &ApiServer, i: usize) {
    let base = u32::from(hand_made_base(i));
    let at = |k: u32| std::net::Ipv4Addr::from(base + k).to_string();
    user.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}))
        .expect("namespace");
    user.apply(
        &json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "legacy", "namespace": "metallb-system"},
        "spec": {"addresses": [format!("{}-{}", at(0), at(7))]}}),
    )
    .expect("hand-made pool");
    for (k, svc) in ["a", "b"].iter().enumerate() {
        user.apply(&json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc, "namespace": "apps"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}}))
            .expect("service");
        user.set_status(
            "services",
            Some("apps"),
            svc,
            json!({"loadBalancer": {"ingress": [{"ip": at(k as u32)}]}}),
        )
        .expect("service status");
    }
}

/// The adoption dry run: every Cluster's complete report, and nothing written.
fn dry_run(size: usize, seed: &ApiServer, users: &[ApiServer]) -> bool {
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
    let report = |i: usize| {
        seed.get("clusters", None, &name(i))
            .and_then(|c| c.pointer("/status/adoption").cloned())
    };
    let mut pending: Vec<usize> = (0..size).collect();
    while !pending.is_empty() && start.elapsed() < Duration::from_secs(600) {
        pending.retain(|&i| {
            !report(i).is_some_and(|a| a["state"] == "DryRun" && a["servedTotal"] == 2)
        });
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let took = start.elapsed();
    let mut ok = pending.is_empty();
    println!(
        "adoption dry run, {size} clusters created at once: every Cluster shows its complete \
         report after {:.2} s{}",
        took.as_secs_f64(),
        if ok {
            String::new()
        } else {
            format!(" — {} still without one (FAILED)", pending.len())
        }
    );
    let stats: Vec<_> = users.iter().map(|u| u.stats()).collect();
    let requests: u64 = stats.iter().map(|s| s.total).sum();
    let writes: u64 = stats
        .iter()
        .map(|s| s.verb("create") + s.verb("update") + s.verb("patch") + s.verb("delete"))
        .sum();
    println!(
        "  requests served by the user clusters: {requests} ({:.1} per cluster), of which \
         writes: {writes}",
        requests as f64 / size as f64
    );
    let allocations = seed.list("ipamallocations", None).len();
    if writes > 0 || allocations > 0 {
        println!(
            "  a dry run wrote {writes} time(s) into user clusters and made {allocations} allocation(s) (FAILED)"
        );
        ok = false;
    }
    ok
}

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

/// A figure of `/proc/<pid>/status` in KiB: `VmHWM` (peak resident) or `VmRSS` (resident).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Sockets the process holds open (its connections and listeners).
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// The `n`-th percentile of sorted durations, in ms.
fn percentile_ms(sorted: &[Duration], n: usize) -> f64 {
    let i = (sorted.len() * n).div_ceil(100).saturating_sub(1);
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

/// A hand edit of the user cluster's pool: addresses kipam never hands out.
const HAND_EDIT: &str = "192.0.2.0-192.0.2.255";

fn hand_edit(user: &ApiServer) {
    user.apply(
        &json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": "kipam-managed-pool", "namespace": "metallb-system"},
        "spec": {"addresses": [HAND_EDIT]}}),
    )
    .expect("hand edit");
}

/// The drift phase (see the module's documentation); false when a hand edit is not repaired.
fn drift(size: usize, pid: u32, users: &[ApiServer], before: (usize, u64)) -> bool {
    let growing = growth();
    // The watches open once a cluster's first sync has applied: wait until each user cluster
    // has served a watch of both kinds kipam applied there.
    let start = Instant::now();
    // With growth, the demand reader watches Services; it watches `AllocationFailed` events
    // only while a Service waits (none does here; builds before that watched them always).
    let watching = |u: &ApiServer| {
        let stats = u.stats();
        stats.count("watch", "ipaddresspools") > 0
            && stats.count("watch", "l2advertisements") > 0
            && (!growing || stats.count("watch", "services") > 0)
    };
    while !users.iter().all(watching) && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let open = users.iter().filter(|u| watching(u)).count();
    if open < size {
        println!("  drift watches open in only {open} of {size} user clusters (FAILED)");
        return false;
    }
    std::thread::sleep(Duration::from_millis(500));
    let (sockets_before, rss_before) = before;
    let sockets_now = sockets(pid);
    let rss_now = status_kib(pid, "VmRSS:").unwrap_or(0);
    let kinds = ["ipaddresspools", "l2advertisements", "services", "events"];
    let open: u64 = users
        .iter()
        .map(|u| {
            let stats = u.stats();
            kinds.iter().filter(|k| stats.count("watch", k) > 0).count() as u64
        })
        .sum();
    println!(
        "watches: {:.2} per user cluster (IPAddressPool, L2Advertisement in metallb-system{}), \
         {open} watched; the controller holds {sockets_now} sockets ({:.2} per user cluster over \
         the {sockets_before} it held before), resident memory {:.1} MiB ({:.0} KiB per user \
         cluster over the {:.1} MiB before any Cluster, everything kipam keeps per cluster \
         included)",
        open as f64 / size as f64,
        if growing {
            "; Services, and Events where they are watched, for growth"
        } else {
            ""
        },
        (sockets_now.saturating_sub(sockets_before)) as f64 / size as f64,
        rss_now as f64 / 1024.0,
        rss_now.saturating_sub(rss_before) as f64 / size as f64,
        rss_before as f64 / 1024.0,
    );
    // A fleet shares one count of connections (see `run`).
    if let Some(c) = users.first().and_then(|u| u.connections()) {
        println!(
            "  connections to the user clusters (TLS, ALPN h2 and http/1.1): {} open, {:.2} per \
             user cluster, {} opened since the Clusters were created",
            c.open(),
            c.open() as f64 / size as f64,
            c.total(),
        );
    }

    // One hand edit at a time, spread over the clusters.
    let sample: Vec<usize> = (0..size.min(100))
        .map(|k| k * size / size.min(100))
        .collect();
    let mut repairs = Vec::with_capacity(sample.len());
    for &i in &sample {
        let want = in_user_cluster(&users[i]);
        hand_edit(&users[i]);
        let t0 = Instant::now();
        while in_user_cluster(&users[i]) != want && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if in_user_cluster(&users[i]) != want {
            println!(
                "  {}: the hand edit was not repaired in 30 s (FAILED)",
                name(i)
            );
            return false;
        }
        repairs.push(t0.elapsed());
    }
    repairs.sort();
    println!(
        "hand edit of an IPAddressPool -> repaired, {} clusters one at a time: median {:.0} ms, \
         p99 {:.0} ms, worst {:.0} ms",
        repairs.len(),
        percentile_ms(&repairs, 50),
        percentile_ms(&repairs, 99),
        percentile_ms(&repairs, 100),
    );

    // Every cluster's pool edited at once.
    let wants: Vec<Option<Vec<Value>>> = users.iter().map(in_user_cluster).collect();
    let t0 = Instant::now();
    for u in users {
        hand_edit(u);
    }
    let edited = t0.elapsed();
    let mut pending: Vec<usize> = (0..size).collect();
    let mut repairs = Vec::with_capacity(size);
    // 120 s, or 30 ms per cluster beyond 4,000 (the repairs go 16 user clusters at a time).
    let cap = Duration::from_secs(120).max(Duration::from_millis(30) * size as u32);
    while !pending.is_empty() && t0.elapsed() < cap {
        pending.retain(|&i| {
            if in_user_cluster(&users[i]) == wants[i] {
                repairs.push(t0.elapsed());
                false
            } else {
                true
            }
        });
        std::thread::sleep(Duration::from_millis(5));
    }
    if !pending.is_empty() {
        println!(
            "  {} hand edits not repaired in {} s (FAILED)",
            pending.len(),
            cap.as_secs()
        );
        return false;
    }
    repairs.sort();
    println!(
        "hand edits of all {size} IPAddressPools at once (made in {:.0} ms) -> repaired: \
         median {:.0} ms, p99 {:.0} ms, all after {:.0} ms",
        edited.as_secs_f64() * 1e3,
        percentile_ms(&repairs, 50),
        percentile_ms(&repairs, 99),
        percentile_ms(&repairs, 100),
    );
    true
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

fn run(size: usize, binary: &str) -> bool {
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
    let pool = if growth() {
        format!("{POOL}{GROWTH}")
    } else {
        POOL.to_string()
    };
    let pool = if adopt() {
        format!("{}      adopt: DryRun\n", pool.trim_end_matches(' '))
    } else {
        pool
    };
    seed.apply_yaml(&pool).expect("pool");
    let setup = Instant::now();
    // Over TLS, one listener serves every user cluster, each under its own path (a process
    // may hold only so many sockets; kipam still opens a connection per user cluster).
    let mut fleet = if tls() {
        rt.block_on(ApiServer::start_tls_fleet(size))
            .expect("user clusters start")
            .into_iter()
    } else {
        Vec::new().into_iter()
    };
    let mut users = Vec::with_capacity(size);
    for i in 0..size {
        let user = match fleet.next() {
            Some(user) => user,
            None => rt
                .block_on(ApiServer::start())
                .expect("user cluster starts"),
        };
        // As often as a real API server sends them (the stand-in's default is every 5 s, which
        // over 2,000 drift watches would be 400 bookmarks a second).
        user.set_bookmark_interval(Duration::from_secs(60));
        user.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "metallb-system"}}))
            .expect("namespace");
        user.apply_yaml(METALLB_CRDS).expect("CRDs");
        if adopt() {
            brownfield(&user, i);
        }
        let cluster = name(i);
        let ns = format!("cluster-{cluster}");
        seed.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"ipam.kipam.dev/cluster": cluster}}}))
            .expect("cluster namespace");
        seed.apply(&json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "kubeconfig", "namespace": ns},
        "stringData": {"kubeconfig": if tls() {
            user.kubeconfig_yaml()
        } else {
            kubeconfig_with_ca(&user)
        }}}))
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
    // `KIPAM_BENCH_WRAP="heaptrack -o /tmp/kipam"` runs the controller under a profiler (the
    // memory and socket figures are then the profiler's process, not the controller's).
    let wrap = std::env::var("KIPAM_BENCH_WRAP").unwrap_or_default();
    let mut wrap = wrap.split_whitespace();
    let mut command = match wrap.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(wrap).arg(binary);
            // A group of its own, so that `finish` stops the controller, not only the wrapper.
            std::os::unix::process::CommandExt::process_group(&mut c, 0);
            c
        }
        None => Command::new(binary),
    };
    let mut child = command
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
    let before = (sockets(pid), status_kib(pid, "VmRSS:").unwrap_or(0));
    if adopt() {
        let ok = dry_run(size, &seed, &users);
        finish(&mut child, &dir, &users, &seed);
        return ok;
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
    let watching: u64 = users
        .iter()
        .map(|u| u.stats().verb("list") + u.stats().verb("watch"))
        .sum();
    println!(
        "  requests served by the user clusters: {requests} ({:.1} per cluster, of which {:.1} \
         the drift watches' lists and watches opened so far)",
        requests as f64 / size as f64,
        watching as f64 / size as f64
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

    if ok {
        ok = drift(size, pid, &users, before);
    }

    finish(&mut child, &dir, &users, &seed);
    ok
}

/// Prints the controller's peak memory, stops it and every stand-in, and removes `dir`.
fn finish(
    child: &mut std::process::Child,
    dir: &std::path::Path,
    users: &[ApiServer],
    seed: &ApiServer,
) {
    match peak_rss_kib(child.id()) {
        Some(kib) => println!(
            "  controller peak resident memory: {:.1} MiB",
            kib as f64 / 1024.0
        ),
        None => println!("  controller peak resident memory: unavailable"),
    }
    if std::env::var_os("KIPAM_BENCH_WRAP").is_some() {
        // The wrapper and the controller it runs: SIGTERM, so that a profiler writes its data.
        // SAFETY: signals the process group this benchmark started (see `run`).
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM);
        }
    } else {
        let _ = child.kill();
    }
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
    for u in users {
        u.shutdown();
    }
    seed.shutdown();
    println!();
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
    println!(
        "kipam addon applier benchmark (release build, default --tenant-concurrency 16; user \
         clusters over {}{})\n",
        if tls() { "TLS" } else { "plain HTTP" },
        if growth() { "; growth on" } else { "" }
    );
    let mut binaries = Vec::new();
    if let Ok(before) = std::env::var("KIPAM_BENCH_BEFORE") {
        binaries.push(("before", before));
    }
    binaries.push(("this build", env!("CARGO_BIN_EXE_kipam").to_string()));
    let mut ok = true;
    for size in sizes {
        for (label, binary) in &binaries {
            if binaries.len() > 1 {
                println!("== {label}: {binary}");
            }
            ok &= run(size, binary);
        }
    }
    if !ok {
        std::process::exit(1);
    }
}
