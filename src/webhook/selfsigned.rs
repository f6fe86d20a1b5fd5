//! A webhook certificate kipam makes and keeps itself, for installs without cert-manager
//! (`kipam controller --webhook-self-signed`).
//!
//! - The certificate lives in one Secret (`--webhook-secret`, type `kubernetes.io/tls`, keys
//!   `ca.crt`, `ca.key`, `tls.crt`, `tls.key`): a private CA and a serving certificate it
//!   signed for the webhook Service's DNS names. Every replica serves the pair from that
//!   Secret, so whichever replica the API server reaches presents a certificate the same CA
//!   signed.
//! - No leader is needed: the Secret is created with `create` (a second replica racing for it
//!   gets 409 and reads the winner's) and renewed with `update` carrying the resourceVersion it
//!   was read at (the loser of a race gets 409 and reads again). Nobody overwrites a
//!   certificate another replica already handed out.
//! - Each replica writes the pair into `--webhook-cert-dir` (an emptyDir in the chart); the
//!   TLS server picks up a changed pair by itself ([`crate::tls`]).
//! - Each replica checks every `--webhook-cert-check-interval` seconds (default
//!   [`CHECK_INTERVAL`]) that the `ValidatingWebhookConfiguration`
//!   (`--webhook-config-name`) carries the CA in the `caBundle` of every webhook, and puts it
//!   back when it is missing or different (after a `helm upgrade` reset it, say).
//! - The serving certificate is valid for [`LEAF_DAYS`] days and renewed [`RENEW_BEFORE_DAYS`]
//!   days before it ends, signed by the same CA ([`CA_DAYS`] days), so the `caBundle` does not
//!   change; the CA is replaced (with a new serving certificate) only when it nears its own end.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};

use crate::seed::{backoff, preconditions};

/// How often each replica looks at the Secret and the configuration again, by default.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(60);
/// Lifetime of the CA.
pub const CA_DAYS: u64 = 3650;
/// Lifetime of the serving certificate.
pub const LEAF_DAYS: u64 = 365;
/// A certificate (CA or serving) is replaced this many days before it ends.
pub const RENEW_BEFORE_DAYS: u64 = 30;

/// Annotation: the serving certificate's end (Unix seconds).
pub const ANNOTATION_NOT_AFTER: &str = "ipam.kipam.dev/not-after";
/// Annotation: the CA's end (Unix seconds).
pub const ANNOTATION_CA_NOT_AFTER: &str = "ipam.kipam.dev/ca-not-after";
/// Annotation: the DNS names the serving certificate is for (comma-separated).
pub const ANNOTATION_DNS_NAMES: &str = "ipam.kipam.dev/dns-names";

const CA_NAME: &str = "kipam webhook CA";
const DAY: u64 = 24 * 60 * 60;

/// What `--webhook-self-signed` needs.
#[derive(Clone, Debug)]
pub struct SelfSignedOptions {
    /// Namespace of the Secret and of the webhook Service (the one kipam runs in).
    pub namespace: String,
    /// The Secret holding the CA and the serving certificate.
    pub secret: String,
    /// The webhook Service: the certificate is for `<service>`, `<service>.<namespace>`,
    /// `<service>.<namespace>.svc` and `<service>.<namespace>.svc.cluster.local`.
    pub service: String,
    /// The `ValidatingWebhookConfiguration` whose `caBundle` kipam keeps.
    pub configuration: String,
    /// Where `tls.crt` and `tls.key` are written for the TLS server.
    pub dir: PathBuf,
    /// How often the Secret, the files and the `caBundle` are checked again.
    pub check_interval: Duration,
}

impl SelfSignedOptions {
    /// The serving certificate's file.
    pub fn cert_file(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    /// The serving key's file.
    pub fn key_file(&self) -> PathBuf {
        self.dir.join("tls.key")
    }

    /// The DNS names the serving certificate is for.
    pub fn dns_names(&self) -> Vec<String> {
        let (s, n) = (&self.service, &self.namespace);
        vec![
            s.clone(),
            format!("{s}.{n}"),
            format!("{s}.{n}.svc"),
            format!("{s}.{n}.svc.cluster.local"),
        ]
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SelfSignedError {
    #[error("cannot make the webhook certificate: {0}")]
    Generate(String),
    #[error("{path}: cannot write the webhook certificate: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A CA and a serving certificate it signed, all PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub ca_cert: String,
    pub ca_key: String,
    pub cert: String,
    pub key: String,
    /// End of the serving certificate (Unix seconds).
    pub not_after: u64,
    /// End of the CA (Unix seconds).
    pub ca_not_after: u64,
    pub dns_names: Vec<String>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The civil date (year, month, day) of a Unix time (proleptic Gregorian, UTC).
fn civil(secs: u64) -> (i32, u8, u8) {
    let days = (secs / DAY) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
    (year, month, day)
}

/// Dates rounded down to the day: the end is a day boundary at or after `days` from `from`.
fn validity(params: &mut rcgen::CertificateParams, from: u64, days: u64) -> u64 {
    let start = (from - from % DAY).saturating_sub(DAY); // a day of slack for clocks behind ours
    let end = start + (days + 2) * DAY;
    let (y, m, d) = civil(start);
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = civil(end);
    params.not_after = rcgen::date_time_ymd(y, m, d);
    end
}

fn ca_params() -> Result<rcgen::CertificateParams, rcgen::Error> {
    // The same parameters each time: a serving certificate signed later by the same CA key
    // names the same issuer.
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, CA_NAME);
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    Ok(ca)
}

/// A new CA (when `ca` is `None`, or the given one is near its end) and a new serving
/// certificate for `dns_names`, valid from `now`.
pub fn generate(
    dns_names: &[String],
    ca: Option<(&str, u64)>,
    now: u64,
) -> Result<Bundle, SelfSignedError> {
    let err = |e: rcgen::Error| SelfSignedError::Generate(e.to_string());
    let mut params = ca_params().map_err(err)?;
    let (ca_key, ca_cert, ca_not_after) = match ca {
        Some((key_pem, not_after)) if not_after > now + RENEW_BEFORE_DAYS * DAY => {
            let key = rcgen::KeyPair::from_pem(key_pem).map_err(err)?;
            (key, None, not_after)
        }
        _ => {
            let key = rcgen::KeyPair::generate().map_err(err)?;
            let end = validity(&mut params, now, CA_DAYS);
            let cert = params.self_signed(&key).map_err(err)?;
            (key, Some(cert.pem()), end)
        }
    };
    let mut leaf = rcgen::CertificateParams::new(dns_names.to_vec()).map_err(err)?;
    leaf.distinguished_name.push(
        rcgen::DnType::CommonName,
        dns_names.get(2).cloned().unwrap_or_default(),
    );
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    // Never beyond the CA.
    let not_after = validity(&mut leaf, now, LEAF_DAYS).min(ca_not_after);
    let (y, m, d) = civil(not_after);
    leaf.not_after = rcgen::date_time_ymd(y, m, d);
    let leaf_key = rcgen::KeyPair::generate().map_err(err)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = rcgen::Issuer::new(params, ca_key);
    let cert = leaf.signed_by(&leaf_key, &issuer).map_err(err)?;
    Ok(Bundle {
        ca_cert: ca_cert.unwrap_or_default(),
        ca_key: ca_key_pem,
        cert: cert.pem(),
        key: leaf_key.serialize_pem(),
        not_after,
        ca_not_after,
        dns_names: dns_names.to_vec(),
    })
}

/// The bundle a Secret holds, when it holds a whole one.
pub fn from_secret(secret: &Secret) -> Option<Bundle> {
    let data = secret.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .filter(|s| !s.trim().is_empty())
    };
    let annotations = secret.metadata.annotations.as_ref()?;
    let number = |k: &str| annotations.get(k).and_then(|v| v.trim().parse().ok());
    Some(Bundle {
        ca_cert: text("ca.crt")?,
        ca_key: text("ca.key")?,
        cert: text("tls.crt")?,
        key: text("tls.key")?,
        not_after: number(ANNOTATION_NOT_AFTER)?,
        ca_not_after: number(ANNOTATION_CA_NOT_AFTER)?,
        dns_names: annotations
            .get(ANNOTATION_DNS_NAMES)?
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
    })
}

/// Why a stored bundle must be replaced, or `None` when it is good.
pub fn needs_renewal(bundle: &Bundle, dns_names: &[String], now: u64) -> Option<String> {
    if bundle.dns_names != dns_names {
        return Some(format!(
            "it is for {} and the webhook Service is now {}",
            bundle.dns_names.join(","),
            dns_names.join(",")
        ));
    }
    let limit = now + RENEW_BEFORE_DAYS * DAY;
    if bundle.ca_not_after <= limit {
        return Some("its CA ends within 30 days".into());
    }
    if bundle.not_after <= limit {
        return Some("it ends within 30 days".into());
    }
    if let Err(e) = usable(&bundle.cert, &bundle.key) {
        return Some(format!("it cannot be used: {e}"));
    }
    None
}

/// The certificate parses and the key belongs to it.
fn usable(cert: &str, key: &str) -> Result<(), String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.crt: {e}"))?;
    if chain.is_empty() {
        return Err("tls.crt: no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| format!("tls.key: {e}"))?;
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("tls.key: {e}"))?;
    rustls::sign::CertifiedKey::new(chain, signing)
        .keys_match()
        .map_err(|_| "tls.key does not belong to tls.crt".to_string())
}

/// The Secret holding `bundle` (on top of `base`, the stored one, when renewing).
pub fn secret_for(options: &SelfSignedOptions, bundle: &Bundle, base: Option<&Secret>) -> Secret {
    let bytes = |s: &str| ByteString(s.as_bytes().to_vec());
    let mut metadata = base.map(|s| s.metadata.clone()).unwrap_or(ObjectMeta {
        name: Some(options.secret.clone()),
        namespace: Some(options.namespace.clone()),
        ..Default::default()
    });
    metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("app.kubernetes.io/name".into(), "kipam".into());
    let annotations = metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(ANNOTATION_NOT_AFTER.into(), bundle.not_after.to_string());
    annotations.insert(
        ANNOTATION_CA_NOT_AFTER.into(),
        bundle.ca_not_after.to_string(),
    );
    annotations.insert(ANNOTATION_DNS_NAMES.into(), bundle.dns_names.join(","));
    Secret {
        metadata,
        type_: Some("kubernetes.io/tls".into()),
        data: Some(
            [
                ("ca.crt", &bundle.ca_cert),
                ("ca.key", &bundle.ca_key),
                ("tls.crt", &bundle.cert),
                ("tls.key", &bundle.key),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), bytes(v)))
            .collect(),
        ),
        ..Default::default()
    }
}

/// Reads the Secret, creating or renewing it when needed, and returns the bundle every
/// replica serves. Races with other replicas end in a 409 for the loser, who reads again.
pub async fn ensure_secret(
    api: &Api<Secret>,
    options: &SelfSignedOptions,
) -> Result<Bundle, String> {
    let dns_names = options.dns_names();
    let what = format!("{}/{}", options.namespace, options.secret);
    for _ in 0..5 {
        // RBAC: src/rbac.rs (secrets get, own namespace)
        let current = api
            .get_opt(&options.secret)
            .await
            .map_err(|e| preconditions::explain(&e, "get", "secrets", &what))?;
        let stored = current.as_ref().and_then(from_secret);
        let now = now_secs();
        let reason = match &stored {
            Some(b) => match needs_renewal(b, &dns_names, now) {
                None => return Ok(b.clone()),
                Some(why) => why,
            },
            None if current.is_some() => "it does not hold a whole kipam certificate".into(),
            None => String::new(),
        };
        // Keep the stored CA when it is good for a while (the caBundle then stays); a CA key
        // that cannot be read means a new CA.
        let ca = stored.as_ref().map(|b| (b.ca_key.as_str(), b.ca_not_after));
        let mut bundle = match generate(&dns_names, ca, now) {
            Ok(b) => b,
            Err(_) if ca.is_some() => generate(&dns_names, None, now).map_err(|e| e.to_string())?,
            Err(e) => return Err(e.to_string()),
        };
        if bundle.ca_cert.is_empty() {
            // Signed by the stored CA: keep its certificate (the caBundle does not change).
            bundle.ca_cert = stored
                .as_ref()
                .map(|b| b.ca_cert.clone())
                .unwrap_or_default();
        }
        let written = match &current {
            None => {
                // RBAC: src/rbac.rs (secrets create, own namespace)
                api.create(&PostParams::default(), &secret_for(options, &bundle, None))
                    .await
            }
            Some(existing) => {
                tracing::info!(secret = %what, "renewing the webhook certificate: {reason}");
                // RBAC: src/rbac.rs (secrets update, own namespace); the resourceVersion read
                // above makes a concurrent renewal by another replica fail here with 409.
                api.replace(
                    &options.secret,
                    &PostParams::default(),
                    &secret_for(options, &bundle, Some(existing)),
                )
                .await
            }
        };
        match written {
            Ok(_) => {
                tracing::info!(secret = %what, "stored a new webhook certificate");
                return Ok(bundle);
            }
            // Another replica wrote first: use its certificate.
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(preconditions::explain(&e, "write", "secrets", &what)),
        }
    }
    Err(format!(
        "{what}: changed by others five times in a row while kipam tried to store its certificate"
    ))
}

/// Writes `tls.crt` and `tls.key` (each through a temporary file and a rename); `true` when
/// something changed.
pub fn write_files(options: &SelfSignedOptions, bundle: &Bundle) -> Result<bool, SelfSignedError> {
    let write = |path: &Path, content: &str| -> Result<bool, SelfSignedError> {
        if std::fs::read_to_string(path).ok().as_deref() == Some(content) {
            return Ok(false);
        }
        let tmp = path.with_extension("tmp");
        let werr = |source| SelfSignedError::Write {
            path: path.to_path_buf(),
            source,
        };
        std::fs::write(&tmp, content).map_err(werr)?;
        std::fs::rename(&tmp, path).map_err(werr)?;
        Ok(true)
    };
    std::fs::create_dir_all(&options.dir).map_err(|source| SelfSignedError::Write {
        path: options.dir.clone(),
        source,
    })?;
    let key = write(&options.key_file(), &bundle.key)?;
    let cert = write(&options.cert_file(), &bundle.cert)?;
    Ok(key || cert)
}

/// What [`ensure_ca_bundle`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaBundle {
    /// Every webhook already trusted the CA.
    Current,
    /// kipam put the CA in (count of webhooks changed).
    Patched(usize),
    /// The configuration does not exist (yet).
    Missing,
}

/// Puts the CA into the `caBundle` of every webhook of the configuration where it is missing
/// or different. The update carries the resourceVersion read, so it never undoes a change made
/// in between (a 409 is retried on the next check).
pub async fn ensure_ca_bundle(
    api: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    ca_pem: &str,
) -> Result<CaBundle, kube::Error> {
    // RBAC: src/rbac.rs (validatingwebhookconfigurations get, update)
    let Some(mut config) = api.get_opt(name).await? else {
        return Ok(CaBundle::Missing);
    };
    let want = ByteString(ca_pem.as_bytes().to_vec());
    let mut changed = 0;
    for hook in config.webhooks.iter_mut().flatten() {
        if hook.client_config.ca_bundle.as_ref() != Some(&want) {
            hook.client_config.ca_bundle = Some(want.clone());
            changed += 1;
        }
    }
    if changed == 0 {
        return Ok(CaBundle::Current);
    }
    api.replace(name, &PostParams::default(), &config).await?;
    Ok(CaBundle::Patched(changed))
}

/// Logs a problem once until it changes.
struct Quiet(Option<String>);

impl Quiet {
    fn problem(&mut self, message: String) {
        if self.0.as_deref() != Some(message.as_str()) {
            tracing::warn!("webhook certificate: {message} (retrying)");
            self.0 = Some(message);
        }
    }

    fn ok(&mut self) {
        if self.0.take().is_some() {
            tracing::info!("webhook certificate: recovered");
        }
    }
}

/// One round: the Secret, the files, the configuration.
async fn round(
    secrets: &Api<Secret>,
    configs: &Api<ValidatingWebhookConfiguration>,
    options: &SelfSignedOptions,
) -> Result<(), String> {
    let bundle = ensure_secret(secrets, options).await?;
    if write_files(options, &bundle).map_err(|e| e.to_string())? {
        tracing::info!(dir = %options.dir.display(), "webhook certificate written for the TLS server");
    }
    match ensure_ca_bundle(configs, &options.configuration, &bundle.ca_cert).await {
        Ok(CaBundle::Current) => Ok(()),
        Ok(CaBundle::Patched(n)) => {
            tracing::info!(
                configuration = %options.configuration,
                webhooks = n,
                "put kipam's CA into the webhook configuration's caBundle"
            );
            Ok(())
        }
        Ok(CaBundle::Missing) => Err(format!(
            "the ValidatingWebhookConfiguration {} does not exist: install it (the chart does, \
             or `kipam webhook-config`) and kipam fills in its caBundle",
            options.configuration
        )),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(format!(
            "the ValidatingWebhookConfiguration {} changed while kipam updated it",
            options.configuration
        )),
        Err(e) => Err(preconditions::explain(
            &e,
            "update",
            "validatingwebhookconfigurations",
            &options.configuration,
        )),
    }
}

/// Makes sure the certificate files exist (retrying with capped backoff until the Secret can
/// be read or written), then keeps the Secret, the files and the configuration's `caBundle`
/// right in the background. Returns once the files are there.
pub async fn prepare(client: Client, options: SelfSignedOptions) -> Result<(), SelfSignedError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &options.namespace);
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let mut quiet = Quiet(None);
    let mut failures = 0;
    loop {
        match ensure_secret(&secrets, &options).await {
            Ok(bundle) => {
                write_files(&options, &bundle)?;
                break;
            }
            Err(message) => {
                failures += 1;
                quiet.problem(message);
                tokio::time::sleep(backoff::delay(failures)).await;
            }
        }
    }
    tokio::spawn(async move {
        loop {
            match round(&secrets, &configs, &options).await {
                Ok(()) => {
                    quiet.ok();
                    failures = 0;
                    tokio::time::sleep(options.check_interval).await;
                }
                Err(message) => {
                    failures += 1;
                    quiet.problem(message);
                    tokio::time::sleep(backoff::delay(failures).min(options.check_interval)).await;
                }
            }
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(951_782_400), (2000, 2, 29));
        assert_eq!(civil(1_798_761_600), (2027, 1, 1));
    }

    fn names() -> Vec<String> {
        SelfSignedOptions {
            namespace: "kipam-system".into(),
            secret: "s".into(),
            service: "kipam-webhook".into(),
            configuration: "kipam".into(),
            dir: PathBuf::new(),
            check_interval: CHECK_INTERVAL,
        }
        .dns_names()
    }

    #[test]
    fn a_new_bundle_is_good_and_renewal_keeps_the_ca() {
        let now = 1_800_000_000;
        let first = generate(&names(), None, now).unwrap();
        assert!(first.ca_cert.contains("BEGIN CERTIFICATE"));
        assert_eq!(needs_renewal(&first, &names(), now), None);
        assert!(first.not_after >= now + LEAF_DAYS * DAY);
        // Near its end, the serving certificate is renewed with the same CA key.
        let later = first.not_after - 10 * DAY;
        assert!(needs_renewal(&first, &names(), later).is_some());
        let renewed = generate(&names(), Some((&first.ca_key, first.ca_not_after)), later).unwrap();
        assert!(renewed.ca_cert.is_empty(), "the CA is kept");
        assert_eq!(renewed.ca_key, first.ca_key);
        assert_ne!(renewed.cert, first.cert);
        // Another Service name needs another certificate.
        let mut other = names();
        other[0] = "elsewhere".into();
        assert!(needs_renewal(&first, &other, now).is_some());
    }
}
