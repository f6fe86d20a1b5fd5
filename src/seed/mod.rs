//! The shared core of the running seed: what every adapter of `kipam controller` reads.
//!
//! [`Context`] holds the two clients, the watch caches ([`watches`], the pool records' read-only
//! view among them), the allocation [`ledger`], the leader's copy of the pool [`records`], the [`leader`] state, per-object
//! [`backoff`] and the [`metrics`] registry. The adapters — the planning loop
//! (`crate::planning`), the addon applier, the REST API, the admission webhook — each read
//! it; it knows none of them. `crate::controller` builds it and starts them.

pub mod backoff;
pub mod demand;
pub mod discovered;
pub mod kubeconfig;
pub mod leader;
pub mod ledger;
pub mod metrics;
pub mod preconditions;
pub mod records;
pub mod tenant_watch;
pub mod tenants;
pub mod watches;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::{Client, Config};
use tokio::sync::{Mutex, Notify, watch};

use crate::resources::{Cluster, IPAMPool};
use leader::LeaderState;
use ledger::Ledger;
use metrics::Metrics;

/// Why the seed's clients cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot load the kubeconfig: {0}")]
    Config(String),
    #[error("cannot reach the API server: {0}")]
    Client(#[from] kube::Error),
}

/// What changed since the last pass, as far as the watches can say: the clusters whose
/// planned content changed by name, and whether anything else did (a pool, a namespace, a
/// deletion, a re-list, a watch error). A pass takes it before it reads the caches, so a
/// change made while the pass runs is left for the next one.
#[derive(Debug, Default)]
pub struct Dirty {
    inner: std::sync::Mutex<(std::collections::BTreeSet<String>, bool)>,
    /// Wakes the planning loop (set once the loop exists).
    wake: std::sync::OnceLock<Arc<Notify>>,
}

impl Dirty {
    /// Lets [`Dirty::wake`] wake the planning loop through `notify`.
    pub fn set_wake(&self, notify: Arc<Notify>) {
        let _ = self.wake.set(notify);
    }

    /// Wakes the planning loop (for work that finished outside a pass).
    pub fn wake(&self) {
        if let Some(n) = self.wake.get() {
            n.notify_one();
        }
    }

    /// `name`'s planned content changed.
    pub fn cluster(&self, name: String) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.0.insert(name);
    }

    /// Something changed that only a look at everything can place.
    pub fn other(&self) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.1 = true;
    }

    /// Takes what changed: (clusters, anything else).
    pub fn take(&self) -> (std::collections::BTreeSet<String>, bool) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *inner)
    }
}

/// Timeout of every request the controller sends (watches excepted).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the planning pass and the watch tasks share.
pub struct Context {
    /// For watches (long polls).
    pub client: Client,
    /// For everything else: a timeout on every request and no hidden retries, so a write is
    /// never sent again behind the planner's back after the lease moved on.
    pub writer: Client,
    pub pools: Store<IPAMPool>,
    pub clusters: Store<Cluster>,
    pub namespaces: Store<Namespace>,
    /// Cluster API's `IPAddressClaim`s, `IPAddress`es and `Cluster`s (empty while Cluster
    /// API is not installed).
    pub capi: watches::CapiCaches,
    /// The pool records as the record watch shows them, on every replica (read-only; the
    /// leader's own copy is [`Context::records`]).
    pub record_view: watches::RecordView,
    pub ledger: Mutex<Ledger>,
    /// Ticks, for every subscriber, once each allocation watch event is in the ledger and
    /// after each rebuild: how the ledger's readers (the addon applier, the webhook) learn of
    /// changes — kipam's own writes too, through their watch echo — without watching
    /// allocations themselves. Its value says whether the ledger has held a complete list yet
    /// (the watch's first, or a rebuild); until then a missing allocation proves nothing.
    pub ledger_updates: watch::Sender<bool>,
    /// Ticks, for every subscriber, after each event of the Cluster and `IPAMPool` watches
    /// ([`watches::Caches::changes`]): how the addon applier learns of changes to what it
    /// reads of [`Context::clusters`] and [`Context::pools`] without watching them again.
    pub cache_changes: watch::Sender<()>,
    /// True once the pool, Cluster and namespace caches have listed, said by the planning
    /// loop, their one waiter: kube's `Store::wait_until_ready` wakes only the last task that
    /// polled it, so every other room waits on this instead.
    pub caches_listed: watch::Sender<bool>,
    pub records: Mutex<records::Records>,
    /// What the watches saw change since the last pass took it.
    pub dirty: Arc<Dirty>,
    /// Per-object retry delays after failed writes.
    pub backoff: std::sync::Mutex<backoff::Backoff>,
    /// Held while a pass runs: shutdown waits for it before giving the Lease up.
    pub pass_lock: Mutex<()>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub leader: Arc<LeaderState>,
    /// What the demand reader saw in the user clusters (demand-driven growth).
    pub demand: Arc<demand::DemandCache>,
    /// What the discovery reader saw in the user clusters that adopt (`spec.adopt`).
    pub discovered: Arc<discovered::DiscoveryCache>,
    /// One client per user cluster, shared by the applier and the demand and discovery readers.
    pub tenants: Arc<tenants::Tenants>,
}

impl Context {
    /// The client shared for user cluster `cluster`, for the current version of its
    /// kubeconfig Secret `namespace/name` (key `key`): the one [`tenants::Tenants`] holds, or
    /// one built from the Secret ([`Context::kubeconfig_secret`]) and shared. `timeout` bounds
    /// connecting and writes, not reads (watches are long). The error is one line naming what
    /// failed.
    pub async fn tenant_client(
        &self,
        cluster: &str,
        namespace: &str,
        name: &str,
        key: &str,
        timeout: Duration,
    ) -> Result<Client, String> {
        let secret = self
            .kubeconfig_secret(namespace, name)
            .await?
            .ok_or_else(|| format!("the kubeconfig Secret {namespace}/{name} does not exist"))?;
        self.tenant_client_from(cluster, &secret, key, timeout)
            .await
            .map(|(_, client)| client)
    }

    /// Reads the kubeconfig Secret `namespace/name` from the seed (as a list of one name, the
    /// permission the applier has), at most a few at once ([`tenants::Tenants::secret_read`]).
    /// `None`: there is no such Secret. The error (the read failed: worth trying again) is one
    /// line.
    pub async fn kubeconfig_secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::Secret>, String> {
        use k8s_openapi::api::core::v1::Secret;
        use kube::ResourceExt;
        use kube::api::{Api, ListParams};
        // RBAC: src/rbac.rs (secrets list).
        let api: Api<Secret> = Api::namespaced(self.writer.clone(), namespace);
        let turn = self.tenants.secret_read().await;
        let list = api
            .list(&ListParams::default().fields(&format!("metadata.name={name}")))
            .await;
        drop(turn);
        let list = list.map_err(|e| {
            format!(
                "cannot read the kubeconfig Secret {namespace}/{name}: {}",
                preconditions::short(&e)
            )
        })?;
        Ok(list.items.into_iter().find(|s| s.name_any() == name))
    }

    /// The client shared for user cluster `cluster` for the kubeconfig in `secret` (key
    /// `key`), built from it unless one is shared for that version already, and the source
    /// it is kept under. The error (the kubeconfig is unusable) is one line naming the Secret
    /// and the key.
    pub async fn tenant_client_from(
        &self,
        cluster: &str,
        secret: &k8s_openapi::api::core::v1::Secret,
        key: &str,
        timeout: Duration,
    ) -> Result<(String, Client), String> {
        use kube::ResourceExt;
        let source = tenants::source(
            &secret.uid().unwrap_or_default(),
            &secret.resource_version().unwrap_or_default(),
            key,
        );
        if let Some(client) = self.tenants.cached(cluster, &source) {
            return Ok((source, client));
        }
        let (namespace, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
        let where_ = format!("Secret {namespace}/{name} key {key:?}");
        let text = kubeconfig::kubeconfig_text(secret, key)?;
        let parsed = kubeconfig::parse(&text, &where_)?;
        let config = kubeconfig::config(parsed, &where_, timeout).await?;
        let client = self
            .tenants
            .client(cluster, &source, || {
                tracing::info!(%cluster, secret = %format!("{namespace}/{name}"), "user cluster client (re)built from its kubeconfig Secret");
                tenants::client(&config, timeout)
            })
            .await?;
        Ok((source, client))
    }

    /// Starts a context over `client` (used for watches and, unless
    /// [`ContextBuilder::writer`] says otherwise, for requests too). Everything else starts
    /// empty: caches nothing fills, an empty ledger not yet complete, no records, a fresh
    /// registry, a leader state that does not hold the Lease. This is the one way to build a
    /// `Context`: the controller, the tests and the benches all use it, so a new field is
    /// added here once.
    pub fn builder(client: Client) -> ContextBuilder {
        ContextBuilder {
            writer: client.clone(),
            client,
            pools: None,
            clusters: None,
            cache_changes: None,
            namespaces: None,
            capi: None,
            record_view: None,
            ledger: None,
            dirty: None,
            metrics: None,
            leader: None,
            instance: None,
        }
    }
}

/// Builds a [`Context`] ([`Context::builder`]).
#[must_use]
pub struct ContextBuilder {
    client: Client,
    writer: Client,
    pools: Option<Store<IPAMPool>>,
    clusters: Option<Store<Cluster>>,
    cache_changes: Option<watch::Sender<()>>,
    namespaces: Option<Store<Namespace>>,
    capi: Option<watches::CapiCaches>,
    record_view: Option<watches::RecordView>,
    ledger: Option<Ledger>,
    dirty: Option<Arc<Dirty>>,
    metrics: Option<Arc<Metrics>>,
    leader: Option<Arc<LeaderState>>,
    instance: Option<String>,
}

impl ContextBuilder {
    /// The request client (timeouts, no retries); the watch client by default.
    pub fn writer(mut self, writer: Client) -> Self {
        self.writer = writer;
        self
    }

    /// The caches the watches fill ([`watches::caches`]).
    pub fn caches(
        mut self,
        pools: Store<IPAMPool>,
        clusters: Store<Cluster>,
        namespaces: Store<Namespace>,
        capi: watches::CapiCaches,
    ) -> Self {
        self.pools = Some(pools);
        self.clusters = Some(clusters);
        self.namespaces = Some(namespaces);
        self.capi = Some(capi);
        self
    }

    /// What ticks on every change the Cluster and pool caches see ([`watches::caches`]).
    pub fn cache_changes(mut self, changes: watch::Sender<()>) -> Self {
        self.cache_changes = Some(changes);
        self
    }

    /// The pool records' view ([`watches::caches`], or one a test fills).
    pub fn record_view(mut self, view: watches::RecordView) -> Self {
        self.record_view = Some(view);
        self
    }

    /// Only the pool cache (the other caches stay empty).
    pub fn pools(mut self, pools: Store<IPAMPool>) -> Self {
        self.pools = Some(pools);
        self
    }

    /// A ledger that already holds a complete list (tests and benches that fill it
    /// themselves, as the allocation watch would). Without it the ledger starts empty and
    /// incomplete, until the allocation watch lists.
    pub fn complete_ledger(mut self, ledger: Ledger) -> Self {
        self.ledger = Some(ledger);
        self
    }

    pub fn dirty(mut self, dirty: Arc<Dirty>) -> Self {
        self.dirty = Some(dirty);
        self
    }

    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    pub fn leader(mut self, leader: Arc<LeaderState>) -> Self {
        self.leader = Some(leader);
        self
    }

    /// This replica's name in the events it records.
    pub fn instance(mut self, identity: String) -> Self {
        self.instance = Some(identity);
        self
    }

    pub fn build(self) -> Arc<Context> {
        let complete = self.ledger.is_some();
        let dirty = self.dirty.unwrap_or_default();
        let ctx = Arc::new(Context {
            recorder: Recorder::new(
                self.client.clone(),
                Reporter {
                    controller: "kipam".into(),
                    instance: self.instance,
                },
            ),
            client: self.client,
            writer: self.writer,
            pools: self.pools.unwrap_or_else(|| reflector::store().0),
            clusters: self.clusters.unwrap_or_else(|| reflector::store().0),
            namespaces: self.namespaces.unwrap_or_else(|| reflector::store().0),
            capi: self.capi.unwrap_or_default(),
            record_view: self.record_view.unwrap_or_default(),
            ledger: Mutex::new(self.ledger.unwrap_or_default()),
            ledger_updates: watch::Sender::new(complete),
            cache_changes: self.cache_changes.unwrap_or_else(|| watch::Sender::new(())),
            caches_listed: watch::Sender::new(false),
            records: Mutex::new(records::Records::default()),
            dirty: dirty.clone(),
            backoff: std::sync::Mutex::new(backoff::Backoff::default()),
            pass_lock: Mutex::new(()),
            metrics: self.metrics.unwrap_or_else(Metrics::new),
            leader: self
                .leader
                .unwrap_or_else(|| LeaderState::new(Duration::from_secs(10))),
            demand: Default::default(),
            discovered: Default::default(),
            tenants: Default::default(),
        });
        ctx.demand.set_dirty(dirty.clone());
        ctx.discovered.set_dirty(dirty);
        ctx
    }
}

/// The watch client and the request client.
pub async fn clients(kubeconfig: Option<&PathBuf>) -> Result<(Client, Client), ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| ClientError::Config(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| ClientError::Config(format!("{}: {e}", path.display())))?
        }
        None => Config::infer()
            .await
            .map_err(|e| ClientError::Config(e.to_string()))?,
    };
    let mut watch_config = config.clone();
    watch_config.connect_timeout = Some(REQUEST_TIMEOUT);
    let mut write_config = config;
    write_config.default_retry = false;
    write_config.connect_timeout = Some(REQUEST_TIMEOUT);
    write_config.read_timeout = Some(REQUEST_TIMEOUT);
    write_config.write_timeout = Some(REQUEST_TIMEOUT);
    Ok((
        Client::try_from(watch_config).map_err(ClientError::Client)?,
        Client::try_from(write_config).map_err(ClientError::Client)?,
    ))
}
