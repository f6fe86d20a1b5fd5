//! The `ValidatingWebhookConfiguration` that sends kipam's kinds, and Cluster API's
//! `IPAddress`es, to the webhook (`kipam webhook-config`).

use serde_json::{Value, json};

use super::PATH;
use super::ipaddress;
use super::rules::GROUP;

/// Where the API server reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The in-cluster Service in front of every kipam replica.
    Service {
        namespace: String,
        name: String,
        port: u16,
    },
    /// A URL (outside the cluster; tests).
    Url(String),
}

/// What the configuration says.
#[derive(Clone, Debug)]
pub struct ConfigOptions {
    /// `metadata.name` of the configuration; the webhook is `validate.ipam.kipam.dev`.
    pub name: String,
    pub target: Target,
    /// Base64 PEM of the CA that signed the webhook's certificate (`caBundle`); a placeholder
    /// for cert-manager's CA injector when not given.
    pub ca_bundle: Option<String>,
    /// `Fail` (the default) or `Ignore`.
    pub failure_policy: String,
    /// 1 to 30.
    pub timeout_seconds: u32,
    /// kipam's own user: its writes skip the webhook (`matchConditions`).
    pub service_account: String,
}

/// The name of the one webhook in the configuration.
pub const WEBHOOK_NAME: &str = "validate.ipam.kipam.dev";

/// Placeholder written when no CA is given (cert-manager's `inject-ca-from` fills it in).
pub const CA_PLACEHOLDER: &str = "Cg==";

/// The configuration as a JSON value.
pub fn configuration(options: &ConfigOptions) -> Value {
    let client = match &options.target {
        Target::Service {
            namespace,
            name,
            port,
        } => json!({
            "service": {"namespace": namespace, "name": name, "path": PATH, "port": port},
        }),
        Target::Url(url) => json!({ "url": format!("{}{}", url.trim_end_matches('/'), PATH) }),
    };
    let mut client = client;
    client["caBundle"] = json!(options.ca_bundle.as_deref().unwrap_or(CA_PLACEHOLDER));
    let rule = |group: &str, resources: &[&str], operations: &[&str], scope: &str| {
        json!({
            "apiGroups": [group],
            "apiVersions": ["*"],
            "resources": resources,
            "operations": operations,
            "scope": scope,
        })
    };
    let mut metadata = json!({
        "name": options.name,
        "labels": {"app.kubernetes.io/name": "kipam"},
    });
    if let Target::Service {
        namespace, name, ..
    } = &options.target
        && options.ca_bundle.is_none()
    {
        metadata["annotations"] = json!({
            "cert-manager.io/inject-ca-from": format!("{namespace}/{name}"),
        });
    }
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": metadata,
        "webhooks": [{
            "name": WEBHOOK_NAME,
            "admissionReviewVersions": ["v1"],
            "clientConfig": client,
            "rules": [
                rule(GROUP, &["ipampools", "clusters"], &["CREATE", "UPDATE"], "Cluster"),
                rule(GROUP, &["ipamallocations"], &["CREATE", "UPDATE", "DELETE"], "Namespaced"),
                rule(GROUP, &["ipampoolrecords"], &["CREATE", "UPDATE", "DELETE"], "Cluster"),
                // Cluster API's: a rule for a kind whose CRD is not installed selects nothing.
                rule(ipaddress::GROUP, &[ipaddress::RESOURCE], &["CREATE", "UPDATE"], "Namespaced"),
            ],
            "matchConditions": [
                {
                    "name": "not-kipam",
                    "expression": format!("request.userInfo.username != {}", cel_string(&options.service_account)),
                },
                {
                    "name": "kipam-pools-only",
                    "expression": kipam_pools_only(),
                },
            ],
            "failurePolicy": options.failure_policy,
            "matchPolicy": "Equivalent",
            // The address of an admitted hand-made `IPAddress` is committed to its pool
            // record before the answer (`webhook::pin`); nothing is written on a dry run.
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": options.timeout_seconds,
        }],
    })
}

/// The condition that keeps Cluster API `IPAddress`es of other providers' pools away from the
/// webhook, so that kipam being down blocks nothing that is not kipam's: every request of
/// another group passes it; an `IPAddress` passes it only when its `spec.poolRef.apiGroup`, in
/// the new object or the old one, is kipam's. The old object covers an update that moves an
/// address away from a kipam pool (refused by the webhook) and a finalizer removal, where the
/// new object is the one without the finalizer (on a delete `object` is null). Each field is
/// tested with `has` before it is read: a `v1beta1` `poolRef` may lack `apiGroup`, and an
/// evaluation error would count as a failed call, refusing the write under `Fail`.
pub fn kipam_pools_only() -> String {
    let names_kipam = |o: &str| {
        format!(
            "({o} != null && has({o}.spec) && has({o}.spec.poolRef) && \
             has({o}.spec.poolRef.apiGroup) && {o}.spec.poolRef.apiGroup == '{GROUP}')"
        )
    };
    format!(
        "request.resource.group != '{}' || {} || {}",
        ipaddress::GROUP,
        names_kipam("object"),
        names_kipam("oldObject")
    )
}

/// A CEL string literal.
fn cel_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "''".into())
}

/// The configuration as YAML.
pub fn configuration_yaml(options: &ConfigOptions) -> Result<String, String> {
    serde_saphyr::to_string(&configuration(options)).map_err(|e| e.to_string())
}

/// Standard base64 with padding (for `caBundle`).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
