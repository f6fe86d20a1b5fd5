//! HTTP endpoints over TLS, with the certificate and key read from files and picked up again
//! when they change (cert-manager rotates them in place through a Secret volume).
//!
//! - [`TlsFiles::new`] names the PEM files; [`TlsFiles::load`] reads them once and says clearly
//!   what is wrong (a missing file, no certificate, no key, a key that does not match).
//! - The files are read again at most every [`TlsFiles::with_check_interval`] (default 5 s), on
//!   the next handshake after the interval: a new pair is used as soon as both parse and match;
//!   a half-written or broken pair is logged once and the previous pair kept, so a rotation in
//!   progress never takes the server down.
//! - [`serve`] serves an `axum::Router` over TLS until a shutdown future completes;
//!   [`serve_http1`] is the same server with a header read timeout and TLS optional (the REST
//!   API uses it for plain HTTP too). The serving itself is `axum-server`'s: every connection,
//!   its handshake included, runs in a task of its own and a handshake must finish within
//!   [`HANDSHAKE_TIMEOUT`], so a client that stalls holds up nobody else.
//!
//! The files are watched here rather than by `axum-server`, because its `RustlsConfig` cannot
//! do what kipam needs of them (tried against `axum-server` 0.9.2):
//! - it reads the files only when asked to (`from_pem_file`, `reload_from_pem_file`): with the
//!   pair rotated on disk, a server built on it still handed out the old certificate 2 s
//!   later, and nothing in the crate looks at the files on a schedule;
//! - once a file could be read, its errors do not say which one is wrong: a certificate file
//!   that does not parse gives "failed to parse certificate", an empty one "peer sent no
//!   certificates", a key that is not the certificate's "keys may not be consistent:
//!   KeyMismatch", a key file without a key "The private key file contained no keys" (only a
//!   missing file is named). kipam's startup check must name the file.
//!
//! `tests/webhook/serving.rs` (`axum_servers_own_config_…`) checks both, so the day the crate
//! does this itself the test says so.
//!
//! Only the `ring` provider is used (kube's, and `axum-server`'s through `tls-rustls-ring`): a
//! second provider in the process would make rustls refuse to pick a default one.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum_server::accept::NoDelayAcceptor;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

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

/// Serves `router` over TLS on `listener` until `shutdown` completes (connections in flight
/// are finished first). Fails at once when the files cannot be used.
pub async fn serve(
    listener: TcpListener,
    files: TlsFiles,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TlsError> {
    serve_http1(listener, Some(files), router, None, shutdown).await
}

/// Serves `router` on `listener` over HTTP/1.1 until `shutdown` completes: over TLS when `tls`
/// names files (failing at once when they cannot be used), plain TCP otherwise. Shutting down
/// stops accepting, closes idle connections and waits for the requests in flight. With a
/// `header_read_timeout`, a connection whose next request's headers do not arrive within it
/// is closed (idle keep-alive connections included). A failing `accept` (out of file
/// descriptors, say) is logged and retried after a short pause.
pub async fn serve_http1(
    listener: TcpListener,
    tls: Option<TlsFiles>,
    router: axum::Router,
    header_read_timeout: Option<Duration>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TlsError> {
    let config = match tls {
        Some(files) => Some(files.server_config()?),
        None => None,
    };
    let handle = axum_server::Handle::<SocketAddr>::new();
    let mut server = axum_server::Server::from_listener(listener)
        .handle(handle.clone())
        .accept_error_handler(|peer, e| match peer {
            // The listener itself: the server pauses and tries again.
            None => tracing::warn!("cannot accept a connection: {e}"),
            // One client's handshake failed or timed out: nobody else is concerned.
            Some(peer) => tracing::debug!(%peer, "connection dropped before serving it: {e}"),
        });
    server
        .http_builder()
        .http1()
        .header_read_timeout(header_read_timeout);
    let server = server.http1_only();
    let app = router.into_make_service();
    let serving = async move {
        match config {
            Some(config) => {
                let acceptor = RustlsAcceptor::new(RustlsConfig::from_config(config))
                    .handshake_timeout(HANDSHAKE_TIMEOUT)
                    .acceptor(NoDelayAcceptor::new());
                server.acceptor(acceptor).serve(app).await
            }
            None => server.acceptor(NoDelayAcceptor::new()).serve(app).await,
        }
    };
    // `shutdown` only starts the drain; `serving` returns once the drain is over. Both are
    // polled here, not in a task of their own, so aborting the caller's task leaves nothing
    // waiting on `shutdown`.
    let drain = async move {
        shutdown.await;
        handle.graceful_shutdown(None);
        std::future::pending::<Infallible>().await
    };
    let result = tokio::select! {
        result = serving => result,
        never = drain => match never {},
    };
    result.map_err(|e| TlsError::Setup(e.to_string()))
}
