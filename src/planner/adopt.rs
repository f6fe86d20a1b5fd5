//! Taking over user clusters that already run MetalLB (`spec.adopt`, `docs/adopt.md`). Pure:
//! what discovery read, the holders kipam knows and the pools in; the adoption plan out.
//!
//! - [`Discovered`]: a user cluster's hand-made MetalLB pools and served addresses, kept as
//!   written (strings), so that the plan names what it cannot read instead of dropping it.
//! - [`plan`]: every served address gets a [`Verdict`]; a cluster is ready, waits, or needs a
//!   look; each kipam pool's rendering takes over at most one hand-made pool in place.
//! - [`apply`]: the plan turned into planner input — [`PoolOverride::Adopt`] for a cluster that
//!   adopts, `hold` for the others — and `set_aside`: what read user clusters serve or may
//!   still hand out, kept from every other holder.
//!
//! Invariants: an address two read user clusters serve (or one serves and the other's pool
//! covers) is adopted by neither; nobody adopts in a datacenter before every user cluster there
//! that adopts has been read; nothing a read user cluster serves is given to another holder.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::input::{ClusterInput, HeldElsewhere, PoolInput, PoolOverride, StoredAllocation};
use super::spaces::{merged, minus};
use crate::address::AddrRange;
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
    /// `metadata.namespace`: MetalLB reads pools from its own namespace.
    pub namespace: String,
    /// `metadata.name`.
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

/// The annotations a Service names its MetalLB pool with, the current one first.
pub const POOL_ANNOTATIONS: [&str; 2] = [
    "metallb.io/address-pool",
    "metallb.universe.tf/address-pool",
];

/// `metadata.<key>` of an object as JSON, or "".
fn meta_str<'a>(obj: &'a serde_json::Value, key: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(key))
        .and_then(|v| v.as_str())
        .unwrap_or_default()
}

/// A MetalLB `IPAddressPool` (as JSON), unless kipam rendered it (it carries kipam's addon
/// label). `spec.addresses` is kept as written; an entry that is not a string (a schema-less
/// server let it in) is shown as its JSON text.
pub fn hand_made_pool(pool: &serde_json::Value) -> Option<HandMadePool> {
    let ours = pool
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(|l| l.get(crate::render::ADDON_LABEL))
        .is_some();
    if ours {
        return None;
    }
    let addresses = pool
        .get("spec")
        .and_then(|s| s.get("addresses"))
        .and_then(|a| a.as_array())
        .map(|a| {
            a.iter()
                .map(|v| match v.as_str() {
                    Some(text) => text.to_string(),
                    None => v.to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(HandMadePool {
        namespace: meta_str(pool, "namespace").to_string(),
        name: meta_str(pool, "name").to_string(),
        addresses,
    })
}

/// `namespace/name` of an object (as JSON).
pub fn service_name(svc: &serde_json::Value) -> String {
    format!("{}/{}", meta_str(svc, "namespace"), meta_str(svc, "name"))
}

/// A Service (as JSON), when it is of type `LoadBalancer` and holds at least one address
/// (`status.loadBalancer.ingress[].ip`; entries with a hostname only are not addresses).
pub fn served_service(svc: &serde_json::Value) -> Option<ServedService> {
    if svc.get("spec")?.get("type")?.as_str()? != "LoadBalancer" {
        return None;
    }
    let addresses: Vec<String> = svc
        .get("status")
        .and_then(|s| s.get("loadBalancer"))
        .and_then(|lb| lb.get("ingress"))
        .and_then(|i| i.as_array())
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("ip").and_then(|ip| ip.as_str()))
        .filter(|ip| !ip.is_empty())
        .map(str::to_string)
        .collect();
    if addresses.is_empty() {
        return None;
    }
    let annotations = svc.get("metadata").and_then(|m| m.get("annotations"));
    let pool = POOL_ANNOTATIONS.iter().find_map(|k| {
        annotations
            .and_then(|a| a.get(*k))
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    });
    Some(ServedService {
        name: service_name(svc),
        addresses,
        pool,
    })
}

/// What a set of exported objects says a user cluster serves (`kubectl get
/// ipaddresspools.metallb.io,services -A -o yaml`, as JSON): `List`s are opened, MetalLB
/// `IPAddressPool`s (any `metallb.io` version) and core `Service`s are read as discovery reads
/// them, everything else is left out. The same object twice (`namespace/name`) counts once.
pub fn from_objects(objects: &[serde_json::Value]) -> Discovered {
    let mut pools: BTreeMap<(String, String), HandMadePool> = BTreeMap::new();
    let mut services: BTreeMap<String, ServedService> = BTreeMap::new();
    let mut stack: Vec<&serde_json::Value> = objects.iter().rev().collect();
    while let Some(obj) = stack.pop() {
        let kind = obj.get("kind").and_then(|k| k.as_str()).unwrap_or_default();
        let api_version = obj
            .get("apiVersion")
            .and_then(|k| k.as_str())
            .unwrap_or_default();
        if kind.ends_with("List") {
            if let Some(items) = obj.get("items").and_then(|i| i.as_array()) {
                stack.extend(items.iter().rev());
            }
            continue;
        }
        match (kind, api_version.split('/').next().unwrap_or_default()) {
            ("IPAddressPool", "metallb.io") => {
                if let Some(p) = hand_made_pool(obj) {
                    pools.insert((p.namespace.clone(), p.name.clone()), p);
                }
            }
            ("Service", "v1") if !api_version.contains('/') => {
                if let Some(s) = served_service(obj) {
                    services.insert(s.name.clone(), s);
                }
            }
            _ => {}
        }
    }
    let mut pools: Vec<HandMadePool> = pools.into_values().collect();
    pools.sort_by(|a, b| (&a.name, &a.namespace).cmp(&(&b.name, &b.namespace)));
    Discovered {
        pools,
        services: services.into_values().collect(),
    }
}

/// The adoption mode that applies to a cluster: its own `spec.adopt`, else the `adopt` of its
/// datacenter in the pools that list it. Pools that disagree give the most careful of their
/// values (`DryRun` before `Adopt` before `Disabled`). `None` and `Disabled` both mean: start from
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
        AdoptMode::Disabled => 2,
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

// The adoption plan.

/// How far discovery got with one user cluster.
#[derive(Clone, Copy, Debug)]
pub enum Reading<'a> {
    /// Not read completely yet.
    NotYet,
    /// Cannot be read at the moment (why).
    Unreadable(&'a str),
    /// Read.
    Read(&'a Discovered),
}

/// A cluster whose user cluster discovery reads (`DryRun` or `Adopt` applies).
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub datacenter: &'a str,
    pub mode: AdoptMode,
    pub reading: Reading<'a>,
}

/// Where an address a user cluster serves stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum Verdict {
    /// Becomes (or would become, in a dry run) the cluster's allocation from `pool`.
    Adopt { pool: String },
    /// Already the cluster's own, in its allocation from `pool`.
    Held { pool: String },
    /// Outside every pool of the cluster's datacenter: it stays as it is, kipam does not
    /// manage it.
    Outside,
    /// Other user clusters serve it too (a latent outage): nobody adopts it.
    Contested { pool: String, clusters: Vec<String> },
    /// kipam already gave it to another holder (a cluster's allocation or a machine's claim).
    Taken { pool: String, holder: String },
    /// Inside an exclusion of `pool`: kipam never hands it out.
    Excluded { pool: String },
}

/// One address a user cluster serves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServedAddress {
    pub address: String,
    /// The Services holding it (`namespace/name`).
    pub services: Vec<String>,
    /// The pool datacenter covering it and what happens to it.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// A hand-made MetalLB pool and how kipam takes it over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HandMadeView {
    pub namespace: String,
    pub name: String,
    pub addresses: Vec<String>,
    /// The kipam pools of the cluster's datacenter it overlaps.
    pub pools: Vec<String>,
    /// Its pieces outside every kipam pool of the datacenter: kept in it as they are when
    /// kipam takes it over.
    pub outside: Vec<String>,
    /// The kipam pool whose allocation takes this MetalLB pool over in place (same name, so
    /// no Service ever loses its address and no two MetalLB pools overlap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taken_over_by: Option<String>,
}

/// A contested address set, named from one cluster's side.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    /// The other user cluster (or holder, `claim/<ns>/<name>` for a machine's claim).
    pub with: String,
    pub addresses: Vec<String>,
    pub kind: ConflictKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum ConflictKind {
    /// Both user clusters serve the addresses.
    BothServe,
    /// kipam gave them to the other holder.
    Held,
    /// A hand-made MetalLB pool of the other user cluster covers addresses this one serves:
    /// that cluster's MetalLB may hand them out again.
    TheirPoolCovers,
    /// The other user cluster serves addresses a hand-made MetalLB pool of this one covers.
    CoversTheirs,
}

/// What the MetalLB pool rendering of one allocation takes over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Takeover {
    /// The hand-made `IPAddressPool` rendered in place, `namespace/name`.
    pub metallb_pool: String,
    /// Its pieces outside every kipam pool, written back unchanged.
    pub kept: Vec<String>,
}

/// Where a cluster's adoption stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "reason")]
pub enum AdoptState {
    /// Discovery has not read the user cluster (why).
    Waiting(String),
    /// Read; with `Adopt`, kipam takes it over; with `DryRun`, it would.
    Ready,
    /// Read, but kipam will not take it over until a person acts (why, each).
    NeedsLook(Vec<String>),
}

/// One cluster's adoption.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAdoption {
    pub cluster: String,
    pub datacenter: String,
    pub mode: AdoptMode,
    #[serde(flatten)]
    pub state: AdoptState,
    pub served: Vec<ServedAddress>,
    pub hand_made: Vec<HandMadeView>,
    /// kipam pool -> the pieces that become (would become) its allocation.
    #[serde(serialize_with = "ranges_by_pool")]
    pub adopt: BTreeMap<String, Vec<AddrRange>>,
    /// kipam pool -> the hand-made MetalLB pool its rendering takes over.
    pub takeover: BTreeMap<String, Takeover>,
    pub conflicts: Vec<Conflict>,
    /// Cluster overrides a person could set instead (`spec.ipam.<pool>.addresses`): the same
    /// addresses as pins.
    #[serde(serialize_with = "ranges_by_pool")]
    pub overrides: BTreeMap<String, Vec<AddrRange>>,
}

fn ranges_by_pool<S: serde::Serializer>(
    m: &BTreeMap<String, Vec<AddrRange>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut out = s.serialize_map(Some(m.len()))?;
    for (k, v) in m {
        let pieces: Vec<String> = v.iter().map(short).collect();
        out.serialize_entry(k, &pieces)?;
    }
    out.end()
}

/// The whole fleet's adoption: every candidate, and what nobody else may be given meanwhile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionPlan {
    pub clusters: Vec<ClusterAdoption>,
    /// What read user clusters serve or may still hand out through a hand-made MetalLB pool,
    /// inside kipam's pools, and is not theirs in kipam yet: set aside in every pool of the
    /// datacenter, so kipam never gives it to another holder.
    #[serde(skip)]
    pub set_aside: Vec<HeldElsewhere>,
}

impl AdoptionPlan {
    pub fn get(&self, cluster: &str) -> Option<&ClusterAdoption> {
        self.clusters
            .binary_search_by(|c| c.cluster.as_str().cmp(cluster))
            .ok()
            .map(|i| &self.clusters[i])
    }
}

/// A piece as people write it: one address alone, else `first-last`.
pub fn short(r: &AddrRange) -> String {
    if r.first() == r.last() {
        r.family().display(r.first()).to_string()
    } else {
        r.to_string()
    }
}

/// The pieces of one pool datacenter, for classification.
struct PoolDc<'a> {
    name: &'a str,
    cidrs: Vec<AddrRange>,
    exclusions: &'a [AddrRange],
    /// A `prefix` pool: it hands out subnets, not single addresses.
    prefix: bool,
}

/// A served address, parsed: (range of one, services).
type Served = BTreeMap<AddrRange, BTreeSet<String>>;

/// Per datacenter, the read user clusters serving each address.
type Servers<'a> = BTreeMap<&'a str, BTreeMap<AddrRange, Vec<&'a str>>>;

/// Per datacenter, the hand-made MetalLB pools of read user clusters: (cluster, pool, pieces).
type CoveredBy<'a> = BTreeMap<&'a str, Vec<(&'a str, &'a str, Vec<AddrRange>)>>;

/// Plans the adoption of every candidate. Pure: `stored` is every holder kipam knows (user
/// clusters' allocations and machines' claims, as the planner is given them).
pub fn plan(
    pools: &[PoolInput],
    stored: &[StoredAllocation],
    candidates: &[Candidate<'_>],
) -> AdoptionPlan {
    // Who serves what, per datacenter, for the contested check.
    let mut served_by: BTreeMap<&str, Vec<(&str, Served)>> = BTreeMap::new();
    let mut covered_by: CoveredBy<'_> = BTreeMap::new();
    let mut unreadable: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for c in candidates {
        if let Reading::Read(d) = c.reading {
            let (served, bad) = parse_served(d);
            unreadable.insert(c.name, bad);
            served_by
                .entry(c.datacenter)
                .or_default()
                .push((c.name, served));
            for h in &d.pools {
                let pieces = h
                    .addresses
                    .iter()
                    .filter_map(|t| AddrRange::parse_lenient(t.trim()).ok())
                    .collect();
                covered_by
                    .entry(c.datacenter)
                    .or_default()
                    .push((c.name, &h.name, pieces));
            }
        }
    }
    // Per datacenter, who serves each address: looked up per address below, so that the
    // checks cost one search each instead of a pass over every cluster of the datacenter.
    let mut servers: Servers<'_> = BTreeMap::new();
    for (dc, list) in &served_by {
        let index = servers.entry(dc).or_default();
        for (name, served) in list {
            for a in served.keys() {
                index.entry(*a).or_default().push(name);
            }
        }
    }
    let mut out = AdoptionPlan::default();
    let mut sorted: Vec<&Candidate<'_>> = candidates.iter().collect();
    sorted.sort_by_key(|c| c.name);
    for c in sorted {
        let pool_dcs: Vec<PoolDc<'_>> = pools
            .iter()
            .filter_map(|p| {
                let dc = p.datacenters.get(c.datacenter)?;
                Some(PoolDc {
                    name: &p.name,
                    cidrs: dc.config.cidrs().map(|c| c.range()).collect(),
                    exclusions: &dc.exclusions,
                    prefix: matches!(dc.config.kind, crate::allocator::PoolKind::Prefix { .. }),
                })
            })
            .collect();
        let mut adoption = ClusterAdoption {
            cluster: c.name.to_string(),
            datacenter: c.datacenter.to_string(),
            mode: c.mode,
            state: AdoptState::Ready,
            served: Vec::new(),
            hand_made: Vec::new(),
            adopt: BTreeMap::new(),
            takeover: BTreeMap::new(),
            conflicts: Vec::new(),
            overrides: BTreeMap::new(),
        };
        let d = match c.reading {
            Reading::NotYet => {
                adoption.state =
                    AdoptState::Waiting("the user cluster has not been read yet".into());
                out.clusters.push(adoption);
                continue;
            }
            Reading::Unreadable(why) => {
                adoption.state =
                    AdoptState::Waiting(format!("the user cluster cannot be read: {why}"));
                out.clusters.push(adoption);
                continue;
            }
            Reading::Read(d) => d,
        };
        let mut needs: Vec<String> = unreadable.remove(c.name).unwrap_or_default();
        let own_served = served_by
            .get(c.datacenter)
            .and_then(|v| v.iter().find(|(n, _)| *n == c.name))
            .map(|(_, s)| s.clone())
            .unwrap_or_default();
        let mut contested: BTreeMap<String, Vec<AddrRange>> = BTreeMap::new();
        let mut taken: BTreeMap<String, Vec<AddrRange>> = BTreeMap::new();
        let mut held_contested: BTreeMap<String, Vec<AddrRange>> = BTreeMap::new();
        for (addr, services) in &own_served {
            let verdict = match pool_dcs
                .iter()
                .find(|p| p.cidrs.iter().any(|r| r.overlaps(addr)))
            {
                None => Verdict::Outside,
                Some(p) => classify(c, p, addr, stored, &servers, &covered_by),
            };
            match &verdict {
                Verdict::Adopt { pool } => {
                    adoption.adopt.entry(pool.clone()).or_default().push(*addr)
                }
                Verdict::Contested { clusters, .. } => {
                    for other in clusters {
                        contested.entry(other.clone()).or_default().push(*addr);
                    }
                }
                Verdict::Taken { holder, .. } => {
                    taken.entry(holder.clone()).or_default().push(*addr)
                }
                // Already its own: another user cluster serving it too is told, not blocked on.
                Verdict::Held { .. } => {
                    let serving = servers.get(c.datacenter).and_then(|i| i.get(addr));
                    for other in serving.into_iter().flatten() {
                        if *other != c.name {
                            held_contested
                                .entry(other.to_string())
                                .or_default()
                                .push(*addr);
                        }
                    }
                }
                _ => {}
            }
            adoption.served.push(ServedAddress {
                address: short(addr),
                services: services.iter().cloned().collect(),
                verdict,
            });
        }
        for (with, addrs) in contested {
            let serves = served_by
                .get(c.datacenter)
                .into_iter()
                .flatten()
                .any(|(n, s)| *n == with && addrs.iter().any(|a| s.contains_key(a)));
            let (kind, why) = if serves {
                (ConflictKind::BothServe, "serves them too")
            } else {
                (
                    ConflictKind::TheirPoolCovers,
                    "has a hand-made MetalLB pool covering them, so it may hand them out",
                )
            };
            needs.push(format!(
                "user cluster {with} {why}: {}",
                join(&merged(addrs.clone()))
            ));
            adoption.conflicts.push(Conflict {
                with,
                addresses: merged(addrs).iter().map(short).collect(),
                kind,
            });
        }
        // Told, not blocked: another user cluster serves what a pool of this one covers.
        let mut covers: BTreeMap<String, Vec<AddrRange>> = BTreeMap::new();
        // This cluster's own pools, picked once: scanning every pool of the datacenter for
        // each other cluster made this loop cubic in the clusters of a datacenter.
        let own_pools: Vec<&Vec<AddrRange>> = covered_by
            .get(c.datacenter)
            .into_iter()
            .flatten()
            .filter(|(n, _, _)| *n == c.name)
            .map(|(_, _, pieces)| pieces)
            .collect();
        if !own_pools.is_empty() {
            for (other, served) in served_by.get(c.datacenter).into_iter().flatten() {
                if *other == c.name {
                    continue;
                }
                for pieces in &own_pools {
                    for a in served.keys() {
                        if pieces.iter().any(|p| p.overlaps(a)) {
                            covers.entry(other.to_string()).or_default().push(*a);
                        }
                    }
                }
            }
        }
        for (with, addrs) in covers {
            let addrs = merged(addrs);
            if adoption
                .conflicts
                .iter()
                .any(|x| x.with == with && x.kind == ConflictKind::BothServe)
            {
                continue;
            }
            adoption.conflicts.push(Conflict {
                with,
                addresses: addrs.iter().map(short).collect(),
                kind: ConflictKind::CoversTheirs,
            });
        }
        for (with, addrs) in held_contested {
            adoption.conflicts.push(Conflict {
                with,
                addresses: merged(addrs).iter().map(short).collect(),
                kind: ConflictKind::BothServe,
            });
        }
        for (with, addrs) in taken {
            needs.push(format!(
                "kipam already gave {} to {with}",
                join(&merged(addrs.clone()))
            ));
            adoption.conflicts.push(Conflict {
                with,
                addresses: merged(addrs).iter().map(short).collect(),
                kind: ConflictKind::Held,
            });
        }
        for a in &adoption.served {
            match &a.verdict {
                Verdict::Excluded { pool } => {
                    needs.push(format!("{} lies in an exclusion of pool {pool}", a.address))
                }
                Verdict::Adopt { pool } if pool_dcs.iter().any(|p| p.name == pool && p.prefix) => {
                    needs.push(format!(
                        "{} lies in prefix pool {pool}, which hands out whole subnets: pin the cluster's subnet by hand (spec.ipam.{pool}.cidr)",
                        a.address
                    ))
                }
                _ => {}
            }
        }
        adoption
            .adopt
            .retain(|pool, _| !pool_dcs.iter().any(|p| p.name == pool && p.prefix));
        // The hand-made pools: which kipam pool takes which over.
        let mut by_pool: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut aside: BTreeMap<String, Vec<AddrRange>> = BTreeMap::new();
        for h in &d.pools {
            let mut pieces = Vec::new();
            for text in &h.addresses {
                match AddrRange::parse_lenient(text.trim()) {
                    Ok(r) => pieces.push(r),
                    Err(e) => needs.push(format!(
                        "MetalLB pool {} holds an address kipam cannot read ({text}): {e}",
                        h.name
                    )),
                }
            }
            let inside: Vec<&PoolDc<'_>> = pool_dcs
                .iter()
                .filter(|p| p.cidrs.iter().any(|r| pieces.iter().any(|x| x.overlaps(r))))
                .collect();
            let all_cidrs: Vec<AddrRange> = pool_dcs.iter().flat_map(|p| p.cidrs.clone()).collect();
            let outside = minus(&pieces, &all_cidrs);
            for p in &inside {
                by_pool
                    .entry(p.name.to_string())
                    .or_default()
                    .push(h.name.clone());
                let within: Vec<AddrRange> = pieces
                    .iter()
                    .flat_map(|x| p.cidrs.iter().filter_map(move |r| intersect(x, r)))
                    .collect();
                aside.entry(p.name.to_string()).or_default().extend(within);
            }
            if inside.len() > 1 {
                needs.push(format!(
                    "MetalLB pool {} spans kipam pools {}: split it by hand so each lies in one",
                    h.name,
                    inside
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                        .join(" and ")
                ));
            }
            adoption.hand_made.push(HandMadeView {
                namespace: h.namespace.clone(),
                name: h.name.clone(),
                addresses: h.addresses.clone(),
                pools: inside.iter().map(|p| p.name.to_string()).collect(),
                outside: outside.iter().map(short).collect(),
                taken_over_by: None,
            });
        }
        for (pool, names) in &by_pool {
            if names.len() > 1 {
                needs.push(format!(
                    "MetalLB pools {} all lie in kipam pool {pool}: merge them by hand into one",
                    names.join(" and ")
                ));
                continue;
            }
            let Some(h) = adoption.hand_made.iter_mut().find(|h| h.name == names[0]) else {
                continue;
            };
            if h.pools.len() == 1 {
                h.taken_over_by = Some(pool.clone());
                adoption.takeover.insert(
                    pool.clone(),
                    Takeover {
                        metallb_pool: format!("{}/{}", h.namespace, h.name),
                        kept: h.outside.clone(),
                    },
                );
            }
        }
        for (pool, pieces) in adoption.adopt.iter_mut() {
            *pieces = merged(std::mem::take(pieces));
            adoption.overrides.insert(pool.clone(), pieces.clone());
        }
        needs.sort();
        needs.dedup();
        if !needs.is_empty() {
            adoption.state = AdoptState::NeedsLook(needs);
        }
        // Set aside for everybody else: what this cluster serves inside a pool and does not
        // hold in kipam, and what its hand-made pools may still hand out.
        for a in &own_served {
            if let Some(p) = pool_dcs
                .iter()
                .find(|p| p.cidrs.iter().any(|r| r.overlaps(a.0)))
            {
                let own = stored.iter().any(|s| {
                    s.cluster == c.name
                        && s.pool == p.name
                        && s.datacenter == c.datacenter
                        && s.held
                            .as_ref()
                            .is_some_and(|h| h.ranges().any(|r| r.overlaps(a.0)))
                });
                if !own {
                    aside.entry(p.name.to_string()).or_default().push(*a.0);
                }
            }
        }
        for (pool, pieces) in aside {
            // What it adopts it places itself (only when it does adopt); the rest is set
            // aside.
            let places = adoption.mode == AdoptMode::Adopt && adoption.state == AdoptState::Ready;
            let mine = match adoption.adopt.get(&pool) {
                Some(m) if places => m.clone(),
                _ => Vec::new(),
            };
            let rest = minus(&pieces, &mine);
            if !rest.is_empty() {
                // Held through no pool of kipam's: set aside in every pool of the datacenter,
                // its own included.
                out.set_aside.push(HeldElsewhere {
                    pool: String::new(),
                    datacenter: c.datacenter.to_string(),
                    holder: format!("served/{}", c.name),
                    addresses: rest,
                });
            }
        }
        out.clusters.push(adoption);
    }
    // Nobody adopts in a datacenter before every user cluster there that discovery reads has
    // been read: an address two of them serve must be seen from both sides first, or the
    // first one read would take it.
    let mut unread: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in candidates {
        if !matches!(c.reading, Reading::Read(_)) {
            unread.entry(c.datacenter).or_default().push(c.name);
        }
    }
    for a in out.clusters.iter_mut() {
        let Some(others) = unread.get(a.datacenter.as_str()) else {
            continue;
        };
        if a.state == AdoptState::Ready && a.mode == AdoptMode::Adopt && !a.adopt.is_empty() {
            let mut names: Vec<&str> = others.clone();
            names.sort();
            a.state = AdoptState::Waiting(format!(
                "user cluster(s) {} of datacenter {} not read yet: nothing is adopted there until every user cluster that adopts has been read",
                names.join(", "),
                a.datacenter
            ));
            // What it would adopt stays set aside for everybody meanwhile.
            for pieces in a.adopt.values() {
                out.set_aside.push(HeldElsewhere {
                    pool: String::new(),
                    datacenter: a.datacenter.clone(),
                    holder: format!("served/{}", a.cluster),
                    addresses: pieces.clone(),
                });
            }
        }
    }
    out.set_aside.sort();
    out
}

/// Applies the adoption plan to the planner's clusters: a cluster that adopts gets
/// [`PoolOverride::Adopt`] in every pool it has no override of its own for; one that runs dry,
/// waits for its user cluster or needs a person is held as it is (`hold`), keeping what it
/// has and getting nothing new.
pub fn apply(plan: &AdoptionPlan, clusters: &mut [ClusterInput], pools: &[PoolInput]) {
    for c in clusters.iter_mut() {
        if c.is_claim() {
            continue;
        }
        let Some(a) = plan.get(&c.name) else {
            continue;
        };
        let hold = match (&a.state, a.mode) {
            (AdoptState::Waiting(why), _) => Some(format!("adoption waits: {why}")),
            (AdoptState::NeedsLook(why), _) => Some(format!(
                "adoption needs a look before kipam takes this cluster over: {}",
                why.join("; ")
            )),
            (AdoptState::Ready, AdoptMode::DryRun) => Some(
                "adopt is DryRun: kipam reads the user cluster and reports, and writes nothing for it until adopt is Adopt".to_string(),
            ),
            (AdoptState::Ready, AdoptMode::Adopt) => None,
            (AdoptState::Ready, AdoptMode::Disabled) => continue,
        };
        if let Some(why) = hold {
            if c.hold.is_none() {
                c.hold = Some(why);
            }
            continue;
        }
        for p in pools.iter() {
            let range = p.datacenters.get(&c.datacenter).is_some_and(|dc| {
                matches!(dc.config.kind, crate::allocator::PoolKind::Range { .. })
            });
            if !range || c.overrides.contains_key(&p.name) {
                continue;
            }
            let pieces = a.adopt.get(&p.name).cloned().unwrap_or_default();
            c.overrides
                .insert(p.name.clone(), PoolOverride::Adopt(pieces));
        }
    }
}

fn join(r: &[AddrRange]) -> String {
    r.iter().map(short).collect::<Vec<_>>().join(", ")
}

fn intersect(a: &AddrRange, b: &AddrRange) -> Option<AddrRange> {
    if !a.overlaps(b) {
        return None;
    }
    AddrRange::new(a.family(), a.first().max(b.first()), a.last().min(b.last()))
}

/// The served addresses of a reading, one range per address, and what cannot be read.
fn parse_served(d: &Discovered) -> (Served, Vec<String>) {
    let mut served = Served::new();
    let mut bad = Vec::new();
    for s in &d.services {
        for text in &s.addresses {
            match text.trim().parse::<AddrRange>() {
                Ok(r) if r.first() == r.last() => {
                    served.entry(r).or_default().insert(s.name.clone());
                }
                _ => bad.push(format!(
                    "Service {} shows an address kipam cannot read ({text})",
                    s.name
                )),
            }
        }
    }
    (served, bad)
}

fn classify(
    c: &Candidate<'_>,
    p: &PoolDc<'_>,
    addr: &AddrRange,
    stored: &[StoredAllocation],
    servers: &Servers<'_>,
    covered_by: &CoveredBy<'_>,
) -> Verdict {
    let pool = p.name.to_string();
    let held_by = |s: &&StoredAllocation| {
        s.datacenter == c.datacenter
            && s.held
                .as_ref()
                .is_some_and(|h| h.ranges().any(|r| r.overlaps(addr)))
    };
    // Any holder of the datacenter counts, whatever its pool: pools of one address space
    // share addresses, and an address two pools cover is one address.
    if let Some(s) = stored.iter().filter(held_by).find(|s| s.cluster == c.name) {
        return Verdict::Held {
            pool: s.pool.clone(),
        };
    }
    if let Some(s) = stored.iter().find(held_by) {
        return Verdict::Taken {
            pool,
            holder: s.cluster.clone(),
        };
    }
    let mut others: Vec<String> = servers
        .get(c.datacenter)
        .and_then(|i| i.get(addr))
        .into_iter()
        .flatten()
        .filter(|n| **n != c.name)
        .map(|n| n.to_string())
        .collect();
    others.extend(
        covered_by
            .get(c.datacenter)
            .into_iter()
            .flatten()
            .filter(|(n, _, pieces)| *n != c.name && pieces.iter().any(|p| p.overlaps(addr)))
            .map(|(n, _, _)| n.to_string()),
    );
    others.sort();
    others.dedup();
    if !others.is_empty() {
        return Verdict::Contested {
            pool,
            clusters: others,
        };
    }
    if p.exclusions.iter().any(|e| e.overlaps(addr)) {
        return Verdict::Excluded { pool };
    }
    Verdict::Adopt { pool }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{Allocation, PoolConfig, PoolKind, Strategy};
    use crate::planner::input::DatacenterInput;
    use crate::resources::ReclaimPolicy;

    fn pool(name: &str, cidr: &str, exclusions: &[&str]) -> PoolInput {
        let config = PoolConfig::new(
            cidr.parse().expect("cidr"),
            PoolKind::Range {
                allocation_range: 4,
            },
            Strategy::FirstFit,
        );
        PoolInput {
            name: name.into(),
            reclaim_policy: ReclaimPolicy::Delete,
            datacenters: [(
                "dc".to_string(),
                DatacenterInput {
                    config,
                    exclusions: exclusions
                        .iter()
                        .map(|e| e.parse().expect("range"))
                        .collect(),
                    reuse_after: 0,
                    machine_reserved: Vec::new(),
                    former: Vec::new(),
                },
            )]
            .into(),
            address_space: String::new(),
        }
    }

    fn found(pools: &[(&str, &[&str])], services: &[(&str, &[&str])]) -> Discovered {
        Discovered {
            pools: pools
                .iter()
                .map(|(n, a)| HandMadePool {
                    namespace: "metallb-system".into(),
                    name: n.to_string(),
                    addresses: a.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
            services: services
                .iter()
                .map(|(n, a)| ServedService {
                    name: n.to_string(),
                    addresses: a.iter().map(|s| s.to_string()).collect(),
                    pool: None,
                })
                .collect(),
        }
    }

    fn candidate<'a>(name: &'a str, d: &'a Discovered) -> Candidate<'a> {
        Candidate {
            name,
            datacenter: "dc",
            mode: AdoptMode::Adopt,
            reading: Reading::Read(d),
        }
    }

    fn pieces(p: &[AddrRange]) -> Vec<String> {
        p.iter().map(short).collect()
    }

    #[test]
    fn a_cluster_adopts_exactly_what_it_serves_inside_the_pool_and_takes_its_pool_over() {
        let pools = [pool("metallb", "10.0.0.0/24", &[])];
        let a = found(
            &[("legacy", &["10.0.0.10-10.0.0.20", "192.168.9.0/30"])],
            &[
                ("web/front", &["10.0.0.11"]),
                ("web/api", &["10.0.0.12"]),
                ("ops/out", &["192.168.9.1"]),
            ],
        );
        let plan = plan(&pools, &[], &[candidate("a", &a)]);
        let c = plan.get("a").expect("planned");
        assert_eq!(c.state, AdoptState::Ready);
        assert_eq!(pieces(&c.adopt["metallb"]), ["10.0.0.11-10.0.0.12"]);
        assert_eq!(
            c.takeover["metallb"],
            Takeover {
                metallb_pool: "metallb-system/legacy".into(),
                kept: vec!["192.168.9.0-192.168.9.3".into()],
            }
        );
        let out = c
            .served
            .iter()
            .find(|s| s.address == "192.168.9.1")
            .expect("served");
        assert_eq!(out.verdict, Verdict::Outside);
        assert_eq!(out.services, ["ops/out"]);
        // What its hand-made pool may still hand out is set aside for everybody else; what it
        // adopts it places itself.
        assert_eq!(plan.set_aside.len(), 1);
        assert_eq!(
            pieces(&plan.set_aside[0].addresses),
            ["10.0.0.10", "10.0.0.13-10.0.0.20"]
        );
    }

    #[test]
    fn two_clusters_serving_one_address_adopt_neither_and_each_names_the_other() {
        let pools = [pool("metallb", "10.0.0.0/24", &[])];
        let a = found(
            &[("a-pool", &["10.0.0.1-10.0.0.5"])],
            &[("x/s", &["10.0.0.3"])],
        );
        let b = found(
            &[("b-pool", &["10.0.0.3-10.0.0.9"])],
            &[("y/s", &["10.0.0.3", "10.0.0.8"])],
        );
        let plan = plan(&pools, &[], &[candidate("a", &a), candidate("b", &b)]);
        for (me, other) in [("a", "b"), ("b", "a")] {
            let c = plan.get(me).expect("planned");
            let AdoptState::NeedsLook(why) = &c.state else {
                panic!("{me} should need a look: {:?}", c.state);
            };
            assert!(
                why.iter()
                    .any(|w| w.contains(other) && w.contains("10.0.0.3")),
                "{me}: {why:?}"
            );
            assert!(c.conflicts.iter().any(|x| x.with == other
                && x.kind == ConflictKind::BothServe
                && x.addresses == ["10.0.0.3"]));
            assert!(
                !c.adopt
                    .values()
                    .flatten()
                    .any(|r| r.first() == r.last() && short(r) == "10.0.0.3")
            );
        }
        // The contested address is set aside for everybody, so no third cluster gets it.
        assert!(
            plan.set_aside
                .iter()
                .any(|h| h.addresses.iter().any(|r| short(r).contains("10.0.0.3")))
        );
    }

    #[test]
    fn an_address_kipam_gave_another_holder_or_in_an_exclusion_is_not_adopted() {
        let pools = [pool("metallb", "10.0.0.0/24", &["10.0.0.200-10.0.0.210"])];
        let stored = [StoredAllocation {
            cluster: "old".into(),
            pool: "metallb".into(),
            datacenter: "dc".into(),
            held: Some(Allocation::Range(vec![
                "10.0.0.50-10.0.0.53".parse().unwrap(),
            ])),
            reclaim_policy: None,
            unreadable: None,
        }];
        let a = found(
            &[("p", &["10.0.0.0/24"])],
            &[
                ("x/s", &["10.0.0.51"]),
                ("x/t", &["10.0.0.201"]),
                ("x/u", &["10.0.0.7"]),
            ],
        );
        let plan = plan(&pools, &stored, &[candidate("a", &a)]);
        let c = plan.get("a").expect("planned");
        let verdict = |a: &str| {
            c.served
                .iter()
                .find(|s| s.address == a)
                .map(|s| s.verdict.clone())
        };
        assert_eq!(
            verdict("10.0.0.51"),
            Some(Verdict::Taken {
                pool: "metallb".into(),
                holder: "old".into()
            })
        );
        assert_eq!(
            verdict("10.0.0.201"),
            Some(Verdict::Excluded {
                pool: "metallb".into()
            })
        );
        assert_eq!(pieces(&c.adopt["metallb"]), ["10.0.0.7"]);
        assert!(matches!(c.state, AdoptState::NeedsLook(_)));
        assert!(
            c.conflicts
                .iter()
                .any(|x| x.with == "old" && x.kind == ConflictKind::Held)
        );
    }

    #[test]
    fn a_hand_made_pool_across_two_kipam_pools_or_two_in_one_needs_a_person() {
        let pools = [
            pool("p1", "10.0.0.0/25", &[]),
            pool("p2", "10.0.0.128/25", &[]),
        ];
        let a = found(&[("wide", &["10.0.0.100-10.0.0.150"])], &[]);
        let plan1 = plan(&pools, &[], &[candidate("a", &a)]);
        let AdoptState::NeedsLook(why) = &plan1.get("a").expect("planned").state else {
            panic!("wide pool must need a look");
        };
        assert!(why[0].contains("spans kipam pools p1 and p2"), "{why:?}");
        let b = found(
            &[("one", &["10.0.0.1-10.0.0.3"]), ("two", &["10.0.0.9"])],
            &[],
        );
        let plan2 = plan(&pools, &[], &[candidate("b", &b)]);
        let c = plan2.get("b").expect("planned");
        assert!(matches!(&c.state, AdoptState::NeedsLook(w) if w[0].contains("one and two")));
        assert!(c.takeover.is_empty());
    }

    #[test]
    fn unreadable_input_is_named_not_dropped() {
        let pools = [pool("metallb", "10.0.0.0/24", &[])];
        let a = found(&[("p", &["10.0.0.1-nope"])], &[("x/s", &["not-an-ip"])]);
        let plan = plan(&pools, &[], &[candidate("a", &a)]);
        let AdoptState::NeedsLook(why) = &plan.get("a").expect("planned").state else {
            panic!("must need a look");
        };
        assert!(
            why.iter()
                .any(|w| w.contains("10.0.0.1-nope") && w.contains("MetalLB pool p"))
        );
        assert!(
            why.iter()
                .any(|w| w.contains("not-an-ip") && w.contains("Service x/s"))
        );
        let waiting = plan_of_unread(&pools);
        assert!(matches!(waiting, AdoptState::Waiting(w) if w.contains("connection refused")));
    }

    #[test]
    fn exported_lists_read_like_discovery_reads_them() {
        let objects = vec![
            serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                 "metadata": {"name": "legacy", "namespace": "metallb-system"},
                 "spec": {"addresses": ["10.0.0.0/28", 7]}},
                {"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                 "metadata": {"name": "kipam-lb", "namespace": "metallb-system",
                              "labels": {"ipam.kipam.dev/addon": "metallb"}},
                 "spec": {"addresses": ["10.0.0.16/28"]}},
                {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": "web", "namespace": "shop",
                              "annotations": {"metallb.universe.tf/address-pool": "legacy"}},
                 "spec": {"type": "LoadBalancer"},
                 "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.3"}, {"hostname": "x"}]}}},
                {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": "pending", "namespace": "shop"},
                 "spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {}}},
                {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": "inner", "namespace": "shop"},
                 "spec": {"type": "ClusterIP"}},
            ]}),
            // A second export of the same Service counts once; other kinds are left out.
            serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "shop",
                             "annotations": {"metallb.io/address-pool": "current",
                                             "metallb.universe.tf/address-pool": "legacy"}},
                "spec": {"type": "LoadBalancer"},
                "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.3"}]}}}),
            serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "shop"}}),
        ];
        let d = from_objects(&objects);
        assert_eq!(
            d.pools,
            [HandMadePool {
                namespace: "metallb-system".into(),
                name: "legacy".into(),
                addresses: vec!["10.0.0.0/28".into(), "7".into()],
            }]
        );
        assert_eq!(
            d.services,
            [ServedService {
                name: "shop/web".into(),
                addresses: vec!["10.0.0.3".into()],
                pool: Some("current".into()),
            }]
        );
    }

    fn plan_of_unread(pools: &[PoolInput]) -> AdoptState {
        let c = Candidate {
            name: "z",
            datacenter: "dc",
            mode: AdoptMode::DryRun,
            reading: Reading::Unreadable("connection refused"),
        };
        plan(pools, &[], &[c]).clusters[0].state.clone()
    }
}
