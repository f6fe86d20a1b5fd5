//! `kipam webhook-config`: the configuration the API server needs.

use std::process::Command;

use serde_json::Value;

fn config(args: &[&str]) -> (bool, Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kipam"))
        .arg("webhook-config")
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let value: Value = if out.status.success() {
        serde_saphyr::from_str(&text).unwrap()
    } else {
        Value::Null
    };
    (
        out.status.success(),
        value,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn the_default_configuration_reaches_the_service_with_a_ca_placeholder() {
    let (ok, c, err) = config(&[]);
    assert!(ok, "{err}");
    assert_eq!(c["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(c["kind"], "ValidatingWebhookConfiguration");
    assert_eq!(
        c["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "kipam-system/kipam-webhook"
    );
    let w = &c["webhooks"][0];
    assert_eq!(w["name"], "validate.ipam.kipam.dev");
    // It writes one thing, the address of a hand-made `IPAddress` it admits, never on a dry run.
    assert_eq!(w["sideEffects"], "NoneOnDryRun");
    assert_eq!(w["matchPolicy"], "Equivalent");
    assert_eq!(w["failurePolicy"], "Fail");
    assert_eq!(w["timeoutSeconds"], 10);
    assert_eq!(w["admissionReviewVersions"], serde_json::json!(["v1"]));
    assert_eq!(
        w["clientConfig"]["service"],
        serde_json::json!({"namespace": "kipam-system", "name": "kipam-webhook", "path": "/validate", "port": 443})
    );
    assert_eq!(w["clientConfig"]["caBundle"], "Cg==");
    assert_eq!(
        w["matchConditions"][0]["expression"],
        "request.userInfo.username != \"system:serviceaccount:kipam-system:kipam\""
    );
    let rules = w["rules"].as_array().unwrap();
    let find = |resource: &str| {
        rules
            .iter()
            .find(|r| {
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
            })
            .unwrap_or_else(|| panic!("no rule for {resource}"))
            .clone()
    };
    for (resource, ops, scope) in [
        ("ipampools", vec!["CREATE", "UPDATE"], "Cluster"),
        ("clusters", vec!["CREATE", "UPDATE"], "Cluster"),
        (
            "ipamallocations",
            vec!["CREATE", "UPDATE", "DELETE"],
            "Namespaced",
        ),
        (
            "ipampoolrecords",
            vec!["CREATE", "UPDATE", "DELETE"],
            "Cluster",
        ),
    ] {
        let r = find(resource);
        assert_eq!(r["apiGroups"], serde_json::json!(["ipam.kipam.dev"]));
        assert_eq!(r["operations"], serde_json::json!(ops), "{resource}");
        assert_eq!(r["scope"], scope, "{resource}");
    }
    // Cluster API's IPAddresses naming a kipam pool, every version.
    let r = find("ipaddresses");
    assert_eq!(r["apiGroups"], serde_json::json!(["ipam.cluster.x-k8s.io"]));
    assert_eq!(r["apiVersions"], serde_json::json!(["*"]));
    assert_eq!(r["resources"], serde_json::json!(["ipaddresses"]));
    assert_eq!(r["operations"], serde_json::json!(["CREATE", "UPDATE"]));
    assert_eq!(r["scope"], "Namespaced");
}

#[test]
fn a_url_and_a_ca_file_are_used_as_given_and_bad_values_refused() {
    let dir = std::env::temp_dir().join(format!("kipam-webhook-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(
        &ca,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let (ok, c, err) = config(&[
        "--url",
        "https://10.0.0.1:9443/",
        "--ca-file",
        ca.to_str().unwrap(),
        "--failure-policy",
        "Ignore",
        "--timeout-seconds",
        "5",
    ]);
    assert!(ok, "{err}");
    let w = &c["webhooks"][0];
    assert_eq!(w["clientConfig"]["url"], "https://10.0.0.1:9443/validate");
    assert_eq!(
        w["clientConfig"]["caBundle"],
        kipam::webhook::config::base64(&std::fs::read(&ca).unwrap())
    );
    assert!(c["metadata"].get("annotations").is_none());
    assert_eq!(w["failurePolicy"], "Ignore");
    assert_eq!(w["timeoutSeconds"], 5);
    std::fs::write(&ca, "not a certificate").unwrap();
    let (ok, _, err) = config(&["--ca-file", ca.to_str().unwrap()]);
    assert!(!ok && err.contains("no PEM certificate"), "{err}");
    let (ok, _, _) = config(&["--timeout-seconds", "31"]);
    assert!(!ok);
    let (ok, _, _) = config(&["--failure-policy", "Sometimes"]);
    assert!(!ok);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn base64_matches_the_standard_alphabet() {
    use kipam::webhook::config::base64;
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    assert_eq!(base64(&[0xff, 0xfe]), "//4=");
}

/// An `IPAddress` of pool `pool` in group `group` (`None`: a `v1beta1` reference without
/// `apiGroup`), with a finalizer as providers put on them.
fn ip_address(name: &str, group: Option<&str>, pool: &str) -> Value {
    let mut pool_ref = serde_json::json!({"kind": "InClusterIPPool", "name": pool});
    let version = match group {
        Some(g) => {
            pool_ref["apiGroup"] = serde_json::json!(g);
            if g == "ipam.kipam.dev" {
                pool_ref["kind"] = serde_json::json!("IPAMPool");
            }
            "v1beta2"
        }
        None => "v1beta1",
    };
    serde_json::json!({
        "apiVersion": format!("ipam.cluster.x-k8s.io/{version}"),
        "kind": "IPAddress",
        "metadata": {"name": name, "namespace": "machines", "finalizers": ["example.com/protect"]},
        "spec": {"address": "10.1.2.3", "prefix": 24, "claimRef": {"name": name}, "poolRef": pool_ref},
    })
}

/// kipam's webhook down (its URL answers nothing, `failurePolicy: Fail`): another provider's
/// `IPAddress`es are created, have their finalizer removed and go, while one naming a kipam
/// pool is refused — the generated configuration, applied to an API server that evaluates its
/// `matchConditions`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_webhook_down_only_kipam_s_ip_addresses_are_blocked() {
    use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
    use kube::core::{ApiResource, GroupVersionKind};

    let server = kube_standin::ApiServer::start().await.expect("stand-in");
    server
        .apply_yaml(include_str!("../fixtures/capi/capi-ipam-ipaddresses.yaml"))
        .expect("Cluster API's IPAddress CRD");
    server
        .apply(&serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "machines"}}))
        .expect("namespace");
    // Nothing listens on this port: every call to the webhook fails.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let (ok, config, err) = config(&["--url", &format!("https://127.0.0.1:{closed}")]);
    assert!(ok, "{err}");
    assert_eq!(config["webhooks"][0]["failurePolicy"], "Fail");
    server.apply(&config).expect("the configuration applies");

    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml()).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(cfg).expect("client");
    let api = |version: &str| -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("ipam.cluster.x-k8s.io", version, "IPAddress");
        Api::namespaced_with(client.clone(), "machines", &ApiResource::from_gvk(&gvk))
    };
    let create = |version: &str, obj: Value| {
        let api = api(version);
        async move {
            let obj: DynamicObject = serde_json::from_value(obj).expect("object");
            api.create(&PostParams::default(), &obj).await
        }
    };

    // Another provider's, v1beta2 and v1beta1 (no apiGroup): created, finalizer removed, gone.
    for (name, version, group) in [
        ("other-0", "v1beta2", Some("ipam.cluster.x-k8s.io")),
        ("other-1", "v1beta1", None),
    ] {
        create(version, ip_address(name, group, "in-cluster"))
            .await
            .unwrap_or_else(|e| panic!("{name}: another provider's IPAddress refused: {e}"));
        api(version)
            .delete(name, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("{name}: delete refused: {e}"));
        api(version)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: finalizer removal refused: {e}"));
        assert!(
            server
                .get("ipaddresses.ipam.cluster.x-k8s.io", Some("machines"), name)
                .is_none(),
            "{name} is gone"
        );
    }

    // One naming a kipam pool: the API server must ask kipam, cannot, and refuses.
    let e = create(
        "v1beta2",
        ip_address("kipam-0", Some("ipam.kipam.dev"), "machines"),
    )
    .await
    .expect_err("a kipam pool's IPAddress with the webhook down");
    let kube::Error::Api(status) = e else {
        panic!("not an API error: {e}");
    };
    assert_eq!(status.code, 500, "{status:?}");
    assert!(
        status
            .message
            .contains("failed calling webhook \"validate.ipam.kipam.dev\""),
        "{}",
        status.message
    );
}
