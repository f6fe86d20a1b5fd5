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
//! Before those, a **start**: a seed of its own where every cluster exists before the
//! controller starts (as after an upgrade or a fail-over): the time from the controller taking
//! the lease to its first allocation, to its first 100 clusters fully allocated, and to all,
//! the writes it sent, their rate, and that rate against the write model's ceiling.
//!
//! The stand-in charges what a real API server's writes cost (`kube_standin::WriteModel`,
//! calibrated on a kube-apiserver with etcd on 2 cores: about 5 ms per write alone, at most
//! 847 writes/s); `KIPAM_BENCH_FREE=1` runs on the free stand-in instead.
//! `KIPAM_BENCH_BEFORE=<path to another kipam binary>` runs every scale with that binary too and
//! prints the figures of both side by side; `KIPAM_BENCH_ARGS` adds controller flags to both
//! (for example `--write-concurrency=32`).
//!
//! Exits non-zero when an allocation is missing or two allocations of a pool overlap.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kipam::resources::IPAMAllocation;
use kube_standin::{ApiServer, Stats, WriteModel};
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
        // Under `KIPAM_BENCH_WRAP` the child is the wrapper: the controller it started would
        // outlive it, still working through the next phases, so it is stopped first and the
        // wrapper given time to write what it recorded.
        if std::env::var_os("KIPAM_BENCH_WRAP").is_some() {
            let pid = self.child.id();
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            for child in children.split_whitespace() {
                let comm = std::fs::read_to_string(format!("/proc/{child}/comm"));
                if let (Ok(child), Ok("kipam")) =
                    (child.parse::<i32>(), comm.as_deref().map(str::trim))
                {
                    // SAFETY: a plain syscall on a process this bench's child started.
                    unsafe { libc::kill(child, libc::SIGTERM) };
                }
            }
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_controller(api: &ApiServer, tag: &str, binary: &Path) -> Controller {
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
            c.args(wrap).arg(binary);
            c
        }
        None => Command::new(binary),
    };
    let extra = std::env::var("KIPAM_BENCH_ARGS").unwrap_or_default();
    let child = command
        .args(["controller", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .args(["--api-addr", "127.0.0.1:0", "--identity", "bench"])
        .args(extra.split_whitespace())
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

/// The write model the stand-in charges, unless `KIPAM_BENCH_FREE` is set.
fn write_model() -> Option<WriteModel> {
    match std::env::var("KIPAM_BENCH_FREE") {
        Ok(v) if !v.is_empty() && v != "0" => None,
        _ => Some(WriteModel::kube_apiserver_2_cores()),
    }
}

/// A stand-in with kipam's CRDs, its namespace, `pools` pools and the model on.
fn seed(pools: usize) -> ApiServer {
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
    api.set_write_model(write_model());
    api
}

/// When each allocation was first seen `Allocated`, by a watch of this process on the
/// stand-in (its own thread and runtime): `(when, namespace)` in the order seen.
struct AllocationWatch {
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AllocationWatch {
    /// Starts watching; returns once the watch's initial list is in.
    fn start(api: &ApiServer) -> AllocationWatch {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let seen: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let yaml = api.kubeconfig_yaml();
        let record = seen.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let kc = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
                let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                    .await
                    .expect("config");
                let client = kube::Client::try_from(cfg).expect("client");
                let api: kube::Api<IPAMAllocation> = kube::Api::all(client);
                let mut known = std::collections::HashSet::new();
                let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
                let mut ready = Some(ready_tx);
                loop {
                    let event = tokio::select! {
                        _ = &mut stopped => break,
                        e = events.next() => e,
                    };
                    match event {
                        Some(Ok(watcher::Event::Apply(a) | watcher::Event::InitApply(a))) => {
                            let key = (a.metadata.namespace.clone(), a.metadata.name.clone());
                            if a.phase() == kipam::resources::AllocationPhase::Allocated
                                && known.insert(key)
                            {
                                let ns = a.metadata.namespace.clone().unwrap_or_default();
                                record
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .push((Instant::now(), ns));
                            }
                        }
                        Some(Ok(watcher::Event::InitDone)) => {
                            if let Some(tx) = ready.take() {
                                let _ = tx.send(());
                            }
                        }
                        Some(_) => {}
                        None => break,
                    }
                }
            });
        });
        let _ = ready_rx.recv_timeout(Duration::from_secs(30));
        AllocationWatch {
            seen,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<(Instant, String)> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// After `since`: the first allocation, the moment `clusters` clusters had all `pools`
    /// allocations, and the moment every one of `want` was seen.
    fn times(
        &self,
        since: Instant,
        clusters: usize,
        pools: usize,
        want: usize,
    ) -> (Option<Duration>, Option<Duration>, Option<Duration>) {
        let seen = self.seen();
        let first = seen
            .first()
            .map(|(t, _)| t.saturating_duration_since(since));
        let mut per: std::collections::HashMap<&str, usize> = Default::default();
        let mut complete = 0;
        let mut first_n = None;
        for (t, ns) in &seen {
            let n = per.entry(ns.as_str()).or_default();
            *n += 1;
            if *n == pools {
                complete += 1;
                if complete == clusters && first_n.is_none() {
                    first_n = Some(t.saturating_duration_since(since));
                }
            }
        }
        let all = (seen.len() >= want)
            .then(|| {
                seen.get(want - 1)
                    .map(|(t, _)| t.saturating_duration_since(since))
            })
            .flatten();
        (first, first_n, all)
    }
}

impl Drop for AllocationWatch {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a run measured, for the table at the end.
#[derive(Default, Clone)]
struct Figures {
    /// Start: lease taken -> first allocation, -> 100 clusters allocated, -> all.
    start_first: Option<Duration>,
    start_100: Option<Duration>,
    start_all: Option<Duration>,
    start_writes: u64,
    /// Start: until the controller was quiet (every status written too), and the writes.
    start_quiet: Option<Duration>,
    start_total_writes: u64,
    /// Burst (clusters created after the lease was taken): all allocated, writes.
    burst_all: Option<Duration>,
    burst_writes: u64,
    /// Burst: until the controller was quiet.
    burst_quiet: Option<Duration>,
    steady_p50: Option<Duration>,
    steady_p99: Option<Duration>,
    steady_max: Option<Duration>,
    peak_mib: Option<f64>,
}

/// Start: every cluster exists before the controller starts. Returns whether everything was
/// allocated, without overlap.
fn start_phase(scale: Scale, binary: &Path, figures: &mut Figures) -> bool {
    let Scale { clusters, pools } = scale;
    let want = clusters * pools;
    let api = seed(pools);
    for i in 0..clusters {
        api.create(&cluster(&format!("c{i:05}")))
            .expect("cluster created");
    }
    let watch = AllocationWatch::start(&api);
    api.reset_stats();
    let ctl = start_controller(&api, &format!("start-{clusters}x{pools}"), binary);
    let begin = Instant::now();
    let mut leading = None;
    while begin.elapsed() < Duration::from_secs(30) {
        if api
            .get("leases", Some("kipam-system"), "kipam-seed")
            .is_some()
        {
            leading = Some(Instant::now());
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let Some(leading) = leading else {
        println!("start: FAILED: no lease within 30 s");
        return false;
    };
    let mut writes_at_all = None;
    while leading.elapsed() < Duration::from_secs(900) {
        if watch.seen.lock().map(|s| s.len()).unwrap_or(0) >= want {
            writes_at_all = Some(api.stats().writes());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (first, first_100, all) = watch.times(leading, clusters.min(100), pools, want);
    drop(watch);
    // Every write of the start (statuses too): until the controller is quiet.
    let before_settle = leading.elapsed();
    let settled = settle(
        &api,
        ctl.metrics_port,
        Duration::from_secs(2),
        Duration::from_secs(300),
    );
    let quiet = before_settle + settled;
    figures.start_quiet = Some(quiet);
    figures.start_total_writes = api.stats().writes();
    figures.start_first = first;
    figures.start_100 = first_100;
    figures.start_all = all;
    figures.start_writes = writes_at_all.unwrap_or_else(|| api.stats().writes());
    let (n, d) = distinct(&allocations(&api));
    let ok = n == want && d == want && all.is_some();
    let show = |d: Option<Duration>| {
        d.map_or("never".to_string(), |d| format!("{:.2} s", d.as_secs_f64()))
    };
    println!(
        "start ({clusters} clusters existing before the controller): from the lease to the first allocation {}, to {} clusters fully allocated {}, to all {want} {}",
        show(first),
        clusters.min(100),
        show(first_100),
        show(all)
    );
    if let Some(all) = all {
        let rate = figures.start_writes as f64 / all.as_secs_f64();
        println!(
            "  {} writes until all allocated: {:.0} writes/s{}",
            figures.start_writes,
            rate,
            model_ratio(rate, figures.start_writes, all)
        );
    }
    let rate = figures.start_total_writes as f64 / quiet.as_secs_f64();
    println!(
        "  {} writes in all, the last after {:.2} s: {:.0} writes/s{}",
        figures.start_total_writes,
        quiet.as_secs_f64(),
        rate,
        model_ratio(rate, figures.start_total_writes, quiet)
    );
    if !ok {
        println!("  FAILED: {n} of {want} allocations ({d} distinct)");
    }
    drop(ctl);
    api.shutdown();
    ok
}

/// The rate against the write model's ceiling, and the time against the shortest the model
/// allows for those writes.
fn model_ratio(rate: f64, writes: u64, took: Duration) -> String {
    match write_model() {
        Some(m) => format!(
            " = {:.2} of the model's ceiling ({:.0} writes/s); {:.2} × the {:.2} s the model needs for them",
            rate / m.ceiling(),
            m.ceiling(),
            took.as_secs_f64() / (writes as f64 / m.ceiling()),
            writes as f64 / m.ceiling()
        ),
        None => " (free stand-in)".to_string(),
    }
}

/// Runs one scale; false when something measured was wrong.
fn run(scale: Scale, binary: &Path, label: &str, figures: &mut Figures) -> bool {
    let Scale { clusters, pools } = scale;
    let want = clusters * pools;
    println!(
        "== {clusters} clusters × {pools} pools ({want} allocations), {label}: {} ==",
        binary.display()
    );
    match write_model() {
        Some(m) => println!(
            "stand-in: writes cost what the model says (about {:.1} ms alone, {} at once, ceiling {:.0} writes/s)",
            m.service_time(1).as_secs_f64() * 1000.0,
            m.slots(),
            m.ceiling()
        ),
        None => println!("stand-in: free writes (KIPAM_BENCH_FREE)"),
    }
    let mut ok = start_phase(scale, binary, figures);
    let api = seed(pools);
    let ctl = start_controller(&api, &format!("{clusters}x{pools}"), binary);
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
    let before_settle = start.elapsed();
    let settled = before_settle
        + settle(
            &api,
            ctl.metrics_port,
            Duration::from_secs(2),
            Duration::from_secs(300),
        );
    let burst = api.stats();
    figures.burst_quiet = Some(settled);
    let burst_peak = proc_status_kib(pid, "VmHWM:");
    let (n, d) = distinct(&allocations(&api));
    println!(
        "burst: {clusters} clusters created in the store in {:.2} s",
        created_in.as_secs_f64()
    );
    figures.burst_all = all_allocated;
    figures.burst_writes = burst.writes();
    match all_allocated {
        Some(t) => println!(
            "  all {want} allocations Allocated after {:.2} s ({:.0} allocations/s); the last write after {:.2} s; {} writes: {:.0} writes/s{}",
            t.as_secs_f64(),
            want as f64 / t.as_secs_f64(),
            settled.as_secs_f64(),
            burst.writes(),
            burst.writes() as f64 / settled.as_secs_f64(),
            model_ratio(
                burst.writes() as f64 / settled.as_secs_f64(),
                burst.writes(),
                settled
            )
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
    figures.steady_p50 = Some(percentile(&latencies, 50.0));
    figures.steady_p99 = Some(percentile(&latencies, 99.0));
    figures.steady_max = Some(percentile(&latencies, 100.0));
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
    figures.peak_mib = peak.map(|k| k as f64 / 1024.0);
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

/// The figures of every binary run at one scale, side by side.
fn table(scale: Scale, runs: &[(String, Figures)]) {
    let secs =
        |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.2} s", d.as_secs_f64()));
    let millis = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1} ms", ms(d)));
    let rate = |w: u64, d: Option<Duration>| {
        d.map_or("-".to_string(), |d| {
            format!("{:.0}", w as f64 / d.as_secs_f64())
        })
    };
    let ratio = |w: u64, d: Option<Duration>| match (write_model(), d) {
        (Some(m), Some(d)) => format!("{:.2}", w as f64 / d.as_secs_f64() / m.ceiling()),
        _ => "-".to_string(),
    };
    let over = |w: u64, d: Option<Duration>| match (write_model(), d) {
        (Some(m), Some(d)) => format!("{:.2}", d.as_secs_f64() / (w as f64 / m.ceiling())),
        _ => "-".to_string(),
    };
    type Row<'a> = (&'a str, Box<dyn Fn(&Figures) -> String + 'a>);
    let rows: Vec<Row> = vec![
        (
            "start: lease -> first allocation",
            Box::new(|f: &Figures| secs(f.start_first)),
        ),
        (
            "start: lease -> 100 clusters allocated",
            Box::new(|f: &Figures| secs(f.start_100)),
        ),
        (
            "start: lease -> all allocated",
            Box::new(|f: &Figures| secs(f.start_all)),
        ),
        (
            "start: writes until all allocated",
            Box::new(|f: &Figures| f.start_writes.to_string()),
        ),
        (
            "start: lease -> last write (quiet)",
            Box::new(|f: &Figures| secs(f.start_quiet)),
        ),
        (
            "start: writes in all",
            Box::new(|f: &Figures| f.start_total_writes.to_string()),
        ),
        (
            "start: writes/s (all writes ÷ time to the last)",
            Box::new(|f: &Figures| rate(f.start_total_writes, f.start_quiet)),
        ),
        (
            "start: ratio to the model's ceiling",
            Box::new(|f: &Figures| ratio(f.start_total_writes, f.start_quiet)),
        ),
        (
            "start: time to the last write ÷ (writes ÷ ceiling)",
            Box::new(|f: &Figures| over(f.start_total_writes, f.start_quiet)),
        ),
        (
            "burst: all allocated",
            Box::new(|f: &Figures| secs(f.burst_all)),
        ),
        (
            "burst: last write (quiet)",
            Box::new(|f: &Figures| secs(f.burst_quiet)),
        ),
        (
            "burst: writes in all",
            Box::new(|f: &Figures| f.burst_writes.to_string()),
        ),
        (
            "burst: writes/s (all writes ÷ time to the last)",
            Box::new(|f: &Figures| rate(f.burst_writes, f.burst_quiet)),
        ),
        (
            "burst: ratio to the model's ceiling",
            Box::new(|f: &Figures| ratio(f.burst_writes, f.burst_quiet)),
        ),
        (
            "burst: time to the last write ÷ (writes ÷ ceiling)",
            Box::new(|f: &Figures| over(f.burst_writes, f.burst_quiet)),
        ),
        (
            "new cluster: median",
            Box::new(|f: &Figures| millis(f.steady_p50)),
        ),
        (
            "new cluster: p99",
            Box::new(|f: &Figures| millis(f.steady_p99)),
        ),
        (
            "new cluster: worst",
            Box::new(|f: &Figures| millis(f.steady_max)),
        ),
        (
            "peak resident memory",
            Box::new(|f: &Figures| f.peak_mib.map_or("-".into(), |m| format!("{m:.1} MiB"))),
        ),
    ];
    println!(
        "== {} clusters × {} pools, {} ==",
        scale.clusters,
        scale.pools,
        match write_model() {
            Some(m) => format!("write model on (ceiling {:.0} writes/s)", m.ceiling()),
            None => "free stand-in".to_string(),
        }
    );
    print!("| figure |");
    for (label, _) in runs {
        print!(" {label} |");
    }
    println!();
    print!("|---|");
    for _ in runs {
        print!("---|");
    }
    println!();
    for (name, value) in &rows {
        print!("| {name} |");
        for (_, f) in runs {
            print!(" {} |", value(f));
        }
        println!();
    }
    println!();
}

fn main() {
    let scales = scales();
    println!(
        "kipam controller scale benchmark ({} cores)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut binaries: Vec<(String, PathBuf)> = Vec::new();
    if let Some(before) = std::env::var_os("KIPAM_BENCH_BEFORE").filter(|v| !v.is_empty()) {
        let before = PathBuf::from(before);
        if !before.is_file() {
            eprintln!("KIPAM_BENCH_BEFORE: {} is not a file", before.display());
            std::process::exit(2);
        }
        binaries.push(("before".into(), before));
    }
    binaries.push(("now".into(), PathBuf::from(env!("CARGO_BIN_EXE_kipam"))));
    let mut ok = true;
    let mut tables = Vec::new();
    for s in scales {
        planner_alone(s);
        let mut runs = Vec::new();
        for (label, binary) in &binaries {
            let mut figures = Figures::default();
            ok &= run(s, binary, label, &mut figures);
            runs.push((label.clone(), figures));
        }
        tables.push((s, runs));
    }
    for (s, runs) in &tables {
        table(*s, runs);
    }
    if !ok {
        std::process::exit(1);
    }
}
