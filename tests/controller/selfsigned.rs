//! `--webhook-self-signed` end to end: two replicas of the real binary start at once without a
//! certificate; one Secret comes out of the race, both serve the certificate it holds, the CA
//! lands in the configuration's caBundle (and is put back when something removes it), and the
//! stand-in — which trusts only that caBundle — reaches the webhook through it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use kipam::resources::IPAMPool;
use kipam::webhook::selfsigned::{self, SelfSignedOptions};

use crate::support::{Controller, Seed, free_port};

const SECRET: &str = "kipam-webhook-tls";

/// A replica making its own certificate for the Service `localhost` (the stand-in calls the
/// URL https://localhost:<port>, so that name must be in the certificate).
fn replica(seed: &Seed, identity: &str) -> (Controller, u16) {
    let port = free_port();
    let dir = seed.dir().join(format!("{identity}-certs"));
    let controller = seed.controller_with(
        identity,
        &[
            "--webhook-addr",
            &format!("127.0.0.1:{port}"),
            "--webhook-self-signed",
            "--webhook-service",
            "localhost",
            "--webhook-secret",
            SECRET,
            "--webhook-config-name",
            "kipam",
            "--webhook-cert-dir",
            &dir.display().to_string(),
            "--webhook-cert-check-interval",
            "1",
            "--service-account",
            "system:kipam-itself",
        ],
    );
    (controller, port)
}

/// The configuration as `kipam webhook-config --url` prints it: a placeholder caBundle.
fn install_configuration(seed: &Seed, port: u16) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kipam"))
        .args([
            "webhook-config",
            "--url",
            &format!("https://localhost:{port}"),
            "--service-account",
            "system:kipam-itself",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    seed.apply(&String::from_utf8(out.stdout).unwrap());
}

fn ca_bundle(seed: &Seed) -> Option<String> {
    let config = seed.get(
        "validatingwebhookconfigurations.admissionregistration.k8s.io",
        None,
        "kipam",
    )?;
    config["webhooks"][0]["clientConfig"]["caBundle"]
        .as_str()
        .map(str::to_string)
}

fn stored_secret(seed: &Seed) -> Option<Secret> {
    seed.get("secrets", Some("kipam-system"), SECRET)
        .and_then(|v| serde_json::from_value(v).ok())
}

async fn wait<T>(what: &str, seed: &Seed, logs: &[&str], mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..300 {
        if let Some(v) = f() {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let logs: Vec<String> = logs.iter().map(|l| seed.log(l)).collect();
    panic!("{what} never happened\n{}", logs.join("\n----\n"));
}

/// The leaf certificate a replica presents, checked against `ca` for the name `localhost`.
async fn served_certificate(port: u16, ca: &str) -> Result<Vec<u8>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (_, connection) = tls.get_ref();
    connection
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .ok_or_else(|| "no certificate presented".to_string())
}

fn der_of(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .as_ref()
        .to_vec()
}

fn data(secret: &Secret, key: &str) -> String {
    String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

/// Admin writes go through the webhook (the admin is not kipam): an invalid pool is refused
/// with the webhook's message, which proves the API server reached it over TLS.
async fn webhook_refuses_a_bad_pool(seed: &Seed, logs: &[&str]) {
    let kc = kube::config::Kubeconfig::from_yaml(&seed.api.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let pools: Api<IPAMPool> = Api::all(kube::Client::try_from(cfg).unwrap());
    let bad: IPAMPool = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": "bad"},
        "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.5.0.0/26", "allocationRange": 65}}},
    }))
    .unwrap();
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut last = String::new();
    for _ in 0..200 {
        match pools.create(&dry, &bad).await {
            Err(kube::Error::Api(s)) if s.message.contains("denied the request") => {
                assert!(s.message.contains("allocationRange"), "{}", s.message);
                return;
            }
            other => last = format!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let logs: Vec<String> = logs.iter().map(|l| seed.log(l)).collect();
    panic!(
        "the webhook never refused the bad pool: {last}\n{}",
        logs.join("\n----\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_self_signed_certificate_and_keep_the_ca_bundle() {
    let seed = Seed::start("selfsigned").await;
    let (_a, port_a) = replica(&seed, "s1");
    let (_b, port_b) = replica(&seed, "s2");
    install_configuration(&seed, port_a);
    let logs = ["s1", "s2"];

    let secret = wait("the certificate Secret", &seed, &logs, || {
        stored_secret(&seed)
    })
    .await;
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let ca = data(&secret, "ca.crt");
    let cert = data(&secret, "tls.crt");
    let names = &secret.metadata.annotations.as_ref().unwrap()[selfsigned::ANNOTATION_DNS_NAMES];
    assert_eq!(
        names,
        "localhost,localhost.kipam-system,localhost.kipam-system.svc,localhost.kipam-system.svc.cluster.local"
    );

    // The placeholder is replaced by the Secret's CA.
    let expected = kipam::webhook::config::base64(ca.as_bytes());
    wait("the caBundle", &seed, &logs, || {
        (ca_bundle(&seed).as_deref() == Some(expected.as_str())).then_some(())
    })
    .await;

    // Both replicas present the Secret's certificate, valid for `localhost` under its CA.
    for port in [port_a, port_b] {
        let mut served = Err(String::new());
        for _ in 0..200 {
            served = served_certificate(port, &ca).await;
            if served.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            served.unwrap_or_else(|e| panic!("port {port}: {e}")),
            der_of(&cert),
            "port {port} serves another certificate"
        );
    }
    // The race for the Secret left it as it was first written.
    assert_eq!(
        stored_secret(&seed).map(|s| data(&s, "tls.crt")),
        Some(cert)
    );

    // The stand-in trusts only the caBundle: a refusal means it reached the webhook over TLS.
    webhook_refuses_a_bad_pool(&seed, &logs).await;

    // Something (a `helm upgrade`, a person) resets the caBundle: kipam puts it back.
    let mut config = seed
        .get(
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
            None,
            "kipam",
        )
        .unwrap();
    config["webhooks"][0]["clientConfig"]["caBundle"] = Value::from("Cg==");
    seed.api.apply(&config).unwrap();
    wait("the caBundle put back", &seed, &logs, || {
        (ca_bundle(&seed).as_deref() == Some(expected.as_str())).then_some(())
    })
    .await;
    webhook_refuses_a_bad_pool(&seed, &logs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_certificate_is_served_as_it_is_and_a_stale_one_is_renewed_with_the_same_ca() {
    let seed = Seed::start("selfsigned-stored").await;
    let options = SelfSignedOptions {
        namespace: "kipam-system".into(),
        secret: SECRET.into(),
        service: "localhost".into(),
        configuration: "kipam".into(),
        dir: seed.dir().join("unused"),
        check_interval: Duration::from_secs(1),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Made earlier (by another replica, say): kipam takes it as it is.
    let bundle = selfsigned::generate(&options.dns_names(), None, now).unwrap();
    let secret = selfsigned::secret_for(&options, &bundle, None);
    seed.api
        .apply(&serde_json::to_value(&secret).unwrap())
        .unwrap();
    let (mut a, port) = replica(&seed, "t1");
    install_configuration(&seed, port);
    let logs = ["t1"];
    let expected = kipam::webhook::config::base64(bundle.ca_cert.as_bytes());
    wait("the caBundle", &seed, &logs, || {
        (ca_bundle(&seed).as_deref() == Some(expected.as_str())).then_some(())
    })
    .await;
    assert_eq!(
        served_certificate(port, &bundle.ca_cert).await.unwrap(),
        der_of(&bundle.cert)
    );
    assert_eq!(
        stored_secret(&seed).map(|s| data(&s, "tls.crt")),
        Some(bundle.cert.clone()),
        "a good certificate is not replaced"
    );
    a.kill();

    // The serving certificate ends within the renewal margin: renewed, the CA kept.
    let mut stale = stored_secret(&seed).unwrap();
    stale.metadata.annotations.as_mut().unwrap().insert(
        selfsigned::ANNOTATION_NOT_AFTER.into(),
        (now + 86_400).to_string(),
    );
    seed.api
        .apply(&serde_json::to_value(&stale).unwrap())
        .unwrap();
    let (_b, port_b) = replica(&seed, "t2");
    let renewed = wait("the renewal", &seed, &["t2"], || {
        stored_secret(&seed).filter(|s| data(s, "tls.crt") != bundle.cert)
    })
    .await;
    assert_eq!(data(&renewed, "ca.crt"), bundle.ca_cert, "the CA is kept");
    assert_eq!(data(&renewed, "ca.key"), bundle.ca_key);
    let mut served = Err(String::new());
    for _ in 0..200 {
        served = served_certificate(port_b, &bundle.ca_cert).await;
        if served.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(served.unwrap(), der_of(&data(&renewed, "tls.crt")));
    // The configuration never needed to change.
    assert_eq!(ca_bundle(&seed).as_deref(), Some(expected.as_str()));
}
