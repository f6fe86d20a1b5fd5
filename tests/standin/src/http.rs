//! HTTP front: parses Kubernetes API paths, counts requests, applies injected failures,
//! latency and optional authentication, then hands the request to the store, discovery,
//! reviews or watch code.

use crate::Shared;
use crate::admission;
use crate::discovery;
use crate::error::ApiError;
use crate::ownerrefs;
use crate::patch::PatchKind;
use crate::rbac::{self, Decision};
use crate::resources::{Behaviour, ResourceType};
use crate::reviews::{
    self, AccessRequest, AccessReviewKind, NonResourceAttributes, ResourceAttributes, UserInfo,
};
use crate::selectors::Selectors;
use crate::store::{
    DeleteOptions, FieldValidation, Propagation, Shown, Store, Target, WatchFrom, WriteOptions,
};
use crate::watch::{WatchOptions, watch_body};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// A parsed request path.
#[derive(Debug, Clone, PartialEq)]
enum Route {
    Version,
    Health,
    CoreVersions,
    CoreResources(String),
    Groups,
    Group(String),
    GroupResources(String, String),
    Resource(ResourcePath),
    Unknown,
}

#[derive(Debug, Clone, PartialEq)]
struct ResourcePath {
    group: String,
    version: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Route {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    if segs.iter().any(|s| s.is_empty()) && segs.len() > 1 {
        return Route::Unknown;
    }
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz", ..] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["api", v] => Route::CoreResources(v.to_string()),
        ["api", v, rest @ ..] => resource_path("", v, rest),
        ["apis"] => Route::Groups,
        ["apis", g] => Route::Group(g.to_string()),
        ["apis", g, v] => Route::GroupResources(g.to_string(), v.to_string()),
        ["apis", g, v, rest @ ..] => resource_path(g, v, rest),
        _ => Route::Unknown,
    }
}

fn resource_path(group: &str, version: &str, rest: &[&str]) -> Route {
    let rp = |ns: Option<&str>, plural: &str, name: Option<&str>, sub: Option<&str>| {
        Route::Resource(ResourcePath {
            group: group.to_string(),
            version: version.to_string(),
            plural: plural.to_string(),
            namespace: ns.map(str::to_string),
            name: name.map(str::to_string),
            sub: sub.map(str::to_string),
        })
    };
    // `/api/v1/namespaces/{name}/status` and `/finalize` are subresources of a namespace,
    // not a resource called "status" inside it.
    let namespace_sub = group.is_empty()
        && rest.len() == 3
        && rest[0] == "namespaces"
        && matches!(rest[2], "status" | "finalize");
    match rest {
        ["namespaces", ns, plural] if !namespace_sub => rp(Some(ns), plural, None, None),
        ["namespaces", ns, plural, name] => rp(Some(ns), plural, Some(name), None),
        ["namespaces", ns, plural, name, sub] => rp(Some(ns), plural, Some(name), Some(sub)),
        [plural] => rp(None, plural, None, None),
        [plural, name] => rp(None, plural, Some(name), None),
        [plural, name, sub] => rp(None, plural, Some(name), Some(sub)),
        _ => Route::Unknown,
    }
}

fn json_response(code: u16, v: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        // Not `to_string()`: going through `Display` is much slower for large objects.
        // Writing a JSON value into memory cannot fail.
        serde_json::to_string(v).unwrap_or_default(),
    )
        .into_response()
}

/// Adds one `Warning: 299 - "..."` header per warning, as the real server does.
fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - {}", Value::String(w.clone()));
        if let Ok(v) = header::HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

fn error_response(e: &ApiError) -> Response {
    json_response(e.code, &e.to_status())
}

fn not_found_path() -> ApiError {
    let mut e = ApiError::new(404, "the server could not find the requested resource");
    e.details = Some(serde_json::json!({}));
    e
}

/// The real server's answer for a path nothing serves — an API group or version that is not
/// served (a CRD not installed yet), or an unknown resource of a CRD's group: Go's plain-text
/// `404 page not found`, not a `Status`.
fn page_not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        "404 page not found\n",
    )
        .into_response()
}

/// How a path under `/api/{version}` or `/apis/{group}/{version}` that names nothing known is
/// answered: a `Status` where the server itself serves that group/version, else plain text.
fn unserved(shared: &Shared, group: &str, version: &str) -> Response {
    if shared.lock_store().registry.serves_natively(group, version) {
        error_response(&not_found_path())
    } else {
        page_not_found()
    }
}

/// [`unserved`] for a path that did not parse: the group/version its segments name, if any.
fn unknown_path(shared: &Shared, path: &str) -> Response {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", v, ..] => unserved(shared, "", v),
        ["apis", g, v, ..] => unserved(shared, g, v),
        _ => page_not_found(),
    }
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> &str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn bearer(h: &HeaderMap) -> Option<&str> {
    header_str(h, header::AUTHORIZATION)
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

fn truthy(q: &HashMap<String, String>, k: &str) -> bool {
    q.get(k).is_some_and(|v| v == "true" || v == "1")
}

/// The verb and resource a request is counted (and matched for failure injection) under.
fn classify(
    method: &Method,
    route: &Route,
    q: &HashMap<String, String>,
    path: &str,
) -> (String, String) {
    match route {
        Route::Resource(rp) => {
            let verb = match (method.as_str(), rp.name.is_some()) {
                ("GET", true) => "get",
                ("GET", false) if truthy(q, "watch") => "watch",
                ("GET", false) => "list",
                ("POST", _) => "create",
                ("PUT", _) => "update",
                ("PATCH", _) => "patch",
                ("DELETE", true) => "delete",
                ("DELETE", false) => "deletecollection",
                (other, _) => return (other.to_ascii_lowercase(), rp.plural.clone()),
            };
            let resource = match &rp.sub {
                Some(s) => format!("{}/{s}", rp.plural),
                None => rp.plural.clone(),
            };
            (verb.to_string(), resource)
        }
        _ => (method.as_str().to_ascii_lowercase(), path.to_string()),
    }
}

/// The single handler behind every path.
/// One member of a fleet ([`crate::ApiServer::start_tls_fleet`]): the request's path starts
/// with `/clusters/<i>`, which is taken off before the member serves it. Any other path is not
/// found, as a plain-text 404 (what a server answers for a path nothing serves).
pub(crate) async fn handle_member(members: &[Arc<Shared>], req: Request) -> Response {
    let path = req.uri().path();
    let member = path.strip_prefix("/clusters/").and_then(|rest| {
        let (index, tail) = rest.split_once('/').unwrap_or((rest, ""));
        let shared = members.get(index.parse::<usize>().ok()?)?;
        Some((shared.clone(), format!("/{tail}")))
    });
    let Some((shared, tail)) = member else {
        return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    };
    let (mut parts, body) = req.into_parts();
    let rewritten = match parts.uri.query() {
        Some(q) => format!("{tail}?{q}"),
        None => tail,
    };
    match rewritten.parse() {
        Ok(uri) => parts.uri = uri,
        Err(_) => return (StatusCode::BAD_REQUEST, "bad path\n").into_response(),
    }
    handle(State(shared), Request::from_parts(parts, body)).await
}

/// A request being served, counted in [`crate::Stats::in_flight`] until it is dropped.
struct Serving {
    shared: Arc<Shared>,
    key: (String, String),
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut c = match self.shared.control.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        if let Some(n) = c.stats.in_flight.get_mut(&self.key) {
            *n = n.saturating_sub(1);
        }
    }
}

pub(crate) async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query: HashMap<String, String> = axum::extract::Query::try_from_uri(&parts.uri)
        .map(|axum::extract::Query(q)| q)
        .unwrap_or_default();
    let route = parse_path(&path);
    let (verb, resource) = classify(&parts.method, &route, &query, &path);
    let _serving = Serving {
        shared: shared.clone(),
        key: (verb.clone(), resource.clone()),
    };

    let (latency, injected, require_auth, write_gate) = {
        let mut c = match shared.control.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        c.stats.total += 1;
        let key = (verb.clone(), resource.clone());
        *c.stats.by_request.entry(key.clone()).or_default() += 1;
        let now = c.stats.in_flight.entry(key.clone()).or_default();
        *now += 1;
        let now = *now;
        let most = c.stats.most_at_once.entry(key).or_default();
        *most = (*most).max(now);
        let injected = c.take_failure(&verb, &resource);
        (c.latency, injected, c.require_auth, c.writes.clone())
    };
    if latency > Duration::ZERO {
        tokio::time::sleep(latency).await;
    }
    if let Some(code) = injected {
        return error_response(&ApiError::new(
            code,
            format!("injected failure for {verb} {resource}"),
        ));
    }

    let caller = match authenticate(&shared, &parts.headers, require_auth) {
        Ok(c) => c,
        Err(e) => return refused(&shared, &e, &verb, &path),
    };
    if require_auth && let Err(e) = authorize(&shared, &caller, &route, &verb, &path) {
        return refused(&shared, &e, &verb, &path);
    }

    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return error_response(&ApiError::new(413, "request entity too large")),
    };
    let accept = header_str(&parts.headers, header::ACCEPT).to_string();
    let content_type = header_str(&parts.headers, header::CONTENT_TYPE).to_string();

    let result = match &route {
        Route::Version => Ok(json_response(200, &discovery::version())),
        Route::Health => Ok((StatusCode::OK, "ok").into_response()),
        Route::CoreVersions | Route::Groups if discovery::wants_aggregated(&accept) => {
            let doc = {
                let store = shared.lock_store();
                discovery::aggregated(&store.registry, route == Route::CoreVersions)
            };
            Ok((
                StatusCode::OK,
                [(header::CONTENT_TYPE, discovery::AGGREGATED_CONTENT_TYPE)],
                doc.to_string(),
            )
                .into_response())
        }
        Route::CoreVersions => Ok(json_response(
            200,
            &discovery::core_versions(&shared.addr.to_string()),
        )),
        Route::CoreResources(v) => {
            let doc = discovery::resource_list(&shared.lock_store().registry, "", v);
            Ok(doc.map_or_else(page_not_found, |d| json_response(200, &d)))
        }
        Route::Groups => Ok(json_response(
            200,
            &discovery::group_list(&shared.lock_store().registry),
        )),
        Route::Group(g) => {
            let doc = discovery::group(&shared.lock_store().registry, g);
            Ok(doc.map_or_else(page_not_found, |d| json_response(200, &d)))
        }
        Route::GroupResources(g, v) => {
            let doc = discovery::resource_list(&shared.lock_store().registry, g, v);
            Ok(doc.map_or_else(page_not_found, |d| json_response(200, &d)))
        }
        Route::Resource(rp) => {
            // A write that reaches the store costs what the write model says (if one is on):
            // it waits for a slot and its service time, and is applied before the slot is
            // given back.
            let _in_service = match write_gate {
                Some(gate) if is_stored_write(&verb, &resource) => Some(gate.enter().await),
                _ => None,
            };
            let req = ResourceRequest {
                method: &parts.method,
                rp,
                query: &query,
                body: &bytes,
                accept: &accept,
                content_type: &content_type,
                caller,
            };
            handle_admitted(&shared, req).await
        }
        Route::Unknown => Ok(unknown_path(&shared, &path)),
    };
    if let (Ok(response), Route::Resource(rp)) = (&result, &route)
        && verb == "get"
        && rp.sub.is_none()
        && response.status().is_success()
    {
        run_get_hook(&shared, rp);
    }
    result.unwrap_or_else(|e| error_response(&e))
}

/// A write the API server commits to storage: reviews (`tokenreviews`,
/// `subjectaccessreviews`…) are answered without storing anything.
fn is_stored_write(verb: &str, resource: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    ) && !resource.ends_with("reviews")
}

/// Answers a refusal for want of credentials or permission, and keeps its message for
/// `ApiServer::refusals`.
fn refused(shared: &Shared, e: &ApiError, verb: &str, path: &str) -> Response {
    shared
        .control_lock()
        .refusals
        .push(format!("{} {verb} {path}: {}", e.code, e.message));
    error_response(e)
}

/// Runs what a test asked to happen right after this GET (see `ApiServer::after_next_get`),
/// before the answer goes out.
fn run_get_hook(shared: &Shared, rp: &ResourcePath) {
    let Some(name) = rp.name.as_deref() else {
        return;
    };
    let hook =
        shared
            .control_lock()
            .take_get_hook(&rp.group, &rp.plural, rp.namespace.as_deref(), name);
    if let Some(action) = hook {
        action();
    }
}

/// The user a token stands for: a token made known with `add_token` or
/// `service_account_token`, else whatever the scripted token review says.
pub(crate) fn user_of_token(shared: &Shared, token: &str) -> Option<UserInfo> {
    let (known, authn) = {
        let c = shared.control_lock();
        (c.tokens.get(token).cloned(), c.token_review.clone())
    };
    known.or_else(|| authn(token))
}

/// Resolves the caller from the bearer token. Without `require_auth`, unknown or missing
/// tokens are let through (as the admin, or anonymous).
fn authenticate(
    shared: &Shared,
    headers: &HeaderMap,
    require_auth: bool,
) -> Result<Option<UserInfo>, ApiError> {
    let user = bearer(headers).and_then(|t| user_of_token(shared, t));
    if require_auth && user.is_none() {
        return Err(ApiError::new(401, "Unauthorized"));
    }
    Ok(user)
}

/// The authoriser: RBAC over the stored roles when it is on, else the scripted function.
pub(crate) fn decide(shared: &Shared, req: &AccessRequest) -> Decision {
    let (rbac_on, authz) = {
        let c = shared.control_lock();
        (c.rbac, c.access_review.clone())
    };
    if rbac_on {
        let decision = rbac::authorize(&shared.lock_store(), req);
        if decision.allowed {
            let (verb, group, resource) = match (&req.resource, &req.non_resource) {
                (Some(r), _) if r.subresource.is_empty() => {
                    (r.verb.clone(), r.group.clone(), r.resource.clone())
                }
                (Some(r), _) => (
                    r.verb.clone(),
                    r.group.clone(),
                    format!("{}/{}", r.resource, r.subresource),
                ),
                (None, Some(n)) => (n.verb.clone(), String::new(), n.path.clone()),
                (None, None) => (String::new(), String::new(), String::new()),
            };
            shared.control_lock().granted.insert(crate::Granted {
                user: req.user.username.clone(),
                verb,
                group,
                resource,
            });
        }
        return decision;
    }
    Decision {
        allowed: authz(req),
        reason: String::new(),
    }
}

/// A refusal by the authoriser, worded as the real server's: the resource (and object name)
/// refused, who asked, the verb, the resource with its subresource, group and scope, and the
/// authoriser's reason when it gave one.
pub(crate) fn forbidden(req: &AccessRequest, reason: &str) -> ApiError {
    let mut why = rbac::forbidden_message(req);
    if !reason.is_empty() {
        why = format!("{why}: {reason}");
    }
    match &req.resource {
        Some(r) => ApiError::forbidden_on(&r.group, &r.resource, &r.name, &why),
        None => ApiError::forbidden_on("", "", "", &why),
    }
}

fn authorize(
    shared: &Shared,
    caller: &Option<UserInfo>,
    route: &Route,
    verb: &str,
    path: &str,
) -> Result<(), ApiError> {
    let user = caller
        .clone()
        .unwrap_or_else(|| UserInfo::new("system:anonymous"));
    let req = match route {
        Route::Resource(rp) => AccessRequest {
            user,
            resource: Some(ResourceAttributes {
                namespace: rp.namespace.clone().unwrap_or_default(),
                verb: verb.to_string(),
                group: rp.group.clone(),
                version: rp.version.clone(),
                resource: rp.plural.clone(),
                subresource: rp.sub.clone().unwrap_or_default(),
                name: rp.name.clone().unwrap_or_default(),
            }),
            non_resource: None,
        },
        _ => AccessRequest {
            user,
            resource: None,
            non_resource: Some(NonResourceAttributes {
                path: path.to_string(),
                verb: verb.to_string(),
            }),
        },
    };
    let decision = decide(shared, &req);
    if decision.allowed {
        return Ok(());
    }
    Err(forbidden(&req, &decision.reason))
}

struct ResourceRequest<'a> {
    method: &'a Method,
    rp: &'a ResourcePath,
    query: &'a HashMap<String, String>,
    body: &'a Bytes,
    accept: &'a str,
    content_type: &'a str,
    caller: Option<UserInfo>,
}

/// Parses a JSON (or, for convenience, YAML) request body.
fn parse_body(body: &[u8], content_type: &str) -> Result<Value, ApiError> {
    let base = content_type.split(';').next().unwrap_or("").trim();
    match base {
        "" | "application/json" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}"))),
        "application/yaml" | "application/x-yaml" | "text/yaml" => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
            serde_saphyr::from_str(text)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// `application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`.
fn metadata_only(accept: &str) -> (bool, bool) {
    let first = accept.split(',').next().unwrap_or("");
    (
        first.contains("as=PartialObjectMetadata;") || first.ends_with("as=PartialObjectMetadata"),
        first.contains("as=PartialObjectMetadataList"),
    )
}

fn to_partial(obj: &Value) -> Value {
    serde_json::json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": obj.get("metadata").cloned().unwrap_or(serde_json::json!({})),
    })
}

/// One write to the store: what it answers (object, HTTP code).
type Write<'a> = Box<dyn FnOnce(&mut Store) -> Result<(Shown, u16), ApiError> + 'a>;

/// Runs a write under one lock of the store, with the `Warning`s it produced.
fn write_with_warnings(
    shared: &Shared,
    f: Write<'_>,
) -> Result<((Shown, u16), Vec<String>), ApiError> {
    let mut store = shared.lock_store();
    store.take_warnings();
    let result = f(&mut store);
    let warnings = store.take_warnings();
    result.map(|r| (r, warnings))
}

fn handle_resource(shared: &Arc<Shared>, req: ResourceRequest<'_>) -> Result<Response, ApiError> {
    let rp = req.rp;
    let Some(rt) = shared
        .lock_store()
        .registry
        .lookup(&rp.group, &rp.version, &rp.plural)
        .cloned()
    else {
        return Ok(unserved(shared, &rp.group, &rp.version));
    };
    if (!rt.namespaced && rp.namespace.is_some())
        || (rt.namespaced && rp.namespace.is_none() && rp.name.is_some())
    {
        return Err(not_found_path());
    }
    let status = match rp.sub.as_deref() {
        None => false,
        Some("status") if rt.status => true,
        Some(_) => return Err(not_found_path()),
    };
    if rt.behaviour != Behaviour::Stored {
        return handle_review(shared, &rt, req);
    }
    let q = req.query;
    let dry_run = q.get("dryRun").is_some_and(|v| v == "All");
    let opts = WriteOptions {
        dry_run,
        field_validation: FieldValidation::parse(
            q.get("fieldValidation").map(String::as_str).unwrap_or(""),
        )?,
    };
    let write = |f| write_with_warnings(shared, f);
    let ns = rp.namespace.as_deref();
    let (meta_one, meta_list) = metadata_only(req.accept);
    let answer = |code: u16, v: Shown| {
        let v = if meta_one && v.get("kind").and_then(Value::as_str) != Some("Status") {
            to_partial(&v).into()
        } else {
            v
        };
        json_response(code, &v)
    };
    let target = |name: &str| Target {
        rt: rt.clone(),
        namespace: rp.namespace.clone(),
        name: name.to_string(),
        status,
    };
    match (req.method.as_str(), rp.name.as_deref()) {
        ("GET", Some(name)) => {
            let v = shared.lock_store().get(&target(name))?;
            Ok(answer(200, v))
        }
        ("GET", None) => {
            let selectors = Selectors::parse(
                q.get("labelSelector").map(String::as_str),
                q.get("fieldSelector").map(String::as_str),
            )?;
            if truthy(q, "watch") {
                return start_watch(shared, rt, ns, selectors, q, meta_one || meta_list);
            }
            let limit = q.get("limit").and_then(|l| l.parse::<usize>().ok());
            let list = shared.lock_store().list(
                &rt,
                ns,
                &selectors,
                limit,
                q.get("continue").map(String::as_str),
            )?;
            let list = if meta_list {
                let items: Vec<Value> = list["items"]
                    .as_array()
                    .map(|a| a.iter().map(to_partial).collect())
                    .unwrap_or_default();
                serde_json::json!({
                    "apiVersion": "meta.k8s.io/v1",
                    "kind": "PartialObjectMetadataList",
                    "metadata": list["metadata"].clone(),
                    "items": items,
                })
            } else {
                list
            };
            Ok(json_response(200, &list))
        }
        ("POST", None) => {
            if status {
                return Err(ApiError::method_not_allowed(
                    "POST is not supported on this path",
                ));
            }
            let body = parse_body(req.body, req.content_type)?;
            let ((v, code), warnings) = write(Box::new(|s| {
                s.create(&rt, ns, body, opts).map(|v| (v, 201))
            }))?;
            Ok(with_warnings(answer(code, v), &warnings))
        }
        ("PUT", Some(name)) => {
            let body = parse_body(req.body, req.content_type)?;
            let ((v, code), warnings) = write(Box::new(|s| {
                s.update(&target(name), body, opts)
                    .map(|(v, created)| (v, if created { 201 } else { 200 }))
            }))?;
            Ok(with_warnings(answer(code, v), &warnings))
        }
        ("PATCH", Some(name)) => {
            let kind = PatchKind::from_content_type(req.content_type)
                .ok_or_else(|| ApiError::unsupported_media_type(req.content_type))?;
            let ((v, code), warnings) = write(Box::new(|s| {
                s.patch(
                    &target(name),
                    kind,
                    req.body,
                    q.get("fieldManager").map(String::as_str),
                    truthy(q, "force"),
                    opts,
                )
                .map(|(v, created)| (v, if created { 201 } else { 200 }))
            }))?;
            Ok(with_warnings(answer(code, v), &warnings))
        }
        ("DELETE", name) => {
            if status {
                return Err(ApiError::method_not_allowed(
                    "DELETE is not supported on this path",
                ));
            }
            let mut opts = DeleteOptions::from_body(req.body)?;
            if let Some(p) = q.get("propagationPolicy") {
                opts.propagation = Propagation::parse(p)?;
            }
            opts.dry_run |= dry_run;
            match name {
                Some(name) => {
                    let v = shared.lock_store().delete(&target(name), &opts)?;
                    Ok(answer(200, v.into()))
                }
                None => {
                    let selectors = Selectors::parse(
                        q.get("labelSelector").map(String::as_str),
                        q.get("fieldSelector").map(String::as_str),
                    )?;
                    let v = shared
                        .lock_store()
                        .delete_collection(&rt, ns, &selectors, &opts)?;
                    Ok(json_response(200, &v))
                }
            }
        }
        (m, _) => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({m})"
        ))),
    }
}

/// A write passes the validating webhooks that select it before it is stored: the object as
/// it would be stored is worked out with a dry run (so schema and CEL errors come first, as on
/// a real server), the webhooks are called, and only then is the write done for real.
async fn handle_admitted(
    shared: &Arc<Shared>,
    req: ResourceRequest<'_>,
) -> Result<Response, ApiError> {
    let rp = req.rp;
    let operation = match (req.method.as_str(), rp.name.is_some()) {
        ("POST", false) => "CREATE",
        ("PUT" | "PATCH", true) => "UPDATE",
        ("DELETE", true) => "DELETE",
        _ => return handle_resource(shared, req),
    };
    let Some(rt) = shared
        .lock_store()
        .registry
        .lookup(&rp.group, &rp.version, &rp.plural)
        .cloned()
    else {
        return handle_resource(shared, req);
    };
    if rt.behaviour != Behaviour::Stored {
        return handle_resource(shared, req);
    }
    let hooks = admission::matching(shared, &rt, rp.sub.as_deref(), operation);
    let owner_plugin = shared.control_lock().owner_references_enforcement
        && matches!(operation, "CREATE" | "UPDATE");
    if hooks.is_empty() && !owner_plugin {
        return handle_resource(shared, req);
    }
    let ns = if rt.namespaced {
        rp.namespace.as_deref()
    } else {
        None
    };
    let old = rp
        .name
        .as_deref()
        .and_then(|n| shared.lock_store().object(&rt, ns, n));
    // A PUT or apply patch that creates: the owner-reference plugin sees a create; webhooks
    // are not called for it (see README).
    let (operation, hooks) = if operation == "UPDATE" && old.is_none() {
        ("CREATE", Vec::new())
    } else {
        (operation, hooks)
    };
    if (operation != "CREATE" && old.is_none()) || (hooks.is_empty() && !owner_plugin) {
        // Nothing to update or delete: let the store say so.
        return handle_resource(shared, req);
    }
    let object = if operation == "DELETE" {
        None
    } else {
        let mut query = req.query.clone();
        query.insert("dryRun".into(), "All".into());
        let dry = ResourceRequest {
            method: req.method,
            rp,
            query: &query,
            body: req.body,
            accept: "",
            content_type: req.content_type,
            caller: req.caller.clone(),
        };
        let response = handle_resource(shared, dry)?;
        if !response.status().is_success() {
            return Ok(response);
        }
        let bytes = axum::body::to_bytes(response.into_body(), MAX_BODY)
            .await
            .map_err(|e| ApiError::new(500, e.to_string()))?;
        Some(
            serde_json::from_slice::<Value>(&bytes)
                .map_err(|e| ApiError::new(500, e.to_string()))?,
        )
    };
    let name = rp
        .name
        .clone()
        .or_else(|| {
            object
                .as_ref()
                .map(|o| crate::util::meta_str(o, "name").to_string())
        })
        .unwrap_or_default();
    let namespace = if rt.namespaced {
        rp.namespace.clone().or_else(|| {
            object
                .as_ref()
                .map(|o| crate::util::meta_str(o, "namespace").to_string())
        })
    } else {
        None
    };
    let uid = shared.lock_store().ids().uid();
    let attrs = admission::Attributes {
        rt: &rt,
        sub: rp.sub.as_deref(),
        operation,
        namespace: namespace.as_deref(),
        name: &name,
        object,
        old_object: old,
        user: req
            .caller
            .clone()
            .unwrap_or_else(|| UserInfo::new("system:anonymous")),
        dry_run: req.query.get("dryRun").is_some_and(|v| v == "All"),
    };
    if owner_plugin {
        let write = ownerrefs::Write {
            rt: &rt,
            sub: rp.sub.as_deref(),
            operation,
            namespace: namespace.as_deref(),
            name: &name,
            object: attrs.object.as_ref(),
            old_object: attrs.old_object.as_ref(),
            user: &attrs.user,
        };
        if let Err(e) = ownerrefs::check(shared, &write, |r| decide(shared, r)) {
            shared.control_lock().refusals.push(format!(
                "{} {operation} {}: {}",
                e.code, rt.plural, e.message
            ));
            return Err(e);
        }
    }
    if !hooks.is_empty() {
        admission::review(&hooks, &attrs, &uid).await?;
    }
    handle_resource(shared, req)
}

fn handle_review(
    shared: &Arc<Shared>,
    rt: &ResourceType,
    req: ResourceRequest<'_>,
) -> Result<Response, ApiError> {
    if req.method != Method::POST || req.rp.name.is_some() {
        return Err(ApiError::method_not_allowed(format!(
            "{} only support create",
            rt.plural
        )));
    }
    let body = parse_body(req.body, req.content_type)?;
    let authn = |token: &str| user_of_token(shared, token);
    let authz = |req: &AccessRequest| decide(shared, req);
    let v = match (rt.behaviour, rt.plural.as_str()) {
        (Behaviour::TokenReview, _) => reviews::token_review(&body, &authn)?,
        (Behaviour::SubjectAccessReview, "localsubjectaccessreviews") => reviews::access_review(
            &body,
            AccessReviewKind::Local,
            req.rp.namespace.as_deref(),
            None,
            &authz,
        )?,
        (Behaviour::SubjectAccessReview, _) => {
            reviews::access_review(&body, AccessReviewKind::Subject, None, None, &authz)?
        }
        (Behaviour::SelfSubjectAccessReview, _) => reviews::access_review(
            &body,
            AccessReviewKind::SelfReview,
            None,
            req.caller,
            &authz,
        )?,
        (Behaviour::Stored, _) => return Err(not_found_path()),
    };
    Ok(json_response(201, &v))
}

fn start_watch(
    shared: &Arc<Shared>,
    rt: ResourceType,
    ns: Option<&str>,
    selectors: Selectors,
    q: &HashMap<String, String>,
    metadata_only: bool,
) -> Result<Response, ApiError> {
    let rv = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let send_initial = truthy(q, "sendInitialEvents");
    let from = match rv.parse::<u64>() {
        _ if send_initial => WatchFrom::Snapshot,
        _ if rv.is_empty() => WatchFrom::Snapshot,
        Ok(0) => WatchFrom::Snapshot,
        Ok(n) => WatchFrom::After(n),
        Err(_) => {
            return Err(ApiError::bad_request(format!(
                "invalid resource version: {rv:?}"
            )));
        }
    };
    let after = match from {
        WatchFrom::After(n) => n,
        WatchFrom::Snapshot => 0,
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .map(Duration::from_secs);
    let (bookmark_interval, delay) = {
        let c = shared.control_lock();
        (c.bookmark_interval, c.watch_delay)
    };
    let sub = shared.lock_store().subscribe(&rt, ns, from);
    let opts = WatchOptions {
        after,
        selectors,
        bookmarks: truthy(q, "allowWatchBookmarks"),
        send_initial,
        timeout,
        metadata_only,
        bookmark_interval,
        delay,
    };
    let body: Body = watch_body(shared.clone(), rt, sub, opts);
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rp(ns: Option<&str>, plural: &str, name: Option<&str>, sub: Option<&str>) -> Route {
        Route::Resource(ResourcePath {
            group: String::new(),
            version: "v1".into(),
            plural: plural.into(),
            namespace: ns.map(Into::into),
            name: name.map(Into::into),
            sub: sub.map(Into::into),
        })
    }

    #[test]
    fn parses_paths() {
        assert_eq!(
            parse_path("/api/v1/namespaces"),
            rp(None, "namespaces", None, None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a"),
            rp(None, "namespaces", Some("a"), None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/status"),
            rp(None, "namespaces", Some("a"), Some("status"))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/configmaps"),
            rp(Some("a"), "configmaps", None, None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/configmaps/b"),
            rp(Some("a"), "configmaps", Some("b"), None)
        );
        assert_eq!(parse_path("/apis"), Route::Groups);
        assert_eq!(
            parse_path("/apis/x.io/v1"),
            Route::GroupResources("x.io".into(), "v1".into())
        );
        assert_eq!(parse_path("/api/v1//x"), Route::Unknown);
        assert_eq!(parse_path("/nope"), Route::Unknown);
    }
}
