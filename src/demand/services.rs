//! Which Services are demand on kipam's pool (pure).
//!
//! A Service counts when MetalLB would serve it from the pool kipam renders: type
//! `LoadBalancer`, no `loadBalancerClass` (MetalLB's default setup serves Services without
//! one), no address pool asked for other than kipam's (`metallb.io/address-pool`, or the older
//! `metallb.universe.tf/address-pool`), and no specific address asked for
//! (`metallb.io/loadBalancerIPs`, `metallb.universe.tf/loadBalancerIPs`,
//! `spec.loadBalancerIP`). It waits while its status shows no ingress address.

use k8s_openapi::api::core::v1::Service;

use crate::address::parse_address;
use crate::seed::demand::ServiceDemand;

/// The MetalLB pools the `metallb` addon renders from kipam's allocations.
pub const KIPAM_METALLB_POOLS: [&str; 2] = ["kipam-managed-pool", "kipam-managed-pool-dualstack"];

const POOL_ANNOTATIONS: [&str; 2] = [
    "metallb.io/address-pool",
    "metallb.universe.tf/address-pool",
];
const IP_ANNOTATIONS: [&str; 2] = [
    "metallb.io/loadBalancerIPs",
    "metallb.universe.tf/loadBalancerIPs",
];

/// What `svc` asks of kipam's pool: `None` for a Service that is not of type LoadBalancer
/// (it holds and asks for nothing kipam hands out).
pub fn service_demand(svc: &Service) -> Option<ServiceDemand> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return None;
    }
    let addresses: Vec<u128> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref())
        .filter_map(|ip| parse_address(ip).ok())
        .map(|(_, a)| a)
        .collect();
    let annotations = svc.metadata.annotations.as_ref();
    let annotation = |keys: &[&str]| {
        annotations.and_then(|a| keys.iter().find_map(|k| a.get(*k).map(String::as_str)))
    };
    let other_class = spec
        .load_balancer_class
        .as_deref()
        .is_some_and(|c| !c.is_empty());
    let other_pool = annotation(&POOL_ANNOTATIONS).is_some_and(|p| {
        !p.split(',')
            .map(str::trim)
            .any(|p| KIPAM_METALLB_POOLS.contains(&p))
    });
    let specific = annotation(&IP_ANNOTATIONS).is_some()
        || spec
            .load_balancer_ip
            .as_deref()
            .is_some_and(|ip| !ip.is_empty());
    let has_ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    Some(ServiceDemand {
        waiting: !other_class && !other_pool && !specific && !has_ingress,
        addresses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(json: serde_json::Value) -> Service {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn only_services_metallb_would_serve_from_kipams_pool_wait() {
        let base = serde_json::json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"type": "LoadBalancer"}});
        assert!(service_demand(&svc(base.clone())).unwrap().waiting);
        let mut cluster_ip = base.clone();
        cluster_ip["spec"]["type"] = "ClusterIP".into();
        assert_eq!(service_demand(&svc(cluster_ip)), None);
        let mut class = base.clone();
        class["spec"]["loadBalancerClass"] = "example.com/other".into();
        assert!(!service_demand(&svc(class)).unwrap().waiting);
        let mut pool = base.clone();
        pool["metadata"]["annotations"] =
            serde_json::json!({"metallb.universe.tf/address-pool": "theirs"});
        assert!(!service_demand(&svc(pool)).unwrap().waiting);
        let mut ours = base.clone();
        ours["metadata"]["annotations"] =
            serde_json::json!({"metallb.io/address-pool": "kipam-managed-pool"});
        assert!(service_demand(&svc(ours)).unwrap().waiting);
        let mut ip = base.clone();
        ip["metadata"]["annotations"] =
            serde_json::json!({"metallb.io/loadBalancerIPs": "10.0.0.5"});
        assert!(!service_demand(&svc(ip)).unwrap().waiting);
        let mut legacy_ip = base.clone();
        legacy_ip["spec"]["loadBalancerIP"] = "10.0.0.5".into();
        assert!(!service_demand(&svc(legacy_ip)).unwrap().waiting);
        let mut served = base;
        served["status"] = serde_json::json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.7"}]}});
        let d = service_demand(&svc(served)).unwrap();
        assert!(!d.waiting);
        assert_eq!(d.addresses, vec![0x0a00_0007]);
    }
}
