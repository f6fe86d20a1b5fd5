//! Name rules: the names kipam turns into object names, namespaces and label values must be
//! usable there, so they are refused up front with the field and the rule they break.
//!
//! - pool names name `IPAMAllocation` objects and are the value of label
//!   `ipam.kipam.dev/pool`: a DNS-1123 label of at most 63 characters;
//! - datacenter names are keys of `IPAMPool.spec.datacenters`, `Cluster.spec.datacenter`, the
//!   value of label `ipam.kipam.dev/datacenter` and part of object names: the same;
//! - cluster names become namespace `cluster-<name>`, itself a label: at most 55 characters;
//! - the keys of `Cluster.spec.ipam` are pool names.
//!
//! The helpers return a [`FieldError`] without an object; [`Errors::check`] (or the caller)
//! fills it in.

use crate::resources::bounds::{MAX_CLUSTER_NAME, MAX_LABEL, MAX_SUBDOMAIN};

use super::FieldError;

/// Why a name is not a DNS-1123 label.
pub(crate) const LABEL_RULE: &str = "must be a DNS-1123 label: lowercase letters, digits and '-', \
     starting and ending with a letter or digit";

/// Why a name is not a DNS-1123 subdomain.
const SUBDOMAIN_RULE: &str = "must be a DNS-1123 subdomain: lowercase letters, digits, '-' and \
     '.', each dot-separated part starting and ending with a letter or digit";

/// Whether `name` is a DNS-1123 label of at most `max` characters.
pub fn is_dns1123_label(name: &str, max: u32) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= max as usize
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// Whether `name` is a DNS-1123 subdomain (at most 253 characters).
pub fn is_dns1123_subdomain(name: &str) -> bool {
    name.len() <= MAX_SUBDOMAIN as usize
        && name
            .split('.')
            .all(|part| is_dns1123_label(part, MAX_LABEL))
}

fn error(field: &str, value: &str, reason: String) -> FieldError {
    FieldError {
        object: String::new(),
        field: field.to_string(),
        value: value.to_string(),
        reason,
    }
}

/// A DNS-1123 label of at most `max` characters; `why` says where kipam uses the name.
pub fn dns1123_label_max(field: &str, value: &str, max: u32, why: &str) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(error(field, value, "is required".into()));
    }
    if value.chars().count() > max as usize {
        return Err(error(
            field,
            value,
            format!(
                "must be at most {max} characters, is {} ({why})",
                value.chars().count()
            ),
        ));
    }
    if !is_dns1123_label(value, max) {
        return Err(error(field, value, format!("{LABEL_RULE} ({why})")));
    }
    Ok(())
}

/// A DNS-1123 label (at most 63 characters).
pub fn dns1123_label(field: &str, value: &str) -> Result<(), FieldError> {
    dns1123_label_max(field, value, MAX_LABEL, "Kubernetes' limit for a label")
}

/// A DNS-1123 subdomain (at most 253 characters).
pub fn dns1123_subdomain(field: &str, value: &str) -> Result<(), FieldError> {
    if value.is_empty() {
        return Err(error(field, value, "is required".into()));
    }
    if value.len() > MAX_SUBDOMAIN as usize {
        return Err(error(
            field,
            value,
            format!("must be at most {MAX_SUBDOMAIN} characters"),
        ));
    }
    if !is_dns1123_subdomain(value) {
        return Err(error(field, value, SUBDOMAIN_RULE.to_string()));
    }
    Ok(())
}

/// A pool name: it names the pool's `IPAMAllocation`s and is the value of label
/// `ipam.kipam.dev/pool`.
pub fn pool_name(field: &str, value: &str) -> Result<(), FieldError> {
    dns1123_label_max(
        field,
        value,
        MAX_LABEL,
        "it names the pool's IPAMAllocations and is the value of label ipam.kipam.dev/pool",
    )
}

/// A datacenter name: a key of `IPAMPool.spec.datacenters`, `Cluster.spec.datacenter`, the
/// value of label `ipam.kipam.dev/datacenter` and part of object names.
pub fn datacenter_name(field: &str, value: &str) -> Result<(), FieldError> {
    dns1123_label_max(
        field,
        value,
        MAX_LABEL,
        "it is the value of label ipam.kipam.dev/datacenter and part of object names",
    )
}

/// An address space name (`IPAMPool.spec.addressSpace`).
pub fn address_space(field: &str, value: &str) -> Result<(), FieldError> {
    dns1123_label_max(
        field,
        value,
        MAX_LABEL,
        "it names a routing domain shared by the pools that give it",
    )
}

/// A cluster name: kipam keeps the cluster's objects in namespace `cluster-<name>`.
pub fn cluster_name(field: &str, value: &str) -> Result<(), FieldError> {
    dns1123_label_max(
        field,
        value,
        MAX_CLUSTER_NAME,
        "kipam keeps the cluster's objects in namespace cluster-<name>",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["a", "dc-1", "0", "a1-b2", &"x".repeat(63)] {
            assert!(dns1123_label("f", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "eu west",
            "EU",
            "-a",
            "a-",
            "a.b",
            "a_b",
            "é",
            &"x".repeat(64),
        ] {
            let e = dns1123_label("spec.x", bad).unwrap_err();
            assert_eq!(e.field, "spec.x");
            assert_eq!(e.value, bad);
        }
        let e = dns1123_label("f", &"x".repeat(64)).unwrap_err();
        assert!(e.reason.contains("at most 63"), "{}", e.reason);
        let e = dns1123_label("f", "eu west").unwrap_err();
        assert!(e.reason.contains("DNS-1123 label"), "{}", e.reason);
    }

    #[test]
    fn subdomains() {
        assert!(dns1123_subdomain("f", "kube-system.example.com").is_ok());
        assert!(dns1123_subdomain("f", "a..b").is_err());
        assert!(dns1123_subdomain("f", &"a".repeat(254)).is_err());
        assert!(dns1123_subdomain("f", "Secret").is_err());
    }

    #[test]
    fn kipam_names() {
        assert!(pool_name("metadata.name", "metallb-ipv4").is_ok());
        assert!(pool_name("metadata.name", "metallb.v4").is_err());
        assert!(datacenter_name("spec.datacenter", "azure-westeurope").is_ok());
        let e = datacenter_name("spec.datacenters", "eu west").unwrap_err();
        assert!(
            e.reason.contains("ipam.kipam.dev/datacenter"),
            "{}",
            e.reason
        );
        assert!(cluster_name("metadata.name", &"c".repeat(55)).is_ok());
        let e = cluster_name("metadata.name", &"c".repeat(56)).unwrap_err();
        assert!(e.reason.contains("at most 55"), "{}", e.reason);
        assert_eq!(
            crate::resources::cluster_namespace(&"c".repeat(55)).len(),
            63
        );
    }
}
