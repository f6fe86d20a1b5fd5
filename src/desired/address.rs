//! The `IPAddress` a claim's decision asks for, and what its claim's status says (pure).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::address::Cidr;
use crate::allocator::Allocation;
use crate::resources::capi::{
    ADDRESS_FINALIZER, IPAddress, IPAddressClaimStatus, IPAddressSpec, LocalReference, MANAGED_BY,
    PoolReference,
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
    let (address, prefix) = match a.held {
        Allocation::Prefix(cidr) => (
            cidr.family().display(cidr.first()).to_string(),
            cidr.prefix_len(),
        ),
        Allocation::Range(pieces) => {
            let [one] = pieces.as_slice() else {
                return Err(format!("holds {} rather than one address", a.held));
            };
            if one.first() != one.last() {
                return Err(format!("holds {} rather than one address", a.held));
            }
            let prefix = a.prefix_length.or_else(|| {
                a.cidrs
                    .iter()
                    .find(|c| c.contains(one))
                    .map(|c| c.prefix_len())
            });
            let Some(prefix) = prefix else {
                return Err(format!("{} lies in none of the pool's CIDRs", a.held));
            };
            (one.family().display(one.first()).to_string(), prefix)
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

/// The `IPAddress` around `spec`: its name, labels, owners and finalizer.
pub fn object_of(a: &AddressFor<'_>, spec: IPAddressSpec) -> IPAddress {
    let labels = BTreeMap::from([
        (LABEL_POOL.to_string(), a.pool.to_string()),
        (LABEL_DATACENTER.to_string(), a.datacenter.to_string()),
        (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
    ]);
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
                    block_owner_deletion: None,
                },
            ]),
            ..Default::default()
        },
        spec,
    }
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
        assert_eq!(obj.metadata.finalizers.unwrap(), vec![ADDRESS_FINALIZER]);
        let mut with_net = for_held(&held, &cidrs);
        with_net.prefix_length = Some(22);
        with_net.gateway = Some("10.0.0.1");
        let obj = address_object(&with_net).unwrap();
        assert_eq!(obj.spec.prefix, 22);
        assert_eq!(obj.spec.gateway.as_deref(), Some("10.0.0.1"));
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
