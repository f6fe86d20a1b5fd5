//! `kipam controller`: the seed controller.
//!
//! Watches feed in-memory caches (pools, clusters, the namespaces kipam made) and the
//! allocation [`ledger::Ledger`]; any change wakes the planning loop, which — on the leader
//! only — runs a [`pass`] over the whole seed. See `docs/design.md` for why no address can be
//! handed out twice.

pub mod backoff;
pub mod leader;
pub mod ledger;
pub mod metrics;
pub mod pass;
pub mod preconditions;
pub mod records;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config};
use tokio::sync::{Mutex, Notify, watch};

use crate::resources::{Cluster, IPAMAllocation, IPAMPool, IPAMPoolRecord, LABEL_CLUSTER};
use leader::{Elector, LeaderState, LeaseTiming};
use ledger::Ledger;
use metrics::Metrics;

/// How `kipam controller` runs.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    pub kubeconfig: Option<PathBuf>,
    pub seed_name: String,
    /// Where the Lease lives.
    pub namespace: String,
    pub metrics_addr: SocketAddr,
    pub lease: LeaseTiming,
    /// A full pass at least this often, even without changes.
    pub resync: Duration,
    /// Writes a pass sends at once (`--write-concurrency`).
    pub write_concurrency: usize,
    /// This replica's name in the Lease.
    pub identity: String,
    /// The REST API served by every replica (`docs/api.md`).
    pub api: crate::api::ApiOptions,
    /// The admission webhook (served by every replica), when certificates are given.
    pub webhook: Option<crate::webhook::WebhookOptions>,
    /// The addon applier (user clusters).
    pub addons: crate::applier::ApplierOptions,
}

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("cannot load the kubeconfig: {0}")]
    Config(String),
    #[error("cannot reach the API server: {0}")]
    Client(#[from] kube::Error),
    #[error(transparent)]
    Webhook(#[from] crate::webhook::WebhookError),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot serve the API on {addr}: {source}")]
    Api {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// What changed since the last pass, as far as the watches can say: the clusters whose
/// planned content changed by name, and whether anything else did (a pool, a namespace, a
/// deletion, a re-list, a watch error). A pass takes it before it reads the caches, so a
/// change made while the pass runs is left for the next one.
#[derive(Debug, Default)]
pub struct Dirty {
    inner: std::sync::Mutex<(std::collections::BTreeSet<String>, bool)>,
    /// Wakes the planning loop (set once the loop exists).
    wake: std::sync::OnceLock<Arc<Notify>>,
}

impl Dirty {
    /// Lets [`Dirty::wake`] wake the planning loop through `notify`.
    pub fn set_wake(&self, notify: Arc<Notify>) {
        let _ = self.wake.set(notify);
    }

    /// Wakes the planning loop (for work that finished outside a pass).
    pub fn wake(&self) {
        if let Some(n) = self.wake.get() {
            n.notify_one();
        }
    }

    /// `name`'s planned content changed.
    pub fn cluster(&self, name: String) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.0.insert(name);
    }

    /// Something changed that only a look at everything can place.
    pub fn other(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.1 = true;
    }

    /// Takes what changed: (clusters, anything else).
    pub fn take(&self) -> (std::collections::BTreeSet<String>, bool) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *inner)
    }
}

/// Timeout of every request the controller sends (watches excepted).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the planning pass and the watch tasks share.
pub struct Context {
    /// For watches (long polls).
    pub client: Client,
    /// For everything else: a timeout on every request and no hidden retries, so a write is
    /// never sent again behind the planner's back after the lease moved on.
    pub writer: Client,
    pub pools: Store<IPAMPool>,
    pub clusters: Store<Cluster>,
    pub namespaces: Store<Namespace>,
    pub ledger: Mutex<Ledger>,
    /// Ticks, for every subscriber, once each allocation watch event is in the ledger and
    /// after each rebuild: how the ledger's readers (the addon applier, the webhook) learn of
    /// changes — kipam's own writes too, through their watch echo — without watching
    /// allocations themselves. Its value says whether the ledger has held a complete list yet
    /// (the watch's first, or a rebuild); until then a missing allocation proves nothing.
    pub ledger_updates: watch::Sender<bool>,
    pub records: Mutex<records::Records>,
    /// What the watches saw change since the last pass took it.
    pub dirty: Arc<Dirty>,
    /// Per-object retry delays after failed writes.
    pub backoff: std::sync::Mutex<backoff::Backoff>,
    /// Held while a pass runs: shutdown waits for it before giving the Lease up.
    pub pass_lock: Mutex<()>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub leader: Arc<LeaderState>,
}

/// The watch client and the request client.
async fn clients(kubeconfig: Option<&PathBuf>) -> Result<(Client, Client), ControllerError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| ControllerError::Config(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| ControllerError::Config(format!("{}: {e}", path.display())))?
        }
        None => Config::infer()
            .await
            .map_err(|e| ControllerError::Config(e.to_string()))?,
    };
    let mut watch_config = config.clone();
    watch_config.connect_timeout = Some(REQUEST_TIMEOUT);
    let mut write_config = config;
    write_config.default_retry = false;
    write_config.connect_timeout = Some(REQUEST_TIMEOUT);
    write_config.read_timeout = Some(REQUEST_TIMEOUT);
    write_config.write_timeout = Some(REQUEST_TIMEOUT);
    Ok((
        Client::try_from(watch_config).map_err(ControllerError::Client)?,
        Client::try_from(write_config).map_err(ControllerError::Client)?,
    ))
}

/// Says once (until it changes or clears) why a watch fails, at warn level, and keeps
/// `/readyz` false with the same reason while it lasts.
struct WatchReporter {
    resource: &'static str,
    metrics: Arc<Metrics>,
    last: std::sync::Mutex<Option<String>>,
}

impl WatchReporter {
    fn new(resource: &'static str, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(WatchReporter {
            resource,
            metrics,
            last: std::sync::Mutex::new(None),
        })
    }

    fn failed(&self, e: &watcher::Error) {
        let message = match e {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => {
                preconditions::explain(e, "list/watch", self.resource, "")
            }
            other => format!("watch of {} failed: {other}", self.resource),
        };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_deref() != Some(message.as_str()) {
            tracing::warn!(
                resource = self.resource,
                "{message} (retrying with backoff)"
            );
            *last = Some(message.clone());
        }
        self.metrics.set_not_ready(Some(message));
    }

    fn ok(&self) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.take().is_some() {
            tracing::info!(resource = self.resource, "watch recovered");
            self.metrics.set_not_ready(None);
        }
    }
}

/// What the planner reads of an object, as a hash: an event that leaves it alone (the echo of
/// kipam's own status or finalizer write) wakes nobody.
fn planned_content<K: kube::Resource>(obj: &K, spec: impl serde::Serialize, own: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let meta = obj.meta();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(&spec)
        .unwrap_or_default()
        .hash(&mut h);
    meta.uid.hash(&mut h);
    meta.labels.hash(&mut h);
    meta.creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut h);
    meta.deletion_timestamp.is_some().hash(&mut h);
    // Other controllers' finalizers matter (they keep an object being deleted); kipam's own
    // is put back by the pass that finds it missing.
    if let Some(f) = &meta.finalizers {
        f.iter().filter(|f| *f != own).for_each(|f| f.hash(&mut h));
    }
    h.finish()
}

/// Which watch events wake the planner.
enum Wakes<K> {
    /// Changes to what [`planned_content`] reads (given the spec and kipam's finalizer).
    Content(fn(&K) -> u64),
    /// Deletions and re-lists only (kipam's namespaces: their creation is kipam's own write).
    Deletions,
}

impl<K> Clone for Wakes<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Wakes<K> {}

/// Feeds one watch into a cache, waking the planner on every change the planner reads.
fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
    wake: Arc<Notify>,
    reporter: Arc<WatchReporter>,
    wakes: Wakes<K>,
    dirty: Arc<Dirty>,
    by_name: bool,
) -> (Store<K>, impl Stream<Item = ()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let mut seen: std::collections::HashMap<reflector::ObjectRef<K>, u64> = Default::default();
    let watch = watcher::watcher(api, config)
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None);
    let stream = reflector::reflector(writer, watch).map(move |ev| {
        match &ev {
            Err(e) => reporter.failed(e),
            // A re-list announces itself before it is tried: no sign of health yet.
            Ok(Event::Init) => {}
            Ok(_) => reporter.ok(),
        }
        let wakes_now = match (&ev, wakes) {
            (Ok(Event::Apply(o)) | Ok(Event::InitApply(o)), Wakes::Content(content)) => {
                let fingerprint = content(o);
                seen.insert(reflector::ObjectRef::from(o), fingerprint) != Some(fingerprint)
            }
            (Ok(Event::Apply(_)) | Ok(Event::InitApply(_)), Wakes::Deletions) => false,
            (Ok(Event::Delete(o)), _) => {
                seen.remove(&reflector::ObjectRef::from(o));
                true
            }
            (Ok(Event::Init), _) => false,
            (Ok(Event::InitDone), _) | (Err(_), _) => true,
        };
        if wakes_now {
            // A content change of a cluster is placed by name; anything else (a pool, a
            // deletion, a re-list, an error) asks the next pass to look at everything.
            match &ev {
                Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) if by_name => {
                    tracing::trace!(target: "kipam::controller::dirty", cluster = ?o.meta().name, "changed");
                    dirty.cluster(o.meta().name.clone().unwrap_or_default())
                }
                _ => dirty.other(),
            }
            wake.notify_one();
        }
    });
    (store, stream)
}

/// Runs the controller until SIGTERM / SIGINT.
pub async fn run(options: ControllerOptions) -> Result<(), ControllerError> {
    let (client, writer) = clients(options.kubeconfig.as_ref()).await?;
    let metrics = Metrics::new();
    let listener_metrics = metrics.clone();
    let metrics_addr = options.metrics_addr;
    let metrics_task =
        tokio::spawn(async move { metrics::serve(metrics_addr, listener_metrics).await });

    let wake = Arc::new(Notify::new());
    let dirty = Arc::new(Dirty::default());
    dirty.set_wake(wake.clone());
    let backoff = || watcher::Config::default();
    // RBAC: src/rbac.rs (list/watch of pools, clusters, namespaces, allocations).
    let (pools, pool_events) = cached(
        Api::<IPAMPool>::all(client.clone()),
        backoff(),
        wake.clone(),
        WatchReporter::new("ipampools.ipam.kipam.dev", metrics.clone()),
        Wakes::Content(|p: &IPAMPool| planned_content(p, &p.spec, pass::POOL_FINALIZER)),
        dirty.clone(),
        false,
    );
    let (clusters, cluster_events) = cached(
        Api::<Cluster>::all(client.clone()),
        backoff(),
        wake.clone(),
        WatchReporter::new("clusters.ipam.kipam.dev", metrics.clone()),
        Wakes::Content(|c: &Cluster| planned_content(c, &c.spec, pass::CLUSTER_FINALIZER)),
        dirty.clone(),
        true,
    );
    let (namespaces, namespace_events) = cached(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default().labels(LABEL_CLUSTER),
        wake.clone(),
        WatchReporter::new("namespaces", metrics.clone()),
        Wakes::Deletions,
        dirty.clone(),
        false,
    );
    let leader = LeaderState::new(options.lease.renew_deadline);
    let ctx = Arc::new(Context {
        client: client.clone(),
        writer: writer.clone(),
        pools,
        clusters,
        namespaces,
        ledger: Mutex::new(Ledger::default()),
        ledger_updates: watch::Sender::new(false),
        records: Mutex::new(records::Records::default()),
        dirty: dirty.clone(),
        backoff: std::sync::Mutex::new(backoff::Backoff::default()),
        pass_lock: Mutex::new(()),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "kipam".into(),
                instance: Some(options.identity.clone()),
            },
        ),
        metrics: metrics.clone(),
        leader: leader.clone(),
    });

    // Every replica serves the API from the caches (before the Lease is
    // contended, so a port already taken stops the replica early).
    let api_addr = options.api.addr;
    let api_listener = tokio::net::TcpListener::bind(api_addr)
        .await
        .map_err(|source| ControllerError::Api {
            addr: api_addr,
            source,
        })?;
    let api_router = crate::api::router(crate::api::ApiState::new(
        ctx.clone(),
        options.seed_name.clone(),
        options.api.clone(),
    ));
    let api_task = match options.api.tls.clone() {
        Some(files) => {
            // Unusable files stop the replica at once, naming them.
            crate::tls::acceptor(&files).map_err(|e| ControllerError::Api {
                addr: api_addr,
                source: std::io::Error::other(e.to_string()),
            })?;
            tokio::spawn(async move {
                crate::api::serve_tls(api_listener, files, api_router)
                    .await
                    .map_err(|e| std::io::Error::other(e.to_string()))
            })
        }
        None => tokio::spawn(crate::api::serve(api_listener, api_router)),
    };
    let webhook_task = match options.webhook.clone() {
        Some(webhook) => tokio::spawn(crate::webhook::run(ctx.clone(), webhook)),
        None => tokio::spawn(std::future::pending()),
    };

    // The allocation watch feeds the ledger directly (see ledger.rs for the guards). It is
    // this replica's only allocation watch: the applier and the webhook read the ledger.
    let allocation_ctx = ctx.clone();
    let allocation_wake = wake.clone();
    let allocation_reporter = WatchReporter::new("ipamallocations.ipam.kipam.dev", metrics.clone());
    let allocation_events = watcher::watcher(
        Api::<IPAMAllocation>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|o| o.metadata.managed_fields = None)
    .then(move |ev| {
        let ctx = allocation_ctx.clone();
        let wake = allocation_wake.clone();
        let reporter = allocation_reporter.clone();
        async move {
            match &ev {
                Err(e) => reporter.failed(e),
                Ok(Event::Init) => {}
                Ok(_) => reporter.ok(),
            }
            let listed = matches!(ev, Ok(Event::InitDone));
            let readers = matches!(
                ev,
                Ok(Event::Apply(_) | Event::InitApply(_) | Event::Delete(_) | Event::InitDone)
            );
            let mut ledger = ctx.ledger.lock().await;
            // The echo of kipam's own write (content the ledger already holds) does not wake
            // the planner; the ledger's readers hear of every event, as they would from a
            // watch of their own (the applier learns of kipam's writes this way).
            let changed = match ev {
                Ok(Event::Apply(obj)) | Ok(Event::InitApply(obj)) => ledger.apply(obj),
                Ok(Event::Delete(obj)) => ledger.remove(&obj),
                Ok(Event::Init) => {
                    ledger.relist_started();
                    false
                }
                Ok(Event::InitDone) => {
                    ledger.relist_done();
                    true
                }
                Err(_) => false,
            };
            drop(ledger);
            if readers {
                ctx.ledger_updates
                    .send_modify(|complete| *complete |= listed);
            }
            if changed {
                wake.notify_one();
            }
        }
    });
    let watches = tokio::spawn(async move {
        let mut all = futures::stream::select_all(vec![
            pool_events.boxed(),
            cluster_events.boxed(),
            namespace_events.boxed(),
            allocation_events.boxed(),
        ]);
        while all.next().await.is_some() {}
    });

    // RBAC: src/rbac.rs (leases in --namespace).
    let elector = Elector::new(
        Api::<Lease>::namespaced(writer.clone(), &options.namespace),
        &format!("kipam-{}", options.seed_name),
        &options.identity,
        options.lease,
        leader.clone(),
    )
    .with_metrics(metrics.clone());
    let release_api = Api::<Lease>::namespaced(writer.clone(), &options.namespace);
    let lease_name = format!("kipam-{}", options.seed_name);
    let identity = options.identity.clone();
    let election = tokio::spawn(elector.run());

    let planning = tokio::spawn(planning_loop(
        ctx.clone(),
        wake.clone(),
        options.resync,
        pass::PassState::new(options.write_concurrency),
    ));
    let applier = tokio::spawn(crate::applier::run(ctx.clone(), options.addons.clone()));

    tokio::select! {
        r = metrics_task => {
            return Err(ControllerError::Metrics {
                addr: metrics_addr,
                source: r.unwrap_or_else(|e| Err(std::io::Error::other(e))).err()
                    .unwrap_or_else(|| std::io::Error::other("metrics server stopped")),
            });
        }
        r = api_task => {
            return Err(ControllerError::Api {
                addr: api_addr,
                source: r.unwrap_or_else(|e| Err(std::io::Error::other(e))).err()
                    .unwrap_or_else(|| std::io::Error::other("API server stopped")),
            });
        }
        r = webhook_task => {
            return Err(ControllerError::Webhook(match r {
                Ok(Err(e)) => e,
                _ => crate::webhook::WebhookError::Stopped,
            }));
        }
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
        }
    }
    // No write starts from now on; the ones in flight finish or time out before the Lease is
    // handed over, so the next leader never races a write of ours.
    leader.resign();
    let drained = tokio::time::timeout(REQUEST_TIMEOUT * 2, ctx.pass_lock.lock()).await;
    if drained.is_err() {
        tracing::warn!("a pass was still writing at shutdown; its requests have timed out");
    }
    planning.abort();
    applier.abort();
    election.abort();
    watches.abort();
    // Hand the lease over at once instead of letting it expire.
    let released = Elector::new(release_api, &lease_name, &identity, options.lease, leader);
    released.release().await;
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// How long the planning loop waits after a wake-up before planning.
const DEBOUNCE: Duration = Duration::from_millis(10);

/// Waits for changes (or the resync period) and runs a pass while leader.
/// A pass at least this long built and dropped large temporary structures (a whole-seed plan
/// takes seconds at 100,000 allocations); afterwards the free memory is handed back.
const TRIM_AFTER: Duration = Duration::from_millis(250);

/// Hands the allocator's free pages back to the system. glibc keeps memory freed in the middle
/// of its heaps: after a pass that planned the whole seed, that is tens of MiB of resident
/// memory no object uses, and the next pass's peak stacks on top of it. Costs a few
/// milliseconds after a pass that took far longer; nothing on other C libraries.
fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it is safe to call at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

async fn planning_loop(
    ctx: Arc<Context>,
    wake: Arc<Notify>,
    resync: Duration,
    mut state: pass::PassState,
) {
    // Caches first: a pass on a partial view would release what it cannot see.
    let _ = tokio::join!(
        ctx.pools.wait_until_ready(),
        ctx.clusters.wait_until_ready(),
        ctx.namespaces.wait_until_ready(),
    );
    ctx.metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut leadership = ctx.leader.subscribe();
    // The leadership term the ledger and records were rebuilt in.
    let mut built_for: Option<u64> = None;
    let mut failures: u32 = 0;
    let mut last_problem: Option<String> = None;
    let mut last_full: Option<Instant> = None;
    loop {
        let holds = ctx.leader.holds();
        ctx.metrics.set_leader(holds);
        if !holds {
            built_for = None;
            tokio::select! {
                _ = leadership.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            continue;
        }
        let term = ctx.leader.term();
        if built_for != Some(term) {
            // Every gain of leadership starts from a fresh quorum list: what any earlier
            // leader committed is all there.
            match rebuild(&ctx).await {
                Ok(()) => {
                    built_for = Some(term);
                    state.replan_all();
                    failures = 0;
                    last_problem = None;
                    tracing::info!(
                        term,
                        "leading: allocations and pool records rebuilt from a fresh list"
                    );
                }
                Err(message) => {
                    failures += 1;
                    if last_problem.as_deref() != Some(message.as_str()) {
                        tracing::error!("{message} (retrying with backoff)");
                        last_problem = Some(message.clone());
                    }
                    ctx.metrics.set_not_ready(Some(message));
                    tokio::time::sleep(backoff::delay(failures)).await;
                    continue;
                }
            }
        }
        let started = Instant::now();
        if last_full.is_none_or(|t| t.elapsed() >= resync) {
            // The periodic resync: plan and check the whole seed, whatever changed.
            state.replan_all();
            last_full = Some(started);
        }
        ctx.metrics.passes.inc();
        let guard = ctx.pass_lock.lock().await;
        let result = pass::run(&ctx, term, &mut state).await;
        drop(guard);
        if started.elapsed() >= TRIM_AFTER {
            give_back_free_memory();
        }
        let wait = match result {
            Ok(outcome) => {
                failures = 0;
                tracing::debug!(writes = outcome.writes, again = outcome.again, "pass done");
                let wait = match (outcome.again, outcome.retry_after) {
                    (true, Some(after)) => after.max(Duration::from_millis(200)),
                    (true, None) => Duration::from_millis(200),
                    (false, Some(after)) => after.min(resync),
                    (false, None) => resync,
                };
                outcome.status_after.map_or(wait, |s| wait.min(s))
            }
            Err(e) => {
                failures += 1;
                state.replan_all();
                ctx.metrics.pass_failures.inc();
                tracing::warn!(error = %e, "pass failed (retrying with backoff)");
                backoff::delay(failures)
            }
        };
        ctx.metrics.pass_finished(started.elapsed());
        tokio::select! {
            _ = wake.notified(), if failures == 0 => {
                // Let the events of one change (or of a burst being written) arrive together.
                // Short: changes that arrive while a pass runs are batched into the next one
                // anyway, and a new cluster should not wait.
                tokio::time::sleep(DEBOUNCE).await;
            }
            _ = tokio::time::sleep(wait) => {}
            _ = leadership.changed() => {}
        }
    }
}

/// Rebuilds the ledger and the pool records from fresh lists.
// RBAC: src/rbac.rs (list of allocations and pool records).
async fn rebuild(ctx: &Context) -> Result<(), String> {
    let allocations: Api<IPAMAllocation> = Api::all(ctx.writer.clone());
    let list = allocations
        .list(&ListParams::default())
        .await
        .map_err(|e| preconditions::explain(&e, "list", "ipamallocations.ipam.kipam.dev", ""))?;
    let records: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    let record_list = records
        .list(&ListParams::default())
        .await
        .map_err(|e| preconditions::explain(&e, "list", "ipampoolrecords.ipam.kipam.dev", ""))?;
    ctx.ledger.lock().await.reset(list.items);
    ctx.ledger_updates.send_replace(true);
    ctx.records.lock().await.reset(record_list.items);
    ctx.metrics.set_not_ready(None);
    Ok(())
}
