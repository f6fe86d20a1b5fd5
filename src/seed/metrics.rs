//! The seed's metrics registry and health endpoints (`/metrics`, `/healthz`, `/readyz`).
//!
//! One [`Registry`] for the whole process; each room registers the metrics it produces
//! ([`Metrics::register`]) and keeps them itself: the planning loop's in
//! `crate::planning::metrics`, the applier's in `crate::applier::metrics`, the REST API's and
//! the webhook's as an [`HttpMetrics`] each. What lives here is what every room shares: the
//! writes sent to the seed's API server, the leader gauge, readiness, and the request
//! instrumentation of kipam's HTTP servers. The list of metrics, with what each means, is in
//! `docs/design.md` ("Metrics").

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A histogram family, one histogram per label set.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub verb: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The route template (`/api/v2/seeds/{seed_name}/ipampools`), or `unmatched` for a path
    /// or method no route serves (so unknown paths cannot grow the label set).
    pub route: String,
    pub method: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpRouteLabels {
    pub route: String,
    pub method: String,
}

/// Buckets of HTTP requests: 1 ms to 16 s.
fn http_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Buckets of requests to user clusters: 5 ms to 20 s.
/// Requests and their durations, for one HTTP server.
#[derive(Clone)]
pub struct HttpMetrics {
    pub requests: Family<HttpLabels, Counter>,
    pub duration: HistogramFamily<HttpRouteLabels>,
}

impl HttpMetrics {
    /// Registers `kipam_<server>_requests_total` and `kipam_<server>_request_duration_seconds`
    /// (`what` names the server in their help text).
    pub fn register(metrics: &Metrics, server: &str, what: &str) -> Self {
        let m = HttpMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(http_buckets),
        };
        metrics.register(|r| {
            r.register(
                format!("{server}_requests"),
                format!("{what} requests by route, method and status code"),
                m.requests.clone(),
            );
            r.register(
                format!("{server}_request_duration_seconds"),
                format!("{what} request durations by route and method"),
                m.duration.clone(),
            );
        });
        m
    }
}

/// What every room of the running seed reports, and the registry all of them register in.
pub struct Metrics {
    registry: Mutex<Registry>,
    pub api_writes: Family<WriteLabels, Counter>,
    /// Failed writes by kind of object and reason (`Conflict`, `Invalid`, `Timeout`, ...).
    pub write_errors: Family<ErrorLabels, Counter>,
    pub leader: Gauge,
    pub ready: AtomicBool,
    /// Why the replica is not ready, when something outside it is missing (CRDs, RBAC, ...).
    pub not_ready_reason: Mutex<Option<String>>,
    pub writes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("kipam")),
            api_writes: Family::default(),
            write_errors: Family::default(),
            leader: Gauge::default(),
            ready: AtomicBool::new(false),
            not_ready_reason: Mutex::new(None),
            writes: AtomicU64::new(0),
        };
        m.register(|r| {
            r.register(
                "api_writes",
                "Writes sent to the API server",
                m.api_writes.clone(),
            );
            r.register(
                "write_errors",
                "Writes the API server refused or that failed, by kind and reason",
                m.write_errors.clone(),
            );
            r.register(
                "leader",
                "1 while this replica holds the leader lease",
                m.leader.clone(),
            );
        });
        Arc::new(m)
    }

    /// Registers a room's metrics (once, when the room starts).
    pub fn register(&self, f: impl FnOnce(&mut Registry)) {
        f(&mut lock(&self.registry));
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
        *lock(&self.not_ready_reason) = reason;
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &lock(&self.registry)).is_err() {
            out.clear();
        }
        out
    }
}

/// The route template among `routes` that `path` matches (`{name}` matches one segment).
pub fn route_of<'a>(path: &str, routes: &[&'a str]) -> Option<&'a str> {
    let segments: Vec<&str> = path.split('/').collect();
    routes.iter().copied().find(|route| {
        let parts: Vec<&str> = route.split('/').collect();
        parts.len() == segments.len()
            && parts
                .iter()
                .zip(&segments)
                .all(|(p, s)| (p.starts_with('{') && p.ends_with('}') && !s.is_empty()) || p == s)
    })
}

#[derive(Clone)]
struct Observed {
    http: HttpMetrics,
    routes: Arc<Vec<&'static str>>,
}

/// Counts and times every request `router` answers in `http` (`kipam_api_*` or
/// `kipam_webhook_*`), labelled with the route template among `routes` (`unmatched` for any
/// other path).
pub fn instrument(router: Router, http: HttpMetrics, routes: Vec<&'static str>) -> Router {
    let observed = Observed {
        http,
        routes: Arc::new(routes),
    };
    router.layer(middleware::from_fn_with_state(observed, observe_request))
}

async fn observe_request(State(o): State<Observed>, req: Request, next: Next) -> Response {
    let route = route_of(req.uri().path(), &o.routes).unwrap_or("unmatched");
    // Only standard methods become label values: any other token is counted as `other`.
    let method = match req.method().as_str() {
        m @ ("GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS") => m.to_string(),
        _ => "other".to_string(),
    };
    let started = Instant::now();
    let response = next.run(req).await;
    o.http
        .requests
        .get_or_create(&HttpLabels {
            route: route.to_string(),
            method: method.clone(),
            code: response.status().as_u16().to_string(),
        })
        .inc();
    o.http
        .duration
        .get_or_create(&HttpRouteLabels {
            route: route.to_string(),
            method,
        })
        .observe(started.elapsed().as_secs_f64());
    response
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
    let reason = lock(&m.not_ready_reason).clone();
    match reason {
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        None if m.ready.load(Ordering::Relaxed) => (StatusCode::OK, "ready".to_string()),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "caches not synced".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_templates_and_unknown_paths_one_label() {
        let routes = [
            "/api/v2/seeds/{seed_name}/ipampools",
            "/api/v2/seeds/{seed_name}/ipampools/{ipampool_name}",
        ];
        assert_eq!(
            route_of("/api/v2/seeds/s1/ipampools/p", &routes),
            Some(routes[1])
        );
        assert_eq!(
            route_of("/api/v2/seeds/s1/ipampools", &routes),
            Some(routes[0])
        );
        assert_eq!(route_of("/api/v2/seeds//ipampools", &routes), None);
        assert_eq!(route_of("/api/v2/seeds/s1/other", &routes), None);
    }

    #[tokio::test]
    async fn every_request_is_counted_by_route_method_and_code() {
        use tower::ServiceExt;
        let m = Metrics::new();
        let _api = HttpMetrics::register(&m, "api", "REST API");
        let webhook = HttpMetrics::register(&m, "webhook", "Admission webhook");
        let app = instrument(
            Router::new().route("/validate", axum::routing::post(|| async { "ok" })),
            webhook,
            vec!["/validate"],
        );
        for (method, path) in [
            ("POST", "/validate"),
            ("POST", "/validate"),
            ("GET", "/nope"),
        ] {
            let req = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .body(axum::body::Body::empty())
                .expect("request");
            let _ = app.clone().oneshot(req).await;
        }
        let text = m.encode();
        assert!(
            text.contains(
                "kipam_webhook_requests_total{route=\"/validate\",method=\"POST\",code=\"200\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains(
            "kipam_webhook_requests_total{route=\"unmatched\",method=\"GET\",code=\"404\"} 1"
        ));
        assert!(text.contains(
            "kipam_webhook_request_duration_seconds_count{route=\"/validate\",method=\"POST\"} 2"
        ));
        assert!(!text.contains("kipam_api_requests_total{"));
    }
}
