//! A model of MetalLB's controller for one stand-in user cluster, and a record of what it did.
//!
//! [`MetalLbModel::start`] subscribes to the instance's `IPAddressPool`s and Services inside
//! the store, so it sees every change in order, none sampled away, and acts the way MetalLB's
//! controller acts on them (its allocator, its Service reconciler and its configuration
//! check), writing Service statuses and `AllocationFailed` events straight into the store:
//!
//! - **Configuration.** The pools are the `IPAddressPool`s of `metallb-system`. A set of pools
//!   whose addresses overlap (between two pools or inside one), or that holds an entry that is
//!   not a CIDR or a `first-last` range, is refused as a whole: MetalLB keeps running on the last
//!   configuration it accepted. Every refusal is recorded ([`MetalLbModel::refusals`]).
//! - **On every accepted configuration** every `LoadBalancer` Service is looked at again. One
//!   whose address lies in some pool keeps it, whatever that pool's name now (a pool replaced
//!   by a differently named one with the same addresses keeps its Services); one whose
//!   address lies in no pool is cleared (`status.loadBalancer` emptied) and given a new address
//!   if one is free. With no pools at all, every Service is cleared.
//! - **A Service** is served when it is of type `LoadBalancer` without a `loadBalancerClass`.
//!   It keeps its address unless the address is outside every pool, taken by another Service,
//!   not the pool its `metallb.io/address-pool` (or `metallb.universe.tf/address-pool`)
//!   annotation asks for, or not the address `spec.loadBalancerIP` (or the `loadBalancerIPs`
//!   annotation) asks for. A Service without an address gets the address it asks for, else the
//!   first free address of the pool it asks for, else the first free address of the pools with
//!   `autoAssign` (by pool name, then address), in the Service's first IP family. When there is
//!   none it stays pending, with a `Warning` event of reason `AllocationFailed` (one per time it
//!   is left pending).
//!
//! What it records, for tests to judge by history rather than by samples: every change of
//! every Service's ingress addresses, whoever made it ([`MetalLbModel::history`]), every one
//! that took an address away from a Service ([`MetalLbModel::lost_addresses`]), and every
//! period during which two stored pools overlapped ([`MetalLbModel::overlaps`]).
//!
//! Not modelled: address sharing (`allow-shared-ip`), dual-stack Services (one address each),
//! `serviceAllocation` pool selectors, `avoidBuggyIPs`, the `ip-allocated-from-pool`
//! annotation, and MetalLB's admission webhook (which refuses an overlapping pool at write
//! time; here the write lands and the configuration is refused instead).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::ApiServer;
use crate::store::{Change, ChangeKind, WatchFrom};
use crate::util::meta_str;

/// The namespace MetalLB reads its pools from.
pub const METALLB_NAMESPACE: &str = "metallb-system";

const POOL_ANNOTATIONS: [&str; 2] = [
    "metallb.io/address-pool",
    "metallb.universe.tf/address-pool",
];
const IP_ANNOTATIONS: [&str; 2] = [
    "metallb.io/loadBalancerIPs",
    "metallb.universe.tf/loadBalancerIPs",
];

/// One change of a Service's ingress addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusChange {
    /// `namespace/name`.
    pub service: String,
    pub old: Vec<String>,
    pub new: Vec<String>,
    /// When the model saw it, and the resource version of the change.
    pub at: Instant,
    pub rv: u64,
}

impl StatusChange {
    /// Addresses the Service showed before and no longer shows.
    pub fn taken(&self) -> Vec<String> {
        self.old
            .iter()
            .filter(|a| !self.new.contains(a))
            .cloned()
            .collect()
    }
}

/// A period during which two stored pools overlapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The two pools' names, in order.
    pub pools: (String, String),
    /// From the change that made them overlap (its time and resource version)...
    pub since: Instant,
    pub since_rv: u64,
    /// ...to the one that ended it (`None` while it lasts).
    pub until: Option<(Instant, u64)>,
}

/// A pool configuration MetalLB refused (it kept the previous one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: String,
    pub at: Instant,
    pub rv: u64,
}

/// One pool of a configuration: its intervals, and whether it hands addresses out unasked.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pool {
    ranges: Vec<(bool, u128, u128)>,
    auto_assign: bool,
}

#[derive(Default)]
struct State {
    /// The pools stored in `metallb-system`, by name: (addresses as written, autoAssign).
    stored: BTreeMap<String, (Vec<String>, bool)>,
    /// The configuration in force: the last one accepted.
    config: BTreeMap<String, Pool>,
    /// Services by `namespace/name`, as last seen.
    services: BTreeMap<String, Value>,
    history: Vec<StatusChange>,
    overlaps: Vec<Overlap>,
    refusals: Vec<Refusal>,
    /// Who holds each address, as the model's allocator sees it (the first to show an address
    /// keeps it).
    assigned: BTreeMap<(bool, u128), String>,
    /// Services left pending since their last `AllocationFailed` event.
    pending: BTreeSet<String>,
    events: u64,
    /// Every change of pools and Services up to this resource version has been acted on
    /// (0 until the task has looked at what was there at the start).
    acted_on: u64,
}

/// MetalLB's controller, modelled, on one stand-in instance. Stops when dropped.
pub struct MetalLbModel {
    state: Arc<Mutex<State>>,
    server: ApiServer,
    /// The two resource types it reads.
    types: (crate::ResourceType, crate::ResourceType),
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MetalLbModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl MetalLbModel {
    /// Starts acting on `server`'s pools and Services, in a task of the current runtime.
    ///
    /// # Panics
    /// When MetalLB's `IPAddressPool` CRD is not installed in `server` (install it first).
    pub fn start(server: &ApiServer) -> MetalLbModel {
        let pools_rt = server
            .resource_type("ipaddresspools.metallb.io")
            .expect("install MetalLB's CRDs before starting the MetalLB model");
        let services_rt = server
            .resource_type("services")
            .expect("the stand-in serves Services");
        let (pools, services) = {
            let mut store = server.shared().lock_store();
            let pools = store
                .subscribe(&pools_rt, Some(METALLB_NAMESPACE), WatchFrom::Snapshot)
                .expect("a snapshot subscription always starts");
            let services = store
                .subscribe(&services_rt, None, WatchFrom::Snapshot)
                .expect("a snapshot subscription always starts");
            (pools, services)
        };
        let state = Arc::new(Mutex::new(State::default()));
        {
            let mut s = lock(&state);
            for p in &pools.initial {
                s.stored
                    .insert(meta_str(p, "name").to_string(), pool_fields(p));
            }
            for svc in &services.initial {
                s.services.insert(key(svc), (**svc).clone());
            }
            // `caught_up` stays 0 until the task has looked at what is there.
        }
        let task = tokio::spawn(run(
            server.clone(),
            state.clone(),
            pools.rx,
            services.rx,
            pools.start_rv,
        ));
        MetalLbModel {
            state,
            server: server.clone(),
            types: (pools_rt, services_rt),
            task,
        }
    }

    /// Every change of a Service's ingress addresses, oldest first (creations with an address
    /// included; deletions not).
    pub fn history(&self) -> Vec<StatusChange> {
        lock(&self.state).history.clone()
    }

    /// The changes that took an address away from a Service that still exists.
    pub fn lost_addresses(&self) -> Vec<StatusChange> {
        self.history()
            .into_iter()
            .filter(|c| !c.taken().is_empty())
            .collect()
    }

    /// Every period during which two stored pools overlapped, oldest first.
    pub fn overlaps(&self) -> Vec<Overlap> {
        lock(&self.state).overlaps.clone()
    }

    /// Every pool configuration refused, oldest first.
    pub fn refusals(&self) -> Vec<Refusal> {
        lock(&self.state).refusals.clone()
    }

    /// The configuration in force: pool name → its addresses as written.
    pub fn config(&self) -> BTreeMap<String, Vec<String>> {
        let s = lock(&self.state);
        s.config
            .keys()
            .map(|n| {
                let written = s.stored.get(n).map(|(a, _)| a.clone()).unwrap_or_default();
                (n.clone(), written)
            })
            .collect()
    }

    /// Waits until the model has acted on every change of pools and Services stored so far,
    /// its own writes included (at most `timeout`); false if it has not by then.
    pub async fn caught_up(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let target = {
                let store = self.server.shared().lock_store();
                store
                    .last_change_of(&self.types.0, Some(METALLB_NAMESPACE))
                    .max(store.last_change_of(&self.types.1, None))
                    .max(1)
            };
            if lock(&self.state).acted_on >= target {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn key(obj: &Value) -> String {
    format!("{}/{}", meta_str(obj, "namespace"), meta_str(obj, "name"))
}

fn pool_fields(p: &Value) -> (Vec<String>, bool) {
    let addresses = p["spec"]["addresses"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let auto_assign = p["spec"]["autoAssign"].as_bool().unwrap_or(true);
    (addresses, auto_assign)
}

fn ingress(svc: &Value) -> Vec<String> {
    svc["status"]["loadBalancer"]["ingress"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["ip"].as_str())
                .filter(|ip| !ip.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn annotation<'a>(svc: &'a Value, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .find_map(|k| svc["metadata"]["annotations"][*k].as_str())
        .filter(|v| !v.is_empty())
}

/// An address as (is IPv6, value).
fn parse_ip(text: &str) -> Option<(bool, u128)> {
    match text.trim().parse::<IpAddr>().ok()? {
        IpAddr::V4(a) => Some((false, u32::from(a) as u128)),
        IpAddr::V6(a) => Some((true, u128::from(a))),
    }
}

fn show(v6: bool, a: u128) -> String {
    if v6 {
        std::net::Ipv6Addr::from(a).to_string()
    } else {
        std::net::Ipv4Addr::from(a as u32).to_string()
    }
}

/// A pool entry: a CIDR or a `first-last` range, as (is IPv6, first, last).
fn parse_entry(text: &str) -> Result<(bool, u128, u128), String> {
    if let Some((a, b)) = text.split_once('-') {
        let (fa, first) = parse_ip(a).ok_or_else(|| format!("invalid IP range {text:?}"))?;
        let (fb, last) = parse_ip(b).ok_or_else(|| format!("invalid IP range {text:?}"))?;
        if fa != fb || last < first {
            return Err(format!("invalid IP range {text:?}"));
        }
        return Ok((fa, first, last));
    }
    let (ip, bits) = text
        .split_once('/')
        .ok_or_else(|| format!("invalid CIDR {text:?}"))?;
    let (v6, addr) = parse_ip(ip).ok_or_else(|| format!("invalid CIDR {text:?}"))?;
    let width: u32 = if v6 { 128 } else { 32 };
    let bits: u32 = bits
        .parse()
        .ok()
        .filter(|b| *b <= width)
        .ok_or_else(|| format!("invalid CIDR {text:?}"))?;
    let host = if bits == width {
        0
    } else {
        (1u128 << (width - bits)) - 1
    };
    Ok((v6, addr & !host, addr | host))
}

/// The configuration the stored pools make, or why MetalLB refuses it.
fn configuration(
    stored: &BTreeMap<String, (Vec<String>, bool)>,
) -> Result<BTreeMap<String, Pool>, String> {
    let mut seen: Vec<(String, String, (bool, u128, u128))> = Vec::new();
    let mut config = BTreeMap::new();
    for (name, (addresses, auto_assign)) in stored {
        let mut ranges = Vec::new();
        for text in addresses {
            let r = parse_entry(text).map_err(|e| format!("pool {name:?}: {e}"))?;
            if let Some((_, other, _)) = seen
                .iter()
                .find(|(_, _, o)| o.0 == r.0 && o.1 <= r.2 && r.1 <= o.2)
            {
                return Err(format!(
                    "CIDR {text:?} in pool {name:?} overlaps with already defined CIDR {other:?}"
                ));
            }
            seen.push((name.clone(), text.clone(), r));
            ranges.push(r);
        }
        config.insert(
            name.clone(),
            Pool {
                ranges,
                auto_assign: *auto_assign,
            },
        );
    }
    Ok(config)
}

/// Pairs of stored pools that overlap, whatever else is wrong with them.
fn overlapping(stored: &BTreeMap<String, (Vec<String>, bool)>) -> BTreeSet<(String, String)> {
    let ranges: Vec<(&String, (bool, u128, u128))> = stored
        .iter()
        .flat_map(|(n, (a, _))| {
            a.iter()
                .filter_map(move |t| parse_entry(t).ok().map(|r| (n, r)))
        })
        .collect();
    let mut pairs = BTreeSet::new();
    for (i, (a, ra)) in ranges.iter().enumerate() {
        for (b, rb) in &ranges[i + 1..] {
            if a != b && ra.0 == rb.0 && ra.1 <= rb.2 && rb.1 <= ra.2 {
                let (x, y) = if a < b { (a, b) } else { (b, a) };
                pairs.insert(((*x).clone(), (*y).clone()));
            }
        }
    }
    pairs
}

async fn run(
    server: ApiServer,
    state: Arc<Mutex<State>>,
    mut pools: UnboundedReceiver<Arc<Change>>,
    mut services: UnboundedReceiver<Arc<Change>>,
    start_rv: u64,
) {
    // The configuration and Services present at the start.
    {
        let mut s = lock(&state);
        let now = Instant::now();
        note_overlaps(&mut s, now, start_rv);
        apply_config(&mut s, now, start_rv);
    }
    reconcile_all(&server, &state);
    lock(&state).acted_on = start_rv.max(1);
    loop {
        // Everything queued so far, in resource-version order across both channels.
        // (is a pool, the change)
        let mut batch: Vec<(bool, Arc<Change>)> = Vec::new();
        tokio::select! {
            c = pools.recv() => match c { Some(c) => batch.push((true, c)), None => return },
            c = services.recv() => match c { Some(c) => batch.push((false, c)), None => return },
        }
        while let Ok(c) = pools.try_recv() {
            batch.push((true, c));
        }
        while let Ok(c) = services.try_recv() {
            batch.push((false, c));
        }
        batch.sort_by_key(|(_, c)| c.rv);
        let mut config_changed = false;
        // Services changed, in the order of their first change (MetalLB's queue is FIFO).
        let mut touched: Vec<String> = Vec::new();
        {
            let mut s = lock(&state);
            let now = Instant::now();
            for (is_pool, change) in &batch {
                let obj = &change.object;
                if *is_pool {
                    let name = meta_str(obj, "name").to_string();
                    match change.kind {
                        ChangeKind::Deleted => {
                            s.stored.remove(&name);
                        }
                        _ => {
                            s.stored.insert(name, pool_fields(obj));
                        }
                    }
                    note_overlaps(&mut s, now, change.rv);
                    config_changed |= apply_config(&mut s, now, change.rv);
                } else {
                    let k = key(obj);
                    let old = s.services.get(&k).map(ingress).unwrap_or_default();
                    match change.kind {
                        ChangeKind::Deleted => {
                            s.services.remove(&k);
                            s.pending.remove(&k);
                            s.assigned.retain(|_, holder| *holder != k);
                        }
                        _ => {
                            let new = ingress(obj);
                            if new != old {
                                s.history.push(StatusChange {
                                    service: k.clone(),
                                    old,
                                    new,
                                    at: now,
                                    rv: change.rv,
                                });
                            }
                            s.services.insert(k.clone(), (**obj).clone());
                            if !touched.contains(&k) {
                                touched.push(k);
                            }
                        }
                    }
                }
            }
        }
        if config_changed {
            reconcile_all(&server, &state);
        } else {
            for k in touched {
                reconcile(&server, &state, &k);
            }
        }
        if let Some((_, last)) = batch.last() {
            let mut s = lock(&state);
            s.acted_on = s.acted_on.max(last.rv);
        }
    }
}

/// Opens and closes overlap periods after a change of the stored pools.
fn note_overlaps(s: &mut State, now: Instant, rv: u64) {
    let pairs = overlapping(&s.stored);
    for o in s.overlaps.iter_mut().filter(|o| o.until.is_none()) {
        if !pairs.contains(&o.pools) {
            o.until = Some((now, rv));
        }
    }
    for pair in pairs {
        let open = s
            .overlaps
            .iter()
            .any(|o| o.until.is_none() && o.pools == pair);
        if !open {
            s.overlaps.push(Overlap {
                pools: pair,
                since: now,
                since_rv: rv,
                until: None,
            });
        }
    }
}

/// Takes the stored pools as the configuration, or records why not; true if it changed.
fn apply_config(s: &mut State, now: Instant, rv: u64) -> bool {
    match configuration(&s.stored) {
        Ok(config) => {
            let changed = config != s.config;
            s.config = config;
            changed
        }
        Err(reason) => {
            s.refusals.push(Refusal {
                reason,
                at: now,
                rv,
            });
            false
        }
    }
}

fn reconcile_all(server: &ApiServer, state: &Mutex<State>) {
    let keys: Vec<String> = lock(state).services.keys().cloned().collect();
    for k in keys {
        reconcile(server, state, &k);
    }
}

/// What the model does about one Service.
enum Action {
    Nothing,
    Set(Vec<String>),
    Fail(String),
}

/// Looks at one Service as MetalLB's reconciler does, and writes what it decides.
fn reconcile(server: &ApiServer, state: &Mutex<State>, k: &str) {
    let (svc, action) = {
        let mut s = lock(state);
        let Some(svc) = s.services.get(k).cloned() else {
            return;
        };
        let (holds, action) = decide(&s, k, &svc);
        s.assigned.retain(|_, holder| holder != k);
        for a in holds {
            s.assigned.insert(a, k.to_string());
        }
        if let Action::Fail(_) = &action {
            if !s.pending.insert(k.to_string()) {
                return;
            }
            s.events += 1;
        } else {
            s.pending.remove(k);
        }
        (svc, action)
    };
    let ns = meta_str(&svc, "namespace");
    let name = meta_str(&svc, "name");
    match action {
        Action::Nothing => {}
        Action::Set(ips) => {
            let ingress: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
            let status = if ingress.is_empty() {
                json!({"loadBalancer": {"ingress": null}})
            } else {
                json!({"loadBalancer": {"ingress": ingress}})
            };
            // A Service deleted meanwhile: nothing to do.
            let _ = server.set_status("services", Some(ns), name, status);
        }
        Action::Fail(why) => {
            let n = lock(state).events;
            let _ = server.create(&json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": format!("{name}.metallb-{n}"), "namespace": ns},
                "involvedObject": {"apiVersion": "v1", "kind": "Service", "namespace": ns,
                    "name": name, "uid": svc["metadata"]["uid"]},
                "reason": "AllocationFailed",
                "type": "Warning",
                "message": format!("Failed to allocate IP for \"{k}\": {why}"),
                "source": {"component": "metallb-controller"},
            }));
        }
    }
}

/// What to do about one Service, and the addresses it holds once done.
fn decide(s: &State, k: &str, svc: &Value) -> (Vec<(bool, u128)>, Action) {
    let action = decide_action(s, k, svc);
    let served = svc["spec"]["type"] == "LoadBalancer"
        && svc["spec"]["loadBalancerClass"]
            .as_str()
            .is_none_or(str::is_empty);
    let holds = match &action {
        _ if !served => Vec::new(),
        Action::Nothing => ingress(svc).iter().filter_map(|t| parse_ip(t)).collect(),
        Action::Set(ips) => ips.iter().filter_map(|t| parse_ip(t)).collect(),
        Action::Fail(_) => Vec::new(),
    };
    (holds, action)
}

fn decide_action(s: &State, k: &str, svc: &Value) -> Action {
    let served = svc["spec"]["type"] == "LoadBalancer"
        && svc["spec"]["loadBalancerClass"]
            .as_str()
            .is_none_or(str::is_empty);
    let current = ingress(svc);
    if svc["spec"]["type"] != "LoadBalancer" {
        return if current.is_empty() {
            Action::Nothing
        } else {
            Action::Set(vec![])
        };
    }
    if !served {
        return Action::Nothing;
    }
    if s.config.is_empty() {
        return if current.is_empty() {
            Action::Nothing
        } else {
            Action::Set(vec![])
        };
    }
    let pool_of = |a: (bool, u128)| {
        s.config
            .iter()
            .find(|(_, p)| {
                p.ranges
                    .iter()
                    .any(|r| r.0 == a.0 && r.1 <= a.1 && a.1 <= r.2)
            })
            .map(|(n, _)| n.as_str())
    };
    // Addresses the allocator gave other Services (the first holder keeps an address).
    let taken: BTreeSet<(bool, u128)> = s
        .assigned
        .iter()
        .filter(|(_, holder)| holder.as_str() != k)
        .map(|(a, _)| *a)
        .collect();
    let wanted_pool = annotation(svc, &POOL_ANNOTATIONS);
    let wanted_ips: Vec<(bool, u128)> = match annotation(svc, &IP_ANNOTATIONS).or_else(|| {
        svc["spec"]["loadBalancerIP"]
            .as_str()
            .filter(|v| !v.is_empty())
    }) {
        Some(text) => {
            let parsed: Option<Vec<_>> = text.split(',').map(parse_ip).collect();
            match parsed {
                Some(p) => p,
                None => {
                    return Action::Fail(format!("invalid requested loadBalancer IPs {text:?}"));
                }
            }
        }
        None => Vec::new(),
    };
    if !current.is_empty() {
        let parsed: Option<Vec<(bool, u128)>> = current.iter().map(|t| parse_ip(t)).collect();
        let keep = parsed.is_some_and(|ips| {
            ips.iter().all(|a| {
                pool_of(*a).is_some_and(|p| wanted_pool.is_none_or(|w| w == p))
                    && !taken.contains(a)
            }) && (wanted_ips.is_empty() || {
                let mut a = ips.clone();
                let mut b = wanted_ips.clone();
                a.sort();
                b.sort();
                a == b
            })
        });
        if keep {
            return Action::Nothing;
        }
    }
    // Cleared (if it held anything) and given a new address, if there is one.
    let fresh: Option<Vec<String>> = if !wanted_ips.is_empty() {
        let ok = wanted_ips.iter().all(|a| {
            pool_of(*a).is_some_and(|p| wanted_pool.is_none_or(|w| w == p)) && !taken.contains(a)
        });
        ok.then(|| wanted_ips.iter().map(|(v6, a)| show(*v6, *a)).collect())
    } else {
        let v6 = svc["spec"]["ipFamilies"][0] == "IPv6";
        let candidates: Vec<&Pool> = match wanted_pool {
            Some(w) => s.config.get(w).into_iter().collect(),
            None => s.config.values().filter(|p| p.auto_assign).collect(),
        };
        candidates
            .iter()
            .flat_map(|p| p.ranges.iter().filter(|r| r.0 == v6))
            .find_map(|r| first_free(r, &taken))
            .map(|a| vec![show(v6, a)])
    };
    match fresh {
        Some(ips) if ips == current => Action::Nothing,
        Some(ips) => Action::Set(ips),
        None if current.is_empty() => Action::Fail("no available IPs".into()),
        // Cleared now; the next look (its own status change) reports the failure.
        None => Action::Set(vec![]),
    }
}

fn first_free(r: &(bool, u128, u128), taken: &BTreeSet<(bool, u128)>) -> Option<u128> {
    let mut a = r.1;
    loop {
        if !taken.contains(&(r.0, a)) {
            return Some(a);
        }
        if a == r.2 {
            return None;
        }
        a += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_as_metallb_reads_them() {
        assert_eq!(
            parse_entry("10.0.0.0/30"),
            Ok((false, 0x0a00_0000, 0x0a00_0003))
        );
        assert_eq!(
            parse_entry("10.0.0.5-10.0.0.9"),
            Ok((false, 0x0a00_0005, 0x0a00_0009))
        );
        assert!(parse_entry("10.0.0.5").is_err());
        assert!(parse_entry("10.0.0.9-10.0.0.5").is_err());
        assert_eq!(
            parse_entry("fd00::/127"),
            Ok((true, 0xfd00 << 112, (0xfd00 << 112) | 1))
        );
    }
}
