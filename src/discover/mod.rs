//! The discovery reader: what a user cluster that adopts (`spec.adopt: DryRun` or `Adopt`)
//! serves today — the MetalLB `IPAddressPool`s typed in by hand and the addresses its
//! `LoadBalancer` Services hold — read into the seed's discovery cache
//! ([`DiscoveryCache`](crate::seed::discovered::DiscoveryCache)) that the planning pass plans
//! the adoption from.
//!
//! - It runs on the leader only, like the planning loop that uses what it reads.
//! - It reads only user clusters whose adoption mode reads
//!   ([`crate::planner::adopt::reads`]), that name a kubeconfig and are neither paused nor
//!   being deleted: per user cluster one watch of `IPAddressPool`s (`metallb.io/v1beta1`) and
//!   one of Services, all namespaces, over the one client shared per user cluster
//!   ([`crate::seed::tenants`]). Nothing is polled: a change shows in the cache as the watch
//!   sees it.
//! - A pool with kipam's addon label is kipam's own and left out. MetalLB not installed (the
//!   API server answers 404 for its pools) means no hand-made pools: said once at info level,
//!   the Services still read, and the pools looked for again with a backoff up to a minute.
//! - A user cluster that cannot be read (no Secret, a bad kubeconfig, no answer, RBAC) is
//!   marked unreadable in the cache, logged once per distinct reason, and retried with a
//!   backoff that doubles up to a minute. Each user cluster has its own task; a cluster no
//!   longer read loses its task and its cache entry.

pub mod found;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use crate::planner::adopt::{self, Discovered, HandMadePool, ServedService};
use crate::resources::Cluster;
use crate::seed::Context;
use crate::seed::kubeconfig;
use crate::seed::tenant_watch::{self, Params};

/// How often the set of user clusters to read is worked out again (also when leadership
/// changes).
const RECHECK: Duration = Duration::from_secs(5);
/// Longest wait before reading an unreachable user cluster, or looking for MetalLB's pools in
/// one without them, again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Connect and request timeout towards a user cluster.
const TIMEOUT: Duration = Duration::from_secs(10);

fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// (cluster, Secret namespace, name, key): a task reads one user cluster through one Secret.
type Target = (String, String, String, String);

/// MetalLB's address pools, as the reader asks for them.
pub fn ip_address_pools() -> ApiResource {
    ApiResource {
        group: "metallb.io".into(),
        version: "v1beta1".into(),
        api_version: "metallb.io/v1beta1".into(),
        kind: "IPAddressPool".into(),
        plural: "ipaddresspools".into(),
    }
}

/// The discovery reader's figures.
struct Metrics {
    clusters: prometheus_client::metrics::gauge::Gauge,
    unreachable: prometheus_client::metrics::gauge::Gauge,
}

impl Metrics {
    fn register(ctx: &Context) -> Metrics {
        let m = Metrics {
            clusters: Default::default(),
            unreachable: Default::default(),
        };
        ctx.metrics.register(|r| {
            r.register(
                "discovery_user_clusters",
                "User clusters that adopt whose MetalLB pools and LoadBalancer Services the discovery reader watches",
                m.clusters.clone(),
            );
            r.register(
                "discovery_unreachable_user_clusters",
                "User clusters that adopt which cannot be read at the moment",
                m.unreachable.clone(),
            );
        });
        m
    }
}

/// Runs the discovery reader until the task is dropped.
pub async fn run(ctx: Arc<Context>) {
    let metrics = Metrics::register(&ctx);
    let mut tasks: HashMap<String, (Target, JoinHandle<()>)> = HashMap::new();
    let mut leading = ctx.leader.subscribe();
    loop {
        let wanted: BTreeMap<String, Target> = if ctx.leader.holds() {
            targets(&ctx)
        } else {
            BTreeMap::new()
        };
        tasks.retain(|cluster, (target, handle)| {
            let keep = wanted.get(cluster) == Some(target) && !handle.is_finished();
            if !keep {
                handle.abort();
                ctx.discovered.forget(cluster);
            }
            keep
        });
        for (cluster, target) in wanted {
            if tasks.contains_key(&cluster) {
                continue;
            }
            let handle = tokio::spawn(read_cluster(ctx.clone(), target.clone()));
            tasks.insert(cluster, (target, handle));
        }
        metrics.clusters.set(tasks.len() as i64);
        metrics
            .unreachable
            .set(ctx.discovered.problems().len() as i64);
        tokio::select! {
            _ = tokio::time::sleep(RECHECK) => {}
            r = leading.changed() => {
                if r.is_err() {
                    tokio::time::sleep(RECHECK).await;
                }
            }
        }
    }
}

/// The user clusters to read: those whose adoption mode reads and that name a kubeconfig.
fn targets(ctx: &Context) -> BTreeMap<String, Target> {
    let pools = ctx.pools.state();
    ctx.clusters
        .state()
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none() && !c.spec.pause)
        .filter(|c| adopt::reads(adopt::effective_mode(c, pools.iter().map(|p| &**p))))
        .filter_map(|c: &Arc<Cluster>| {
            let (ns, name, key) = kubeconfig::secret_location(c)?;
            Some((c.name_any(), (c.name_any(), ns, name, key)))
        })
        .collect()
}

/// Reads one user cluster for as long as it is wanted, retrying with backoff.
async fn read_cluster(ctx: Arc<Context>, target: Target) {
    let cluster = target.0.clone();
    let mut backoff = Duration::from_secs(1);
    let mut last_problem: Option<String> = None;
    // Whether MetalLB's absence was said (once, not on every reconnection).
    let missing_said = AtomicBool::new(false);
    loop {
        let started = std::time::Instant::now();
        // Boxed: building a client is a large future (see the demand reader).
        let why = match Box::pin(client_for(&ctx, &target)).await {
            Ok(client) => watch(&ctx, &cluster, client, &missing_said).await,
            Err(why) => why,
        };
        ctx.discovered.unreadable(&cluster, why.clone(), now());
        if last_problem.as_deref() != Some(why.as_str()) {
            tracing::warn!(cluster = %cluster, "the user cluster cannot be read for adoption: {why}");
            last_problem = Some(why);
        }
        if started.elapsed() > MAX_BACKOFF {
            backoff = Duration::from_secs(1);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A watch client for the user cluster, shared with the applier (see
/// [`Context::tenant_client`]).
async fn client_for(ctx: &Context, target: &Target) -> Result<Client, String> {
    let (cluster, namespace, name, key) = target;
    ctx.tenant_client(cluster, namespace, name, key, TIMEOUT)
        .await
}

/// What the two watches of one user cluster have seen so far.
#[derive(Default)]
struct Seen {
    /// By (name, namespace): sorted by name.
    pools: BTreeMap<(String, String), HandMadePool>,
    pools_listed: bool,
    /// By `namespace/name`.
    services: BTreeMap<String, ServedService>,
    services_listed: bool,
}

impl Seen {
    fn publish(&self, ctx: &Context, cluster: &str) {
        let found = Discovered {
            pools: self.pools.values().cloned().collect(),
            services: self.services.values().cloned().collect(),
        };
        let complete = self.pools_listed && self.services_listed;
        ctx.discovered.read(cluster, found, complete, now());
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|p| p.into_inner())
}

/// The watch expired (410): the watcher lists again on its own; nothing is wrong.
fn expired(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(s) if s.code == 410)
}

/// The API server does not serve MetalLB's pools (404: the CRD is not installed).
fn not_installed(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => matches!(e, kube::Error::Api(s) if s.code == 404),
        watcher::Error::WatchError(s) => s.code == 404,
        _ => false,
    }
}

/// Watches pools and Services until the Service watch, or the pool watch for a reason other
/// than MetalLB missing, fails; returns why.
async fn watch(ctx: &Context, cluster: &str, client: Client, missing_said: &AtomicBool) -> String {
    let seen = Mutex::new(Seen::default());
    let pools = async {
        let api = Api::<DynamicObject>::all_with(client.clone(), &ip_address_pools());
        let mut backoff = Duration::from_secs(1);
        loop {
            let mut stream = tenant_watch::watch(api.clone(), Params::default());
            let mut initial: Option<BTreeMap<(String, String), HandMadePool>> = None;
            let error = loop {
                let event = match stream.try_next().await {
                    Ok(Some(e)) => e,
                    Ok(None) => return "the IPAddressPool watch ended".to_string(),
                    Err(e) if expired(&e) => continue,
                    Err(e) => break e,
                };
                match event {
                    watcher::Event::Init => initial = Some(BTreeMap::new()),
                    watcher::Event::InitApply(p) => {
                        if let (Some(map), Some(pool)) = (initial.as_mut(), found::hand_made(&p)) {
                            map.insert(pool_key(&p), pool);
                        }
                    }
                    watcher::Event::InitDone => {
                        let mut s = lock(&seen);
                        s.pools = initial.take().unwrap_or_default();
                        s.pools_listed = true;
                        s.publish(ctx, cluster);
                        backoff = Duration::from_secs(1);
                        if missing_said.swap(false, Ordering::Relaxed) {
                            tracing::info!(cluster = %cluster, "MetalLB's IPAddressPools are served in the user cluster now");
                        }
                    }
                    watcher::Event::Apply(p) => {
                        let mut s = lock(&seen);
                        match found::hand_made(&p) {
                            Some(pool) => s.pools.insert(pool_key(&p), pool),
                            None => s.pools.remove(&pool_key(&p)),
                        };
                        s.publish(ctx, cluster);
                    }
                    watcher::Event::Delete(p) => {
                        let mut s = lock(&seen);
                        s.pools.remove(&pool_key(&p));
                        s.publish(ctx, cluster);
                    }
                }
            };
            if !not_installed(&error) {
                return crate::seed::watches::failure(&error, "ipaddresspools.metallb.io");
            }
            if !missing_said.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    cluster = %cluster,
                    "MetalLB is not installed in the user cluster (its IPAddressPools are not served): no hand-made pools; looked for again with backoff"
                );
            }
            {
                let mut s = lock(&seen);
                s.pools.clear();
                s.pools_listed = true;
                s.publish(ctx, cluster);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    };
    let services = async {
        let api = Api::<Service>::all(client.clone());
        let mut stream = tenant_watch::watch(api, Params::default());
        let mut initial: Option<BTreeMap<String, ServedService>> = None;
        loop {
            let event = match stream.try_next().await {
                Ok(Some(e)) => e,
                Ok(None) => return "the Service watch ended".to_string(),
                Err(e) if expired(&e) => continue,
                Err(e) => return crate::seed::watches::failure(&e, "services"),
            };
            match event {
                watcher::Event::Init => initial = Some(BTreeMap::new()),
                watcher::Event::InitApply(svc) => {
                    if let (Some(map), Some(s)) = (initial.as_mut(), found::served(&svc)) {
                        map.insert(s.name.clone(), s);
                    }
                }
                watcher::Event::InitDone => {
                    let mut s = lock(&seen);
                    s.services = initial.take().unwrap_or_default();
                    s.services_listed = true;
                    s.publish(ctx, cluster);
                }
                watcher::Event::Apply(svc) => {
                    let mut s = lock(&seen);
                    let name = found::service_name(&svc);
                    let before = s.services.get(&name).cloned();
                    let now_served = found::served(&svc);
                    if before == now_served {
                        continue;
                    }
                    match now_served {
                        Some(served) => s.services.insert(name, served),
                        None => s.services.remove(&name),
                    };
                    s.publish(ctx, cluster);
                }
                watcher::Event::Delete(svc) => {
                    let mut s = lock(&seen);
                    if s.services.remove(&found::service_name(&svc)).is_some() {
                        s.publish(ctx, cluster);
                    }
                }
            }
        }
    };
    tokio::select! {
        why = pools => why,
        why = services => why,
    }
}

fn pool_key(p: &DynamicObject) -> (String, String) {
    (p.name_any(), p.namespace().unwrap_or_default())
}
