//! `kipam controller`: the composition root of the running seed.
//!
//! It builds the shared core ([`crate::seed`]: clients, watch caches, ledger, records, leader
//! state, metrics), starts the watches and the Lease election, starts each adapter — the
//! planning loop ([`crate::planning`]), the addon applier ([`crate::applier`]), the demand and
//! discovery readers ([`crate::demand`], [`crate::discover`]), the REST API ([`crate::api`])
//! and the admission webhook ([`crate::webhook`]) — and on SIGTERM stops them
//! in order: no write starts, the pass in flight drains, then the Lease is handed over. It is
//! the only module that knows every adapter; none of them knows another (`ARCHITECTURE.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::Notify;

use crate::seed::leader::{Elector, LeaderState, LeaseTiming};
use crate::seed::metrics::{self, Metrics};
use crate::seed::{self, Context, Dirty, REQUEST_TIMEOUT, watches};

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
    /// The addon applier (user clusters); `None` runs the seed without it: allocations,
    /// the API and the webhook work, Addons are left untouched.
    pub addons: Option<crate::applier::ApplierOptions>,
}

#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Client(#[from] seed::ClientError),
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

/// Runs the controller until SIGTERM / SIGINT.
pub async fn run(options: ControllerOptions) -> Result<(), ControllerError> {
    raise_open_file_limit();
    let (client, writer) = seed::clients(options.kubeconfig.as_ref()).await?;
    let metrics = Metrics::new();
    let listener_metrics = metrics.clone();
    let metrics_addr = options.metrics_addr;
    let metrics_task =
        tokio::spawn(async move { metrics::serve(metrics_addr, listener_metrics).await });

    // The core: watch caches, ledger, records, leader state.
    let wake = Arc::new(Notify::new());
    let dirty = Arc::new(Dirty::default());
    dirty.set_wake(wake.clone());
    let caches = watches::caches(&client, &metrics, &wake, &dirty);
    let leader = LeaderState::new(options.lease.renew_deadline);
    let ctx = Context::builder(client.clone())
        .writer(writer.clone())
        .caches(
            caches.pools,
            caches.clusters,
            caches.namespaces,
            caches.capi,
        )
        .record_view(caches.records)
        .cache_changes(caches.changes)
        .dirty(dirty.clone())
        .metrics(metrics.clone())
        .leader(leader.clone())
        .instance(options.identity.clone())
        .build();

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
            files.load().map_err(|e| ControllerError::Api {
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

    let watches = tokio::spawn(watches::drive(vec![
        caches.events,
        watches::allocations(ctx.clone(), wake.clone()),
    ]));

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

    let planning = tokio::spawn(crate::planning::run(
        ctx.clone(),
        wake.clone(),
        options.resync,
        options.write_concurrency,
    ));
    let applier = options
        .addons
        .clone()
        .map(|addons| tokio::spawn(crate::applier::run(ctx.clone(), addons)));
    // Demand from the user clusters, for pools that grow.
    let demand = tokio::spawn(crate::demand::run(ctx.clone()));
    // What the user clusters that adopt serve today (`spec.adopt`).
    let discover = tokio::spawn(crate::discover::run(ctx.clone()));

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
    if let Some(applier) = applier {
        applier.abort();
    }
    demand.abort();
    discover.abort();
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

/// Lets the process open as many descriptors as its hard limit allows, as Go programs do at
/// start. The leader holds a connection per drift watch, two per user cluster for `metallb`:
/// past about 500 user clusters that is more than the soft limit of 1,024 some container
/// runtimes give, and running out would fail syncs and seed requests too, not only watches.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write the one struct passed, nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    if limit.rlim_cur >= limit.rlim_max {
        return;
    }
    let before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: as above.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } == 0 {
        tracing::info!(
            from = before,
            to = limit.rlim_max,
            "open-file limit raised to its hard limit"
        );
    }
}
