//! The validating admission webhook served by `kipam controller` (see `docs/webhook.md`).
//!
//! Every replica serves it over TLS ([`crate::tls`]) on `--webhook-addr`. It answers from
//! memory: the controller's pool, cluster and namespace caches, the allocation ledger (which
//! every replica's allocation watch keeps, leader or not), and the seed's read-only view of
//! the `IPAMPoolRecord`s, the authoritative record (every replica watches it). The one call it
//! makes to the API server while answering is [`pin`]: an admitted hand-made `IPAddress` is
//! committed to its pool record (a few reads and writes of one or two shards) before the
//! answer. The only lock it takes is the ledger's, which nobody holds across a request to the
//! API server, and it gives up after [`REVIEW_DEADLINE`] with a refusal, so it answers well
//! inside the API server's timeout. The decisions themselves are pure: [`rules::decide`].

pub mod config;
pub mod ipaddress;
pub mod pin;
pub mod review;
pub mod rules;
pub mod selfsigned;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::resources::{Cluster, IPAMAllocation, IPAMPool, IPAMPoolRecord};
use crate::seed::Context;
use crate::tls::{self, TlsFiles};
use review::{AdmissionReview, Verdict};
use rules::{View, Wants};

/// The path the API server posts reviews to.
pub const PATH: &str = "/validate";

/// Longest time the webhook works on one review before refusing it (the API server's timeout
/// in the generated configuration is 10 s).
pub const REVIEW_DEADLINE: Duration = Duration::from_secs(5);

/// Largest review accepted: an API server request is at most 3 MiB and a review carries the
/// object twice (new and old).
pub const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;

/// kipam's user name when running in a pod of service account `kipam` in the namespace it
/// runs in (`system:serviceaccount:<namespace>:kipam`), else in `kipam-system`.
pub fn default_service_account() -> String {
    let namespace =
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
            .ok()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "kipam-system".to_string());
    format!("system:serviceaccount:{namespace}:kipam")
}

/// How the webhook runs.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    pub addr: SocketAddr,
    pub tls: TlsFiles,
    /// kipam's own user name (`request.userInfo.username` of its writes).
    pub service_account: String,
    /// kipam makes and keeps the certificate in `tls` itself ([`selfsigned`]).
    pub self_signed: Option<selfsigned::SelfSignedOptions>,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook: cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("webhook: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("webhook: {0}")]
    SelfSigned(#[from] selfsigned::SelfSignedError),
    #[error("webhook: the server stopped")]
    Stopped,
}

/// Where the webhook's view of the seed comes from.
pub trait Source: Send + Sync + 'static {
    /// What [`rules::decide`] needs for a request; `Err` says why it cannot be known now.
    fn view(&self, wants: &Wants) -> impl Future<Output = Result<View, String>> + Send;

    /// Commits the address of an admitted hand-made `IPAddress` to its pool's record
    /// ([`pin`]); `Err` refuses the request after all. A fixed view has no records to write.
    fn pin(
        &self,
        _request: &review::AdmissionRequest,
    ) -> impl Future<Output = Result<(), Verdict>> + Send {
        async { Ok(()) }
    }
}

/// A fixed view: for tests and benches.
#[derive(Clone, Debug, Default)]
pub struct StaticSource {
    pub pools: Vec<IPAMPool>,
    pub clusters: Vec<Cluster>,
    pub allocations: Vec<IPAMAllocation>,
    pub records: Vec<IPAMPoolRecord>,
    pub terminating_namespaces: Vec<String>,
}

/// Two pools share their addresses where their datacenters meet: the same `addressSpace`
/// (none being the default one).
fn same_space(a: &IPAMPool, b: &IPAMPool) -> bool {
    a.spec.address_space.as_deref().unwrap_or_default()
        == b.spec.address_space.as_deref().unwrap_or_default()
}

fn named<K: kube::Resource>(k: &K, name: &str) -> bool {
    k.meta().name.as_deref() == Some(name)
}

impl Source for StaticSource {
    async fn view(&self, wants: &Wants) -> Result<View, String> {
        let pool = wants.pool.as_deref().unwrap_or("");
        let found = self.pools.iter().find(|p| named(*p, pool)).cloned();
        let space: Vec<IPAMPool> = match (&found, wants.space) {
            (Some(p), true) => self
                .pools
                .iter()
                .filter(|o| !named(*o, pool) && same_space(o, p))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        let mut names: Vec<&str> = space
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        names.push(pool);
        Ok(View {
            pool: found.clone(),
            allocations: self
                .allocations
                .iter()
                .filter(|a| names.iter().any(|n| named(*a, n)))
                .cloned()
                .collect(),
            records: self
                .records
                .iter()
                .filter(|r| names.contains(&r.spec.pool.as_str()))
                .cloned()
                .collect(),
            space,
            hand_made: Vec::new(),
            retained: if wants.space {
                self.allocations
                    .iter()
                    .filter(|a| {
                        let name = a.metadata.name.as_deref().unwrap_or_default();
                        !self
                            .pools
                            .iter()
                            .any(|p| named(p, name) && p.spec.datacenters.contains_key(&a.spec.dc))
                    })
                    .cloned()
                    .collect()
            } else {
                Vec::new()
            },
            cluster: wants
                .cluster
                .as_deref()
                .and_then(|c| self.clusters.iter().find(|x| named(*x, c)).cloned()),
            namespace_terminating: wants
                .namespace
                .as_ref()
                .is_some_and(|n| self.terminating_namespaces.contains(n)),
        })
    }
}

/// The controller's caches and ledger, plus the webhook's own record cache.
pub struct CacheSource {
    pools: Store<IPAMPool>,
    clusters: Store<Cluster>,
    namespaces: Store<Namespace>,
    ctx: Arc<Context>,
    records: Store<IPAMPoolRecord>,
    ready: Arc<AtomicBool>,
}

impl Source for CacheSource {
    async fn view(&self, wants: &Wants) -> Result<View, String> {
        if !self.ready.load(Ordering::Acquire) {
            return Err(
                "kipam's caches are still loading (the replica just started); try again in a moment"
                    .into(),
            );
        }
        let pool = wants.pool.as_deref().unwrap_or("");
        let found = self
            .pools
            .get(&ObjectRef::new(pool))
            .map(|p| p.as_ref().clone());
        // The other pools of its address space, when asked: an `IPAddress` overlapping what
        // they hold is refused too.
        let space: Vec<IPAMPool> = match (&found, wants.space) {
            (Some(p), true) => self
                .pools
                .state()
                .iter()
                .filter(|o| o.metadata.name.as_deref() != Some(pool) && same_space(o, p))
                .map(|o| o.as_ref().clone())
                .collect(),
            _ => Vec::new(),
        };
        let mut names: Vec<String> = space
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.push(pool.to_string());
        // Shared under the lock, copied after it. For an `IPAddress`, also the allocations
        // whose pool no longer serves them — a pool that went and left them (`Retain`, or not
        // deleted yet), a datacenter removed from the pool — held in every pool of their
        // datacenter until their objects go.
        let (allocations, retained): (Vec<_>, Vec<_>) = {
            let ledger = self.ctx.ledger.lock().await;
            let retained = if wants.space {
                ledger
                    .pools()
                    .flat_map(|n| {
                        let serving = self
                            .pools
                            .get(&ObjectRef::new(n))
                            .filter(|p| p.metadata.deletion_timestamp.is_none());
                        ledger.in_pool(n).into_iter().filter(move |a| {
                            serving
                                .as_ref()
                                .is_none_or(|p| !p.spec.datacenters.contains_key(&a.spec().dc))
                        })
                    })
                    .collect()
            } else {
                Vec::new()
            };
            (
                names.iter().flat_map(|n| ledger.in_pool(n)).collect(),
                retained,
            )
        };
        Ok(View {
            pool: found,
            allocations: allocations.iter().map(|a| a.to_object()).collect(),
            records: self
                .records
                .state()
                .into_iter()
                .filter(|r| names.contains(&r.spec.pool))
                .map(|r| r.as_ref().clone())
                .collect(),
            space,
            retained: retained.iter().map(|a| a.to_object()).collect(),
            hand_made: if wants.space {
                self.ctx
                    .capi
                    .foreign_addresses
                    .state()
                    .iter()
                    .filter(|a| {
                        // Of its address space, or of a pool that no longer serves it (held
                        // in its datacenter whatever the space).
                        a.spec.pool_ref.kipam_pool().is_some_and(|p| {
                            names.iter().any(|n| n == p)
                                || !ipaddress::served_by(
                                    a,
                                    self.pools.get(&ObjectRef::new(p)).as_deref(),
                                )
                        })
                    })
                    .map(|a| a.as_ref().clone())
                    .collect()
            } else {
                Vec::new()
            },
            cluster: wants
                .cluster
                .as_deref()
                .and_then(|c| self.clusters.get(&ObjectRef::new(c)))
                .map(|c| c.as_ref().clone()),
            namespace_terminating: wants
                .namespace
                .as_deref()
                .and_then(|n| self.namespaces.get(&ObjectRef::new(n)))
                .is_some_and(|n| {
                    n.metadata.deletion_timestamp.is_some()
                        || n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating")
                }),
        })
    }

    async fn pin(&self, request: &review::AdmissionRequest) -> Result<(), Verdict> {
        let Some(object) = request.object.as_ref() else {
            return Ok(());
        };
        let view = self
            .view(&rules::wants(request))
            .await
            .map_err(Verdict::unavailable)?;
        let Some(pool) = view.pool.as_ref() else {
            return Ok(());
        };
        let placed = ipaddress::check(
            object,
            request.namespace.as_deref(),
            ipaddress::Held {
                pool: Some(pool),
                allocations: &view.allocations,
                records: &view.records,
                space: &view.space,
                retained: &view.retained,
                hand_made: &view.hand_made,
            },
        )?;
        if placed.is_empty() {
            return Ok(());
        }
        let text = |path: &str| {
            object
                .pointer(path)
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let namespace = Some(text("/metadata/namespace"))
            .filter(|n| !n.is_empty())
            .or_else(|| request.namespace.clone())
            .unwrap_or_default();
        let name = text("/metadata/name");
        let claim = text("/spec/claimRef/name");
        let pools: Vec<IPAMPool> = self
            .pools
            .state()
            .iter()
            .map(|p| p.as_ref().clone())
            .collect();
        // The pools as this replica has seen them: every change up to the highest version.
        let pools_seen = pools
            .iter()
            .filter_map(|p| p.metadata.resource_version.as_deref()?.parse::<i64>().ok())
            .max()
            .unwrap_or(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let made = pin::HandMade {
            namespace: &namespace,
            name: &name,
            claim: &claim,
            pool,
            placed: &placed,
        };
        pin::commit(&self.ctx.writer, &pools, pools_seen, &made, now).await
    }
}

struct Shared<S> {
    source: S,
    kipam: String,
    deadline: Duration,
}

/// The webhook's HTTP routes (`POST /validate`) over `source`; `kipam` is kipam's own user.
pub fn router<S: Source>(source: S, kipam: &str, deadline: Duration) -> axum::Router {
    let shared = Arc::new(Shared {
        source,
        kipam: kipam.to_string(),
        deadline,
    });
    axum::Router::new()
        .route(PATH, axum::routing::post(handle::<S>))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(shared)
}

fn plain(code: StatusCode, message: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain")], message).into_response()
}

async fn handle<S: Source>(
    State(shared): State<Arc<Shared<S>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let base = content_type.split(';').next().unwrap_or("").trim();
    if !base.eq_ignore_ascii_case("application/json") {
        return plain(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content type {content_type:?}: an AdmissionReview must be application/json"),
        );
    }
    let review: AdmissionReview = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("not an AdmissionReview: {e}"),
            );
        }
    };
    if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
        return plain(
            StatusCode::BAD_REQUEST,
            format!(
                "expected an admission.k8s.io/v1 AdmissionReview, got {} {}",
                review.api_version, review.kind
            ),
        );
    }
    let Some(request) = review.request else {
        return plain(
            StatusCode::BAD_REQUEST,
            "the AdmissionReview has no request".to_string(),
        );
    };
    let work = async {
        if request.user_info.username == shared.kipam {
            return Verdict::allow();
        }
        let wants = rules::wants(&request);
        let verdict = match shared.source.view(&wants).await {
            Ok(view) => rules::decide(&request, &view, &shared.kipam),
            Err(why) => Verdict::unavailable(why),
        };
        // Admitted by the caches: committed behind the record's fence before the answer.
        if verdict.allowed && rules::commits_hand_made(&request) {
            return match shared.source.pin(&request).await {
                Ok(()) => verdict,
                Err(refused) => refused,
            };
        }
        verdict
    };
    let verdict = match tokio::time::timeout(shared.deadline, work).await {
        Ok(v) => v,
        Err(_) => Verdict::unavailable(format!(
            "kipam could not check this request within {} s; try again",
            shared.deadline.as_secs_f64()
        )),
    };
    if !verdict.allowed {
        tracing::info!(
            user = %request.user_info.username,
            operation = %request.operation,
            resource = %request.resource.resource,
            namespace = request.namespace.as_deref().unwrap_or(""),
            name = request.name.as_deref().unwrap_or(""),
            "admission refused: {}",
            verdict.message
        );
    }
    let body = review::response(&request.uid, &verdict);
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Serves the webhook until the process ends, from the controller's caches. Fails at once when
/// the address cannot be bound or the certificate files cannot be used.
pub async fn run(ctx: Arc<Context>, options: WebhookOptions) -> Result<(), WebhookError> {
    if let Some(self_signed) = options.self_signed.clone() {
        // Waits (retrying) until the shared certificate is in the Secret and on disk.
        selfsigned::prepare(ctx.writer.clone(), self_signed).await?;
    }
    // Check the files before anything else: a bad certificate is a start-up error.
    options.tls.load()?;
    let listener = tokio::net::TcpListener::bind(options.addr)
        .await
        .map_err(|source| WebhookError::Bind {
            addr: options.addr,
            source,
        })?;
    // The pool records come from the seed's record view (every replica watches them);
    // allocations from the ledger.
    let records = ctx.record_view.clone();
    let ready = Arc::new(AtomicBool::new(false));
    let source = CacheSource {
        pools: ctx.pools.clone(),
        clusters: ctx.clusters.clone(),
        namespaces: ctx.namespaces.clone(),
        ctx: ctx.clone(),
        records: records.store.clone(),
        ready: ready.clone(),
    };
    // The controller's own caches are ready once its planning loop says so
    // (`Context::caches_listed`: a second waiter on `Store::wait_until_ready` would steal the
    // planning loop's wake-up). The ledger is ready once it has held a complete list (the
    // allocation watch's first, on every replica); the record view says nothing when it lists,
    // so it is polled.
    let mut listed = ctx.caches_listed.subscribe();
    let mut ledger_updates = ctx.ledger_updates.subscribe();
    tokio::spawn(async move {
        // (the guards wait_for returns are dropped at once: they must not be held across awaits)
        let _ = listed.wait_for(|listed| *listed).await.is_ok();
        let _ = ledger_updates.wait_for(|complete| *complete).await.is_ok();
        while !records.listed() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ready.store(true, Ordering::Release);
        tracing::info!("webhook: caches loaded, reviewing requests");
    });
    tracing::info!(addr = %options.addr, "webhook: serving {PATH} over TLS");
    let app = crate::seed::metrics::instrument(
        router(source, &options.service_account, REVIEW_DEADLINE),
        crate::seed::metrics::HttpMetrics::register(&ctx.metrics, "webhook", "Admission webhook"),
        vec![PATH],
    );
    tls::serve(listener, options.tls, app, std::future::pending())
        .await
        .map_err(WebhookError::Tls)
}
