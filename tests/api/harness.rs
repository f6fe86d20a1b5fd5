//! A stand-in seed with kipam's CRDs, a controller `Context` with a live pool cache on it,
//! and the API router. Tokens: `admin` may do everything, `reader` may get and list,
//! `anonymous` is the API server's anonymous user; anything else is not a token.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures::StreamExt;
use kube::runtime::reflector;
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_standin::{AccessRequest, ApiServer, UserInfo};
use serde_json::{Value, json};
use tower::ServiceExt;

use kipam::api::{ApiOptions, ApiState};
use kipam::resources::{Cluster, IPAMAllocation, IPAMPool};
use kipam::seed::{Context, ledger};

pub const SEED: &str = "seed-1";
pub const POOLS: &str = "/api/v2/seeds/seed-1/ipampools";

pub struct Harness {
    pub api: ApiServer,
    pub ctx: Arc<Context>,
    pub router: Router,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.task.abort();
        self.api.shutdown();
    }
}

pub fn admin_or_reader(req: &AccessRequest) -> bool {
    let Some(r) = &req.resource else {
        return false;
    };
    if r.group != "ipam.kipam.dev" {
        return false;
    }
    match req.user.username.as_str() {
        "alice" => true,
        "rita" => matches!(r.verb.as_str(), "get" | "list"),
        _ => false,
    }
}

pub fn tokens(token: &str) -> Option<UserInfo> {
    match token {
        "admin" => Some(UserInfo::new("alice").with_groups(&["ipam-admins"])),
        "reader" => Some(UserInfo::new("rita")),
        "anonymous" => Some(UserInfo {
            username: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..UserInfo::default()
        }),
        _ => None,
    }
}

pub async fn client_of(api: &ApiServer) -> Client {
    let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

/// A context as the controller builds it, over the stand-in; only the pool cache is fed.
pub async fn context(api: &ApiServer) -> (Arc<Context>, tokio::task::JoinHandle<()>) {
    let client = client_of(api).await;
    let (pools, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher::watcher(
            Api::<IPAMPool>::all(client.clone()),
            watcher::Config::default(),
        ),
    );
    // The Cluster cache too (the adoption route reads it), fed like the pools.
    let (clusters, cluster_writer) = reflector::store();
    let cluster_stream = reflector::reflector(
        cluster_writer,
        watcher::watcher(
            Api::<Cluster>::all(client.clone()),
            watcher::Config::default(),
        ),
    );
    let task = tokio::spawn(async move {
        tokio::join!(
            stream.for_each(|_| async {}),
            cluster_stream.for_each(|_| async {})
        );
    });
    let ctx = Context::builder(client)
        .caches(
            pools,
            clusters,
            reflector::store().0,
            kipam::seed::watches::CapiCaches::default(),
        )
        // Filled by the test as the allocation watch would, complete from the start.
        .complete_ledger(ledger::Ledger::default())
        .build();
    ctx.pools.wait_until_ready().await.unwrap();
    ctx.clusters.wait_until_ready().await.unwrap();
    // What the planning loop does once its caches are ready.
    ctx.metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    (ctx, task)
}

impl Harness {
    pub async fn start() -> Harness {
        Self::with_options(ApiOptions::default()).await
    }

    pub async fn with_options(options: ApiOptions) -> Harness {
        let api = ApiServer::start().await.unwrap();
        for crd in kipam::resources::crds() {
            api.apply(&serde_json::to_value(&crd).unwrap()).unwrap();
        }
        api.set_token_review(tokens);
        api.set_access_review(admin_or_reader);
        let (ctx, task) = context(&api).await;
        let router = kipam::api::router(ApiState::new(ctx.clone(), SEED.into(), options));
        Harness {
            api,
            ctx,
            router,
            task,
        }
    }

    /// A pool stored straight in the stand-in, waited for in the cache.
    pub async fn pool(&self, yaml: &str) {
        let stored = self.api.apply_yaml(yaml).unwrap();
        let name = stored[0]["metadata"]["name"].as_str().unwrap().to_string();
        self.wait_cached(&name, true).await;
    }

    pub async fn wait_cached(&self, name: &str, present: bool) {
        for _ in 0..200 {
            let found = self
                .ctx
                .pools
                .get(&reflector::ObjectRef::new(name))
                .is_some();
            if found == present {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("pool {name} never became present={present} in the cache");
    }

    /// An allocation known to the ledger (as the allocation watch would report it).
    pub async fn allocation(&self, yaml: &str) {
        let obj: IPAMAllocation = serde_saphyr::from_str(yaml).unwrap();
        self.ctx.ledger.lock().await.apply(obj);
    }

    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Body>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(body.unwrap_or_else(Body::empty)).unwrap();
        let response = self.router.clone().oneshot(req).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&bytes)}))
        };
        (status, value)
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        self.call(
            method,
            path,
            Some(token),
            Some(Body::from(body.to_string())),
        )
        .await
    }

    pub async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call("GET", path, Some(token), None).await
    }
}

/// The error body's code and message, checking the shape.
pub fn error_of(status: StatusCode, body: &Value) -> String {
    assert_eq!(
        body["error"]["code"].as_u64(),
        Some(status.as_u16() as u64),
        "error shape: {body}"
    );
    body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no message: {body}"))
        .to_string()
}

pub const METALLB: &str = r#"
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/24
      allocationRange: 8
      excludeRanges: ["10.0.0.1", "10.0.0.5-10.0.0.7"]
    dc-2:
      type: prefix
      poolCidr: 10.1.0.0/24
      allocationPrefix: 28
      excludePrefixes: ["10.1.0.0/28"]
"#;

pub fn kkp_pool(name: &str) -> Value {
    json!({
        "name": name,
        "datacenters": {
            "azure-westeurope": {
                "type": "range", "poolCidr": "192.168.1.0/26", "allocationRange": 8,
                "excludeRanges": ["192.168.1.1", "192.168.1.5-192.168.1.7"]
            },
            "aws-eu-central-1a": {
                "type": "prefix", "poolCidr": "192.168.1.0/26", "allocationPrefix": 30,
                "excludePrefixes": ["192.168.1.0/30", "192.168.1.8/30"]
            }
        }
    })
}
