//! The demand reader: LoadBalancer Services and MetalLB's refusals, read from the user
//! clusters whose allocations may grow, into the seed's demand cache
//! ([`DemandCache`](crate::seed::demand::DemandCache)) that the planning pass decides from.
//!
//! - It runs on the leader only, like the planning loop that uses what it reads.
//! - It reads only user clusters that hold an allocation of a pool datacenter with `growth`
//!   and name a kubeconfig: per user cluster one watch of Services and, while one of them
//!   waits for an address, one of Events with reason `AllocationFailed`, through the same
//!   kubeconfig Secret and the same client (one connection, `seed::tenants`) the applier
//!   uses ([`crate::seed::kubeconfig`]). Per Service it keeps whether it waits and the
//!   addresses it holds.
//! - A watch sees a refused Service at once; nothing is polled. The Event watch's first list
//!   brings the refusals made before it opened.
//! - A user cluster that cannot be read (no Secret, a bad kubeconfig, no answer, RBAC) is
//!   marked unknown in the cache (its grown pieces' unused clocks stop), logged once per
//!   distinct reason, and retried with a backoff that doubles up to a minute. Each user cluster
//!   has its own task: none waits for another.

pub mod services;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::{Event, Service};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use crate::resources::{AllocationType, Cluster};
use crate::seed::Context;
use crate::seed::demand::ServiceDemand;
use crate::seed::kubeconfig;
use crate::seed::tenant_watch::{self, Params};

/// How often the set of user clusters to read is worked out again (also on every ledger
/// change).
const RECHECK: Duration = Duration::from_secs(5);
/// The set of user clusters to read is worked out at most this often.
const COALESCE: Duration = Duration::from_millis(500);
/// Longest wait before reading an unreachable user cluster again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Connect, write (and list) timeout towards a user cluster.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long the Event watch stays open after the last waiting Service of its user cluster
/// stopped waiting (so a few Services made one after the other do not open it each time).
const EVENTS_LINGER: Duration = Duration::from_secs(60);

fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// (cluster, Secret namespace, name, key): a task reads one user cluster through one Secret.
type Target = (String, String, String, String);

/// The demand reader's figures.
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
                "demand_user_clusters",
                "User clusters whose LoadBalancer Services the demand reader watches",
                m.clusters.clone(),
            );
            r.register(
                "demand_unreachable_user_clusters",
                "Watched user clusters whose Services cannot be read at the moment",
                m.unreachable.clone(),
            );
        });
        m
    }
}

/// Runs the demand reader until the task is dropped.
pub async fn run(ctx: Arc<Context>) {
    let metrics = Metrics::register(&ctx);
    let mut tasks: HashMap<String, (Target, JoinHandle<()>)> = HashMap::new();
    let mut updates = ctx.ledger_updates.subscribe();
    loop {
        let wanted: BTreeMap<String, Target> = if ctx.leader.holds() {
            targets(&ctx).await
        } else {
            BTreeMap::new()
        };
        tasks.retain(|cluster, (target, handle)| {
            let keep = wanted.get(cluster) == Some(target) && !handle.is_finished();
            if !keep {
                handle.abort();
                ctx.demand.forget(cluster);
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
        metrics.unreachable.set(ctx.demand.problems().len() as i64);
        let worked_out = tokio::time::Instant::now();
        tokio::select! {
            _ = tokio::time::sleep(RECHECK) => {}
            r = updates.changed() => {
                if r.is_err() {
                    tokio::time::sleep(RECHECK).await;
                }
            }
        }
        // Worked out at most once per `COALESCE`: a burst of allocation writes changes the
        // ledger on every event, and working the set out on each read the growing pools'
        // entries once per event (100,000 events, each over 10,000 entries, at scale).
        tokio::time::sleep_until(worked_out + COALESCE).await;
    }
}

/// The user clusters to read: those naming a kubeconfig that hold an allocation of a range
/// pool datacenter with `growth`.
async fn targets(ctx: &Context) -> BTreeMap<String, Target> {
    let mut growing: std::collections::HashSet<(String, String)> = Default::default();
    for pool in ctx.pools.state() {
        for (dc, settings) in &pool.spec.datacenters {
            if settings.type_ == AllocationType::Range
                && matches!(
                    crate::validation::datacenter_growth(dc, settings),
                    Ok(Some(_))
                )
            {
                growing.insert((pool.name_any(), dc.clone()));
            }
        }
    }
    if growing.is_empty() {
        return BTreeMap::new();
    }
    // Only the growing pools' entries are read, not every allocation of the seed.
    let holders: std::collections::HashSet<String> = {
        let mut pools: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
        for (pool, dc) in &growing {
            pools.entry(pool.as_str()).or_default().insert(dc.as_str());
        }
        let ledger = ctx.ledger.lock().await;
        pools
            .iter()
            .flat_map(|(pool, dcs)| {
                ledger
                    .of_pool(pool)
                    .filter(|e| dcs.contains(e.spec().dc.as_str()))
            })
            .filter_map(|e| e.cluster().map(str::to_string))
            .collect()
    };
    ctx.clusters
        .state()
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none() && !c.spec.pause)
        .filter(|c| holders.contains(&c.name_any()))
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
    loop {
        let started = std::time::Instant::now();
        // Boxed: building a client (reading the Secret, the first request) is a large future,
        // and inline it would size the task of every user cluster for as long as it watches.
        let why = match Box::pin(client_for(&ctx, &target)).await {
            Ok(client) => watch(&ctx, &cluster, client).await,
            Err(why) => why,
        };
        ctx.demand.unreachable(&cluster, why.clone());
        if last_problem.as_deref() != Some(why.as_str()) {
            tracing::warn!(cluster = %cluster, "demand of the user cluster cannot be read: {why}");
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

/// What a watch of `K` yields.
type Watch<K> = BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>;

/// The next event of the Event watch, or never while there is none.
async fn next_refusal(
    events: &mut Option<Watch<Event>>,
) -> Option<Result<watcher::Event<Event>, watcher::Error>> {
    match events.as_mut() {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// What woke the reader.
enum Woke {
    Service(Option<Result<watcher::Event<Service>, watcher::Error>>),
    Refusal(Option<Result<watcher::Event<Event>, watcher::Error>>),
    Linger,
}

/// Watches Services, and `AllocationFailed` events while a Service waits, until a watch
/// fails; returns why.
///
/// A refusal only matters for a Service that waits, so the Event watch runs only while one
/// does (and [`EVENTS_LINGER`] after the last one stopped waiting): a user cluster whose
/// Services are all served costs one watch, not two. The Event watch's first list brings
/// the refusals MetalLB made before it started; a refusal naming another uid than the waiting
/// Service's is of an earlier Service of that name, and is not this one's.
async fn watch(ctx: &Context, cluster: &str, client: Client) -> String {
    let events_api = Api::<Event>::all(client.clone());
    // Boxed: the task of every user cluster stays small while it waits.
    let mut services: Watch<Service> =
        tenant_watch::watch(Api::<Service>::all(client), Params::default());
    let mut events: Option<Watch<Event>> = None;
    // During a (re)list: the Services listed so far, and those that wait, by uid.
    let mut initial: Option<(BTreeMap<String, ServiceDemand>, HashMap<String, String>)> = None;
    // `namespace/name` -> uid of every Service that waits.
    let mut waiting: HashMap<String, String> = HashMap::new();
    // Refusals naming a uid, seen before their Service waited: `namespace/name` -> uid. Each
    // is settled by the next event of its Service (bounded like the cache's early refusals).
    let mut early: HashMap<String, String> = HashMap::new();
    let mut idle_since: Option<tokio::time::Instant> = None;
    loop {
        if !waiting.is_empty() {
            idle_since = None;
            if events.is_none() {
                let params = Params {
                    fields: Some("reason=AllocationFailed".to_string()),
                    ..Params::default()
                };
                events = Some(tenant_watch::watch(events_api.clone(), params));
            }
        } else if events.is_some() && idle_since.is_none() {
            idle_since = Some(tokio::time::Instant::now());
        }
        let linger_end = idle_since.map(|at| at + EVENTS_LINGER);
        let woke = tokio::select! {
            e = services.next() => Woke::Service(e),
            e = next_refusal(&mut events) => Woke::Refusal(e),
            _ = tokio::time::sleep_until(linger_end.unwrap_or_else(tokio::time::Instant::now)),
                if linger_end.is_some() => Woke::Linger,
        };
        match woke {
            Woke::Linger => {
                events = None;
                idle_since = None;
            }
            Woke::Service(None) => return "the Service watch ended".to_string(),
            Woke::Service(Some(Err(e))) => {
                return crate::seed::watches::failure(&e, "services");
            }
            Woke::Service(Some(Ok(event))) => match event {
                watcher::Event::Init => initial = Some(Default::default()),
                watcher::Event::InitApply(s) => {
                    if let (Some((map, waits)), Some(d)) =
                        (initial.as_mut(), services::service_demand(&s))
                    {
                        if d.waiting {
                            waits.insert(service_key(&s), s.uid().unwrap_or_default());
                        }
                        map.insert(service_key(&s), d);
                    }
                }
                watcher::Event::InitDone => {
                    let (map, waits) = initial.take().unwrap_or_default();
                    waiting = waits;
                    ctx.demand.replace(cluster, map, now());
                    for (key, uid) in std::mem::take(&mut early) {
                        if waiting.get(&key) == Some(&uid) {
                            ctx.demand.refused(cluster, &key);
                        }
                    }
                }
                watcher::Event::Apply(s) => {
                    let key = service_key(&s);
                    let demand = services::service_demand(&s);
                    let uid = s.uid().unwrap_or_default();
                    let refused = early.remove(&key).is_some_and(|r| r == uid);
                    let waits = demand.as_ref().is_some_and(|d| d.waiting);
                    if waits {
                        waiting.insert(key.clone(), uid);
                    } else {
                        waiting.remove(&key);
                    }
                    ctx.demand.service(cluster, &key, demand, now());
                    if waits && refused {
                        ctx.demand.refused(cluster, &key);
                    }
                }
                watcher::Event::Delete(s) => {
                    let key = service_key(&s);
                    waiting.remove(&key);
                    early.remove(&key);
                    ctx.demand.service(cluster, &key, None, now());
                }
            },
            Woke::Refusal(None) => return "the Event watch ended".to_string(),
            Woke::Refusal(Some(Err(e))) => return crate::seed::watches::failure(&e, "events"),
            Woke::Refusal(Some(Ok(watcher::Event::Apply(e) | watcher::Event::InitApply(e)))) => {
                let o = &e.involved_object;
                if o.kind.as_deref() == Some("Service")
                    && let (Some(ns), Some(name)) = (&o.namespace, &o.name)
                {
                    let key = format!("{ns}/{name}");
                    match (
                        waiting.get(&key),
                        o.uid.as_deref().filter(|u| !u.is_empty()),
                    ) {
                        // Another uid: a refusal of an earlier Service of that name.
                        (Some(waits), Some(uid)) if waits != uid => {}
                        (Some(_), _) | (None, None) => ctx.demand.refused(cluster, &key),
                        // Not waiting (yet): settled by its Service's next event.
                        (None, Some(uid)) => {
                            if early.len() < 10_000 {
                                early.insert(key, uid.to_string());
                            }
                        }
                    }
                }
            }
            Woke::Refusal(Some(Ok(_))) => {}
        }
    }
}

fn service_key(s: &Service) -> String {
    format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any())
}
