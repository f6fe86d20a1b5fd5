//! A small HTTPS client (HTTP/1.1, one request per connection) for calling admission webhooks,
//! trusting only the CA given for the call, as the API server does with a webhook's
//! `caBundle`. Public so tests and benches can call a webhook the same way.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// An HTTP response: status code, headers (lower-case names) and body, plus the server's
/// leaf certificate (DER).
#[derive(Clone, Debug)]
pub struct HttpsResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub peer_certificate: Option<Vec<u8>>,
}

impl HttpsResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why a call failed (the API server applies the webhook's `failurePolicy` then).
#[derive(Debug)]
pub struct CallError(pub String);

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err(e: impl std::fmt::Display) -> CallError {
    CallError(e.to_string())
}

/// Splits `https://host:port/path` into (host, port, path).
fn split_url(url: &str) -> Result<(String, u16, String), CallError> {
    let rest = url
        .strip_prefix("https://")
        .ok_or_else(|| CallError(format!("{url}: only https:// URLs are called")))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h.trim_matches(|c| c == '[' || c == ']').to_string(),
            p.parse::<u16>()
                .map_err(|_| CallError(format!("{url}: bad port")))?,
        ),
        _ => (authority.to_string(), 443),
    };
    Ok((host, port, path.to_string()))
}

/// Root store with exactly the certificates of `ca_pem`.
fn roots(ca_pem: &[u8]) -> Result<rustls::RootCertStore, CallError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.map_err(err)?).map_err(err)?;
    }
    if roots.is_empty() {
        return Err(CallError("the CA bundle holds no certificate".into()));
    }
    Ok(roots)
}

/// POSTs `body` to an `https://` URL, trusting only `ca_pem`, within `timeout` (connection,
/// handshake, request and response together).
pub async fn post(
    url: &str,
    ca_pem: &[u8],
    content_type: &str,
    body: &[u8],
    timeout: Duration,
) -> Result<HttpsResponse, CallError> {
    tokio::time::timeout(timeout, post_inner(url, ca_pem, content_type, body))
        .await
        .map_err(|_| CallError(format!("the call to {url} timed out after {timeout:?}")))?
}

async fn post_inner(
    url: &str,
    ca_pem: &[u8],
    content_type: &str,
    body: &[u8],
) -> Result<HttpsResponse, CallError> {
    let (host, port, path) = split_url(url)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(err)?
        .with_root_certificates(roots(ca_pem)?)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| CallError(format!("cannot connect to {url}: {e}")))?;
    let name = ServerName::try_from(host.clone()).map_err(err)?;
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| CallError(format!("TLS with {url}: {e}")))?;
    let peer_certificate = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec());
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\nAccept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.map_err(err)?;
    tls.write_all(body).await.map_err(err)?;
    tls.flush().await.map_err(err)?;
    let mut raw = Vec::new();
    // A server may close without close_notify after `Connection: close`; keep what came.
    if let Err(e) = tls.read_to_end(&mut raw).await
        && raw.is_empty()
    {
        return Err(err(e));
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| CallError(format!("{url}: no HTTP response")))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| CallError(format!("{url}: bad status line")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body).ok_or_else(|| CallError(format!("{url}: bad chunked body")))?;
    }
    Ok(HttpsResponse {
        status,
        headers,
        body,
        peer_certificate,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_urls() {
        assert_eq!(
            split_url("https://127.0.0.1:9443/validate").unwrap(),
            ("127.0.0.1".into(), 9443, "/validate".into())
        );
        assert_eq!(
            split_url("https://kipam.example").unwrap(),
            ("kipam.example".into(), 443, "/".into())
        );
        assert!(split_url("http://x").is_err());
    }

    #[test]
    fn decodes_chunks() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
    }
}
