//! Taking over a user cluster that already runs MetalLB (`spec.adopt`): what discovery read
//! from a user cluster, as plain data.
//!
//! The discovery adapter fills [`Discovered`] from the user cluster's MetalLB
//! `IPAddressPool`s that kipam did not create and its `LoadBalancer` Services; everything is
//! kept as written (strings), so that the plan can name what it cannot read instead of
//! dropping it.

use serde::Serialize;

use crate::resources::{AdoptMode, Cluster, IPAMPool};

/// What one user cluster serves today, as read through its kubeconfig.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Discovered {
    /// MetalLB `IPAddressPool`s without kipam's addon label, sorted by name.
    pub pools: Vec<HandMadePool>,
    /// `LoadBalancer` Services that hold at least one address, sorted by `namespace/name`.
    pub services: Vec<ServedService>,
}

/// A MetalLB `IPAddressPool` typed in by hand.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HandMadePool {
    /// `metadata.name` (MetalLB's pools live in its own namespace).
    pub name: String,
    /// `spec.addresses` as written: CIDRs or `first-last` ranges.
    pub addresses: Vec<String>,
}

/// A `LoadBalancer` Service and the addresses MetalLB gave it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServedService {
    /// `namespace/name`.
    pub name: String,
    /// `status.loadBalancer.ingress[].ip`, as written.
    pub addresses: Vec<String>,
    /// The pool the Service asks for by annotation (`metallb.universe.tf/address-pool` or
    /// `metallb.io/address-pool`), if any.
    pub pool: Option<String>,
}

/// The adoption mode that applies to a cluster: its own `spec.adopt`, else the `adopt` of its
/// datacenter in the pools that list it. Pools that disagree give the most careful of their
/// values (`DryRun` before `Adopt` before `Off`). `None` and `Off` both mean: start from
/// nothing, read nothing.
pub fn effective_mode<'a>(
    cluster: &Cluster,
    pools: impl IntoIterator<Item = &'a IPAMPool>,
) -> Option<AdoptMode> {
    if let Some(own) = cluster.spec.adopt {
        return Some(own);
    }
    let care = |m: &AdoptMode| match m {
        AdoptMode::DryRun => 0,
        AdoptMode::Adopt => 1,
        AdoptMode::Off => 2,
    };
    pools
        .into_iter()
        .filter_map(|p| p.spec.datacenters.get(&cluster.spec.datacenter))
        .filter_map(|dc| dc.adopt)
        .min_by_key(care)
}

/// Whether discovery reads this cluster's user cluster: `DryRun` or `Adopt` applies.
pub fn reads(mode: Option<AdoptMode>) -> bool {
    matches!(mode, Some(AdoptMode::DryRun | AdoptMode::Adopt))
}
