//! A seed: one API stand-in with kipam's CRDs, and `kipam controller` processes against it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_standin::ApiServer;
use serde_json::{Value, json};

use kipam::allocator::Allocation;
use kipam::resources::IPAMAllocation;

/// Controllers started by a test are killed when it ends, pass or fail.
pub struct Controller {
    child: Child,
    pub metrics_port: u16,
    /// The REST API's port.
    pub api_port: u16,
    pub identity: String,
}

impl Controller {
    /// SIGKILL: no clean-up, no lease hand-over. Fails the test unless the process was running
    /// and died of that very signal.
    pub fn kill(&mut self) {
        assert!(
            self.is_running(),
            "controller {} had already exited before it was killed",
            self.identity
        );
        if let Err(e) = self.child.kill() {
            panic!("SIGKILL to controller {}: {e}", self.identity);
        }
        let status = match self.child.wait() {
            Ok(s) => s,
            Err(e) => panic!("waiting for the killed controller {}: {e}", self.identity),
        };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "controller {} ended with {status}, not by the SIGKILL it was sent",
            self.identity
        );
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends a signal (`STOP`, `CONT`, `TERM`, ...) to the process and fails the test unless it
    /// was delivered; for `STOP` and `CONT`, until the process shows as stopped (or no longer
    /// stopped) in `/proc`.
    pub fn signal(&self, name: &str) {
        if let Err(e) = self.send(name) {
            panic!("{e}");
        }
        let want_stopped = match name {
            "STOP" => true,
            "CONT" => false,
            _ => return,
        };
        let start = Instant::now();
        loop {
            let state = self.state();
            if state.is_some_and(|s| (s == 'T') == want_stopped) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "controller {} (pid {}) is in state {state:?} 5 s after SIG{name}",
                self.identity,
                self.child.id()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `kill(2)` with the signal named `name`.
    fn send(&self, name: &str) -> Result<(), String> {
        let signal = match name {
            "STOP" => libc::SIGSTOP,
            "CONT" => libc::SIGCONT,
            "TERM" => libc::SIGTERM,
            "INT" => libc::SIGINT,
            "KILL" => libc::SIGKILL,
            other => return Err(format!("no signal named {other:?} in the tests' list")),
        };
        let pid = libc::pid_t::try_from(self.child.id())
            .map_err(|_| format!("pid {} does not fit a pid_t", self.child.id()))?;
        // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped (a child
        // that has exited stays a zombie until waited for, so the pid cannot be reused).
        let sent = unsafe { libc::kill(pid, signal) };
        if sent != 0 {
            return Err(format!(
                "SIG{name} to controller {} (pid {pid}) was not delivered: {}",
                self.identity,
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// The process's state letter in `/proc/<pid>/stat` (`T` when stopped).
    fn state(&self) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).ok()?;
        stat.rsplit_once(')')?.1.trim_start().chars().next()
    }

    /// The planning passes this controller has run, read from its `/metrics`. Fails the test
    /// when the process is not running or the counter cannot be read: a dead controller is not
    /// a quiet one.
    /// The passes of one kind (`kipam_reconcile_passes_by_kind_total{kind}`) this controller
    /// has run: `whole`, `partial`, `new`, `growth`, `statuses`, `idle`.
    pub async fn passes_of(&self, kind: &str) -> u64 {
        Seed::metric(
            self.metrics_port,
            &format!("kipam_reconcile_passes_by_kind_total{{kind=\"{kind}\"}}"),
        )
        .await
        .map_or(0, |v| v as u64)
    }

    pub async fn passes(&mut self) -> u64 {
        assert!(
            self.is_running(),
            "controller {} is not running",
            self.identity
        );
        match Seed::metric(self.metrics_port, "kipam_reconcile_passes_total").await {
            Some(v) if v >= 0.0 && v.fract() == 0.0 => v as u64,
            Some(v) => panic!(
                "controller {}: kipam_reconcile_passes_total reads {v}, not a count",
                self.identity
            ),
            None => panic!(
                "controller {}: kipam_reconcile_passes_total could not be read from /metrics on port {}",
                self.identity, self.metrics_port
            ),
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // Best effort: the test is over (or failing), the process must not outlive it.
        let _ = self.send("CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An allocated range and who holds it.
type Piece = (u128, u128, String);

pub struct Seed {
    pub api: ApiServer,
    dir: PathBuf,
    kubeconfig: PathBuf,
}

impl Drop for Seed {
    fn drop(&mut self) {
        self.api.shutdown();
        if std::env::var_os("KIPAM_KEEP_E2E").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A port for a controller to listen on. Not one the kernel picks (`bind(:0)`): those come
/// from the ephemeral range, which every outgoing connection of the tests and controllers
/// running beside draws from too, so one of them could take the port before the controller
/// binds it ("Address already in use", seen in CI). These come from below that range
/// (Linux's default starts at 32768), each once per test process, and are checked free.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Processes started one after another begin at different places.
    let start = std::process::id().wrapping_mul(7919) % SPAN;
    for _ in 0..SPAN {
        let port = (FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

impl Seed {
    pub async fn start(name: &str) -> Seed {
        let seed = Seed::bare(name).await;
        seed.install_crds();
        seed.api
            .apply(
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kipam-system"}}),
            )
            .expect("namespace");
        seed
    }

    /// kipam's CRDs, as `kubectl apply -f crds/` would install them.
    pub fn install_crds(&self) {
        for crd in kipam::resources::crds() {
            let value = serde_json::to_value(&crd).expect("CRD serialises");
            self.api.apply(&value).expect("CRD registers");
        }
    }

    /// An API server with neither kipam's CRDs nor the Lease's namespace.
    pub async fn bare(name: &str) -> Seed {
        let api = ApiServer::start().await.expect("stand-in starts");
        let dir = std::env::temp_dir().join(format!("kipam-e2e-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let kubeconfig = dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        Seed {
            api,
            dir,
            kubeconfig,
        }
    }

    /// Starts `kipam controller` with short lease timings (1 s retry, 2 s deadline, 3 s lease).
    pub fn controller(&self, identity: &str) -> Controller {
        self.controller_with(identity, &[])
    }

    /// [`Seed::controller`] with more command-line arguments.
    pub fn controller_with(&self, identity: &str, extra: &[&str]) -> Controller {
        self.controller_full(identity, free_port(), extra, None)
    }

    /// [`Seed::controller_with`] started in the working directory `cwd` (tests otherwise run
    /// it in the repository, where the default `addons/` and `templates/` are).
    pub fn controller_in(&self, identity: &str, cwd: &Path, extra: &[&str]) -> Controller {
        self.controller_full(identity, free_port(), extra, Some(cwd))
    }

    /// A controller with its REST API on `api_port`.
    pub fn controller_on(&self, identity: &str, api_port: u16) -> Controller {
        self.controller_full(identity, api_port, &[], None)
    }

    fn controller_full(
        &self,
        identity: &str,
        api_port: u16,
        extra: &[&str],
        cwd: Option<&Path>,
    ) -> Controller {
        let port = free_port();
        let log = std::fs::File::create(self.dir.join(format!("{identity}.log"))).ok();
        let mut command = Command::new(env!("CARGO_BIN_EXE_kipam"));
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        let child = command
            .args(["controller", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args([
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
                "--lease-duration",
                "3",
                "--renew-deadline",
                "2",
                "--retry-period",
                "1",
                "--identity",
                identity,
                "--api-addr",
                &format!("127.0.0.1:{api_port}"),
            ])
            .args(extra)
            .env("RUST_LOG", "kipam=debug")
            .stdout(Stdio::null())
            .stderr(log.map(Stdio::from).unwrap_or_else(Stdio::null))
            .spawn()
            .expect("controller starts");
        Controller {
            child,
            metrics_port: port,
            api_port,
            identity: identity.to_string(),
        }
    }

    /// Where a controller's log is written.
    pub fn log_path(&self, identity: &str) -> PathBuf {
        self.dir.join(format!("{identity}.log"))
    }

    /// The seed's scratch directory (removed with the seed).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The whole log of a controller.
    pub fn full_log(&self, identity: &str) -> String {
        std::fs::read_to_string(self.log_path(identity)).unwrap_or_default()
    }

    /// The log of a controller, for failure messages.
    pub fn log(&self, identity: &str) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("{identity}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub fn apply(&self, yaml: &str) {
        self.api.apply_yaml(yaml).expect("fixture applies");
    }

    /// A cluster in `dc`. Clusters are served oldest first, then by name: tests create them
    /// in name order so that both agree.
    pub fn cluster(&self, name: &str, dc: &str) {
        self.cluster_with(name, dc, "");
    }

    /// A cluster with more `spec` fields, given as YAML.
    pub fn cluster_with(&self, name: &str, dc: &str, extra_spec: &str) {
        let mut obj = json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name},
            "spec": {"datacenter": dc},
        });
        if !extra_spec.is_empty() {
            let extra: Value = serde_saphyr::from_str(extra_spec).expect("extra spec");
            if let (Some(spec), Some(extra)) = (obj["spec"].as_object_mut(), extra.as_object()) {
                for (k, v) in extra {
                    spec.insert(k.clone(), v.clone());
                }
            }
        }
        self.api.create(&obj).expect("cluster created");
    }

    pub fn delete(&self, resource: &str, namespace: Option<&str>, name: &str) {
        self.api.delete(resource, namespace, name).expect("delete");
    }

    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        self.api.get(resource, namespace, name)
    }

    pub fn allocations(&self) -> Vec<IPAMAllocation> {
        self.api
            .list("ipamallocations", None)
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect()
    }

    /// The allocation of `cluster` from `pool`.
    pub fn allocation(&self, cluster: &str, pool: &str) -> Option<IPAMAllocation> {
        self.api
            .get("ipamallocations", Some(&format!("cluster-{cluster}")), pool)
            .and_then(|v| serde_json::from_value(v).ok())
    }

    /// `spec.addresses` joined, or `spec.cidr`.
    pub fn held(&self, cluster: &str, pool: &str) -> String {
        self.allocation(cluster, pool)
            .map(|a| match a.spec.cidr {
                Some(c) => c,
                None => a.spec.addresses.join(","),
            })
            .unwrap_or_default()
    }

    pub fn phase(&self, cluster: &str, pool: &str) -> String {
        self.allocation(cluster, pool)
            .map(|a| a.phase().as_str().to_string())
            .unwrap_or_default()
    }

    pub fn condition(&self, resource: &str, name: &str, type_: &str) -> Option<Value> {
        let obj = self.api.get(resource, None, name)?;
        obj.pointer("/status/conditions")?
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)
            .cloned()
    }

    /// Waits until `check` holds, or fails the test with `what` and the controller log.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        log_of: &str,
        mut check: impl FnMut(&Seed) -> bool,
    ) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if check(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "timed out after {timeout:?} waiting for: {what}\n--- controller log ---\n{}",
            self.log(log_of)
        );
    }

    /// Every allocation, checked: none overlaps another of the same pool and datacenter, each
    /// belongs to an existing cluster. Returns the number of allocations holding addresses.
    pub fn assert_no_overlap_no_leak(&self) -> usize {
        let clusters: Vec<String> = self
            .api
            .list("clusters", None)
            .iter()
            .filter_map(|c| {
                c.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect();
        let mut by_pool: BTreeMap<(String, String), Vec<Piece>> = BTreeMap::new();
        let mut held = 0;
        for obj in self.allocations() {
            let s = kipam::validation::stored_allocation(&obj).expect("allocation parses");
            assert!(
                clusters.contains(&s.cluster),
                "leaked allocation {}/{} of a cluster that is gone",
                s.cluster,
                s.pool
            );
            let Some(allocation) = s.held else { continue };
            held += 1;
            let pieces: Vec<Piece> = match &allocation {
                Allocation::Range(_) | Allocation::Prefix(_) => allocation
                    .ranges()
                    .map(|r| (r.first(), r.last(), s.cluster.clone()))
                    .collect(),
            };
            by_pool
                .entry((s.pool.clone(), s.datacenter.clone()))
                .or_default()
                .extend(pieces);
        }
        for ((pool, dc), mut pieces) in by_pool {
            pieces.sort();
            for pair in pieces.windows(2) {
                assert!(
                    pair[0].1 < pair[1].0,
                    "pool {pool} in {dc}: {} and {} overlap",
                    pair[0].2,
                    pair[1].2
                );
            }
        }
        held
    }

    /// Pairs of allocations of one pool and datacenter that share an address, right now.
    pub fn overlaps(&self) -> Vec<String> {
        let mut by_pool: BTreeMap<(String, String), Vec<Piece>> = BTreeMap::new();
        for obj in self.allocations() {
            let Ok(s) = kipam::validation::stored_allocation(&obj) else {
                continue;
            };
            let Some(allocation) = s.held else { continue };
            by_pool
                .entry((s.pool.clone(), s.datacenter.clone()))
                .or_default()
                .extend(
                    allocation
                        .ranges()
                        .map(|r| (r.first(), r.last(), s.cluster.clone())),
                );
        }
        let mut found = Vec::new();
        for ((pool, dc), mut pieces) in by_pool {
            pieces.sort();
            for pair in pieces.windows(2) {
                if pair[0].1 >= pair[1].0 {
                    found.push(format!("{pool}/{dc}: {} and {}", pair[0].2, pair[1].2));
                }
            }
        }
        found
    }

    /// Waits until `identity` holds the leader Lease (`kipam-seed` in `kipam-system`), as the
    /// API server stores it: a takeover confirmed, not assumed.
    pub async fn wait_leader(&self, identity: &str, timeout: Duration) {
        self.wait_for(
            &format!("{identity} holds the Lease"),
            timeout,
            identity,
            |s| s.lease_holder() == identity,
        )
        .await;
    }

    /// The current holder of the leader Lease.
    pub fn lease_holder(&self) -> String {
        self.get("leases", Some("kipam-system"), "kipam-seed")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    /// A value of a controller's metrics, by the metric's name with its labels.
    pub async fn metric(port: u16, name: &str) -> Option<f64> {
        let (_, text) = Seed::http_get(port, "/metrics").await;
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
    }

    /// GET on the controller's metrics port (a tiny blocking HTTP/1.1 client).
    pub async fn http_get(port: u16, path: &str) -> (u16, String) {
        let path = path.to_string();
        tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                return (0, String::new());
            };
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
            if stream.write_all(request.as_bytes()).is_err() {
                return (0, String::new());
            }
            let mut buf = Vec::new();
            let _ = stream.read_to_end(&mut buf);
            let text = String::from_utf8_lossy(&buf).into_owned();
            let code = text
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let body = text
                .split("\r\n\r\n")
                .nth(1)
                .unwrap_or_default()
                .to_string();
            (code, body)
        })
        .await
        .unwrap_or((0, String::new()))
    }
}

/// The pools most tests use: `metallb` (range /28 of 4 in dc-1, prefix /28s of a /24 in dc-2)
/// and `metallb-ipv6` (an IPv6 /64 range pool in dc-1, `Retain`).
pub const POOLS: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/28
      allocationRange: 4
    dc-2:
      type: prefix
      poolCidr: 10.1.0.0/24
      allocationPrefix: 28
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb-ipv6
spec:
  reclaimPolicy: Retain
  datacenters:
    dc-1:
      type: range
      poolCidr: 2001:db8::/64
      allocationRange: 16
";

/// Watches `api`'s request counter for `(verb, resource)` for `window` and returns when each
/// new request was seen (measured from the start, to about 20 ms).
pub async fn request_times(
    api: &ApiServer,
    verb: &str,
    resource: &str,
    window: Duration,
) -> Vec<Duration> {
    let start = Instant::now();
    let mut seen = api.stats().count(verb, resource);
    let mut times = Vec::new();
    while start.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = api.stats().count(verb, resource);
        for _ in seen..now {
            times.push(start.elapsed());
        }
        seen = now;
    }
    times
}

/// The longest wait between two consecutive `times`.
pub fn longest_gap(times: &[Duration]) -> Duration {
    times
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .max()
        .unwrap_or_default()
}

/// A CA and a webhook certificate for 127.0.0.1 signed by it, written into the seed's
/// directory: (ca file, cert file, key file).
pub fn webhook_certificates(seed: &Seed) -> (String, String, String) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "kipam e2e CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let issuer = rcgen::Issuer::from_params(&ca, &ca_key);
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    let path = |n: &str| seed.dir().join(n).display().to_string();
    std::fs::write(path("ca.pem"), ca_cert.pem()).unwrap();
    std::fs::write(path("tls.crt"), leaf_cert.pem()).unwrap();
    std::fs::write(path("tls.key"), leaf_key.serialize_pem()).unwrap();
    (path("ca.pem"), path("tls.crt"), path("tls.key"))
}

/// Installs the configuration exactly as `kipam webhook-config` prints it, pointing at `port`.
pub fn install_webhook_configuration(seed: &Seed, port: u16, ca: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kipam"))
        .args([
            "webhook-config",
            "--url",
            &format!("https://127.0.0.1:{port}"),
            "--ca-file",
            ca,
            "--service-account",
            "system:admin",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    seed.apply(&String::from_utf8(out.stdout).unwrap());
}
