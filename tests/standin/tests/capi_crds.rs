//! Cluster API's own CRDs (`tests/fixtures/capi/`, unchanged upstream copies) installed into
//! the stand-in as they are, and served the way a real kube-apiserver serves them for what
//! kipam does as an IPAM provider: several versions with no conversion strategy, the claim's
//! status subresource, finalizers, owner references, merge patches and label selectors.

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use kube_standin::ApiServer;
use serde_json::{Value, json};
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

const CLAIMS: &str = include_str!("../../fixtures/capi/capi-ipam-ipaddressclaims.yaml");
const ADDRESSES: &str = include_str!("../../fixtures/capi/capi-ipam-ipaddresses.yaml");
const CLUSTERS: &str = include_str!("../../fixtures/capi/capi-clusters.yaml");

const GROUP: &str = "ipam.cluster.x-k8s.io";

async fn start() -> (ApiServer, Client) {
    let server = ApiServer::start().await.expect("stand-in starts");
    let kc = Kubeconfig::from_yaml(&server.kubeconfig_yaml()).expect("kubeconfig parses");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config from kubeconfig");
    (server, Client::try_from(config).expect("client"))
}

/// Installs the three CRDs over HTTP, as `kubectl create -f` would.
async fn install(client: &Client) -> TestResult {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for text in [CLAIMS, ADDRESSES, CLUSTERS] {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text)?;
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            crds.create(&PostParams::default(), &serde_json::from_value(doc)?)
                .await?;
        }
    }
    Ok(())
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn claims(client: &Client, version: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        "machines",
        &ar(GROUP, version, "IPAddressClaim", "ipaddressclaims"),
    )
}

fn addresses(client: &Client, version: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        "machines",
        &ar(GROUP, version, "IPAddress", "ipaddresses"),
    )
}

fn object(api_version: &str, kind: &str, name: &str, body: Value) -> DynamicObject {
    let mut v = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": "machines"},
    });
    if let (Some(o), Some(b)) = (v.as_object_mut(), body.as_object()) {
        for (k, x) in b {
            if k == "metadata" {
                for (mk, mv) in x.as_object().into_iter().flatten() {
                    o["metadata"][mk] = mv.clone();
                }
            } else {
                o.insert(k.clone(), x.clone());
            }
        }
    }
    serde_json::from_value(v).expect("object json")
}

fn claim(version: &str, name: &str, pool_ref: Value) -> DynamicObject {
    object(
        &format!("{GROUP}/{version}"),
        "IPAddressClaim",
        name,
        json!({"spec": {"clusterName": "workload", "poolRef": pool_ref}}),
    )
}

fn kipam_pool_ref() -> Value {
    json!({"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": "lan"})
}

fn json_of(o: &DynamicObject) -> Value {
    serde_json::to_value(o).expect("serialises")
}

async fn with_namespace(server: &ApiServer) {
    server
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "machines"}}))
        .expect("namespace");
}

fn ready(status: &str, reason: &str, message: &str) -> Value {
    json!({
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-08-01T00:00:00Z",
    })
}

fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test]
async fn the_crds_install_as_they_are_and_every_version_is_discoverable() -> TestResult {
    let (_server, client) = start().await;
    install(&client).await?;
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run_aggregated()
        .await?;
    for version in ["v1alpha1", "v1beta1", "v1beta2"] {
        for kind in ["IPAddressClaim", "IPAddress"] {
            let gvk = GroupVersionKind::gvk(GROUP, version, kind);
            assert!(discovery.resolve_gvk(&gvk).is_some(), "{gvk:?} is served");
        }
    }
    for version in ["v1beta1", "v1beta2"] {
        let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", version, "Cluster");
        assert!(discovery.resolve_gvk(&gvk).is_some(), "{gvk:?} is served");
    }
    Ok(())
}

#[tokio::test]
async fn a_claim_written_as_v1beta1_is_stored_and_read_as_v1beta2_unchanged() -> TestResult {
    let (server, client) = start().await;
    with_namespace(&server).await;
    install(&client).await?;
    let v1 = claims(&client, "v1beta1");
    let v2 = claims(&client, "v1beta2");
    let mut watch = v2.watch(&WatchParams::default(), "0").await?.boxed();

    let created = v1
        .create(
            &PostParams::default(),
            &claim("v1beta1", "web-0", kipam_pool_ref()),
        )
        .await?;
    assert_eq!(
        created.types.as_ref().map(|t| t.api_version.as_str()),
        Some("ipam.cluster.x-k8s.io/v1beta1"),
        "the answer is in the version asked for"
    );
    // v1beta1 allows a poolRef without apiGroup; such a claim is kept as written.
    v1.create(
        &PostParams::default(),
        &claim(
            "v1beta1",
            "old-0",
            json!({"kind": "IPAMPool", "name": "lan"}),
        ),
    )
    .await?;

    let read = v2.get("web-0").await?;
    let read = json_of(&read);
    assert_eq!(read["apiVersion"], "ipam.cluster.x-k8s.io/v1beta2");
    assert_eq!(read["spec"], json_of(&created)["spec"], "fields unchanged");
    assert_eq!(
        read["metadata"]["uid"],
        json_of(&created)["metadata"]["uid"]
    );
    let old = json_of(&v2.get("old-0").await?);
    assert_eq!(
        old["spec"]["poolRef"],
        json!({"kind": "IPAMPool", "name": "lan"})
    );

    // Stored as v1beta2: the store and lists hand it out at the storage version.
    let stored = server
        .get(
            "ipaddressclaims.ipam.cluster.x-k8s.io",
            Some("machines"),
            "web-0",
        )
        .expect("stored");
    assert_eq!(stored["apiVersion"], "ipam.cluster.x-k8s.io/v1beta2");
    let listed = v2.list(&ListParams::default()).await?;
    assert_eq!(listed.items.len(), 2);
    for item in &listed.items {
        assert_eq!(json_of(item)["apiVersion"], "ipam.cluster.x-k8s.io/v1beta2");
    }
    // And a v1beta2 watch sees v1beta2 objects.
    match tokio::time::timeout(Duration::from_secs(5), watch.next()).await? {
        Some(Ok(WatchEvent::Added(o))) => {
            assert_eq!(json_of(&o)["apiVersion"], "ipam.cluster.x-k8s.io/v1beta2");
            assert_eq!(o.name_any(), "web-0");
        }
        other => panic!("expected ADDED web-0, got {other:?}"),
    }
    // Read back at v1beta1, it is v1beta1 again.
    let back = json_of(&v1.get("web-0").await?);
    assert_eq!(back["apiVersion"], "ipam.cluster.x-k8s.io/v1beta1");
    assert_eq!(back["spec"], read["spec"]);

    // v1beta2's own schema applies to writes at v1beta2: apiGroup is required there.
    let refused = v2
        .create(
            &PostParams::default(),
            &claim(
                "v1beta2",
                "new-0",
                json!({"kind": "IPAMPool", "name": "lan"}),
            ),
        )
        .await
        .expect_err("v1beta2 requires poolRef.apiGroup");
    assert_eq!(api_code(&refused), Some(422));
    Ok(())
}

#[tokio::test]
async fn the_claim_status_is_written_through_its_subresource_only() -> TestResult {
    let (server, client) = start().await;
    with_namespace(&server).await;
    install(&client).await?;
    let v2 = claims(&client, "v1beta2");
    let mut with_status = claim("v1beta2", "web-0", kipam_pool_ref());
    with_status.data["status"] = json!({"addressRef": {"name": "forged"}});
    let created = v2.create(&PostParams::default(), &with_status).await?;
    assert!(
        json_of(&created).get("status").is_none(),
        "status dropped on create"
    );

    let status = json!({"status": {
        "addressRef": {"name": "web-0"},
        "conditions": [ready("True", "AddressAllocated", "10.0.0.1 from lan/dc-1")],
    }});
    let after = v2
        .patch_status("web-0", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    assert_ne!(after.resource_version(), created.resource_version());
    assert_eq!(json_of(&after)["status"], status["status"]);
    assert_eq!(json_of(&after)["spec"], json_of(&created)["spec"]);
    assert_eq!(after.metadata.generation, created.metadata.generation);

    // A write of the main resource ignores status (and keeps the one stored).
    let spec_patch = json!({
        "metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "workload"}},
        "status": {"addressRef": {"name": "forged"}},
    });
    let patched = v2
        .patch("web-0", &PatchParams::default(), &Patch::Merge(&spec_patch))
        .await?;
    assert_eq!(json_of(&patched)["status"], status["status"]);
    assert_eq!(
        patched
            .labels()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some("workload")
    );
    let mut replaced = patched.clone();
    replaced.data["status"] = json!({"addressRef": {"name": "forged"}});
    let replaced = v2
        .replace("web-0", &PostParams::default(), &replaced)
        .await?;
    assert_eq!(json_of(&replaced)["status"], status["status"]);

    // A status write with a stale resourceVersion conflicts; one with the current succeeds.
    let mut stale = created.clone();
    stale.data["status"] = json!({"addressRef": {"name": "web-0"}});
    let conflict = v2
        .replace_status("web-0", &PostParams::default(), &stale)
        .await
        .expect_err("stale resourceVersion");
    assert_eq!(api_code(&conflict), Some(409));

    // The v1beta2 status schema is enforced: a condition needs a reason and a message.
    let bad = json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "lastTransitionTime": "2026-08-01T00:00:00Z",
    }]}});
    let refused = v2
        .patch_status("web-0", &PatchParams::default(), &Patch::Merge(&bad))
        .await
        .expect_err("a condition without reason and message");
    assert_eq!(api_code(&refused), Some(422));
    let bad_reason = json!({"status": {"conditions": [ready("False", "Pool Exhausted", "full")]}});
    let refused = v2
        .patch_status("web-0", &PatchParams::default(), &Patch::Merge(&bad_reason))
        .await
        .expect_err("a reason with a space");
    assert_eq!(api_code(&refused), Some(422));

    // A custom resource takes no strategic merge patch (415), as on a real server.
    let strategic = v2
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect_err("strategic merge patch of a custom resource");
    assert_eq!(api_code(&strategic), Some(415));
    Ok(())
}

#[tokio::test]
async fn finalizers_keep_claims_and_addresses_until_removed() -> TestResult {
    let (server, client) = start().await;
    with_namespace(&server).await;
    install(&client).await?;
    let v2 = claims(&client, "v1beta2");
    let ips = addresses(&client, "v1beta2");
    let created = v2
        .create(
            &PostParams::default(),
            &claim("v1beta2", "web-0", kipam_pool_ref()),
        )
        .await?;
    let with_finalizer = v2
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "finalizers": ["ipam.cluster.x-k8s.io/ReleaseAddress"],
                "resourceVersion": created.resource_version(),
            }})),
        )
        .await?;
    let address = object(
        "ipam.cluster.x-k8s.io/v1beta2",
        "IPAddress",
        "web-0",
        json!({
            "metadata": {
                "finalizers": ["ipam.cluster.x-k8s.io/ProtectAddress"],
                "labels": {"ipam.kipam.dev/pool": "lan", "ipam.kipam.dev/datacenter": "dc-1"},
                "ownerReferences": [{
                    "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
                    "kind": "IPAddressClaim",
                    "name": "web-0",
                    "uid": created.uid(),
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "claimRef": {"name": "web-0"},
                "poolRef": kipam_pool_ref(),
                "address": "10.0.0.1",
                "prefix": 24,
                "gateway": "10.0.0.254",
            },
        }),
    );
    ips.create(&PostParams::default(), &address).await?;

    // Deleting the claim marks it; it stays while the finalizer is there.
    v2.delete("web-0", &DeleteParams::default()).await?;
    let marked = v2.get("web-0").await?;
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_ne!(marked.resource_version(), with_finalizer.resource_version());
    // No finalizer can be added to an object being deleted.
    let refused = v2
        .patch(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": [
                "ipam.cluster.x-k8s.io/ReleaseAddress", "example.dev/other",
            ]}})),
        )
        .await
        .expect_err("a new finalizer on a deleted object");
    assert_eq!(api_code(&refused), Some(422));
    // A status write still works while it is being deleted.
    v2.patch_status(
        "web-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": [ready("False", "Deleting", "releasing")]}})),
    )
    .await?;

    // The provider's release: the address's finalizer, then the address, then the claim's.
    ips.delete("web-0", &DeleteParams::default()).await?;
    assert!(
        ips.get("web-0")
            .await?
            .metadata
            .deletion_timestamp
            .is_some()
    );
    ips.patch(
        "web-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    assert!(
        ips.get_opt("web-0").await?.is_none(),
        "address gone with its last finalizer"
    );
    assert!(
        v2.get_opt("web-0").await?.is_some(),
        "claim still held by its finalizer"
    );
    v2.patch(
        "web-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": []}})),
    )
    .await?;
    assert!(
        v2.get_opt("web-0").await?.is_none(),
        "claim gone with its last finalizer"
    );
    Ok(())
}

#[tokio::test]
async fn addresses_keep_their_owner_references_and_are_selected_by_label() -> TestResult {
    let (server, client) = start().await;
    with_namespace(&server).await;
    install(&client).await?;
    let ips = addresses(&client, "v1beta2");
    let owners = json!([
        {
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "kind": "IPAddressClaim",
            "name": "web-0",
            "uid": "00000000-0000-0000-0000-000000000001",
            "controller": true,
            "blockOwnerDeletion": true,
        },
        {
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPool",
            "name": "lan",
            "uid": "00000000-0000-0000-0000-000000000002",
            "controller": false,
        },
    ]);
    for (name, pool) in [("web-0", "lan"), ("web-1", "lan"), ("db-0", "storage")] {
        let address = object(
            "ipam.cluster.x-k8s.io/v1beta2",
            "IPAddress",
            name,
            json!({
                "metadata": {
                    "labels": {"ipam.kipam.dev/pool": pool, "app.kubernetes.io/managed-by": "kipam"},
                    "ownerReferences": owners,
                },
                "spec": {
                    "claimRef": {"name": name},
                    "poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": pool},
                    "address": "10.0.0.1",
                    "prefix": 24,
                },
            }),
        );
        ips.create(&PostParams::default(), &address).await?;
    }
    let got = json_of(&ips.get("web-0").await?);
    assert_eq!(got["metadata"]["ownerReferences"], owners);
    assert!(got.get("status").is_none());

    let lan = ips
        .list(&ListParams::default().labels("ipam.kipam.dev/pool=lan"))
        .await?;
    let mut names: Vec<String> = lan.items.iter().map(|o| o.name_any()).collect();
    names.sort();
    assert_eq!(names, ["web-0", "web-1"]);
    let managed = ips
        .list(
            &ListParams::default()
                .labels("app.kubernetes.io/managed-by=kipam,ipam.kipam.dev/pool!=lan"),
        )
        .await?;
    assert_eq!(managed.items.len(), 1);

    // Two controllers among the owners is refused, as on a real server.
    let mut two = owners.clone();
    two[1]["controller"] = json!(true);
    let refused = ips
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": two}})),
        )
        .await
        .expect_err("two controller owners");
    assert_eq!(api_code(&refused), Some(422));

    // The v1beta2 schema is enforced on addresses: a prefix above 128 is refused.
    let mut wide = ips.get("web-1").await?;
    wide.data["spec"]["prefix"] = json!(129);
    let refused = ips
        .replace("web-1", &PostParams::default(), &wide)
        .await
        .expect_err("prefix 129");
    assert_eq!(api_code(&refused), Some(422));
    Ok(())
}

#[tokio::test]
async fn a_cluster_api_cluster_pauses_and_unpauses_with_merge_patches() -> TestResult {
    let (server, client) = start().await;
    with_namespace(&server).await;
    install(&client).await?;
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "machines",
        &ar("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters"),
    );
    let created = clusters
        .create(
            &PostParams::default(),
            &object(
                "cluster.x-k8s.io/v1beta2",
                "Cluster",
                "workload",
                json!({"spec": {"paused": true}}),
            ),
        )
        .await?;
    assert_eq!(json_of(&created)["spec"]["paused"], true);
    let unpaused = clusters
        .patch(
            "workload",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}, "metadata": {"annotations": {"cluster.x-k8s.io/paused": ""}}})),
        )
        .await?;
    assert_eq!(json_of(&unpaused)["spec"]["paused"], false);
    // Its spec needs at least one field (the schema's minProperties), as on a real server.
    let refused = clusters
        .patch(
            "workload",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": null}})),
        )
        .await
        .expect_err("an empty spec");
    assert_eq!(api_code(&refused), Some(422));
    assert_eq!(
        unpaused
            .annotations()
            .get("cluster.x-k8s.io/paused")
            .map(String::as_str),
        Some("")
    );
    // Read at v1beta1 (no conversion), the same fields.
    let v1: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "machines",
        &ar("cluster.x-k8s.io", "v1beta1", "Cluster", "clusters"),
    );
    let old = json_of(&v1.get("workload").await?);
    assert_eq!(old["apiVersion"], "cluster.x-k8s.io/v1beta1");
    assert_eq!(
        old["metadata"]["annotations"],
        json!({"cluster.x-k8s.io/paused": ""})
    );
    Ok(())
}
