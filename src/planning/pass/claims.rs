//! Machines' claims (Cluster API's IPAM contract): their planner input, and after the record
//! commit their `IPAddress`es, finalizers and statuses.
//!
//! A claim is one more holder of the plan (`claim/<namespace>/<name>`, asking its one pool):
//! the planner gives it its address beside the clusters' ranges, the commit puts it in the
//! pool record, and only then does this step write the `IPAddress`. A claim of a paused Cluster
//! API cluster is left alone: it keeps what it holds and nothing of it is written.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::*;
use crate::allocator::{Allocation, PoolKind};
use crate::desired::address::{AddressFor, address_spec, claim_status, metadata_patch, object_of};
use crate::planner::{Change, ClusterInput, Decision, HeldElsewhere, PoolInput, StoredAllocation};
use crate::planning::records::RecordKey;
use crate::resources::capi::{
    ADDRESS_FINALIZER, CLAIM_FINALIZER, IPAddress, IPAddressClaim, IPAddressClaimStatus,
    claim_holder, claim_of_holder,
};
use crate::resources::{Cluster, IPAMPool, LABEL_DATACENTER};
use crate::seed::Context;
use crate::validation::{self, ClaimHeld, ClaimPool, ClaimWait};

/// (namespace, name) of a claim.
type ClaimKey = (String, String);

/// What the inputs step made of the claims, for the writes after the commit.
#[derive(Default)]
pub(super) struct ClaimsRead {
    /// Every claim of a kipam pool, by holder name.
    pub claims: HashMap<String, Arc<IPAddressClaim>>,
    /// Claims left alone (paused).
    pub paused: HashSet<String>,
    /// Claims not served, and why.
    pub waits: HashMap<String, ClaimWait>,
    /// Something said beside a served claim's status (an annotation left aside).
    pub notes: HashMap<String, String>,
    /// Claims whose pin (requested address) was asked: a failure is about that address.
    pub pinned: HashSet<String>,
    /// kipam's `IPAddress`es of claims, by holder.
    pub addresses: HashMap<String, Arc<IPAddress>>,
    /// `IPAddress`es made before their claim that the claim adopts (the plan pins their
    /// address), by holder.
    pub adopt: HashMap<String, Arc<IPAddress>>,
    /// Claims that hold an address of a pool being deleted: they keep it, untouched, until
    /// they are deleted themselves (the pool waits for them).
    pub in_deleting_pool: HashSet<String>,
}

/// A hand-made `IPAddress` naming a kipam pool, and how it is set aside.
pub(super) struct HandMade {
    pub object: Arc<IPAddress>,
    pub aside: Vec<HeldElsewhere>,
}

/// The Cluster API clusters that are paused, by (namespace, name).
fn paused_clusters(ctx: &Context) -> HashSet<ClaimKey> {
    ctx.capi
        .clusters
        .state()
        .iter()
        .filter(|c| c.is_paused())
        .map(|c| key_of(c.as_ref()))
        .collect()
}

/// The Cluster API cluster a claim names exists (in its namespace), as the cache shows it.
fn cluster_found(ctx: &Context, namespace: &str, claim: &IPAddressClaim) -> bool {
    claim.cluster_name().is_none_or(|n| {
        ctx.capi
            .clusters
            .get(&ObjectRef::new(n).within(namespace))
            .is_some()
    })
}

/// The kipam pool carries Cluster API's pause annotation: it serves no new claim, and its
/// claims are left alone as those of a paused cluster are.
fn pool_paused(ctx: &Context, pool: &str) -> bool {
    ctx.pools
        .get(&ObjectRef::new(pool))
        .is_some_and(|p| crate::resources::capi::has_pause_annotation(&p.metadata))
}

fn key_of<K: kube::Resource>(o: &K) -> ClaimKey {
    (
        o.meta().namespace.clone().unwrap_or_default(),
        o.meta().name.clone().unwrap_or_default(),
    )
}

/// The `IPAddress`es that point at a kipam pool, by holder, with what they hold as stored
/// allocations (added to what the records hold: an address an object shows is held).
pub(super) fn stored_addresses(
    ctx: &Context,
    pools: &[PoolInput],
) -> (
    HashMap<String, Arc<IPAddress>>,
    Vec<StoredAllocation>,
    Vec<HandMade>,
) {
    let kinds: HashMap<(&str, &str), &PoolKind> = pools
        .iter()
        .flat_map(|p| {
            p.datacenters
                .iter()
                .map(move |(dc, d)| ((p.name.as_str(), dc.as_str()), &d.config.kind))
        })
        .collect();
    let mut by_holder = HashMap::new();
    let mut stored = Vec::new();
    let mut hand_made = Vec::new();
    for a in ctx.capi.addresses.state() {
        let Some(pool) = a.spec.pool_ref.kipam_pool() else {
            continue;
        };
        let ours = a.written_by_kipam();
        let Some(dc) = a.labels().get(LABEL_DATACENTER).cloned().filter(|_| ours) else {
            // Not written by kipam: the admission webhook refuses one that overlaps what kipam
            // holds; one it let in is set aside, in every datacenter of the pool holding its
            // address, so kipam never hands that address out. It is not kipam's to keep or
            // delete.
            let mut aside = Vec::new();
            let (namespace, name) = key_of(a.as_ref());
            for p in pools.iter().filter(|p| p.name == pool) {
                for (dc, d) in &p.datacenters {
                    // What it shows: its address, or in a prefix pool its subnet.
                    let prefix_pool = matches!(d.config.kind, PoolKind::Prefix { .. });
                    let Some(shown) = held_by(&a, prefix_pool).or_else(|| held_by(&a, false))
                    else {
                        continue;
                    };
                    let r: Vec<crate::address::AddrRange> = shown.ranges().collect();
                    if d.config
                        .cidrs()
                        .any(|c| r.iter().all(|piece| c.contains(piece)))
                    {
                        aside.push(HeldElsewhere {
                            // Not a pool name: set aside in this pool too.
                            pool: format!("{pool} (IPAddress {namespace}/{name})"),
                            datacenter: dc.clone(),
                            holder: format!("{namespace}/{name}"),
                            addresses: r,
                        });
                    }
                }
            }
            // Its pool no longer serves it (the datacenter removed from the pool, the pool
            // deleted or invalid), yet the object still shows the address: set aside in every
            // pool of the datacenter its label names (without one, of every datacenter) whose
            // CIDRs hold it, whatever the address space, until the object is deleted.
            if !serves_hand_made(pools, pool, &a)
                && let Some(shown) = held_by(&a, false)
            {
                let r: Vec<crate::address::AddrRange> = shown.ranges().collect();
                let label = a
                    .labels()
                    .get(LABEL_DATACENTER)
                    .filter(|l| !l.is_empty())
                    .cloned();
                let mut dcs: Vec<&String> = pools
                    .iter()
                    .flat_map(|p| p.datacenters.iter())
                    .filter(|(dc, d)| {
                        label.as_ref().is_none_or(|l| l == *dc)
                            && d.config
                                .cidrs()
                                .any(|c| r.iter().all(|piece| c.contains(piece)))
                    })
                    .map(|(dc, _)| dc)
                    .collect();
                dcs.sort();
                dcs.dedup();
                for dc in dcs {
                    aside.push(HeldElsewhere {
                        pool: format!("{pool} (IPAddress {namespace}/{name})"),
                        datacenter: dc.clone(),
                        holder: format!("{namespace}/{name}"),
                        addresses: r.clone(),
                    });
                }
            }
            hand_made.push(HandMade { object: a, aside });
            continue;
        };
        let (namespace, name) = key_of(a.as_ref());
        let holder = claim_holder(&namespace, &a.spec.claim_ref.name);
        let prefix_pool = matches!(
            kinds.get(&(pool, dc.as_str())),
            Some(PoolKind::Prefix { .. })
        );
        let held = held_by(&a, prefix_pool);
        stored.push(StoredAllocation {
            cluster: holder.clone(),
            pool: pool.to_string(),
            datacenter: dc,
            unreadable: if held.is_none() {
                Some(format!(
                    "IPAddress {namespace}/{name}: spec.address {:?} with prefix {} cannot be read",
                    a.spec.address, a.spec.prefix
                ))
            } else {
                None
            },
            held,
            reclaim_policy: None,
        });
        by_holder.insert(holder, a);
    }
    (by_holder, stored, hand_made)
}

/// What kipam's `IPAddress`es of claims show in (`pool`, `datacenter`), by holder: the record
/// keeps covering an address while an object shows it (a released claim's until its
/// `IPAddress` is gone).
pub(super) fn shown_in(
    ctx: &Context,
    pool: &str,
    datacenter: &str,
    kind: Option<&PoolKind>,
) -> Vec<(String, Allocation)> {
    ctx.capi
        .addresses
        .state()
        .iter()
        .filter(|a| {
            a.spec.pool_ref.kipam_pool() == Some(pool)
                && a.written_by_kipam()
                && a.labels().get(LABEL_DATACENTER).map(String::as_str) == Some(datacenter)
        })
        .filter_map(|a| {
            let (namespace, _) = key_of(a.as_ref());
            Some((
                claim_holder(&namespace, &a.spec.claim_ref.name),
                held_by(a, matches!(kind, Some(PoolKind::Prefix { .. })))?,
            ))
        })
        .collect()
}

/// kipam's `IPAddress`es of each pool (by pool, then datacenter) whose spec shows another
/// network than the pool datacenter's current one (prefix length or gateway): `IPAddress.spec`
/// is immutable in Cluster API, so they keep what they were written with; new claims get the
/// new network.
pub(super) fn outdated_addresses(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    inputs: &[PoolInput],
) -> HashMap<String, BTreeMap<String, usize>> {
    /// What an `IPAddress` written now shows of a pool datacenter's network.
    struct Now {
        prefix_pool: bool,
        cidrs: Vec<crate::address::Cidr>,
        prefix_length: Option<u8>,
        gateway: Option<String>,
    }
    // Read once per pool datacenter, not once per `IPAddress`: this runs over every claim's
    // `IPAddress` whenever pool statuses are written (once a second while claims stream in).
    let inputs: HashMap<&str, &PoolInput> = inputs.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut now: HashMap<(&str, &str), Now> = HashMap::new();
    for p in pools {
        let Some(name) = p.metadata.name.as_deref() else {
            continue;
        };
        let Some(input) = inputs.get(name) else {
            continue;
        };
        for (dc, settings) in &p.spec.datacenters {
            let Some(dc_input) = input.datacenters.get(dc) else {
                continue;
            };
            let network = validation::datacenter_network(dc, settings).ok().flatten();
            now.insert(
                (name, dc.as_str()),
                Now {
                    prefix_pool: matches!(dc_input.config.kind, PoolKind::Prefix { .. }),
                    cidrs: dc_input.config.cidrs().collect(),
                    prefix_length: settings
                        .network
                        .as_ref()
                        .and_then(|n| n.prefix_length)
                        .and_then(|n| u8::try_from(n).ok()),
                    gateway: network.and_then(|n| n.gateway),
                },
            );
        }
    }
    let mut out: HashMap<String, BTreeMap<String, usize>> = HashMap::new();
    if now.is_empty() {
        return out;
    }
    for a in ctx.capi.addresses.state() {
        if !a.written_by_kipam() {
            continue;
        }
        let (Some(pool), Some(dc)) = (
            a.spec.pool_ref.kipam_pool(),
            a.labels().get(LABEL_DATACENTER),
        ) else {
            continue;
        };
        let Some(n) = now.get(&(pool, dc.as_str())) else {
            continue;
        };
        let Some(held) = held_by(&a, n.prefix_pool) else {
            continue;
        };
        let outdated = crate::desired::address::held_prefix(&held, &n.cidrs, n.prefix_length)
            .is_ok_and(|prefix| {
                i32::from(prefix) != a.spec.prefix
                    || n.gateway.as_deref() != a.spec.gateway.as_deref()
            });
        if outdated {
            *out.entry(pool.to_string())
                .or_default()
                .entry(dc.clone())
                .or_default() += 1;
        }
    }
    out
}

/// The claims holding addresses of a pool being deleted, by pool: kipam's `IPAddress`es that
/// name it (the pool waits for them).
pub(super) fn holding_in(ctx: &Context, pool: &str) -> Vec<String> {
    let mut out: Vec<String> = ctx
        .capi
        .addresses
        .state()
        .iter()
        .filter(|a| a.written_by_kipam() && a.spec.pool_ref.kipam_pool() == Some(pool))
        .map(|a| {
            let (ns, _) = key_of(a.as_ref());
            format!("{ns}/{}", a.spec.claim_ref.name)
        })
        .collect();
    out.sort();
    out
}

/// What an `IPAddress` holds: its address, or in a prefix pool (`prefix_pool`) its subnet.
fn held_by(a: &IPAddress, prefix_pool: bool) -> Option<Allocation> {
    let (family, value) = crate::address::parse_address(a.spec.address.trim()).ok()?;
    if prefix_pool {
        let len = u8::try_from(a.spec.prefix).ok()?;
        if let Some(cidr) = crate::address::Cidr::new(family, value, len) {
            return Some(Allocation::Prefix(cidr));
        }
    }
    Some(Allocation::Range(vec![crate::address::AddrRange::new(
        family, value, value,
    )?]))
}

/// Whether `pool` (among the valid pools) still serves the hand-made `a`: one of its
/// datacenters holds its address in its CIDRs — the one its datacenter label names, when it
/// has the label (the webhook's rule, `webhook::ipaddress::served_by`).
fn serves_hand_made(pools: &[PoolInput], pool: &str, a: &IPAddress) -> bool {
    let Some(shown) = held_by(a, false) else {
        return true; // shows nothing readable: holds nothing
    };
    let label = a.labels().get(LABEL_DATACENTER).filter(|l| !l.is_empty());
    pools.iter().filter(|p| p.name == pool).any(|p| {
        p.datacenters.iter().any(|(dc, d)| {
            label.is_none_or(|l| l == dc)
                && d.config
                    .cidrs()
                    .any(|c| shown.ranges().all(|piece| c.contains(&piece)))
        })
    })
}

/// The claims as planner input. `stored` already holds what records and `IPAddress`es show;
/// a holder of it whose claim the cache lacks is looked up before it is let go.
#[allow(clippy::too_many_arguments)]
pub(super) async fn inputs(
    ctx: &Context,
    pool_inputs: &[PoolInput],
    invalid_pools: &HashMap<String, Vec<crate::validation::FieldError>>,
    deleting_pools: &HashMap<String, crate::resources::ReclaimPolicy>,
    clusters: &[Arc<Cluster>],
    stored: &[StoredAllocation],
    addresses: HashMap<String, Arc<IPAddress>>,
    hand_made: Vec<HandMade>,
) -> Result<(Vec<ClusterInput>, ClaimsRead, Vec<HeldElsewhere>), PassError> {
    let mut read = ClaimsRead {
        addresses,
        ..Default::default()
    };
    // Hand-made `IPAddress`es by (namespace, name): one named like a claim may be adopted.
    let mut hand_made: HashMap<ClaimKey, HandMade> = hand_made
        .into_iter()
        .map(|h| (key_of(h.object.as_ref()), h))
        .collect();
    for c in ctx.capi.claims.state() {
        if c.spec.pool_ref.kipam_pool().is_some() {
            let (ns, name) = key_of(c.as_ref());
            read.claims.insert(claim_holder(&ns, &name), c);
        }
    }
    // Holders of addresses whose claim is not in the cache: until the claims have been
    // listed once, kept as they are; after, looked up (a lagging cache never frees one).
    let mut held: HashMap<&str, (&str, &str, &Allocation)> = HashMap::new();
    for s in stored {
        if let (Some(h), true) = (&s.held, claim_of_holder(&s.cluster).is_some()) {
            held.insert(
                s.cluster.as_str(),
                (s.pool.as_str(), s.datacenter.as_str(), h),
            );
        }
    }
    let mut frozen: BTreeMap<String, String> = BTreeMap::new();
    for holder in held.keys() {
        if read.claims.contains_key(*holder) {
            continue;
        }
        if !ctx.capi.listed() {
            frozen.insert(
                holder.to_string(),
                "Cluster API's claims have not been listed yet".to_string(),
            );
            continue;
        }
        let Some((ns, name)) = claim_of_holder(holder) else {
            continue;
        };
        // RBAC: src/rbac.rs (ipaddressclaims get).
        let api: Api<IPAddressClaim> = Api::namespaced(ctx.writer.clone(), ns);
        match api.get_opt(name).await {
            Ok(Some(c)) if c.spec.pool_ref.kipam_pool().is_some() => {
                tracing::info!(claim = %format!("{ns}/{name}"), "claim missing from the cache exists; keeping its address");
                read.claims.insert(holder.to_string(), Arc::new(c));
            }
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(PassError::ConfirmCluster {
                    cluster: holder.to_string(),
                    source,
                });
            }
        }
    }
    let pools: HashMap<&str, &PoolInput> =
        pool_inputs.iter().map(|p| (p.name.as_str(), p)).collect();
    let kipam_dc: HashMap<String, &str> = clusters
        .iter()
        .map(|c| (c.name_any(), c.spec.datacenter.as_str()))
        .collect();
    let paused_clusters = paused_clusters(ctx);
    let clusters_listed = ctx.capi.clusters_listed();
    let mut inputs = Vec::with_capacity(read.claims.len() + frozen.len());
    for (holder, why) in frozen {
        if let Some((pool, dc, _)) = held.get(holder.as_str()) {
            let mut input = ClusterInput::invalid(&holder, None, dc, false, why);
            input.only_pool = Some(pool.to_string());
            inputs.push(input);
        }
    }
    for (holder, claim) in &read.claims {
        let Some(pool_name) = claim.spec.pool_ref.kipam_pool() else {
            continue;
        };
        let namespace = claim.namespace().unwrap_or_default();
        let holds = held.contains_key(holder.as_str());
        let deleting = claim.metadata.deletion_timestamp.is_some();
        // A claim whose Cluster the cache does not show (yet) holds nothing new: it waits.
        // Until the Clusters have been listed once, such a claim is left alone.
        let cluster_wait =
            validation::cluster_wait(claim, holds, cluster_found(ctx, &namespace, claim));
        let paused = claim.is_paused()
            || claim
                .cluster_name()
                .is_some_and(|n| paused_clusters.contains(&(namespace.clone(), n.to_string())))
            || pool_paused(ctx, pool_name)
            || (cluster_wait.is_some() && !clusters_listed);
        if paused {
            read.paused.insert(holder.clone());
        }
        if let Some(wait) = cluster_wait.filter(|_| !paused) {
            read.waits.insert(holder.clone(), wait);
            continue;
        }
        // A claim holding an address of a pool being deleted keeps it: the pool waits for
        // the claim. Released once the claim is deleted (its `IPAddress` first).
        if let Some((p, _, _)) = held.get(holder.as_str())
            && deleting_pools.contains_key(*p)
        {
            read.in_deleting_pool.insert(holder.clone());
            continue;
        }
        let pool = match pools.get(pool_name) {
            Some(p) => ClaimPool::Ready(p),
            None if deleting_pools.contains_key(pool_name) => ClaimPool::Deleting,
            None => match invalid_pools.get(pool_name) {
                Some(errors) => ClaimPool::Invalid(
                    errors
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                None => ClaimPool::Missing,
            },
        };
        let holding = held.get(holder.as_str()).map(|(_, dc, h)| ClaimHeld {
            datacenter: dc,
            held: h,
        });
        let cluster_dc = claim.cluster_name().and_then(|n| kipam_dc.get(n).copied());
        let ready_pool = match &pool {
            ClaimPool::Ready(p) => Some(*p),
            _ => None,
        };
        let mut r = validation::claim_input(claim, pool_name, pool, cluster_dc, paused, holding);
        // An `IPAddress` made before the claim, under its name: adopted (its address pinned
        // for the claim, so the plan commits it to the record like any request), or the claim
        // says why not and gets nothing else (its `IPAddress` name is taken).
        let name = claim.name_any();
        if !holds
            && !deleting
            && let Some(found) = hand_made.get_mut(&(namespace.clone(), name.clone()))
        {
            // Only a claim that would be served now adopts; one that waits says why it waits.
            let adopt = match (&mut r.input, ready_pool) {
                (Some(input), Some(p)) if r.wait.is_none() => {
                    let pool_ref = found.object.spec.pool_ref.kipam_pool();
                    let seen = validation::Found {
                        name: &name,
                        claim_ref: &found.object.spec.claim_ref.name,
                        pool: pool_ref,
                        address: &found.object.spec.address,
                        prefix: found.object.spec.prefix,
                    };
                    Some(
                        validation::adoption(&name, pool_name, p, &input.datacenter, &seen).map(
                            |pin| {
                                input.overrides.insert(pool_name.to_string(), pin);
                            },
                        ),
                    )
                }
                _ => None,
            };
            match adopt {
                None => {}
                Some(Ok(())) => {
                    // Set aside for this claim only: its pin lifts it.
                    for e in &mut found.aside {
                        e.holder = format!("{}{holder}", crate::resources::capi::ADOPTABLE_PREFIX);
                    }
                    read.adopt.insert(holder.clone(), found.object.clone());
                }
                Some(Err(wait)) => {
                    r.input = None;
                    r.wait = Some(wait);
                }
            }
        }
        // A claim being deleted keeps its address until its `IPAddress` is gone: released
        // before, the address could go to another claim while the old object still shows it.
        if let Some(input) = r.input.as_mut()
            && input.deleting
            && read.addresses.contains_key(holder)
        {
            input.deleting = false;
            input.invalid = Some("being deleted: its IPAddress goes first".to_string());
        }
        if let Some(input) = &r.input
            && matches!(
                input.overrides.get(pool_name),
                Some(crate::planner::PoolOverride::PinnedAddresses(_))
                    | Some(crate::planner::PoolOverride::PinnedCidr(_))
            )
            && !held.contains_key(holder.as_str())
        {
            read.pinned.insert(holder.clone());
        }
        if let Some(w) = r.wait {
            read.waits.insert(holder.clone(), w);
        }
        if let Some(n) = r.note {
            read.notes.insert(holder.clone(), n);
        }
        if let Some(input) = r.input {
            inputs.push(input);
        }
    }
    let aside = hand_made.into_values().flat_map(|h| h.aside).collect();
    Ok((inputs, read, aside))
}

/// The named claims as planner input for the short pass, when every one of them is new and
/// plainly served (see `fast::run_claims`); `None` sends the pass to the full plan.
pub(super) fn newcomers(
    ctx: &Context,
    pools: &[PoolInput],
    known: &PassState,
    records: &crate::seed::records::Records,
    holders: &BTreeSet<String>,
) -> Option<(Vec<ClusterInput>, ClaimsRead)> {
    if !ctx.capi.listed() {
        return None;
    }
    let mut read = ClaimsRead::default();
    let mut new = Vec::new();
    let paused_clusters = paused_clusters(ctx);
    for holder in holders {
        let (ns, name) = claim_of_holder(holder)?;
        let claim = ctx.capi.claims.get(&ObjectRef::new(name).within(ns))?;
        let pool_name = claim.spec.pool_ref.kipam_pool()?;
        let paused = claim.is_paused()
            || claim
                .cluster_name()
                .is_some_and(|n| paused_clusters.contains(&(ns.to_string(), n.to_string())));
        if paused
            || claim.metadata.deletion_timestamp.is_some()
            || records.holds(holder)
            || !cluster_found(ctx, ns, &claim)
            || pool_paused(ctx, pool_name)
        {
            return None;
        }
        if ctx
            .capi
            .addresses
            .get(&ObjectRef::new(name).within(ns))
            .is_some()
        {
            return None;
        }
        let pool = ClaimPool::Ready(pools.iter().find(|p| p.name == pool_name)?);
        let cluster_dc = claim.cluster_name().and_then(|n| {
            ctx.clusters
                .get(&ObjectRef::new(n))
                .map(|c| c.spec.datacenter.clone())
        });
        let r =
            validation::claim_input(&claim, pool_name, pool, cluster_dc.as_deref(), false, None);
        let input = r.input.filter(|_| r.wait.is_none())?;
        match known.known_input(holder) {
            Some(before) if *before == input => continue,
            Some(_) => return None,
            None => {}
        }
        if !matches!(
            input.overrides.get(pool_name),
            None | Some(crate::planner::PoolOverride::Addresses(_))
        ) {
            return None; // a requested address: the full plan places pins
        }
        read.claims.insert(holder.clone(), claim);
        new.push(input);
    }
    Some((new, read))
}

/// The claims' `IPAddress` creates the plan asks for, by the record that must be committed
/// first: added to the commit's checks so their shards are current.
pub(super) fn to_create(
    plan: &planner::Plan,
    read: &ClaimsRead,
) -> HashMap<RecordKey, std::collections::BTreeSet<String>> {
    let mut out: HashMap<RecordKey, std::collections::BTreeSet<String>> = HashMap::new();
    for d in claim_decisions(plan) {
        if read.paused.contains(&d.cluster) || d.change == Change::Release {
            continue;
        }
        let Some(wants) = &d.held else {
            continue;
        };
        let prefix_pool = matches!(wants, Allocation::Prefix(_));
        let shows = read
            .addresses
            .get(&d.cluster)
            .and_then(|a| held_by(a, prefix_pool));
        if shows.as_ref() != Some(wants) {
            out.entry((d.pool.clone(), d.datacenter.clone()))
                .or_default()
                .insert(d.cluster.clone());
        }
    }
    out
}

fn claim_decisions(plan: &planner::Plan) -> impl Iterator<Item = &Decision> {
    plan.decisions
        .iter()
        .filter(|d| claim_of_holder(&d.cluster).is_some())
}

/// One claim's writes.
struct ClaimJob<'a> {
    holder: String,
    claim: Option<Arc<IPAddressClaim>>,
    existing: Option<Arc<IPAddress>>,
    /// The `IPAddress` to have (`None`: none), or leave what exists (`Keep`).
    address: AddressWant,
    /// The status to write, when it differs.
    status: Option<IPAddressClaimStatus>,
    /// Drop the claim's finalizer (its address is released).
    release_claim: bool,
    /// The claim holds an address: it must carry the contract's finalizer.
    wants_finalizer: bool,
    ctx: &'a Context,
    term: u64,
}

enum AddressWant {
    Keep,
    Have(Box<IPAddress>),
    /// Keep the object and its spec; merge-patch its metadata (adoption, or kipam's labels,
    /// finalizer and owner references brought up to date).
    Patch(String, serde_json::Value),
    Remove,
}

/// Writes the claims' `IPAddress`es, finalizers and statuses: creates only where the pool
/// record was committed in this pass (`committed`), releases once the address is in the
/// record's care (the record keeps the entry while the claim still exists).
#[allow(clippy::too_many_arguments)]
pub(super) async fn write(
    ctx: &Context,
    term: u64,
    plan: &planner::Plan,
    read: &ClaimsRead,
    committed: &HashSet<RecordKey>,
    pools: &[Arc<IPAMPool>],
    inputs: &[PoolInput],
    now: &str,
    limit: usize,
    outcome: &mut PassOutcome,
) {
    let pool_objects: HashMap<String, &Arc<IPAMPool>> =
        pools.iter().map(|p| (p.name_any(), p)).collect();
    let pool_inputs: HashMap<&str, &PoolInput> =
        inputs.iter().map(|p| (p.name.as_str(), p)).collect();
    let decisions: HashMap<&str, &Decision> = claim_decisions(plan)
        .map(|d| (d.cluster.as_str(), d))
        .collect();
    // Hand-made `IPAddress`es, by the address space of the pool they name, with what they show:
    // kipam does not write a claim's `IPAddress` over one of them. Read from the cache of
    // those kipam did not write (never behind the cache of all): going through all of them
    // here cost every new claim a walk over every claim's `IPAddress`.
    let space_of = |pool: &str| {
        pool_objects
            .get(pool)
            .map(|p| p.spec.address_space.clone().unwrap_or_default())
    };
    let hand_made: Vec<(String, Allocation, String)> = ctx
        .capi
        .foreign_addresses
        .state()
        .iter()
        .filter(|a| !a.written_by_kipam())
        .filter_map(|a| {
            let pool = a.spec.pool_ref.kipam_pool()?;
            let prefix_pool = pool_inputs.get(pool).is_some_and(|p| {
                p.datacenters
                    .values()
                    .any(|d| matches!(d.config.kind, PoolKind::Prefix { .. }))
            });
            let shown = held_by(a, prefix_pool).or_else(|| held_by(a, false))?;
            let (ns, name) = key_of(a.as_ref());
            Some((space_of(pool)?, shown, format!("{ns}/{name}")))
        })
        .collect();
    let mut jobs = Vec::new();
    // Holders with a decision but no claim (it is gone): their addresses are removed.
    let gone: Vec<String> = decisions
        .keys()
        .filter(|h| !read.claims.contains_key(**h))
        .map(|h| h.to_string())
        .collect();
    for holder in read.claims.keys().cloned().chain(gone) {
        if read.paused.contains(&holder) {
            continue;
        }
        let deleting_claim = read
            .claims
            .get(&holder)
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some());
        if read.in_deleting_pool.contains(&holder) && !deleting_claim {
            // Its pool is being deleted: it keeps its address, untouched, until it goes.
            continue;
        }
        let claim = read.claims.get(&holder).cloned();
        let existing = read.addresses.get(&holder).cloned();
        let decision = decisions.get(holder.as_str()).copied();
        let deleting = claim
            .as_ref()
            .is_some_and(|c| c.metadata.deletion_timestamp.is_some());
        let has_finalizer = claim
            .as_ref()
            .is_some_and(|c| c.finalizers().iter().any(|f| f == CLAIM_FINALIZER));
        let mut job = ClaimJob {
            holder: holder.clone(),
            claim: claim.clone(),
            existing: existing.clone(),
            address: AddressWant::Keep,
            status: None,
            release_claim: false,
            wants_finalizer: false,
            ctx,
            term,
        };
        let ready = |reason: &str, message: String, address: Option<&str>, ok: bool| {
            claim.as_ref().and_then(|c| {
                let next = claim_status(
                    c.status.as_ref(),
                    address,
                    ok,
                    reason,
                    message,
                    c.metadata.generation,
                    now,
                );
                (!same_status(c.status.as_ref(), &next)).then_some(next)
            })
        };
        match decision {
            None if deleting || claim.is_none() => {
                // Holds nothing: nothing to release.
                if existing.is_some() {
                    job.address = AddressWant::Remove;
                }
                job.release_claim = has_finalizer;
            }
            None => {
                let (reason, message) = match read.waits.get(&holder) {
                    Some(w) => (w.reason, w.message.clone()),
                    None => (
                        "AllocationFailed",
                        "the claim is not planned yet; it is retried".to_string(),
                    ),
                };
                job.status = ready(reason, message, None, false);
            }
            Some(d) if d.change == Change::Release => {
                if existing.is_some() {
                    job.address = AddressWant::Remove;
                }
                job.release_claim = has_finalizer && deleting;
                if !deleting {
                    // Its pool or datacenter went: the claim says so and waits.
                    let (reason, message) = match read.waits.get(&holder) {
                        Some(w) => (w.reason, format!("{}; {}", d.message, w.message)),
                        None => ("AddressReleased", d.message.clone()),
                    };
                    job.status = ready(reason, message, None, false);
                }
            }
            Some(_) if deleting => {
                // Kept (frozen) until its `IPAddress` is gone; then the plan releases it.
                if existing.is_some() {
                    job.address = AddressWant::Remove;
                }
            }
            Some(d) => {
                let adopting = read.adopt.get(&holder);
                let Some(held) = &d.held else {
                    let (reason, message) = match adopting {
                        Some(found) => (
                            validation::ADDRESS_NOT_ADOPTABLE,
                            format!(
                                "IPAddress {} exists under the claim's name but cannot be adopted: {}; delete it, and the claim is served",
                                found.name_any(),
                                d.message
                            ),
                        ),
                        None => (
                            fail_reason(d, read.pinned.contains(&holder), plan),
                            d.message.clone(),
                        ),
                    };
                    job.status = ready(reason, message, None, false);
                    push(&mut jobs, job);
                    continue;
                };
                if !committed.contains(&(d.pool.clone(), d.datacenter.clone())) {
                    outcome.again = true;
                    continue;
                }
                let Some(c) = &claim else {
                    continue;
                };
                let (namespace, name) = key_of(c.as_ref());
                let network = pool_objects
                    .get(&d.pool)
                    .and_then(|p| p.spec.datacenters.get(&d.datacenter))
                    .and_then(|settings| {
                        validation::datacenter_network(&d.datacenter, settings)
                            .ok()
                            .flatten()
                    });
                let cidrs: Vec<crate::address::Cidr> = pool_inputs
                    .get(d.pool.as_str())
                    .and_then(|p| p.datacenters.get(&d.datacenter))
                    .map(|dc| dc.config.cidrs().collect())
                    .unwrap_or_default();
                let pool_uid = pool_objects
                    .get(&d.pool)
                    .and_then(|p| p.uid())
                    .unwrap_or_default();
                let claim_uid = c.uid().unwrap_or_default();
                let wanted = AddressFor {
                    namespace: &namespace,
                    claim: &name,
                    claim_uid: &claim_uid,
                    pool: &d.pool,
                    pool_uid: &pool_uid,
                    datacenter: &d.datacenter,
                    held,
                    cidrs: &cidrs,
                    prefix_length: pool_objects
                        .get(&d.pool)
                        .and_then(|p| p.spec.datacenters.get(&d.datacenter))
                        .and_then(|s| s.network.as_ref())
                        .and_then(|n| n.prefix_length)
                        .and_then(|n| u8::try_from(n).ok()),
                    gateway: network.as_ref().and_then(|n| n.gateway.as_deref()),
                    cluster_name: c
                        .labels()
                        .get(crate::resources::capi::LABEL_CAPI_CLUSTER_NAME)
                        .map(String::as_str)
                        .or(c.spec.cluster_name.as_deref())
                        .filter(|n| !n.is_empty()),
                };
                match address_spec(&wanted) {
                    Err(why) => {
                        job.status = ready(
                            "AllocationFailed",
                            format!("{} in pool {}: {why}", d.cluster, d.pool),
                            None,
                            false,
                        );
                    }
                    Ok(spec) => {
                        job.wants_finalizer = !deleting;
                        let prefix_pool = matches!(held, Allocation::Prefix(_));
                        // An `IPAddress` that shows what the claim holds stays as it is:
                        // its spec is immutable in Cluster API, so a network edited since
                        // (gateway, prefix length) reaches new claims only (the pool's status
                        // counts those left on the old one). Only its metadata may change.
                        let shown = existing
                            .as_ref()
                            .or(adopting)
                            .filter(|e| held_by(e, prefix_pool).as_ref() == Some(held));
                        let mut message = match shown {
                            Some(e) => format!(
                                "{}/{} from pool {} in datacenter {}",
                                e.spec.address, e.spec.prefix, d.pool, d.datacenter
                            ),
                            None => format!(
                                "{}/{} from pool {} in datacenter {}",
                                spec.address, spec.prefix, d.pool, d.datacenter
                            ),
                        };
                        match shown {
                            Some(e) => {
                                let current =
                                    adopting.is_none() && metadata_current(e, wanted.cluster_name);
                                if !current {
                                    let whole = object_of(&wanted, e.spec.clone());
                                    if let Some(patch) = metadata_patch(e, &whole) {
                                        job.address = AddressWant::Patch(e.name_any(), patch);
                                    }
                                }
                                if adopting.is_some() {
                                    message.push_str(
                                        " (adopted: the IPAddress was made before the claim)",
                                    );
                                }
                            }
                            None if adopting.is_some() => {
                                // The plan holds another address than the one made by hand
                                // (never, as the pin is its address): nothing is written.
                                outcome.again = true;
                                continue;
                            }
                            None => {
                                // A hand-made `IPAddress` admitted while this address was
                                // being handed to the claim shows it already: kipam does not
                                // write a second object showing it; a person resolves it.
                                let space = space_of(&d.pool).unwrap_or_default();
                                let over = hand_made.iter().find(|(s, shown, _)| {
                                    *s == space
                                        && shown
                                            .ranges()
                                            .any(|r| held.ranges().any(|h| h.overlaps(&r)))
                                });
                                if let Some((_, shown, object)) = over {
                                    job.status = ready(
                                        "AddressConflict",
                                        format!(
                                            "{held} of pool {} is the claim's in the pool record, but IPAddress {object} (not written by kipam) shows {shown}: kipam writes no IPAddress for the claim while it exists; delete one of them",
                                            d.pool
                                        ),
                                        None,
                                        false,
                                    );
                                    push(&mut jobs, job);
                                    continue;
                                }
                                job.address = AddressWant::Have(Box::new(object_of(&wanted, spec)));
                            }
                        }
                        if let Some(note) = read.notes.get(&holder) {
                            message.push_str("; ");
                            message.push_str(note);
                        }
                        if d.change == Change::Conflict {
                            job.status =
                                ready("AddressConflict", d.message.clone(), Some(&name), false);
                        } else {
                            job.status = ready("AddressAllocated", message, Some(&name), true);
                        }
                    }
                }
            }
        }
        push(&mut jobs, job);
    }
    let runs: Vec<_> = jobs.into_iter().map(ClaimJob::run).collect();
    let results: Vec<(u64, bool)> = futures::stream::iter(runs)
        .buffer_unordered(limit.max(1))
        .collect()
        .await;
    for (writes, again) in results {
        outcome.writes += writes;
        outcome.again |= again;
    }
}

fn push<'a>(jobs: &mut Vec<ClaimJob<'a>>, job: ClaimJob<'a>) {
    let lacks_finalizer = job.wants_finalizer
        && job
            .claim
            .as_ref()
            .is_some_and(|c| !c.finalizers().iter().any(|f| f == CLAIM_FINALIZER));
    let nothing = matches!(job.address, AddressWant::Keep)
        && job.status.is_none()
        && !job.release_claim
        && !lacks_finalizer;
    if !nothing {
        jobs.push(job);
    }
}

/// kipam's `IPAddress` carries what kipam writes on it beside the spec: the protecting
/// finalizer, the claim's cluster label, and owner references that block their owners'
/// deletion. (Cheap: checked for every claim on every pass; [`metadata_patch`] builds the rest.)
fn metadata_current(a: &IPAddress, cluster: Option<&str>) -> bool {
    a.finalizers().iter().any(|f| f == ADDRESS_FINALIZER)
        && a.labels()
            .get(crate::resources::capi::LABEL_CAPI_CLUSTER_NAME)
            .map(String::as_str)
            == cluster
        && a.owner_references()
            .iter()
            .filter(|o| o.block_owner_deletion == Some(true))
            .count()
            >= 2
}

/// Why a claim's request failed, as its `Ready` reason.
fn fail_reason(d: &Decision, pinned: bool, plan: &planner::Plan) -> &'static str {
    if pinned {
        return "RequestedAddressUnavailable";
    }
    // Free addresses remain, but only those no machine gets (network, broadcast, gateway).
    if d.message.contains("a machine is never given") {
        return "PoolExhausted";
    }
    let full = plan
        .usage
        .get(&(d.pool.clone(), d.datacenter.clone()))
        .is_some_and(|r| r.usage.available.is_zero() || d.message.contains("no free aligned"));
    if full {
        "PoolExhausted"
    } else {
        "AllocationFailed"
    }
}

/// The status says the same (its `Ready` condition and `addressRef`).
fn same_status(old: Option<&IPAddressClaimStatus>, new: &IPAddressClaimStatus) -> bool {
    let Some(old) = old else {
        return false;
    };
    let ready = |s: &IPAddressClaimStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    old.address_ref == new.address_ref && ready(old) == ready(new)
}

impl ClaimJob<'_> {
    /// Runs the writes in order: finalizer, `IPAddress`, status, release. Returns the writes
    /// made and whether anything is left to retry.
    async fn run(self) -> (u64, bool) {
        let ctx = self.ctx;
        let mut writes = 0;
        let name = claim_of_holder(&self.holder)
            .map(|(ns, n)| format!("{ns}/{n}"))
            .unwrap_or_default();
        if !due(ctx, "IPAddressClaim", &name) {
            return (0, true);
        }
        let fence = || ctx.leader.holds_term(self.term);
        let Some((namespace, claim_name)) = claim_of_holder(&self.holder) else {
            return (0, false);
        };
        let claims: Api<IPAddressClaim> = Api::namespaced(ctx.writer.clone(), namespace);
        let addresses: Api<IPAddress> = Api::namespaced(ctx.writer.clone(), namespace);
        let fail = |verb: &str, kind: &str, e: kube::Error| {
            if !is_conflict(&e) {
                write_failed(ctx, kind, &name, verb, &e);
            }
        };
        // 1. The contract's finalizer, before the claim holds anything written.
        if let Some(c) = &self.claim
            && self.wants_finalizer
            && !c.finalizers().iter().any(|f| f == CLAIM_FINALIZER)
        {
            if !fence() {
                return (writes, false);
            }
            // RBAC: src/rbac.rs (ipaddressclaims patch).
            if let Err(e) =
                lifecycle::patch_finalizers(&claims, c.as_ref(), CLAIM_FINALIZER, true, ctx).await
            {
                {
                    fail("patch", "IPAddressClaim", e);
                    return (writes, true);
                };
            }
            writes += 1;
        }
        // 2. The address.
        match &self.address {
            AddressWant::Keep => {}
            AddressWant::Have(desired) => {
                if !fence() {
                    return (writes, false);
                }
                if let Some(old) = &self.existing {
                    // Another address than the record's: replaced (it was kipam's).
                    match remove_address(ctx, &addresses, old).await {
                        Ok(n) => writes += n,
                        Err(e) => {
                            fail("delete", "IPAddress", e);
                            return (writes, true);
                        }
                    }
                }
                ctx.metrics.wrote("create", "ipaddresses");
                // RBAC: src/rbac.rs (ipaddresses create).
                match addresses
                    .create(
                        &PostParams {
                            field_manager: Some("kipam".into()),
                            ..Default::default()
                        },
                        desired,
                    )
                    .await
                {
                    Ok(_) => writes += 1,
                    Err(e) if is_conflict(&e) => {
                        // Already there (our earlier create the cache has not shown yet, or
                        // somebody's): the next pass compares it.
                        return (writes, true);
                    }
                    Err(e) => {
                        fail("create", "IPAddress", e);
                        return (writes, true);
                    }
                }
            }
            AddressWant::Patch(address_name, patch) => {
                if !fence() {
                    return (writes, false);
                }
                ctx.metrics.wrote("patch", "ipaddresses");
                // RBAC: src/rbac.rs (ipaddresses patch).
                match addresses
                    .patch(address_name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                {
                    Ok(_) => writes += 1,
                    Err(e) if is_conflict(&e) || is_not_found(&e) => {
                        // Changed or gone since the cache saw it: the next pass looks again.
                        return (writes, true);
                    }
                    Err(e) => {
                        fail("patch", "IPAddress", e);
                        return (writes, true);
                    }
                }
            }
            AddressWant::Remove => {
                if let Some(old) = &self.existing {
                    if !fence() {
                        return (writes, false);
                    }
                    match remove_address(ctx, &addresses, old).await {
                        Ok(n) => writes += n,
                        Err(e) => {
                            fail("delete", "IPAddress", e);
                            return (writes, true);
                        }
                    }
                }
            }
        }
        // 3. The status.
        if let Some(status) = &self.status
            && self.claim.is_some()
        {
            if !fence() {
                return (writes, false);
            }
            ctx.metrics.wrote("patch", "ipaddressclaims/status");
            let patch = json!({ "status": {
                "addressRef": status.address_ref,
                "conditions": status.conditions,
            }});
            // RBAC: src/rbac.rs (ipaddressclaims/status patch).
            match claims
                .patch_status(claim_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => writes += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    fail("patch", "IPAddressClaim", e);
                    return (writes, true);
                }
            }
        }
        // 4. The claim lets go once its address is gone.
        if self.release_claim
            && let Some(c) = &self.claim
        {
            if !fence() {
                return (writes, false);
            }
            match lifecycle::patch_finalizers(&claims, c.as_ref(), CLAIM_FINALIZER, false, ctx)
                .await
            {
                Ok(_) => writes += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    fail("patch", "IPAddressClaim", e);
                    return (writes, true);
                }
            }
        }
        write_succeeded(ctx, "IPAddressClaim", &name);
        (writes, false)
    }
}

/// Drops the protecting finalizer of kipam's `IPAddress` and deletes it.
async fn remove_address(
    ctx: &Context,
    api: &Api<IPAddress>,
    old: &IPAddress,
) -> Result<u64, kube::Error> {
    let mut writes = 0;
    if old.finalizers().iter().any(|f| f == ADDRESS_FINALIZER) {
        // RBAC: src/rbac.rs (ipaddresses patch).
        match lifecycle::patch_finalizers(api, old, ADDRESS_FINALIZER, false, ctx).await {
            Ok(_) => writes += 1,
            Err(e) if is_not_found(&e) => return Ok(writes),
            Err(e) => return Err(e),
        }
    }
    ctx.metrics.wrote("delete", "ipaddresses");
    // RBAC: src/rbac.rs (ipaddresses delete).
    match api.delete(&old.name_any(), &DeleteParams::default()).await {
        Ok(_) => writes += 1,
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(e),
    }
    Ok(writes)
}
