//! The data an addon template sees.
//!
//! Field names are serialised as KKP spells them (`Cluster.Network.IPAMAllocations`,
//! `Type`, `CIDR`, `Addresses`, `DC`), so an addon written for KKP needs only its Go-template
//! syntax translated, not its data paths; kipam adds the pool datacenter's network (`Gateway`,
//! `PrefixLength`, `VLAN`, `DNS`, `MTU`). Every field is always present (an empty string, an
//! empty list or none when it does not apply), so under strict undefined a template can read
//! `allocation.CIDR` of a range allocation or `allocation.Gateway` of a pool without a network
//! without tripping an error.
//!
//! The types also deserialise from the same shape (missing fields default to empty), so the
//! data of one render can be written down, e.g. as a test fixture, and read back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Allocation type of a range allocation (`first-last` pieces).
pub const ALLOCATION_RANGE: &str = "range";
/// Allocation type of a prefix allocation (one subnet).
pub const ALLOCATION_PREFIX: &str = "prefix";

/// Everything one addon template renders from: the cluster and the Addon's variables.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TemplateData {
    /// `Cluster`: the user cluster the addon is rendered for.
    pub cluster: ClusterData,
    /// `Variables`: the Addon's `spec.variables`, as written by its author.
    pub variables: serde_json::Map<String, serde_json::Value>,
}

/// `Cluster`: who the addon is rendered for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ClusterData {
    /// `Cluster.Name`: the Cluster object's name.
    pub name: String,
    /// `Cluster.Datacenter`: the datacenter the cluster runs in.
    pub datacenter: String,
    /// `Cluster.Namespace`: the cluster's namespace on the seed (`cluster-<name>`).
    pub namespace: String,
    /// `Cluster.Network`.
    pub network: NetworkData,
}

/// `Cluster.Network`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkData {
    /// `Cluster.Network.IPAMAllocations`: pool name → that pool's allocation for this cluster.
    /// A `BTreeMap`, so templates iterate the pools in name order and output is deterministic.
    #[serde(rename = "IPAMAllocations")]
    pub ipam_allocations: BTreeMap<String, AllocationData>,
}

/// One IPAM allocation, as KKP exposes it to addons.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AllocationData {
    /// `Type`: `range` or `prefix`.
    #[serde(rename = "Type")]
    pub type_: String,
    /// `CIDR`: the allocated subnet of a prefix allocation; empty for a range allocation.
    #[serde(rename = "CIDR")]
    pub cidr: String,
    /// `Addresses`: the `first-last` pieces of a range allocation, in address order; empty for
    /// a prefix allocation.
    #[serde(rename = "Addresses")]
    pub addresses: Vec<String>,
    /// `DC`: the datacenter the allocation was made in.
    #[serde(rename = "DC")]
    pub dc: String,
    /// `Gateway`, `PrefixLength`, `VLAN`, `DNS`, `MTU`: the network of the pool datacenter.
    #[serde(flatten)]
    pub network: AllocationNetwork,
    /// `MetalLBPool`: for an allocation made by adoption, the name of the hand-made MetalLB
    /// `IPAddressPool` it takes over in place (render the pool under this name); `none`
    /// otherwise.
    #[serde(rename = "MetalLBPool", default)]
    pub metallb_pool: Option<String>,
    /// `MetalLBNamespace`: that pool's namespace; `none` otherwise.
    #[serde(rename = "MetalLBNamespace", default)]
    pub metallb_namespace: Option<String>,
    /// `MetalLBKept`: that hand-made pool's pieces outside every kipam pool, to be written back
    /// into it unchanged; empty otherwise.
    #[serde(rename = "MetalLBKept", default)]
    pub metallb_kept: Vec<String>,
}

/// The network of the pool datacenter an allocation comes from (its `network`). The keys are
/// always there: a value the pool does not give is `none` (`DNS`: an empty list), so a
/// template can test `{% if a.Gateway %}` under strict undefined.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AllocationNetwork {
    /// `Gateway`: the default gateway.
    #[serde(rename = "Gateway")]
    pub gateway: Option<String>,
    /// `PrefixLength`: the prefix length of the network (the pool's own when the pool names a
    /// network without one).
    #[serde(rename = "PrefixLength")]
    pub prefix_length: Option<u8>,
    /// `VLAN`: the 802.1Q VLAN ID.
    #[serde(rename = "VLAN")]
    pub vlan: Option<u16>,
    /// `DNS`: the DNS servers, in order of preference.
    #[serde(rename = "DNS")]
    pub dns: Vec<String>,
    /// `MTU`: the MTU in bytes.
    #[serde(rename = "MTU")]
    pub mtu: Option<u16>,
}

impl AllocationData {
    /// A range allocation made of the given `first-last` pieces.
    pub fn range<I, S>(dc: impl Into<String>, addresses: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        AllocationData {
            type_: ALLOCATION_RANGE.to_string(),
            cidr: String::new(),
            addresses: addresses.into_iter().map(Into::into).collect(),
            dc: dc.into(),
            network: AllocationNetwork::default(),
            metallb_pool: None,
            metallb_namespace: None,
            metallb_kept: Vec::new(),
        }
    }

    /// A prefix allocation of one subnet.
    pub fn prefix(dc: impl Into<String>, cidr: impl Into<String>) -> Self {
        AllocationData {
            type_: ALLOCATION_PREFIX.to_string(),
            cidr: cidr.into(),
            addresses: Vec::new(),
            dc: dc.into(),
            network: AllocationNetwork::default(),
            metallb_pool: None,
            metallb_namespace: None,
            metallb_kept: Vec::new(),
        }
    }
}

impl AllocationData {
    /// The same allocation taking over hand-made MetalLB pool `namespace/name` (adoption),
    /// keeping `kept` in it.
    pub fn taking_over(mut self, namespace: &str, name: &str, kept: Vec<String>) -> Self {
        self.metallb_namespace = Some(namespace.to_string());
        self.metallb_pool = Some(name.to_string());
        self.metallb_kept = kept;
        self
    }

    /// The same allocation with its pool datacenter's network.
    pub fn with_network(mut self, network: AllocationNetwork) -> Self {
        self.network = network;
        self
    }
}

impl ClusterData {
    /// A cluster with kipam's namespace convention (`cluster-<name>`) and no allocations yet.
    pub fn new(name: impl Into<String>, datacenter: impl Into<String>) -> Self {
        let name = name.into();
        ClusterData {
            namespace: format!("cluster-{name}"),
            name,
            datacenter: datacenter.into(),
            network: NetworkData::default(),
        }
    }

    /// Adds (or replaces) the allocation of one pool.
    pub fn with_allocation(mut self, pool: impl Into<String>, allocation: AllocationData) -> Self {
        self.network
            .ipam_allocations
            .insert(pool.into(), allocation);
        self
    }
}

impl TemplateData {
    /// Template data for a cluster with no variables.
    pub fn new(cluster: ClusterData) -> Self {
        TemplateData {
            cluster,
            variables: serde_json::Map::new(),
        }
    }

    /// Sets one variable.
    pub fn with_variable(mut self, name: impl Into<String>, value: serde_json::Value) -> Self {
        self.variables.insert(name.into(), value);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_with_kkp_names() {
        let data = TemplateData::new(
            ClusterData::new("alpha", "dc-1")
                .with_allocation(
                    "metallb",
                    AllocationData::range("dc-1", ["10.0.0.0-10.0.0.7"]),
                )
                .with_allocation(
                    "other",
                    AllocationData::prefix("dc-1", "10.1.0.0/30").with_network(AllocationNetwork {
                        gateway: Some("10.1.0.1".into()),
                        prefix_length: Some(24),
                        vlan: Some(7),
                        dns: vec!["10.1.0.53".into()],
                        mtu: Some(9000),
                    }),
                ),
        )
        .with_variable("flag", serde_json::Value::Bool(true));
        let json = serde_json::to_value(&data).unwrap_or_default();
        let back: Option<TemplateData> = serde_json::from_value(json.clone()).ok();
        assert_eq!(back.as_ref(), Some(&data));
        assert_eq!(
            json,
            serde_json::json!({
                "Cluster": {
                    "Name": "alpha",
                    "Datacenter": "dc-1",
                    "Namespace": "cluster-alpha",
                    "Network": {"IPAMAllocations": {
                        "metallb": {"Type": "range", "CIDR": "", "Addresses": ["10.0.0.0-10.0.0.7"], "DC": "dc-1",
                                    "Gateway": null, "PrefixLength": null, "VLAN": null, "DNS": [], "MTU": null,
                                    "MetalLBPool": null, "MetalLBNamespace": null, "MetalLBKept": []},
                        "other": {"Type": "prefix", "CIDR": "10.1.0.0/30", "Addresses": [], "DC": "dc-1",
                                  "Gateway": "10.1.0.1", "PrefixLength": 24, "VLAN": 7, "DNS": ["10.1.0.53"], "MTU": 9000,
                                  "MetalLBPool": null, "MetalLBNamespace": null, "MetalLBKept": []},
                    }},
                },
                "Variables": {"flag": true},
            })
        );
    }
}
