//! Validation: turns resources into the planner's plain inputs, or says exactly what is wrong.
//!
//! The same rules serve the admission webhook, `kipam validate` and `kipam offline`. Every
//! message names the object, the field (with the datacenter) and the bad value. KKP's rules
//! apply, without its pool-size cap (an IPv6 /64 range pool is fine here).

mod allocation;
mod claim;
mod cluster;
mod growth;
pub mod names;
mod network;
mod pool;
mod references;
mod schema;
pub mod strict;

pub use allocation::{AllocationParts, stored_allocation, stored_allocation_of};
pub use claim::{
    ADDRESS_NOT_ADOPTABLE, CLUSTER_NOT_FOUND, ClaimHeld, ClaimPool, ClaimRead, ClaimWait, Found,
    POOL_NOT_READY, adoption, claim_input, cluster_wait,
};
pub use cluster::cluster_input;
pub use growth::{cluster_growth, datacenter_growth};
pub use network::{DatacenterNetwork, GATEWAY_HOLDER, datacenter_network, gateways};
pub use pool::{
    DEFAULT_SPACE, RecordedPrefixes, machine_reserved, parse_reuse_after, pool_input,
    validate_pool, validate_pool_against_state, validate_pool_with_clusters,
};
pub use references::{override_fits, override_pools};

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

    /// Records the error of a check that returns one (see [`names`]).
    pub fn check(&mut self, result: Result<(), FieldError>) {
        if let Err(mut e) = result {
            e.object = self.object.clone();
            self.list.push(e);
        }
    }

    /// Checks `spec` against the bounds of `kind`'s CRD schema. A field that already has an
    /// error keeps only that one: one clear reason per field.
    pub fn check_schema(&mut self, kind: &str, spec: &impl serde::Serialize) {
        for mut e in schema::check_spec(kind, spec) {
            if self.list.iter().any(|x| x.field == e.field) {
                continue;
            }
            e.object = self.object.clone();
            self.list.push(e);
        }
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
