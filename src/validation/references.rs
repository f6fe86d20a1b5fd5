//! References between objects that only make sense together: a cluster's per-pool override
//! must name a pool that exists.

use crate::resources::Cluster;

use super::{Errors, FieldError, strict::suggest};

/// Overrides under `spec.ipam` of `cluster` that name none of `pools`. Such an override would
/// otherwise do nothing, silently (a typo in a pool name, or a pool that was removed).
pub fn override_pools<'p>(
    cluster: &Cluster,
    pools: impl IntoIterator<Item = &'p str> + Clone,
) -> Vec<FieldError> {
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let mut errors = Errors::new(format!("Cluster {name}"));
    for pool in cluster.spec.ipam.keys() {
        if pools.clone().into_iter().any(|p| p == pool) {
            continue;
        }
        let reason = match suggest(pool, pools.clone()) {
            Some(close) => format!("names no IPAMPool, did you mean {close}?"),
            None => "names no IPAMPool".to_string(),
        };
        errors.add(format!("spec.ipam[{pool}]"), "", reason);
    }
    errors.into_vec()
}
