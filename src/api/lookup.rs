//! `GET /api/v2/seeds/{seed}/addresses/{address}` (and `…/{address}/{prefix_length}` for a
//! CIDR written with its slash): who holds an address or a CIDR, in which pool and
//! datacenter, or that it is free or excluded. Answered from the pool cache and the ledger,
//! by the pure `crate::page::lookup`; the web page's search box calls it too.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::page::lookup::{Query, answer};
use crate::page::{self, Holding, view};
use crate::seed::Context;

use super::auth::Access;
use super::error::ApiError;
use super::{ApiState, Shared};

fn access() -> [Access; 2] {
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

pub(super) async fn by_address(
    State(state): State<Shared>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path((seed, address)) = path.map_err(super::path_error)?;
    respond(&state, &headers, &seed, &address).await
}

pub(super) async fn by_cidr(
    State(state): State<Shared>,
    path: Result<Path<(String, String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path((seed, address, length)) = path.map_err(super::path_error)?;
    respond(&state, &headers, &seed, &format!("{address}/{length}")).await
}

async fn respond(
    state: &ApiState,
    headers: &HeaderMap,
    seed: &str,
    text: &str,
) -> Result<Response, ApiError> {
    super::admit(state, headers, seed, &access()).await?;
    let query = Query::parse(text).map_err(ApiError::bad_request)?;
    super::caches_ready(&state.ctx).await?;
    let body = lookup(&state.ctx, &query).await;
    let mut response = axum::Json(body).into_response();
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    Ok(response)
}

/// The answer from the caches: the pool datacenters one of whose CIDRs meets the query
/// (their CIDRs alone are parsed for the others), then the holdings of those only. The
/// quarantine comes from the pool records this replica watches (former holder, and until
/// when); before that watch has listed it is known only as the count of the pool status,
/// and an address held by nobody in a pool datacenter with quarantined addresses is
/// answered `unheld`, never `free`.
pub async fn lookup(ctx: &Context, query: &Query) -> view::LookupView {
    let mut candidates = Vec::new();
    for pool in ctx.pools.state() {
        let meets: Vec<&String> = pool
            .spec
            .datacenters
            .iter()
            .filter(|(_, spec)| page::cidrs_of(spec).iter().any(|c| query.meets(c)))
            .map(|(dc, _)| dc)
            .collect();
        if meets.is_empty() {
            continue;
        }
        candidates.extend(
            super::page_dcs(ctx, &pool)
                .into_iter()
                .filter(|d| meets.contains(&&d.datacenter)),
        );
    }
    candidates.sort_by(|a, b| (&a.pool, &a.datacenter).cmp(&(&b.pool, &b.datacenter)));
    let entries = {
        let ledger = ctx.ledger.lock().await;
        let mut pools: Vec<&str> = candidates.iter().map(|c| c.pool.as_str()).collect();
        pools.dedup();
        pools
            .into_iter()
            .map(|p| (p.to_string(), ledger.in_pool(p)))
            .collect::<Vec<_>>()
    };
    // Machines' claims hold addresses of the pools too (their `IPAddress`es).
    let claims: Vec<Holding> = ctx
        .pools
        .state()
        .iter()
        .filter(|p| {
            candidates
                .iter()
                .any(|c| Some(c.pool.as_str()) == p.metadata.name.as_deref())
        })
        .flat_map(|p| super::claim_holdings(ctx, p))
        .collect();
    let holdings: Vec<Vec<Holding>> = candidates
        .iter()
        .map(|c| {
            entries
                .iter()
                .filter(|(p, _)| *p == c.pool)
                .flat_map(|(_, list)| list.iter())
                .filter(|e| e.spec().dc == c.datacenter)
                .map(|e| Holding::of(e.namespace(), e.name(), e.spec(), e.status()))
                .chain(
                    claims
                        .iter()
                        .filter(|h| h.pool == c.pool && h.datacenter == c.datacenter)
                        .cloned(),
                )
                .collect()
        })
        .collect();
    let refs: Vec<Vec<&Holding>> = holdings.iter().map(|h| h.iter().collect()).collect();
    let matches: Vec<_> = candidates
        .iter()
        .zip(&refs)
        .filter_map(|(c, h)| answer(query, c, h))
        .collect();
    view::lookup_view(query, &matches)
}
