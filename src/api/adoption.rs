//! `GET /api/v2/seeds/{seed}/adoption[?datacenter=<dc>]`: the whole fleet's adoption plan
//! (`spec.adopt`) — per cluster what its user cluster serves, each address's verdict, the
//! hand-made MetalLB pools, the conflicts and what it adopts (or would, in a dry run), with
//! figures over the fleet. Read from the Clusters' `status.adoption` in this replica's cache
//! (the leader's planning pass writes them), by the pure `crate::page::adoption`: any replica
//! answers, and nothing is asked of the user clusters.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::page::adoption;

use super::Shared;
use super::auth::Access;
use super::error::ApiError;

#[derive(Deserialize)]
pub(super) struct Params {
    datacenter: Option<String>,
}

pub(super) async fn fleet(
    State(state): State<Shared>,
    path: Result<Path<String>, PathRejection>,
    params: Result<Query<Params>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Path(seed) = path.map_err(super::path_error)?;
    let access = [Access {
        verb: "list",
        resource: "clusters",
        name: None,
    }];
    super::admit(&state, &headers, &seed, &access).await?;
    let Query(params) =
        params.map_err(|e| ApiError::bad_request(format!("invalid query: {}", e.body_text())))?;
    if params.datacenter.as_deref() == Some("") {
        return Err(ApiError::bad_request(
            "datacenter: \"\": give a datacenter's name, or leave the parameter out for every datacenter",
        ));
    }
    super::caches_ready(&state.ctx).await?;
    let clusters = state.ctx.clusters.state();
    let body = adoption::fleet(clusters.iter().map(|c| &**c), params.datacenter.as_deref());
    Ok(axum::Json(body).into_response())
}
