//! Validation: turns resources into the planner's plain inputs, or says exactly what is wrong.
//!
//! The same rules serve the admission webhook, `kipam validate` and `kipam offline`. Every
//! message names the object, the field (with the datacenter) and the bad value. KKP's rules
//! apply, without its pool-size cap (an IPv6 /64 range pool is fine here).

mod allocation;
mod cluster;
mod pool;
mod references;
pub mod strict;

pub use allocation::stored_allocation;
pub use cluster::cluster_input;
pub use pool::{pool_input, validate_pool, validate_pool_with_clusters};
pub use references::override_pools;

use std::fmt;

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// `IPAMPool metallb`, `Cluster c1`, `IPAMAllocation cluster-c1/metallb`.
    pub object: String,
    /// `spec.datacenters[dc-1].allocationRange`.
    pub field: String,
    /// The value as written (empty when the field is missing).
    pub value: String,
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() {
            write!(f, "{}: {}: {}", self.object, self.field, self.reason)
        } else {
            write!(
                f,
                "{}: {} {:?}: {}",
                self.object, self.field, self.value, self.reason
            )
        }
    }
}

/// Collects errors for one object.
pub(crate) struct Errors {
    object: String,
    list: Vec<FieldError>,
}

impl Errors {
    pub fn new(object: impl Into<String>) -> Self {
        Errors {
            object: object.into(),
            list: Vec::new(),
        }
    }

    pub fn add(
        &mut self,
        field: impl Into<String>,
        value: impl fmt::Display,
        reason: impl Into<String>,
    ) {
        self.list.push(FieldError {
            object: self.object.clone(),
            field: field.into(),
            value: value.to_string(),
            reason: reason.into(),
        });
    }

    pub fn into_result<T>(self, value: T) -> Result<T, Vec<FieldError>> {
        if self.list.is_empty() {
            Ok(value)
        } else {
            Err(self.list)
        }
    }

    pub fn into_vec(self) -> Vec<FieldError> {
        self.list
    }
}

/// A valid DNS-1123 label of at most `max` characters.
pub(crate) fn is_dns_label(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// A valid DNS-1123 subdomain (object names of most kinds).
pub(crate) fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(|part| is_dns_label(part, 63))
}
