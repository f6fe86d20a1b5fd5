//! The seed REST API for pools, with KKP's routes and JSON model
//! (`/api/v2/seeds/{seed_name}/ipampools`), served by `kipam controller` on every replica.
//!
//! Reads answer from the controller's caches (the pool reflector and the allocation ledger):
//! no API server call per read. Writes go to the API server with the controller's request
//! client, so any replica takes them; the controller then sees them through its watches like
//! any other change. Every request is authenticated with a `TokenReview` and authorised with a
//! `SubjectAccessReview` (see [`auth`]). See `docs/api.md`.
//!
//! [`router`] builds the routes; [`serve`] runs them on a plain TCP listener and [`serve_tls`]
//! over TLS, both with the server of [`crate::tls`].

pub mod adoption;
pub mod auth;
pub mod error;
pub mod lookup;
pub mod model;
pub mod openapi;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, patch, post};
use futures::StreamExt;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tokio::sync::Semaphore;

use crate::planner::StoredAllocation;
use crate::resources::IPAMPool;
use crate::seed::Context;
use crate::seed::metrics::{HttpMetrics, instrument};
use crate::validation;
use auth::{Access, Gate};
use error::ApiError;
use model::{AllocationView, PoolBody, PoolView};

/// How the API is served.
#[derive(Clone, Debug)]
pub struct ApiOptions {
    pub addr: SocketAddr,
    /// How long token and access review answers are reused (zero: not cached).
    pub auth_cache_ttl: Duration,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// A request (body included) that takes longer is answered 503.
    pub request_timeout: Duration,
    /// Requests served at once; more are answered 429 at once.
    pub max_concurrent: usize,
    /// Serve over TLS with these files (re-read when they change); plain HTTP when `None`.
    pub tls: Option<crate::tls::TlsFiles>,
}

impl Default for ApiOptions {
    fn default() -> Self {
        ApiOptions {
            addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            auth_cache_ttl: Duration::from_secs(10),
            max_body_bytes: 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            max_concurrent: 256,
            tls: None,
        }
    }
}

/// What the handlers share.
pub struct ApiState {
    pub ctx: Arc<Context>,
    pub seed_name: String,
    pub options: ApiOptions,
    gate: Gate,
    in_flight: Semaphore,
    /// `kipam_api_requests_total` and `kipam_api_request_duration_seconds`.
    metrics: HttpMetrics,
    /// What the web page polls to follow changes.
    live: ui::Live,
}

impl ApiState {
    pub fn new(ctx: Arc<Context>, seed_name: String, options: ApiOptions) -> Arc<ApiState> {
        Arc::new(ApiState {
            gate: Gate::new(ctx.writer.clone(), options.auth_cache_ttl),
            in_flight: Semaphore::new(options.max_concurrent.max(1)),
            metrics: HttpMetrics::register(&ctx.metrics, "api", "REST API"),
            live: ui::Live::new(&ctx),
            ctx,
            seed_name,
            options,
        })
    }
}

pub const POOLS: &str = "/api/v2/seeds/{seed_name}/ipampools";
pub const POOL: &str = "/api/v2/seeds/{seed_name}/ipampools/{ipampool_name}";
pub const ALLOCATIONS: &str = "/api/v2/seeds/{seed_name}/ipampools/{ipampool_name}/allocations";
pub const OPENAPI: &str = "/api/v2/openapi.json";
pub const ADDRESS: &str = "/api/v2/seeds/{seed_name}/addresses/{address}";
pub const ADDRESS_CIDR: &str = "/api/v2/seeds/{seed_name}/addresses/{address}/{prefix_length}";
pub const ADOPTION: &str = "/api/v2/seeds/{seed_name}/adoption";

type Shared = Arc<ApiState>;

/// Every route: the router is built from this list, and the OpenAPI test walks it.
pub fn routes() -> Vec<(Method, &'static str, MethodRouter<Shared>)> {
    vec![
        (Method::GET, POOLS, get(list_pools)),
        (Method::POST, POOLS, post(create_pool)),
        (Method::GET, POOL, get(get_pool)),
        (Method::PATCH, POOL, patch(patch_pool)),
        (Method::DELETE, POOL, delete(delete_pool)),
        (Method::GET, ALLOCATIONS, get(list_allocations)),
        (Method::GET, OPENAPI, get(openapi_document)),
        (Method::GET, ADDRESS, get(lookup::by_address)),
        (Method::GET, ADDRESS_CIDR, get(lookup::by_cidr)),
        (Method::GET, ADOPTION, get(adoption::fleet)),
    ]
}

/// The API's routes with their limits (concurrency, timeout) and KKP-shaped errors for
/// unknown paths and methods.
pub fn router(state: Shared) -> Router {
    let metrics = state.metrics.clone();
    let mut router = Router::new();
    for (_, path, method_router) in routes() {
        router = router.route(path, method_router);
    }
    let router = router
        .merge(ui::router())
        .fallback(|req: Request| async move {
            ApiError::not_found(format!("no such route: {}", req.uri().path()))
        })
        .method_not_allowed_fallback(|req: Request| async move {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{} is not allowed on {}", req.method(), req.uri().path()),
            )
        })
        .layer(middleware::from_fn_with_state(state.clone(), limits))
        .with_state(state);
    let paths = routes()
        .into_iter()
        .map(|(_, path, _)| path)
        .chain(ui::routes().into_iter().map(|(path, _)| path))
        .collect();
    instrument(router, metrics, paths)
}

/// A client that has not sent a request's headers within this time is disconnected (idle
/// keep-alive connections included), so connections cannot be held open for free.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until the task is dropped (plain HTTP/1.1, through
/// [`crate::tls::serve_http1`], with [`HEADER_READ_TIMEOUT`]). Accept errors (out of file
/// descriptors, a connection reset before it was accepted) are logged and waited out.
pub async fn serve(listener: tokio::net::TcpListener, router: Router) -> std::io::Result<()> {
    crate::tls::serve_http1(
        listener,
        None,
        router,
        Some(HEADER_READ_TIMEOUT),
        std::future::pending(),
    )
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))
}

/// [`serve`] over TLS: each connection's handshake runs in its own task (a client that stalls
/// blocks nobody) and the certificate follows the files. Fails at once when the files cannot
/// be used.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    files: crate::tls::TlsFiles,
    router: Router,
) -> Result<(), crate::tls::TlsError> {
    crate::tls::serve_http1(
        listener,
        Some(files),
        router,
        Some(HEADER_READ_TIMEOUT),
        std::future::pending(),
    )
    .await
}

/// A bound on requests in flight and on each request's duration.
async fn limits(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let Ok(_permit) = state.in_flight.try_acquire() else {
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too many requests in flight; try again shortly",
        )
        .into_response();
    };
    let timeout = state.options.request_timeout;
    match tokio::time::timeout(timeout, next.run(req)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the request did not finish within {timeout:?}"),
        )
        .into_response(),
    }
}

/// Authenticates (401), checks the seed name (400) and authorises (403), in that order.
async fn admit(
    state: &ApiState,
    headers: &HeaderMap,
    seed: &str,
    access: &[Access],
) -> Result<auth::User, ApiError> {
    let user = state.gate.authenticate(headers).await?;
    if seed != state.seed_name {
        return Err(ApiError::bad_request(format!(
            "unknown seed {seed:?}: this API serves seed {:?}",
            state.seed_name
        )));
    }
    for a in access {
        state.gate.authorize(&user, a.clone()).await?;
    }
    Ok(user)
}

fn pools_access(verb: &'static str, name: Option<&str>) -> Access {
    Access {
        verb,
        resource: "ipampools",
        name: name.map(str::to_string),
    }
}

fn path_error(e: PathRejection) -> ApiError {
    ApiError::bad_request(format!("invalid path: {}", e.body_text()))
}

/// Reads the body after the caller was admitted, refusing more than the limit (413).
async fn read_body(state: &ApiState, headers: &HeaderMap, body: Body) -> Result<Vec<u8>, ApiError> {
    let limit = state.options.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {limit} bytes"),
        )
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("cannot read the body: {e}")))?;
        if bytes.len() + chunk.len() > limit {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the body is empty; a JSON object is expected",
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))
}

/// The stored allocations of `pool` that validation compares added exclusions with.
async fn stored_of(ctx: &Context, pool: &str) -> Vec<StoredAllocation> {
    let ledger = ctx.ledger.lock().await;
    ledger
        .of_pool(pool)
        .filter_map(|obj| validation::stored_allocation_of(&obj.parts()).ok())
        .collect()
}

fn validate(
    new: &IPAMPool,
    old: Option<&IPAMPool>,
    stored: &[StoredAllocation],
) -> Result<(), ApiError> {
    validation::validate_pool(new, old, stored)
        .map(|_| ())
        .map_err(|errors| ApiError::invalid(errors.iter().map(|e| e.to_string()).collect()))
}

/// Reads wait for the pool cache's and the ledger's first list (briefly): an empty list
/// before it would be a wrong answer, not an empty seed, and exclusions would be checked
/// against no allocations at all.
///
/// It polls the flag the planning loop sets once every cache is ready instead of waiting on
/// `Store::wait_until_ready`: kube's ready signal wakes one waiter only, and a request waiting
/// there could take the planning loop's wake-up.
async fn caches_ready(ctx: &Context) -> Result<(), ApiError> {
    let ready = || {
        ctx.metrics.ready.load(std::sync::atomic::Ordering::Relaxed) && *ctx.ledger_updates.borrow()
    };
    let wait = async {
        while !ready() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    match tokio::time::timeout(Duration::from_secs(5), wait).await {
        Ok(()) => Ok(()),
        Err(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the pool and allocation caches are still loading; try again shortly",
        )),
    }
}

fn cached_pool(ctx: &Context, name: &str) -> Option<Arc<IPAMPool>> {
    ctx.pools
        .get(&kube::runtime::reflector::ObjectRef::new(name))
}

fn not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("ipampool {name:?} not found"))
}

async fn list_pools(
    State(state): State<Shared>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(seed) = path.map_err(path_error)?;
    admit(&state, &headers, &seed, &[pools_access("list", None)]).await?;
    caches_ready(&state.ctx).await?;
    let mut pools = state.ctx.pools.state();
    pools.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let views: Vec<model::PoolViewRef> = pools.iter().map(|p| model::PoolViewRef(p)).collect();
    Ok(axum::Json(views).into_response())
}

async fn get_pool(
    State(state): State<Shared>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path((seed, name)) = path.map_err(path_error)?;
    admit(&state, &headers, &seed, &[pools_access("get", Some(&name))]).await?;
    caches_ready(&state.ctx).await?;
    let pool = cached_pool(&state.ctx, &name).ok_or_else(|| not_found(&name))?;
    Ok(axum::Json(PoolView::of(&pool)).into_response())
}

async fn create_pool(
    State(state): State<Shared>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Path(seed) = path.map_err(path_error)?;
    let user = admit(&state, &headers, &seed, &[pools_access("create", None)]).await?;
    let body: PoolBody = parse_json(&read_body(&state, &headers, body).await?)?;
    if body.name.is_empty() {
        return Err(ApiError::bad_request("name: is required"));
    }
    let pool = IPAMPool::new(&body.name, body.spec());
    let stored = stored_of(&state.ctx, &body.name).await;
    validate(&pool, None, &stored)?;
    if cached_pool(&state.ctx, &body.name).is_some() {
        return Err(ApiError::conflict(format!(
            "ipampool {:?} already exists",
            body.name
        )));
    }
    // RBAC: src/rbac.rs (ipampools: create, get, update, delete).
    let api = Api::<IPAMPool>::all(state.ctx.writer.clone());
    let created = api
        .create(&PostParams::default(), &pool)
        .await
        .map_err(|e| ApiError::from_kube(e, &format!("ipampool {:?}", body.name)))?;
    tracing::info!(user = %user.name, pool = %body.name, "pool created through the API");
    Ok((StatusCode::CREATED, axum::Json(PoolView::of(&created))).into_response())
}

async fn patch_pool(
    State(state): State<Shared>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Path((seed, name)) = path.map_err(path_error)?;
    let user = admit(
        &state,
        &headers,
        &seed,
        &[pools_access("patch", Some(&name))],
    )
    .await?;
    let patch: serde_json::Value = parse_json(&read_body(&state, &headers, body).await?)?;
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "invalid body: a merge patch must be a JSON object",
        ));
    }
    // RBAC: src/rbac.rs (ipampools: create, get, update, delete).
    let api = Api::<IPAMPool>::all(state.ctx.writer.clone());
    let what = format!("ipampool {name:?}");
    // The write is checked against the pool as stored now, and carries its resourceVersion, so
    // nothing written meanwhile is lost. A write that loses only to a status or metadata
    // change (kipam's own usage write, most often) is done again on a fresh read; a change of
    // the spec since the first read is a conflict the client has to look at.
    let mut first_spec = None;
    for _ in 0..PATCH_ATTEMPTS {
        let old = api
            .get_opt(&name)
            .await
            .map_err(|e| ApiError::from_kube(e, &what))?
            .ok_or_else(|| not_found(&name))?;
        let first = first_spec.get_or_insert_with(|| old.spec.clone());
        if old.spec != *first {
            return Err(changed_meanwhile(&name));
        }
        let new = merged_pool(&old, &patch, &name)?;
        let stored = stored_of(&state.ctx, &name).await;
        validate(&new, Some(&old), &stored)?;
        if new.spec == old.spec {
            return Ok(axum::Json(PoolView::of(&old)).into_response());
        }
        match api.replace(&name, &PostParams::default(), &new).await {
            Ok(updated) => {
                tracing::info!(user = %user.name, pool = %name, "pool changed through the API");
                return Ok(axum::Json(PoolView::of(&updated)).into_response());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tracing::debug!(pool = %name, "the pool was written meanwhile; reading it again");
            }
            Err(e) => return Err(ApiError::from_kube(e, &what)),
        }
    }
    Err(ApiError::conflict(format!(
        "{what} kept changing while it was being patched ({PATCH_ATTEMPTS} attempts); try again"
    )))
}

/// Writes a PATCH tries before it gives up on a pool that keeps changing under it.
const PATCH_ATTEMPTS: usize = 5;

fn changed_meanwhile(name: &str) -> ApiError {
    ApiError::conflict(format!(
        "ipampool {name:?} was changed by someone else while this patch was applied; read it \
         again and send the patch again if it still holds"
    ))
}

/// `old` with the client's merge patch applied to its spec (in the API's model).
fn merged_pool(
    old: &IPAMPool,
    patch: &serde_json::Value,
    name: &str,
) -> Result<IPAMPool, ApiError> {
    let mut document = serde_json::to_value(PoolBody::of(old))
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    model::merge_patch(&mut document, patch);
    let merged: PoolBody = serde_json::from_value(document)
        .map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))?;
    if !merged.name.is_empty() && merged.name != name {
        return Err(ApiError::bad_request(format!(
            "name: {:?}: cannot be changed (the pool is {name:?})",
            merged.name
        )));
    }
    let mut new = old.clone();
    new.spec = merged.spec();
    Ok(new)
}

async fn delete_pool(
    State(state): State<Shared>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path((seed, name)) = path.map_err(path_error)?;
    let user = admit(
        &state,
        &headers,
        &seed,
        &[pools_access("delete", Some(&name))],
    )
    .await?;
    // RBAC: src/rbac.rs (ipampools: create, get, update, delete).
    let api = Api::<IPAMPool>::all(state.ctx.writer.clone());
    api.delete(&name, &DeleteParams::default())
        .await
        .map_err(|e| ApiError::from_kube(e, &format!("ipampool {name:?}")))?;
    tracing::info!(user = %user.name, pool = %name, "pool deleted through the API");
    Ok(StatusCode::OK.into_response())
}

/// The pool datacenters of `pool` as the page shows them. The quarantine is read address by
/// address from the pool records every replica watches ([`crate::seed::watches::RecordView`]),
/// once that watch has listed; until then it is only the count of the pool status (written
/// by the leader), which the page shows as a count.
pub(crate) fn page_dcs(
    ctx: &Context,
    pool: &crate::resources::IPAMPool,
) -> Vec<crate::page::PoolDc> {
    let records = ctx
        .record_view
        .listed()
        .then(|| ctx.record_view.store.state());
    page_dcs_with(pool, records.as_deref(), now_seconds())
}

/// [`page_dcs`] with the records (`None`: not listed yet) and the time given.
pub(crate) fn page_dcs_with(
    pool: &crate::resources::IPAMPool,
    records: Option<&[Arc<crate::resources::IPAMPoolRecord>]>,
    now: i64,
) -> Vec<crate::page::PoolDc> {
    match records {
        Some(records) => {
            let quarantine =
                crate::page::quarantine::of_records(pool, records.iter().map(|r| &**r), now);
            crate::page::view::pool_dcs_with(pool, &quarantine)
        }
        None => crate::page::pool_dcs(pool),
    }
}

fn now_seconds() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// What machines' claims hold in `pool` (every datacenter), from kipam's `IPAddress`es, for
/// the page and the lookup.
pub(crate) fn claim_holdings(
    ctx: &Context,
    pool: &crate::resources::IPAMPool,
) -> Vec<crate::page::Holding> {
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let mut out = Vec::new();
    for address in ctx.capi.addresses.state() {
        if address.spec.pool_ref.kipam_pool() != Some(name) {
            continue;
        }
        let namespace = address.metadata.namespace.as_deref().unwrap_or_default();
        let claim = ctx.capi.claims.get(
            &kube::runtime::reflector::ObjectRef::new(&address.spec.claim_ref.name)
                .within(namespace),
        );
        let Some(view) = AllocationView::of_claim(&address, claim.as_deref(), false) else {
            continue;
        };
        let prefix_pool = pool
            .spec
            .datacenters
            .get(&view.datacenter)
            .is_some_and(|d| d.type_ == crate::resources::AllocationType::Prefix);
        out.push(crate::page::Holding::claim(crate::page::ClaimShown {
            namespace,
            name: &address.spec.claim_ref.name,
            pool: name,
            datacenter: &view.datacenter,
            address: &address.spec.address,
            prefix: address.spec.prefix,
            prefix_pool,
            ready: view.phase == Some(crate::resources::AllocationPhase::Allocated),
            message: view.message.unwrap_or_default(),
        }));
    }
    out
}

async fn list_allocations(
    State(state): State<Shared>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path((seed, name)) = path.map_err(path_error)?;
    let access = [
        pools_access("get", Some(&name)),
        Access {
            verb: "list",
            resource: "ipamallocations",
            name: None,
        },
    ];
    admit(&state, &headers, &seed, &access).await?;
    caches_ready(&state.ctx).await?;
    let Some(pool) = cached_pool(&state.ctx, &name) else {
        return Err(not_found(&name));
    };
    let mut list: Vec<AllocationView> = {
        let ledger = state.ctx.ledger.lock().await;
        ledger
            .of_pool(&name)
            .map(|a| AllocationView::of(&a.to_object()))
            .collect()
    };
    // Machines' claims hold addresses of the pool too: their `IPAddress`es.
    for address in state.ctx.capi.addresses.state() {
        if address.spec.pool_ref.kipam_pool() != Some(name.as_str()) {
            continue;
        }
        let claim = state.ctx.capi.claims.get(
            &kube::runtime::reflector::ObjectRef::new(&address.spec.claim_ref.name)
                .within(address.metadata.namespace.as_deref().unwrap_or_default()),
        );
        let prefix = address
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::resources::LABEL_DATACENTER))
            .and_then(|dc| pool.spec.datacenters.get(dc))
            .is_some_and(|d| d.type_ == crate::resources::AllocationType::Prefix);
        list.extend(AllocationView::of_claim(&address, claim.as_deref(), prefix));
    }
    list.sort_by(|a, b| (&a.datacenter, &a.cluster).cmp(&(&b.datacenter, &b.cluster)));
    Ok(axum::Json(list).into_response())
}

async fn openapi_document(
    State(state): State<Shared>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // No anonymous access, not even to the description.
    state.gate.authenticate(&headers).await?;
    Ok(axum::Json(openapi::document()).into_response())
}
