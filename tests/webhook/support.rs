//! Reviews, objects and certificates for the webhook tests.

#![allow(dead_code)]

use kipam::resources::{Cluster, IPAMAllocation, IPAMPool, IPAMPoolRecord};
use kipam::webhook::StaticSource;
use kipam::webhook::review::{AdmissionRequest, Verdict};
use kipam::webhook::rules::{self, View};
use serde_json::{Value, json};

pub const KIPAM: &str = "system:serviceaccount:kipam-system:kipam";
pub const HUMAN: &str = "alice";

pub fn pool_json(name: &str, dcs: Value) -> Value {
    json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "IPAMPool",
        "metadata": {"name": name},
        "spec": {"datacenters": dcs},
    })
}

/// A range pool `metallb` in `dc-1` over 10.0.0.0/24, 8 addresses per cluster, with
/// exclusion 10.0.0.250.
pub fn range_pool() -> Value {
    pool_json(
        "metallb",
        json!({"dc-1": {"type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 8, "excludeRanges": ["10.0.0.250"]}}),
    )
}

pub fn allocation_json(cluster: &str, pool: &str, dc: &str, addresses: &[&str]) -> Value {
    json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "IPAMAllocation",
        "metadata": {"name": pool, "namespace": format!("cluster-{cluster}")},
        "spec": {"type": "range", "dc": dc, "addresses": addresses},
        "status": {"phase": "Allocated"},
    })
}

pub fn cluster_json(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": spec,
    })
}

pub fn record_json(pool: &str, dc: &str, reservations: Value) -> Value {
    json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "IPAMPoolRecord",
        "metadata": {"name": format!("{pool}.{dc}")},
        "spec": {"pool": pool, "datacenter": dc, "reservations": reservations},
    })
}

pub fn request(
    resource: &str,
    operation: &str,
    user: &str,
    object: Option<Value>,
    old: Option<Value>,
) -> AdmissionRequest {
    let some = object
        .as_ref()
        .or(old.as_ref())
        .cloned()
        .unwrap_or(Value::Null);
    let name = some["metadata"]["name"].as_str().unwrap_or("").to_string();
    let namespace = some["metadata"]["namespace"].as_str().map(str::to_string);
    serde_json::from_value(json!({
        "uid": "u-1",
        "kind": {"group": "ipam.kipam.dev", "version": "v1alpha1", "kind": some["kind"]},
        "resource": {"group": "ipam.kipam.dev", "version": "v1alpha1", "resource": resource},
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": object,
        "oldObject": old,
    }))
    .unwrap()
}

/// A Cluster API `IPAddress` in `machines` for claim `claim`, from kipam pool `pool`.
pub fn ip_address_json(version: &str, claim: &str, pool: &str, address: &str) -> Value {
    json!({
        "apiVersion": format!("ipam.cluster.x-k8s.io/{version}"),
        "kind": "IPAddress",
        "metadata": {"name": claim, "namespace": "machines"},
        "spec": {
            "claimRef": {"name": claim},
            "poolRef": {"apiGroup": "ipam.kipam.dev", "kind": "IPAMPool", "name": pool},
            "address": address,
            "prefix": 24,
        },
    })
}

/// A review of an `ipaddresses` write (group `ipam.cluster.x-k8s.io`, `version`).
pub fn ip_address_request(
    version: &str,
    operation: &str,
    user: &str,
    object: Option<Value>,
    old: Option<Value>,
) -> AdmissionRequest {
    let mut r = request("ipaddresses", operation, user, object, old);
    r.resource.group = "ipam.cluster.x-k8s.io".into();
    r.resource.version = version.into();
    r
}

pub fn review_json(request: &AdmissionRequest) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": request.uid,
            "resource": {"group": request.resource.group, "version": request.resource.version, "resource": request.resource.resource},
            "name": request.name,
            "namespace": request.namespace,
            "operation": request.operation,
            "userInfo": {"username": request.user_info.username},
            "object": request.object,
            "oldObject": request.old_object,
        }
    })
}

/// A seed: pools, clusters, allocation objects, records, as the webhook's caches hold them.
#[derive(Default, Clone)]
pub struct Seed {
    pub source: StaticSource,
}

impl Seed {
    pub fn pool(mut self, v: Value) -> Self {
        self.source
            .pools
            .push(serde_json::from_value::<IPAMPool>(v).unwrap());
        self
    }
    pub fn cluster(mut self, v: Value) -> Self {
        self.source
            .clusters
            .push(serde_json::from_value::<Cluster>(v).unwrap());
        self
    }
    pub fn allocation(mut self, v: Value) -> Self {
        self.source
            .allocations
            .push(serde_json::from_value::<IPAMAllocation>(v).unwrap());
        self
    }
    pub fn record(mut self, v: Value) -> Self {
        self.source
            .records
            .push(serde_json::from_value::<IPAMPoolRecord>(v).unwrap());
        self
    }
    pub fn terminating(mut self, ns: &str) -> Self {
        self.source.terminating_namespaces.push(ns.to_string());
        self
    }

    /// What the webhook answers.
    pub fn decide(&self, request: &AdmissionRequest) -> Verdict {
        let wants = rules::wants(request);
        let view: View =
            futures::FutureExt::now_or_never(kipam::webhook::Source::view(&self.source, &wants))
                .unwrap()
                .unwrap();
        rules::decide(request, &view, KIPAM)
    }
}

/// A self-signed CA and a server certificate for `127.0.0.1` / `localhost` signed by it.
pub struct Pki {
    pub ca_pem: String,
    ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
    ca_params: rcgen::CertificateParams,
}

impl Pki {
    pub fn new() -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kipam test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.clone().self_signed(&key).unwrap();
        Pki {
            ca_pem: cert.pem(),
            ca_cert: cert,
            ca_key: key,
            ca_params: params,
        }
    }

    /// (certificate PEM, key PEM) for the webhook, with `cn` as its common name.
    pub fn server(&self, cn: &str) -> (String, String) {
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let issuer = rcgen::Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let _ = &self.ca_cert;
        (cert.pem(), key.serialize_pem())
    }
}
