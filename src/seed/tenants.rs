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
/// An HTTP/1.1 connection left without requests is closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

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
        .pool_idle_timeout(IDLE_TIMEOUT)
        .http2_keep_alive_interval(PING_INTERVAL)
        .http2_keep_alive_timeout(PING_TIMEOUT)
        .http2_keep_alive_while_idle(false)
        // No dynamic table for the response headers the server sends: it would fill with
        // each response's unique headers (`Audit-Id`, `Date`) to 4 KiB per connection, for
        // a saving of a few hundred bytes per response on a connection that mostly streams.
        .http2_header_table_size(0)
        .build(https);
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
