//! Drives the stand-in with a real kube 5 client over HTTP, the way the controller will.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    LocalSubjectAccessReview, ResourceAttributes as SarResource, SelfSubjectAccessReview,
    SelfSubjectAccessReviewSpec, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, PropagationPolicy, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{self, Discovery, Scope};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::watcher;
use kube::{Client, Config, ResourceExt};
use kube_standin::{ApiServer, UserInfo};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn client_for(server: &ApiServer) -> Client {
    let kc = Kubeconfig::from_yaml(&server.kubeconfig_yaml()).expect("kubeconfig parses");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config from kubeconfig");
    Client::try_from(config).expect("client")
}

async fn start() -> (ApiServer, Client) {
    let server = ApiServer::start().await.expect("stand-in starts");
    let client = client_for(&server).await;
    (server, client)
}

/// Sends a PATCH with any content type, as raw bytes.
async fn raw_patch(
    client: &Client,
    path: &str,
    content_type: &str,
    body: Value,
) -> Result<String, kube::Error> {
    let req = axum::http::Request::patch(path)
        .header("content-type", content_type)
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request");
    client.request_text(req).await
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn api_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.reason.clone(),
        other => format!("not an API error: {other}"),
    }
}

fn configmap(name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        },
        "data": data.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
    }))
    .expect("configmap json")
}

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.dev"},
        "spec": {
            "group": "example.dev",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "minimum": 1},
                                "color": {"type": "string", "default": "blue"},
                                "tags": {"type": "array", "items": {"type": "string"}}
                            }
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "phase": {"type": "string"},
                                "observedGeneration": {"type": "integer"}
                            }
                        }
                    }
                }}
            }]
        }
    }))
    .expect("crd json")
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("widget json")
}

/// Registers the Widget CRD and resolves it through discovery.
async fn install_widgets(client: &Client) -> ApiResource {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &widget_crd())
        .await
        .expect("crd created");
    let (ar, _caps) = discovery::pinned_kind(
        client,
        &GroupVersionKind::gvk("example.dev", "v1", "Widget"),
    )
    .await
    .expect("widget discovered");
    ar
}

async fn next_event<S, T>(stream: &mut S) -> T
where
    S: futures::Stream<Item = T> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("event within 10 s")
        .expect("stream still open")
}

/// Waits until `f` holds, polling the store.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn core_objects_crud_and_errors() -> TestResult {
    let (server, client) = start().await;
    let version = client.apiserver_version().await?;
    assert_eq!(version.major, "1");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = cms
        .create(
            &PostParams::default(),
            &configmap("a", &[("app", "x")], &[("k", "v")]),
        )
        .await?;
    let meta = &created.metadata;
    assert_eq!(meta.namespace.as_deref(), Some("default"));
    assert!(meta.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(meta.creation_timestamp.is_some());
    let rv1: u64 = meta.resource_version.as_deref().unwrap_or("").parse()?;
    assert!(rv1 > 0);

    // Duplicate create → 409 AlreadyExists.
    let err = cms
        .create(&PostParams::default(), &configmap("a", &[], &[]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));
    assert_eq!(api_reason(&err), "AlreadyExists");

    // No name and no generateName → 422; generateName works.
    let err = cms
        .create(&PostParams::default(), &configmap("", &[], &[]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(422));
    let mut generated = configmap("", &[], &[]);
    generated.metadata.generate_name = Some("gen-".into());
    let generated = cms.create(&PostParams::default(), &generated).await?;
    assert!(generated.name_any().starts_with("gen-") && generated.name_any().len() == 9);

    // Get, replace with the current rv, then a stale replace → 409 Conflict.
    let mut got = cms.get("a").await?;
    assert_eq!(
        got.data
            .as_ref()
            .and_then(|d| d.get("k"))
            .map(String::as_str),
        Some("v")
    );
    got.data = Some(BTreeMap::from([("k".to_string(), "w".to_string())]));
    let replaced = cms.replace("a", &PostParams::default(), &got).await?;
    let rv2: u64 = replaced.resource_version().unwrap_or_default().parse()?;
    assert!(rv2 > rv1);
    let err = cms
        .replace("a", &PostParams::default(), &got)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));
    assert_eq!(api_reason(&err), "Conflict");

    // A no-op replace does not bump the resource version.
    let same = cms.replace("a", &PostParams::default(), &replaced).await?;
    assert_eq!(same.resource_version(), replaced.resource_version());

    // Dry run does not persist.
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    cms.create(&dry, &configmap("dry", &[], &[])).await?;
    assert!(cms.get_opt("dry").await?.is_none());

    // List carries the current resource version.
    let list = cms.list(&ListParams::default()).await?;
    assert_eq!(list.items.len(), 2);
    assert_eq!(
        list.metadata.resource_version.as_deref(),
        Some(server.resource_version().to_string().as_str())
    );

    // Secret stringData is folded into data.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let s: Secret = serde_json::from_value(
        json!({"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}),
    )?;
    let s = secrets.create(&PostParams::default(), &s).await?;
    assert_eq!(s.data.unwrap()["password"].0, b"hunter2".to_vec());

    // Unknown namespace → 404; unknown resource → 404 with a Status.
    let nowhere: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    let err = nowhere
        .create(&PostParams::default(), &configmap("x", &[], &[]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(404));
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nope.dev", "v1", "Nope"),
        "nopes",
    );
    let nopes: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let err = nopes.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_code(&err), Some(404));

    // Delete without finalizers: gone at once, answered with a Status.
    let res = cms.delete("a", &DeleteParams::default()).await?;
    assert!(res.is_right());
    let err = cms.get("a").await.unwrap_err();
    assert_eq!(api_code(&err), Some(404));

    // Delete with a stale precondition → 409.
    let err = cms
        .delete("gen-x", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(404));
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: Some("1".into()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    let err = cms.delete(&generated.name_any(), &dp).await.unwrap_err();
    assert_eq!(api_code(&err), Some(409));

    // Paging with limit/continue walks everything once.
    for i in 0..5 {
        cms.create(
            &PostParams::default(),
            &configmap(&format!("p{i}"), &[("page", "yes")], &[]),
        )
        .await?;
    }
    let mut seen = Vec::new();
    let mut lp = ListParams::default().labels("page=yes").limit(2);
    loop {
        let page = cms.list(&lp).await?;
        seen.extend(page.items.iter().map(|c| c.name_any()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(seen, vec!["p0", "p1", "p2", "p3", "p4"]);
    Ok(())
}

/// A GET over a plain connection: the status code, the content type and the body.
async fn raw_get(server: &ApiServer, path: &str) -> (u16, String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = server.url().trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await.expect("send");
    let mut answer = String::new();
    conn.read_to_string(&mut answer).await.expect("read");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    (code, content_type, body.to_string())
}

/// As on a real server: a path under a group/version nobody serves (a CRD not installed yet) is
/// Go's plain-text `404 page not found`, which kube reports as a 404 that is not `NotFound`; a
/// missing object of a served resource is a `Status` with reason `NotFound`.
#[tokio::test]
async fn paths_nobody_serves_are_a_plain_text_404() -> TestResult {
    let (server, client) = start().await;
    for path in [
        "/apis/metallb.io/v1beta1/namespaces/metallb-system/ipaddresspools",
        "/apis/metallb.io/v1beta1/ipaddresspools",
        "/apis/metallb.io/v1beta1",
        "/apis/metallb.io",
        "/api/v2",
        "/nowhere",
    ] {
        let (code, content_type, body) = raw_get(&server, path).await;
        assert_eq!(code, 404, "{path}");
        assert_eq!(content_type, "text/plain; charset=utf-8", "{path}");
        assert_eq!(body, "404 page not found\n", "{path}");
    }
    // An unknown resource of a built-in group/version is a Status, as before.
    let (code, content_type, body) = raw_get(&server, "/api/v1/nopes").await;
    assert_eq!((code, content_type.as_str()), (404, "application/json"));
    assert_eq!(serde_json::from_str::<Value>(&body)?["kind"], "Status");

    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("metallb.io", "v1beta1", "IPAddressPool"),
        "ipaddresspools",
    );
    let pools: Api<DynamicObject> = Api::namespaced_with(client.clone(), "metallb-system", &ar);
    match pools.list(&ListParams::default()).await.unwrap_err() {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.message, "404 page not found");
            assert!(!s.is_not_found(), "not an object's NotFound: {s:?}");
        }
        other => panic!("not an API error: {other}"),
    }
    let gv = kube::core::GroupVersion::gv("metallb.io", "v1beta1");
    match discovery::pinned_group(&client, &gv).await {
        Err(e) => assert_eq!(api_code(&e), Some(404), "{e}"),
        Ok(_) => panic!("metallb.io/v1beta1 discovered on a server that does not serve it"),
    }

    // Once the group is served, an unknown resource of it is still plain text (the CRD
    // handler passes it on), and a missing object is a Status.
    let ar = install_widgets(&client).await;
    let (code, content_type, _) = raw_get(&server, "/apis/example.dev/v1/gadgets").await;
    assert_eq!(
        (code, content_type.as_str()),
        (404, "text/plain; charset=utf-8")
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    match widgets.get("missing").await.unwrap_err() {
        kube::Error::Api(s) => assert!(s.is_not_found(), "{s:?}"),
        other => panic!("not an API error: {other}"),
    }
    assert!(widgets.get_opt("missing").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn crd_registered_at_run_time_is_discoverable_and_served() -> TestResult {
    let (server, client) = start().await;
    let ar = install_widgets(&client).await;
    assert_eq!(ar.plural, "widgets");
    let (_, caps) = discovery::pinned_kind(
        &client,
        &GroupVersionKind::gvk("example.dev", "v1", "Widget"),
    )
    .await?;
    assert_eq!(caps.scope, Scope::Namespaced);
    assert!(caps.subresources.iter().any(|(r, _)| r.plural == "status"));

    // Full discovery, plain and aggregated, sees the new group next to built-ins.
    let disc = Discovery::new(client.clone()).run().await?;
    assert!(disc.has_group("example.dev"));
    assert!(disc.has_group("coordination.k8s.io"));
    let (lease_ar, _) = disc
        .resolve_gvk(&GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"))
        .expect("leases discovered");
    assert_eq!(lease_ar.plural, "leases");
    let agg = Discovery::new(client.clone()).run_aggregated().await?;
    let (war, wcaps) = agg
        .resolve_gvk(&GroupVersionKind::gvk("example.dev", "v1", "Widget"))
        .expect("widget in aggregated discovery");
    assert_eq!(war.plural, "widgets");
    assert!(wcaps.subresources.iter().any(|(r, _)| r.plural == "status"));
    assert!(
        agg.resolve_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap"))
            .is_some()
    );

    // CRUD through the dynamic API, with schema pruning and defaulting.
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let w = widgets
        .create(
            &PostParams::default(),
            &widget("w1", json!({"size": 3, "bogus": true})),
        )
        .await?;
    assert_eq!(w.data["spec"], json!({"size": 3, "color": "blue"}));
    assert_eq!(w.metadata.generation, Some(1));
    let err = widgets
        .create(&PostParams::default(), &widget("w2", json!({"size": 0})))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(422));
    let err = widgets
        .create(&PostParams::default(), &widget("w3", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(422));
    assert_eq!(widgets.list(&ListParams::default()).await?.items.len(), 1);
    assert_eq!(
        server
            .get("widgets.example.dev", Some("default"), "w1")
            .unwrap()["spec"]["size"],
        json!(3)
    );
    assert_eq!(server.list("wd", None).len(), 1, "short names resolve");

    // A PUT of a custom resource needs a resourceVersion.
    let mut unversioned = w.clone();
    unversioned.metadata.resource_version = None;
    let err = widgets
        .replace("w1", &PostParams::default(), &unversioned)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(422));

    // Deleting the CRD deletes its objects, unregisters the type and ends its watches.
    let mut watch = widgets
        .watch(
            &WatchParams::default(),
            &server.resource_version().to_string(),
        )
        .await?
        .boxed();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("widgets.example.dev", &DeleteParams::default())
        .await?;
    eventually("CRD gone", || {
        server.get("crd", None, "widgets.example.dev").is_none()
    })
    .await;
    assert!(matches!(
        next_event(&mut watch).await?,
        WatchEvent::Deleted(_)
    ));
    let end = tokio::time::timeout(Duration::from_secs(10), watch.next()).await?;
    assert!(end.is_none(), "the watch ends with its type");
    let err = widgets.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_code(&err), Some(404));
    let disc = Discovery::new(client.clone()).run().await?;
    assert!(!disc.has_group("example.dev"));
    Ok(())
}

/// `after_next_get` puts a write between a client's read and its write: a status write (which
/// bumps the resourceVersion like any write) then makes an update with the version just read
/// conflict, as it does on a real server.
#[tokio::test]
async fn a_status_write_between_read_and_update_makes_the_update_conflict() -> TestResult {
    let (server, client) = start().await;
    let ar = install_widgets(&client).await;
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    widgets
        .create(&PostParams::default(), &widget("w", json!({"size": 1})))
        .await?;

    let other = server.clone();
    server.after_next_get("widgets.example.dev", Some("default"), "w", move || {
        other
            .set_status("widgets", Some("default"), "w", json!({"phase": "Ready"}))
            .expect("status write");
    })?;
    assert_eq!(server.pending_get_hooks(), 1);
    // A list is not a GET of the object: the hook waits.
    widgets.list(&ListParams::default()).await?;
    assert_eq!(server.pending_get_hooks(), 1);
    let mut read = widgets.get("w").await?;
    assert_eq!(server.pending_get_hooks(), 0);
    assert!(read.data.get("status").is_none(), "the read came first");
    let stored = server.get("widgets", Some("default"), "w").expect("stored");
    assert_eq!(stored["status"]["phase"], "Ready");
    assert_ne!(
        stored["metadata"]["resourceVersion"].as_str(),
        read.metadata.resource_version.as_deref(),
        "a status write bumps the resourceVersion"
    );

    read.data["spec"]["size"] = json!(2);
    let err = widgets
        .replace("w", &PostParams::default(), &read)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));
    // The hook ran once: the next read and write go through.
    let mut fresh = widgets.get("w").await?;
    fresh.data["spec"]["size"] = json!(2);
    let replaced = widgets.replace("w", &PostParams::default(), &fresh).await?;
    assert_eq!(replaced.data["spec"]["size"], 2);

    // Unknown resources are refused.
    assert!(server.after_next_get("nopes", None, "x", || {}).is_err());
    Ok(())
}

#[tokio::test]
async fn status_subresource_and_generation() -> TestResult {
    let (_server, client) = start().await;
    let ar = install_widgets(&client).await;
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);

    // Status sent on create is dropped.
    let mut w = widget("w", json!({"size": 1}));
    w.data["status"] = json!({"phase": "Bogus"});
    let w = widgets.create(&PostParams::default(), &w).await?;
    assert!(w.data.get("status").is_none());
    assert_eq!(w.metadata.generation, Some(1));

    // Writing status changes only status, and not the generation.
    let s = widgets
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"size": 9}, "status": {"phase": "Ready", "observedGeneration": 1}}),
            ),
        )
        .await?;
    assert_eq!(s.data["status"]["phase"], "Ready");
    assert_eq!(s.data["spec"]["size"], 1);
    assert_eq!(s.metadata.generation, Some(1));

    // Writing the main resource ignores status; a spec change bumps the generation.
    let m = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}, "status": {"phase": "Hacked"}})),
        )
        .await?;
    assert_eq!(m.data["status"]["phase"], "Ready");
    assert_eq!(m.data["spec"]["size"], 2);
    assert_eq!(m.metadata.generation, Some(2));

    // Metadata-only changes do not bump the generation.
    let l = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await?;
    assert_eq!(l.metadata.generation, Some(2));
    assert_eq!(l.labels().get("a").map(String::as_str), Some("b"));

    // replace_status with a stale resourceVersion conflicts.
    let mut stale = w.clone();
    stale.data["status"] = json!({"phase": "Old"});
    let err = widgets
        .replace_status("w", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));
    let mut fresh = widgets.get_status("w").await?;
    fresh.data["status"] = json!({"phase": "New"});
    let r = widgets
        .replace_status("w", &PostParams::default(), &fresh)
        .await?;
    assert_eq!(r.data["status"], json!({"phase": "New"}));
    assert_eq!(r.metadata.generation, Some(2));

    // Invalid labels are refused like the real server does.
    let err = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "not valid!"}}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(422));
    Ok(())
}

#[tokio::test]
async fn merge_json_strategic_and_apply_patches() -> TestResult {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &configmap("c", &[], &[("a", "1"), ("b", "2")]),
    )
    .await?;

    // Merge patch: null deletes.
    let c = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": null, "c": "3"}})),
        )
        .await?;
    assert_eq!(
        c.data.unwrap().keys().cloned().collect::<Vec<_>>(),
        vec!["b", "c"]
    );

    // JSON patch: a failing test is 422 and changes nothing; a passing one applies.
    let path = "/api/v1/namespaces/default/configmaps/c";
    let err = raw_patch(
        &client,
        path,
        "application/json-patch+json",
        json!([
            {"op": "test", "path": "/data/b", "value": "nope"},
            {"op": "remove", "path": "/data/b"}
        ]),
    )
    .await
    .unwrap_err();
    assert_eq!(api_code(&err), Some(422));
    raw_patch(
        &client,
        path,
        "application/json-patch+json",
        json!([
            {"op": "test", "path": "/data/b", "value": "2"},
            {"op": "replace", "path": "/data/b", "value": "22"}
        ]),
    )
    .await?;
    assert_eq!(cms.get("c").await?.data.unwrap()["b"], "22");
    let err = raw_patch(
        &client,
        path,
        "application/json-patch+json",
        json!({"op": "add"}),
    )
    .await
    .unwrap_err();
    assert_eq!(api_code(&err), Some(400));
    let err = raw_patch(&client, path, "application/x-unknown", json!({}))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(415));

    // A resourceVersion inside a patch is a precondition.
    let err = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1"}, "data": {"x": "y"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));

    // Strategic merge on a built-in kind.
    let c = cms
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Strategic(json!({"data": {"s": "1"}})),
        )
        .await?;
    assert!(c.data.unwrap().contains_key("s"));

    // Server-side apply creates, merges, and removes what the manager stopped applying.
    let pp = PatchParams::apply("tester");
    let applied = cms
        .patch(
            "applied",
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied", "labels": {"owner": "tester"}},
                "data": {"one": "1", "two": "2"}
            })),
        )
        .await?;
    assert_eq!(applied.data.as_ref().unwrap().len(), 2);
    cms.patch(
        "applied",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"other": "x"}})),
    )
    .await?;
    let reapplied = cms
        .patch(
            "applied",
            &pp,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied"},
                "data": {"one": "1"}
            })),
        )
        .await?;
    let data = reapplied.data.unwrap();
    assert_eq!(
        data.keys().cloned().collect::<Vec<_>>(),
        vec!["one", "other"]
    );
    assert!(reapplied.metadata.labels.unwrap_or_default().is_empty());

    // Another manager changing an owned field conflicts unless forced.
    let other = PatchParams::apply("intruder");
    let err = cms
        .patch(
            "applied",
            &other,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"one": "uno"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));
    let forced = cms
        .patch(
            "applied",
            &other.clone().force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"one": "uno"}})),
        )
        .await?;
    assert_eq!(forced.data.unwrap()["one"], "uno");
    // The original manager no longer owns `one`, so dropping it does not remove it.
    let after = cms
        .patch(
            "applied",
            &pp,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"three": "3"}})),
        )
        .await?;
    let data = after.data.unwrap();
    assert_eq!(data["one"], "uno");
    assert_eq!(data["three"], "3");

    // Apply without a field manager is a 400.
    let err = cms
        .patch(
            "applied",
            &PatchParams::default(),
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}}),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(400));

    // Apply of a custom resource's status, and strategic merge refused on custom resources.
    let ar = install_widgets(&client).await;
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    widgets
        .patch(
            "w",
            &PatchParams::apply("ctl"),
            &Patch::Apply(json!({"apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 4, "tags": ["a"]}})),
        )
        .await?;
    let st = widgets
        .patch_status(
            "w",
            &PatchParams::apply("ctl").force(),
            &Patch::Apply(json!({"apiVersion": "example.dev/v1", "kind": "Widget", "status": {"phase": "Applied"}})),
        )
        .await?;
    assert_eq!(st.data["status"]["phase"], "Applied");
    assert_eq!(st.data["spec"]["size"], 4);
    let err = widgets
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"size": 5}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(415));

    // The store-level apply used to seed fixtures accepts YAML, CRDs included.
    server.apply_yaml(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: seeded\n  namespace: kube-system\ndata:\n  k: v\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: seeded-ns\n",
    )?;
    assert!(
        server
            .get("configmaps", Some("kube-system"), "seeded")
            .is_some()
    );
    assert!(server.get("ns", None, "seeded-ns").is_some());
    Ok(())
}

/// An error type for closures that cannot fail.
#[derive(Debug)]
enum Never {}

impl std::fmt::Display for Never {
    fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {}
    }
}

impl std::error::Error for Never {}

/// What kipam's pool record commit relies on: a merge patch answered with metadata only
/// (`Accept: ...;as=PartialObjectMetadata`, what `Api::patch_metadata` sends), whose
/// `metadata.resourceVersion` is a precondition even when the patch changes nothing, and a
/// patch that changes nothing keeps the version.
#[tokio::test]
async fn a_merge_patch_answered_with_metadata_is_conditional_on_its_resource_version() -> TestResult
{
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = cms
        .create(&PostParams::default(), &configmap("m", &[], &[("a", "1")]))
        .await?;
    let v1 = created.resource_version().unwrap_or_default();
    let patched = cms
        .patch_metadata(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": v1}, "data": {"b": "2"}})),
        )
        .await?;
    assert_eq!(
        patched.types.as_ref().map(|t| t.kind.as_str()),
        Some("PartialObjectMetadata")
    );
    let v2 = patched
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    assert_ne!(v2, v1);
    let stored = cms.get("m").await?;
    assert_eq!(stored.resource_version().as_deref(), Some(v2.as_str()));
    assert_eq!(stored.data.unwrap_or_default().len(), 2);

    // The answer carries metadata only.
    let req = axum::http::Request::patch("/api/v1/namespaces/default/configmaps/m")
        .header("content-type", "application/merge-patch+json")
        .header(
            "accept",
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
        )
        .body(serde_json::to_vec(
            &json!({"metadata": {"resourceVersion": v2}}),
        )?)?;
    let answer: Value = serde_json::from_str(&client.request_text(req).await?)?;
    assert_eq!(answer["kind"], "PartialObjectMetadata");
    assert!(answer.get("data").is_none(), "{answer}");

    // A patch that changes nothing keeps the version, and no change is recorded.
    let before = server.resource_version();
    let same = cms
        .patch_metadata(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": v2}})),
        )
        .await?;
    assert_eq!(same.metadata.resource_version.as_deref(), Some(v2.as_str()));
    assert_eq!(server.resource_version(), before);

    // A stale version is refused, with or without changes, and nothing is stored.
    for body in [
        json!({"metadata": {"resourceVersion": v1}}),
        json!({"metadata": {"resourceVersion": v1}, "data": {"c": "3"}}),
    ] {
        let err = cms
            .patch_metadata("m", &PatchParams::default(), &Patch::Merge(body))
            .await
            .unwrap_err();
        assert_eq!(api_code(&err), Some(409));
    }
    let after = cms.get("m").await?;
    assert_eq!(after.resource_version().as_deref(), Some(v2.as_str()));
    assert_eq!(after.data.unwrap_or_default().len(), 2);
    Ok(())
}

#[tokio::test]
async fn finalizer_helper_flow() -> TestResult {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &configmap("f", &[], &[]))
        .await?;
    const NAME: &str = "example.dev/cleanup";

    // First pass: the helper adds the finalizer with a JSON patch that tests a null path.
    let obj = Arc::new(cms.get("f").await?);
    finalizer(&cms, NAME, obj, |_ev: FinalizerEvent<ConfigMap>| async {
        Ok::<_, Never>(Action::await_change())
    })
    .await?;
    let obj = cms.get("f").await?;
    assert_eq!(obj.finalizers(), &[NAME.to_string()]);

    // A second finalizer added by someone else goes through the `test` of the whole list.
    let obj2 = Arc::new(obj.clone());
    finalizer(
        &cms,
        "example.dev/other",
        obj2,
        |_ev: FinalizerEvent<ConfigMap>| async { Ok::<_, Never>(Action::await_change()) },
    )
    .await?;
    assert_eq!(cms.get("f").await?.finalizers().len(), 2);

    // Delete: the object stays with a deletionTimestamp.
    let res = cms.delete("f", &DeleteParams::default()).await?;
    let left = res.left().expect("object returned while finalizers remain");
    assert!(left.metadata.deletion_timestamp.is_some());
    assert!(server.get("cm", Some("default"), "f").is_some());
    // No new finalizers may be added while deleting.
    let err = cms
        .patch(
            "f",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["a", "b", "c"]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(422));

    // Cleanup: the helper runs the cleanup and removes its finalizer (test + remove).
    let cleaned = Arc::new(AtomicUsize::new(0));
    let seen = cleaned.clone();
    let obj = Arc::new(cms.get("f").await?);
    finalizer(
        &cms,
        NAME,
        obj,
        move |ev: FinalizerEvent<ConfigMap>| async move {
            if let FinalizerEvent::Cleanup(_) = ev {
                seen.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, Never>(Action::await_change())
        },
    )
    .await?;
    assert_eq!(cleaned.load(Ordering::SeqCst), 1);
    let obj = cms.get("f").await?;
    assert_eq!(obj.finalizers(), &["example.dev/other".to_string()]);

    // Removing the last finalizer removes the object.
    let obj = Arc::new(obj);
    finalizer(
        &cms,
        "example.dev/other",
        obj,
        |_ev: FinalizerEvent<ConfigMap>| async { Ok::<_, Never>(Action::await_change()) },
    )
    .await?;
    assert!(cms.get_opt("f").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn label_and_field_selectors() -> TestResult {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for (name, labels) in [
        ("a", vec![("tier", "web"), ("env", "prod")]),
        ("b", vec![("tier", "db"), ("env", "prod")]),
        ("c", vec![("tier", "web"), ("env", "dev")]),
        ("d", vec![]),
    ] {
        cms.create(&PostParams::default(), &configmap(name, &labels, &[]))
            .await?;
    }
    let names = |sel: &'static str| {
        let cms = cms.clone();
        async move {
            let l = cms
                .list(&ListParams::default().labels(sel))
                .await
                .expect("list");
            l.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
        }
    };
    assert_eq!(names("tier=web").await, vec!["a", "c"]);
    assert_eq!(names("tier==web,env=prod").await, vec!["a"]);
    assert_eq!(names("tier!=web").await, vec!["b", "d"]);
    assert_eq!(
        names("tier in (db, web),env notin (dev)").await,
        vec!["a", "b"]
    );
    assert_eq!(names("tier").await, vec!["a", "b", "c"]);
    assert_eq!(names("!tier").await, vec!["d"]);
    let by_field = cms
        .list(&ListParams::default().fields("metadata.name=c"))
        .await?;
    assert_eq!(by_field.items.len(), 1);
    // A list of one name reads that object alone (as the real server does), and the rest of
    // the selector still applies to it.
    let field_names = |sel: &'static str, api: Api<ConfigMap>| async move {
        let l = api
            .list(&ListParams::default().fields(sel))
            .await
            .expect("list");
        l.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    };
    assert_eq!(
        field_names("metadata.name=c,metadata.namespace=default", cms.clone()).await,
        vec!["c"]
    );
    assert!(
        field_names("metadata.name=c,metadata.namespace=other", cms.clone())
            .await
            .is_empty()
    );
    assert!(
        field_names("metadata.name=zz", cms.clone())
            .await
            .is_empty()
    );
    let all: Api<ConfigMap> = Api::all(client.clone());
    assert_eq!(field_names("metadata.name=c", all.clone()).await, vec!["c"]);
    let by_ns = all
        .list(&ListParams::default().fields("metadata.namespace=default,metadata.name!=a"))
        .await?;
    assert_eq!(by_ns.items.len(), 3);
    let err = cms
        .list(&ListParams::default().labels("tier in (web"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(400));
    Ok(())
}

fn owned_by(name: &str, owner: &ConfigMap, extra_owner: Option<&ConfigMap>) -> ConfigMap {
    let mut refs = vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": owner.name_any(), "uid": owner.uid().unwrap()}),
    ];
    if let Some(o) = extra_owner {
        refs.push(json!({"apiVersion": "v1", "kind": "ConfigMap", "name": o.name_any(), "uid": o.uid().unwrap()}));
    }
    serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": refs}})).unwrap()
}

/// As a real server's `NamespaceLifecycle` admission, which runs before any validation: an
/// object put in a namespace that does not exist is refused with the namespace's 404, whatever
/// else is wrong with it, by a create and by a server-side apply alike.
#[tokio::test]
async fn a_missing_namespace_refuses_what_is_put_in_it() -> TestResult {
    let (_server, client) = start().await;
    let ar = install_widgets(&client).await;
    let nowhere: Api<DynamicObject> = Api::namespaced_with(client.clone(), "cluster-alpha", &ar);
    let missing = |e: &kube::Error| match e {
        kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
        other => (0, String::new(), other.to_string()),
    };
    let expected = (
        404,
        "NotFound".to_string(),
        "namespaces \"cluster-alpha\" not found".to_string(),
    );
    let pp = PostParams::default();
    let err = nowhere
        .create(&pp, &widget("w", json!({"size": 1})))
        .await
        .unwrap_err();
    assert_eq!(missing(&err), expected);
    // Invalid too (size below its minimum): the namespace is what the server names.
    let err = nowhere
        .create(&pp, &widget("w", json!({"size": 0})))
        .await
        .unwrap_err();
    assert_eq!(missing(&err), expected);
    let err = nowhere
        .patch(
            "w",
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(widget("w", json!({"size": 1}))),
        )
        .await
        .unwrap_err();
    assert_eq!(missing(&err), expected);
    // A name that is not valid either: still the namespace first.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "cluster-alpha");
    let err = cms
        .create(&pp, &configmap("Not_A_Name", &[], &[]))
        .await
        .unwrap_err();
    assert_eq!(missing(&err), expected);
    Ok(())
}

#[tokio::test]
async fn garbage_collection_and_namespace_cascade() -> TestResult {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let owner = cms.create(&pp, &configmap("owner", &[], &[])).await?;
    let other = cms.create(&pp, &configmap("other", &[], &[])).await?;
    let child = cms.create(&pp, &owned_by("child", &owner, None)).await?;
    cms.create(&pp, &owned_by("grandchild", &child, None))
        .await?;
    cms.create(&pp, &owned_by("shared", &owner, Some(&other)))
        .await?;

    cms.delete("owner", &DeleteParams::default()).await?;
    assert!(cms.get_opt("child").await?.is_none());
    assert!(
        cms.get_opt("grandchild").await?.is_none(),
        "GC is recursive"
    );
    assert!(
        cms.get_opt("shared").await?.is_some(),
        "a dependent with a live owner stays"
    );
    cms.delete("other", &DeleteParams::default()).await?;
    assert!(cms.get_opt("shared").await?.is_none());

    // Orphan propagation keeps dependents and strips the reference.
    let owner = cms.create(&pp, &configmap("owner2", &[], &[])).await?;
    cms.create(&pp, &owned_by("orphan", &owner, None)).await?;
    cms.delete(
        "owner2",
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..DeleteParams::default()
        },
    )
    .await?;
    let orphan = cms.get("orphan").await?;
    assert!(
        orphan
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // Namespace deletion: contents go; a finalizer keeps the namespace Terminating.
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &pp,
        &serde_json::from_value(json!({"metadata": {"name": "team"}}))?,
    )
    .await?;
    let team: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    team.create(&pp, &configmap("plain", &[], &[])).await?;
    let mut held = configmap("held", &[], &[]);
    held.metadata.finalizers = Some(vec!["example.dev/hold".into()]);
    team.create(&pp, &held).await?;
    let res = nss.delete("team", &DeleteParams::default()).await?;
    let ns = res
        .left()
        .expect("namespace still there while content remains");
    assert_eq!(
        ns.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    assert!(team.get_opt("plain").await?.is_none());
    assert!(
        team.get("held")
            .await?
            .metadata
            .deletion_timestamp
            .is_some()
    );
    let err = team
        .create(&pp, &configmap("late", &[], &[]))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(403));
    team.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    assert!(team.get_opt("held").await?.is_none());
    assert!(
        nss.get_opt("team").await?.is_none(),
        "namespace goes once empty"
    );
    assert!(server.get("namespaces", None, "team").is_none());

    // System namespaces cannot be deleted.
    let err = nss
        .delete("default", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(403));
    Ok(())
}

#[tokio::test]
async fn watcher_sees_added_modified_deleted() -> TestResult {
    let (server, client) = start().await;
    server.set_bookmark_interval(Duration::from_millis(100));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &configmap("before", &[], &[]))
        .await?;

    // kube's watcher: list, then watch from the list's resource version.
    let mut stream = watcher(cms.clone(), watcher::Config::default()).boxed();
    assert!(matches!(
        next_event(&mut stream).await?,
        watcher::Event::Init
    ));
    match next_event(&mut stream).await? {
        watcher::Event::InitApply(cm) => assert_eq!(cm.name_any(), "before"),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        next_event(&mut stream).await?,
        watcher::Event::InitDone
    ));
    cms.create(&PostParams::default(), &configmap("after", &[], &[]))
        .await?;
    match next_event(&mut stream).await? {
        watcher::Event::Apply(cm) => assert_eq!(cm.name_any(), "after"),
        other => panic!("unexpected {other:?}"),
    }
    cms.patch(
        "after",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await?;
    match next_event(&mut stream).await? {
        watcher::Event::Apply(cm) => assert_eq!(cm.data.unwrap()["x"], "1"),
        other => panic!("unexpected {other:?}"),
    }
    cms.delete("after", &DeleteParams::default()).await?;
    match next_event(&mut stream).await? {
        watcher::Event::Delete(cm) => assert_eq!(cm.name_any(), "after"),
        other => panic!("unexpected {other:?}"),
    }

    // Streaming lists: initial events end with the initial-events-end bookmark.
    let mut streaming = watcher(cms.clone(), watcher::Config::default().streaming_lists()).boxed();
    assert!(matches!(
        next_event(&mut streaming).await?,
        watcher::Event::Init
    ));
    assert!(matches!(
        next_event(&mut streaming).await?,
        watcher::Event::InitApply(_)
    ));
    assert!(matches!(
        next_event(&mut streaming).await?,
        watcher::Event::InitDone
    ));

    // Raw watch: event types, a label selector that stops matching gives DELETED, bookmarks.
    let rv = server.resource_version().to_string();
    let wp = WatchParams::default().labels("watched=yes");
    let mut raw = cms.watch(&wp, &rv).await?.boxed();
    cms.create(
        &PostParams::default(),
        &configmap("w", &[("watched", "yes")], &[]),
    )
    .await?;
    assert!(matches!(next_event(&mut raw).await?, WatchEvent::Added(_)));
    cms.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "b"}})),
    )
    .await?;
    assert!(matches!(
        next_event(&mut raw).await?,
        WatchEvent::Modified(_)
    ));
    cms.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"watched": "no"}}})),
    )
    .await?;
    assert!(matches!(
        next_event(&mut raw).await?,
        WatchEvent::Deleted(_)
    ));
    cms.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"watched": "yes"}}})),
    )
    .await?;
    assert!(matches!(next_event(&mut raw).await?, WatchEvent::Added(_)));
    let mut bookmarked = cms
        .watch(
            &WatchParams::default(),
            &server.resource_version().to_string(),
        )
        .await?
        .boxed();
    assert!(matches!(
        next_event(&mut bookmarked).await?,
        WatchEvent::Bookmark(_)
    ));

    // Resuming from an old resource version replays history; after compaction it is 410.
    let mut replay = cms.watch(&WatchParams::default(), &rv).await?.boxed();
    assert!(matches!(
        next_event(&mut replay).await?,
        WatchEvent::Added(_)
    ));
    server.compact_history();
    let mut expired = cms.watch(&WatchParams::default(), &rv).await?.boxed();
    match next_event(&mut expired).await? {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }

    // Metadata-only watcher.
    let meta_api: Api<kube::core::PartialObjectMeta<ConfigMap>> =
        Api::namespaced(client.clone(), "default");
    let mut meta = watcher(meta_api, watcher::Config::default()).boxed();
    assert!(matches!(next_event(&mut meta).await?, watcher::Event::Init));
    match next_event(&mut meta).await? {
        watcher::Event::InitApply(m) => assert!(!m.name_any().is_empty()),
        other => panic!("unexpected {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn controller_reconciles_objects_created_after_start() -> TestResult {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let ctx = seen.clone();
    let controller = Controller::new(cms.clone(), watcher::Config::default())
        .run(
            |cm: Arc<ConfigMap>, ctx: Arc<std::sync::Mutex<Vec<String>>>| async move {
                ctx.lock().unwrap().push(cm.name_any());
                Ok::<_, Never>(Action::await_change())
            },
            |_cm, _err: &Never, _ctx| Action::await_change(),
            ctx,
        )
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);
    tokio::time::sleep(Duration::from_millis(200)).await;
    cms.create(&PostParams::default(), &configmap("reconcile-me", &[], &[]))
        .await?;
    eventually("reconcile", || {
        seen.lock().unwrap().contains(&"reconcile-me".to_string())
    })
    .await;
    handle.abort();
    Ok(())
}

#[tokio::test]
async fn two_instances_are_independent() -> TestResult {
    let (seed, seed_client) = start().await;
    let (user, user_client) = start().await;
    assert_ne!(seed.url(), user.url());
    let a: Api<ConfigMap> = Api::namespaced(seed_client.clone(), "default");
    let b: Api<ConfigMap> = Api::namespaced(user_client.clone(), "default");
    a.create(&PostParams::default(), &configmap("only-in-seed", &[], &[]))
        .await?;
    assert!(b.get_opt("only-in-seed").await?.is_none());
    assert!(
        seed.get("configmaps", Some("default"), "only-in-seed")
            .is_some()
    );
    assert!(
        user.get("configmaps", Some("default"), "only-in-seed")
            .is_none()
    );
    install_widgets(&seed_client).await;
    let disc = Discovery::new(user_client.clone()).run().await?;
    assert!(!disc.has_group("example.dev"), "CRDs are per instance");

    // A kubeconfig written to disk works too.
    let dir = std::env::temp_dir().join(format!("standin-kubeconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("user.yaml");
    user.write_kubeconfig(&path)?;
    let kc = Kubeconfig::read_from(&path)?;
    let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    assert_eq!(
        cfg.cluster_url.to_string().trim_end_matches('/'),
        user.url()
    );
    std::fs::remove_dir_all(&dir)?;

    // Shutting one down leaves the other serving.
    seed.shutdown();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(a.list(&ListParams::default()).await.is_err());
    assert!(b.list(&ListParams::default()).await.is_ok());
    Ok(())
}

#[tokio::test]
async fn token_and_access_reviews_are_scripted() -> TestResult {
    let (server, client) = start().await;
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review = |token: &str| TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            ..TokenReviewSpec::default()
        },
        ..TokenReview::default()
    };
    // Default: only the kubeconfig's own token authenticates.
    let r = reviews
        .create(&PostParams::default(), &review(&server.token()))
        .await?;
    let status = r.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(
        status.user.unwrap().username.as_deref(),
        Some("system:admin")
    );
    let r = reviews
        .create(&PostParams::default(), &review("unknown"))
        .await?;
    assert_eq!(r.status.unwrap().authenticated, Some(false));

    server.set_token_review(|t| {
        (t == "alice-token").then(|| UserInfo::new("alice").with_groups(&["devs"]))
    });
    let r = reviews
        .create(&PostParams::default(), &review("alice-token"))
        .await?;
    let user = r.status.unwrap().user.unwrap();
    assert_eq!(user.username.as_deref(), Some("alice"));
    assert!(user.groups.unwrap().contains(&"devs".to_string()));

    server.set_access_review(|req| {
        req.user.username == "alice"
            && req
                .resource
                .as_ref()
                .is_some_and(|r| r.verb == "get" && r.resource == "clusters")
    });
    let sars: Api<SubjectAccessReview> = Api::all(client.clone());
    let sar = |user: &str, verb: &str| SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            resource_attributes: Some(SarResource {
                verb: Some(verb.to_string()),
                group: Some("ipam.kipam.dev".into()),
                resource: Some("clusters".into()),
                ..SarResource::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let yes = sars
        .create(&PostParams::default(), &sar("alice", "get"))
        .await?;
    assert!(yes.status.unwrap().allowed);
    let no = sars
        .create(&PostParams::default(), &sar("alice", "delete"))
        .await?;
    assert!(!no.status.unwrap().allowed);
    let no = sars
        .create(&PostParams::default(), &sar("bob", "get"))
        .await?;
    assert!(!no.status.unwrap().allowed);

    let local: Api<LocalSubjectAccessReview> = Api::namespaced(client.clone(), "default");
    let mut l = LocalSubjectAccessReview {
        spec: sar("alice", "get").spec,
        ..LocalSubjectAccessReview::default()
    };
    l.metadata.namespace = Some("default".into());
    l.spec.resource_attributes.as_mut().unwrap().namespace = Some("default".into());
    assert!(
        local
            .create(&PostParams::default(), &l)
            .await?
            .status
            .unwrap()
            .allowed
    );

    // Self review: the caller is whoever the token says (alice here).
    let alice_kc = server
        .kubeconfig_yaml()
        .replace(&server.token(), "alice-token");
    let alice = Client::try_from(
        Config::from_custom_kubeconfig(
            Kubeconfig::from_yaml(&alice_kc)?,
            &KubeConfigOptions::default(),
        )
        .await?,
    )?;
    let selfs: Api<SelfSubjectAccessReview> = Api::all(alice.clone());
    let ssar = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(SarResource {
                verb: Some("get".into()),
                resource: Some("clusters".into()),
                ..SarResource::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    assert!(
        selfs
            .create(&PostParams::default(), &ssar)
            .await?
            .status
            .unwrap()
            .allowed
    );

    // Reviews are create-only.
    let err = reviews.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_code(&err), Some(405));

    // With authentication required, the scripted functions gate every request.
    server.set_require_auth(true);
    let alice_cms: Api<ConfigMap> = Api::namespaced(alice.clone(), "default");
    let err = alice_cms.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_code(&err), Some(403));
    let admin_cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let err = admin_cms.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(
        api_code(&err),
        Some(401),
        "the admin token is no longer accepted by the script"
    );
    Ok(())
}

#[tokio::test]
async fn injected_failures_and_stats() -> TestResult {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    server.reset_stats();
    server.inject_failures("create", "configmaps", 2, 500);
    for _ in 0..2 {
        let err = cms
            .create(&PostParams::default(), &configmap("x", &[], &[]))
            .await
            .unwrap_err();
        assert_eq!(api_code(&err), Some(500));
    }
    cms.create(&PostParams::default(), &configmap("x", &[], &[]))
        .await?;
    assert_eq!(server.pending_failures(), 0);
    server.inject_failures("*", "configmaps/status", 1, 503);
    // kube retries 429, 503 and 504 by itself: the caller sees success, the stats see two gets.
    server.inject_failures("get", "*", 1, 429);
    cms.get("x").await?;
    server.inject_failures("get", "configmaps", 1, 409);
    let err = cms.get("x").await.unwrap_err();
    assert_eq!(api_code(&err), Some(409));
    cms.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "b"}})),
    )
    .await?;
    cms.list(&ListParams::default()).await?;

    let stats = server.stats();
    assert_eq!(stats.count("create", "configmaps"), 3);
    assert_eq!(stats.count("get", "configmaps"), 3);
    assert_eq!(stats.count("patch", "configmaps"), 1);
    assert_eq!(stats.count("list", "configmaps"), 1);
    assert_eq!(stats.verb("get"), 3);
    assert_eq!(stats.resource("configmaps"), 8);
    assert_eq!(stats.writes(), 4);
    assert_eq!(stats.total, 8);
    assert_eq!(
        server.pending_failures(),
        1,
        "the status failure is still armed"
    );
    server.reset_stats();
    assert_eq!(server.stats().total, 0);
    Ok(())
}

#[tokio::test]
async fn events_recorder_and_leases() -> TestResult {
    let (server, client) = start().await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "standin-test".into(),
            instance: Some("pod-0".into()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some("thing".into()),
        namespace: Some("default".into()),
        ..ObjectReference::default()
    };
    let ev = KubeEvent {
        type_: EventType::Normal,
        reason: "Allocated".into(),
        note: Some("10.0.0.0/24".into()),
        action: "Allocate".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await?;
    recorder.publish(&ev, &reference).await?;
    let events = server.list("events.events.k8s.io", Some("default"));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["series"]["count"], json!(2));
    assert_eq!(server.stats().count("create", "events"), 1);
    assert_eq!(server.stats().count("patch", "events"), 1);

    // Leader election by hand: create, renew with the rv, a stale renew conflicts.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "kipam"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}
    }))?;
    let held = leases.create(&PostParams::default(), &lease).await?;
    let err = leases
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));
    let mut renew = held.clone();
    renew.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("kipam", &PostParams::default(), &renew)
        .await?;
    let err = leases
        .replace("kipam", &PostParams::default(), &renew)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), Some(409));
    Ok(())
}

#[tokio::test]
async fn many_concurrent_watchers_and_a_slow_one() -> TestResult {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // A watcher that never reads must not hold up writers.
    let _slow = cms.watch(&WatchParams::default(), "0").await?;
    let mut streams = Vec::new();
    for _ in 0..20 {
        streams.push(
            cms.watch(
                &WatchParams::default(),
                &server.resource_version().to_string(),
            )
            .await?
            .boxed(),
        );
    }
    for i in 0..50 {
        cms.create(
            &PostParams::default(),
            &configmap(&format!("c{i}"), &[], &[]),
        )
        .await?;
    }
    for s in &mut streams {
        let events: Vec<_> = s.by_ref().take(50).try_collect().await?;
        assert_eq!(events.len(), 50);
        assert!(events.iter().all(|e| matches!(e, WatchEvent::Added(_))));
    }
    Ok(())
}

#[test]
fn detached_server_serves_blocking_callers() -> TestResult {
    use std::io::{Read, Write};
    // No runtime here: the server brings its own, and this thread may block freely.
    let server = ApiServer::start_detached()?;
    let addr = server.url().trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr)?;
    conn.write_all(
        b"GET /api/v1/namespaces/default HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"phase\":\"Active\""), "{answer}");
    assert_eq!(server.stats().count("get", "namespaces"), 1);
    server.apply(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"}}))?;
    assert_eq!(server.list("cm", Some("default")).len(), 1);
    drop(server);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "dropping the last handle stops it"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_creates_reach_every_watcher() -> TestResult {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let rv = server.resource_version().to_string();
    let watch = cms.watch(&WatchParams::default(), &rv).await?.boxed();
    let started = std::time::Instant::now();
    futures::stream::iter(0..1000)
        .map(|i| {
            let cms = cms.clone();
            async move {
                cms.create(
                    &PostParams::default(),
                    &configmap(&format!("n{i}"), &[("bulk", "yes")], &[]),
                )
                .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let created = started.elapsed();
    let events: Vec<_> = tokio::time::timeout(
        Duration::from_secs(30),
        watch.take(1000).try_collect::<Vec<_>>(),
    )
    .await??;
    assert_eq!(events.len(), 1000);
    let listed = cms.list(&ListParams::default().labels("bulk=yes")).await?;
    assert_eq!(listed.items.len(), 1000);
    assert_eq!(server.stats().count("create", "configmaps"), 1000);
    eprintln!(
        "1000 creates in {created:?}, all watched and listed in {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn watch_delay_simulates_a_lagging_cache() -> TestResult {
    let (server, client) = start().await;
    server.set_watch_delay(Duration::from_millis(400));
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut watch = cms
        .watch(
            &WatchParams::default(),
            &server.resource_version().to_string(),
        )
        .await?
        .boxed();
    cms.create(&PostParams::default(), &configmap("late", &[], &[]))
        .await?;
    // Reads are current at once; the watch only hears of it later.
    assert!(cms.get_opt("late").await?.is_some());
    let early = tokio::time::timeout(Duration::from_millis(150), watch.next()).await;
    assert!(early.is_err(), "nothing is delivered before the delay");
    assert!(matches!(
        next_event(&mut watch).await?,
        WatchEvent::Added(_)
    ));
    Ok(())
}

/// The project's own CRDs (whatever `crds/` holds) register and serve through discovery.
#[tokio::test]
async fn project_crds_apply_and_are_discoverable() -> TestResult {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    let (server, client) = start().await;
    let mut kinds = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        for crd in server.apply_yaml(&std::fs::read_to_string(&path)?)? {
            let group = crd["spec"]["group"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let kind = crd["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            for v in crd["spec"]["versions"].as_array().into_iter().flatten() {
                let version = v["name"].as_str().unwrap_or_default().to_string();
                kinds.push(GroupVersionKind::gvk(&group, &version, &kind));
            }
        }
    }
    assert!(!kinds.is_empty(), "crds/ holds CRDs");
    let disc = Discovery::new(client.clone()).run_aggregated().await?;
    for gvk in &kinds {
        assert!(disc.resolve_gvk(gvk).is_some(), "{gvk:?} is discoverable");
    }
    // The examples validate against those schemas.
    for example in ["pools.yaml", "clusters.yaml"] {
        let path = dir.join("../examples").join(example);
        if let Ok(text) = std::fs::read_to_string(&path) {
            let applied = server.apply_yaml(&text)?;
            assert!(!applied.is_empty());
        }
    }
    Ok(())
}

/// Sends `method path` with a JSON body; answers the status code, the `Warning` headers and
/// the body.
async fn raw_json(
    client: &Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: &Value,
) -> (u16, Vec<String>, Value) {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(
            serde_json::to_vec(body).expect("json"),
        ))
        .expect("request");
    let resp = client.send(req).await.expect("response");
    let code = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap_or_default().to_string())
        .collect();
    let bytes = resp.into_body().collect_bytes().await.expect("body");
    (
        code,
        warnings,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

const POOLS: &str = "/apis/ipam.kipam.dev/v1alpha1/ipampools";

fn pool_body(extra_spec: Value) -> Value {
    let mut spec = json!({"datacenters": {"dc-1": {
        "type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4, "foo": 1
    }}});
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(extra.clone());
    }
    json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
           "metadata": {"name": "metallb"}, "spec": spec})
}

#[tokio::test]
async fn unknown_fields_are_dropped_with_a_warning_or_refused_when_strict() -> TestResult {
    let (server, client) = start().await;
    server.apply_yaml(include_str!("../../../crds/ipampools.ipam.kipam.dev.yaml"))?;

    // kubectl's default: Strict refuses the write before anything is stored.
    let (code, _, status) = raw_json(
        &client,
        "POST",
        &format!("{POOLS}?fieldValidation=Strict"),
        "application/json",
        &pool_body(json!({"bar": true})),
    )
    .await;
    assert_eq!(code, 400, "{status}");
    assert_eq!(status["reason"], "BadRequest");
    assert_eq!(
        status["message"],
        "strict decoding error: unknown field \"spec.bar\", unknown field \"spec.datacenters[dc-1].foo\""
    );
    assert!(server.get("ipampools", None, "metallb").is_none());

    // Unset (kube-rs' default) is Warn on a real server: pruned, one Warning header each.
    let (code, warnings, created) = raw_json(
        &client,
        "POST",
        POOLS,
        "application/json",
        &pool_body(json!({"bar": true})),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        warnings,
        vec![
            "299 - \"unknown field \\\"spec.bar\\\"\"",
            "299 - \"unknown field \\\"spec.datacenters[dc-1].foo\\\"\"",
        ]
    );
    assert!(created["spec"].get("bar").is_none());
    assert!(created["spec"]["datacenters"]["dc-1"].get("foo").is_none());

    // Through kube's PatchParams: Strict refuses, Ignore drops silently.
    let gvk = GroupVersionKind::gvk("ipam.kipam.dev", "v1alpha1", "IPAMPool");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    let e = api
        .patch(
            "metallb",
            &PatchParams::default().validation_strict(),
            &Patch::Merge(json!({"spec": {"baz": 1}})),
        )
        .await
        .expect_err("strict");
    assert_eq!(api_code(&e), Some(400));
    assert!(e.to_string().contains("unknown field \"spec.baz\""), "{e}");
    let patched = api
        .patch(
            "metallb",
            &PatchParams::default().validation_ignore(),
            &Patch::Merge(json!({"spec": {"baz": 1, "reclaimPolicy": "Retain"}})),
        )
        .await?;
    assert!(patched.data["spec"].get("baz").is_none());
    assert_eq!(patched.data["spec"]["reclaimPolicy"], "Retain");
    let (_, warnings, _) = raw_json(
        &client,
        "PATCH",
        &format!("{POOLS}/metallb?fieldValidation=Ignore"),
        "application/merge-patch+json",
        &json!({"spec": {"qux": 1}}),
    )
    .await;
    assert!(warnings.is_empty(), "{warnings:?}");
    Ok(())
}

#[tokio::test]
async fn crd_rules_and_bounds_are_enforced_with_real_messages() -> TestResult {
    let (server, client) = start().await;
    server.apply_yaml(include_str!("../../../crds/ipampools.ipam.kipam.dev.yaml"))?;
    let gvk = GroupVersionKind::gvk("ipam.kipam.dev", "v1alpha1", "IPAMPool");
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk));
    let pool = |dcs: Value| -> DynamicObject {
        serde_json::from_value(
            json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "metallb"}, "spec": {"datacenters": dcs}}),
        )
        .expect("object")
    };
    let e = api
        .create(
            &PostParams::default(),
            &pool(json!({"dc-1": {"type": "range", "poolCidr": "a".repeat(44), "allocationRange": 0}})),
        )
        .await
        .expect_err("invalid");
    assert_eq!(api_code(&e), Some(422));
    let kube::Error::Api(status) = &e else {
        panic!("{e}")
    };
    let causes: Vec<(String, String, String)> = status
        .details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| (c.reason.clone(), c.field.clone(), c.message.clone()))
                .collect()
        })
        .unwrap_or_default();
    let f = "spec.datacenters[dc-1]";
    assert_eq!(
        causes,
        vec![
            (
                "FieldValueInvalid".into(),
                format!("{f}.allocationRange"),
                format!(
                    "Invalid value: 0: {f}.allocationRange in body should be greater than or equal to 1"
                )
            ),
            (
                "FieldValueTooLong".into(),
                format!("{f}.poolCidr"),
                "Too long: may not be more than 43 bytes".into()
            ),
            (
                "FieldValueInvalid".into(),
                format!("{f}.poolCidr"),
                format!(
                    "Invalid value: \"{}\": {f}.poolCidr in body should match '^ *[0-9A-Fa-f:.]+ */[0-9]{{1,3}} *$'",
                    "a".repeat(44)
                )
            ),
        ]
    );
    assert!(
        status
            .message
            .starts_with("IPAMPool.ipam.kipam.dev \"metallb\" is invalid: "),
        "{}",
        status.message
    );
    // A transition rule runs on update only: creating with any type is fine, changing it not.
    api.create(
        &PostParams::default(),
        &pool(
            json!({"dc-1": {"type": "prefix", "poolCidr": "10.0.0.0/24", "allocationPrefix": 28}}),
        ),
    )
    .await?;
    let e = api
        .patch(
            "metallb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"datacenters": {"dc-1": {"type": "range", "allocationPrefix": null, "allocationRange": 4}}}})),
        )
        .await
        .expect_err("type is immutable");
    assert!(
        e.to_string()
            .contains("spec.datacenters[dc-1]: Invalid value: \"object\": type is immutable"),
        "{e}"
    );
    assert!(
        e.to_string().contains("allocationPrefix is immutable"),
        "{e}"
    );
    Ok(())
}

/// A webhook configuration for ConfigMaps whose webhook cannot be reached.
fn unreachable_webhook(policy: &str, condition: Option<&str>) -> Value {
    // Nothing listens on port 1, so the call fails whatever the CA holds.
    let ca = "-----BEGIN CERTIFICATE-----\nMIIBcjCCARigAwIBAgIUV4hzZ0pN4l0n3cJqK1GdW0X8gYQwCgYIKoZIzj0EAwIw\nADAeFw0yNDAxMDEwMDAwMDBaFw0zNDAxMDEwMDAwMDBaMAAwWTATBgcqhkjOPQIB\nBggqhkjOPQMBBwNCAAR3\n-----END CERTIFICATE-----\n";
    let mut webhook = json!({
        "name": "check.example.dev",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": policy,
        "timeoutSeconds": 2,
        "clientConfig": {"url": "https://127.0.0.1:1/validate", "caBundle": base64(ca.as_bytes())},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "operations": ["CREATE"]}],
    });
    if let Some(c) = condition {
        webhook["matchConditions"] = json!([{"name": "only", "expression": c}]);
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "check"},
        "webhooks": [webhook],
    })
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                A[((n >> (18 - 6 * i)) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

#[tokio::test]
async fn admission_webhooks_follow_failure_policy_and_match_conditions() {
    let (server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"a": "b"}})).unwrap()
    };
    // Fail: an unreachable webhook refuses the write, as a real server does.
    server.apply(&unreachable_webhook("Fail", None)).unwrap();
    let e = cms
        .create(&PostParams::default(), &cm("one"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&e), Some(500));
    assert!(
        e.to_string()
            .contains("failed calling webhook \"check.example.dev\""),
        "{e}"
    );
    assert!(server.get("configmaps", Some("default"), "one").is_none());
    // Writes the rules do not select are not sent: an update passes.
    server
        .create(&serde_json::to_value(cm("two")).unwrap())
        .unwrap();
    let mut two = cms.get("two").await.unwrap();
    two.data = Some([("a".to_string(), "c".to_string())].into());
    cms.replace("two", &PostParams::default(), &two)
        .await
        .unwrap();
    // A matchCondition that does not hold skips the webhook.
    server
        .apply(&unreachable_webhook(
            "Fail",
            Some("request.userInfo.username != 'system:admin'"),
        ))
        .unwrap();
    cms.create(&PostParams::default(), &cm("three"))
        .await
        .unwrap();
    // Ignore: the failed call is skipped.
    server.apply(&unreachable_webhook("Ignore", None)).unwrap();
    cms.create(&PostParams::default(), &cm("four"))
        .await
        .unwrap();
}

/// Over TLS the kubeconfig carries the stand-in's CA and kube's client (HTTP/1.1 through ALPN)
/// works unchanged; every connection is counted.
#[tokio::test]
async fn a_tls_instance_serves_kube_and_counts_its_connections() -> TestResult {
    let server = ApiServer::start_tls().await?;
    assert!(
        server.url().starts_with("https://127.0.0.1:"),
        "{}",
        server.url()
    );
    let client = client_for(&server).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let listed = namespaces.list(&ListParams::default()).await?;
    assert!(listed.items.iter().any(|n| n.name_any() == "default"));
    let connections = server
        .connections()
        .expect("TLS instances count connections");
    assert!(connections.total() >= 1);
    assert!(connections.open() >= 1);
    drop(client);
    drop(namespaces);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(connections.open(), 0, "the client's connections closed");
    Ok(())
}

/// A fleet's members share one listener but nothing else: each has its own objects under its
/// own path, and a path outside every member is a plain-text 404.
#[tokio::test]
async fn fleet_members_are_separate_api_servers_behind_one_listener() -> TestResult {
    let fleet = ApiServer::start_tls_fleet(3).await?;
    assert_eq!(fleet.len(), 3);
    assert!(
        fleet[2].url().ends_with("/clusters/2"),
        "{}",
        fleet[2].url()
    );
    let client = client_for(&fleet[1]).await;
    let namespaces: Api<Namespace> = Api::all(client);
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "only-in-one"}}))?,
        )
        .await?;
    assert!(fleet[1].get("namespaces", None, "only-in-one").is_some());
    assert!(fleet[0].get("namespaces", None, "only-in-one").is_none());
    assert!(fleet[2].get("namespaces", None, "only-in-one").is_none());
    assert_eq!(fleet[1].stats().count("create", "namespaces"), 1);
    assert_eq!(fleet[0].stats().total, 0);
    // Past the last member: nothing serves it.
    let beyond = fleet[0].url().replace("/clusters/0", "/clusters/3");
    let kc = fleet[0].kubeconfig_yaml().replace(&fleet[0].url(), &beyond);
    let config =
        Config::from_custom_kubeconfig(Kubeconfig::from_yaml(&kc)?, &KubeConfigOptions::default())
            .await?;
    let lost: Api<Namespace> = Api::all(Client::try_from(config)?);
    let err = lost
        .list(&ListParams::default())
        .await
        .expect_err("no member serves /clusters/3");
    assert!(err.to_string().contains("404"), "{err}");
    Ok(())
}
