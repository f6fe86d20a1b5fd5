//! The demand reader: LoadBalancer Services and MetalLB's refusals, read from the user
//! clusters whose allocations may grow, into the seed's demand cache
//! ([`DemandCache`](crate::seed::demand::DemandCache)) that the planning pass decides from.
//!
//! - It runs on the leader only, like the planning loop that uses what it reads.
//! - It reads only user clusters that hold an allocation of a pool datacenter with `growth`
//!   and name a kubeconfig: per user cluster one watch of Services and one of Events with
//!   reason `AllocationFailed`, through the same kubeconfig Secret the applier uses
//!   ([`crate::seed::kubeconfig`]). Two connections per user cluster; per Service it keeps
//!   whether it waits and the addresses it holds.
//! - A watch sees a refused Service at once; nothing is polled.
//! - A user cluster that cannot be read (no Secret, a bad kubeconfig, no answer, RBAC) is
//!   marked unknown in the cache (its grown pieces' unused clocks stop), logged once per
//!   distinct reason, and retried with a backoff that doubles up to a minute. Each user cluster
//!   has its own task: none waits for another.

pub mod services;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event, Service};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use crate::resources::{AllocationType, Cluster};
use crate::seed::Context;
use crate::seed::demand::ServiceDemand;
use crate::seed::kubeconfig;

/// How often the set of user clusters to read is worked out again (also on every ledger
/// change).
const RECHECK: Duration = Duration::from_secs(5);
/// The set of user clusters to read is worked out at most this often.
const COALESCE: Duration = Duration::from_millis(500);
/// Longest wait before reading an unreachable user cluster again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Connect, write (and list) timeout towards a user cluster.
const TIMEOUT: Duration = Duration::from_secs(10);

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
        let why = match client_for(&ctx, &target).await {
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

/// Watches Services and `AllocationFailed` events until either watch fails; returns why.
async fn watch(ctx: &Context, cluster: &str, client: Client) -> String {
    let services = Api::<Service>::all(client.clone());
    let events = Api::<Event>::all(client);
    let svc_stream = watcher::watcher(services, watcher::Config::default());
    let event_stream = watcher::watcher(
        events,
        watcher::Config::default().fields("reason=AllocationFailed"),
    );
    let mut initial: Option<BTreeMap<String, ServiceDemand>> = None;
    let svc = async {
        let mut stream = std::pin::pin!(svc_stream);
        loop {
            let event = match stream.try_next().await {
                Ok(Some(e)) => e,
                Ok(None) => return "the Service watch ended".to_string(),
                Err(e) => return crate::seed::watches::failure(&e, "services"),
            };
            match event {
                watcher::Event::Init => initial = Some(BTreeMap::new()),
                watcher::Event::InitApply(s) => {
                    if let (Some(map), Some(d)) = (initial.as_mut(), services::service_demand(&s)) {
                        map.insert(service_key(&s), d);
                    }
                }
                watcher::Event::InitDone => {
                    let map = initial.take().unwrap_or_default();
                    ctx.demand.replace(cluster, map, now());
                }
                watcher::Event::Apply(s) => {
                    ctx.demand.service(
                        cluster,
                        &service_key(&s),
                        services::service_demand(&s),
                        now(),
                    );
                }
                watcher::Event::Delete(s) => {
                    ctx.demand.service(cluster, &service_key(&s), None, now());
                }
            }
        }
    };
    let ev = async {
        let mut stream = std::pin::pin!(event_stream.boxed());
        loop {
            match stream.next().await {
                Some(Ok(watcher::Event::Apply(e) | watcher::Event::InitApply(e))) => {
                    let o = &e.involved_object;
                    if o.kind.as_deref() == Some("Service")
                        && let (Some(ns), Some(name)) = (&o.namespace, &o.name)
                    {
                        ctx.demand.refused(cluster, &format!("{ns}/{name}"));
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return crate::seed::watches::failure(&e, "events"),
                None => return "the Event watch ended".to_string(),
            }
        }
    };
    tokio::select! {
        why = svc => why,
        why = ev => why,
    }
}

fn service_key(s: &Service) -> String {
    format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any())
}
