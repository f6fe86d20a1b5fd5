//! The pool web page, served beside the REST API on the same port (`/ui/`), on every
//! replica, read-only.
//!
//! The shell and its two assets are public and carry no data. Everything with data is under
//! `/ui/api/` and admitted like the REST API: a bearer token (TokenReview), then RBAC `list`
//! on `ipampools` and on `ipamallocations` (the page shows every allocation). Answers come
//! from the controller's pool cache and allocation ledger, like the REST API's reads: a page
//! view sends nothing to the API server beyond the (cached) reviews. The figures are built by
//! the pure `crate::page`, which the offline report uses too.
//!
//! The page follows changes by polling [`VERSION`] (a few bytes) every two seconds and
//! fetching again only when the version moved.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get};
use serde::Deserialize;
use tokio::sync::watch;

use crate::page::{Holding, html, view};
use crate::resources::IPAMPoolRecord;
use crate::seed::Context;
use crate::seed::ledger::Entry;

use super::auth::Access;
use super::error::ApiError;
use super::{ApiState, Shared};

pub const ROOT: &str = "/ui";
pub const INDEX: &str = "/ui/";
pub const APP_JS: &str = "/ui/app.js";
pub const APP_CSS: &str = "/ui/app.css";
pub const SUMMARY: &str = "/ui/api/summary";
pub const DETAIL: &str = "/ui/api/pools/{ipampool_name}/datacenters/{datacenter}";
pub const VERSION: &str = "/ui/api/version";

/// Pools per page of the list, by default and at most.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 200;

/// The page's routes (served by [`super::router`] with the API's limits).
pub fn routes() -> Vec<(&'static str, MethodRouter<Shared>)> {
    vec![
        (
            ROOT,
            get(|| async { axum::response::Redirect::permanent(INDEX) }),
        ),
        (INDEX, get(index)),
        (APP_JS, get(app_js)),
        (APP_CSS, get(app_css)),
        (SUMMARY, get(summary)),
        (DETAIL, get(detail)),
        (VERSION, get(version)),
    ]
}

/// The page's routes with their security headers.
pub fn router() -> Router<Shared> {
    let mut router = Router::new();
    for (path, method_router) in routes() {
        router = router.route(path, method_router);
    }
    router.layer(middleware::from_fn(headers))
}

/// Every answer under `/ui`: a strict policy (no inline script or style, nothing from
/// elsewhere), no sniffing, no referrer, and data never cached.
async fn headers(req: Request, next: Next) -> Response {
    let data = req.uri().path().starts_with("/ui/api/");
    let mut response = next.run(req).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(html::SERVED_CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(if data { "no-store" } else { "no-cache" }),
    );
    response
}

/// What tells the page that something changed: ticks of the ledger seen by any poller.
pub struct Live {
    ledger: std::sync::Mutex<watch::Receiver<bool>>,
    ticks: AtomicU64,
}

impl Live {
    pub fn new(ctx: &Context) -> Live {
        Live {
            ledger: std::sync::Mutex::new(ctx.ledger_updates.subscribe()),
            ticks: AtomicU64::new(0),
        }
    }

    /// Counts the ledger's changes seen since the last call (at least one tick for any).
    fn tick(&self) -> u64 {
        let mut rx = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        if rx.has_changed().unwrap_or(false) {
            rx.borrow_and_update();
            self.ticks.fetch_add(1, Ordering::Relaxed);
        }
        self.ticks.load(Ordering::Relaxed)
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn index() -> Response {
    static SHELL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let body = SHELL.get_or_init(html::served).clone();
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", html::APP_JS)
}

async fn app_css() -> Response {
    asset("text/css; charset=utf-8", html::APP_CSS)
}

/// What the page needs to be allowed: the pools and the allocations they hold.
fn page_access() -> [Access; 2] {
    [
        Access {
            verb: "list",
            resource: "ipampools",
            name: None,
        },
        Access {
            verb: "list",
            resource: "ipamallocations",
            name: None,
        },
    ]
}

/// Authenticates and authorises a page request, then waits for the caches.
pub(super) async fn admit_page(state: &ApiState, headers: &HeaderMap) -> Result<(), ApiError> {
    super::admit(state, headers, &state.seed_name, &page_access()).await?;
    super::caches_ready(&state.ctx).await
}

fn holding(e: &Entry) -> Holding {
    Holding::of(e.namespace(), e.name(), e.spec(), e.status())
}

#[derive(Deserialize)]
struct SummaryParams {
    #[serde(default)]
    offset: usize,
    limit: Option<usize>,
    #[serde(default)]
    filter: String,
}

async fn summary(
    State(state): State<Shared>,
    params: Result<Query<SummaryParams>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit_page(&state, &headers).await?;
    let Query(params) =
        params.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let mut pools = state.ctx.pools.state();
    pools.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let datacenters = pools.iter().map(|p| p.spec.datacenters.len()).sum();
    let attention_pools: Vec<view::PoolAttention> = pools
        .iter()
        .filter_map(|p| {
            let conditions = view::notable_conditions(p);
            (!conditions.is_empty()).then(|| view::PoolAttention {
                pool: p.metadata.name.clone().unwrap_or_default(),
                conditions,
            })
        })
        .collect();
    let filter = params.filter.trim();
    let matched: Vec<_> = pools
        .iter()
        .filter(|p| p.metadata.name.as_deref().unwrap_or("").contains(filter))
        .collect();
    let shown: Vec<_> = matched
        .iter()
        .skip(params.offset)
        .take(limit)
        .copied()
        .collect();
    let (entries, attention_entries, allocations) = {
        let ledger = state.ctx.ledger.lock().await;
        let entries: Vec<Vec<Arc<Entry>>> = shown
            .iter()
            .map(|p| ledger.in_pool(p.metadata.name.as_deref().unwrap_or("")))
            .collect();
        (entries, ledger.snapshot(), ledger.len())
    };
    let mut attention = Vec::new();
    let mut attention_count = 0;
    for e in &attention_entries {
        if matches!(
            e.phase(),
            crate::resources::AllocationPhase::Failed | crate::resources::AllocationPhase::Conflict
        ) {
            attention_count += 1;
            if attention.len() < view::MAX_ATTENTION {
                attention.push(view::HolderView::of(&holding(e), false));
            }
        }
    }
    drop(attention_entries);
    // The records once, by pool (the quarantine of the pools shown).
    let records = state
        .ctx
        .record_view
        .listed()
        .then(|| state.ctx.record_view.store.state());
    let mut by_pool: std::collections::HashMap<&str, Vec<Arc<IPAMPoolRecord>>> = Default::default();
    for r in records.iter().flatten() {
        by_pool
            .entry(r.spec.pool.as_str())
            .or_default()
            .push(r.clone());
    }
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let summaries = shown
        .iter()
        .zip(&entries)
        .map(|(pool, entries)| {
            let mut holdings: Vec<Holding> = entries.iter().map(|e| holding(e)).collect();
            holdings.extend(super::claim_holdings(&state.ctx, pool));
            let mine = records.as_ref().map(|_| {
                by_pool
                    .get(pool.metadata.name.as_deref().unwrap_or(""))
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
            });
            let dcs = super::page_dcs_with(pool, mine, now);
            view::pool_summary(pool, &dcs, &holdings)
        })
        .collect();
    // Adoption, from the Clusters' statuses in this replica's cache; those needing a look
    // count among what needs a look.
    let clusters = state.ctx.clusters.state();
    let adoption = crate::page::adoption::page(clusters.iter().map(|c| &**c));
    let adoption_attention = adoption.as_ref().map_or(0, |a| a.summary.needs_look.len());
    let body = view::Summary {
        seed: state.seed_name.clone(),
        totals: view::Totals {
            pools: pools.len(),
            datacenters,
            allocations,
            attention: attention_count + attention_pools.len() + adoption_attention,
        },
        attention,
        attention_pools,
        pools: summaries,
        adoption,
        matched: matched.len(),
        offset: params.offset,
        limit,
    };
    Ok(axum::Json(body).into_response())
}

#[derive(Deserialize)]
struct DetailParams {
    from: Option<String>,
    to: Option<String>,
}

async fn detail(
    State(state): State<Shared>,
    path: Result<Path<(String, String)>, PathRejection>,
    params: Result<Query<DetailParams>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    admit_page(&state, &headers).await?;
    let Path((name, dc)) = path.map_err(super::path_error)?;
    let Query(params) =
        params.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    let pool = super::cached_pool(&state.ctx, &name).ok_or_else(|| super::not_found(&name))?;
    let pool_dc = super::page_dcs(&state.ctx, &pool)
        .into_iter()
        .find(|d| d.datacenter == dc)
        .ok_or_else(|| {
            ApiError::not_found(format!("ipampool {name:?} has no datacenter {dc:?}"))
        })?;
    let entries = state.ctx.ledger.lock().await.in_pool(&name);
    let mut holdings: Vec<Holding> = entries
        .iter()
        .filter(|e| e.spec().dc == dc)
        .map(|e| holding(e))
        .collect();
    drop(entries);
    holdings.extend(
        super::claim_holdings(&state.ctx, &pool)
            .into_iter()
            .filter(|h| h.datacenter == dc),
    );
    let refs: Vec<&Holding> = holdings.iter().collect();
    let slice = match (&params.from, &params.to, pool_dc.cidr) {
        (None, None, _) => None,
        (Some(from), Some(to), Some(cidr)) => {
            Some(view::parse_slice(cidr.family(), from, to).map_err(ApiError::bad_request)?)
        }
        (Some(_), Some(_), None) => None,
        _ => {
            return Err(ApiError::bad_request(
                "from, to: give both ends of the slice, or neither",
            ));
        }
    };
    let (detail, _) = view::detail(&pool_dc, &refs, slice, view::notable_conditions(&pool))
        .map_err(|e| match e {
            view::DetailError::Slice(e) => ApiError::bad_request(format!("from, to: {e}")),
            e => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        })?;
    Ok(axum::Json(detail).into_response())
}

async fn version(State(state): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    admit_page(&state, &headers).await?;
    let ticks = state.live.tick();
    // Any change of a pool (spec or status) or of a pool record moves its resourceVersion.
    // The caches have no order: objects are combined so that order does not matter.
    let (mut mix, mut sum, mut count) = (0u64, 0u64, 0u64);
    for pool in state.ctx.pools.state() {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        pool.metadata.name.hash(&mut hasher);
        pool.metadata.resource_version.hash(&mut hasher);
        let h = hasher.finish();
        mix ^= h;
        sum = sum.wrapping_add(h);
        count += 1;
    }
    // The records too: the quarantine the page shows changes with them.
    for record in state.ctx.record_view.store.state() {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        record.metadata.name.hash(&mut hasher);
        record.metadata.resource_version.hash(&mut hasher);
        let h = hasher.finish();
        mix ^= h.rotate_left(1);
        sum = sum.wrapping_add(h.rotate_left(1));
        count += 1;
    }
    // And the Clusters whose adoption the page shows: their status moves their version.
    for cluster in state.ctx.clusters.state() {
        if cluster.status.as_ref().is_none_or(|s| s.adoption.is_none()) {
            continue;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        cluster.metadata.name.hash(&mut hasher);
        cluster.metadata.resource_version.hash(&mut hasher);
        let h = hasher.finish();
        mix ^= h.rotate_left(2);
        sum = sum.wrapping_add(h.rotate_left(2));
        count += 1;
    }
    let version = format!("{ticks}-{count}-{mix:016x}{sum:016x}");
    Ok(axum::Json(serde_json::json!({ "version": version })).into_response())
}
