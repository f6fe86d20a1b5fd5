//! A TLS server for HTTP endpoints, with the certificate and key read from files and picked up
//! again when they change (cert-manager rotates them in place through a Secret volume).
//!
//! - [`TlsFiles::new`] names the PEM files; [`TlsFiles::load`] reads them once and says clearly
//!   what is wrong (a missing file, no certificate, no key, a key that does not match).
//! - [`serve`] serves an `axum::Router` on a `TcpListener` over TLS until a shutdown future
//!   completes. Handshakes run concurrently, each bounded by a timeout, so a client that never
//!   finishes its handshake holds up nobody else.
//! - The files are read again at most every [`TlsFiles::with_check_interval`] (default 5 s), on
//!   the next handshake after the interval: a new pair is used as soon as both parse and match;
//!   a half-written or broken pair is logged once and the previous pair kept, so a rotation in
//!   progress never takes the server down.
//!
//! Only the `ring` provider is used (kube's): a second provider in the process would make
//! rustls refuse to pick a default one.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a certificate and key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate in it")]
    NoCertificate { path: PathBuf },
    #[error("{path}: {reason}")]
    BadCertificate { path: PathBuf, reason: String },
    #[error("{path}: no usable PEM private key in it ({reason})")]
    BadKey { path: PathBuf, reason: String },
    #[error("{key} does not belong to the certificate in {cert}")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("TLS setup failed: {0}")]
    Setup(String),
}

/// The certificate chain and private key files of a TLS server.
#[derive(Clone)]
pub struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    check_interval: Duration,
}

impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsFiles {
    /// A PEM certificate chain (leaf first) and its PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        TlsFiles {
            cert: cert.into(),
            key: key.into(),
            check_interval: Duration::from_secs(5),
        }
    }

    /// How often the files are looked at again (on the next handshake after the interval).
    pub fn with_check_interval(mut self, interval: Duration) -> Self {
        self.check_interval = interval;
        self
    }

    pub fn cert_path(&self) -> &Path {
        &self.cert
    }

    pub fn key_path(&self) -> &Path {
        &self.key
    }

    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| TlsError::Read {
                path: p.to_path_buf(),
                source,
            })
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    fn parse(&self, cert: &[u8], key: &[u8]) -> Result<Arc<CertifiedKey>, TlsError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<_, _>>()
            .map_err(|e| TlsError::BadCertificate {
                path: self.cert.clone(),
                reason: e.to_string(),
            })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: self.cert.clone(),
            });
        }
        let key_der = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::BadKey {
            path: self.key.clone(),
            reason: e.to_string(),
        })?;
        let signing = provider()
            .key_provider
            .load_private_key(key_der)
            .map_err(|e| TlsError::BadKey {
                path: self.key.clone(),
                reason: e.to_string(),
            })?;
        let certified = CertifiedKey::new(chain, signing);
        match certified.keys_match() {
            Ok(()) => Ok(Arc::new(certified)),
            // A key whose public half cannot be derived is checked by the first handshake.
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
                Ok(Arc::new(certified))
            }
            Err(_) => Err(TlsError::Mismatch {
                cert: self.cert.clone(),
                key: self.key.clone(),
            }),
        }
    }

    /// Reads and checks the pair once.
    pub fn load(&self) -> Result<Arc<CertifiedKey>, TlsError> {
        let (cert, key) = self.read()?;
        self.parse(&cert, &key)
    }

    /// A rustls server configuration (HTTP/1.1 only) whose certificate follows the files.
    /// Fails when the files cannot be used now.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let resolver = Arc::new(Reloading::new(self.clone())?);
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

struct Current {
    cert_bytes: Vec<u8>,
    key_bytes: Vec<u8>,
    key: Arc<CertifiedKey>,
    checked: Instant,
    /// The last reload problem reported, so it is logged once.
    problem: Option<String>,
}

/// Serves the current pair, re-reading the files at most once per check interval.
struct Reloading {
    files: TlsFiles,
    current: Mutex<Current>,
}

impl fmt::Debug for Reloading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("files", &self.files)
            .finish()
    }
}

impl Reloading {
    fn new(files: TlsFiles) -> Result<Self, TlsError> {
        let (cert_bytes, key_bytes) = files.read()?;
        let key = files.parse(&cert_bytes, &key_bytes)?;
        Ok(Reloading {
            files,
            current: Mutex::new(Current {
                cert_bytes,
                key_bytes,
                key,
                checked: Instant::now(),
                problem: None,
            }),
        })
    }

    fn key(&self) -> Arc<CertifiedKey> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.checked.elapsed() >= self.files.check_interval {
            current.checked = Instant::now();
            let outcome = self.files.read().and_then(|(cert, key)| {
                if cert == current.cert_bytes && key == current.key_bytes {
                    return Ok(None);
                }
                let parsed = self.files.parse(&cert, &key)?;
                Ok(Some((cert, key, parsed)))
            });
            match outcome {
                Ok(None) => {}
                Ok(Some((cert, key, parsed))) => {
                    tracing::info!(
                        cert = %self.files.cert.display(),
                        "TLS certificate changed on disk: serving the new one"
                    );
                    current.cert_bytes = cert;
                    current.key_bytes = key;
                    current.key = parsed;
                    current.problem = None;
                }
                Err(e) => {
                    let message = e.to_string();
                    if current.problem.as_deref() != Some(message.as_str()) {
                        tracing::warn!(
                            "cannot use the TLS files as they are now ({message}); still serving the previous certificate"
                        );
                        current.problem = Some(message);
                    }
                }
            }
        }
        current.key.clone()
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key())
    }
}

/// A listener yielding TLS connections whose handshakes completed; the handshakes run in
/// their own tasks.
struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop ended (the listener failed): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// A TLS acceptor whose certificate follows the files (for servers that run their own
/// connection loop, such as the REST API). Fails when the files cannot be used now.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    Ok(TlsAcceptor::from(files.server_config()?))
}

/// Completes the TLS handshake of one accepted connection within [`HANDSHAKE_TIMEOUT`];
/// `None` (logged at debug) when the client fails or stalls.
pub async fn handshake(acceptor: &TlsAcceptor, tcp: TcpStream) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::debug!("TLS handshake failed: {e}");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            None
        }
    }
}

/// Serves `router` over TLS on `listener` until `shutdown` completes (connections in flight
/// are finished first). Fails at once when the files cannot be used.
pub async fn serve(
    listener: TcpListener,
    files: TlsFiles,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TlsError> {
    let acceptor = TlsAcceptor::from(files.server_config()?);
    let local = listener
        .local_addr()
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let (tx, rx) = mpsc::channel(64);
    let accept_loop = tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment instead of spinning.
                    tracing::warn!("accepting a TLS connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send((stream, peer)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    let result = axum::serve(TlsListener { rx, local }, router)
        .with_graceful_shutdown(shutdown)
        .await;
    accept_loop.abort();
    result.map_err(|e| TlsError::Setup(e.to_string()))
}
