//! Cluster API claims benchmark: `cargo bench --bench claims [-- CLAIMS [CLUSTERS [SEQUENTIAL]]]`
//! (default `10000 1000 200`).
//!
//! One seed stand-in in this process with kipam's CRDs and Cluster API's
//! (`tests/fixtures/capi/`), one `kipam controller` (release build) in another process, one
//! `range` pool datacenter (a /16). First CLUSTERS kipam Clusters take their `allocationRange`
//! blocks of 8 addresses; then CLAIMS `IPAddressClaim`s are created at once. Printed:
//!
//! - the time from the first claim's creation until every claim is `Ready=True` with its
//!   `IPAddress` (target: under 30 s);
//! - the controller's writes per claim over that burst (its `kipam_api_writes_total` counters,
//!   `src/seed/metrics.rs`), and the API server's own count of writes;
//! - at steady state, SEQUENTIAL claims created one after another: the latency from a claim's
//!   creation to its `IPAddress` appearing on a watch, p50, p99 and worst (target: p99 under
//!   100 ms).
//!
//! The stand-in charges what a real API server's writes cost (`kube_standin::WriteModel`:
//! about 5 ms per write alone, at most 847 writes/s), and the burst's writes per second are
//! printed against that ceiling; `KIPAM_BENCH_FREE=1` runs on the free stand-in.
//! `KIPAM_BENCH_BINARY=<path>` runs another kipam binary (an older release, to compare).
//!
//! Every figure printed was measured: when one cannot be (the controller died, its `/metrics`
//! could not be read, the clusters were not all allocated), the bench says which and exits
//! non-zero instead of printing it. Exits non-zero too when a claim is not served.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_standin::ApiServer;
use serde_json::{Value, json};

const CLAIM_CRDS: &str = include_str!("../tests/fixtures/capi/capi-ipam-ipaddressclaims.yaml");
const ADDRESS_CRDS: &str = include_str!("../tests/fixtures/capi/capi-ipam-ipaddresses.yaml");
const CLUSTER_CRDS: &str = include_str!("../tests/fixtures/capi/capi-clusters.yaml");

const CLAIMS: &str = "ipaddressclaims.ipam.cluster.x-k8s.io";
const ADDRESSES: &str = "ipaddresses.ipam.cluster.x-k8s.io";
const NS: &str = "machines";

const POOL: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: machines
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/16
      allocationRange: 8
      network: {gateway: 10.255.255.254, prefixLength: 8}
";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The sum of every sample of a metric family on the controller's `/metrics`; an error when
/// the page cannot be read or does not have the family.
fn metric_sum(port: u16, family: &str) -> Result<f64, String> {
    let read = || -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body)
    };
    let text = read().map_err(|e| format!("GET /metrics on port {port}: {e}"))?;
    let status = text.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("GET /metrics on port {port} answered {status:?}"));
    }
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .map(|l| {
            l.split_whitespace()
                .last()
                .and_then(|v| v.parse::<f64>().ok())
                .ok_or_else(|| format!("/metrics: {l:?} has no value"))
        })
        .collect::<Result<_, _>>()?;
    // A family the page declares without a sample is a measured zero (a counter nothing has
    // counted yet); one it does not declare is not measured at all.
    let declared = |name: &str| {
        text.lines()
            .any(|l| l.starts_with(&format!("# TYPE {name} ")))
    };
    if samples.is_empty() && !declared(family) && !declared(family.trim_end_matches("_total")) {
        return Err(format!("/metrics on port {port} has no {family}"));
    }
    Ok(samples.iter().sum())
}

/// Fails unless the controller still runs: figures of a dead process are not figures.
fn alive(ctl: &mut Controller, when: &str) -> Result<(), String> {
    match ctl.0.try_wait() {
        Ok(None) => Ok(()),
        Ok(Some(status)) => Err(format!("the controller exited ({status}) {when}")),
        Err(e) => Err(format!("the controller's state cannot be read {when}: {e}")),
    }
}

fn percentile_ms(sorted: &[Duration], n: usize) -> f64 {
    let i = (sorted.len() * n).div_ceil(100).saturating_sub(1);
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

fn claim(name: &str) -> Value {
    json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
        "kind": "IPAddressClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": "machines"}},
    })
}

fn is_ready(c: &Value) -> bool {
    c["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Allocations that hold addresses and read as `Allocated`.
fn allocated(api: &ApiServer) -> usize {
    api.list("ipamallocations", None)
        .into_iter()
        .filter_map(|v| serde_json::from_value::<kipam::resources::IPAMAllocation>(v).ok())
        .filter(|a| a.phase() == kipam::resources::AllocationPhase::Allocated)
        .count()
}

struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn arg(n: usize, default: usize) -> usize {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// The whole run; the controller is killed when it returns (`process::exit` would skip that).
/// `Ok(false)` when a claim was not served, `Err` when a figure could not be measured.
fn run() -> Result<bool, String> {
    let claims = arg(0, 10_000);
    let clusters = arg(1, 1_000);
    let sequential = arg(2, 200);
    if claims == 0 {
        return Err("CLAIMS must be at least 1: writes per claim are measured over them".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let _guard = rt.enter();
    let seed = rt.block_on(ApiServer::start()).expect("seed starts");
    for crd in kipam::resources::crds() {
        seed.apply(&serde_json::to_value(&crd).expect("CRD JSON"))
            .expect("CRD registers");
    }
    for crds in [CLAIM_CRDS, ADDRESS_CRDS, CLUSTER_CRDS] {
        seed.apply_yaml(crds).expect("Cluster API CRDs");
    }
    for ns in ["kipam-system", NS] {
        seed.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
            .expect("namespace");
    }
    seed.apply_yaml(POOL).expect("pool");
    let free = std::env::var("KIPAM_BENCH_FREE").is_ok_and(|v| !v.is_empty() && v != "0");
    if !free {
        seed.set_write_model(Some(kube_standin::WriteModel::kube_apiserver_2_cores()));
    }
    for i in 0..clusters {
        seed.create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": format!("c{i:04}")}, "spec": {"datacenter": "dc-1"}}),
        )
        .expect("cluster");
    }

    let dir = std::env::temp_dir().join(format!("kipam-bench-claims-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let kubeconfig = dir.join("kubeconfig");
    seed.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let metrics_port = free_port();
    let mut ctl = Controller(
        Command::new(
            std::env::var_os("KIPAM_BENCH_BINARY")
                .unwrap_or_else(|| env!("CARGO_BIN_EXE_kipam").into()),
        )
        .args(["controller", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .args(["--api-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--identity", "bench"])
        // `KIPAM_BENCH_LOG=kipam::planning=debug` shows each pass's steps.
        .env(
            "RUST_LOG",
            std::env::var("KIPAM_BENCH_LOG").unwrap_or_else(|_| "warn".to_string()),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("controller starts"),
    );
    let start = Instant::now();
    while allocated(&seed) < clusters && start.elapsed() < Duration::from_secs(300) {
        alive(&mut ctl, "while the clusters were allocated")?;
        std::thread::sleep(Duration::from_millis(100));
    }
    let held = allocated(&seed);
    if held < clusters {
        return Err(format!(
            "only {held} of {clusters} clusters hold their range after {:.0} s",
            start.elapsed().as_secs_f64()
        ));
    }
    println!(
        "{clusters} clusters hold their range of 8 after {:.1} s",
        start.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(1));

    // The burst.
    alive(&mut ctl, "before the burst")?;
    let writes_before = metric_sum(metrics_port, "kipam_api_writes_total")
        .map_err(|e| format!("writes before the burst: {e}"))?;
    let server_writes_before = seed.stats().writes();
    let start = Instant::now();
    for i in 0..claims {
        seed.create(&claim(&format!("burst-{i:05}")))
            .expect("claim");
    }
    let created = start.elapsed();
    let mut ready = 0;
    let mut progress = Instant::now();
    // Up to 5 minutes, but not a minute without a claim getting Ready.
    while start.elapsed() < Duration::from_secs(300) && progress.elapsed() < Duration::from_secs(60)
    {
        let now = seed
            .list(CLAIMS, Some(NS))
            .iter()
            .filter(|c| is_ready(c))
            .count();
        if now > ready {
            progress = Instant::now();
        }
        ready = now;
        let addresses = seed.list(ADDRESSES, Some(NS)).len();
        if ready == claims && addresses == claims {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let all_ready = start.elapsed();
    alive(&mut ctl, "during the burst")?;
    let writes = metric_sum(metrics_port, "kipam_api_writes_total")
        .map_err(|e| format!("writes after the burst: {e}"))?
        - writes_before;
    let server_writes = seed.stats().writes() - server_writes_before;
    println!(
        "{claims} claims created in {:.2} s; {ready} Ready after {:.2} s (target < 30 s: {})",
        created.as_secs_f64(),
        all_ready.as_secs_f64(),
        if ready == claims && all_ready < Duration::from_secs(30) {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "writes per claim: {:.2} (controller's kipam_api_writes_total), {:.2} (API server's count)",
        writes / claims as f64,
        server_writes as f64 / claims as f64
    );
    let rate = server_writes as f64 / all_ready.as_secs_f64();
    match seed.write_model() {
        Some(m) => println!(
            "burst writes: {server_writes} in {:.2} s, {rate:.0} writes/s = {:.2} of the write model's ceiling ({:.0} writes/s)",
            all_ready.as_secs_f64(),
            rate / m.ceiling(),
            m.ceiling()
        ),
        None => println!(
            "burst writes: {server_writes} in {:.2} s, {rate:.0} writes/s (free stand-in)",
            all_ready.as_secs_f64()
        ),
    }
    if ready < claims {
        println!("burst: {} claims not served (FAILED)", claims - ready);
        return Ok(false);
    }
    if sequential == 0 {
        return Ok(true);
    }

    // Steady state: one claim at a time, timed from its creation to its IPAddress on a watch.
    std::thread::sleep(Duration::from_secs(2));
    let latencies = rt.block_on(async {
        let kc = Kubeconfig::from_yaml(&seed.kubeconfig_yaml()).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("config");
        let client = kube::Client::try_from(config).expect("client");
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("ipam.cluster.x-k8s.io", "v1beta2", "IPAddress"),
            "ipaddresses",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(client, NS, &ar);
        let rv = seed.resource_version().to_string();
        let mut events = api
            .watch(&WatchParams::default(), &rv)
            .await
            .expect("watch")
            .boxed();
        let mut latencies = Vec::with_capacity(sequential);
        for i in 0..sequential {
            let name = format!("steady-{i:04}");
            let created = Instant::now();
            seed.create(&claim(&name)).expect("claim");
            let seen = tokio::time::timeout(Duration::from_secs(10), async {
                while let Some(event) = events.next().await {
                    if let Ok(WatchEvent::Added(o)) = event
                        && o.metadata.name.as_deref() == Some(name.as_str())
                    {
                        return true;
                    }
                }
                false
            })
            .await;
            if !matches!(seen, Ok(true)) {
                println!("steady state: {name} got no IPAddress within 10 s (FAILED)");
                return None;
            }
            latencies.push(created.elapsed());
        }
        Some(latencies)
    });
    let Some(mut latencies) = latencies else {
        return Ok(false);
    };
    alive(&mut ctl, "after the steady state")?;
    latencies.sort();
    let Some(worst) = latencies.last().copied() else {
        return Err("no steady-state latency was measured".into());
    };
    let p99 = percentile_ms(&latencies, 99);
    println!(
        "steady state, {sequential} claims one at a time, creation to IPAddress: p50 {:.1} ms, p99 {p99:.1} ms, worst {:.1} ms (target p99 < 100 ms: {})",
        percentile_ms(&latencies, 50),
        worst.as_secs_f64() * 1e3,
        if p99 < 100.0 { "met" } else { "MISSED" }
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(true)
}

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("claims bench: not measured: {e}");
            std::process::exit(1);
        }
    }
}
