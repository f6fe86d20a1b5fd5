//! Serving over TLS, as a real API server does: ALPN offers `h2` and `http/1.1`, so an HTTP/2
//! client multiplexes all its requests and watches over one connection while an HTTP/1.1
//! client gets a connection per request in flight. Every instance in a process shares one
//! certificate for `127.0.0.1` (made once, by a CA of its own), so starting thousands costs no
//! key generation each. Connections are counted, open and in total, so tests can state how
//! many a client holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The process-wide certificate: the CA's PEM (for kubeconfigs) and the server's config.
struct Material {
    ca_pem: String,
    config: Arc<rustls::ServerConfig>,
}

fn material() -> Result<&'static Material, String> {
    static MATERIAL: OnceLock<Result<Material, String>> = OnceLock::new();
    MATERIAL
        .get_or_init(make_material)
        .as_ref()
        .map_err(Clone::clone)
}

fn make_material() -> Result<Material, String> {
    let err = |e: &dyn std::fmt::Display| format!("stand-in TLS material: {e}");
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(|e| err(&e))?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "kube-standin CA");
    let ca_key = rcgen::KeyPair::generate().map_err(|e| err(&e))?;
    let ca_cert = ca.self_signed(&ca_key).map_err(|e| err(&e))?;
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".into()])
        .map_err(|e| err(&e))?;
    let leaf_key = rcgen::KeyPair::generate().map_err(|e| err(&e))?;
    let issuer = rcgen::Issuer::from_params(&ca, &ca_key);
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(|e| err(&e))?;
    let chain = vec![CertificateDer::from(leaf_cert.der().to_vec())];
    let key =
        PrivateKeyDer::from_pem_slice(leaf_key.serialize_pem().as_bytes()).map_err(|e| err(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| err(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Material {
        ca_pem: ca_cert.pem(),
        config: Arc::new(config),
    })
}

/// The CA certificate (PEM) that signed every instance's serving certificate.
pub fn ca_pem() -> Result<String, String> {
    material().map(|m| m.ca_pem.clone())
}

/// Connections a TLS instance accepted: open now, and in total.
#[derive(Debug, Default)]
pub struct Connections {
    open: AtomicU64,
    total: AtomicU64,
    /// How long each TLS handshake waits before it starts, in milliseconds.
    handshake_delay_ms: AtomicU64,
}

impl Connections {
    /// Makes every new connection wait `delay` before its TLS handshake, as a server busy with
    /// thousands of new clients does.
    pub fn delay_handshakes(&self, delay: std::time::Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.handshake_delay_ms.store(ms, Ordering::SeqCst);
    }

    pub fn open(&self) -> u64 {
        self.open.load(Ordering::SeqCst)
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }
}

/// Counts a connection open for as long as it lives.
struct Counted(Arc<Connections>);

impl Counted {
    fn new(c: Arc<Connections>) -> Self {
        c.open.fetch_add(1, Ordering::SeqCst);
        c.total.fetch_add(1, Ordering::SeqCst);
        Counted(c)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts TLS connections until `shutdown` turns true, serving each with HTTP/1.1 or HTTP/2
/// as ALPN chose; open connections are dropped at shutdown.
pub(crate) async fn serve(
    listener: TcpListener,
    app: axum::Router,
    connections: Arc<Connections>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = match material() {
        Ok(m) => TlsAcceptor::from(m.config.clone()),
        Err(e) => {
            eprintln!("{e}");
            return;
        }
    };
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|v| *v) => return,
        };
        let Ok((tcp, _)) = accepted else {
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        let connections = connections.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let delay = connections.handshake_delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
            }
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let _counted = Counted::new(connections);
            let builder = auto::Builder::new(TokioExecutor::new());
            let serving = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            tokio::select! {
                _ = serving => {}
                _ = shutdown.wait_for(|v| *v) => {}
            }
        });
    }
}
