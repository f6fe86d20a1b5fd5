//! What the webhook decides, as a pure function of the request and a view of the seed (no
//! client, no lock): [`decide`].
//!
//! - `IPAMPool` create / update: [`validation::validate_pool`], the rules of `kipam validate`,
//!   against every allocation the pool holds (objects and the pool records).
//! - `Cluster` create / update: [`validation::cluster_input`].
//! - `IPAMAllocation` written by anyone but kipam: it must be readable, name an existing pool
//!   datacenter, stay inside it, avoid its exclusions, overlap no other allocation of the pool
//!   and datacenter and nothing the pool record holds for another cluster; a live allocation's
//!   addresses cannot be changed, and it cannot be deleted while its cluster lives.
//! - `IPAMPoolRecord`: written by kipam alone; others may only delete the record of a pool (or
//!   datacenter) that is gone, as the garbage collector does.
//! - Cluster API's `IPAddress` (`ipam.cluster.x-k8s.io`) naming a kipam pool, created or updated
//!   by anyone but kipam: [`ipaddress::check`] (the pool exists, the address lies in it and
//!   nobody else holds it).
//!
//! An update that leaves `spec` unchanged (labels, finalizers) is always let through, so an
//! object stored before a rule existed can still be cleaned up.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::address::AddrRange;
use crate::allocator::{Allocation, PoolKind};
use crate::planner::StoredAllocation;
use crate::reservations::allocation_of;
use crate::resources::{Cluster, IPAMAllocation, IPAMPool, IPAMPoolRecord, cluster_of_namespace};
use crate::validation::{self, FieldError};

use super::ipaddress;
use super::review::{AdmissionRequest, Verdict};

/// The API group of kipam's kinds.
pub const GROUP: &str = "ipam.kipam.dev";

/// What a decision needs to know about the seed, gathered by the caller for one request.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// The pool the request concerns, when it exists.
    pub pool: Option<IPAMPool>,
    /// Every `IPAMAllocation` named after that pool (all datacenters).
    pub allocations: Vec<IPAMAllocation>,
    /// Every `IPAMPoolRecord` of that pool.
    pub records: Vec<IPAMPoolRecord>,
    /// The cluster the request concerns (allocation deletes), when it exists.
    pub cluster: Option<Cluster>,
    /// The namespace of the request is being deleted.
    pub namespace_terminating: bool,
    /// For an `IPAddress`: the other pools of the same address space as `pool` (their
    /// `IPAMAllocation`s and records are in `allocations` and `records` too): an address held
    /// through one of them is held.
    pub space: Vec<IPAMPool>,
    /// For an `IPAddress`: the `IPAMAllocation`s of pools that no longer exist (kept by
    /// `reclaimPolicy: Retain`): held in every pool of their datacenter.
    pub retained: Vec<IPAMAllocation>,
    /// For an `IPAddress`: the hand-made ones (not kipam's) naming the pool or a pool of its
    /// address space.
    pub hand_made: Vec<crate::resources::capi::IPAddress>,
}

/// Which pool and cluster a request concerns, so the caller can gather the [`View`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wants {
    pub pool: Option<String>,
    pub cluster: Option<String>,
    pub namespace: Option<String>,
    /// The other pools of `pool`'s address space, with what they hold, are needed too.
    pub space: bool,
}

fn object_name(obj: Option<&Value>) -> Option<String> {
    obj?.get("metadata")?
        .get("name")?
        .as_str()
        .map(str::to_string)
}

/// What [`decide`] will need for `request`.
pub fn wants(request: &AdmissionRequest) -> Wants {
    if request.resource.group == ipaddress::GROUP
        && request.resource.resource == ipaddress::RESOURCE
    {
        return Wants {
            pool: request.object.as_ref().and_then(ipaddress::kipam_pool),
            space: true,
            ..Wants::default()
        };
    }
    if request.resource.group != GROUP {
        return Wants::default();
    }
    let name = request
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| object_name(request.object.as_ref()))
        .or_else(|| object_name(request.old_object.as_ref()));
    match request.resource.resource.as_str() {
        "ipampools" => Wants {
            pool: name,
            ..Wants::default()
        },
        "ipamallocations" => {
            let namespace = request.namespace.clone();
            Wants {
                pool: name,
                cluster: namespace
                    .as_deref()
                    .and_then(cluster_of_namespace)
                    .map(str::to_string),
                namespace,
                space: false,
            }
        }
        "ipampoolrecords" => {
            let spec_pool = |o: Option<&Value>| {
                o.and_then(|o| o.get("spec")?.get("pool")?.as_str().map(str::to_string))
            };
            Wants {
                pool: spec_pool(request.old_object.as_ref())
                    .or_else(|| spec_pool(request.object.as_ref())),
                ..Wants::default()
            }
        }
        _ => Wants::default(),
    }
}

fn parse<T: DeserializeOwned>(value: Option<&Value>, what: &str) -> Result<T, Verdict> {
    let value = value.ok_or_else(|| Verdict::invalid(format!("the review carries no {what}")))?;
    serde_json::from_value(value.clone())
        .map_err(|e| Verdict::invalid(format!("cannot read the {what}: {e}")))
}

fn joined(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The decision for one request. `kipam` is kipam's own user name: its writes pass.
pub fn decide(request: &AdmissionRequest, view: &View, kipam: &str) -> Verdict {
    if request.user_info.username == kipam {
        return Verdict::allow();
    }
    if request
        .sub_resource
        .as_deref()
        .is_some_and(|s| !s.is_empty())
    {
        return Verdict::allow();
    }
    let result = match (
        request.resource.group.as_str(),
        request.resource.resource.as_str(),
    ) {
        (ipaddress::GROUP, ipaddress::RESOURCE) => ip_address(request, view),
        (GROUP, _) => kipam_kind(request, view, kipam),
        _ => Ok(()),
    };
    match result {
        Ok(()) => Verdict::allow(),
        Err(v) => v,
    }
}

/// kipam's own kinds.
fn kipam_kind(request: &AdmissionRequest, view: &View, kipam: &str) -> Result<(), Verdict> {
    match request.resource.resource.as_str() {
        "ipampools" => pool(request, view),
        "clusters" => cluster(request),
        "ipamallocations" => allocation(request, view),
        "ipampoolrecords" => record(request, view, kipam),
        _ => Ok(()),
    }
}

/// Cluster API's `IPAddress`: created or updated (spec changed) by hand, it must name an
/// address of its kipam pool that nobody else holds.
fn ip_address(request: &AdmissionRequest, view: &View) -> Result<(), Verdict> {
    if !matches!(request.operation.as_str(), "CREATE" | "UPDATE") || spec_unchanged(request) {
        return Ok(());
    }
    let Some(object) = request.object.as_ref() else {
        return Err(Verdict::invalid("the review carries no IPAddress"));
    };
    // Once written for a kipam pool, the address is what the pool record holds for its claim:
    // moving it by hand would leave the claim holding two (Cluster API's own webhook keeps the
    // spec immutable too, where it is installed).
    if request.operation == "UPDATE"
        && let Some(pool) = request.old_object.as_ref().and_then(ipaddress::kipam_pool)
    {
        let name = object
            .pointer("/metadata/name")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        return Err(Verdict::invalid(format!(
            "IPAddress {}/{name}: spec is immutable once written for IPAMPool {pool}: delete the \
             claim to release its address, and create a new claim for another one",
            request.namespace.as_deref().unwrap_or_default()
        )));
    }
    ipaddress::check(
        object,
        request.namespace.as_deref(),
        ipaddress::Held {
            pool: view.pool.as_ref(),
            allocations: &view.allocations,
            records: &view.records,
            space: &view.space,
            retained: &view.retained,
            hand_made: &view.hand_made,
        },
    )
    .map(|_| ())
}

/// An admitted `request` that makes a hand-made `IPAddress` show an address of a kipam pool
/// (a create, or an update giving a non-kipam one kipam's pool, which [`decide`] let through):
/// the webhook commits its address before answering ([`super::pin`]). Never for a dry run.
pub fn commits_hand_made(request: &AdmissionRequest) -> bool {
    (
        request.resource.group.as_str(),
        request.resource.resource.as_str(),
    ) == (ipaddress::GROUP, ipaddress::RESOURCE)
        && matches!(request.operation.as_str(), "CREATE" | "UPDATE")
        && !spec_unchanged(request)
        && request.dry_run != Some(true)
        && request
            .object
            .as_ref()
            .and_then(ipaddress::kipam_pool)
            .is_some()
}

fn spec_unchanged(request: &AdmissionRequest) -> bool {
    request.operation == "UPDATE"
        && match (&request.object, &request.old_object) {
            (Some(new), Some(old)) => new.get("spec") == old.get("spec"),
            _ => false,
        }
}

/// Everything the pool holds, from the objects and the records (each parsed leniently: an
/// object that cannot be read is left out here; the controller reports it).
fn stored_of_pool(view: &View) -> Vec<StoredAllocation> {
    let mut stored: Vec<StoredAllocation> = view
        .allocations
        .iter()
        .filter_map(|a| validation::stored_allocation(a).ok())
        .collect();
    for record in &view.records {
        for (cluster, reservation) in &record.spec.reservations {
            if let Ok(held) = allocation_of(reservation) {
                stored.push(StoredAllocation {
                    cluster: cluster.clone(),
                    pool: record.spec.pool.clone(),
                    datacenter: record.spec.datacenter.clone(),
                    held: Some(held),
                    reclaim_policy: None,
                    unreadable: None,
                });
            }
        }
    }
    stored
}

fn pool(request: &AdmissionRequest, view: &View) -> Result<(), Verdict> {
    if !matches!(request.operation.as_str(), "CREATE" | "UPDATE") || spec_unchanged(request) {
        return Ok(());
    }
    let new: IPAMPool = parse(request.object.as_ref(), "IPAMPool")?;
    let old: Option<IPAMPool> = match request.operation.as_str() {
        "UPDATE" => Some(parse(request.old_object.as_ref(), "old IPAMPool")?),
        _ => None,
    };
    validation::validate_pool(&new, old.as_ref(), &stored_of_pool(view))
        .map(|_| ())
        .map_err(|e| Verdict::invalid(joined(&e)))
}

fn cluster(request: &AdmissionRequest) -> Result<(), Verdict> {
    if !matches!(request.operation.as_str(), "CREATE" | "UPDATE") || spec_unchanged(request) {
        return Ok(());
    }
    let new: Cluster = parse(request.object.as_ref(), "Cluster")?;
    validation::cluster_input(&new)
        .map(|_| ())
        .map_err(|e| Verdict::invalid(joined(&e)))
}

fn object_label(a: &IPAMAllocation) -> String {
    format!(
        "IPAMAllocation {}/{}",
        a.metadata.namespace.as_deref().unwrap_or(""),
        a.metadata.name.as_deref().unwrap_or("")
    )
}

fn overlap(a: &Allocation, b: &Allocation) -> Option<AddrRange> {
    for x in a.ranges() {
        for y in b.ranges() {
            if x.overlaps(&y) {
                return AddrRange::new(
                    x.family(),
                    x.first().max(y.first()),
                    x.last().min(y.last()),
                );
            }
        }
    }
    None
}

fn allocation(request: &AdmissionRequest, view: &View) -> Result<(), Verdict> {
    match request.operation.as_str() {
        "CREATE" => allocation_write(request, view, None),
        "UPDATE" => {
            if spec_unchanged(request) {
                return Ok(());
            }
            let old: IPAMAllocation = parse(request.old_object.as_ref(), "old IPAMAllocation")?;
            allocation_write(request, view, Some(&old))
        }
        "DELETE" => allocation_delete(request, view),
        _ => Ok(()),
    }
}

/// The stored view of an allocation object, or why it cannot be read.
fn read_allocation(obj: &IPAMAllocation) -> Result<StoredAllocation, Verdict> {
    validation::stored_allocation(obj).map_err(|e| Verdict::invalid(joined(&e)))
}

fn allocation_write(
    request: &AdmissionRequest,
    view: &View,
    old: Option<&IPAMAllocation>,
) -> Result<(), Verdict> {
    let mut new: IPAMAllocation = parse(request.object.as_ref(), "IPAMAllocation")?;
    if new.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        new.metadata.namespace = request.namespace.clone();
    }
    let label = object_label(&new);
    let parsed = read_allocation(&new)?;
    if let Some(old) = old
        && let Ok(before) = validation::stored_allocation(old)
        && let Some(held_before) = &before.held
    {
        // A live allocation keeps its addresses: only kipam changes them, through the pool
        // record, for an explicit reason.
        let same = before.datacenter == parsed.datacenter
            && old.spec.type_ == new.spec.type_
            && parsed.held.as_ref() == Some(held_before);
        if !same {
            return Err(Verdict::invalid(format!(
                "{label}: spec: changes the addresses of a live allocation (cluster {} holds {held_before} in datacenter {}); only kipam changes them — edit the Cluster's spec.ipam[{}] or the pool instead",
                before.cluster, before.datacenter, before.pool
            )));
        }
        return Ok(());
    }
    let Some(held) = &parsed.held else {
        return Ok(()); // holds nothing: nothing to collide with
    };
    let dc = &parsed.datacenter;
    let Some(pool) = &view.pool else {
        return Err(Verdict::invalid(format!(
            "{label}: metadata.name {:?}: no IPAMPool {} exists (an allocation is named after its pool)",
            parsed.pool, parsed.pool
        )));
    };
    let Some(settings) = pool.spec.datacenters.get(dc) else {
        return Err(Verdict::invalid(format!(
            "{label}: spec.dc {dc:?}: IPAMPool {} has no datacenter {dc}",
            parsed.pool
        )));
    };
    let input = validation::pool_input(pool).map_err(|e| {
        Verdict::invalid(format!(
            "{label}: IPAMPool {} is invalid, so nothing can be checked against it: {}",
            parsed.pool,
            joined(&e)
        ))
    })?;
    let Some(dc_input) = input.datacenters.get(dc) else {
        return Err(Verdict::invalid(format!(
            "{label}: spec.dc {dc:?}: IPAMPool {} has no usable datacenter {dc}",
            parsed.pool
        )));
    };
    let (field, value) = match held {
        Allocation::Prefix(c) => ("spec.cidr", c.to_string()),
        Allocation::Range(_) => ("spec.addresses", held.to_string()),
    };
    let want = match dc_input.config.kind {
        PoolKind::Range { .. } => "range",
        PoolKind::Prefix { .. } => "prefix",
    };
    if held.type_name() != want {
        return Err(Verdict::invalid(format!(
            "{label}: spec.type {:?}: IPAMPool {}/{dc} is of type {want}",
            held.type_name(),
            parsed.pool
        )));
    }
    let cidr = dc_input.config.cidr;
    let inside = |r: &AddrRange| {
        // Cut at the edges of the pool's CIDRs: what is left must be nothing.
        let mut left = vec![(r.first(), r.last())];
        for c in dc_input.config.cidrs() {
            left = left
                .into_iter()
                .flat_map(|(f, l)| {
                    let mut rest = Vec::new();
                    if c.family() != r.family() || c.last() < f || c.first() > l {
                        rest.push((f, l));
                    } else {
                        if c.first() > f {
                            rest.push((f, c.first() - 1));
                        }
                        if c.last() < l {
                            rest.push((c.last() + 1, l));
                        }
                    }
                    rest
                })
                .collect();
        }
        left.is_empty()
    };
    if let Some(r) = held.ranges().find(|r| !inside(r)) {
        let more = if settings.additional_cidrs.is_empty() {
            String::new()
        } else {
            format!(" and {}", settings.additional_cidrs.join(", "))
        };
        return Err(Verdict::invalid(format!(
            "{label}: {field} {value:?}: {r} leaves the pool: IPAMPool {}/{dc} is {cidr} ({}){more}",
            parsed.pool, settings.pool_cidr
        )));
    }
    let written = match dc_input.config.kind {
        PoolKind::Range { .. } => ("excludeRanges", &settings.exclude_ranges),
        PoolKind::Prefix { .. } => ("excludePrefixes", &settings.exclude_prefixes),
    };
    for (i, e) in dc_input.exclusions.iter().enumerate() {
        let exclusion = Allocation::Range(vec![*e]);
        if let Some(common) = overlap(held, &exclusion) {
            let text = written.1.get(i).cloned().unwrap_or_else(|| e.to_string());
            return Err(Verdict::invalid(format!(
                "{label}: {field} {value:?}: {common} is excluded from IPAMPool {}/{dc} (spec.datacenters[{dc}].{}[{i}] {text:?})",
                parsed.pool, written.0
            )));
        }
    }
    let me = (
        new.metadata.namespace.clone().unwrap_or_default(),
        new.metadata.name.clone().unwrap_or_default(),
    );
    for other in &view.allocations {
        let key = (
            other.metadata.namespace.clone().unwrap_or_default(),
            other.metadata.name.clone().unwrap_or_default(),
        );
        if key == me {
            continue;
        }
        let Ok(theirs) = validation::stored_allocation(other) else {
            continue;
        };
        if theirs.pool != parsed.pool || &theirs.datacenter != dc {
            continue;
        }
        if let Some(their_held) = &theirs.held
            && let Some(common) = overlap(held, their_held)
        {
            return Err(Verdict::invalid(format!(
                "{label}: {field} {value:?}: overlaps {} of cluster {} ({their_held}) at {common}",
                object_label(other),
                theirs.cluster
            )));
        }
    }
    for record in view
        .records
        .iter()
        .filter(|r| r.spec.pool == parsed.pool && &r.spec.datacenter == dc)
    {
        for (cluster, reservation) in &record.spec.reservations {
            if cluster == &parsed.cluster {
                continue;
            }
            let Ok(recorded) = allocation_of(reservation) else {
                continue;
            };
            if let Some(common) = overlap(held, &recorded) {
                return Err(Verdict::invalid(format!(
                    "{label}: {field} {value:?}: {common} is recorded for cluster {cluster} in IPAMPoolRecord {} ({recorded})",
                    record.metadata.name.as_deref().unwrap_or_default()
                )));
            }
        }
    }
    Ok(())
}

fn allocation_delete(request: &AdmissionRequest, view: &View) -> Result<(), Verdict> {
    let Some(old) = request.old_object.as_ref() else {
        return Ok(()); // nothing to judge (an API server always sends it)
    };
    let mut old: IPAMAllocation = parse(Some(old), "IPAMAllocation")?;
    if old.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        old.metadata.namespace = request.namespace.clone();
    }
    let Ok(parsed) = validation::stored_allocation(&old) else {
        return Ok(()); // an unreadable object may be removed
    };
    let Some(held) = &parsed.held else {
        return Ok(());
    };
    let cluster_lives = view
        .cluster
        .as_ref()
        .is_some_and(|c| c.metadata.deletion_timestamp.is_none());
    if !cluster_lives || view.namespace_terminating {
        return Ok(());
    }
    Err(Verdict::forbidden(format!(
        "{}: holds {held} for cluster {} in datacenter {}; deleting it by hand releases nothing (kipam's record keeps the addresses and kipam writes the object again). To release them delete the Cluster, set spec.ipam[{}].optOut on it, or remove the datacenter from IPAMPool {}",
        object_label(&old),
        parsed.cluster,
        parsed.datacenter,
        parsed.pool,
        parsed.pool,
    )))
}

fn record(request: &AdmissionRequest, view: &View, kipam: &str) -> Result<(), Verdict> {
    let who = &request.user_info.username;
    let name = request.name.clone().unwrap_or_default();
    if request.operation == "DELETE"
        && let Some(old) = request.old_object.as_ref()
        && let Ok(old) = serde_json::from_value::<IPAMPoolRecord>(old.clone())
    {
        let pool_gone = match &view.pool {
            None => true,
            Some(p) => {
                p.metadata.deletion_timestamp.is_some()
                    || !p.spec.datacenters.contains_key(&old.spec.datacenter)
            }
        };
        if pool_gone {
            return Ok(()); // the garbage collector removing the record of a deleted pool
        }
    }
    Err(Verdict::forbidden(format!(
        "IPAMPoolRecord {name}: written by kipam alone (user {kipam}), not by {who:?}: it is the commit point of every allocation of pool {} (see docs/design.md); it is deleted with its pool",
        view.pool
            .as_ref()
            .and_then(|p| p.metadata.name.clone())
            .unwrap_or_else(|| name.split('.').next().unwrap_or("").to_string())
    )))
}
