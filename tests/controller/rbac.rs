//! kipam with only the permissions it ships, on a strict API server: the stand-in decides
//! every request of the controller by RBAC from the ClusterRole, Role and bindings of
//! `deploy/kipam.yaml` (the chart's default rendering, which `tests/chart` holds equal to
//! `src/rbac.rs`), and runs the `OwnerReferencesPermissionEnforcement` admission plugin, as
//! OpenShift and hardened clusters do. The controller authenticates with a service-account
//! token of `kipam-system/kipam`, serves its webhook with a self-signed certificate as the
//! chart's default does, and goes through the README's walkthrough, a connected user cluster
//! with its Addon, growth, a Cluster API claim, the REST API and the page. Any request the
//! grants do not cover is refused by the stand-in, and the test fails on the first refusal.

use std::collections::BTreeSet;
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

/// The flags of a replica as the chart runs it: kipam's service account and namespace, its
/// webhook on `webhook_port` with the self-signed certificate Secret the chart names.
fn args_of(webhook_port: u16, cert_dir: &Path) -> Vec<String> {
    [
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
        &cert_dir.display().to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
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
        &args_of(webhook_port, &certs)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
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

    every_other_path(&seed, &admin).await;

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
    let (code, body) = http(
        ctl.api_port,
        "PATCH",
        &format!("{pools_path}/extra"),
        Some("admin-token"),
        Some(&json!({"datacenters": {"dc-x": {"allocationRange": 16}}})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
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
    // Last, as it changes the webhook's CA: a replica that starts over a certificate Secret
    // that holds no kipam certificate replaces it (update; the first replica created it).
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "kipam-webhook-tls", "namespace": "kipam-system"},
            "data": null,
            "stringData": {"note": "not a certificate"}}))
        .expect("a Secret in the certificate's place");
    let second_certs = seed.dir().join("certs-2");
    let mut second = seed.controller_with(
        "ctl2",
        &args_of(free_port(), &second_certs)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    wait(
        &seed,
        "the second replica's certificate in the Secret",
        |s| {
            s.get("secrets", Some("kipam-system"), "kipam-webhook-tls")
                .is_some_and(|secret| secret["data"].get("tls.crt").is_some())
        },
    )
    .await;
    second.kill();
    assert_nothing_refused(&seed, "at the end");
    assert_grants_match_use(&seed);
}

/// The paths the walkthrough above does not take, each needing a grant of its own: a
/// hand-made `IPAddress` confirmed gone (get), a claim in a record but not in the cache (get),
/// conflicts re-read (get of an allocation and of a record), a namespace made by hand
/// (patch), an event repeated (patch), an allocation released (delete), a datacenter removed
/// from a pool (its record deleted).
async fn every_other_path(seed: &Seed, admin: &kube::Client) {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let records_holding = |s: &Seed, prefix: &str| -> bool {
        s.api.list("ipampoolrecords", None).iter().any(|r| {
            r["spec"]["reservations"]
                .as_object()
                .is_some_and(|m| m.keys().any(|k| k.starts_with(prefix)))
        })
    };

    // A claim the record holds an entry for but the cache does not show (a replica's view
    // behind another's): read with a get before anything is decided. Writing the entry by
    // hand also moves the shard under the leader, whose next commit there meets a conflict
    // and reads the shard again (get).
    let mut shard = seed
        .api
        .list("ipampoolrecords", None)
        .into_iter()
        .find(|r| r["spec"]["pool"] == "machines" && r["spec"]["block"].is_string())
        .expect("a shard of machines");
    shard["spec"]["reservations"]["claim/machines/ghost"] =
        json!({"addresses": ["10.10.0.12-10.10.0.12"]});
    seed.api
        .apply(&shard)
        .expect("an entry of a claim nobody sees");

    // A hand-made IPAddress of a kipam pool: the webhook commits it to the record before it
    // answers; once its maker deletes it, kipam confirms with a get that it is gone before
    // its record entry goes.
    let addresses = kube::Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        "machines",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("ipam.cluster.x-k8s.io", "v1beta2", "IPAddress"),
            "ipaddresses",
        ),
    );
    let made: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
        "metadata": {"name": "hand-0", "namespace": "machines",
            "labels": {"ipam.kipam.dev/datacenter": "dc-m"}},
        "spec": {
            "claimRef": {"name": "hand-0"},
            "poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": "machines"},
            "address": "10.10.0.9",
            "prefix": 24,
        },
    }))
    .expect("IPAddress");
    addresses
        .create(&Default::default(), &made)
        .await
        .expect("a hand-made IPAddress admitted");
    // A claim served after it: a pass that has seen the hand-made object (an entry whose
    // object no pass saw is kept for a minute: the webhook commits before it is stored).
    seed.api
        .create(&json!({
            "apiVersion": "ipam.cluster.x-k8s.io/v1beta2",
            "kind": "IPAddressClaim",
            "metadata": {"name": "web-1", "namespace": "machines"},
            "spec": {"poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": "machines"}},
        }))
        .expect("claim");
    wait(
        seed,
        "the ghost's entry gone, web-1 served, hand-0 held",
        |s| {
            !records_holding(s, "claim/machines/ghost")
                && s.get(ADDRESSES, Some("machines"), "web-1").is_some()
                && records_holding(s, "ipaddress/machines/hand-0@")
        },
    )
    .await;
    addresses
        .delete("hand-0", &Default::default())
        .await
        .expect("the hand-made IPAddress deleted");
    wait(seed, "hand-0's record entry released", |s| {
        !records_holding(s, "ipaddress/machines/hand-0@")
    })
    .await;

    // A pool whose datacenters fill with one cluster: its capacity events repeat (the second
    // time the Recorder patches the first event), a cluster released deletes its allocation,
    // and a datacenter removed from the pool deletes its records.
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: tiny}
spec:
  datacenters:
    dc-t: {type: range, poolCidr: 10.88.0.0/30, allocationRange: 4}
    dc-u: {type: range, poolCidr: 10.89.0.0/30, allocationRange: 4}
",
    );
    // A namespace made by hand before its Cluster: kipam labels it (patch).
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "cluster-india"}}))
        .expect("namespace");
    let clusters: kube::Api<kipam::resources::Cluster> = kube::Api::all(admin.clone());
    let create = |name: &'static str, dc: &'static str| {
        let clusters = clusters.clone();
        async move {
            clusters
                .create(
                    &Default::default(),
                    &serde_json::from_value(json!({
                        "metadata": {"name": name},
                        "spec": {"datacenter": dc},
                    }))
                    .expect("cluster"),
                )
                .await
                .expect("create cluster");
        }
    };
    create("india", "dc-t").await;
    wait(seed, "india fills tiny", |s| {
        s.phase("india", "tiny") == "Allocated"
    })
    .await;
    clusters
        .delete("india", &Default::default())
        .await
        .expect("delete india");
    wait(seed, "india released", |s| {
        s.get(KIPAM_CLUSTERS, None, "india").is_none() && s.allocation("india", "tiny").is_none()
    })
    .await;
    // juliet's allocation meets a conflict on its create: kipam reads it again (get).
    seed.api
        .inject_failures("create", "ipamallocations", 1, 409);
    create("juliet", "dc-t").await;
    wait(seed, "juliet fills dc-t again", |s| {
        s.phase("juliet", "tiny") == "Allocated"
    })
    .await;
    create("kilo", "dc-u").await;
    wait(seed, "kilo fills dc-u", |s| {
        s.phase("kilo", "tiny") == "Allocated"
    })
    .await;
    // dc-u goes: kilo's allocation is released and the records of tiny/dc-u deleted.
    let pools: kube::Api<kipam::resources::IPAMPool> = kube::Api::all(admin.clone());
    pools
        .patch(
            "tiny",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"datacenters": {"dc-u": null}}})),
        )
        .await
        .expect("dc-u removed from tiny");
    wait(seed, "tiny/dc-u's records gone", |s| {
        s.allocation("kilo", "tiny").is_none()
            && !s
                .api
                .list("ipampoolrecords", None)
                .iter()
                .any(|r| r["spec"]["pool"] == "tiny" && r["spec"]["datacenter"] == "dc-u")
    })
    .await;
}

/// What RBAC granted the service account, held against `src/rbac.rs`: every permission it
/// used is in the table (a verb the code sends and the table lacks would be a refusal on a
/// server that grants no more than the table), and every verb the table grants was used by
/// this run (a grant nothing uses is a grant too many, or a path this test does not walk).
fn assert_grants_match_use(seed: &Seed) {
    let used: BTreeSet<(String, String, String)> = seed
        .api
        .granted()
        .into_iter()
        .filter(|g| g.user == SERVICE_ACCOUNT)
        .map(|g| (g.group, g.resource, g.verb))
        .collect();
    let table: BTreeSet<(String, String, String)> = kipam::rbac::PERMISSIONS
        .iter()
        .flat_map(|p| {
            p.verbs
                .iter()
                .map(|v| (p.group.to_string(), p.resource.to_string(), v.to_string()))
        })
        .collect();
    let show = |set: Vec<&(String, String, String)>| -> Vec<String> {
        set.iter()
            .map(|(g, r, v)| {
                format!(
                    "{v} {}{r}",
                    if g.is_empty() {
                        String::new()
                    } else {
                        format!("{g}/")
                    }
                )
            })
            .collect()
    };
    let beyond: Vec<&(String, String, String)> = used.difference(&table).collect();
    assert!(
        beyond.is_empty(),
        "used but not in src/rbac.rs: {:?}",
        show(beyond)
    );
    let unused: Vec<&(String, String, String)> = table.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "granted by src/rbac.rs but never used by this run: {:?}",
        show(unused)
    );
}
