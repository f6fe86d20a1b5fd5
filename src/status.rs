//! Status of pools and clusters, computed from a plan (pure: no client).
//!
//! Conditions keep their `lastTransitionTime` while their status stays the same, so writing a
//! status that did not change is a no-op the caller can skip. Capacity conditions report a
//! threshold crossing (up or down) as a [`StatusEvent`], never a steady state, so events are
//! emitted on change and not on every resync.

use std::collections::BTreeMap;

use crate::address::AddrRange;
use crate::allocator::CidrUsage;
use crate::planner::adopt::ClusterAdoption;
use crate::planner::{Change, DatacenterReport, Decision, PoolInput};
use crate::resources::{
    AdoptionAddress, AdoptionConflict, AdoptionHandMadePool, AdoptionStatus, Condition,
    DatacenterUsage, IPAMPoolStatus, PoolCidrUsage,
};
use crate::validation::FieldError;

/// `(condition type, utilisation threshold in percent)`, lowest first.
pub const CAPACITY_THRESHOLDS: [(&str, u8); 3] = [
    ("CapacityWarning", 70),
    ("CapacityCritical", 85),
    ("CapacityExhausted", 95),
];

/// An event the caller should publish: something changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusEvent {
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

/// Two pool datacenters whose CIDRs intersect.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Overlap {
    pub pool: String,
    pub datacenter: String,
    pub other_pool: String,
    pub other_datacenter: String,
    /// Both pools list the same datacenter in the same address space: the addresses they
    /// share are handed out once for both (the planner enforces it). Otherwise the overlap
    /// is across datacenters or address spaces, where the same address may be handed out
    /// once on each side.
    pub shared: bool,
}

impl Overlap {
    fn describe(&self) -> String {
        if self.pool == self.other_pool {
            format!(
                "datacenters {} and {} share addresses (separate address spaces: an address may be handed out in each)",
                self.datacenter, self.other_datacenter
            )
        } else if self.shared {
            format!(
                "datacenter {} overlaps pool {} in the same address space: an address held through either is taken for both",
                self.datacenter, self.other_pool
            )
        } else if self.datacenter == self.other_datacenter {
            format!(
                "datacenter {} overlaps pool {} in another address space: an address may be handed out in each",
                self.datacenter, self.other_pool
            )
        } else {
            format!(
                "datacenter {} overlaps pool {} in datacenter {}",
                self.datacenter, self.other_pool, self.other_datacenter
            )
        }
    }
}

/// Pool datacenters whose CIDRs intersect: different pools in one datacenter, and one pool
/// across its datacenters (legal, as KKP allows, but worth knowing). Each pair is reported
/// from both sides.
pub fn find_overlaps(pools: &[PoolInput]) -> Vec<Overlap> {
    let mut all: Vec<(&str, &str, AddrRange, &str)> = Vec::new();
    for pool in pools {
        for (dc, input) in &pool.datacenters {
            for cidr in input.config.cidrs() {
                all.push((&pool.name, dc, cidr.range(), &pool.address_space));
            }
        }
    }
    let mut out = Vec::new();
    for (i, a) in all.iter().enumerate() {
        for b in all.iter().skip(i + 1) {
            let same_pool = a.0 == b.0;
            let same_dc = a.1 == b.1;
            // Two CIDRs of one pool datacenter never overlap (validation refuses it).
            if same_pool && same_dc {
                continue;
            }
            if (same_pool || same_dc) && a.2.overlaps(&b.2) {
                let shared = !same_pool && same_dc && a.3 == b.3;
                out.push(Overlap {
                    pool: a.0.into(),
                    datacenter: a.1.into(),
                    other_pool: b.0.into(),
                    other_datacenter: b.1.into(),
                    shared,
                });
                out.push(Overlap {
                    pool: b.0.into(),
                    datacenter: b.1.into(),
                    other_pool: a.0.into(),
                    other_datacenter: a.1.into(),
                    shared,
                });
            }
        }
    }
    out.sort();
    // Pools of several CIDRs may overlap through more than one pair of them: once each.
    out.dedup();
    out
}

/// The status figures of each CIDR of a pool datacenter of several CIDRs (none for one CIDR:
/// the datacenter's own figures are that CIDR's).
fn cidr_usage(cidrs: &[CidrUsage]) -> Vec<PoolCidrUsage> {
    if cidrs.len() < 2 {
        return Vec::new();
    }
    cidrs
        .iter()
        .map(|c| PoolCidrUsage {
            cidr: c.cidr.to_string(),
            total: c.total.to_string(),
            allocated: c.allocated.to_string(),
            excluded: c.excluded.to_string(),
            available: c.available.to_string(),
            largest_free_block: c.largest_free_block.to_string(),
            fragmentation_percent: i32::from(c.fragmentation_percent),
        })
        .collect()
}

/// Sets one condition, keeping `lastTransitionTime` when the status does not change.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &str,
) {
    let status = if status { "True" } else { "False" };
    let previous = conditions.iter().find(|c| c.type_ == type_);
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Some(now.to_string()),
    };
    let condition = Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time,
        observed_generation: generation,
    };
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(slot) => *slot = condition,
        None => conditions.push(condition),
    }
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// A pool's status from the plan, and the events its changes call for.
///
/// `validation` is the outcome of validating the pool (errors make it not Ready);
/// `reports` are its datacenters' usage after the plan.
#[allow(clippy::too_many_arguments)]
pub fn pool_status(
    name: &str,
    generation: Option<i64>,
    validation: Result<(), &[FieldError]>,
    reports: &[&DatacenterReport],
    overlaps: &[Overlap],
    conflicts: &[&Decision],
    previous: Option<&IPAMPoolStatus>,
    now: &str,
) -> (IPAMPoolStatus, Vec<StatusEvent>) {
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    let before = conditions.clone();
    let mut events = Vec::new();
    match validation {
        Ok(()) => set_condition(
            &mut conditions,
            "Ready",
            true,
            "Valid",
            "the pool is valid and serving allocations".into(),
            generation,
            now,
        ),
        Err(errors) => {
            let message = errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("; ");
            set_condition(
                &mut conditions,
                "Ready",
                false,
                "Invalid",
                message,
                generation,
                now,
            );
        }
    }
    let mut datacenters = BTreeMap::new();
    let mut max_percent: Option<u8> = None;
    let mut allocations = 0i64;
    let mut quarantined = crate::address::AddressCount::ZERO;
    let mut busiest = String::new();
    for r in reports {
        let u = &r.usage;
        let percent = u.utilisation_percent();
        if max_percent.is_none_or(|m| percent > m) {
            max_percent = Some(percent);
            busiest = r.datacenter.clone();
        }
        allocations += u.allocations as i64;
        quarantined = quarantined.saturating_add(u.quarantined);
        datacenters.insert(
            r.datacenter.clone(),
            DatacenterUsage {
                total: u.total.to_string(),
                allocated: u.allocated.to_string(),
                excluded: u.excluded.to_string(),
                available: u.available.to_string(),
                allocations: u.allocations as i64,
                largest_free_block: u.largest_free_block.to_string(),
                fragmentation_percent: u.fragmentation_percent as i32,
                utilisation_percent: percent as i32,
                cidrs: cidr_usage(&r.cidrs),
                quarantined: Some(u.quarantined.to_string()),
                // Counted by the caller, which knows which holders are claims.
                claims: None,
            },
        );
    }
    let used = max_percent.unwrap_or(0);
    for (type_, threshold) in CAPACITY_THRESHOLDS {
        let reached = used >= threshold;
        let message = if reached {
            format!("datacenter {busiest} is {used}% used (threshold {threshold}%)")
        } else {
            format!("every datacenter is below {threshold}% used (highest {used}%)")
        };
        let reason = if reached {
            "ThresholdReached"
        } else {
            "BelowThreshold"
        };
        let was = is_true(&before, type_);
        set_condition(
            &mut conditions,
            type_,
            reached,
            reason,
            message.clone(),
            generation,
            now,
        );
        if reached != was && (reached || before.iter().any(|c| c.type_ == type_)) {
            events.push(StatusEvent {
                warning: reached,
                reason: if reached {
                    type_.to_string()
                } else {
                    format!("{type_}Cleared")
                },
                message: format!("pool {name}: {message}"),
            });
        }
    }
    let mine: Vec<&Overlap> = overlaps.iter().filter(|o| o.pool == name).collect();
    let overlap_message = if mine.is_empty() {
        "no overlap with other pools or datacenters".to_string()
    } else {
        mine.iter()
            .map(|o| o.describe())
            .collect::<Vec<_>>()
            .join("; ")
    };
    let overlapping = !mine.is_empty();
    if overlapping && !is_true(&before, "Overlap") {
        events.push(StatusEvent {
            warning: true,
            reason: "Overlap".into(),
            message: format!("pool {name}: {overlap_message}"),
        });
    }
    set_condition(
        &mut conditions,
        "Overlap",
        overlapping,
        if overlapping {
            "CidrsIntersect"
        } else {
            "NoOverlap"
        },
        overlap_message,
        generation,
        now,
    );
    let conflicting = !conflicts.is_empty();
    let conflict_message = if conflicting {
        let mut listed: Vec<String> = conflicts
            .iter()
            .take(10)
            .map(|d| {
                format!(
                    "IPAMAllocation cluster-{}/{} ({}): {}",
                    d.cluster, d.pool, d.datacenter, d.message
                )
            })
            .collect();
        if conflicts.len() > 10 {
            listed.push(format!("and {} more", conflicts.len() - 10));
        }
        listed.join("; ")
    } else {
        "every stored allocation is honoured".to_string()
    };
    if conflicting && !is_true(&before, "Conflict") {
        events.push(StatusEvent {
            warning: true,
            reason: "AllocationConflict".into(),
            message: format!("pool {name}: {conflict_message}"),
        });
    }
    set_condition(
        &mut conditions,
        "Conflict",
        conflicting,
        if conflicting {
            "AllocationConflict"
        } else {
            "NoConflict"
        },
        conflict_message,
        generation,
        now,
    );
    let status = IPAMPoolStatus {
        observed_generation: generation,
        conditions,
        datacenters,
        max_utilisation_percent: max_percent.map(|p| p as i32),
        allocations: Some(allocations),
        quarantined: Some(quarantined.to_string()),
        claims: None,
    };
    (status, events)
}

/// The `IPAMReady` condition of a cluster from its decisions.
pub fn cluster_ipam_condition(decisions: &[&Decision]) -> (bool, String, String) {
    let failed: Vec<&&Decision> = decisions.iter().filter(|d| !d.is_ok()).collect();
    if failed.is_empty() {
        let held = decisions
            .iter()
            .filter(|d| d.held.is_some() && d.change != Change::Release)
            .count();
        return (
            true,
            "Allocated".into(),
            format!("{held} allocation(s) held"),
        );
    }
    let message = failed
        .iter()
        .map(|d| format!("{}: {}", d.pool, d.message))
        .collect::<Vec<_>>()
        .join("; ");
    let reason = if failed.iter().any(|d| d.change == Change::Conflict) {
        "AllocationConflict"
    } else if failed
        .iter()
        .any(|d| d.message.contains("free addresses") || d.message.contains("no free aligned"))
    {
        "PoolExhausted"
    } else {
        "AllocationFailed"
    };
    (false, reason.into(), message)
}

/// Whether the reserved addresses leave a machine's claim nothing in this pool datacenter: every
/// address of its CIDRs is excluded or is one no machine gets (network, broadcast, gateway).
/// Only `range` datacenters have such addresses; a large pool is never short of them.
pub fn no_machine_room(dc: &crate::planner::DatacenterInput) -> bool {
    if dc.machine_reserved.is_empty() {
        return false;
    }
    for cidr in dc.config.cidrs() {
        // At most a few reserved addresses and the exclusions: a CIDR wider than a /24 (v4)
        // always has room left, whatever the exclusions, only if they leave some; count.
        let Some(size) = cidr.size().to_u128() else {
            return false;
        };
        let inside = |r: &AddrRange| {
            let first = r.first().max(cidr.first());
            let last = r.last().min(cidr.last());
            (first <= last).then_some((first, last))
        };
        let mut taken: Vec<(u128, u128)> = dc
            .exclusions
            .iter()
            .chain(dc.machine_reserved.iter().map(|(r, _)| r))
            .filter(|r| r.family() == cidr.family())
            .filter_map(inside)
            .collect();
        taken.sort();
        let mut covered: u128 = 0;
        let mut upto: Option<u128> = None;
        for (first, last) in taken {
            let start = match upto {
                Some(u) if first <= u => u.saturating_add(1),
                _ => first,
            };
            if start <= last {
                covered = covered.saturating_add(last - start + 1);
            }
            upto = Some(upto.map_or(last, |u| u.max(last)));
        }
        if covered < size {
            return false;
        }
    }
    true
}

/// A Cluster's `status.adoption` from its adoption plan (lists cut to what the schema holds).
pub fn adoption_status(a: &ClusterAdoption) -> AdoptionStatus {
    use crate::planner::adopt::{AdoptState, Verdict, short};
    use crate::resources::bounds::{MAX_ADOPTION_ADDRESSES, MAX_ADOPTION_LINES};
    let lines = MAX_ADOPTION_LINES as usize;
    let reasons = match &a.state {
        AdoptState::Waiting(why) => vec![why.clone()],
        AdoptState::NeedsLook(why) => why.iter().take(lines).cloned().collect(),
        AdoptState::Ready => Vec::new(),
    };
    let served = a
        .served
        .iter()
        .take(MAX_ADOPTION_ADDRESSES as usize)
        .map(|s| {
            let (verdict, pool, with) = match &s.verdict {
                Verdict::Adopt { pool } => ("Adopt", Some(pool.clone()), Vec::new()),
                Verdict::Held { pool } => ("Held", Some(pool.clone()), Vec::new()),
                Verdict::Outside => ("Outside", None, Vec::new()),
                Verdict::Contested { pool, clusters } => {
                    ("Contested", Some(pool.clone()), clusters.clone())
                }
                Verdict::Taken { pool, holder } => {
                    ("Taken", Some(pool.clone()), vec![holder.clone()])
                }
                Verdict::Excluded { pool } => ("Excluded", Some(pool.clone()), Vec::new()),
            };
            AdoptionAddress {
                address: s.address.clone(),
                services: s.services.iter().take(16).cloned().collect(),
                verdict: verdict.into(),
                pool,
                with: with.into_iter().take(16).collect(),
            }
        })
        .collect();
    AdoptionStatus {
        mode: a.mode.as_str().into(),
        state: adoption_state(a).into(),
        reasons,
        served,
        served_total: i64::try_from(a.served.len()).unwrap_or(i64::MAX),
        hand_made_pools: a
            .hand_made
            .iter()
            .take(lines)
            .map(|h| AdoptionHandMadePool {
                namespace: h.namespace.clone(),
                name: h.name.clone(),
                addresses: h.addresses.clone(),
                pools: h.pools.clone(),
                outside: h.outside.clone(),
                taken_over_by: h.taken_over_by.clone(),
            })
            .collect(),
        conflicts: a
            .conflicts
            .iter()
            .take(lines)
            .map(|c| AdoptionConflict {
                with: c.with.clone(),
                kind: format!("{:?}", c.kind),
                addresses: c.addresses.clone(),
            })
            .collect(),
        adopt: a
            .adopt
            .iter()
            .map(|(pool, pieces)| crate::resources::AdoptionPool {
                pool: pool.clone(),
                addresses: pieces.iter().map(short).collect(),
            })
            .collect(),
    }
}

/// `Waiting`, `NeedsLook`, `DryRun`, `Adopting` (its hand-made MetalLB pools inside kipam's
/// pools not all taken over yet) or `Adopted`.
pub fn adoption_state(a: &ClusterAdoption) -> &'static str {
    use crate::planner::adopt::AdoptState;
    use crate::resources::AdoptMode;
    match (&a.state, a.mode) {
        (AdoptState::Waiting(_), _) => "Waiting",
        (AdoptState::NeedsLook(_), _) => "NeedsLook",
        (AdoptState::Ready, AdoptMode::Adopt) if a.hand_made.iter().all(|h| h.pools.is_empty()) => {
            "Adopted"
        }
        (AdoptState::Ready, AdoptMode::Adopt) => "Adopting",
        (AdoptState::Ready, _) => "DryRun",
    }
}

/// The `Adopted` condition: (true once adopted, reason, message).
pub fn adoption_condition(a: &ClusterAdoption) -> (bool, &'static str, String) {
    use crate::planner::adopt::{AdoptState, Verdict};
    let state = adoption_state(a);
    let count = |f: &dyn Fn(&Verdict) -> bool| a.served.iter().filter(|s| f(&s.verdict)).count();
    let adopt = count(&|v| matches!(v, Verdict::Adopt { .. } | Verdict::Held { .. }));
    let outside = count(&|v| matches!(v, Verdict::Outside));
    let served = a.served.len();
    let takeovers: Vec<String> = a
        .takeover
        .iter()
        .map(|(pool, t)| format!("pool {pool} takes over MetalLB pool {}", t.metallb_pool))
        .collect();
    let summary = format!(
        "the user cluster serves {served} address(es): {adopt} inside kipam's pools, {outside} outside every pool (left as they are){}",
        if takeovers.is_empty() {
            String::new()
        } else {
            format!("; {}", takeovers.join(", "))
        }
    );
    let message = match &a.state {
        AdoptState::Waiting(why) => format!("adoption waits: {why}"),
        AdoptState::NeedsLook(why) => format!("{summary}; needs a look: {}", why.join("; ")),
        AdoptState::Ready if state == "DryRun" => {
            format!("{summary}; dry run: set adopt to Adopt to take it over")
        }
        AdoptState::Ready => summary,
    };
    (state == "Adopted", state, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::AddressCount;
    use crate::allocator::PoolUsage;

    fn report(dc: &str, allocated: u64, total: u64) -> DatacenterReport {
        DatacenterReport {
            pool: "p".into(),
            datacenter: dc.into(),
            usage: PoolUsage {
                total: total.into(),
                allocated: allocated.into(),
                excluded: AddressCount::ZERO,
                available: (total - allocated).into(),
                allocations: 1,
                largest_free_block: (total - allocated).into(),
                fragmentation_percent: 0,
                quarantined: AddressCount::ZERO,
                shared: AddressCount::ZERO,
            },
            cidrs: Vec::new(),
        }
    }

    fn pool(name: &str, dcs: &[(&str, &str)]) -> PoolInput {
        use crate::allocator::{PoolConfig, PoolKind, Strategy};
        PoolInput {
            name: name.into(),
            reclaim_policy: Default::default(),
            datacenters: dcs
                .iter()
                .map(|(dc, cidr)| {
                    let config = PoolConfig::new(
                        cidr.parse().unwrap(),
                        PoolKind::Range {
                            allocation_range: 1,
                        },
                        Strategy::FirstFit,
                    );
                    (
                        dc.to_string(),
                        crate::planner::DatacenterInput {
                            config,
                            exclusions: vec![],
                            reuse_after: 0,
                            machine_reserved: vec![],
                            former: Vec::new(),
                        },
                    )
                })
                .collect(),
            address_space: String::new(),
        }
    }

    #[test]
    fn a_pool_whose_reserved_addresses_leave_no_machine_anything_is_told_apart() {
        use crate::allocator::{PoolKind, Strategy};
        let dc = |cidr: &str, excluded: &[&str]| {
            let config = crate::allocator::PoolConfig::new(
                cidr.parse().unwrap(),
                PoolKind::Range {
                    allocation_range: 1,
                },
                Strategy::FirstFit,
            );
            let settings: crate::resources::IPAMPoolDatacenter = serde_json::from_value(
                serde_json::json!({"type": "range", "poolCidr": cidr, "allocationRange": 1}),
            )
            .unwrap();
            crate::planner::DatacenterInput {
                machine_reserved: crate::validation::machine_reserved(&config, "dc", &settings),
                former: Vec::new(),
                config,
                exclusions: excluded.iter().map(|e| e.parse().unwrap()).collect(),
                reuse_after: 0,
            }
        };
        // A /30: network .0 and broadcast .3 reserved; .1 and .2 excluded leave nothing.
        assert!(no_machine_room(&dc("10.0.0.0/30", &["10.0.0.1-10.0.0.2"])));
        assert!(!no_machine_room(&dc("10.0.0.0/30", &["10.0.0.1"])));
        assert!(!no_machine_room(&dc("10.0.0.0/24", &[])));
        // A /31 has no network or broadcast address: both are hosts.
        assert!(!no_machine_room(&dc("10.0.0.0/31", &[])));
    }

    #[test]
    fn overlaps_within_a_datacenter_and_within_a_pool() {
        let pools = vec![
            pool("a", &[("dc-1", "10.0.0.0/24"), ("dc-2", "10.0.0.0/25")]),
            pool("b", &[("dc-1", "10.0.0.128/25"), ("dc-2", "10.9.0.0/24")]),
            pool("c", &[("dc-3", "10.0.0.0/24")]),
        ];
        let found = find_overlaps(&pools);
        let pairs: Vec<(String, String, String, String)> = found
            .iter()
            .map(|o| {
                (
                    o.pool.clone(),
                    o.datacenter.clone(),
                    o.other_pool.clone(),
                    o.other_datacenter.clone(),
                )
            })
            .collect();
        let s = |x: &str| x.to_string();
        assert_eq!(
            pairs,
            vec![
                (s("a"), s("dc-1"), s("a"), s("dc-2")),
                (s("a"), s("dc-1"), s("b"), s("dc-1")),
                (s("a"), s("dc-2"), s("a"), s("dc-1")),
                (s("b"), s("dc-1"), s("a"), s("dc-1")),
            ]
        );
        // c in dc-3 shares addresses with a but neither pool nor datacenter: not reported.
        let r = report("dc-1", 1, 100);
        let (status, events) = pool_status("b", None, Ok(()), &[&r], &found, &[], None, "t");
        assert!(is_true(&status.conditions, "Overlap"));
        assert_eq!(events.last().map(|e| e.reason.as_str()), Some("Overlap"));
    }

    #[test]
    fn thresholds_emit_events_only_when_crossed() {
        let r = report("dc-1", 72, 100);
        let (s1, e1) = pool_status("p", Some(1), Ok(()), &[&r], &[], &[], None, "t1");
        assert_eq!(e1.len(), 1);
        assert_eq!(e1[0].reason, "CapacityWarning");
        assert!(is_true(&s1.conditions, "CapacityWarning"));
        assert!(!is_true(&s1.conditions, "CapacityCritical"));
        // Same figures again: no event, same transition times.
        let (s2, e2) = pool_status("p", Some(1), Ok(()), &[&r], &[], &[], Some(&s1), "t2");
        assert!(e2.is_empty());
        assert_eq!(s1, s2);
        // Up to 96 %: critical and exhausted.
        let r = report("dc-1", 96, 100);
        let (s3, e3) = pool_status("p", Some(1), Ok(()), &[&r], &[], &[], Some(&s2), "t3");
        let reasons: Vec<&str> = e3.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(reasons, vec!["CapacityCritical", "CapacityExhausted"]);
        // Down to 10 %: all three cleared.
        let r = report("dc-1", 10, 100);
        let (s4, e4) = pool_status("p", Some(1), Ok(()), &[&r], &[], &[], Some(&s3), "t4");
        assert_eq!(e4.len(), 3);
        assert!(
            e4.iter()
                .all(|e| !e.warning && e.reason.ends_with("Cleared"))
        );
        assert!(!is_true(&s4.conditions, "CapacityWarning"));
        assert_eq!(s4.max_utilisation_percent, Some(10));
    }
}
