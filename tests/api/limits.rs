//! Body size, request time and concurrency bounds.

use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;

use kipam::api::ApiOptions;

use super::harness::*;

#[tokio::test]
async fn a_body_of_several_megabytes_is_413_declared_or_streamed() {
    let h = Harness::start().await;
    let big = format!(
        "{{\"name\": \"p\", \"x\": \"{}\"}}",
        "a".repeat(5 * 1024 * 1024)
    );
    let (status, body) = h
        .call("POST", POOLS, Some("admin"), Some(Body::from(big.clone())))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(error_of(status, &body).contains("larger than 1048576 bytes"));
    // Without a Content-Length: counted while it is read.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big
        .as_bytes()
        .chunks(64 * 1024)
        .map(|c| Ok(c.to_vec()))
        .collect();
    let stream = Body::from_stream(futures::stream::iter(chunks));
    h.pool(METALLB).await;
    let (status, body) = h
        .call(
            "PATCH",
            &format!("{POOLS}/metallb"),
            Some("admin"),
            Some(stream),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    error_of(status, &body);
    // Unauthenticated: refused before the body is looked at.
    let (status, _) = h.call("POST", POOLS, None, Some(Body::from(big))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_request_over_the_timeout_is_503() {
    let h = Harness::with_options(ApiOptions {
        request_timeout: Duration::from_millis(300),
        ..ApiOptions::default()
    })
    .await;
    h.api.set_latency(Duration::from_secs(2));
    let (status, body) = h.get(POOLS, "admin").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(error_of(status, &body).contains("did not finish"));
}

#[tokio::test]
async fn requests_over_the_concurrency_bound_are_429() {
    let h = Harness::with_options(ApiOptions {
        max_concurrent: 2,
        ..ApiOptions::default()
    })
    .await;
    h.api.set_latency(Duration::from_millis(500));
    let (a, b, c) = tokio::join!(h.get(POOLS, "admin"), h.get(POOLS, "admin"), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        h.get(POOLS, "admin").await
    });
    assert_eq!(a.0, StatusCode::OK);
    assert_eq!(b.0, StatusCode::OK);
    assert_eq!(c.0, StatusCode::TOO_MANY_REQUESTS);
    error_of(c.0, &c.1);
    // Permits come back.
    assert_eq!(h.get(POOLS, "admin").await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let h = Harness::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(kipam::api::serve(listener, h.router.clone()));
    let started = std::time::Instant::now();
    let (closed, answered) = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        // A whole request is served on the same kind of connection...
        let mut ok = std::net::TcpStream::connect(addr).unwrap();
        ok.write_all(format!("GET {POOLS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin\r\nConnection: close\r\n\r\n").as_bytes())
            .unwrap();
        let mut answer = String::new();
        ok.read_to_string(&mut answer).unwrap();
        // ...while one that stops halfway through its headers is dropped.
        let mut slow = std::net::TcpStream::connect(addr).unwrap();
        slow.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        slow.write_all(b"GET /api/v2/openapi.json HTTP/1.1\r\nHost: x\r\n").unwrap();
        let mut rest = Vec::new();
        let closed = slow.read_to_end(&mut rest).is_ok();
        (closed, answer)
    })
    .await
    .unwrap();
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(closed, "the connection was closed by the server");
    let waited = started.elapsed();
    assert!(
        waited >= kipam::api::HEADER_READ_TIMEOUT && waited < kipam::api::HEADER_READ_TIMEOUT * 2,
        "{waited:?}"
    );
    server.abort();
}

/// A CA and a leaf for 127.0.0.1 signed by it, written as `tls.crt` / `tls.key` in `dir`:
/// (the CA's PEM, the files).
fn api_certificate(dir: &std::path::Path) -> (String, kipam::tls::TlsFiles) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "kipam API test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_pem = ca.clone().self_signed(&ca_key).unwrap().pem();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &rcgen::Issuer::from_params(&ca, &ca_key))
        .unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tls.crt"), leaf.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), leaf_key.serialize_pem()).unwrap();
    (
        ca_pem,
        kipam::tls::TlsFiles::new(dir.join("tls.crt"), dir.join("tls.key")),
    )
}

/// A TLS connection to `addr` whose handshake is complete, trusting only `ca_pem`.
async fn tls_connect(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// The same bound over TLS: the clock starts once the handshake is done, and a client that
/// then stops halfway through its headers is dropped like a plain one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_headers_over_tls_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::start().await;
    let dir = std::env::temp_dir().join(format!("kipam-api-tls-headers-{}", std::process::id()));
    let (ca_pem, files) = api_certificate(&dir);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(kipam::api::serve_tls(listener, files, h.router.clone()));
    let started = std::time::Instant::now();
    // A whole request is served on the same kind of connection...
    let mut ok = tls_connect(addr, &ca_pem).await;
    ok.write_all(format!("GET {POOLS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    // (the server may close without a TLS close_notify: what was read is what counts)
    let _ = ok.read_to_end(&mut answer).await;
    let answered = String::from_utf8_lossy(&answer).to_string();
    // ...while one that stops halfway through its headers is dropped.
    let mut slow = tls_connect(addr, &ca_pem).await;
    slow.write_all(b"GET /api/v2/openapi.json HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(30), slow.read_to_end(&mut rest)).await;
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(ended.is_ok(), "the connection was closed by the server");
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    let waited = started.elapsed();
    assert!(
        waited >= kipam::api::HEADER_READ_TIMEOUT && waited < kipam::api::HEADER_READ_TIMEOUT * 2,
        "{waited:?}"
    );
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
