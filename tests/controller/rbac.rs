//! kipam with only the permissions it ships, on a strict API server: the stand-in decides
//! every request of the controller by RBAC from the ClusterRole, Role and bindings of
//! `deploy/kipam.yaml` (the chart's default rendering, which `tests/chart` holds equal to
//! `src/rbac.rs`), and runs the `OwnerReferencesPermissionEnforcement` admission plugin, as
//! OpenShift and hardened clusters do. The controller authenticates with a service-account
//! token of `kipam-system/kipam`, serves its webhook with a self-signed certificate as the
//! chart's default does, and goes through the README's walkthrough, a connected user cluster
//! with its Addon, growth, a Cluster API claim, the REST API and the page. Any request the
//! grants do not cover is refused by the stand-in, and the test fails on the first refusal.

use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube_standin::{ApiServer, UserInfo};
use serde_json::{Value, json};

use super::api::http;
use super::metallb::{MetalLb, address_of, service};
use super::support::{Seed, free_port};
use super::walkthrough::{client_of, condition_status, kubectl_apply};

const WAIT: Duration = Duration::from_secs(40);
const SERVICE_ACCOUNT: &str = "system:serviceaccount:kipam-system:kipam";
const KIPAM_CLUSTERS: &str = "clusters.ipam.kipam.dev";
const CLAIMS: &str = "ipaddressclaims.ipam.cluster.x-k8s.io";
const ADDRESSES: &str = "ipaddresses.ipam.cluster.x-k8s.io";
const METALLB_CRDS: &str = include_str!("../render/fixtures/metallb-crds.yaml");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The ServiceAccount, roles and bindings of `deploy/kipam.yaml`, as shipped.
fn shipped_rbac() -> Vec<Value> {
    let text = std::fs::read_to_string(root().join("deploy/kipam.yaml")).expect("deploy/");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("deploy/kipam.yaml parses");
    let rbac: Vec<Value> = docs
        .into_iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some(
                    "ServiceAccount"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                        | "Role"
                        | "RoleBinding"
                )
            )
        })
        .collect();
    assert_eq!(rbac.len(), 5, "deploy/kipam.yaml's RBAC: {rbac:?}");
    rbac
}

/// Fails the test on the first request the shipped grants did not cover.
fn assert_nothing_refused(seed: &Seed, when: &str) {
    let refused = seed.api.refusals();
    assert!(
        refused.is_empty(),
        "{when}: the API server refused requests the shipped RBAC does not cover:\n{}\n\
         --- controller log ---\n{}",
        refused.join("\n"),
        seed.log("ctl")
    );
}

async fn wait(seed: &Seed, what: &str, mut check: impl FnMut(&Seed) -> bool) {
    let start = Instant::now();
    while start.elapsed() < WAIT {
        assert_nothing_refused(seed, what);
        if check(seed) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_nothing_refused(seed, what);
    panic!(
        "timed out waiting for: {what}\n--- controller log ---\n{}",
        seed.log("ctl")
    );
}

fn namespace(seed: &Seed, name: &str) {
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}))
        .expect("namespace");
}

/// A user cluster with MetalLB's CRDs (and the MetalLB stand-in, for growth).
async fn user_cluster() -> ApiServer {
    let api = ApiServer::start().await.expect("user cluster starts");
    for ns in ["metallb-system", "default"] {
        let _ = api.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns}}));
    }
    api.apply_yaml(METALLB_CRDS).expect("MetalLB CRDs");
    api
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_rbac_covers_everything_kipam_does_on_a_strict_api_server() {
    let seed = Seed::start("rbac").await;
    for crds in [
        include_str!("../fixtures/capi/capi-ipam-ipaddressclaims.yaml"),
        include_str!("../fixtures/capi/capi-ipam-ipaddresses.yaml"),
        include_str!("../fixtures/capi/capi-clusters.yaml"),
    ] {
        seed.apply(crds);
    }
    namespace(&seed, "machines");
    for obj in shipped_rbac() {
        seed.api.apply(&obj).expect("shipped RBAC applies");
    }
    // REST API users: an admin of kipam's kinds and a reader, by RBAC like anyone else.
    seed.apply(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kipam-admin}
rules:
  - apiGroups: ["ipam.kipam.dev"]
    resources: ["*"]
    verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kipam-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kipam-admin}
subjects: [{kind: User, name: admin@example.com}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kipam-reader}
rules:
  - apiGroups: ["ipam.kipam.dev"]
    resources: ["*"]
    verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kipam-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kipam-reader}
subjects: [{kind: User, name: viewer@example.com}]
"#,
    );
    seed.api
        .add_token("admin-token", UserInfo::new("admin@example.com"));
    seed.api
        .add_token("reader-token", UserInfo::new("viewer@example.com"));
    seed.api.enable_rbac();
    seed.api.enable_owner_references_permission_enforcement();
    // The controller runs as kipam's service account (the pod's projected token).
    let token = seed.api.service_account_token("kipam-system", "kipam");
    std::fs::write(
        seed.dir().join("kubeconfig"),
        seed.api.kubeconfig_yaml_for_token(&token),
    )
    .expect("kubeconfig");

    // The webhook configuration the chart ships, pointed at a URL the stand-in can call.
    let webhook_port = free_port();
    let config = std::process::Command::new(env!("CARGO_BIN_EXE_kipam"))
        .args([
            "webhook-config",
            "--url",
            &format!("https://localhost:{webhook_port}"),
            "--service-account",
            SERVICE_ACCOUNT,
        ])
        .output()
        .expect("kipam webhook-config");
    assert!(config.status.success());
    seed.apply(&String::from_utf8_lossy(&config.stdout));
    let certs = seed.dir().join("certs");
    let ctl = seed.controller_with(
        "ctl",
        &[
            "--seed-name",
            "seed",
            "--namespace",
            "kipam-system",
            "--service-account",
            SERVICE_ACCOUNT,
            "--webhook-addr",
            &format!("127.0.0.1:{webhook_port}"),
            "--webhook-self-signed",
            "--webhook-service",
            "localhost",
            "--webhook-secret",
            "kipam-webhook-tls",
            "--webhook-config-name",
            "kipam",
            "--webhook-cert-dir",
            &certs.display().to_string(),
        ],
    );
    wait(&seed, "the webhook's caBundle written by kipam", |s| {
        s.get(
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
            None,
            "kipam",
        )
        .is_some_and(|c| c["webhooks"][0]["clientConfig"]["caBundle"] != "Cg==")
    })
    .await;

    // kubectl apply -f examples/ as the cluster admin, through kipam's webhook.
    let admin = client_of(&seed.api).await;
    let start = Instant::now();
    loop {
        let applied = kubectl_apply(&admin, &root().join("examples")).await;
        let refused: Vec<String> = applied.into_iter().filter_map(Result::err).collect();
        if refused.is_empty() {
            break;
        }
        // Until the webhook serves, the API server cannot call it.
        assert!(
            start.elapsed() < WAIT,
            "kubectl apply -f examples/: {refused:?}\n{}",
            seed.log("ctl")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait(
        &seed,
        "the walkthrough's Clusters allocated, Addons rendered",
        |s| {
            let clusters = s.api.list(KIPAM_CLUSTERS, None);
            clusters.len() == 5
                && clusters
                    .iter()
                    .all(|c| condition_status(c, "IPAMReady") == "True")
                && s.api.list("addons", None).len() == 5
                && s.api
                    .list("addons", None)
                    .iter()
                    .all(|a| condition_status(a, "Rendered") == "True")
        },
    )
    .await;

    // A Cluster whose namespace kipam makes: owned by the Cluster, blocking its deletion.
    let clusters: kube::Api<kipam::resources::Cluster> = kube::Api::all(admin.clone());
    clusters
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "foxtrot"},
                "spec": {"datacenter": "azure-westeurope"},
            }))
            .expect("cluster"),
        )
        .await
        .expect("create cluster foxtrot");
    wait(&seed, "foxtrot's namespace, owned by it", |s| {
        s.get("namespaces", None, "cluster-foxtrot")
            .is_some_and(|n| n["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] == true)
            && s.phase("foxtrot", "metallb") == "Allocated"
    })
    .await;

    // Connect alpha's user cluster: its Addon is applied there.
    let user = user_cluster().await;
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(admin.clone(), "cluster-alpha");
    secrets
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "kubeconfig"},
                "stringData": {"kubeconfig": user.kubeconfig_yaml()},
            }))
            .expect("secret"),
        )
        .await
        .expect("kubeconfig secret");
    clusters
        .patch(
            "alpha",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubeconfig": {"secretRef": {"name": "kubeconfig"}}}})),
        )
        .await
        .expect("patch cluster alpha");
    wait(&seed, "alpha's Addon in sync", |s| {
        s.get("addons", Some("cluster-alpha"), "metallb")
            .is_some_and(|a| condition_status(&a, "InSync") == "True")
    })
    .await;

    // Growth: a datacenter that grows on demand, and a cluster there whose MetalLB refuses a
    // third Service.
    let pools: kube::Api<kipam::resources::IPAMPool> = kube::Api::all(admin.clone());
    pools
        .patch(
            "metallb",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"datacenters": {"dc-grow": {
                "type": "range", "poolCidr": "10.99.0.0/28", "allocationRange": 2,
                "growth": {"increment": 2, "max": 4, "shrinkAfter": "1m"},
            }}}})),
        )
        .await
        .expect("a growing datacenter");
    let grower = user_cluster().await;
    let _metallb = MetalLb::start(grower.clone());
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "kc-golf", "namespace": "kipam-system"},
            "stringData": {"kubeconfig": grower.kubeconfig_yaml()}}))
        .expect("secret");
    clusters
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "golf"},
                "spec": {"datacenter": "dc-grow",
                    "kubeconfig": {"secretRef": {"namespace": "kipam-system", "name": "kc-golf"}}},
            }))
            .expect("cluster"),
        )
        .await
        .expect("create cluster golf");
    wait(&seed, "golf's namespace", |s| {
        s.get("namespaces", None, "cluster-golf").is_some()
    })
    .await;
    let addons: kube::Api<kipam::resources::Addon> =
        kube::Api::namespaced(admin.clone(), "cluster-golf");
    addons
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "metallb"}, "spec": {"name": "metallb"},
            }))
            .expect("addon"),
        )
        .await
        .expect("golf's Addon");
    for s in ["s1", "s2", "s3"] {
        service(&grower, s);
    }
    wait(&seed, "golf's third Service served after growth", |_| {
        address_of(&grower, "s3").is_some()
    })
    .await;
    assert_eq!(
        seed.held("golf", "metallb"),
        "10.99.0.0-10.99.0.1,10.99.0.2-10.99.0.3"
    );

    // A Cluster API claim: its IPAddress is owned by the claim and the pool (blockOwnerDeletion
    // needs update on their finalizers), and it is released when the claim goes.
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: machines}
spec:
  datacenters:
    dc-m: {type: range, poolCidr: 10.10.0.0/28, allocationRange: 4,
           network: {gateway: 10.10.0.254, prefixLength: 24}}
",
    );
    seed.api
        .create(&json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "kind": "IPAddressClaim",
            "metadata": {"name": "web-0", "namespace": "machines"},
            "spec": {"poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": "machines"}},
        }))
        .expect("claim");
    wait(&seed, "the claim served", |s| {
        s.get(CLAIMS, Some("machines"), "web-0").is_some_and(|c| {
            c["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        }) && s.get(ADDRESSES, Some("machines"), "web-0").is_some()
    })
    .await;
    let address = seed
        .get(ADDRESSES, Some("machines"), "web-0")
        .expect("IPAddress");
    let owners = address["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o["kind"] == "IPAddressClaim" && o["blockOwnerDeletion"] == true),
        "{owners:?}"
    );
    seed.api
        .delete(CLAIMS, Some("machines"), "web-0")
        .expect("delete the claim");
    wait(&seed, "the claim released and gone", |s| {
        s.get(CLAIMS, Some("machines"), "web-0").is_none()
            && s.get(ADDRESSES, Some("machines"), "web-0").is_none()
    })
    .await;

    // The REST API: callers' tokens and permissions checked by TokenReview and
    // SubjectAccessReview, both answered by RBAC.
    let pools_path = "/api/v2/seeds/seed/ipampools";
    let (code, body) = http(ctl.api_port, "GET", pools_path, Some("reader-token"), None).await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.as_array()
            .is_some_and(|a| a.iter().any(|p| p["name"] == "metallb")),
        "{body}"
    );
    let pool = json!({"name": "extra", "datacenters": {"dc-x": {
        "type": "range", "poolCidr": "10.77.0.0/24", "allocationRange": 8}}});
    let (code, body) = http(
        ctl.api_port,
        "POST",
        pools_path,
        Some("reader-token"),
        Some(&pool),
    )
    .await;
    assert_eq!(code, 403, "{body}");
    let (code, body) = http(
        ctl.api_port,
        "POST",
        pools_path,
        Some("admin-token"),
        Some(&pool),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (code, _) = http(
        ctl.api_port,
        "DELETE",
        &format!("{pools_path}/extra"),
        Some("admin-token"),
        None,
    )
    .await;
    assert_eq!(code, 200);

    // The page and what it reads.
    let (code, _) = http(ctl.api_port, "GET", "/ui/", None, None).await;
    assert_eq!(code, 200);
    for path in [
        "/ui/api/summary?offset=0&limit=50&filter=".to_string(),
        "/ui/api/pools/metallb/datacenters/azure-westeurope".to_string(),
        "/ui/api/version".to_string(),
        format!(
            "/api/v2/seeds/seed/addresses/{}",
            seed.held("alpha", "metallb")
                .split(['-', ','])
                .next()
                .unwrap_or_default()
        ),
    ] {
        let (code, body) = http(ctl.api_port, "GET", &path, Some("reader-token"), None).await;
        assert_eq!(code, 200, "{path}: {body}");
    }

    // A few more passes of everything (resyncs, renewals), still nothing refused.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_nothing_refused(&seed, "at the end");
    // The controller really ran as the service account, through RBAC.
    assert!(seed.api.stats().count("create", "subjectaccessreviews") > 0);
}
