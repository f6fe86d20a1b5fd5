//! A user cluster's kubeconfig, read from the Secret its `Cluster` names.
//!
//! The content of the Secret never appears in a message or a log: errors say which Secret,
//! which key and what is wrong with it, not what it holds. Kubeconfigs that would make kipam
//! run a program (`exec`, `auth-provider`) or read a file of the controller's own file system
//! (`tokenFile`, `client-certificate`, `client-key`, `certificate-authority`) are refused: the
//! Secret is written by whoever registers a cluster, who must not be able to reach into the
//! controller's pod through it. Only inline data is accepted.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Config, ResourceExt};

use crate::resources::{Cluster, cluster_namespace};

/// Where a cluster's kubeconfig lives: `(namespace, name, key)`.
pub fn secret_location(cluster: &Cluster) -> Option<(String, String, String)> {
    let reference = cluster.spec.kubeconfig.as_ref()?;
    let r = &reference.secret_ref;
    let namespace = if r.namespace.is_empty() {
        cluster_namespace(&cluster.name_any())
    } else {
        r.namespace.clone()
    };
    let key = if r.key.is_empty() {
        "kubeconfig".to_string()
    } else {
        r.key.clone()
    };
    Some((namespace, r.name.clone(), key))
}

/// The kubeconfig text in `secret` under `key`.
pub fn kubeconfig_text(secret: &Secret, key: &str) -> Result<String, String> {
    let where_ = format!(
        "Secret {}/{} key {key:?}",
        secret.namespace().unwrap_or_default(),
        secret.name_any()
    );
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| format!("{where_}: the key is missing"))?;
    String::from_utf8(bytes).map_err(|_| format!("{where_}: the kubeconfig is not UTF-8 text"))
}

/// Parses and checks a kubeconfig, refusing what would run programs or read local files.
/// `where_` names the Secret in messages.
pub fn parse(text: &str, where_: &str) -> Result<Kubeconfig, String> {
    let kubeconfig = Kubeconfig::from_yaml(text).map_err(|_| {
        format!("{where_}: not a kubeconfig (the YAML does not parse as one; content not shown)")
    })?;
    for named in &kubeconfig.auth_infos {
        let Some(auth) = &named.auth_info else {
            continue;
        };
        let refused = [
            ("exec", auth.exec.is_some()),
            ("auth-provider", auth.auth_provider.is_some()),
            ("tokenFile", auth.token_file.is_some()),
            ("client-certificate", auth.client_certificate.is_some()),
            ("client-key", auth.client_key.is_some()),
        ];
        if let Some((field, _)) = refused.iter().find(|(_, set)| *set) {
            return Err(format!(
                "{where_}: user {:?} uses {field}, which kipam refuses (it would run a program \
                 or read a file of the controller); use inline token or client-certificate-data \
                 / client-key-data",
                named.name
            ));
        }
    }
    for named in &kubeconfig.clusters {
        if let Some(cluster) = &named.cluster
            && cluster.certificate_authority.is_some()
        {
            return Err(format!(
                "{where_}: cluster {:?} uses certificate-authority (a file path), which kipam \
                 refuses; use certificate-authority-data",
                named.name
            ));
        }
    }
    Ok(kubeconfig)
}

/// The client configuration for a user cluster: the kubeconfig's current context, a timeout on
/// connecting, reading and writing, and none of kube's hidden retries.
pub async fn config(
    kubeconfig: Kubeconfig,
    where_: &str,
    timeout: Duration,
) -> Result<Config, String> {
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| {
            format!(
                "{where_}: unusable kubeconfig: {}",
                safe_error(&e.to_string())
            )
        })?;
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    Ok(config)
}

/// kube's kubeconfig errors name fields and contexts, not secrets, but cut them short anyway so
/// that a value quoted by a parser never travels far.
fn safe_error(text: &str) -> String {
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: 'https://10.0.0.1:6443', certificate-authority-data: ''}
users:
- name: u
  user: {token: s3cr3t-token}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
";

    #[test]
    fn secret_location_defaults_to_the_cluster_namespace_and_key() {
        use crate::resources::{ClusterSpec, KubeconfigReference, SecretKeyRef};
        let mut cluster = Cluster::new(
            "alpha",
            ClusterSpec {
                datacenter: "dc".into(),
                ..Default::default()
            },
        );
        assert_eq!(secret_location(&cluster), None);
        cluster.spec.kubeconfig = Some(KubeconfigReference {
            secret_ref: SecretKeyRef {
                namespace: String::new(),
                name: "kc".into(),
                key: String::new(),
            },
        });
        assert_eq!(
            secret_location(&cluster),
            Some(("cluster-alpha".into(), "kc".into(), "kubeconfig".into()))
        );
        let parsed: SecretKeyRef =
            serde_json::from_value(serde_json::json!({"name": "kc"})).unwrap_or_default();
        assert_eq!(
            (parsed.namespace.as_str(), parsed.key.as_str()),
            ("", "kubeconfig")
        );
    }

    #[test]
    fn accepts_inline_refuses_exec_and_files_and_never_shows_content() {
        assert!(parse(GOOD, "Secret a/b").is_ok());
        let exec = GOOD.replace(
            "user: {token: s3cr3t-token}",
            "user: {exec: {command: /bin/sh, apiVersion: client.authentication.k8s.io/v1}}",
        );
        let e = parse(&exec, "Secret a/b").unwrap_err();
        assert!(e.contains("uses exec"), "{e}");
        let file = GOOD.replace(
            "user: {token: s3cr3t-token}",
            "user: {tokenFile: /etc/passwd}",
        );
        assert!(parse(&file, "S").unwrap_err().contains("tokenFile"));
        let ca = GOOD.replace(
            "certificate-authority-data: ''",
            "certificate-authority: /x",
        );
        assert!(
            parse(&ca, "S")
                .unwrap_err()
                .contains("certificate-authority")
        );
        let broken = "users: [ {token: s3cr3t-token";
        let e = parse(broken, "Secret a/b").unwrap_err();
        assert!(!e.contains("s3cr3t"), "{e}");
    }
}
