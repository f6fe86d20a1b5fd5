//! One connection per user cluster.
//!
//! The addon applier (its syncs and its drift watches) and the demand reader all talk to the
//! same user clusters. kube's own client speaks HTTP/1.1 only, where every watch holds a socket
//! of its own: with growth on, that was four connections per user cluster (two drift watches,
//! the Service and Event watches), about 100 KiB of buffers each, plus a fresh connection and
//! TLS handshake for every sync. [`Tenants`] keeps one client per user cluster, shared by every
//! room, built on hyper with HTTP/2 offered through ALPN: against a real API server (which
//! always speaks HTTP/2 over TLS) every request and every watch of that cluster is a stream
//! on one connection. A server that only speaks HTTP/1.1 (a plain-`http://` endpoint, a proxy)
//! still works: the same client then opens a connection per concurrent request, as before.
//!
//! Invariants:
//! - A user cluster's client is rebuilt when its kubeconfig Secret changes (the `source` key:
//!   the Secret's uid, resourceVersion and key), and dropped when kipam stops serving it; a
//!   room that still holds the old one keeps its connection until it lets go.
//! - No socket read timeout (a watch is a long response). Instead every request must see its
//!   response headers within the request timeout, and HTTP/2 PINGs find a connection that went
//!   silent, failing every stream on it, so the watches restart and syncs fail instead of
//!   hanging.
//! - No hidden retries: the rooms decide what to retry, with their own backoff.
//! - One connection attempt at a time: until a request of a client has been answered (and
//!   again after a connection could not be made), its requests go one at a time, so requests
//!   sent at once do not each open a connection ([`OneConnecting`]).
//! - At most [`SECRET_READS`] kubeconfig Secrets are read from the seed at once, whatever the
//!   number of user clusters asked for at the same moment.
//! - One connection from the first contact: a user cluster's client is built and its first
//!   request answered once, whichever rooms ask for it at the same moment (the others wait for
//!   that one and share it), and at most [`PRIMING`] first contacts are in flight at once, so
//!   a burst of thousands of new user clusters does not have their handshakes outrun their
//!   timeouts and their rooms open a second connection each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
use tower::ServiceBuilder;
use tower::timeout::TimeoutLayer;

/// How often an idle HTTP/2 connection is pinged, and how long a ping may go unanswered
/// before the connection counts as dead (client-go pings after 30 s of silence and gives a
/// ping 15 s).
const PING_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// How many new clients may make their first request at once.
const PRIMING: usize = 32;
/// How many kubeconfig Secrets may be read from the seed at once ([`Tenants::secret_read`]).
const SECRET_READS: usize = 16;
/// The waits after a first request that did not reach the server, before it is tried again;
/// after the last, the client is shared anyway.
const PRIME_RETRIES: [Duration; 3] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::ZERO,
];

/// Builds a client for a user cluster from its configuration: HTTP/2 offered over TLS, one
/// connection shared by all its requests and watches, `timeout` to connect and for every
/// response's headers.
pub fn client(config: &Config, timeout: Duration) -> Result<Client, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(timeout));
    http.set_nodelay(true);
    http.set_keepalive(Some(PING_INTERVAL));
    let mut tls = config
        .rustls_client_config()
        .map_err(|e| format!("cannot set up TLS for the user cluster: {e}"))?;
    // No session resumption: the one connection lasts, and a reconnection (rare: the server
    // restarted or stopped answering) may do a full handshake. Keeping sessions cost about
    // 3 KiB per user cluster (its cache, the server's tickets and key-exchange hint).
    tls.resumption = rustls::client::Resumption::disabled();
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone()).map_err(|e| {
                format!("the kubeconfig's tls-server-name {name:?} is not a server name: {e}")
            })?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    // Both versions: ALPN offers h2 first, and HTTP/1.1 stays for servers without it.
    let https = builder.enable_all_versions().wrap_connector(http);
    let hyper: HyperClient<_, Body> = HyperClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        // No idle timeout: hyper dates a shared HTTP/2 connection from when it was made, not
        // from its last use, and dropped it from the pool after that long while watches kept
        // it open, so the next request opened a second connection. Idle HTTP/1.1 connections
        // (a server without HTTP/2) stay until the server closes them, as many as requests
        // were in flight at once.
        .pool_idle_timeout(None)
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(false)
        // No dynamic table for the response headers the server sends: it would fill with
        // each response's unique headers (`Audit-Id`, `Date`) to 4 KiB per connection, for
        // a saving of a few hundred bytes per response on a connection that mostly streams.
        .http2_header_table_size(0)
        .build(https);
    let hyper = OneConnecting::new(hyper);
    let auth = config
        .auth_layer()
        .map_err(|e| format!("cannot use the kubeconfig's credentials: {e}"))?;
    let headers = config
        .extra_headers_layer()
        .map_err(|e| format!("cannot use the kubeconfig's headers: {e}"))?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .layer(headers)
        // Bounds the wait for a response's headers; a watch's body may then last as long as
        // the server keeps it open.
        .layer(TimeoutLayer::new(timeout))
        .service(hyper);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// The user cluster's hyper client, letting one request at a time through while the client
/// has no connection known to work: before the first answer (or after a connection could not
/// be made) the client cannot know the server will speak HTTP/2, and requests sent at once
/// would each open a connection and do a TLS handshake of their own (hyper keeps one of them
/// once HTTP/2 is agreed and closes the others, but each cost both sides a handshake). Once a
/// request is answered, the connection is known and requests go through at once, as streams
/// on it.
#[derive(Clone)]
struct OneConnecting<S> {
    inner: S,
    gate: Arc<Gate>,
}

struct Gate {
    /// A request was answered, and no connection failed since.
    connected: std::sync::atomic::AtomicBool,
    /// The one turn while not connected.
    turn: tokio::sync::Semaphore,
}

impl<S> OneConnecting<S> {
    fn new(inner: S) -> Self {
        OneConnecting {
            inner,
            gate: Arc::new(Gate {
                connected: std::sync::atomic::AtomicBool::new(false),
                turn: tokio::sync::Semaphore::new(1),
            }),
        }
    }
}

impl<S, R, B> tower::Service<R> for OneConnecting<S>
where
    S: tower::Service<R, Response = B, Error = hyper_util::client::legacy::Error>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    R: Send + 'static,
{
    type Response = B;
    type Error = hyper_util::client::legacy::Error;
    type Future = futures::future::BoxFuture<'static, Result<B, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        use std::sync::atomic::Ordering;
        // The clone takes the readiness polled above (the usual swap); hyper's client is
        // always ready.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gate = self.gate.clone();
        Box::pin(async move {
            let turn = if gate.connected.load(Ordering::Acquire) {
                None
            } else {
                // Never closed.
                gate.turn.acquire().await.ok()
            };
            let answer = inner.call(request).await;
            match &answer {
                Ok(_) => gate.connected.store(true, Ordering::Release),
                Err(e) if e.is_connect() => gate.connected.store(false, Ordering::Release),
                Err(_) => {}
            }
            drop(turn);
            answer
        })
    }
}

/// The shared clients, one per user cluster (by Cluster name).
pub struct Tenants {
    clients: Mutex<HashMap<String, (String, Client)>>,
    /// One gate per user cluster whose client is being built: the rooms asking meanwhile
    /// wait for it instead of building one of their own.
    building: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Bounds the first requests in flight ([`PRIMING`]).
    priming: tokio::sync::Semaphore,
    /// Bounds the reads of kubeconfig Secrets from the seed ([`SECRET_READS`]).
    secret_reads: tokio::sync::Semaphore,
}

impl Default for Tenants {
    fn default() -> Self {
        Tenants {
            clients: Mutex::default(),
            building: Mutex::default(),
            priming: tokio::sync::Semaphore::new(PRIMING),
            secret_reads: tokio::sync::Semaphore::new(SECRET_READS),
        }
    }
}

impl Tenants {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Client)>> {
        // Plain data: a panic elsewhere leaves it usable.
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn gate(&self, cluster: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut building = self.building.lock().unwrap_or_else(|e| e.into_inner());
        building.entry(cluster.to_string()).or_default().clone()
    }

    /// The client of `cluster` for the kubeconfig `source`; `build` makes one when there is
    /// none yet or the kubeconfig changed. A new client sends one request (`/version`) and
    /// waits for its answer (bounded by the client's own timeouts) before it is shared, so the
    /// connection is up and HTTP/2 agreed when the requests a sync sends at once arrive;
    /// otherwise each of them opens a connection of its own, and watches started on those
    /// keep them open. Rooms asking for the same cluster meanwhile wait and share it.
    pub async fn client(
        &self,
        cluster: &str,
        source: &str,
        build: impl FnOnce() -> Result<Client, String>,
    ) -> Result<Client, String> {
        if let Some(client) = self.cached(cluster, source) {
            return Ok(client);
        }
        let gate = self.gate(cluster);
        let built = {
            let _building = gate.lock().await;
            match self.cached(cluster, source) {
                // Built by the room that held the gate.
                Some(client) => Ok(client),
                None => self.build(cluster, source, build).await,
            }
        };
        let mut building = self.building.lock().unwrap_or_else(|e| e.into_inner());
        // The map's and this one: nobody else waits on it.
        if Arc::strong_count(&gate) == 2 {
            building.remove(cluster);
        }
        built
    }

    async fn build(
        &self,
        cluster: &str,
        source: &str,
        build: impl FnOnce() -> Result<Client, String>,
    ) -> Result<Client, String> {
        // Built outside the lock (TLS setup reads certificates).
        let client = build()?;
        {
            // Never closed: a permit always comes.
            let _permit = self.priming.acquire().await;
            // Its answer does not matter beyond the connection: an unreachable cluster is said
            // by the request that needed it, with its reason. A first contact that did not
            // reach the server is tried again a little later (a server busy with thousands of
            // handshakes, a moment out of sockets): shared without a connection, the client
            // would have the requests a sync sends at once each open one of their own.
            for wait in PRIME_RETRIES {
                match client.apiserver_version().await {
                    Ok(_) | Err(kube::Error::Api(_)) => break,
                    Err(_) => tokio::time::sleep(wait).await,
                }
            }
        }
        Ok(self.share(cluster, source, client))
    }

    /// A turn to read a kubeconfig Secret from the seed, held for the read. The rooms that
    /// read user clusters start a task per user cluster at once (the demand reader, at
    /// startup or when growth is turned on, one for each of thousands): unbounded, their reads
    /// went out together, and kube's seed client, which speaks HTTP/1.1, opened a connection
    /// for each and kept it idle in its pool for a minute and a half, a socket and its buffers
    /// per user cluster, on top of the user cluster's own connection.
    pub async fn secret_read(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        // Never closed; `None` would only mean no bound.
        self.secret_reads.acquire().await.ok()
    }

    /// Shares `client`, already built for `source`, unless one is shared for it already.
    pub fn share(&self, cluster: &str, source: &str, client: Client) -> Client {
        let mut clients = self.lock();
        match clients.get(cluster) {
            Some((known, shared)) if known == source => shared.clone(),
            _ => {
                clients.insert(cluster.to_string(), (source.to_string(), client.clone()));
                client
            }
        }
    }

    /// The client of `cluster` if one was built for `source`.
    pub fn cached(&self, cluster: &str, source: &str) -> Option<Client> {
        self.lock()
            .get(cluster)
            .filter(|(known, _)| known == source)
            .map(|(_, c)| c.clone())
    }

    /// Forgets every cluster `keep` says no to.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|name, _| keep(name));
    }
}

/// The key a client is kept under: which Secret, which version of it, which key in it.
pub fn source(secret_uid: &str, resource_version: &str, key: &str) -> String {
    format!("{secret_uid}/{resource_version}/{key}")
}

/// A user cluster's client for a stand-in, as the rooms build it (for tests).
#[cfg(test)]
pub(crate) async fn client_of(user: &kube_standin::ApiServer) -> Client {
    use crate::seed::kubeconfig;
    let parsed = kubeconfig::parse(&user.kubeconfig_yaml(), "test").expect("kubeconfig");
    let config = kubeconfig::config(parsed, "test", Duration::from_secs(10))
        .await
        .expect("config");
    client(&config, Duration::from_secs(10)).expect("client")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Namespace;
    use kube::Api;
    use kube::api::ListParams;
    use kube_standin::ApiServer;

    use super::*;

    /// A connection kept busy by a watch is still the one requests use after the pool's idle
    /// time: hyper dates a shared HTTP/2 connection from when it was made, not from its last
    /// use, and with an idle timeout it dropped it from the pool after that long while the
    /// watch kept it open, so the next request opened a second connection (at 10,000 user
    /// clusters, whose first apply took over a minute, 1.6 connections per user cluster).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watched_connection_still_serves_requests_after_the_idle_time() {
        use futures::StreamExt;
        use kube::api::WatchParams;
        let user = ApiServer::start_tls().await.expect("TLS stand-in");
        let connections = user.connections().expect("counted");
        let client = client_of(&user).await;
        let api: Api<Namespace> = Api::all(client.clone());
        let mut watch = api
            .watch(&WatchParams::default().timeout(290), "0")
            .await
            .expect("watch")
            .boxed();
        let kept = tokio::spawn(async move { while watch.next().await.is_some() {} });
        // Longer than the 30 s idle timeout the client had.
        tokio::time::sleep(Duration::from_secs(32)).await;
        api.list(&ListParams::default()).await.expect("list");
        assert_eq!(
            (connections.open(), connections.total()),
            (1, 1),
            "connections (open, opened in all)"
        );
        kept.abort();
    }

    /// Requests sent at once on a client that has no connection yet (its first contact failed,
    /// or its connection was lost) make one connection between them: until one of them is
    /// answered the client cannot know HTTP/2 will be spoken, and each would otherwise open a
    /// connection of its own, kept open by the watches started on it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_sent_at_once_before_the_first_connection_share_one() {
        let user = ApiServer::start_tls().await.expect("TLS stand-in");
        let connections = user.connections().expect("counted");
        connections.delay_handshakes(Duration::from_millis(500));
        let client = client_of(&user).await;
        let requests = (0..6).map(|_| {
            let api: Api<Namespace> = Api::all(client.clone());
            async move {
                api.list(&ListParams::default())
                    .await
                    .map(|l| l.items.len())
            }
        });
        let answers = futures::future::join_all(requests).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(
            (connections.open(), connections.total()),
            (1, 1),
            "connections (open, opened in all)"
        );
    }
}
