//! The REST API of the real `kipam controller` binary, against the stand-in answering its
//! token and access reviews.

use std::time::Duration;

use kube_standin::{AccessRequest, UserInfo};
use serde_json::{Value, json};

use super::support::Seed;

const WAIT: Duration = Duration::from_secs(30);

/// One HTTP/1.1 request; the answer's status and JSON body (`Null` when empty).
pub async fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if let Some(t) = token {
        request.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let body = body.map(Value::to_string).unwrap_or_default();
    request.push_str(&format!(
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    ));
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return (0, Value::Null);
        };
        if stream.write_all(request.as_bytes()).is_err() {
            return (0, Value::Null);
        }
        let mut buf = Vec::new();
        let _ = stream.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf).into_owned();
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
        (code, serde_json::from_str(body).unwrap_or(Value::Null))
    })
    .await
    .unwrap_or((0, Value::Null))
}

/// `admin-token` may do anything with kipam's resources, `reader-token` only read; the
/// controller's own token (the kubeconfig's) is its service account, allowed everything.
pub fn script_auth(seed: &Seed) {
    let own = seed.api.token();
    seed.api.set_token_review(move |token| match token {
        t if t == own => Some(UserInfo::new("system:serviceaccount:kipam-system:kipam")),
        "admin-token" => Some(UserInfo::new("admin@example.com")),
        "reader-token" => Some(UserInfo::new("viewer@example.com")),
        _ => None,
    });
    seed.api
        .set_access_review(|req: &AccessRequest| match req.user.username.as_str() {
            "system:serviceaccount:kipam-system:kipam" | "admin@example.com" => true,
            "viewer@example.com" => req
                .resource
                .as_ref()
                .is_some_and(|r| matches!(r.verb.as_str(), "get" | "list" | "watch")),
            _ => false,
        });
    // Every request the controller itself makes is authenticated and authorised too.
    seed.api.set_require_auth(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_pool_lifecycle_with_tokens_and_rbac() {
    let seed = Seed::start("api").await;
    script_auth(&seed);
    seed.cluster("c1", "dc-1");
    let ctl = seed.controller("ctl");
    let port = ctl.api_port;
    let pools = "/api/v2/seeds/seed/ipampools";

    // The API answers once the pool cache is loaded.
    let start = std::time::Instant::now();
    loop {
        let (code, body) = http(port, "GET", pools, Some("admin-token"), None).await;
        if code == 200 {
            assert_eq!(body, json!([]));
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "API never answered: {code} {body}\n{}",
            seed.log("ctl")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // No token, a wrong token: 401. A reader: lists, but 403 on POST.
    assert_eq!(http(port, "GET", pools, None, None).await.0, 401);
    assert_eq!(http(port, "GET", pools, Some("wrong"), None).await.0, 401);
    let pool = json!({
        "name": "metallb",
        "datacenters": {"dc-1": {
            "type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 8,
            "excludeRanges": ["10.0.0.0-10.0.0.3"]
        }}
    });
    let (code, body) = http(port, "POST", pools, Some("reader-token"), Some(&pool)).await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["error"]["code"], 403);
    assert!(seed.get("ipampools", None, "metallb").is_none());

    // The admin creates it; the controller allocates from it.
    let (code, body) = http(port, "POST", pools, Some("admin-token"), Some(&pool)).await;
    assert_eq!(code, 201, "{body}");
    seed.wait_for("c1 allocated from the API's pool", WAIT, "ctl", |s| {
        s.held("c1", "metallb") == "10.0.0.4-10.0.0.11"
    })
    .await;

    // Listed, with the usage the controller computed.
    let start = std::time::Instant::now();
    loop {
        let (code, list) = http(port, "GET", pools, Some("reader-token"), None).await;
        assert_eq!(code, 200);
        if list[0]["datacenters"]["dc-1"]["usage"]["allocated"] == "8" {
            assert_eq!(list[0]["name"], "metallb");
            assert_eq!(list[0]["datacenters"]["dc-1"]["usage"]["allocations"], 1);
            break;
        }
        assert!(start.elapsed() < WAIT, "usage never shown: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, allocations) = http(
        port,
        "GET",
        &format!("{pools}/metallb/allocations"),
        Some("reader-token"),
        None,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(allocations[0]["cluster"], "c1");
    assert_eq!(allocations[0]["addresses"], json!(["10.0.0.4-10.0.0.11"]));

    // PATCH grows the range and keeps the exclusions it does not name.
    let patch = json!({"datacenters": {"dc-1": {"allocationRange": 12}}});
    let (code, body) = http(
        port,
        "PATCH",
        &format!("{pools}/metallb"),
        Some("admin-token"),
        Some(&patch),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let stored = seed.get("ipampools", None, "metallb").unwrap();
    assert_eq!(
        stored["spec"]["datacenters"]["dc-1"]["excludeRanges"],
        json!(["10.0.0.0-10.0.0.3"])
    );
    seed.wait_for("c1 grown to 12 addresses", WAIT, "ctl", |s| {
        // Growth appends a piece next to the first one.
        s.held("c1", "metallb") == "10.0.0.4-10.0.0.11,10.0.0.12-10.0.0.15"
    })
    .await;
    let (code, _) = http(
        port,
        "PATCH",
        &format!("{pools}/metallb"),
        Some("reader-token"),
        Some(&patch),
    )
    .await;
    assert_eq!(code, 403);

    // DELETE: the pool goes and its allocation is released.
    let (code, _) = http(
        port,
        "DELETE",
        &format!("{pools}/metallb"),
        Some("reader-token"),
        None,
    )
    .await;
    assert_eq!(code, 403);
    let (code, body) = http(
        port,
        "DELETE",
        &format!("{pools}/metallb"),
        Some("admin-token"),
        None,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    seed.wait_for("pool and allocation gone", WAIT, "ctl", |s| {
        s.get("ipampools", None, "metallb").is_none() && s.allocation("c1", "metallb").is_none()
    })
    .await;
    let (code, body) = http(
        port,
        "GET",
        &format!("{pools}/metallb"),
        Some("admin-token"),
        None,
    )
    .await;
    assert_eq!(code, 404, "{body}");
    let (code, body) = http(
        port,
        "GET",
        "/api/v2/seeds/other/ipampools",
        Some("admin-token"),
        None,
    )
    .await;
    assert_eq!(code, 400, "{body}");

    // Tokens never reach the log.
    let log = std::fs::read_to_string(seed.log_path("ctl")).unwrap_or_default();
    assert!(log.contains("pool created through the API"), "{log}");
    for secret in ["admin-token", "reader-token", &seed.api.token()] {
        assert!(!log.contains(secret), "token in the log");
    }
}

/// Not a test: serves a seed (stand-in with the tokens above, one cluster `c1` in `dc-1`)
/// and a controller with its API on 127.0.0.1:18080 for `KIPAM_API_DEMO_SECONDS` seconds,
/// to run the curl examples of docs/api.md against:
/// `KIPAM_API_DEMO_SECONDS=300 cargo test --test controller api_demo -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn api_demo() {
    let seed = Seed::start("api-demo").await;
    script_auth(&seed);
    seed.cluster("c1", "dc-1");
    let ctl = seed.controller_on("ctl", 18080);
    let seconds: u64 = std::env::var("KIPAM_API_DEMO_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    println!(
        "API on 127.0.0.1:{}, metrics on 127.0.0.1:{}, for {seconds} s",
        ctl.api_port, ctl.metrics_port
    );
    tokio::time::sleep(Duration::from_secs(seconds)).await;
}

/// With `--api-tls-cert-file` / `--api-tls-key-file` the API answers over TLS only, and a
/// certificate rotated on disk is served without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_is_served_over_tls_and_follows_a_rotated_certificate() {
    let seed = Seed::start("api-tls").await;
    script_auth(&seed);
    let write = |tag: &str| {
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, format!("kipam API CA {tag}"));
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf_cert = leaf
            .signed_by(&leaf_key, &rcgen::Issuer::from_params(&ca, &ca_key))
            .unwrap();
        std::fs::write(seed.dir().join("api.crt"), leaf_cert.pem()).unwrap();
        std::fs::write(seed.dir().join("api.key"), leaf_key.serialize_pem()).unwrap();
        ca_cert.pem().into_bytes()
    };
    let first_ca = write("one");
    let cert = seed.dir().join("api.crt").display().to_string();
    let key = seed.dir().join("api.key").display().to_string();
    let ctl = seed.controller_with(
        "ctl",
        &["--api-tls-cert-file", &cert, "--api-tls-key-file", &key],
    );
    let url = format!(
        "https://127.0.0.1:{}/api/v2/seeds/seed/ipampools",
        ctl.api_port
    );
    let call = |ca: Vec<u8>| {
        let url = url.clone();
        async move {
            kube_standin::https::post(&url, &ca, "application/json", b"{}", Duration::from_secs(5))
                .await
        }
    };
    // No token: 401 with KKP's error shape, over TLS checked against the first CA.
    let start = std::time::Instant::now();
    let answer = loop {
        match call(first_ca.clone()).await {
            Ok(r) => break r,
            Err(e) if start.elapsed() < WAIT => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no TLS answer: {e}\n{}", seed.log("ctl")),
        }
    };
    assert_eq!(answer.status, 401);
    let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(body["error"]["code"], 401);
    // Plain HTTP is not served on that port.
    let (code, _) = http(
        ctl.api_port,
        "GET",
        "/api/v2/seeds/seed/ipampools",
        Some("admin-token"),
        None,
    )
    .await;
    assert_ne!(code, 200);

    // Rotated on disk: the new certificate is served within the reload interval.
    let second_ca = write("two");
    let start = std::time::Instant::now();
    loop {
        if call(second_ca.clone()).await.is_ok_and(|r| r.status == 401) {
            break;
        }
        assert!(
            start.elapsed() < WAIT,
            "the rotated certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        call(first_ca).await.is_err(),
        "the old certificate is no longer served"
    );
}
