//! `kipam controller`: the seed controller.
//!
//! Watches feed in-memory caches (pools, clusters, the namespaces kipam made) and the
//! allocation [`ledger::Ledger`]; any change wakes the planning loop, which — on the leader
//! only — runs a [`pass`] over the whole seed. See `docs/design.md` for why no address can be
//! handed out twice.

pub mod leader;
pub mod ledger;
pub mod metrics;
pub mod pass;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ListParams;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config};
use tokio::sync::{Mutex, Notify};

use crate::resources::{Cluster, IPAMAllocation, IPAMPool, LABEL_CLUSTER};
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
    /// This replica's name in the Lease.
    pub identity: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("cannot load the kubeconfig: {0}")]
    Config(String),
    #[error("cannot reach the API server: {0}")]
    Client(#[from] kube::Error),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// What the planning pass and the watch tasks share.
pub struct Context {
    pub client: Client,
    pub pools: Store<IPAMPool>,
    pub clusters: Store<Cluster>,
    pub namespaces: Store<Namespace>,
    pub ledger: Mutex<Ledger>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub leader: Arc<LeaderState>,
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client, ControllerError> {
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
    Client::try_from(config).map_err(ControllerError::Client)
}

/// Feeds one watch into a cache, waking the planner on every change.
fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
    wake: Arc<Notify>,
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
    let stream = reflector::reflector(writer, watcher::watcher(api, config)).map(move |ev| {
        if let Err(e) = &ev {
            tracing::debug!(error = %e, "watch error (retried)");
        }
        wake.notify_one();
    });
    (store, stream)
}

/// Runs the controller until SIGTERM / SIGINT.
pub async fn run(options: ControllerOptions) -> Result<(), ControllerError> {
    let client = client(options.kubeconfig.as_ref()).await?;
    let metrics = Metrics::new();
    let listener_metrics = metrics.clone();
    let metrics_addr = options.metrics_addr;
    let metrics_task =
        tokio::spawn(async move { metrics::serve(metrics_addr, listener_metrics).await });

    let wake = Arc::new(Notify::new());
    let backoff = || watcher::Config::default();
    let (pools, pool_events) = cached(
        Api::<IPAMPool>::all(client.clone()),
        backoff(),
        wake.clone(),
    );
    let (clusters, cluster_events) =
        cached(Api::<Cluster>::all(client.clone()), backoff(), wake.clone());
    let (namespaces, namespace_events) = cached(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default().labels(LABEL_CLUSTER),
        wake.clone(),
    );
    let leader = LeaderState::new(options.lease.renew_deadline);
    let ctx = Arc::new(Context {
        client: client.clone(),
        pools,
        clusters,
        namespaces,
        ledger: Mutex::new(Ledger::default()),
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

    // The allocation watch feeds the ledger directly (see ledger.rs for the guards).
    let allocation_ctx = ctx.clone();
    let allocation_wake = wake.clone();
    let allocation_events = watcher::watcher(
        Api::<IPAMAllocation>::all(client.clone()),
        watcher::Config::default(),
    )
    .then(move |ev| {
        let ctx = allocation_ctx.clone();
        let wake = allocation_wake.clone();
        async move {
            let mut ledger = ctx.ledger.lock().await;
            match ev {
                Ok(Event::Apply(obj)) | Ok(Event::InitApply(obj)) => ledger.apply(obj),
                Ok(Event::Delete(obj)) => ledger.remove(&obj),
                Ok(Event::Init) => ledger.relist_started(),
                Ok(Event::InitDone) => ledger.relist_done(),
                Err(e) => tracing::debug!(error = %e, "allocation watch error (retried)"),
            }
            drop(ledger);
            wake.notify_one();
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

    let elector = Elector::new(
        Api::<Lease>::namespaced(client.clone(), &options.namespace),
        &format!("kipam-{}", options.seed_name),
        &options.identity,
        options.lease,
        leader.clone(),
    );
    let release_api = Api::<Lease>::namespaced(client.clone(), &options.namespace);
    let lease_name = format!("kipam-{}", options.seed_name);
    let identity = options.identity.clone();
    let election = tokio::spawn(elector.run());

    let planning = tokio::spawn(planning_loop(ctx.clone(), wake.clone(), options.resync));

    tokio::select! {
        r = metrics_task => {
            return Err(ControllerError::Metrics {
                addr: metrics_addr,
                source: r.unwrap_or_else(|e| Err(std::io::Error::other(e))).err()
                    .unwrap_or_else(|| std::io::Error::other("metrics server stopped")),
            });
        }
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
        }
    }
    planning.abort();
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

/// Waits for changes (or the resync period) and runs a pass while leader.
async fn planning_loop(ctx: Arc<Context>, wake: Arc<Notify>, resync: Duration) {
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
    let mut ledger_ready = false;
    loop {
        let holds = ctx.leader.holds();
        ctx.metrics.leader.set(holds as i64);
        if !holds {
            ledger_ready = false;
            tokio::select! {
                _ = leadership.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            continue;
        }
        if !ledger_ready {
            // Rebuild from an authoritative list: what a previous leader wrote is all there.
            let api: Api<IPAMAllocation> = Api::all(ctx.client.clone());
            match api.list(&ListParams::default()).await {
                Ok(list) => {
                    ctx.ledger.lock().await.reset(list.items);
                    ledger_ready = true;
                    tracing::info!("leading: allocation state rebuilt from a fresh list");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list allocations");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        let started = Instant::now();
        ctx.metrics.passes.inc();
        let again = match pass::run(&ctx).await {
            Ok(outcome) => {
                tracing::debug!(writes = outcome.writes, again = outcome.again, "pass done");
                outcome.again
            }
            Err(e) => {
                ctx.metrics.pass_failures.inc();
                tracing::warn!(error = %e, "pass failed");
                true
            }
        };
        ctx.metrics
            .last_pass_millis
            .set(started.elapsed().as_millis() as i64);
        let wait = if again {
            Duration::from_millis(200)
        } else {
            resync
        };
        tokio::select! {
            _ = wake.notified() => {
                // Let a burst of changes settle into one pass.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ = tokio::time::sleep(wait) => {}
            _ = leadership.changed() => {}
        }
    }
}
