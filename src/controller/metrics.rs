//! Prometheus metrics and the health endpoints (`/metrics`, `/healthz`, `/readyz`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
    pub datacenter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub verb: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncLabels {
    /// `settled` or `failed`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
    pub reason: String,
}

/// Everything the controller reports.
pub struct Metrics {
    registry: Registry,
    pub passes: Counter,
    pub pass_failures: Counter,
    pub allocations_created: Counter,
    pub allocations_released: Counter,
    pub allocation_failures: Counter,
    pub api_writes: Family<WriteLabels, Counter>,
    /// Failed writes by kind of object and reason (`Conflict`, `Invalid`, `Timeout`, ...).
    pub write_errors: Family<ErrorLabels, Counter>,
    pub leader: Gauge,
    pub pool_utilisation: Family<PoolLabels, Gauge>,
    pub pool_allocations: Family<PoolLabels, Gauge>,
    pub last_pass_millis: Gauge,
    pub ready: AtomicBool,
    /// Why the replica is not ready, when something outside it is missing (CRDs, RBAC, ...).
    pub not_ready_reason: std::sync::Mutex<Option<String>>,
    pub writes: AtomicU64,
    /// Addon applier: user-cluster syncs by result.
    pub addon_syncs: Family<SyncLabels, Counter>,
    /// Addon applier: requests sent to user clusters (applies and deletes).
    pub addon_requests: Counter,
    pub addon_objects_applied: Counter,
    pub addon_objects_pruned: Counter,
    pub addon_syncs_in_flight: Gauge,
    pub addon_last_sync_millis: Gauge,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("kipam");
        let m = Metrics {
            passes: Counter::default(),
            pass_failures: Counter::default(),
            allocations_created: Counter::default(),
            allocations_released: Counter::default(),
            allocation_failures: Counter::default(),
            api_writes: Family::default(),
            write_errors: Family::default(),
            leader: Gauge::default(),
            pool_utilisation: Family::default(),
            pool_allocations: Family::default(),
            last_pass_millis: Gauge::default(),
            ready: AtomicBool::new(false),
            not_ready_reason: std::sync::Mutex::new(None),
            writes: AtomicU64::new(0),
            addon_syncs: Family::default(),
            addon_requests: Counter::default(),
            addon_objects_applied: Counter::default(),
            addon_objects_pruned: Counter::default(),
            addon_syncs_in_flight: Gauge::default(),
            addon_last_sync_millis: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register("reconcile_passes", "Planning passes run", m.passes.clone());
        registry.register(
            "reconcile_pass_failures",
            "Planning passes that ended with an error",
            m.pass_failures.clone(),
        );
        registry.register(
            "allocations_created",
            "Allocations created, grown or re-pinned",
            m.allocations_created.clone(),
        );
        registry.register(
            "allocations_released",
            "Allocations released",
            m.allocations_released.clone(),
        );
        registry.register(
            "allocation_failures",
            "Allocation requests that could not be met (counted when they change)",
            m.allocation_failures.clone(),
        );
        registry.register(
            "api_writes",
            "Writes sent to the API server",
            m.api_writes.clone(),
        );
        registry.register(
            "write_errors",
            "Writes the API server refused or that failed, by kind and reason",
            m.write_errors.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            m.leader.clone(),
        );
        registry.register(
            "pool_utilisation_percent",
            "Allocated share of the allocatable addresses, per pool and datacenter",
            m.pool_utilisation.clone(),
        );
        registry.register(
            "pool_allocations",
            "Allocations per pool and datacenter",
            m.pool_allocations.clone(),
        );
        registry.register(
            "last_pass_milliseconds",
            "Duration of the last planning pass",
            m.last_pass_millis.clone(),
        );
        registry.register(
            "addon_syncs",
            "User-cluster syncs of the addon applier, by result",
            m.addon_syncs.clone(),
        );
        registry.register(
            "addon_requests",
            "Requests sent to user clusters (server-side applies and deletes)",
            m.addon_requests.clone(),
        );
        registry.register(
            "addon_objects_applied",
            "Objects applied to user clusters",
            m.addon_objects_applied.clone(),
        );
        registry.register(
            "addon_objects_pruned",
            "Objects deleted from user clusters because no Addon renders them any more",
            m.addon_objects_pruned.clone(),
        );
        registry.register(
            "addon_syncs_in_flight",
            "User clusters being synced right now (at most --tenant-concurrency)",
            m.addon_syncs_in_flight.clone(),
        );
        registry.register(
            "addon_last_sync_milliseconds",
            "Duration of the last user-cluster sync",
            m.addon_last_sync_millis.clone(),
        );
        Arc::new(Metrics { registry, ..m })
    }

    /// Counts one API write.
    pub fn wrote(&self, verb: &str, resource: &str) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.api_writes
            .get_or_create(&WriteLabels {
                verb: verb.into(),
                resource: resource.into(),
            })
            .inc();
    }

    /// Records the end of one user-cluster sync.
    pub fn addon_sync(&self, settled: bool, took: std::time::Duration) {
        let result = if settled { "settled" } else { "failed" };
        self.addon_syncs
            .get_or_create(&SyncLabels {
                result: result.into(),
            })
            .inc();
        self.addon_last_sync_millis.set(took.as_millis() as i64);
    }

    /// Counts one failed write.
    pub fn write_failed(&self, kind: &str, reason: &str) {
        self.write_errors
            .get_or_create(&ErrorLabels {
                kind: kind.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Records (or clears, with `None`) why this replica cannot work.
    pub fn set_not_ready(&self, reason: Option<String>) {
        if let Ok(mut g) = self.not_ready_reason.lock() {
            *g = reason;
        }
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Serves the endpoints until the process ends.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}

async fn metrics_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

async fn ready_handler(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    let reason = m.not_ready_reason.lock().ok().and_then(|g| g.clone());
    match reason {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        None if m.ready.load(Ordering::Relaxed) => (StatusCode::OK, "ready".to_string()),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "caches not synced".to_string(),
        ),
    }
}
