//! A small MetalLB stand-in for user cluster stand-ins: it hands LoadBalancer Services that
//! wait for an address the lowest free address of the `IPAddressPool`s kipam rendered, takes
//! back an address its pool no longer lists, and when no address is free emits the
//! `AllocationFailed` event MetalLB emits (once per Service until it is served).
//!
//! It serves Services as MetalLB's default setup does: type `LoadBalancer`, no
//! `loadBalancerClass`. It looks every 20 ms (a test's timer, not kipam's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kipam::address::AddrRange;
use kube_standin::ApiServer;
use serde_json::{Value, json};

/// What the stand-in did, for the tests and the bench.
#[derive(Default, Debug)]
pub struct Log {
    /// `namespace/name` -> when first refused.
    pub refused: BTreeMap<String, Instant>,
    /// `namespace/name` -> (when served, the address).
    pub served: BTreeMap<String, (Instant, String)>,
}

pub struct MetalLb {
    stop: Arc<AtomicBool>,
    pub log: Arc<std::sync::Mutex<Log>>,
}

impl Drop for MetalLb {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn pool_addresses(api: &ApiServer) -> BTreeSet<u128> {
    api.list("ipaddresspools.metallb.io", Some("metallb-system"))
        .iter()
        .flat_map(|p| {
            p["spec"]["addresses"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|v| v.as_str().and_then(|t| AddrRange::parse_lenient(t).ok()))
        .flat_map(|r| r.first()..=r.last())
        .collect()
}

fn ip(a: u128) -> String {
    std::net::Ipv4Addr::from(a as u32).to_string()
}

fn parse(text: &str) -> Option<u128> {
    text.parse::<std::net::Ipv4Addr>()
        .ok()
        .map(|a| u32::from(a) as u128)
}

/// One look at the user cluster.
fn step(api: &ApiServer, log: &std::sync::Mutex<Log>, events: &mut u64) {
    let pool = pool_addresses(api);
    let services: Vec<Value> = api
        .list("services", None)
        .into_iter()
        .filter(|s| s["spec"]["type"] == "LoadBalancer" && s["spec"]["loadBalancerClass"].is_null())
        .collect();
    let key = |s: &Value| {
        format!(
            "{}/{}",
            s["metadata"]["namespace"].as_str().unwrap_or_default(),
            s["metadata"]["name"].as_str().unwrap_or_default()
        )
    };
    let mut used: BTreeSet<u128> = BTreeSet::new();
    let mut waiting = Vec::new();
    for s in &services {
        let held = s["status"]["loadBalancer"]["ingress"][0]["ip"]
            .as_str()
            .and_then(parse);
        match held {
            Some(a) if pool.contains(&a) => {
                used.insert(a);
            }
            Some(_) => {
                // The pool no longer lists it: MetalLB takes it back.
                let _ = api.set_status(
                    "services",
                    s["metadata"]["namespace"].as_str(),
                    s["metadata"]["name"].as_str().unwrap_or_default(),
                    json!({"loadBalancer": {"ingress": null}}),
                );
            }
            None => waiting.push(s),
        }
    }
    let mut free = pool.iter().filter(|a| !used.contains(a)).copied();
    for s in waiting {
        let name = key(s);
        let ns = s["metadata"]["namespace"].as_str().unwrap_or("default");
        match free.next() {
            Some(a) => {
                let _ = api.set_status(
                    "services",
                    Some(ns),
                    s["metadata"]["name"].as_str().unwrap_or_default(),
                    json!({"loadBalancer": {"ingress": [{"ip": ip(a)}]}}),
                );
                let mut log = log.lock().unwrap();
                log.served.entry(name).or_insert((Instant::now(), ip(a)));
            }
            None => {
                let mut log = log.lock().unwrap();
                if log.refused.contains_key(&name) {
                    continue;
                }
                log.refused.insert(name.clone(), Instant::now());
                drop(log);
                *events += 1;
                let _ = api.create(&json!({
                    "apiVersion": "v1", "kind": "Event",
                    "metadata": {"name": format!("{}.{}", s["metadata"]["name"].as_str().unwrap_or_default(), events), "namespace": ns},
                    "involvedObject": {"apiVersion": "v1", "kind": "Service", "namespace": ns,
                        "name": s["metadata"]["name"]},
                    "reason": "AllocationFailed",
                    "type": "Warning",
                    "message": format!("Failed to allocate IP for \"{name}\": no available IPs"),
                    "source": {"component": "metallb-controller"},
                }));
            }
        }
    }
}

impl MetalLb {
    /// Starts serving `api` until dropped.
    #[allow(dead_code)]
    pub fn start(api: ApiServer) -> MetalLb {
        MetalLb::start_every(api, Duration::from_millis(20))
    }

    /// [`MetalLb::start`], looking every `interval`.
    pub fn start_every(api: ApiServer, interval: Duration) -> MetalLb {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(std::sync::Mutex::new(Log::default()));
        let (s, l) = (stop.clone(), log.clone());
        std::thread::spawn(move || {
            let mut events = 0;
            while !s.load(Ordering::Relaxed) {
                step(&api, &l, &mut events);
                std::thread::sleep(interval);
            }
        });
        MetalLb { stop, log }
    }
}

/// A LoadBalancer Service in `default`.
#[allow(dead_code)]
pub fn service(api: &ApiServer, name: &str) {
    api.create(&json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    }))
    .expect("service created");
}

/// The address a Service holds.
#[allow(dead_code)]
pub fn address_of(api: &ApiServer, name: &str) -> Option<String> {
    api.get("services", Some("default"), name)?["status"]["loadBalancer"]["ingress"][0]["ip"]
        .as_str()
        .map(str::to_string)
}
