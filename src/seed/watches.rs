//! The seed's watches: pools, clusters and kipam's namespaces feed [`Store`] caches, and the
//! allocation watch feeds the [`Ledger`](super::ledger::Ledger) directly (see `ledger` for its
//! guards). Every event the planner would read marks [`Dirty`] and wakes the planning loop;
//! the echo of kipam's own status or finalizer write wakes nobody. This replica watches
//! allocations once: the applier and the webhook read the ledger.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use kube::{Resource, ResourceExt};
use tokio::sync::Notify;

use super::metrics::Metrics;
use super::{Context, Dirty, preconditions};
use crate::resources::capi::{CLAIM_FINALIZER, CapiCluster, IPAddress, IPAddressClaim};
use crate::resources::{
    CLUSTER_FINALIZER, Cluster, IPAMAllocation, IPAMPool, IPAMPoolRecord, LABEL_CLUSTER,
    POOL_FINALIZER,
};

/// Retry delays of kipam's watches: those of the controller's writes (200 ms, doubling,
/// at most 30 s), growing for as long as the watch keeps failing.
///
/// kube's stream backoff starts again from its first step on every item that is not an error,
/// and its watcher yields an `Init` event before each attempt to list: a list that always
/// fails (a CRD not installed) would be retried about once a second forever. So resets from the
/// stream are ignored here; the delays start again once no error has come for [`CALM`].
#[derive(Default)]
pub struct WatchBackoff {
    failures: u32,
    last: Option<Instant>,
}

/// How long a watch must go without an error before its retry delays start again from the
/// first (longer than the largest delay, so a watch that keeps failing never gets there).
const CALM: Duration = Duration::from_secs(120);

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.last.is_some_and(|at| at.elapsed() >= CALM) {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        self.last = Some(Instant::now());
        Some(super::backoff::delay(self.failures))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {}
}

/// What to tell the operator about a failed watch of `resource`, in one line (no `Debug` dump
/// of the API server's answer).
pub fn failure(e: &watcher::Error, resource: &str) -> String {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => preconditions::explain(e, "list/watch", resource, ""),
        other => format!("the watch of {resource} failed: {other}"),
    }
}

/// What kipam watches into a cache: a typed object, cheap to clone.
pub trait Watched:
    kube::Resource<DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> Watched for K where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// A watch of `api` feeding a fresh cache, retried with [`WatchBackoff`], with the
/// field-manager bookkeeping (most of a small object, never read by kipam) dropped. The caller
/// drives the events and says what a failure means.
pub fn reflected<K>(
    api: Api<K>,
    config: watcher::Config,
) -> (
    Store<K>,
    impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: Watched,
{
    let (store, writer) = reflector::store();
    let watch = watcher::watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(|o: &mut K| o.meta_mut().managed_fields = None);
    (store, reflector::reflector(writer, watch))
}

/// Like [`reflected`], with a second cache, `aside`, of the objects `pick` selects: the few a
/// pass looks for among many (the `IPAddress`es kipam did not write, among thousands of its
/// own) without going through all of them. Each event reaches `aside` before the main cache,
/// so `aside` is never behind it; an object that stops being picked leaves `aside`.
pub fn reflected_with_aside<K>(
    api: Api<K>,
    config: watcher::Config,
    pick: fn(&K) -> bool,
) -> (
    Store<K>,
    Store<K>,
    impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
)
where
    K: Watched,
{
    let (store, writer) = reflector::store();
    let (aside, mut aside_writer) = reflector::store::<K>();
    let aside_reader = aside.clone();
    let watch = watcher::watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .map(move |ev| {
            if let Ok(ev) = &ev {
                feed_aside(&mut aside_writer, &aside_reader, ev, pick);
            }
            ev
        });
    (store, aside, reflector::reflector(writer, watch))
}

/// Applies one watch event to the cache of the objects `pick` selects (`writer`, read by
/// `reader`).
fn feed_aside<K>(
    writer: &mut reflector::store::Writer<K>,
    reader: &Store<K>,
    ev: &Event<K>,
    pick: fn(&K) -> bool,
) where
    K: Watched,
{
    match ev {
        Event::Apply(o) | Event::InitApply(o) if pick(o) => writer.apply_watcher_event(ev),
        // No longer picked (an `IPAddress` kipam adopted): it leaves.
        Event::Apply(o) => {
            if reader.get(&reflector::ObjectRef::from(o)).is_some() {
                writer.apply_watcher_event(&Event::Delete(o.clone()));
            }
        }
        // A re-list fills the cache with the picked objects only.
        Event::InitApply(_) => {}
        Event::Delete(_) | Event::Init | Event::InitDone => writer.apply_watcher_event(ev),
    }
}

/// Says once (until it changes or clears) why a watch fails, at warn level, and keeps
/// `/readyz` false with the same reason while it lasts.
pub struct WatchReporter {
    resource: &'static str,
    metrics: Arc<Metrics>,
    last: std::sync::Mutex<Option<String>>,
    /// The kind may be missing (see [`WatchReporter::optional`]).
    optional: bool,
}

impl WatchReporter {
    pub fn new(resource: &'static str, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(WatchReporter {
            resource,
            metrics,
            last: std::sync::Mutex::new(None),
            optional: false,
        })
    }

    /// The watch of an optional kind failed because the kind is not installed.
    fn not_installed(&self, e: &watcher::Error) -> bool {
        self.optional && is_not_installed(e)
    }

    /// For a kind kipam serves only when it is installed (Cluster API's): a watch failing
    /// because the kind is not there says so once, at info level, and leaves `/readyz` alone.
    pub fn optional(resource: &'static str, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(WatchReporter {
            resource,
            metrics,
            last: std::sync::Mutex::new(None),
            optional: true,
        })
    }

    pub fn failed(&self, e: &watcher::Error) {
        if self.optional && is_not_installed(e) {
            let message = format!(
                "{} is not installed: Cluster API claims are not served until it is (the watch retries with backoff)",
                self.resource
            );
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if last.as_deref() != Some(message.as_str()) {
                tracing::info!(resource = self.resource, "{message}");
                *last = Some(message);
            }
            return;
        }
        let message = failure(e, self.resource);
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

    pub fn ok(&self) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(was) = last.take() {
            tracing::info!(resource = self.resource, "watch recovered");
            // An optional kind that was missing never made the replica unready.
            if !(self.optional && was.contains(" is not installed: ")) {
                self.metrics.set_not_ready(None);
            }
        }
    }
}

/// The watch failed because the API server does not serve the kind (404: no CRD).
fn is_not_installed(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => match e {
            kube::Error::Api(s) => s.code == 404,
            _ => false,
        },
        _ => false,
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
    /// Any change to an object the function does not call kipam's own (an echo of kipam's
    /// write wakes nobody), and every deletion.
    Foreign(fn(&K) -> bool),
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
#[allow(clippy::too_many_arguments)]
fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
    wake: Arc<Notify>,
    reporter: Arc<WatchReporter>,
    wakes: Wakes<K>,
    dirty: Arc<Dirty>,
    by_name: Option<fn(&K) -> Option<String>>,
    listed: Option<Arc<AtomicBool>>,
) -> (Store<K>, impl Stream<Item = ()>)
where
    K: Watched,
{
    let (store, events) = reflected(api, config);
    (
        store,
        waking(events, wake, reporter, wakes, dirty, by_name, listed),
    )
}

/// The events of a watch feeding a cache, waking the planner on every change it reads (see
/// [`cached`]).
#[allow(clippy::too_many_arguments)]
fn waking<K>(
    events: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    wake: Arc<Notify>,
    reporter: Arc<WatchReporter>,
    wakes: Wakes<K>,
    dirty: Arc<Dirty>,
    by_name: Option<fn(&K) -> Option<String>>,
    listed: Option<Arc<AtomicBool>>,
) -> impl Stream<Item = ()>
where
    K: Watched,
{
    let mut seen: std::collections::HashMap<reflector::ObjectRef<K>, u64> = Default::default();
    events.map(move |ev| {
        match &ev {
            Err(e) => reporter.failed(e),
            // A re-list announces itself before it is tried: no sign of health yet.
            Ok(Event::Init) => {}
            Ok(_) => reporter.ok(),
        }
        if let (Ok(Event::InitDone), Some(listed)) = (&ev, &listed) {
            listed.store(true, Ordering::Release);
        }
        let wakes_now = match (&ev, wakes) {
            (Ok(Event::Apply(o)) | Ok(Event::InitApply(o)), Wakes::Content(content)) => {
                let fingerprint = content(o);
                seen.insert(reflector::ObjectRef::from(o), fingerprint) != Some(fingerprint)
            }
            (Ok(Event::Apply(_)) | Ok(Event::InitApply(_)), Wakes::Deletions) => false,
            (Ok(Event::Apply(o)) | Ok(Event::InitApply(o)), Wakes::Foreign(own)) => !own(o),
            (Ok(Event::Delete(o)), _) => {
                seen.remove(&reflector::ObjectRef::from(o));
                true
            }
            (Ok(Event::Init), _) => false,
            // A kind that is not installed (Cluster API's, on a cluster without it): its
            // cache stays as it was, and a pass of the whole seed on every retry (200 ms,
            // doubling, then every 30 s, for good) made new clusters wait for it now and then.
            (Err(e), _) if reporter.not_installed(e) => false,
            (Ok(Event::InitDone), _) | (Err(_), _) => true,
        };
        if wakes_now {
            // A content change of a cluster is placed by name; anything else (a pool, a
            // deletion, a re-list, an error) asks the next pass to look at everything.
            match &ev {
                Ok(Event::Apply(o)) | Ok(Event::InitApply(o))
                    if let Some(name) = by_name.and_then(|f| f(o)) =>
                {
                    tracing::trace!(target: "kipam::seed::dirty", holder = %name, "changed");
                    dirty.cluster(name)
                }
                _ => dirty.other(),
            }
            wake.notify_one();
        }
    })
}

/// The caches the planner reads, and the stream that keeps them filled (it must be driven).
pub struct Caches {
    pub pools: Store<IPAMPool>,
    pub clusters: Store<Cluster>,
    pub namespaces: Store<Namespace>,
    pub capi: CapiCaches,
    pub records: RecordView,
    /// Ticks after each event of the pool and Cluster watches, once it is in its cache.
    pub changes: tokio::sync::watch::Sender<()>,
    pub events: BoxStream<'static, ()>,
}

/// Starts the watches of pools, clusters and kipam's namespaces (lazily: nothing is sent
/// until [`Caches::events`] is driven).
// RBAC: src/rbac.rs (list/watch of pools, clusters, namespaces, pool records, and Cluster
// API's claims, addresses and clusters).
pub fn caches(
    client: &Client,
    metrics: &Arc<Metrics>,
    wake: &Arc<Notify>,
    dirty: &Arc<Dirty>,
) -> Caches {
    let (pools, pool_events) = cached(
        Api::<IPAMPool>::all(client.clone()),
        watcher::Config::default(),
        wake.clone(),
        WatchReporter::new("ipampools.ipam.kipam.dev", metrics.clone()),
        // Cluster API's pause annotation on a pool stops and resumes its claims.
        Wakes::Content(|p: &IPAMPool| {
            planned_content(p, &p.spec, POOL_FINALIZER)
                ^ u64::from(crate::resources::capi::has_pause_annotation(&p.metadata))
        }),
        dirty.clone(),
        None,
        None,
    );
    let (clusters, cluster_events) = cached(
        Api::<Cluster>::all(client.clone()),
        watcher::Config::default(),
        wake.clone(),
        WatchReporter::new("clusters.ipam.kipam.dev", metrics.clone()),
        Wakes::Content(|c: &Cluster| planned_content(c, &c.spec, CLUSTER_FINALIZER)),
        dirty.clone(),
        Some(|c: &Cluster| c.meta().name.clone()),
        None,
    );
    let (namespaces, namespace_events) = cached(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default().labels(LABEL_CLUSTER),
        wake.clone(),
        WatchReporter::new("namespaces", metrics.clone()),
        Wakes::Deletions,
        dirty.clone(),
        None,
        None,
    );
    let claims_listed = Arc::new(AtomicBool::new(false));
    let addresses_listed = Arc::new(AtomicBool::new(false));
    let clusters_listed = Arc::new(AtomicBool::new(false));
    let (claims, claim_events) = cached(
        Api::<IPAddressClaim>::all(client.clone()),
        watcher::Config::default(),
        wake.clone(),
        WatchReporter::optional("ipaddressclaims.ipam.cluster.x-k8s.io", metrics.clone()),
        Wakes::Content(claim_content),
        dirty.clone(),
        // A claim of a kipam pool is named (its holder name) so that new claims can take the
        // short pass; others do not concern the planner.
        Some(|c: &IPAddressClaim| {
            c.spec.pool_ref.kipam_pool()?;
            Some(crate::resources::capi::claim_holder(
                c.meta().namespace.as_deref()?,
                c.meta().name.as_deref()?,
            ))
        }),
        Some(claims_listed.clone()),
    );
    let (addresses, foreign_addresses, address_events) = reflected_with_aside(
        Api::<IPAddress>::all(client.clone()),
        watcher::Config::default(),
        |a: &IPAddress| !a.written_by_kipam(),
    );
    let address_events = waking(
        address_events,
        wake.clone(),
        WatchReporter::optional("ipaddresses.ipam.cluster.x-k8s.io", metrics.clone()),
        // kipam's own `IPAddress`es change only by kipam's writes (a hand edit is repaired by
        // the periodic full pass); anybody else's, and every deletion, are planned.
        Wakes::Foreign(IPAddress::written_by_kipam),
        dirty.clone(),
        None,
        Some(addresses_listed.clone()),
    );
    let (capi_clusters, capi_cluster_events) = cached(
        Api::<CapiCluster>::all(client.clone()),
        watcher::Config::default(),
        wake.clone(),
        WatchReporter::optional("clusters.cluster.x-k8s.io", metrics.clone()),
        Wakes::Content(|c: &CapiCluster| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            c.is_paused().hash(&mut h);
            h.finish()
        }),
        dirty.clone(),
        None,
        Some(clusters_listed.clone()),
    );
    let (records, record_events) = record_view(client, metrics, dirty.clone());
    // The addon applier reads Clusters and pools from these caches: every event of theirs
    // (after it reached the cache) ticks for it.
    let changes = tokio::sync::watch::Sender::new(());
    let tick = |events: BoxStream<'static, ()>| {
        let changes = changes.clone();
        events
            .inspect(move |()| {
                changes.send_replace(());
            })
            .boxed()
    };
    let (pool_events, cluster_events) = (tick(pool_events.boxed()), tick(cluster_events.boxed()));
    Caches {
        pools,
        clusters,
        namespaces,
        records,
        changes,
        capi: CapiCaches {
            claims,
            addresses,
            foreign_addresses,
            clusters: capi_clusters,
            claims_listed,
            addresses_listed,
            clusters_listed,
        },
        events: futures::stream::select_all(vec![
            pool_events,
            cluster_events,
            namespace_events.boxed(),
            claim_events.boxed(),
            address_events.boxed(),
            capi_cluster_events.boxed(),
            record_events.boxed(),
        ])
        .boxed(),
    }
}

/// The pool records as this replica sees them, read-only: what the page reads of the
/// quarantine, and what the webhook checks claims' addresses against, on every replica. The
/// leader's own copy, the fence's state, is [`super::records`]: its content changes only with
/// what the API server answered to its writes, never from this watch (it only shares this
/// watch's object for a shard at the very version it holds, [`super::records::Records::share`]).
#[derive(Clone)]
pub struct RecordView {
    pub store: Store<IPAMPoolRecord>,
    listed: Arc<AtomicBool>,
    /// Shards the watch saw go, as (name, uid), until the planning loop takes them: the
    /// leader's copy keeps a shard until it hears of its deletion, and a shard deleted by
    /// somebody else (the garbage collector, after its pool went) must leave that copy, or
    /// the leader finds nothing to commit for the holders it listed.
    deleted: Arc<std::sync::Mutex<Vec<(String, String)>>>,
}

impl Default for RecordView {
    /// An empty view nothing fills (tests and benches that do not watch records).
    fn default() -> Self {
        RecordView {
            store: reflector::store().0,
            listed: Default::default(),
            deleted: Default::default(),
        }
    }
}

impl RecordView {
    /// A view of `store`, complete once `listed` (tests fill it as the watch would).
    pub fn new(store: Store<IPAMPoolRecord>, listed: bool) -> RecordView {
        RecordView {
            store,
            listed: Arc::new(AtomicBool::new(listed)),
            deleted: Default::default(),
        }
    }

    /// The watch has listed once: from then on the view is complete (a missing entry is
    /// not there).
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// The shards seen deleted since the last call, as (name, uid), oldest first.
    pub fn take_deleted(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.deleted.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn note_deleted(&self, r: &IPAMPoolRecord) {
        let name = r.metadata.name.clone().unwrap_or_default();
        let uid = r.metadata.uid.clone().unwrap_or_default();
        self.deleted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name, uid));
    }
}

/// What the record watch notes of shards that go: each deletion, and after a re-list (the
/// watch fell behind, its history was compacted) the shards the view held before and the new
/// list no longer shows, since no deletion event comes for them.
#[derive(Default)]
struct Deletions {
    relist: Option<Relist>,
}

/// During a re-list: the shards the view held when it began, and the (name, uid) of those it
/// has shown since.
type Relist = (Vec<Arc<IPAMPoolRecord>>, HashSet<(String, String)>);

impl Deletions {
    /// Looks at one event, after the view's store took it (as the reflector does); true when
    /// it noted a deletion in `view`.
    fn observe(&mut self, view: &RecordView, ev: &Event<IPAMPoolRecord>) -> bool {
        let id = |r: &IPAMPoolRecord| (r.name_any(), r.metadata.uid.clone().unwrap_or_default());
        match ev {
            Event::Init => {
                // The store still shows what it held before (it is replaced at `InitDone`);
                // the first list has nothing before it.
                self.relist = view.listed().then(|| (view.store.state(), HashSet::new()));
                false
            }
            Event::InitApply(r) => {
                if let Some((_, shown)) = self.relist.as_mut() {
                    shown.insert(id(r));
                }
                false
            }
            Event::InitDone => {
                let Some((before, shown)) = self.relist.take() else {
                    return false;
                };
                let mut noted = false;
                for r in before.iter().filter(|r| !shown.contains(&id(r))) {
                    view.note_deleted(r);
                    noted = true;
                }
                noted
            }
            Event::Delete(r) => {
                view.note_deleted(r);
                true
            }
            Event::Apply(_) => false,
        }
    }
}

/// The watch of pool records. It wakes the planning loop only when a shard goes (kipam alone
/// writes them, and the planner reads the leader's copy; but the garbage collector deletes
/// the shards of a deleted pool, and a person may delete one): the deletion is noted for the
/// loop ([`RecordView::take_deleted`]). A re-list after the watch fell behind notes the
/// shards it no longer shows. A failure makes the replica unready like any watch's.
fn record_view(
    client: &Client,
    metrics: &Arc<Metrics>,
    dirty: Arc<Dirty>,
) -> (RecordView, impl Stream<Item = ()> + use<>) {
    let (store, events) = reflected(
        Api::<IPAMPoolRecord>::all(client.clone()),
        watcher::Config::default(),
    );
    let view = RecordView::new(store, false);
    let listed = view.listed.clone();
    let reporter = WatchReporter::new("ipampoolrecords.ipam.kipam.dev", metrics.clone());
    let noted = view.clone();
    let mut deletions = Deletions::default();
    let stream = events.map(move |ev| match &ev {
        Err(e) => reporter.failed(e),
        Ok(ev) => {
            if deletions.observe(&noted, ev) {
                dirty.other();
                dirty.wake();
            }
            if matches!(ev, Event::InitDone) {
                listed.store(true, Ordering::Release);
            }
            if !matches!(ev, Event::Init) {
                reporter.ok()
            }
        }
    });
    (view, stream)
}

/// Cluster API's claims, their addresses and its clusters (for pauses), all empty while
/// Cluster API is not installed, and whether the watches of claims and addresses have listed
/// once: until they have, a claim missing from the cache proves nothing, so what claims hold
/// is kept as it is.
pub struct CapiCaches {
    pub claims: Store<IPAddressClaim>,
    pub addresses: Store<IPAddress>,
    /// The `IPAddress`es of `addresses` that kipam did not write (made by hand, or another
    /// provider's): few, so a pass reads them without going through all of kipam's.
    pub foreign_addresses: Store<IPAddress>,
    pub clusters: Store<CapiCluster>,
    pub claims_listed: Arc<AtomicBool>,
    pub addresses_listed: Arc<AtomicBool>,
    /// Cluster API's `Cluster`s listed once: until then a claim's missing Cluster proves
    /// nothing, and the claim is left alone.
    pub clusters_listed: Arc<AtomicBool>,
}

impl Default for CapiCaches {
    /// Empty caches nothing fills (tests and benches that do not serve claims).
    fn default() -> Self {
        CapiCaches {
            claims: reflector::store().0,
            addresses: reflector::store().0,
            foreign_addresses: reflector::store().0,
            clusters: reflector::store().0,
            claims_listed: Default::default(),
            addresses_listed: Default::default(),
            clusters_listed: Default::default(),
        }
    }
}

impl CapiCaches {
    /// Both caches are complete (they listed once; later they stay current or re-list).
    pub fn listed(&self) -> bool {
        self.claims_listed.load(Ordering::Acquire) && self.addresses_listed.load(Ordering::Acquire)
    }

    /// Cluster API's `Cluster`s have been listed once.
    pub fn clusters_listed(&self) -> bool {
        self.clusters_listed.load(Ordering::Acquire)
    }
}

/// What the planner reads of a claim: its spec, its own annotations (datacenter, requested
/// address, pause) and what [`planned_content`] reads.
fn claim_content(c: &IPAddressClaim) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    planned_content(c, &c.spec, CLAIM_FINALIZER).hash(&mut h);
    c.metadata.annotations.hash(&mut h);
    h.finish()
}

/// The allocation watch, feeding `ctx`'s ledger: the echo of kipam's own write (content the
/// ledger already holds) does not wake the planner; the ledger's readers hear of every event,
/// as they would from a watch of their own (the applier learns of kipam's writes this way).
// RBAC: src/rbac.rs (list/watch of allocations).
pub fn allocations(ctx: Arc<Context>, wake: Arc<Notify>) -> BoxStream<'static, ()> {
    let reporter = WatchReporter::new("ipamallocations.ipam.kipam.dev", ctx.metrics.clone());
    watcher::watcher(
        Api::<IPAMAllocation>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .backoff(WatchBackoff::default())
    .modify(|o| o.metadata.managed_fields = None)
    .then(move |ev| {
        let ctx = ctx.clone();
        let wake = wake.clone();
        let reporter = reporter.clone();
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
    })
    .boxed()
}

/// Drives watch streams until they end (they do not: the watcher retries with backoff).
pub async fn drive(streams: Vec<BoxStream<'static, ()>>) {
    let mut all = futures::stream::select_all(streams);
    while all.next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::capi::{IPAddressSpec, MANAGED_BY};

    fn shard(name: &str, uid: &str) -> IPAMPoolRecord {
        let mut r = IPAMPoolRecord::new(name, Default::default());
        r.metadata.uid = Some(uid.into());
        r
    }

    /// The record watch notes every shard that goes: by its deletion event, and after a
    /// re-list by its absence from the new list (a shard deleted while the watch was down, or
    /// deleted and created again under a new uid). The first list notes nothing.
    #[test]
    fn the_record_watch_notes_deleted_shards_and_those_a_relist_no_longer_shows() {
        let (store, mut writer) = reflector::store::<IPAMPoolRecord>();
        let view = RecordView::new(store, false);
        let mut deletions = Deletions::default();
        let mut feed = |ev: Event<IPAMPoolRecord>| {
            // As the reflector does: the store first, then the stream's reader.
            writer.apply_watcher_event(&ev);
            let noted = deletions.observe(&view, &ev);
            if matches!(ev, Event::InitDone) {
                view.listed.store(true, Ordering::Release);
            }
            noted
        };
        let (a, b, c) = (shard("a", "1"), shard("b", "2"), shard("c", "3"));
        // The first list.
        assert!(!feed(Event::Init));
        for r in [&a, &b, &c] {
            assert!(!feed(Event::InitApply(r.clone())));
        }
        assert!(!feed(Event::InitDone));
        assert!(view.take_deleted().is_empty());
        // A deletion event.
        assert!(feed(Event::Delete(c.clone())));
        assert_eq!(
            view.take_deleted(),
            vec![("c".to_string(), "3".to_string())]
        );
        assert!(view.take_deleted().is_empty(), "taken once");
        // A re-list: `a` is gone, `b` came back under another uid.
        assert!(!feed(Event::Init));
        assert!(!feed(Event::InitApply(shard("b", "4"))));
        assert!(feed(Event::InitDone));
        let mut gone = view.take_deleted();
        gone.sort();
        assert_eq!(
            gone,
            vec![
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "2".to_string())
            ]
        );
        // A re-list that shows everything the view held notes nothing.
        assert!(!feed(Event::Init));
        assert!(!feed(Event::InitApply(shard("b", "4"))));
        assert!(!feed(Event::InitDone));
        assert!(view.take_deleted().is_empty());
    }

    fn address(name: &str, kipams: bool) -> IPAddress {
        let mut a = IPAddress::new(name, IPAddressSpec::default());
        a.metadata.namespace = Some("machines".into());
        if kipams {
            a.metadata.labels = Some([(MANAGED_BY.0.into(), MANAGED_BY.1.into())].into());
        }
        a
    }

    fn names(store: &Store<IPAddress>) -> Vec<String> {
        let mut out: Vec<String> = store
            .state()
            .iter()
            .filter_map(|a| a.metadata.name.clone())
            .collect();
        out.sort();
        out
    }

    /// What `waking` does with `events` of a watch reported by `reporter`: the dirty marks
    /// (clusters, anything else) and whether the planning loop was woken.
    async fn woken_by(
        events: Vec<Result<Event<IPAddressClaim>, watcher::Error>>,
        reporter: Arc<WatchReporter>,
    ) -> ((std::collections::BTreeSet<String>, bool), bool) {
        let wake = Arc::new(Notify::new());
        let dirty = Arc::new(Dirty::default());
        waking(
            futures::stream::iter(events),
            wake.clone(),
            reporter,
            Wakes::Content(claim_content),
            dirty.clone(),
            None,
            None,
        )
        .collect::<Vec<()>>()
        .await;
        let woken = tokio::time::timeout(Duration::from_millis(20), wake.notified())
            .await
            .is_ok();
        (dirty.take(), woken)
    }

    fn not_found() -> watcher::Error {
        watcher::Error::InitialListFailed(kube::Error::Api(
            kube::core::Status::failure(
                "the server could not find the requested resource",
                "NotFound",
            )
            .with_code(404)
            .boxed(),
        ))
    }

    #[tokio::test]
    async fn a_kind_not_installed_wakes_no_pass_on_its_retries() {
        let resource = "ipaddressclaims.ipam.cluster.x-k8s.io";
        // Cluster API not installed: every retry of the list fails with 404. Nothing the
        // planner reads changed, so no pass (it would plan the whole seed) is asked for.
        let optional = WatchReporter::optional(resource, Metrics::new());
        let retries = vec![
            Ok(Event::Init),
            Err(not_found()),
            Ok(Event::Init),
            Err(not_found()),
        ];
        assert_eq!(
            woken_by(retries, optional).await,
            ((Default::default(), false), false)
        );
        // A watch kipam needs still wakes the planner when it fails, as before.
        let needed = WatchReporter::new(resource, Metrics::new());
        assert_eq!(
            woken_by(vec![Err(not_found())], needed).await,
            ((Default::default(), true), true)
        );
        // And an optional kind that lists (it was installed) asks for a look at everything.
        let optional = WatchReporter::optional(resource, Metrics::new());
        assert_eq!(
            woken_by(vec![Ok(Event::Init), Ok(Event::InitDone)], optional).await,
            ((Default::default(), true), true)
        );
    }

    #[test]
    fn the_aside_cache_holds_exactly_the_ip_addresses_kipam_did_not_write() {
        let (reader, mut writer) = reflector::store::<IPAddress>();
        let pick: fn(&IPAddress) -> bool = |a| !a.written_by_kipam();
        let mut feed = |ev: Event<IPAddress>| feed_aside(&mut writer, &reader, &ev, pick);
        // The first list: only the hand-made one is kept.
        feed(Event::Init);
        feed(Event::InitApply(address("hand", false)));
        feed(Event::InitApply(address("ours", true)));
        feed(Event::InitDone);
        assert_eq!(names(&reader), ["hand"]);
        // Another hand-made one arrives; one of kipam's too.
        feed(Event::Apply(address("hand-2", false)));
        feed(Event::Apply(address("ours-2", true)));
        assert_eq!(names(&reader), ["hand", "hand-2"]);
        // kipam adopts `hand` (its label now says kipam's): it leaves; `hand-2` is deleted.
        feed(Event::Apply(address("hand", true)));
        feed(Event::Delete(address("hand-2", false)));
        assert!(names(&reader).is_empty());
        // A label taken off one of kipam's by hand: it is not kipam's any more.
        feed(Event::Apply(address("ours", false)));
        assert_eq!(names(&reader), ["ours"]);
        // A re-list replaces everything with what is picked now.
        feed(Event::Init);
        feed(Event::InitApply(address("ours", true)));
        feed(Event::InitApply(address("hand-3", false)));
        feed(Event::InitDone);
        assert_eq!(names(&reader), ["hand-3"]);
    }
}
