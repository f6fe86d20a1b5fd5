//! What one object of a user cluster says about what it serves (pure): a MetalLB
//! `IPAddressPool` typed in by hand, or a `LoadBalancer` Service holding addresses. Everything
//! is kept as written; the planner reads and judges it.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::DynamicObject;

use crate::planner::adopt::{HandMadePool, ServedService};
use crate::render::ADDON_LABEL;

/// The annotations a Service names its MetalLB pool with, the current one first.
pub const POOL_ANNOTATIONS: [&str; 2] = [
    "metallb.io/address-pool",
    "metallb.universe.tf/address-pool",
];

/// The pool, unless kipam rendered it (it carries kipam's addon label).
pub fn hand_made(pool: &DynamicObject) -> Option<HandMadePool> {
    if pool.labels().contains_key(ADDON_LABEL) {
        return None;
    }
    let addresses = pool
        .data
        .get("spec")
        .and_then(|s| s.get("addresses"))
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .map(|v| match v.as_str() {
                    Some(text) => text.to_string(),
                    // Not a string (a schema-less server let it in): shown as written.
                    None => v.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(HandMadePool {
        namespace: pool.namespace().unwrap_or_default(),
        name: pool.name_any(),
        addresses,
    })
}

/// `namespace/name` of a Service.
pub fn service_name(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// The Service, when it is of type `LoadBalancer` and holds at least one address
/// (`status.loadBalancer.ingress[].ip`; entries with a hostname only are not addresses).
pub fn served(svc: &Service) -> Option<ServedService> {
    if svc.spec.as_ref()?.type_.as_deref() != Some("LoadBalancer") {
        return None;
    }
    let addresses: Vec<String> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone())
        .filter(|ip| !ip.is_empty())
        .collect();
    if addresses.is_empty() {
        return None;
    }
    let pool = svc.metadata.annotations.as_ref().and_then(|a| {
        POOL_ANNOTATIONS
            .iter()
            .find_map(|k| a.get(*k).filter(|v| !v.is_empty()).cloned())
    });
    Some(ServedService {
        name: service_name(svc),
        addresses,
        pool,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kipams_pools_are_left_out_and_the_rest_kept_as_written() {
        let pool: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
            "metadata": {"name": "legacy", "namespace": "metallb-system"},
            "spec": {"addresses": ["10.0.0.0/28", "10.0.1.5-10.0.1.9", "not an address"]},
        }))
        .unwrap();
        assert_eq!(
            hand_made(&pool),
            Some(HandMadePool {
                namespace: "metallb-system".into(),
                name: "legacy".into(),
                addresses: vec![
                    "10.0.0.0/28".into(),
                    "10.0.1.5-10.0.1.9".into(),
                    "not an address".into()
                ],
            })
        );
        let mut ours = pool.clone();
        ours.labels_mut()
            .insert(ADDON_LABEL.into(), "metallb".into());
        assert_eq!(hand_made(&ours), None);
    }

    #[test]
    fn only_load_balancers_holding_an_address_are_served() {
        let svc = |v: serde_json::Value| -> Service { serde_json::from_value(v).unwrap() };
        let base = json!({"metadata": {"name": "web", "namespace": "shop",
                "annotations": {"metallb.universe.tf/address-pool": "legacy"}},
            "spec": {"type": "LoadBalancer"},
            "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.3"}, {"hostname": "lb.example"}]}}});
        assert_eq!(
            served(&svc(base.clone())),
            Some(ServedService {
                name: "shop/web".into(),
                addresses: vec!["10.0.0.3".into()],
                pool: Some("legacy".into()),
            })
        );
        let mut pending = base.clone();
        pending["status"] = json!({"loadBalancer": {}});
        assert_eq!(served(&svc(pending)), None);
        let mut cluster_ip = base.clone();
        cluster_ip["spec"]["type"] = "ClusterIP".into();
        assert_eq!(served(&svc(cluster_ip)), None);
        let mut both = base;
        both["metadata"]["annotations"]["metallb.io/address-pool"] = "current".into();
        assert_eq!(served(&svc(both)).unwrap().pool.as_deref(), Some("current"));
    }
}
