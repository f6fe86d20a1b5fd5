//! An in-process stand-in for the Kubernetes API server, for tests only.
//!
//! [`ApiServer::start`] binds `127.0.0.1:0` and serves the real HTTP protocol (discovery,
//! CRUD, the four patch formats, status subresources, finalizers, garbage collection and
//! watch) from memory, so that real clients — kube-rs, or the `kipam` binary pointed at the
//! kubeconfig from [`ApiServer::write_kubeconfig`] — can run against it. Several instances can
//! run in one process. See `README.md` next to this crate for what differs from a real server.

mod admission;
mod cel;
mod discovery;
mod error;
mod http;
pub mod https;
pub mod metallb;
mod ownerrefs;
mod patch;
mod rbac;
mod resources;
mod reviews;
mod schema;
mod selectors;
mod serve_tls;
mod store;
mod util;
mod watch;
mod writes;

pub use error::ApiError;
pub use metallb::MetalLbModel;
pub use resources::ResourceType;
pub use reviews::{AccessRequest, NonResourceAttributes, ResourceAttributes, UserInfo};
pub use selectors::{FieldSelector, LabelSelector};
pub use serve_tls::Connections;
pub use writes::WriteModel;

use reviews::{AccessReviewFn, TokenReviewFn};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use store::{DeleteOptions, Shown, Store, Target, WriteOptions};

/// Request counters: the total and a count per `(verb, resource)`.
///
/// Verbs are the Kubernetes ones: `get`, `list`, `watch`, `create`, `update`, `patch`,
/// `delete`, `deletecollection`. The resource is the plural, with `/status` for the status
/// subresource (`"ipampools/status"`). Requests outside resources (discovery, `/version`) are
/// counted under the lowercase HTTP method and the path (`("get", "/apis")`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub total: u64,
    pub by_request: BTreeMap<(String, String), u64>,
    /// Requests being served now, per `(verb, resource)` (from arrival, the latency included,
    /// to the response's headers: a watch counts only until its stream starts).
    pub in_flight: BTreeMap<(String, String), u64>,
    /// The most requests per `(verb, resource)` that were being served at once.
    pub most_at_once: BTreeMap<(String, String), u64>,
}

impl Stats {
    /// The most requests with this verb and resource that were being served at once.
    pub fn most_at_once(&self, verb: &str, resource: &str) -> u64 {
        self.most_at_once
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests with this verb and resource.
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.by_request
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Requests with this verb, any resource.
    pub fn verb(&self, verb: &str) -> u64 {
        self.by_request
            .iter()
            .filter(|((v, _), _)| v == verb)
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests for this resource (`"clusters"` or `"clusters/status"`), any verb.
    pub fn resource(&self, resource: &str) -> u64 {
        self.by_request
            .iter()
            .filter(|((_, r), _)| r == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// Writes of any kind: create, update, patch, delete, deletecollection.
    pub fn writes(&self) -> u64 {
        ["create", "update", "patch", "delete", "deletecollection"]
            .iter()
            .map(|v| self.verb(v))
            .sum()
    }
}

struct Injection {
    verb: String,
    resource: String,
    remaining: usize,
    status: u16,
}

/// Something to do once, right after a GET of one object has been answered (see
/// [`ApiServer::after_next_get`]).
pub(crate) struct GetHook {
    group: String,
    plural: String,
    namespace: Option<String>,
    name: String,
    action: Box<dyn FnOnce() + Send>,
}

/// Behaviour a test controls: scripted reviews, failures, latency, counters.
/// One permission RBAC granted: who, the verb, and the resource (group, plural with
/// `/subresource`) or, for a URL that is no resource, its path in `resource` and an empty
/// `group`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Granted {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
}

pub(crate) struct Control {
    pub stats: Stats,
    pub token_review: TokenReviewFn,
    pub access_review: AccessReviewFn,
    pub require_auth: bool,
    /// Requests and access reviews are decided by the stored RBAC objects.
    pub rbac: bool,
    /// The `OwnerReferencesPermissionEnforcement` admission plugin is on.
    pub owner_references_enforcement: bool,
    /// Tokens known besides the scripted token review (service accounts, users).
    pub tokens: BTreeMap<String, UserInfo>,
    /// Every request refused by authentication, authorisation or the owner-reference plugin.
    pub refusals: Vec<String>,
    /// Every distinct permission RBAC granted (`ApiServer::granted`).
    pub granted: BTreeSet<Granted>,
    pub latency: Duration,
    /// What writes cost, when a model is on (`ApiServer::set_write_model`).
    pub writes: Option<Arc<writes::WriteGate>>,
    pub bookmark_interval: Duration,
    pub watch_delay: Duration,
    injections: Vec<Injection>,
    get_hooks: Vec<GetHook>,
}

impl Control {
    /// Consumes one injected failure matching the request, if any.
    pub(crate) fn take_failure(&mut self, verb: &str, resource: &str) -> Option<u16> {
        let hit = self.injections.iter_mut().find(|i| {
            i.remaining > 0
                && (i.verb == "*" || i.verb == verb)
                && (i.resource == "*" || i.resource == resource)
        })?;
        hit.remaining -= 1;
        let status = hit.status;
        self.injections.retain(|i| i.remaining > 0);
        Some(status)
    }

    /// Takes the first hook waiting for a GET of this object, if any.
    pub(crate) fn take_get_hook(
        &mut self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<Box<dyn FnOnce() + Send>> {
        let at = self.get_hooks.iter().position(|h| {
            h.group == group
                && h.plural == plural
                && h.namespace.as_deref() == namespace
                && h.name == name
        })?;
        Some(self.get_hooks.remove(at).action)
    }
}

/// State shared by the HTTP handlers and the handle.
pub(crate) struct Shared {
    pub store: Mutex<Store>,
    pub control: Mutex<Control>,
    pub shutdown: tokio::sync::watch::Sender<bool>,
    pub addr: SocketAddr,
}

impl Shared {
    /// Locks the store; a panic elsewhere while holding it does not make it unusable.
    pub(crate) fn lock_store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn control_lock(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Handle {
    shared: Arc<Shared>,
    token: String,
    name: String,
    /// Served over TLS ([`ApiServer::start_tls`]): the CA's PEM and the connections counted.
    tls: Option<(String, Arc<Connections>)>,
    /// The path this instance is served under (one of a fleet, [`ApiServer::start_tls_fleet`]).
    prefix: String,
}

impl Drop for Handle {
    fn drop(&mut self) {
        stop(&self.shared);
    }
}

fn stop(shared: &Shared) {
    shared.shutdown.send_replace(true);
    shared.lock_store().drop_subscribers();
    // A hook may hold a clone of the server: dropping the ones never run breaks that cycle.
    let hooks = std::mem::take(&mut shared.control_lock().get_hooks);
    drop(hooks);
}

/// A fresh instance's state at `addr`: its store (with the admin token) and controls, and the
/// receiver its server watches for shutdown.
fn new_shared(addr: SocketAddr) -> (Arc<Shared>, String, tokio::sync::watch::Receiver<bool>) {
    let mut store = Store::new();
    let token = store.ids().token();
    let admin_token = token.clone();
    let control = Control {
        stats: Stats::default(),
        token_review: Arc::new(move |t: &str| {
            (t == admin_token)
                .then(|| UserInfo::new("system:admin").with_groups(&["system:masters"]))
        }),
        access_review: Arc::new(|_: &AccessRequest| true),
        require_auth: false,
        rbac: false,
        owner_references_enforcement: false,
        tokens: BTreeMap::new(),
        refusals: Vec::new(),
        granted: BTreeSet::new(),
        latency: Duration::ZERO,
        writes: None,
        bookmark_interval: Duration::from_secs(5),
        watch_delay: Duration::ZERO,
        injections: Vec::new(),
        get_hooks: Vec::new(),
    };
    let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
    let shared = Arc::new(Shared {
        store: Mutex::new(store),
        control: Mutex::new(control),
        shutdown,
        addr,
    });
    (shared, token, shutdown_rx)
}

/// A running stand-in API server. Cheap to clone; it stops when [`ApiServer::shutdown`] is
/// called or the last clone is dropped.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Handle>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url())
            .finish()
    }
}

/// Splits a multi-document YAML string into JSON values, skipping empty documents.
fn yaml_documents(yaml: &str) -> Result<Vec<Value>, ApiError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

impl ApiServer {
    /// Binds `127.0.0.1:0` and starts serving in a task of the current tokio runtime.
    ///
    /// The instance starts with the namespaces `default`, `kube-system`, `kube-public` and
    /// `kube-node-lease`. Its kubeconfig carries a random bearer token; by default every
    /// request is served whatever its token, and `TokenReview`s authenticate exactly that token
    /// (as `system:admin` in `system:masters`), while `SubjectAccessReview`s allow everything.
    pub async fn start() -> std::io::Result<ApiServer> {
        Self::start_serving(false).await
    }

    /// Like [`ApiServer::start`], but served over TLS with ALPN offering HTTP/2 and HTTP/1.1,
    /// as a real API server is: an HTTP/2 client multiplexes every request and watch over one
    /// connection. The kubeconfig carries the CA; [`ApiServer::connections`] counts the
    /// connections.
    pub async fn start_tls() -> std::io::Result<ApiServer> {
        Self::start_serving(true).await
    }

    async fn start_serving(tls: bool) -> std::io::Result<ApiServer> {
        let tls = match tls {
            true => Some((
                serve_tls::ca_pem().map_err(std::io::Error::other)?,
                Arc::new(Connections::default()),
            )),
            false => None,
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (shared, token, mut shutdown_rx) = new_shared(addr);
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        match &tls {
            Some((_, connections)) => {
                tokio::spawn(serve_tls::serve(
                    listener,
                    app,
                    connections.clone(),
                    shutdown_rx,
                ));
            }
            None => {
                tokio::spawn(async move {
                    let stopped = async move {
                        let _ = shutdown_rx.wait_for(|v| *v).await;
                    };
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(stopped)
                        .await;
                });
            }
        }
        Ok(ApiServer {
            inner: Arc::new(Handle {
                shared,
                token,
                name: format!("standin-{}", addr.port()),
                tls,
                prefix: String::new(),
            }),
        })
    }

    /// `n` instances behind one TLS listener (as [`ApiServer::start_tls`]), each served under
    /// its own path, `https://127.0.0.1:PORT/clusters/<i>` (kubeconfigs carry it; clients
    /// prefix every request with it, as they do behind a multi-cluster proxy). For benchmarks
    /// with more user clusters than a process may hold listening sockets. They share one count
    /// of connections; each stops on its own, and the listener when all have.
    pub async fn start_tls_fleet(n: usize) -> std::io::Result<Vec<ApiServer>> {
        let ca = serve_tls::ca_pem().map_err(std::io::Error::other)?;
        let connections = Arc::new(Connections::default());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let mut members = Vec::with_capacity(n);
        let mut stops = Vec::with_capacity(n);
        for i in 0..n {
            let (shared, token, stop) = new_shared(addr);
            stops.push(stop);
            members.push(ApiServer {
                inner: Arc::new(Handle {
                    shared,
                    token,
                    name: format!("standin-{}-{i}", addr.port()),
                    tls: Some((ca.clone(), connections.clone())),
                    prefix: format!("/clusters/{i}"),
                }),
            });
        }
        let shareds: Arc<Vec<Arc<Shared>>> =
            Arc::new(members.iter().map(|m| m.inner.shared.clone()).collect());
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let shareds = shareds.clone();
            async move { http::handle_member(&shareds, req).await }
        });
        let (fleet_stop, fleet_stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            for mut stop in stops {
                let _ = stop.wait_for(|v| *v).await;
            }
            fleet_stop.send_replace(true);
        });
        tokio::spawn(serve_tls::serve(listener, app, connections, fleet_stopped));
        Ok(members)
    }

    /// Like [`ApiServer::start`], but serves from a runtime on a thread of its own, so that
    /// tests which block their own thread (waiting on a child process, `std::thread::sleep`)
    /// or use a current-thread runtime never starve the server. Callable outside any runtime.
    pub fn start_detached() -> std::io::Result<ApiServer> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("kube-standin".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let server = match ApiServer::start().await {
                        Ok(s) => s,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let mut stopped = server.shared().shutdown.subscribe();
                    // Hand the only handle to the caller; this thread keeps just a receiver.
                    if tx.send(Ok(server)).is_err() {
                        return;
                    }
                    let _ = stopped.wait_for(|v| *v).await;
                    // Give connections a moment to close gracefully before the runtime goes.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                });
            })?;
        rx.recv()
            .map_err(|_| std::io::Error::other("stand-in thread exited before starting"))?
    }

    /// Polls the store until the object exists and `pred` holds for it, or `timeout` passes.
    /// Returns the object that satisfied `pred`.
    pub async fn wait_for(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(o) = self.get(resource, namespace, name).filter(|o| pred(o)) {
                return Some(o);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// `http://127.0.0.1:PORT`, or `https://` when served over TLS.
    pub fn url(&self) -> String {
        let scheme = if self.inner.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}{}", self.shared().addr, self.inner.prefix)
    }

    /// The connections accepted so far (open now, and in total); `None` unless served over
    /// TLS ([`ApiServer::start_tls`]).
    pub fn connections(&self) -> Option<Arc<Connections>> {
        self.inner.tls.as_ref().map(|(_, c)| c.clone())
    }

    /// The bearer token in the kubeconfig.
    pub fn token(&self) -> String {
        self.inner.token.clone()
    }

    /// A kubeconfig whose current context points at this instance with the admin token
    /// (cluster, context and user are named `standin-PORT`).
    pub fn kubeconfig_yaml(&self) -> String {
        self.kubeconfig_yaml_for_token(&self.inner.token)
    }

    /// The same kubeconfig with another bearer token (a second user, for instance; make the
    /// token known with [`ApiServer::set_token_review`]).
    pub fn kubeconfig_yaml_for_token(&self, token: &str) -> String {
        let n = &self.inner.name;
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {n}\n  cluster:\n    server: {url}\n{ca}contexts:\n- name: {n}\n  context:\n    cluster: {n}\n    user: {n}\n    namespace: default\ncurrent-context: {n}\nusers:\n- name: {n}\n  user:\n    token: {token}\npreferences: {{}}\n",
            url = self.url(),
            ca = match &self.inner.tls {
                Some((pem, _)) => format!(
                    "    certificate-authority-data: {}\n",
                    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, pem)
                ),
                None => String::new(),
            },
        )
    }

    /// Writes [`ApiServer::kubeconfig_yaml`] to a file.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    /// A copy of the request counters.
    pub fn stats(&self) -> Stats {
        self.shared().control_lock().stats.clone()
    }

    /// Zeroes the request counters.
    pub fn reset_stats(&self) {
        self.shared().control_lock().stats = Stats::default();
    }

    /// Scripts `TokenReview` answers (and, with [`ApiServer::set_require_auth`], request
    /// authentication): `Some(user)` authenticates the token.
    pub fn set_token_review(&self, f: impl Fn(&str) -> Option<UserInfo> + Send + Sync + 'static) {
        self.shared().control_lock().token_review = Arc::new(f);
    }

    /// Scripts `SubjectAccessReview` answers (and, with [`ApiServer::set_require_auth`],
    /// request authorisation). The default allows everything.
    pub fn set_access_review(&self, f: impl Fn(&AccessRequest) -> bool + Send + Sync + 'static) {
        self.shared().control_lock().access_review = Arc::new(f);
    }

    /// When on, every request must carry a bearer token the token-review function accepts
    /// (else 401) and be allowed by the access-review function (else 403). Off by default.
    pub fn set_require_auth(&self, on: bool) {
        self.shared().control_lock().require_auth = on;
    }

    /// Turns on authorisation by RBAC, as a real API server runs it: from now on every request
    /// must carry a known token (else 401) and be allowed by the `ClusterRole`s, `Role`s and
    /// bindings stored in this instance (else 403 `Forbidden` with the real message), and
    /// `SubjectAccessReview`s are answered the same way. The kubeconfig's token stays the admin
    /// (`system:masters`, allowed everything); other users come from [`ApiServer::add_token`],
    /// [`ApiServer::service_account_token`] or the scripted token review. The bootstrap roles a
    /// real cluster grants every authenticated user (discovery, `/version`, health, self
    /// reviews) are stored as well. Off by default; it cannot be turned off again.
    pub fn enable_rbac(&self) {
        for obj in rbac::bootstrap_objects() {
            // The registry always has the RBAC kinds; a bootstrap object cannot fail to apply.
            let _ = self.apply(&obj);
        }
        let mut c = self.shared().control_lock();
        c.rbac = true;
        c.require_auth = true;
    }

    /// Turns on the `OwnerReferencesPermissionEnforcement` admission plugin (OpenShift and many
    /// hardened clusters run it): a create or update that makes an owner reference
    /// `blockOwnerDeletion: true` needs `update` on the owner's `finalizers` subresource, and an
    /// update that changes owner references at all needs `delete` on the object itself;
    /// otherwise 403 with the real plugin's message. Decisions come from RBAC when it is on
    /// ([`ApiServer::enable_rbac`]), else from the scripted access review.
    pub fn enable_owner_references_permission_enforcement(&self) {
        self.shared().control_lock().owner_references_enforcement = true;
    }

    /// The messages of every request refused so far for want of credentials (401) or
    /// permission (403 by RBAC or the owner-reference plugin), oldest first: a test that runs a
    /// client with exactly the permissions it ships asserts this stays empty.
    pub fn refusals(&self) -> Vec<String> {
        self.shared().control_lock().refusals.clone()
    }

    /// Every distinct permission RBAC has granted so far (requests, the owner-reference
    /// plugin's checks and access reviews alike), each once: with `refusals`, what a client
    /// running with the grants it ships did use, to hold against what it grants.
    pub fn granted(&self) -> BTreeSet<Granted> {
        self.shared().control_lock().granted.clone()
    }

    /// Makes `token` authenticate as `user`, whatever the scripted token review says.
    pub fn add_token(&self, token: &str, user: UserInfo) {
        self.shared()
            .control_lock()
            .tokens
            .insert(token.to_string(), user);
    }

    /// A new token for the service account `namespace/name`: it authenticates as
    /// `system:serviceaccount:<namespace>:<name>` in the groups `system:serviceaccounts`,
    /// `system:serviceaccounts:<namespace>` and `system:authenticated`, as a real projected
    /// token does. (The ServiceAccount object itself is not required.)
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let token = self.shared().lock_store().ids().token();
        let user = UserInfo {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            uid: self.shared().lock_store().ids().uid(),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_string(),
            ],
            extra: BTreeMap::new(),
        };
        self.add_token(&token, user);
        token
    }

    /// Makes the next `count` requests matching `verb` and `resource` (either may be `"*"`)
    /// fail with `status` and a `Status` body, before they reach the store.
    pub fn inject_failures(&self, verb: &str, resource: &str, count: usize, status: u16) {
        if count == 0 {
            return;
        }
        self.shared().control_lock().injections.push(Injection {
            verb: verb.to_string(),
            resource: resource.to_string(),
            remaining: count,
            status,
        });
    }

    /// Runs `action` once, right after the next successful HTTP GET of one object has been
    /// worked out and before its answer is sent: the client holds what it read, and whatever
    /// `action` writes (with the direct-store helpers, through a clone of this server) lands
    /// between that read and the client's next request. This is how a test puts, say, a status
    /// write by another controller between a read-modify-write's read and its write.
    ///
    /// `resource` resolves as in [`ApiServer::resource_type`]; `namespace` is ignored for
    /// cluster-scoped types. Only GETs of the object itself count (not lists, watches or its
    /// `/status`). Hooks that never ran are dropped on [`ApiServer::shutdown`].
    pub fn after_next_get(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        action: impl FnOnce() + Send + 'static,
    ) -> Result<(), ApiError> {
        let t = self.target_named(resource, namespace, name, false)?;
        self.shared().control_lock().get_hooks.push(GetHook {
            group: t.rt.group,
            plural: t.rt.plural,
            namespace: t.namespace,
            name: t.name,
            action: Box::new(action),
        });
        Ok(())
    }

    /// Hooks set with [`ApiServer::after_next_get`] that have not run yet.
    pub fn pending_get_hooks(&self) -> usize {
        self.shared().control_lock().get_hooks.len()
    }

    /// Failures injected but not yet consumed.
    pub fn pending_failures(&self) -> usize {
        self.shared()
            .control_lock()
            .injections
            .iter()
            .map(|i| i.remaining)
            .sum()
    }

    /// Delays every request by `latency` before it is served.
    pub fn set_latency(&self, latency: Duration) {
        self.shared().control_lock().latency = latency;
    }

    /// Gives every write (create, update, patch, delete, deletecollection of a stored
    /// resource) the cost `model` says a real server's has — a service time, and a bounded
    /// number served at once — or none again (`None`, the default). Reads and watches stay
    /// free. See `WriteModel::kube_apiserver_2_cores` and the crate's README.
    pub fn set_write_model(&self, model: Option<WriteModel>) {
        self.shared().control_lock().writes = model.map(|m| Arc::new(writes::WriteGate::new(m)));
    }

    /// The write model in force, if any.
    pub fn write_model(&self) -> Option<WriteModel> {
        self.shared()
            .control_lock()
            .writes
            .as_ref()
            .map(|g| g.model().clone())
    }

    /// How often watches with `allowWatchBookmarks` get a BOOKMARK (default 5 s). Applies to
    /// watches started afterwards.
    pub fn set_bookmark_interval(&self, interval: Duration) {
        self.shared().control_lock().bookmark_interval = interval.max(Duration::from_millis(10));
    }

    /// Delays every change by `delay` on watches started afterwards, as a lagging watch cache
    /// would: clients' informers then act on stale state while reads and writes see the
    /// latest, so conflict handling gets exercised. Zero (the default) turns it off.
    pub fn set_watch_delay(&self, delay: Duration) {
        self.shared().control_lock().watch_delay = delay;
    }

    /// Forgets the change history: a watch resuming from an older resource version gets a
    /// `410 Expired` ERROR event and must list again (as after etcd compaction).
    pub fn compact_history(&self) {
        self.shared().lock_store().compact();
    }

    /// Retains at most `limit` changes for resuming watches (`None`, the default: all).
    pub fn set_history_limit(&self, limit: Option<usize>) {
        self.shared().lock_store().set_history_limit(limit);
    }

    /// Number of changes retained for resuming watches.
    pub fn history_len(&self) -> usize {
        self.shared().lock_store().history_len()
    }

    /// The current resource version (one counter for the whole instance).
    pub fn resource_version(&self) -> u64 {
        self.shared().lock_store().current_rv()
    }

    /// Serves an extra built-in resource type.
    pub fn register_resource(&self, rt: ResourceType) {
        self.shared().lock_store().registry.register(rt);
    }

    /// Resolves a resource name kubectl-style: `plural`, `singular`, `Kind` or short name,
    /// optionally `.group`-qualified (`"ipampools.ipam.kipam.dev"`, `"leases"`, `"cm"`).
    pub fn resource_type(&self, resource: &str) -> Option<ResourceType> {
        self.shared()
            .lock_store()
            .registry
            .resolve(resource)
            .cloned()
    }

    /// An object straight from the store (no request is counted). `resource` is resolved as in
    /// [`ApiServer::resource_type`]; `namespace` is ignored for cluster-scoped types.
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let store = self.shared().lock_store();
        let rt = store.registry.resolve(resource)?.clone();
        let ns = if rt.namespaced { namespace } else { None };
        store.object(&rt, ns, name)
    }

    /// Objects straight from the store, in one namespace or (with `None`) all of them.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        let store = self.shared().lock_store();
        let Some(rt) = store.registry.resolve(resource).cloned() else {
            return Vec::new();
        };
        let ns = if rt.namespaced { namespace } else { None };
        store.objects_of(&rt, ns)
    }

    /// Like [`ApiServer::list`], filtered by a label selector in query syntax.
    pub fn list_selected(
        &self,
        resource: &str,
        namespace: Option<&str>,
        label_selector: &str,
    ) -> Result<Vec<Value>, ApiError> {
        let sel = LabelSelector::parse(label_selector)?;
        Ok(self
            .list(resource, namespace)
            .into_iter()
            .filter(|o| sel.matches(o))
            .collect())
    }

    /// Number of stored objects of all types (system namespaces included).
    pub fn object_count(&self) -> usize {
        self.shared().lock_store().object_count()
    }

    fn target_for(&self, obj: &Value) -> Result<Target, ApiError> {
        let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let rt = self
            .shared()
            .lock_store()
            .registry
            .by_kind(av, kind)
            .cloned()
            .ok_or_else(|| ApiError::new(404, format!("no resource serves {av} {kind}")))?;
        let ns = util::meta_str(obj, "namespace");
        let namespace = match (rt.namespaced, ns.is_empty()) {
            (true, true) => Some("default".to_string()),
            (true, false) => Some(ns.to_string()),
            (false, _) => None,
        };
        Ok(Target {
            name: util::meta_str(obj, "name").to_string(),
            rt,
            namespace,
            status: false,
        })
    }

    /// Server-side applies one object straight into the store (field manager `standin`,
    /// forced), creating it if missing — the quick way to seed CRDs and fixtures. Events are
    /// sent to watchers as for any write; no request is counted.
    pub fn apply(&self, obj: &Value) -> Result<Value, ApiError> {
        let t = self.target_for(obj)?;
        let body = serde_json::to_vec(obj).map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.shared()
            .lock_store()
            .patch(
                &t,
                patch::PatchKind::Apply,
                &body,
                Some("standin"),
                true,
                WriteOptions::default(),
            )
            .map(|(v, _)| v.into_value())
    }

    /// [`ApiServer::apply`] for every document of a (multi-document) YAML string, in order.
    pub fn apply_yaml(&self, yaml: &str) -> Result<Vec<Value>, ApiError> {
        yaml_documents(yaml)?
            .iter()
            .map(|d| self.apply(d))
            .collect()
    }

    /// Creates one object straight in the store (AlreadyExists if present).
    pub fn create(&self, obj: &Value) -> Result<Value, ApiError> {
        let t = self.target_for(obj)?;
        self.shared()
            .lock_store()
            .create(
                &t.rt,
                t.namespace.as_deref(),
                obj.clone(),
                WriteOptions::default(),
            )
            .map(Shown::into_value)
    }

    /// The store target of a named object; `status` selects its status subresource (when the
    /// type has one).
    fn target_named(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        status: bool,
    ) -> Result<Target, ApiError> {
        let rt = self
            .resource_type(resource)
            .ok_or_else(|| ApiError::new(404, format!("unknown resource {resource}")))?;
        Ok(Target {
            namespace: if rt.namespaced {
                namespace.map(str::to_string)
            } else {
                None
            },
            name: name.to_string(),
            status: status && rt.status,
            rt,
        })
    }

    /// Merges `status` into an object's status straight in the store (a JSON merge patch of
    /// `/status`), as a controller would.
    pub fn set_status(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
        status: Value,
    ) -> Result<Value, ApiError> {
        let t = self.target_named(resource, namespace, name, true)?;
        let body = serde_json::to_vec(&serde_json::json!({ "status": status }))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.shared()
            .lock_store()
            .patch(
                &t,
                patch::PatchKind::Merge,
                &body,
                None,
                false,
                WriteOptions::default(),
            )
            .map(|(v, _)| v.into_value())
    }

    /// Deletes an object straight in the store, with the usual finalizer, garbage-collection
    /// and namespace semantics.
    pub fn delete(
        &self,
        resource: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<(), ApiError> {
        let t = self.target_named(resource, namespace, name, false)?;
        self.shared()
            .lock_store()
            .delete(&t, &DeleteOptions::default())
            .map(|_| ())
    }

    /// Stops serving: the listener closes, open watch streams end, and later requests are
    /// refused. Idempotent.
    pub fn shutdown(&self) {
        stop(self.shared());
    }
}
