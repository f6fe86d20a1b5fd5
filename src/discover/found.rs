//! What one object of a user cluster says about what it serves (pure): a MetalLB
//! `IPAddressPool` typed in by hand, or a `LoadBalancer` Service holding addresses. Everything
//! is kept as written; the planner reads and judges it.

use k8s_openapi::api::core::v1::Service;
use kube::api::DynamicObject;

use crate::planner::adopt::{self, HandMadePool, ServedService};

/// The pool, unless kipam rendered it (it carries kipam's addon label). Read as
/// `kipam adopt` reads an exported pool ([`adopt::hand_made_pool`]), so both say the same.
pub fn hand_made(pool: &DynamicObject) -> Option<HandMadePool> {
    adopt::hand_made_pool(&serde_json::to_value(pool).ok()?)
}

/// `namespace/name` of a Service.
pub fn service_name(svc: &Service) -> String {
    use kube::ResourceExt;
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

/// The Service, when it is of type `LoadBalancer` and holds at least one address
/// (`status.loadBalancer.ingress[].ip`; entries with a hostname only are not addresses).
/// Read as `kipam adopt` reads an exported Service ([`adopt::served_service`]).
pub fn served(svc: &Service) -> Option<ServedService> {
    adopt::served_service(&serde_json::to_value(svc).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::ADDON_LABEL;
    use kube::ResourceExt;
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
