//! The `IPAddress` a claim's decision asks for, and what its claim's status says (pure).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::address::Cidr;
use crate::allocator::Allocation;
use crate::resources::capi::{
    ADDRESS_FINALIZER, IPAddress, IPAddressClaimStatus, IPAddressSpec, LABEL_CAPI_CLUSTER_NAME,
    LocalReference, MANAGED_BY, PoolReference,
};
use crate::resources::{API_VERSION, Condition, LABEL_DATACENTER, LABEL_POOL};

/// What an `IPAddress` is made of.
pub struct AddressFor<'a> {
    pub namespace: &'a str,
    pub claim: &'a str,
    pub claim_uid: &'a str,
    pub pool: &'a str,
    pub pool_uid: &'a str,
    pub datacenter: &'a str,
    pub held: &'a Allocation,
    /// The pool datacenter's CIDRs (the one holding the address gives the prefix when the
    /// datacenter has no `network.prefixLength`).
    pub cidrs: &'a [Cidr],
    /// `network.prefixLength` and `network.gateway`, when the datacenter has a network.
    pub prefix_length: Option<u8>,
    pub gateway: Option<&'a str>,
    /// The claim's `cluster.x-k8s.io/cluster-name` label (else its `spec.clusterName`),
    /// copied onto the `IPAddress` as the reference provider does (`clusterctl move` and
    /// users select a cluster's objects by it).
    pub cluster_name: Option<&'a str>,
}

/// The `IPAddress` for a claim holding `held`: one address of a range pool, or the first
/// address of a prefix pool's subnet with the subnet's length. `Err` when the holding is not
/// one address or one subnet (a claim never holds more; the message says what it holds).
pub fn address_object(a: &AddressFor<'_>) -> Result<IPAddress, String> {
    let spec = address_spec(a)?;
    Ok(object_of(a, spec))
}

/// The `spec` of [`address_object`] alone: what decides whether a stored `IPAddress` needs a
/// write, without building the rest.
pub fn address_spec(a: &AddressFor<'_>) -> Result<IPAddressSpec, String> {
    let prefix = held_prefix(a.held, a.cidrs, a.prefix_length)?;
    let address = match a.held {
        Allocation::Prefix(cidr) => cidr.family().display(cidr.first()).to_string(),
        Allocation::Range(pieces) => {
            let Some(one) = pieces.first() else {
                return Err(format!("holds {} rather than one address", a.held));
            };
            one.family().display(one.first()).to_string()
        }
    };
    Ok(IPAddressSpec {
        claim_ref: LocalReference {
            name: a.claim.to_string(),
        },
        pool_ref: PoolReference::to_pool(a.pool),
        address,
        prefix: i32::from(prefix),
        gateway: a.gateway.map(str::to_string),
    })
}

/// The `spec.prefix` of the `IPAddress` for a claim holding `held` (see [`address_spec`]): a
/// subnet's own length, else `prefix_length` (the datacenter network's), else the length of
/// the pool CIDR holding the address. `Err` as [`address_spec`]'s. Builds no string unless it
/// fails: it is asked of every claim's `IPAddress` when pool statuses are written.
pub fn held_prefix(
    held: &Allocation,
    cidrs: &[Cidr],
    prefix_length: Option<u8>,
) -> Result<u8, String> {
    match held {
        Allocation::Prefix(cidr) => Ok(cidr.prefix_len()),
        Allocation::Range(pieces) => {
            let [one] = pieces.as_slice() else {
                return Err(format!("holds {held} rather than one address"));
            };
            if one.first() != one.last() {
                return Err(format!("holds {held} rather than one address"));
            }
            prefix_length
                .or_else(|| {
                    cidrs
                        .iter()
                        .find(|c| c.contains(one))
                        .map(|c| c.prefix_len())
                })
                .ok_or_else(|| format!("{held} lies in none of the pool's CIDRs"))
        }
    }
}

/// The `IPAddress` around `spec`: its name, labels, owners and finalizer.
pub fn object_of(a: &AddressFor<'_>, spec: IPAddressSpec) -> IPAddress {
    let mut labels = BTreeMap::from([
        (LABEL_POOL.to_string(), a.pool.to_string()),
        (LABEL_DATACENTER.to_string(), a.datacenter.to_string()),
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
    ]);
    if let Some(cluster) = a.cluster_name {
        labels.insert(LABEL_CAPI_CLUSTER_NAME.to_string(), cluster.to_string());
    }
    IPAddress {
        metadata: ObjectMeta {
            name: Some(a.claim.to_string()),
            namespace: Some(a.namespace.to_string()),
            labels: Some(labels),
            finalizers: Some(vec![ADDRESS_FINALIZER.to_string()]),
            owner_references: Some(vec![
                OwnerReference {
                    api_version: crate::resources::capi::CAPI_IPAM_VERSION.to_string(),
                    kind: "IPAddressClaim".to_string(),
                    name: a.claim.to_string(),
                    uid: a.claim_uid.to_string(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                },
                OwnerReference {
                    api_version: API_VERSION.to_string(),
                    kind: "IPAMPool".to_string(),
                    name: a.pool.to_string(),
                    uid: a.pool_uid.to_string(),
                    controller: Some(false),
                    // The contract: `blockOwnerDeletion: true` on the pool's reference too.
                    block_owner_deletion: Some(true),
                },
            ]),
            ..Default::default()
        },
        spec,
    }
}

/// The JSON merge patch that gives `existing` what `wanted` (from [`object_of`]) says of its
/// metadata: kipam's labels, the protecting finalizer and the owner references to the claim
/// and the pool; `None` when it has them all. Its `spec` is never touched (Cluster API keeps an
/// `IPAddress`'s spec immutable). Labels, finalizers and owner references of others are kept;
/// the patch names the `resourceVersion` it was computed on, so it applies to that version only.
/// This adopts an `IPAddress` made before its claim, and brings one written by an older kipam
/// up to date.
pub fn metadata_patch(existing: &IPAddress, wanted: &IPAddress) -> Option<serde_json::Value> {
    let mut patch = serde_json::Map::new();
    let have_labels = existing.metadata.labels.clone().unwrap_or_default();
    let labels: serde_json::Map<String, serde_json::Value> = wanted
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, v)| have_labels.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    if !labels.is_empty() {
        patch.insert("labels".into(), serde_json::Value::Object(labels));
    }
    let mut finalizers = existing.metadata.finalizers.clone().unwrap_or_default();
    if !finalizers.iter().any(|f| f == ADDRESS_FINALIZER) {
        finalizers.push(ADDRESS_FINALIZER.to_string());
        patch.insert("finalizers".into(), serde_json::json!(finalizers));
    }
    let have = existing
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    let want = wanted.metadata.owner_references.clone().unwrap_or_default();
    let ours = |o: &OwnerReference| {
        want.iter().any(|w| {
            w.kind == o.kind && w.api_version.split('/').next() == o.api_version.split('/').next()
        })
    };
    let mut refs: Vec<OwnerReference> = have.iter().filter(|o| !ours(o)).cloned().collect();
    refs.extend(want.iter().cloned());
    let same = refs.len() == have.len() && want.iter().all(|w| have.contains(w));
    if !same {
        patch.insert("ownerReferences".into(), serde_json::json!(refs));
    }
    if patch.is_empty() {
        return None;
    }
    patch.insert(
        "resourceVersion".into(),
        serde_json::json!(existing.metadata.resource_version),
    );
    Some(serde_json::json!({ "metadata": patch }))
}

/// The claim's status: `addressRef` (when served) and its `Ready` condition, keeping the
/// transition time while `Ready` does not change.
pub fn claim_status(
    previous: Option<&IPAddressClaimStatus>,
    address: Option<&str>,
    ready: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &str,
) -> IPAddressClaimStatus {
    let mut conditions: Vec<Condition> = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    crate::status::set_condition(
        &mut conditions,
        "Ready",
        ready,
        reason,
        message,
        generation,
        now,
    );
    IPAddressClaimStatus {
        address_ref: address.map(|name| LocalReference {
            name: name.to_string(),
        }),
        conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn for_held<'a>(held: &'a Allocation, cidrs: &'a [Cidr]) -> AddressFor<'a> {
        AddressFor {
            namespace: "capi",
            claim: "m0-eth0",
            claim_uid: "u-claim",
            pool: "nodes",
            pool_uid: "u-pool",
            datacenter: "fra",
            held,
            cidrs,
            prefix_length: None,
            gateway: None,
            cluster_name: Some("edge"),
        }
    }

    #[test]
    fn a_range_address_takes_the_prefix_of_its_cidr_or_the_network() {
        let held = Allocation::Range(vec!["10.0.1.9".parse().unwrap()]);
        let cidrs = [
            "10.0.0.0/24".parse().unwrap(),
            "10.0.1.0/25".parse().unwrap(),
        ];
        let obj = address_object(&for_held(&held, &cidrs)).unwrap();
        assert_eq!(
            (obj.spec.address.as_str(), obj.spec.prefix),
            ("10.0.1.9", 25)
        );
        assert_eq!(obj.spec.gateway, None);
        let refs = obj.metadata.owner_references.unwrap();
        assert_eq!(refs[0].controller, Some(true));
        assert_eq!(refs[0].block_owner_deletion, Some(true));
        assert_eq!(refs[1].controller, Some(false));
        assert_eq!(
            refs[1].block_owner_deletion,
            Some(true),
            "the contract's must"
        );
        assert_eq!(
            obj.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_CAPI_CLUSTER_NAME))
                .map(String::as_str),
            Some("edge")
        );
        assert_eq!(
            obj.metadata.finalizers.clone().unwrap(),
            vec![ADDRESS_FINALIZER]
        );
        let mut with_net = for_held(&held, &cidrs);
        with_net.prefix_length = Some(22);
        with_net.gateway = Some("10.0.0.1");
        let obj = address_object(&with_net).unwrap();
        assert_eq!(obj.spec.prefix, 22);
        assert_eq!(obj.spec.gateway.as_deref(), Some("10.0.0.1"));
    }

    #[test]
    fn an_address_made_by_hand_is_adopted_by_a_metadata_patch_keeping_what_others_set() {
        let held = Allocation::Range(vec!["10.0.1.9".parse().unwrap()]);
        let cidrs = ["10.0.1.0/24".parse().unwrap()];
        let wanted = address_object(&for_held(&held, &cidrs)).unwrap();
        let mut found = wanted.clone();
        found.metadata.labels = Some(BTreeMap::from([("team".to_string(), "a".to_string())]));
        found.metadata.finalizers = Some(vec!["example.com/keep".to_string()]);
        found.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "infrastructure.cluster.x-k8s.io/v1beta1".into(),
            kind: "VSphereMachine".into(),
            name: "m0".into(),
            uid: "u-machine".into(),
            ..Default::default()
        }]);
        found.metadata.resource_version = Some("41".into());
        let patch = metadata_patch(&found, &wanted).expect("a patch");
        let meta = &patch["metadata"];
        assert_eq!(meta["resourceVersion"], "41");
        assert_eq!(meta["labels"]["app.kubernetes.io/managed-by"], "kipam");
        assert!(
            meta["labels"].get("team").is_none(),
            "others' labels untouched"
        );
        assert_eq!(
            meta["finalizers"],
            serde_json::json!(["example.com/keep", ADDRESS_FINALIZER])
        );
        let refs = meta["ownerReferences"].as_array().unwrap();
        assert_eq!(refs.len(), 3);
        assert_eq!(refs[0]["kind"], "VSphereMachine");
        assert!(patch.get("spec").is_none(), "the spec is never touched");
        // Nothing to do once it carries everything.
        assert_eq!(metadata_patch(&wanted, &wanted), None);
    }

    #[test]
    fn a_subnet_is_its_first_address_and_its_length() {
        let held = Allocation::Prefix("2001:db8:0:40::/60".parse().unwrap());
        let obj = address_object(&for_held(&held, &[])).unwrap();
        assert_eq!(
            (obj.spec.address.as_str(), obj.spec.prefix),
            ("2001:db8:0:40::", 60)
        );
    }

    #[test]
    fn more_than_one_address_is_refused_with_what_is_held() {
        let held = Allocation::Range(vec!["10.0.0.1-10.0.0.2".parse().unwrap()]);
        let cidrs = ["10.0.0.0/24".parse().unwrap()];
        let err = address_object(&for_held(&held, &cidrs)).unwrap_err();
        assert!(err.contains("10.0.0.1-10.0.0.2"), "{err}");
    }
}
