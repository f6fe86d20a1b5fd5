//! Demand-driven growth benchmark: `cargo bench --bench growth [-- LATENCY_SIZE [COST_SIZE]]`
//! (default `100 1000`).
//!
//! **Latency.** One seed stand-in and LATENCY_SIZE user-cluster stand-ins in this process, each
//! with the MetalLB stand-in of `tests/controller/metallb.rs` (looking every 50 ms), one
//! `kipam controller` (release build) in another process. The pool starts every cluster with 2
//! addresses and grows by 2 up to 8. Each user cluster first gets 2 LoadBalancer Services,
//! which take the initial addresses; then one more Service is created in every user cluster at
//! once. MetalLB refuses each (no free address), kipam grows the allocation, the applier
//! updates the user cluster's `IPAddressPool`, MetalLB serves the Service. Per Service, the
//! time from MetalLB's refusal to the Service's address: median, p99 and worst.
//!
//! **Cost.** COST_SIZE user clusters, each holding an allocation of the growing pool, a
//! kubeconfig and no Service: once the demand reader watches all of them, the controller's
//! sockets and resident memory over what it held before any Cluster existed, and its CPU time
//! over 60 idle seconds.
//!
//! **At scale.** `KIPAM_BENCH_SEED=CLUSTERSxPOOLS` (for example `10000x10`) fills the seed of
//! the latency phase first: POOLS more pools (IPv6 prefix pools of `dc-1`, without growth) and
//! CLUSTERS more Clusters without a user cluster, all allocated before the user clusters come.
//! The latency phase then runs beside them, demand read in every user cluster, and ends with
//! `KIPAM_BENCH_NEW` (default 20) new Clusters created one after the other: the time from
//! each create to all its allocations (median, p99, worst).
//!
//! `KIPAM_BENCH_BEFORE=PATH` runs the latency phase with the controller binary at PATH first,
//! then with this build (or `KIPAM_BENCH_BINARY=PATH`), for figures side by side in one run.
//!
//! `KIPAM_BENCH_LOG` sets the controller's `RUST_LOG` (default `warn`; its log goes to the
//! bench's standard error), e.g. `kipam::planning=debug` for every pass's steps.
//!
//! `KIPAM_BENCH_NO_GROWTH=1` runs the cost phase on a pool without `growth`: the difference
//! between the two runs is the demand reader's share (the addon applier holds drift watches
//! in every user cluster either way).
//!
//! Every figure printed was measured: when one cannot be (the controller died, `/proc` could
//! not be read, a phase timed out), the bench says which and exits non-zero instead of
//! printing it. Exits non-zero too when a Service does not get its address.

#[path = "../tests/controller/metallb.rs"]
mod metallb;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_standin::ApiServer;
use serde_json::json;

use metallb::MetalLb;

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
      allocationRange: 2
      growth: {increment: 2, max: 8, shrinkAfter: 10m}
";

/// A field of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> Result<u64, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("/proc/{pid}/status: {e}"))?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("/proc/{pid}/status has no {field} in KiB"))
}

/// Open sockets of a process.
fn sockets(pid: u32) -> Result<usize, String> {
    let dir =
        std::fs::read_dir(format!("/proc/{pid}/fd")).map_err(|e| format!("/proc/{pid}/fd: {e}"))?;
    Ok(dir
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
        })
        .count())
}

/// CPU time (user + system) of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, after)| after.split_whitespace().collect())
        .unwrap_or_default();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    match (field(11), field(12)) {
        (Some(user), Some(system)) => Ok(user + system),
        _ => Err(format!("/proc/{pid}/stat has no utime and stime: {stat:?}")),
    }
}

/// The clock ticks per second `/proc/<pid>/stat` counts in (`USER_HZ`).
fn ticks_per_second() -> Result<f64, String> {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz <= 0 {
        return Err(format!("sysconf(_SC_CLK_TCK) gave {hz}"));
    }
    Ok(hz as f64)
}

/// Fails unless the controller still runs: figures of a dead process are not figures.
fn alive(child: &mut Child, when: &str) -> Result<(), String> {
    match child.try_wait() {
        Ok(None) => Ok(()),
        Ok(Some(status)) => Err(format!("the controller exited ({status}) {when}")),
        Err(e) => Err(format!("the controller's state cannot be read {when}: {e}")),
    }
}

/// The `n`th percentile of `sorted`, which is not empty.
fn percentile_ms(sorted: &[Duration], n: usize) -> f64 {
    let i = (sorted.len() * n).div_ceil(100).saturating_sub(1);
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

fn name(i: usize) -> String {
    format!("c{i:04}")
}

/// `KIPAM_BENCH_SEED`: (clusters, pools) filling the seed besides the user clusters.
fn seed_scale() -> Result<(usize, usize), String> {
    let Ok(text) = std::env::var("KIPAM_BENCH_SEED") else {
        return Ok((0, 0));
    };
    text.split_once('x')
        .and_then(|(c, p)| Some((c.trim().parse().ok()?, p.trim().parse().ok()?)))
        .filter(|&(_, p): &(usize, usize)| p <= 200)
        .ok_or_else(|| {
            format!("KIPAM_BENCH_SEED: {text:?} is not CLUSTERSxPOOLS (pools up to 200)")
        })
}

/// Seed pool `i`: an IPv6 prefix pool of `dc-1` handing out /64s, apart from every other.
fn seed_pool(i: usize) -> serde_json::Value {
    json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": format!("seed-{i:03}")},
        "spec": {"datacenters": {"dc-1": {"type": "prefix",
            "poolCidr": format!("2001:db8:{i:x}::/48"), "allocationPrefix": 64}}}})
}

/// Whether every pool serving `dc-1` (the growing one and `pools` seed pools) has an
/// allocation for `cluster`.
fn allocated_for(seed: &ApiServer, cluster: &str, pools: usize) -> bool {
    let ns = format!("cluster-{cluster}");
    std::iter::once("metallb".to_string())
        .chain((0..pools).map(|i| format!("seed-{i:03}")))
        .all(|p| seed.get("ipamallocations", Some(&ns), &p).is_some())
}

struct Setup {
    rt: tokio::runtime::Runtime,
    seed: ApiServer,
    users: Vec<ApiServer>,
    child: Child,
    before: (usize, u64),
    _dir: std::path::PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A seed with the pool, `size` user clusters registered (Secret, Addon, Cluster), and the
/// controller running; returns once every user cluster holds its initial pool, and fails
/// when one does not within 10 minutes.
fn setup(size: usize) -> Result<Setup, String> {
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
    // `KIPAM_BENCH_NO_GROWTH=1`: the same seed without `growth`, to tell the demand reader's
    // cost from the addon applier's (which holds drift watches in every user cluster too).
    let pool = if std::env::var_os("KIPAM_BENCH_NO_GROWTH").is_some() {
        POOL.replace(
            "      growth: {increment: 2, max: 8, shrinkAfter: 10m}\n",
            "",
        )
    } else {
        POOL.to_string()
    };
    seed.apply_yaml(&pool).expect("pool");
    let (fill, fill_pools) = seed_scale()?;
    for i in 0..fill_pools {
        seed.apply(&seed_pool(i)).expect("seed pool");
    }
    for i in 0..fill {
        seed.create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": format!("s{i:05}")}, "spec": {"datacenter": "dc-1"}}),
        )
        .expect("seed cluster");
    }
    let mut users = Vec::with_capacity(size);
    for i in 0..size {
        let user = rt.block_on(ApiServer::start()).expect("user cluster");
        user.set_bookmark_interval(Duration::from_secs(60));
        for ns in ["metallb-system", "default"] {
            let _ = user.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns}}));
        }
        user.apply_yaml(METALLB_CRDS).expect("CRDs");
        let ns = format!("cluster-{}", name(i));
        seed.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"ipam.kipam.dev/cluster": name(i)}}}))
            .expect("cluster namespace");
        seed.apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "kubeconfig", "namespace": ns},
            "stringData": {"kubeconfig": user.kubeconfig_yaml()}}))
            .expect("secret");
        seed.create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "metallb", "namespace": ns}, "spec": {"name": "metallb"}}),
        )
        .expect("addon");
        users.push(user);
    }
    let dir = std::env::temp_dir().join(format!("kipam-bench-growth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    seed.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let child = Command::new(binary())
        .args(["controller", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--metrics-addr", "127.0.0.1:0", "--identity", "bench"])
        .args(["--api-addr", "127.0.0.1:0"])
        .env(
            "RUST_LOG",
            std::env::var("KIPAM_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("controller starts");
    let pid = child.id();
    // From here on the controller is killed when `setup` returns early.
    let mut s = Setup {
        rt,
        seed,
        users,
        child,
        before: (0, 0),
        _dir: dir,
    };
    let start = Instant::now();
    while s
        .seed
        .get("leases", Some("kipam-system"), "kipam-seed")
        .is_none()
    {
        alive(&mut s.child, "before taking the Lease")?;
        if start.elapsed() > Duration::from_secs(20) {
            return Err("the controller took no Lease within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if fill > 0 {
        let want = (fill * (fill_pools + 1)) as u64;
        let start = Instant::now();
        while s.seed.stats().count("create", "ipamallocations") < want
            || !allocated_for(&s.seed, &format!("s{:05}", fill - 1), fill_pools)
        {
            alive(
                &mut s.child,
                "while the seed's clusters got their allocations",
            )?;
            if start.elapsed() > Duration::from_secs(900) {
                return Err(format!(
                    "the seed's {fill} clusters are not allocated after 900 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        println!(
            "seed: {fill} clusters × {} pools allocated {:.1} s after the Lease",
            fill_pools + 1,
            start.elapsed().as_secs_f64()
        );
    }
    std::thread::sleep(Duration::from_secs(1));
    alive(&mut s.child, "before the clusters were created")?;
    s.before = (sockets(pid)?, status_kib(pid, "VmRSS:")?);
    let (seed, users) = (&s.seed, &s.users);
    for i in 0..size {
        seed.create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": name(i)},
            "spec": {"datacenter": "dc-1", "kubeconfig": {"secretRef": {"name": "kubeconfig"}}}}),
        )
        .expect("cluster");
    }
    let start = Instant::now();
    let mut pending: Vec<usize> = (0..size).collect();
    while !pending.is_empty() && start.elapsed() < Duration::from_secs(600) {
        alive(&mut s.child, "while the clusters got their initial pools")?;
        pending.retain(|&i| {
            users[i]
                .get(
                    "ipaddresspools.metallb.io",
                    Some("metallb-system"),
                    "kipam-managed-pool",
                )
                .is_none()
        });
        std::thread::sleep(Duration::from_millis(50));
    }
    if !pending.is_empty() {
        return Err(format!(
            "{} of {size} user clusters hold no initial pool after {:.0} s",
            pending.len(),
            start.elapsed().as_secs_f64()
        ));
    }
    println!(
        "{size} user clusters hold their initial pool after {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(s)
}

fn create(user: &ApiServer, name: &str) {
    user.create(&json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}))
        .expect("service");
}

fn served(user: &ApiServer, name: &str) -> bool {
    user.get("services", Some("default"), name)
        .is_some_and(|s| s["status"]["loadBalancer"]["ingress"][0]["ip"].is_string())
}

/// The latency phase; `Ok(false)` when a Service was not served after a refusal.
fn latency(size: usize) -> Result<bool, String> {
    let mut s = setup(size)?;
    let lbs: Vec<MetalLb> = s
        .users
        .iter()
        .map(|u| MetalLb::start_every(u.clone(), Duration::from_millis(50)))
        .collect();
    for u in &s.users {
        create(u, "first");
        create(u, "second");
    }
    let start = Instant::now();
    while !s
        .users
        .iter()
        .all(|u| served(u, "first") && served(u, "second"))
    {
        if start.elapsed() > Duration::from_secs(120) {
            let waiting = s
                .users
                .iter()
                .filter(|u| !(served(u, "first") && served(u, "second")))
                .count();
            return Err(format!(
                "{waiting} of {size} user clusters still wait for their first two Services after 120 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the reader settle, then one Service more in every user cluster at once.
    std::thread::sleep(Duration::from_secs(2));
    for u in &s.users {
        create(u, "third");
    }
    let start = Instant::now();
    while !s.users.iter().all(|u| served(u, "third")) && start.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    alive(&mut s.child, "during the latency phase")?;
    let mut times: Vec<Duration> = Vec::new();
    let mut missing = 0;
    for lb in &lbs {
        let log = lb.log.lock().map_err(|_| "a MetalLB stand-in panicked")?;
        match (
            log.refused.get("default/third"),
            log.served.get("default/third"),
        ) {
            (Some(r), Some((t, _))) => times.push(t.saturating_duration_since(*r)),
            _ => missing += 1,
        }
    }
    times.sort();
    let Some(worst) = times.last() else {
        println!("latency: no Service was served after a refusal (FAILED)");
        return Ok(false);
    };
    println!(
        "refusal to address, {} Services across {size} user clusters: p50 {:.0} ms, p99 {:.0} ms, worst {:.0} ms{}",
        times.len(),
        percentile_ms(&times, 50),
        percentile_ms(&times, 99),
        worst.as_secs_f64() * 1e3,
        if missing > 0 {
            format!(" — {missing} not refused first or not served (FAILED)")
        } else {
            String::new()
        }
    );
    let (fill, fill_pools) = seed_scale()?;
    let mut ok = missing == 0;
    if fill > 0 {
        ok &= new_clusters(&mut s, fill_pools)?;
    }
    drop(lbs);
    let _ = (&s.rt, &s.seed);
    Ok(ok)
}

/// New Clusters one after the other while demand is read: create -> all their allocations.
fn new_clusters(s: &mut Setup, fill_pools: usize) -> Result<bool, String> {
    let new: usize = std::env::var("KIPAM_BENCH_NEW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut times = Vec::with_capacity(new);
    for k in 0..new {
        let name = format!("n{k:03}");
        let t = Instant::now();
        s.seed
            .create(
                &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
                "metadata": {"name": name}, "spec": {"datacenter": "dc-1"}}),
            )
            .expect("new cluster");
        while !allocated_for(&s.seed, &name, fill_pools) {
            if t.elapsed() > Duration::from_secs(60) {
                println!("new cluster {name}: not allocated within 60 s (FAILED)");
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        times.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    alive(&mut s.child, "while new clusters came")?;
    times.sort();
    if let Some(worst) = times.last() {
        println!(
            "new clusters while demand is read, create -> all {} allocations, {} clusters: median {:.0} ms, p99 {:.0} ms, worst {:.0} ms",
            fill_pools + 1,
            times.len(),
            percentile_ms(&times, 50),
            percentile_ms(&times, 99),
            worst.as_secs_f64() * 1e3
        );
    }
    Ok(true)
}

fn cost(size: usize) -> Result<(), String> {
    let hz = ticks_per_second()?;
    let mut s = setup(size)?;
    let pid = s.child.id();
    // The reader opens two watches per user cluster.
    let start = Instant::now();
    let want = s.before.0 + 2 * size;
    let growing = std::env::var_os("KIPAM_BENCH_NO_GROWTH").is_none();
    while growing && sockets(pid)? < want && start.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(5));
    alive(&mut s.child, "before the idle minute")?;
    let (socks, rss) = (sockets(pid)?, status_kib(pid, "VmRSS:")?);
    let ticks0 = cpu_ticks(pid)?;
    std::thread::sleep(Duration::from_secs(60));
    let ticks1 = cpu_ticks(pid)?;
    alive(&mut s.child, "during the idle minute")?;
    let ticks = ticks1.checked_sub(ticks0).ok_or_else(|| {
        format!("the controller's CPU time went back from {ticks0} to {ticks1} ticks")
    })?;
    let watches: usize = s
        .users
        .iter()
        .map(|u| u.stats().count("watch", "services") as usize)
        .sum();
    let rss_delta = rss as f64 - s.before.1 as f64;
    println!(
        "watching {size} user clusters: {:+} sockets ({} watch requests on Services seen), resident memory {:+.1} MiB ({:+.1} KiB per user cluster), CPU over 60 s idle {:.2} s ({:.1} %)",
        socks as i64 - s.before.0 as i64,
        watches,
        rss_delta / 1024.0,
        rss_delta / size as f64,
        ticks as f64 / hz,
        ticks as f64 / hz / 60.0 * 100.0,
    );
    Ok(())
}

/// The controller binary the latency phase runs (`KIPAM_BENCH_BEFORE` runs it first with an
/// older build, for figures side by side); the cost phase runs this build.
static BINARY: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// This build's controller, or `KIPAM_BENCH_BINARY=<path>` (another kipam binary, to compare).
fn this_build() -> String {
    std::env::var("KIPAM_BENCH_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kipam").to_string())
}

fn binary() -> String {
    let chosen = BINARY.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if chosen.is_empty() {
        this_build()
    } else {
        chosen
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let latency_size = sizes.first().copied().unwrap_or(100);
    let cost_size = sizes.get(1).copied().unwrap_or(1000);
    let mut binaries = Vec::new();
    if let Ok(before) = std::env::var("KIPAM_BENCH_BEFORE") {
        binaries.push(("before", before));
    }
    binaries.push(("this build", this_build()));
    let mut latency_ok = Ok(true);
    if latency_size > 0 {
        for (label, path) in &binaries {
            if binaries.len() > 1 {
                println!("== {label}: {path}");
            }
            *BINARY.lock().unwrap_or_else(|p| p.into_inner()) = path.clone();
            latency_ok = match (latency_ok, latency(latency_size)) {
                (Ok(a), Ok(b)) => Ok(a && b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        BINARY.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
    let cost_ok = if cost_size == 0 {
        Ok(())
    } else {
        cost(cost_size)
    };
    let mut failed = false;
    match latency_ok {
        Ok(ok) => failed |= !ok,
        Err(e) => {
            eprintln!("growth bench, latency: not measured: {e}");
            failed = true;
        }
    }
    if let Err(e) = cost_ok {
        eprintln!("growth bench, cost: not measured: {e}");
        failed = true;
    }
    if failed {
        std::process::exit(1);
    }
}
