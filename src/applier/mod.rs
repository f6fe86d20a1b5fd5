//! The addon applier: every Addon rendered with its cluster's allocations and applied inside
//! the user cluster through the kubeconfig its `Cluster` names (server-side apply, field manager
//! `kipam`, forced), objects no longer rendered pruned, drift repaired on every resync.
//!
//! - watches of Addons and of kubeconfig Secrets (their metadata only) feed caches and wake
//!   the scheduler; Clusters and IPAMPools (for their networks) are read from the
//!   controller's own caches ([`Context::clusters`], [`Context::pools`]), whose changes
//!   ([`Context::cache_changes`]) wake it, and allocations from the controller's
//!   [`Ledger`](crate::seed::ledger::Ledger), whose updates ([`Context::ledger_updates`]) wake
//!   it too;
//! - the scheduler (leader only) works out, per user cluster, whether its inputs changed since
//!   its last successful sync, its resync is due, or a failed sync's backoff has passed, and
//!   starts at most `--tenant-concurrency` syncs at once, one at a time per cluster;
//! - [`sync`] does one user cluster; [`summary`] computes statuses (pure); [`kubeconfig`] turns
//!   a Secret into a client configuration;
//! - [`drift`] watches, on the leader, the objects kipam applied in each user cluster and asks
//!   for a full sync of a cluster where one was changed or deleted by someone else.
//!
//! See `docs/multicluster.md`.

pub mod drift;
pub use crate::seed::kubeconfig;
pub mod metrics;
pub mod summary;
pub mod sync;

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tokio::sync::{Notify, Semaphore, mpsc};

use crate::render::Renderer;
use crate::resources::{Addon, Cluster, cluster_of_namespace};
use crate::resources::{IPAMAllocationSpec, IPAMPool};
use crate::seed::backoff::Backoff;
use crate::seed::ledger::Entry;
use crate::seed::{Context, watches};
use sync::{ClientSlot, SyncReport, TenantInput};

/// Field manager of every server-side apply in user clusters.
pub const FIELD_MANAGER: &str = "kipam";
/// Finalizer on Addons: their objects are pruned from the user cluster before they go.
pub const FINALIZER: &str = "ipam.kipam.dev/prune-addon";

/// The Secrets the applier watches (see `run`).
const SECRET_FIELDS: &str = "type!=helm.sh/release.v1,type!=kubernetes.io/service-account-token";

/// How the applier runs (part of `kipam controller`'s options).
#[derive(Clone, Debug)]
pub struct ApplierOptions {
    /// The addons, loaded and parsed at start-up.
    pub renderer: Arc<Renderer>,
    /// At most this many user clusters are worked on at once.
    pub tenant_concurrency: usize,
    /// Every user cluster is re-applied at least this often (drift repair).
    pub resync: Duration,
    /// Timeout of connecting, reading and writing, for each request to a user cluster.
    pub request_timeout: Duration,
}

/// The scheduler's view of one user cluster.
#[derive(Default)]
struct Tenant {
    /// Inputs of the last settled sync.
    fingerprint: Option<u64>,
    /// When the last settled sync ended.
    synced_at: Option<Instant>,
    /// The last sync did not settle: retry once its backoff has passed.
    retry: bool,
    running: bool,
    /// Its client configuration and discovery cache; taken by the running sync.
    slot: Option<ClientSlot>,
    /// The `AddonsReady` condition last written, to notice it being overwritten.
    addons_ready: Option<(bool, String, String)>,
    /// The failure last said in the log ([`SyncReport::said`]).
    said: Option<String>,
}

/// The applier's own caches. Allocations are not among them: they come from the ledger.
struct Caches {
    addons: Store<Addon>,
    clusters: Store<Cluster>,
    /// Metadata only: which version of each kubeconfig Secret is current.
    secrets: Store<PartialObjectMeta<Secret>>,
    /// Read for the `network` of each pool datacenter, which templates see.
    pools: Store<IPAMPool>,
}

/// Feeds a watch into a cache, waking the scheduler on every change and saying (once per
/// distinct error, at warn level) when the watch fails, and when it recovers.
fn cached<K>(
    (store, events): (
        Store<K>,
        impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    ),
    wake: Arc<Notify>,
    what: &'static str,
) -> (Store<K>, impl Stream<Item = ()>)
where
    K: watches::Watched,
{
    let mut last_error: Option<String> = None;
    let stream = events.map(move |ev| {
        match &ev {
            Err(e) => {
                let text = watches::failure(e, what);
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(
                        resource = what,
                        "addon applier: {text} (retrying with backoff)"
                    );
                    last_error = Some(text);
                }
            }
            // Yielded before every attempt to list, successful or not.
            Ok(watcher::Event::Init) => {}
            Ok(_) => {
                if last_error.take().is_some() {
                    tracing::info!(resource = what, "addon applier watch recovered");
                }
            }
        }
        wake.notify_one();
    });
    (store, stream)
}

/// Runs the applier until the task is aborted. Only the leader applies; other replicas keep
/// their caches warm.
pub async fn run(ctx: Arc<Context>, options: ApplierOptions) {
    let metrics = metrics::Metrics::new(&ctx.metrics);
    let wake = Arc::new(Notify::new());
    // Subscribed before anything is read: no update after this point goes unnoticed.
    let mut ledger_updates = ctx.ledger_updates.subscribe();
    // RBAC: src/rbac.rs (list/watch of addons and secrets).
    let (addons, addon_events) = cached(
        watches::reflected(
            Api::<Addon>::all(ctx.client.clone()),
            watcher::Config::default(),
        ),
        wake.clone(),
        "addons.ipam.kipam.dev",
    );
    // Kubeconfigs are opaque Secrets; Helm release records and service account tokens, often
    // the bulk of a seed's Secrets, are never kubeconfigs and are not watched. Only the
    // metadata is kept: its uid and resourceVersion say when a user cluster's client must be
    // built again, and only then is the Secret's data read (`Context::tenant_client`).
    let (secrets, secret_events) = cached(
        watches::reflected(
            Api::<PartialObjectMeta<Secret>>::all(ctx.client.clone()),
            watcher::Config::default().fields(SECRET_FIELDS),
        ),
        wake.clone(),
        "secrets",
    );
    // Clusters and pools come from the controller's own caches, which every replica keeps:
    // their changes tick `cache_changes` (a second watch of each held every Cluster twice).
    let mut changes = ctx.cache_changes.subscribe();
    let woken = wake.clone();
    let watches = tokio::spawn(async move {
        let mut all =
            futures::stream::select_all(vec![addon_events.boxed(), secret_events.boxed()]);
        loop {
            tokio::select! {
                event = all.next() => if event.is_none() { break },
                changed = changes.changed() => match changed {
                    Ok(()) => woken.notify_one(),
                    // The context is gone: so is the controller.
                    Err(_) => break,
                },
            }
        }
    });
    let caches = Arc::new(Caches {
        addons,
        clusters: ctx.clusters.clone(),
        secrets,
        pools: ctx.pools.clone(),
    });
    // The ledger is ready once it has held a complete list: before, a cluster would be
    // rendered without allocations it holds.
    // The controller's Cluster and pool caches are not waited on here: kube's ready signal
    // wakes only the last task that waited, and the planning loop waits on them; it says when
    // they have listed (`caches_listed`).
    let mut listed = ctx.caches_listed.subscribe();
    let _ = tokio::join!(
        caches.addons.wait_until_ready(),
        caches.secrets.wait_until_ready(),
        // (the guards wait_for returns must not be held across the other waits)
        async { listed.wait_for(|listed| *listed).await.is_ok() },
        async { ledger_updates.wait_for(|complete| *complete).await.is_ok() },
    );
    tracing::info!(
        concurrency = options.tenant_concurrency,
        resync_seconds = options.resync.as_secs(),
        "addon applier ready"
    );
    schedule(ctx, metrics, options, caches, wake, ledger_updates).await;
    watches.abort();
}

/// What finished syncs report back.
type Done = (String, u64, SyncReport, ClientSlot);

async fn schedule(
    ctx: Arc<Context>,
    metrics: Arc<metrics::Metrics>,
    options: ApplierOptions,
    caches: Arc<Caches>,
    wake: Arc<Notify>,
    mut ledger_updates: tokio::sync::watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(options.tenant_concurrency.max(1)));
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut tenants: HashMap<String, Tenant> = HashMap::new();
    let mut backoff = Backoff::default();
    let mut leadership = ctx.leader.subscribe();
    let mut was_leader = false;
    let mut next_wait = options.resync;
    let drift = drift::Drift::new(metrics.clone(), wake.clone());
    loop {
        tokio::select! {
            _ = wake.notified() => {
                // Let a burst of changes settle into one round.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(()) = ledger_updates.changed() => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Some(done) = done_rx.recv() => finish(&mut tenants, &mut backoff, &drift, done, ctx.leader.holds()),
            _ = leadership.changed() => {}
            _ = tokio::time::sleep(next_wait) => {}
        }
        while let Ok(done) = done_rx.try_recv() {
            finish(&mut tenants, &mut backoff, &drift, done, ctx.leader.holds());
        }
        let leading = ctx.leader.holds();
        if !leading {
            // A new term starts from scratch: everything is applied again.
            if was_leader {
                for t in tenants.values_mut() {
                    forget(t);
                }
                drift.stop_all();
                // The shared user-cluster clients too (the demand reader stops as well).
                ctx.tenants.retain(|_| false);
            }
            was_leader = false;
            next_wait = Duration::from_secs(1);
            continue;
        }
        was_leader = true;
        // Only the namespaces with Addons are read from the ledger, one range each.
        let by_namespace = addons_by_namespace(&caches);
        let allocations = {
            let ledger = ctx.ledger.lock().await;
            by_namespace
                .keys()
                .map(|ns| (ns.clone(), ledger.in_namespace(ns)))
                .collect()
        };
        // A cluster due for a retry is synced in this round if it still has Addons; one that
        // has none any more must not keep waking the loop.
        backoff.start_round();
        next_wait = round(
            &ctx,
            &metrics,
            &options,
            &caches,
            by_namespace,
            allocations,
            &mut tenants,
            &backoff,
            &permits,
            &done_tx,
            &drift,
        );
    }
}

/// What a replica knew about a user cluster, dropped when it stops leading: the next term
/// starts with a full apply everywhere, not from memories of an earlier one.
fn forget(tenant: &mut Tenant) {
    tenant.fingerprint = None;
    tenant.synced_at = None;
    tenant.slot = None;
    tenant.addons_ready = None;
    tenant.said = None;
}

fn finish(
    tenants: &mut HashMap<String, Tenant>,
    backoff: &mut Backoff,
    drift: &drift::Drift,
    done: Done,
    leading: bool,
) {
    let (name, fingerprint, report, slot) = done;
    match (&slot, leading) {
        (Some(t), true) => drift.sync_ended(
            &name,
            drift::Applied {
                source: &t.source,
                client: &t.client,
                kinds: &t.kinds,
                stamps: &t.stamps,
            },
        ),
        _ => drift.stop(&name),
    }
    let tenant = tenants.entry(name.clone()).or_default();
    tenant.running = false;
    tenant.slot = Some(slot);
    if !leading {
        forget(tenant);
        return;
    }
    tenant.said = report.said;
    if report.addons_ready.is_some() {
        tenant.addons_ready = report.addons_ready;
    }
    if report.settled {
        backoff.succeeded(&name);
        tenant.fingerprint = Some(fingerprint);
        tenant.synced_at = Some(Instant::now());
        tenant.retry = false;
    } else {
        let wait = backoff.failed(&name);
        tracing::debug!(cluster = %name, ?wait, "user cluster sync did not settle");
        tenant.fingerprint = None;
        tenant.retry = true;
    }
}

/// The Addons, by namespace.
fn addons_by_namespace(caches: &Caches) -> BTreeMap<String, Vec<Arc<Addon>>> {
    let mut by_namespace: BTreeMap<String, Vec<Arc<Addon>>> = BTreeMap::new();
    for addon in caches.addons.state() {
        if let Some(ns) = addon.namespace() {
            by_namespace.entry(ns).or_default().push(addon);
        }
    }
    by_namespace
}

/// One scheduling round over the Addons (by namespace) and those namespaces' allocations:
/// starts the syncs that are due; returns how long until the next one may be due without any
/// change.
#[allow(clippy::too_many_arguments)]
fn round(
    ctx: &Arc<Context>,
    metrics: &Arc<metrics::Metrics>,
    options: &ApplierOptions,
    caches: &Arc<Caches>,
    by_namespace: BTreeMap<String, Vec<Arc<Addon>>>,
    mut allocations: HashMap<String, Vec<Arc<Entry>>>,
    tenants: &mut HashMap<String, Tenant>,
    backoff: &Backoff,
    permits: &Arc<Semaphore>,
    done_tx: &mpsc::UnboundedSender<Done>,
    drift: &drift::Drift,
) -> Duration {
    // Looked up by name, for the namespaces with Addons only: a round runs on every change to
    // the allocations, and a map of every Cluster per round was a twelfth of the controller's
    // CPU in a burst of 10,000 new clusters.
    let cluster_named = |name: &str| caches.clusters.get(&reflector::ObjectRef::new(name));
    let mut next = options.resync;
    let pools = caches.pools.state();
    // Clusters whose Addons are all gone: their tenant state goes too.
    tenants.retain(|name, t| {
        t.running || by_namespace.contains_key(&crate::resources::cluster_namespace(name))
    });
    drift.retain(|name| tenants.contains_key(name));
    // A deleted Cluster's shared client goes (whoever still holds it keeps it until done).
    ctx.tenants.retain(|name| cluster_named(name).is_some());
    for (namespace, mut addons) in by_namespace {
        let Some(cluster_name) = cluster_of_namespace(&namespace).map(str::to_string) else {
            continue;
        };
        addons.sort_by_key(|a| a.name_any());
        let cluster = cluster_named(&cluster_name);
        // A cluster being adopted is left alone until its adoption commits (the planning pass
        // says `Adopting` or `Adopted`): a dry run, a wait or a conflict writes nothing into
        // the user cluster.
        if cluster
            .as_deref()
            .is_some_and(|c| held_by_adoption(c, &pools))
        {
            continue;
        }
        let secret = cluster.as_ref().and_then(|c| {
            let (ns, name, _) = kubeconfig::secret_location(c)?;
            caches
                .secrets
                .get(&reflector::ObjectRef::new(&name).within(&ns))
        });
        let mine = allocations.remove(&namespace).unwrap_or_default();
        let tenant = tenants.entry(cluster_name.clone()).or_default();
        let networks = networks_of(&caches.pools, &mine);
        let fingerprint = fingerprint(
            cluster.as_deref(),
            &addons,
            &mine,
            secret.as_deref(),
            tenant.addons_ready.as_ref(),
        ) ^ networks.1;
        if tenant.running {
            continue;
        }
        let resync_due = tenant
            .synced_at
            .is_none_or(|at| at.elapsed() >= options.resync);
        let changed = tenant.fingerprint != Some(fingerprint);
        let drifted = drift.drifted(&cluster_name);
        if tenant.retry || changed || resync_due || drifted {
            if !backoff.due(&cluster_name) {
                continue;
            }
            // Re-apply everything on a resync, a retry, drift and the first sync of a term; on
            // a change, only Addons whose rendered output changed.
            let force = tenant.retry || resync_due || drifted;
            tenant.running = true;
            drift.sync_started(&cluster_name);
            let slot = tenant.slot.take().flatten();
            let written = tenant.addons_ready.clone();
            let said = tenant.said.clone();
            let ctx = ctx.clone();
            let metrics = metrics.clone();
            let caches = caches.clone();
            let permits = permits.clone();
            let done_tx = done_tx.clone();
            let renderer = options.renderer.clone();
            let timeout = options.request_timeout;
            tokio::spawn(async move {
                let mut slot = slot;
                let mut synced = fingerprint;
                let report = match permits.acquire_owned().await {
                    Ok(_permit) => {
                        // The inputs are read now, not when the sync was queued: a queue of
                        // syncs on stale inputs would be wasted work.
                        let (mut input, now_fingerprint) =
                            snapshot(&ctx, &caches, &cluster_name, written.as_ref()).await;
                        input.said = said;
                        synced = now_fingerprint;
                        metrics.addon_syncs_in_flight.inc();
                        let started = Instant::now();
                        // Boxed, so that a sync waiting for its permit is a small task:
                        // a burst of new clusters queues one per cluster.
                        let report = Box::pin(sync::sync_tenant(
                            &ctx, &metrics, &renderer, timeout, input, force, &mut slot,
                        ))
                        .await;
                        metrics.addon_syncs_in_flight.dec();
                        metrics.addon_sync(report.settled, started.elapsed());
                        report
                    }
                    Err(_) => SyncReport {
                        settled: false,
                        addons_ready: None,
                        said: None,
                    },
                };
                let _ = done_tx.send((cluster_name, synced, report, slot));
            });
        } else if let Some(at) = tenant.synced_at {
            next = next.min(options.resync.saturating_sub(at.elapsed()));
        }
    }
    for due in [backoff.next_due(), drift.next_due()].into_iter().flatten() {
        next = next.min(due);
    }
    next.max(Duration::from_millis(50))
}

/// Whether adoption holds the cluster's user cluster back from the applier: `adopt` applies
/// and the planning pass has not said `Adopting` or `Adopted`.
fn held_by_adoption(cluster: &Cluster, pools: &[Arc<IPAMPool>]) -> bool {
    use crate::planner::adopt;
    let mode = adopt::effective_mode(cluster, pools.iter().map(AsRef::as_ref));
    if !adopt::reads(mode) {
        return false;
    }
    let state = cluster
        .status
        .as_ref()
        .and_then(|s| s.adoption.as_ref())
        .map(|a| a.state.as_str());
    !matches!(state, Some("Adopting" | "Adopted"))
}

/// A digest of everything a sync of this user cluster depends on (statuses excluded, so that
/// kipam's own status writes do not trigger another sync).
fn fingerprint(
    cluster: Option<&Cluster>,
    addons: &[Arc<Addon>],
    allocations: &[Arc<Entry>],
    secret: Option<&PartialObjectMeta<Secret>>,
    written: Option<&(bool, String, String)>,
) -> u64 {
    let mut h = DefaultHasher::new();
    match cluster {
        None => 0u8.hash(&mut h),
        Some(c) => {
            1u8.hash(&mut h);
            c.uid().hash(&mut h);
            c.metadata.generation.hash(&mut h);
            c.metadata.deletion_timestamp.is_some().hash(&mut h);
            // AddonsReady overwritten by another writer: write it again.
            let stored = c.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|x| x.type_ == "AddonsReady")
                    .map(|x| (x.status == "True", x.reason.clone(), x.message.clone()))
            });
            (written.is_none() || written == stored.as_ref()).hash(&mut h);
        }
    }
    for a in addons {
        a.uid().hash(&mut h);
        a.metadata.generation.hash(&mut h);
        a.metadata.deletion_timestamp.is_some().hash(&mut h);
    }
    // What rendering reads of an allocation: its spec and whether it may be rendered (a
    // status update that leaves both alone changes nothing for the user cluster).
    let mut versions: Vec<(String, String)> = allocations
        .iter()
        .map(|a| {
            let renderable =
                !a.deleting() && a.phase() == crate::resources::AllocationPhase::Allocated;
            (
                a.name().to_string(),
                format!(
                    "{renderable}{}",
                    serde_json::to_string(a.spec()).unwrap_or_default()
                ),
            )
        })
        .collect();
    versions.sort();
    versions.hash(&mut h);
    secret.map(|s| (s.uid(), s.resource_version())).hash(&mut h);
    h.finish()
}

/// One user cluster's inputs, read from the caches and the ledger, and their fingerprint.
async fn snapshot(
    ctx: &Context,
    caches: &Caches,
    cluster_name: &str,
    written: Option<&(bool, String, String)>,
) -> (TenantInput, u64) {
    let namespace = crate::resources::cluster_namespace(cluster_name);
    let in_namespace = |ns: Option<String>| ns.as_deref() == Some(namespace.as_str());
    let mut addons: Vec<Arc<Addon>> = caches
        .addons
        .state()
        .into_iter()
        .filter(|a| in_namespace(a.namespace()))
        .collect();
    addons.sort_by_key(|a| a.name_any());
    let allocations = ctx.ledger.lock().await.in_namespace(&namespace);
    let cluster = caches
        .clusters
        .get(&reflector::ObjectRef::new(cluster_name));
    let secret = cluster.as_ref().and_then(|c| {
        let (ns, name, _) = kubeconfig::secret_location(c)?;
        caches
            .secrets
            .get(&reflector::ObjectRef::new(&name).within(&ns))
    });
    let (pools, networks) = networks_of(&caches.pools, &allocations);
    let fingerprint = fingerprint(
        cluster.as_deref(),
        &addons,
        &allocations,
        secret.as_deref(),
        written,
    ) ^ networks;
    (
        TenantInput {
            cluster_name: cluster_name.to_string(),
            namespace,
            cluster,
            addons,
            allocations,
            secret,
            pools,
            said: None,
        },
        fingerprint,
    )
}

/// The pools the allocations come from, and a digest of what templates may see of their
/// networks, so that editing a pool's `network` re-renders the clusters it serves. Pools
/// without a network in the allocation's datacenter add nothing: their edits sync nothing.
fn networks_of(pools: &Store<IPAMPool>, allocations: &[Arc<Entry>]) -> (Vec<Arc<IPAMPool>>, u64) {
    let mut found: BTreeMap<String, Arc<IPAMPool>> = BTreeMap::new();
    let mut seen: Vec<(String, String)> = Vec::new();
    for a in allocations {
        let pool = pools.get(&reflector::ObjectRef::new(a.name()));
        seen.push((
            a.name().to_string(),
            network_digest(pool.as_deref(), a.spec()),
        ));
        if let Some(pool) = pool {
            found.insert(a.name().to_string(), pool);
        }
    }
    seen.sort();
    let mut h = DefaultHasher::new();
    seen.hash(&mut h);
    (found.into_values().collect(), h.finish())
}

/// Which version of the pool the network of the allocation's datacenter comes from: its uid
/// and `generation` when that datacenter names a network (whether the network validates
/// depends on the rest of the pool's spec too), else nothing. Cheap on purpose: it runs for
/// every allocation in every scheduling round, and a sync whose render comes out the same
/// sends nothing to the user cluster.
fn network_digest(pool: Option<&IPAMPool>, spec: &IPAMAllocationSpec) -> String {
    match pool {
        Some(p)
            if p.spec
                .datacenters
                .get(&spec.dc)
                .is_some_and(|d| d.network.is_some()) =>
        {
            format!(
                "{}/{}",
                p.metadata.uid.as_deref().unwrap_or_default(),
                p.metadata.generation.unwrap_or_default()
            )
        }
        _ => String::new(),
    }
}
