//! Controller scale benchmark: `cargo bench --bench controller`.
//!
//! For each scale (`KIPAM_BENCH_SCALES`, default `1000x10`: clusters × pools, comma-separated,
//! for example `1000x10,10000x10`) it starts the API stand-in and one `kipam controller`
//! process (release build), creates the pools, then measures:
//!
//! 1. **burst**: every cluster created at once — time until every allocation exists and is
//!    `Allocated`, the controller's API requests by verb and resource until it is quiet again,
//!    writes per allocation and per cluster, and the controller's peak resident memory
//!    (`VmHWM` of the real process);
//! 2. **steady state**: 100 (`KIPAM_BENCH_NEW`) new clusters, one after the other — the time from each Cluster's
//!    create to all its allocations existing (median, p99), and the requests they cost;
//! 3. **idle**: `KIPAM_BENCH_IDLE_SECS` (default 60) seconds without changes — CPU time used by
//!    the controller (`utime + stime` from `/proc/PID/stat`), planning passes run, and the API
//!    requests it sent.
//!
//! Exits non-zero when an allocation is missing or two allocations of a pool overlap.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kipam::resources::IPAMAllocation;
use kube_standin::{ApiServer, Stats};
use serde_json::{Value, json};

/// New clusters created one by one at steady state (`KIPAM_BENCH_NEW`, default 100).
fn new_clusters() -> usize {
    std::env::var("KIPAM_BENCH_NEW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

#[derive(Clone, Copy, Debug)]
struct Scale {
    clusters: usize,
    pools: usize,
}

fn scales() -> Vec<Scale> {
    let text = std::env::var("KIPAM_BENCH_SCALES").unwrap_or_else(|_| "1000x10".into());
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parsed = item
            .split_once('x')
            .and_then(|(c, p)| Some((c.parse().ok()?, p.parse().ok()?)));
        match parsed {
            Some((clusters, pools)) if clusters > 0 && (1..=50).contains(&pools) => {
                out.push(Scale { clusters, pools })
            }
            _ => {
                eprintln!(
                    "KIPAM_BENCH_SCALES: {item:?} is not CLUSTERSxPOOLS (clusters at least 1, pools 1 to 50)"
                );
                std::process::exit(2);
            }
        }
    }
    out
}

fn idle_secs() -> u64 {
    std::env::var("KIPAM_BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

/// Pool `i`: even ones are IPv4 ranges (4 addresses per cluster from a /12), odd ones IPv6
/// prefixes (a /64 per cluster from a /44): room for far more than the clusters created.
fn pool(i: usize) -> Value {
    let dc = if i.is_multiple_of(2) {
        json!({"type": "range", "poolCidr": format!("10.{}.0.0/12", (i / 2) * 16), "allocationRange": 4})
    } else {
        json!({"type": "prefix", "poolCidr": format!("2001:db8:{:x}::/44", (i / 2) * 16), "allocationPrefix": 64})
    };
    json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "IPAMPool",
        "metadata": {"name": format!("pool-{i:02}")},
        "spec": {"datacenters": {"dc-1": dc}},
    })
}

fn cluster(name: &str) -> Value {
    json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"datacenter": "dc-1"},
    })
}

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// CPU seconds (user + system) the process has used.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(ticks as f64 / 100.0)
}

/// One counter from the controller's `/metrics`.
fn metric(port: u16, name: &str) -> Option<f64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Every allocation of the store that holds addresses and reads as `Allocated`.
fn allocations(api: &ApiServer) -> Vec<IPAMAllocation> {
    api.list("ipamallocations", None)
        .into_iter()
        .filter_map(|v| serde_json::from_value::<IPAMAllocation>(v).ok())
        .filter(|a| a.phase() == kipam::resources::AllocationPhase::Allocated)
        .collect()
}

/// `(total, distinct per pool)`: equal-sized allocations of one pool overlap exactly when
/// two of them start at the same address.
fn distinct(all: &[IPAMAllocation]) -> (usize, usize) {
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    for a in all {
        let held = a
            .spec
            .cidr
            .clone()
            .or_else(|| a.spec.addresses.first().cloned())
            .unwrap_or_default();
        seen.insert((a.metadata.name.clone().unwrap_or_default(), held));
    }
    (all.len(), seen.len())
}

fn allocated_for(api: &ApiServer, cluster: &str, pools: usize) -> bool {
    let ns = format!("cluster-{cluster}");
    (0..pools).all(|i| {
        api.get("ipamallocations", Some(&ns), &format!("pool-{i:02}"))
            .and_then(|v| serde_json::from_value::<IPAMAllocation>(v).ok())
            .is_some_and(|a| a.phase() == kipam::resources::AllocationPhase::Allocated)
    })
}

/// Whether the controller has put its finalizer on `cluster`.
fn finalized(api: &ApiServer, cluster: &str) -> bool {
    api.get("clusters", None, cluster).is_some_and(|c| {
        c["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
    })
}

/// Waits until the controller has sent no request (lease renewals aside) and started no
/// planning pass for `quiet`, and no pass is running: a pass that plans the whole seed can
/// think for seconds without a request, and whatever is measured next would wait behind it.
fn settle(api: &ApiServer, metrics_port: u16, quiet: Duration, limit: Duration) -> Duration {
    let start = Instant::now();
    let look = || {
        let s = api.stats();
        (
            s.total - s.resource("leases"),
            metric(metrics_port, "kipam_reconcile_passes_total").unwrap_or(0.0) as u64,
            metric(metrics_port, "kipam_reconcile_pass_duration_seconds_count").unwrap_or(0.0)
                as u64,
        )
    };
    let mut last = look();
    let mut since = Instant::now();
    while start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(100));
        let now = look();
        let (_, started, finished) = now;
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet && started == finished {
            break;
        }
    }
    start.elapsed().saturating_sub(quiet)
}

fn print_requests(stats: &Stats, indent: &str) {
    for ((verb, resource), n) in &stats.by_request {
        println!("{indent}{verb:<7} {resource:<30} {n}");
    }
}

struct Controller {
    child: Child,
    metrics_port: u16,
    dir: std::path::PathBuf,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_controller(api: &ApiServer, tag: &str) -> Controller {
    let dir = std::env::temp_dir().join(format!("kipam-bench-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let metrics_port = free_port();
    // `KIPAM_BENCH_WRAP="heaptrack -o /tmp/kipam"` runs the controller under a profiler.
    let wrap = std::env::var("KIPAM_BENCH_WRAP").unwrap_or_default();
    let mut wrap = wrap.split_whitespace();
    let mut command = match wrap.next() {
        Some(program) => {
            let mut c = Command::new(program);
            c.args(wrap).arg(env!("CARGO_BIN_EXE_kipam"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_kipam")),
    };
    let child = command
        .args(["controller", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .args(["--api-addr", "127.0.0.1:0", "--identity", "bench"])
        .env(
            "RUST_LOG",
            std::env::var("KIPAM_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("controller starts");
    Controller {
        child,
        metrics_port,
        dir,
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The pure planner alone, in this process: the whole seed, then what one new cluster costs.
fn planner_alone(scale: Scale) {
    use kipam::planner::{ClusterInput, PlanInputs, StoredAllocation, changed_pools, plan_pools};
    let pools: Vec<_> = (0..scale.pools)
        .map(|i| {
            let p: kipam::resources::IPAMPool = serde_json::from_value(pool(i)).expect("pool");
            kipam::validation::pool_input(&p).expect("valid pool")
        })
        .collect();
    let cluster_input = |name: String| ClusterInput {
        name,
        created: Some("2026-01-01T00:00:00Z".into()),
        datacenter: "dc-1".into(),
        overrides: Default::default(),
        deleting: false,
        paused: false,
        invalid: None,
        only_pool: None,
        hold: None,
    };
    let clusters: Vec<ClusterInput> = (0..scale.clusters)
        .map(|i| cluster_input(format!("c{i:05}")))
        .collect();
    let mut inputs = PlanInputs {
        pools,
        clusters,
        stored: Vec::new(),
        ..Default::default()
    };
    let t = Instant::now();
    let first = inputs.plan();
    let burst = t.elapsed();
    inputs.stored = first
        .decisions
        .iter()
        .map(|d| StoredAllocation {
            cluster: d.cluster.clone(),
            pool: d.pool.clone(),
            datacenter: d.datacenter.clone(),
            held: d.held.clone(),
            reclaim_policy: None,
            unreadable: None,
        })
        .collect();
    let before = inputs.clone();
    let t = Instant::now();
    let _ = inputs.plan();
    let steady = t.elapsed();
    inputs.clusters.push(cluster_input("n000".into()));
    let t = Instant::now();
    let dirty = changed_pools(&before, &inputs);
    let find = t.elapsed();
    let t = Instant::now();
    let _ = plan_pools(&inputs, &dirty);
    let partial = t.elapsed();
    let one: std::collections::BTreeSet<String> = dirty.iter().take(1).cloned().collect();
    let t = Instant::now();
    let _ = plan_pools(&inputs, &one);
    let single = t.elapsed();
    println!(
        "planner alone: first plan {:.0} ms; replan of the settled seed {:.0} ms; one new cluster: finding the {} dirty pools {:.1} ms, replanning them {:.0} ms (one pool {:.1} ms)",
        ms(burst),
        ms(steady),
        dirty.len(),
        ms(find),
        ms(partial),
        ms(single)
    );
}

/// Runs one scale; false when something measured was wrong.
fn run(scale: Scale) -> bool {
    let Scale { clusters, pools } = scale;
    let want = clusters * pools;
    println!("== {clusters} clusters × {pools} pools ({want} allocations) ==");
    let api = ApiServer::start_detached().expect("stand-in starts");
    for crd in kipam::resources::crds() {
        api.apply(&serde_json::to_value(&crd).expect("CRD JSON"))
            .expect("CRD registers");
    }
    api.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kipam-system"}}),
    )
    .expect("namespace");
    for i in 0..pools {
        api.apply(&pool(i)).expect("pool");
    }
    let ctl = start_controller(&api, &format!("{clusters}x{pools}"));
    let pid = ctl.child.id();

    // Leader, and settled on the seed without clusters.
    let start = Instant::now();
    while api
        .get("leases", Some("kipam-system"), "kipam-seed")
        .is_none()
        && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    settle(
        &api,
        ctl.metrics_port,
        Duration::from_secs(1),
        Duration::from_secs(30),
    );
    api.reset_stats();

    // 1. Burst.
    let start = Instant::now();
    for i in 0..clusters {
        api.create(&cluster(&format!("c{i:05}")))
            .expect("cluster created");
    }
    let created_in = start.elapsed();
    let mut all_allocated = None;
    while start.elapsed() < Duration::from_secs(900) {
        // Cheap progress first; the full check only once every create was sent.
        if api.stats().count("create", "ipamallocations") >= want as u64 {
            let (n, d) = distinct(&allocations(&api));
            if n == want && d == want {
                all_allocated = Some(start.elapsed());
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let settled = settle(
        &api,
        ctl.metrics_port,
        Duration::from_secs(2),
        Duration::from_secs(300),
    );
    let burst = api.stats();
    let burst_peak = proc_status_kib(pid, "VmHWM:");
    let (n, d) = distinct(&allocations(&api));
    let mut ok = true;
    println!(
        "burst: {clusters} clusters created in the store in {:.2} s",
        created_in.as_secs_f64()
    );
    match all_allocated {
        Some(t) => println!(
            "  all {want} allocations Allocated after {:.2} s ({:.0} allocations/s); quiet after {:.2} s",
            t.as_secs_f64(),
            want as f64 / t.as_secs_f64(),
            settled.as_secs_f64().max(t.as_secs_f64())
        ),
        None => {
            println!("  FAILED: {n} of {want} allocations ({d} distinct) after 900 s");
            ok = false;
        }
    }
    if n != d {
        println!("  FAILED: {} allocations share addresses", n - d);
        ok = false;
    }
    let writes = burst.writes();
    let allocation_writes: u64 = ["create", "update", "patch", "delete"]
        .iter()
        .map(|v| burst.count(v, "ipamallocations") + burst.count(v, "ipamallocations/status"))
        .sum();
    let other = writes - allocation_writes;
    println!(
        "  API requests: {} ({:.2} per cluster); writes {} ({:.2} per cluster)",
        burst.total,
        burst.total as f64 / clusters as f64,
        writes,
        writes as f64 / clusters as f64
    );
    print_requests(&burst, "    ");
    println!(
        "  writes per allocation: {:.3} (IPAMAllocation creates, updates, status); other writes per cluster: {:.3}",
        allocation_writes as f64 / want as f64,
        other as f64 / clusters as f64
    );
    if let Some(kib) = burst_peak {
        println!(
            "  controller peak resident memory: {:.1} MiB",
            kib as f64 / 1024.0
        );
    }

    // 2. Steady state: new clusters one by one.
    let new = new_clusters();
    api.reset_stats();
    let mut latencies = Vec::with_capacity(new);
    // Create -> the controller's first write for the cluster (its finalizer): how long the
    // cluster waits before its pass starts.
    let mut first_writes = Vec::with_capacity(new);
    for k in 0..new {
        let name = format!("n{k:03}");
        let t = Instant::now();
        api.create(&cluster(&name)).expect("new cluster");
        if std::env::var_os("KIPAM_BENCH_TRACE").is_some() {
            // To line up with the controller's log (UTC seconds since the epoch).
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            eprintln!("created {name} at {:.6}", at.as_secs_f64());
        }
        let mut first = None;
        while !allocated_for(&api, &name, pools) {
            if first.is_none() && finalized(&api, &name) {
                first = Some(t.elapsed());
            }
            if t.elapsed() > Duration::from_secs(60) {
                println!("  FAILED: {name} not allocated within 60 s");
                ok = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if std::env::var_os("KIPAM_BENCH_TRACE").is_some() {
            eprintln!("{name} allocated after {:.1} ms", ms(t.elapsed()));
        }
        latencies.push(t.elapsed());
        first_writes.push(first.unwrap_or_else(|| t.elapsed()));
        std::thread::sleep(Duration::from_millis(50));
    }
    settle(
        &api,
        ctl.metrics_port,
        Duration::from_secs(2),
        Duration::from_secs(120),
    );
    let steady = api.stats();
    latencies.sort();
    println!(
        "steady state: {new} new clusters one by one, create -> all {pools} allocations: median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 99.0)),
        ms(percentile(&latencies, 100.0)),
    );
    first_writes.sort();
    println!(
        "  create -> the cluster's finalizer (its pass has started): median {:.1} ms, p99 {:.1} ms",
        ms(percentile(&first_writes, 50.0)),
        ms(percentile(&first_writes, 99.0)),
    );
    println!(
        "  API requests: {} ({:.2} per new cluster), writes {:.2} per new cluster",
        steady.total,
        steady.total as f64 / new as f64,
        steady.writes() as f64 / new as f64
    );
    print_requests(&steady, "    ");

    // 3. Idle.
    let idle = idle_secs();
    settle(
        &api,
        ctl.metrics_port,
        Duration::from_secs(2),
        Duration::from_secs(60),
    );
    api.reset_stats();
    let passes_before = metric(ctl.metrics_port, "kipam_reconcile_passes_total");
    let cpu_before = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(idle));
    let cpu_after = cpu_seconds(pid);
    let passes_after = metric(ctl.metrics_port, "kipam_reconcile_passes_total");
    let quiet = api.stats();
    let cpu = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) => format!(
            "{:.2} s CPU ({:.2} %)",
            b - a,
            (b - a) * 100.0 / idle as f64
        ),
        _ => "CPU unavailable".into(),
    };
    let passes = match (passes_before, passes_after) {
        (Some(a), Some(b)) => format!("{} passes", b - a),
        _ => "passes unavailable".into(),
    };
    println!(
        "idle {idle} s: {cpu}, {passes}, {} API requests ({} on leases)",
        quiet.total,
        quiet.resource("leases")
    );
    print_requests(&quiet, "    ");
    let peak = proc_status_kib(pid, "VmHWM:");
    let rss = proc_status_kib(pid, "VmRSS:");
    if let (Some(peak), Some(rss)) = (peak, rss) {
        println!(
            "controller memory: peak {:.1} MiB, now {:.1} MiB",
            peak as f64 / 1024.0,
            rss as f64 / 1024.0
        );
    }
    let total = clusters + new;
    let (n, d) = distinct(&allocations(&api));
    if n != total * pools || n != d {
        println!(
            "FAILED: {n} allocations ({d} distinct), {} expected",
            total * pools
        );
        ok = false;
    }
    drop(ctl);
    api.shutdown();
    println!();
    ok
}

fn main() {
    let scales = scales();
    println!(
        "kipam controller scale benchmark ({} cores)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut ok = true;
    for s in scales {
        planner_alone(s);
        ok &= run(s);
    }
    if !ok {
        std::process::exit(1);
    }
}
