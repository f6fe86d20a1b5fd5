//! The `IPAMAllocation` objects a plan asks for (pure: shared by the offline writer and the
//! controller), and the `IPAddress` objects of machines' claims (`address`).

pub mod address;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::allocator::Allocation;
use crate::planner::{Change, Decision};
use crate::resources::{
    ANNOTATION_ADDRESSES, ANNOTATION_METALLB_KEPT, ANNOTATION_METALLB_POOL,
    ANNOTATION_RECLAIM_POLICY, AllocationPhase, AllocationType, IPAMAllocation, IPAMAllocationSpec,
    IPAMAllocationStatus, LABEL_CLUSTER, LABEL_DATACENTER, LABEL_PHASE, LABEL_POOL, ReclaimPolicy,
    address_summary, cluster_namespace,
};

/// The allocation object for a decision, or `None` when it is to be removed.
///
/// `existing` is the stored object, whose metadata (other labels, annotations) and
/// `allocatedAt` are carried over; `policy` is the pool's current `reclaimPolicy` (`None` when
/// the pool is gone: the recorded one stays); `now` stamps new allocations (RFC 3339).
///
/// The object carries its phase in the `ipam.kipam.dev/phase` label and its addresses, short,
/// in the `ipam.kipam.dev/addresses` annotation (see [`show_phase`]).
pub fn allocation_object(
    decision: &Decision,
    existing: Option<&IPAMAllocation>,
    policy: Option<ReclaimPolicy>,
    now: &str,
) -> Option<IPAMAllocation> {
    if decision.change == Change::Release {
        return None;
    }
    let mut obj = existing.cloned().unwrap_or_else(|| IPAMAllocation {
        metadata: ObjectMeta::default(),
        spec: IPAMAllocationSpec::default(),
        status: None,
    });
    obj.metadata.name = Some(decision.pool.clone());
    obj.metadata.namespace = Some(cluster_namespace(&decision.cluster));
    let labels = obj.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(LABEL_POOL.into(), decision.pool.clone());
    labels.insert(LABEL_CLUSTER.into(), decision.cluster.clone());
    labels.insert(LABEL_DATACENTER.into(), decision.datacenter.clone());
    if let Some(policy) = policy {
        obj.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION_RECLAIM_POLICY.into(), policy.as_str().into());
    }
    let previous_status = obj.status.take().unwrap_or_default();
    if decision.change == Change::Conflict {
        // Reported, never rewritten: the spec (and what it reserves) stays as stored.
        if let Some(existing) = existing {
            obj.spec = existing.spec.clone();
            obj.metadata = existing.metadata.clone();
        } else if let Some(held) = &decision.held {
            obj.spec = spec_for(held, &decision.datacenter);
        }
        show_phase(&mut obj, existing, AllocationPhase::Conflict);
        obj.status = Some(IPAMAllocationStatus {
            phase: Some(AllocationPhase::Conflict),
            message: Some(decision.message.clone()),
            allocated_at: previous_status.allocated_at,
            conditions: previous_status.conditions,
            pieces: previous_status.pieces,
        });
        return Some(obj);
    }
    match &decision.held {
        Some(held) => {
            obj.spec = spec_for(held, &decision.datacenter);
        }
        None => {
            // Nothing held: no addresses.
            obj.spec.type_ = decision.type_;
            obj.spec.dc = decision.datacenter.clone();
            obj.spec.addresses.clear();
            obj.spec.cidr = None;
        }
    }
    let phase = phase_of(decision).unwrap_or_default();
    show_phase(&mut obj, existing, phase);
    let fresh = matches!(decision.change, Change::Create | Change::Replace);
    let allocated_at = match (&decision.held, fresh) {
        (Some(_), true) => Some(now.to_string()),
        (Some(_), false) => previous_status
            .allocated_at
            .clone()
            .or(Some(now.to_string())),
        (None, _) => None,
    };
    // The message says why the allocation is as it is in this plan: a plan that has nothing
    // to say clears it (a refused growth, a pause, a blocked pool are over once the plan
    // says nothing of them).
    let message = (!decision.message.is_empty()).then(|| decision.message.clone());
    obj.status = Some(IPAMAllocationStatus {
        phase: Some(phase),
        message,
        allocated_at,
        conditions: previous_status.conditions,
        pieces: held_pieces(previous_status.pieces, &obj.spec),
    });
    Some(obj)
}

/// The recorded pieces (`status.pieces`) that `spec` still holds, as they were: a write
/// that changes nothing about growth keeps what the growth step recorded, and a piece given
/// back leaves the list with its addresses.
fn held_pieces(
    pieces: Vec<crate::resources::PieceStatus>,
    spec: &IPAMAllocationSpec,
) -> Vec<crate::resources::PieceStatus> {
    pieces
        .into_iter()
        .filter(|p| spec.addresses.contains(&p.addresses))
        .collect()
}

/// Sets the phase label and the address annotation of `obj` (whose spec is final) for `phase`.
///
/// Both ride along with writes kipam makes anyway: the create, a spec change. On their own they
/// cause a write only when the phase changes. An object written before kipam set them (it has
/// neither) is not rewritten just to add them: it gets them with its next change.
fn show_phase(obj: &mut IPAMAllocation, existing: Option<&IPAMAllocation>, phase: AllocationPhase) {
    if let Some(e) = existing {
        let has_label = e
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(LABEL_PHASE));
        let has_annotation = e
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ANNOTATION_ADDRESSES));
        if !has_label && !has_annotation && e.phase() == phase && e.spec == obj.spec {
            return;
        }
    }
    obj.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(LABEL_PHASE.into(), phase.as_str().into());
    match address_summary(&obj.spec) {
        Some(summary) => {
            obj.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(ANNOTATION_ADDRESSES.into(), summary);
        }
        None => {
            // Stored without an empty map, as the API server returns it.
            if let Some(annotations) = obj.metadata.annotations.as_mut() {
                annotations.remove(ANNOTATION_ADDRESSES);
                if annotations.is_empty() {
                    obj.metadata.annotations = None;
                }
            }
        }
    }
}

/// The phase of the allocation object a decision asks for (`None`: the object goes away).
pub fn phase_of(decision: &Decision) -> Option<AllocationPhase> {
    match (decision.change, &decision.held) {
        (Change::Release, _) => None,
        (Change::Conflict, _) => Some(AllocationPhase::Conflict),
        (_, Some(_)) => Some(AllocationPhase::Allocated),
        (Change::Fail, None) => Some(AllocationPhase::Failed),
        (_, None) => Some(AllocationPhase::Pending),
    }
}

/// `spec` for what a cluster holds.
pub fn spec_for(held: &Allocation, datacenter: &str) -> IPAMAllocationSpec {
    match held {
        Allocation::Range(pieces) => IPAMAllocationSpec {
            type_: AllocationType::Range,
            dc: datacenter.to_string(),
            cidr: None,
            addresses: pieces.iter().map(|p| p.to_string()).collect(),
        },
        Allocation::Prefix(cidr) => IPAMAllocationSpec {
            type_: AllocationType::Prefix,
            dc: datacenter.to_string(),
            cidr: Some(cidr.to_string()),
            addresses: Vec::new(),
        },
    }
}

/// What an addon template sees for one cluster: its allocations that hold addresses and the
/// Addon's variables. Left out: allocations without addresses, those whose phase is `Pending`,
/// `Failed`, `Released` or `Conflict` (a conflicting allocation's addresses may also be held by
/// another cluster, so they must not be announced), and those being deleted. An allocation
/// without a status yet (just created, or from a state file) is rendered by its spec.
pub fn template_data<'a>(
    cluster: &str,
    datacenter: &str,
    allocations: impl IntoIterator<Item = &'a IPAMAllocation>,
    variables: serde_json::Map<String, serde_json::Value>,
) -> crate::render::TemplateData {
    use crate::render::{AllocationData, ClusterData, TemplateData};
    let namespace = cluster_namespace(cluster);
    let mut data = ClusterData::new(cluster, datacenter);
    for a in allocations {
        if a.metadata.namespace.as_deref() != Some(namespace.as_str())
            || a.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let phase = a.status.as_ref().and_then(|s| s.phase);
        if phase.is_some_and(|p| p != AllocationPhase::Allocated) {
            continue;
        }
        let pool = a.metadata.name.clone().unwrap_or_default();
        let entry = match (&a.spec.type_, &a.spec.cidr) {
            (AllocationType::Prefix, Some(cidr)) => AllocationData::prefix(&a.spec.dc, cidr),
            (AllocationType::Range, _) if !a.spec.addresses.is_empty() => {
                AllocationData::range(&a.spec.dc, a.spec.addresses.iter().cloned())
            }
            _ => continue,
        };
        let annotations = a.metadata.annotations.as_ref();
        let taken = annotations
            .and_then(|m| m.get(ANNOTATION_METALLB_POOL))
            .and_then(|v| v.split_once('/'))
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty());
        let entry = match taken {
            Some((namespace, name)) => {
                let kept = annotations
                    .and_then(|m| m.get(ANNOTATION_METALLB_KEPT))
                    .map(|k| {
                        k.split(',')
                            .map(str::trim)
                            .filter(|p| !p.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                entry.taking_over(namespace, name, kept)
            }
            _ => entry,
        };
        data = data.with_allocation(pool, entry);
    }
    let mut out = TemplateData::new(data);
    out.variables = variables;
    out
}

/// What an addon template sees of pool datacenter `dc` of `pool`: its `network`, checked.
/// Empty (every value `none`) when the pool has no such datacenter, names no network, or names
/// one that does not validate (the pool's `Ready` condition says why; nothing half-checked
/// reaches a user cluster).
pub fn allocation_network(
    pool: &crate::resources::IPAMPool,
    dc: &str,
) -> crate::render::AllocationNetwork {
    let checked = pool
        .spec
        .datacenters
        .get(dc)
        .and_then(|settings| crate::validation::datacenter_network(dc, settings).ok())
        .flatten();
    match checked {
        Some(n) => crate::render::AllocationNetwork {
            gateway: n.gateway,
            prefix_length: Some(n.prefix_length),
            vlan: n.vlan_id,
            dns: n.dns_servers,
            mtu: n.mtu,
        },
        None => crate::render::AllocationNetwork::default(),
    }
}

/// Adds to every allocation in `data` the network of its pool datacenter, from `pools` (by
/// name; an allocation whose pool is not among them keeps empty values).
pub fn add_networks<'a>(
    data: &mut crate::render::TemplateData,
    pools: impl IntoIterator<Item = &'a crate::resources::IPAMPool>,
) {
    let by_name: BTreeMap<&str, &crate::resources::IPAMPool> = pools
        .into_iter()
        .filter_map(|p| Some((p.metadata.name.as_deref()?, p)))
        .collect();
    for (name, allocation) in data.cluster.network.ipam_allocations.iter_mut() {
        if let Some(pool) = by_name.get(name.as_str()) {
            allocation.network = allocation_network(pool, &allocation.dc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(pool: &str, addresses: &str, phase: Option<AllocationPhase>) -> IPAMAllocation {
        IPAMAllocation {
            metadata: ObjectMeta {
                name: Some(pool.into()),
                namespace: Some("cluster-a".into()),
                ..Default::default()
            },
            spec: IPAMAllocationSpec {
                type_: AllocationType::Range,
                dc: "dc".into(),
                cidr: None,
                addresses: vec![addresses.into()],
            },
            status: phase.map(|phase| IPAMAllocationStatus {
                phase: Some(phase),
                ..Default::default()
            }),
        }
    }

    /// Only allocations that are really held reach the templates: a `Conflict` one keeps its
    /// spec (and its addresses reserved) but may overlap another cluster's.
    #[test]
    fn template_data_renders_only_held_allocations() {
        let all = [
            allocation("ok", "10.0.0.0-10.0.0.3", Some(AllocationPhase::Allocated)),
            allocation("fresh", "10.0.1.0-10.0.1.3", None),
            allocation(
                "conflict",
                "10.0.2.0-10.0.2.3",
                Some(AllocationPhase::Conflict),
            ),
            allocation("failed", "10.0.3.0-10.0.3.3", Some(AllocationPhase::Failed)),
            allocation(
                "pending",
                "10.0.4.0-10.0.4.3",
                Some(AllocationPhase::Pending),
            ),
            allocation(
                "released",
                "10.0.5.0-10.0.5.3",
                Some(AllocationPhase::Released),
            ),
        ];
        let data = template_data("a", "dc", &all, Default::default());
        let json = serde_json::to_value(&data).unwrap_or_default();
        let pools: Vec<&String> = json["Cluster"]["Network"]["IPAMAllocations"]
            .as_object()
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        assert_eq!(pools, vec!["fresh", "ok"]);
    }
}
