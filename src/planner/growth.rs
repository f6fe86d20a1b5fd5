//! Demand-driven growth: how many addresses a cluster should gain and which grown pieces it
//! should give back, from the demand its user cluster shows.
//!
//! Pure: the caller reads the user clusters and the stored allocations and gives the time.
//! The rules, and why there is nothing here to oscillate around:
//!
//! - **Demand** is a LoadBalancer Service MetalLB would serve from kipam's pool that has no
//!   address yet, and that MetalLB refused or that has waited at least `pending_grace`.
//! - **Supply in flight**: every address the cluster holds that no Service of the user cluster
//!   has taken counts as on its way to a waiting Service (the addon may not have reached the
//!   user cluster yet). A cluster grows by `demand - unused` addresses, rounded up to whole
//!   increments, so one waiting Service never causes two growths.
//! - **Caps**: no cluster passes its `max`; when the pool datacenter has fewer free addresses
//!   than the clusters ask for, the cluster whose oldest waiting Service waits longest is
//!   served first.
//! - **Shrink** gives back a grown piece only when none of its addresses has been taken for
//!   `shrinkAfter` without a break, no Service of the cluster waits, the user cluster could be
//!   read, and the cluster keeps at least its initial size. Initial and pinned pieces are
//!   never given back. A user cluster that cannot be read restarts every clock: nobody can
//!   tell whether its pieces were used meanwhile.

use std::collections::{BTreeMap, BTreeSet};

use super::{Change, Plan, PoolStates};
use crate::address::AddrRange;
use crate::allocator::{Allocation, Growth, PoolAllocator};
use crate::resources::PieceKind;

/// How a decision's message says a growth was for demand.
pub const GREW_FOR_DEMAND: &str = "for LoadBalancer Services waiting";

/// `shrinkAfter` when none is given: ten minutes.
pub const DEFAULT_SHRINK_AFTER: u64 = 600;

/// A pool datacenter's `growth`, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowthPolicy {
    /// Addresses per step, at least 1.
    pub increment: u128,
    /// Most addresses a cluster may hold, initial ones included.
    pub max: u128,
    /// Seconds a grown piece stays unused before it is given back.
    pub shrink_after: u64,
}

/// One cluster's `spec.ipam.<pool>.growth`, checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrowthOverride {
    /// `enabled: false`.
    pub disabled: bool,
    /// `max`, instead of the pool's.
    pub max: Option<u128>,
}

impl GrowthPolicy {
    /// The policy for one cluster: `None` when it must not grow. Its `max` is never below
    /// `initial` (a cluster's own `allocationRange` may exceed the pool's `max`).
    pub fn for_cluster(&self, ov: Option<&GrowthOverride>, initial: u128) -> Option<GrowthPolicy> {
        if ov.is_some_and(|o| o.disabled) {
            return None;
        }
        let max = ov.and_then(|o| o.max).unwrap_or(self.max).max(initial);
        Some(GrowthPolicy { max, ..*self })
    }
}

/// One piece a cluster holds, with what growth knows of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub range: AddrRange,
    pub kind: PieceKind,
    /// Grown pieces: when (seconds since the epoch).
    pub grown_at: Option<i64>,
    /// Grown pieces: since when none of its addresses is taken.
    pub unused_since: Option<i64>,
}

/// A recorded piece (`status.pieces`), times already in seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedPiece {
    pub addresses: String,
    pub kind: PieceKind,
    pub grown_at: Option<i64>,
    pub unused_since: Option<i64>,
}

/// The pieces of `held` (in order) with their kinds: pinned when the cluster pins its
/// addresses, grown when pieces the status records as grown cover it entirely (a piece may
/// come back from the pool record merged with its neighbours, so pieces are compared as
/// address sets; its clocks are then the most recent of those it is made of), initial
/// otherwise. A grown piece whose record was lost is taken as initial: it is kept for good
/// rather than risk giving back an address someone uses.
pub fn classify(held: &[AddrRange], recorded: &[RecordedPiece], pinned: bool) -> Vec<Piece> {
    let grown: Vec<(AddrRange, &RecordedPiece)> = recorded
        .iter()
        .filter(|r| r.kind == PieceKind::Grown)
        .filter_map(|r| AddrRange::parse_lenient(&r.addresses).ok().map(|a| (a, r)))
        .collect();
    held.iter()
        .map(|range| {
            let plain = |kind| Piece {
                range: *range,
                kind,
                grown_at: None,
                unused_since: None,
            };
            if pinned {
                return plain(PieceKind::Pinned);
            }
            let mut parts: Vec<&(AddrRange, &RecordedPiece)> =
                grown.iter().filter(|(a, _)| a.overlaps(range)).collect();
            parts.sort_by_key(|(a, _)| a.first());
            // Covered entirely, without a gap?
            let mut next = range.first();
            let mut covered = false;
            for (a, _) in &parts {
                if a.first() > next {
                    break;
                }
                if a.last() >= range.last() {
                    covered = true;
                    break;
                }
                next = a.last() + 1;
            }
            if !covered {
                return plain(PieceKind::Initial);
            }
            let grown_at = parts.iter().filter_map(|(_, r)| r.grown_at).max();
            let unused_since = if parts.iter().all(|(_, r)| r.unused_since.is_some()) {
                parts.iter().filter_map(|(_, r)| r.unused_since).max()
            } else {
                None
            };
            Piece {
                range: *range,
                kind: PieceKind::Grown,
                grown_at,
                unused_since,
            }
        })
        .collect()
}

/// A Service waiting for an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// `namespace/name`.
    pub service: String,
    /// When it was first seen waiting (seconds since the epoch).
    pub since: i64,
    /// MetalLB said it has no address for it (`AllocationFailed`).
    pub refused: bool,
}

/// What a user cluster shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// The user cluster could be read (its Services are known).
    pub known: bool,
    /// Services MetalLB would serve from kipam's pool that have no address yet.
    pub waiting: Vec<Waiting>,
    /// Every load-balancer address the user cluster's Services hold now.
    pub used: BTreeSet<u128>,
    /// Addresses some Service held at any moment since the last decision but holds no
    /// more (a Service deleted in between): they stop the unused clocks like `used`, but are
    /// free for waiting Services.
    pub touched: BTreeSet<u128>,
}

/// One cluster's allocation from one pool datacenter, as growth sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub cluster: String,
    pub pool: String,
    pub datacenter: String,
    /// What it holds, in order.
    pub pieces: Vec<Piece>,
    /// Its size without growth (`allocationRange`, or the cluster's own).
    pub initial: u128,
    /// `None`: it does not grow (no `growth`, turned off for it, or pinned). Grown pieces it
    /// holds still shrink when the pool datacenter has a `shrinkAfter` (`shrink_after`).
    pub policy: Option<GrowthPolicy>,
    /// The pool datacenter's `shrinkAfter` (seconds); `None`: grown pieces are kept.
    pub shrink_after: Option<u64>,
    pub demand: Demand,
}

/// Everything one decision needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrowthInput {
    pub holdings: Vec<Holding>,
    /// (pool, datacenter) -> free addresses there.
    pub free: BTreeMap<(String, String), u128>,
    /// Seconds a Service must wait, unrefused, before it counts as demand.
    pub pending_grace: i64,
    pub now: i64,
}

/// Why a cluster got less than its demand, or what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// Grew by this many addresses for these Services.
    Grew {
        addresses: u128,
        services: Vec<String>,
    },
    /// Gave back this grown piece.
    Shrank { piece: AddrRange, unused_since: i64 },
    /// The cluster is at its `max`: these Services stay without an address.
    MaxReached { max: u128, services: Vec<String> },
    /// The pool datacenter has no free address left for these Services.
    PoolFull { services: Vec<String> },
}

/// The decision for one holding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub cluster: String,
    pub pool: String,
    pub datacenter: String,
    /// Addresses to add (as new pieces).
    pub grow: u128,
    /// Grown pieces to give back.
    pub release: Vec<AddrRange>,
    /// The pieces after the decision's bookkeeping (unused clocks), before growth and release
    /// are applied.
    pub pieces: Vec<Piece>,
    /// Services that count as demand and have no address yet.
    pub unmet: Vec<String>,
    pub notes: Vec<Note>,
}

impl Outcome {
    /// Nothing to write but bookkeeping.
    pub fn changes_nothing(&self) -> bool {
        self.grow == 0 && self.release.is_empty()
    }
}

fn size(r: &AddrRange) -> u128 {
    r.size().to_u128().unwrap_or(u128::MAX)
}

fn used_in(range: &AddrRange, used: &BTreeSet<u128>) -> usize {
    used.range(range.first()..=range.last()).count()
}

/// Decides growth and shrink for every holding. See the module documentation.
pub fn decide(input: &GrowthInput) -> Vec<Outcome> {
    let now = input.now;
    // Per holding: (demand counted, unused held).
    let mut outcomes: Vec<Outcome> = Vec::with_capacity(input.holdings.len());
    // (index, oldest waiting since, wanted) of holdings that ask for more.
    let mut asks: Vec<(usize, i64, u128)> = Vec::new();
    for (i, h) in input.holdings.iter().enumerate() {
        let d = &h.demand;
        let mut waiting: Vec<&Waiting> = if d.known {
            d.waiting
                .iter()
                .filter(|w| w.refused || now.saturating_sub(w.since) >= input.pending_grace)
                .collect()
        } else {
            Vec::new()
        };
        waiting.sort_by(|a, b| (a.since, &a.service).cmp(&(b.since, &b.service)));
        let held: u128 = h.pieces.iter().map(|p| size(&p.range)).sum();
        let taken: u128 = h
            .pieces
            .iter()
            .map(|p| used_in(&p.range, &d.used) as u128)
            .sum();
        let unused = held.saturating_sub(taken);
        // Bookkeeping of the unused clocks.
        let pieces: Vec<Piece> = h
            .pieces
            .iter()
            .map(|p| {
                let mut p = p.clone();
                if p.kind == PieceKind::Grown {
                    let touched =
                        used_in(&p.range, &d.used) > 0 || used_in(&p.range, &d.touched) > 0;
                    p.unused_since = if !d.known || touched {
                        None
                    } else {
                        Some(p.unused_since.unwrap_or(now))
                    };
                }
                p
            })
            .collect();
        let mut outcome = Outcome {
            cluster: h.cluster.clone(),
            pool: h.pool.clone(),
            datacenter: h.datacenter.clone(),
            grow: 0,
            release: Vec::new(),
            pieces,
            unmet: waiting.iter().map(|w| w.service.clone()).collect(),
            notes: Vec::new(),
        };
        let demand = waiting.len() as u128;
        if let Some(policy) = &h.policy
            && demand > unused
        {
            let need = demand - unused;
            let steps = need.div_ceil(policy.increment.max(1));
            let wanted = steps.saturating_mul(policy.increment.max(1));
            let room = policy.max.saturating_sub(held);
            let capped = wanted.min(room);
            if capped < need {
                let short = (need - capped) as usize;
                let services = waiting[waiting.len().saturating_sub(short)..]
                    .iter()
                    .map(|w| w.service.clone())
                    .collect();
                outcome.notes.push(Note::MaxReached {
                    max: policy.max,
                    services,
                });
            }
            if capped > 0 {
                asks.push((i, waiting[0].since, capped));
            }
        }
        // Shrink: only with nobody waiting, a readable cluster, and the size kept.
        if d.known
            && waiting.is_empty()
            && d.waiting.is_empty()
            && let Some(after) = h.shrink_after
        {
            let mut remaining = held;
            for p in &outcome.pieces {
                let Some(since) = p.unused_since else {
                    continue;
                };
                if p.kind != PieceKind::Grown
                    || now.saturating_sub(since) < after as i64
                    || remaining.saturating_sub(size(&p.range)) < h.initial
                {
                    continue;
                }
                remaining -= size(&p.range);
                outcome.release.push(p.range);
                outcome.notes.push(Note::Shrank {
                    piece: p.range,
                    unused_since: since,
                });
            }
        }
        outcomes.push(outcome);
    }
    // Oldest waiting Service first across clusters when the pool is short.
    asks.sort_by(|a, b| {
        (a.1, &input.holdings[a.0].cluster).cmp(&(b.1, &input.holdings[b.0].cluster))
    });
    let mut free = input.free.clone();
    for (i, _, wanted) in asks {
        let h = &input.holdings[i];
        let key = (h.pool.clone(), h.datacenter.clone());
        let available = free.get(&key).copied().unwrap_or(0);
        let given = wanted.min(available);
        if let Some(f) = free.get_mut(&key) {
            *f -= given;
        }
        let outcome = &mut outcomes[i];
        if given < wanted {
            outcome.notes.push(Note::PoolFull {
                services: outcome.unmet.clone(),
            });
        }
        if given > 0 {
            outcome.grow = given;
            outcome.notes.push(Note::Grew {
                addresses: given,
                services: outcome.unmet.clone(),
            });
        }
    }
    outcomes
}

/// What applying one [`Outcome`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub cluster: String,
    pub pool: String,
    pub datacenter: String,
    /// What the cluster holds now.
    pub held: Allocation,
    /// What it held before.
    pub previous: Allocation,
    /// Pieces added (grown).
    pub added: Vec<AddrRange>,
    /// Grown pieces given back.
    pub released: Vec<AddrRange>,
    /// Every piece held now, with its kind and clocks: what `status.pieces` records.
    pub pieces: Vec<Piece>,
}

/// Gives back `outcome.release` and then grows by `outcome.grow` in `allocator`, where
/// `outcome.cluster` holds a range allocation. On any error the allocator is left as it was.
/// A released piece must be one the cluster holds whole and that the outcome calls grown.
pub fn apply_outcome(
    allocator: &mut PoolAllocator,
    outcome: &Outcome,
    now: i64,
) -> Result<Applied, String> {
    let cluster = outcome.cluster.as_str();
    let Some(Allocation::Range(current)) = allocator.get(cluster).cloned() else {
        return Err(format!("{cluster} holds no range allocation here"));
    };
    let previous = Allocation::Range(current.clone());
    for r in &outcome.release {
        let grown = outcome
            .pieces
            .iter()
            .any(|p| p.range == *r && p.kind == PieceKind::Grown);
        if !grown || !current.contains(r) {
            return Err(format!("{r} is not a grown piece of {cluster}"));
        }
    }
    let kept: Vec<AddrRange> = current
        .iter()
        .filter(|p| !outcome.release.contains(p))
        .copied()
        .collect();
    if kept.is_empty() {
        return Err(format!("{cluster} would hold nothing"));
    }
    if !outcome.release.is_empty() {
        allocator.release(cluster);
        if let Err(e) = allocator.load(cluster, Allocation::Range(kept.clone())) {
            // Nothing else moved since: put back what it held.
            let _ = allocator.load(cluster, previous.clone());
            return Err(e.to_string());
        }
    }
    let mut added = Vec::new();
    if outcome.grow > 0 {
        let held: u128 = kept.iter().map(size).sum();
        match allocator.grow(cluster, held.saturating_add(outcome.grow)) {
            Ok(Growth::Appended(pieces)) => added = pieces,
            Ok(Growth::Unchanged) => {}
            Err(e) => {
                allocator.release(cluster);
                let _ = allocator.load(cluster, previous.clone());
                return Err(e.to_string());
            }
        }
    }
    let Some(held) = allocator.get(cluster).cloned() else {
        return Err(format!("{cluster} lost its allocation"));
    };
    if let Allocation::Range(p) = &held
        && p.len() > crate::resources::bounds::MAX_ALLOCATION_PIECES as usize
    {
        allocator.release(cluster);
        let _ = allocator.load(cluster, previous.clone());
        return Err(format!(
            "the pool is so fragmented that growing would take {} pieces, more than an IPAMAllocation holds",
            p.len()
        ));
    }
    let mut pieces: Vec<Piece> = outcome
        .pieces
        .iter()
        .filter(|p| kept.contains(&p.range))
        .cloned()
        .collect();
    pieces.extend(added.iter().map(|r| Piece {
        range: *r,
        kind: PieceKind::Grown,
        grown_at: Some(now),
        unused_since: Some(now),
    }));
    Ok(Applied {
        cluster: outcome.cluster.clone(),
        pool: outcome.pool.clone(),
        datacenter: outcome.datacenter.clone(),
        held,
        previous,
        added,
        released: outcome.release.clone(),
        pieces,
    })
}

/// Applies growth outcomes to a plan and the allocators it ended with (`states`, from
/// [`super::plan_keeping`] or its incremental forms): each outcome that changes something,
/// for a (cluster, pool) the plan keeps as it is, turns its decision into `Grow` (pieces
/// added, and possibly some given back) or `Shrink` (only given back). Decisions the plan
/// changes anyway (created, failed, released, in conflict...) are left alone: growth waits
/// for the next pass. Every growth is applied before any piece is given back. Returns what
/// was applied and, for outcomes that could not be, why.
///
/// A grown piece given back follows its pool datacenter's quarantine: where `reuse_after`
/// (pool, datacenter) is above zero, the piece is set aside for the cluster and listed in
/// `plan.quarantined`, so the fenced commit records it and nobody else gets it before the
/// period ends.
pub fn apply(
    plan: &mut Plan,
    states: &mut PoolStates,
    outcomes: &[Outcome],
    now: i64,
    reuse_after: &dyn Fn(&str, &str) -> u64,
) -> (Vec<Applied>, Vec<(Outcome, String)>) {
    let mut applied = Vec::new();
    let mut refused = Vec::new();
    // Growths first, then what is given back: an address given back in this pass is never
    // handed to another cluster in the same pass (its user cluster may still list it until
    // the shrunk allocation reaches it).
    let growths = outcomes.iter().filter(|o| o.grow > 0);
    let shrinks = outcomes
        .iter()
        .filter(|o| o.grow == 0 && !o.release.is_empty());
    for outcome in growths.chain(shrinks) {
        // The plan is sorted by (cluster, pool).
        let Ok(at) = plan.decisions.binary_search_by(|d| {
            (d.cluster.as_str(), d.pool.as_str())
                .cmp(&(outcome.cluster.as_str(), outcome.pool.as_str()))
        }) else {
            continue;
        };
        let d = &mut plan.decisions[at];
        if d.change != Change::Keep || d.datacenter != outcome.datacenter {
            continue;
        }
        let Some(allocator) = states.allocator_mut(&outcome.pool, &outcome.datacenter) else {
            continue;
        };
        match apply_outcome(allocator, outcome, now) {
            Ok(a) => {
                if !a.released.is_empty() && reuse_after(&a.pool, &a.datacenter) > 0 {
                    allocator.set_aside(
                        &super::spaces::quarantine_tag(&a.cluster),
                        crate::allocator::Aside::Quarantined,
                        a.released.iter().copied(),
                    );
                    plan.quarantined.push(super::Quarantined {
                        pool: a.pool.clone(),
                        datacenter: a.datacenter.clone(),
                        holder: a.cluster.clone(),
                        released_at: now,
                        addresses: super::spaces::merged(a.released.clone()),
                    });
                    plan.quarantined.sort();
                }
                let mut words = Vec::new();
                if !a.added.is_empty() {
                    let waiting = outcome
                        .notes
                        .iter()
                        .find_map(|n| match n {
                            Note::Grew { services, .. } => Some(services.as_slice()),
                            _ => None,
                        })
                        .unwrap_or_default();
                    words.push(format!(
                        "grew by {} {GREW_FOR_DEMAND}: {}",
                        list(&a.added),
                        some(waiting)
                    ));
                }
                if !a.released.is_empty() {
                    words.push(format!("gave back unused {}", list(&a.released)));
                }
                d.change = if a.added.is_empty() {
                    Change::Shrink
                } else {
                    Change::Grow
                };
                d.previous = Some(a.previous.clone());
                d.held = Some(a.held.clone());
                d.message = words.join("; ");
                applied.push(a);
            }
            Err(why) => refused.push((outcome.clone(), why)),
        }
    }
    if !applied.is_empty() {
        let touched: BTreeSet<(String, String)> = applied
            .iter()
            .map(|a| (a.pool.clone(), a.datacenter.clone()))
            .collect();
        for (key, report) in plan.usage.iter_mut() {
            if touched.contains(key)
                && let Some(allocator) = states.allocator_mut(&key.0, &key.1)
            {
                report.usage = allocator.usage();
            }
        }
    }
    (applied, refused)
}

/// The first few names of a list, and how many more.
pub fn some(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

fn list(pieces: &[AddrRange]) -> String {
    pieces
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Family;

    fn r(first: u128, last: u128) -> AddrRange {
        AddrRange::new(Family::V4, first, last).unwrap()
    }

    fn holding(pieces: Vec<Piece>, waiting: &[(&str, i64, bool)], used: &[u128]) -> Holding {
        Holding {
            cluster: "c1".into(),
            pool: "metallb".into(),
            datacenter: "dc".into(),
            pieces,
            initial: 2,
            policy: Some(GrowthPolicy {
                increment: 2,
                max: 8,
                shrink_after: 600,
            }),
            shrink_after: Some(600),
            demand: Demand {
                known: true,
                waiting: waiting
                    .iter()
                    .map(|(s, since, refused)| Waiting {
                        service: s.to_string(),
                        since: *since,
                        refused: *refused,
                    })
                    .collect(),
                used: used.iter().copied().collect(),
                touched: BTreeSet::new(),
            },
        }
    }

    fn initial(first: u128, last: u128) -> Piece {
        Piece {
            range: r(first, last),
            kind: PieceKind::Initial,
            grown_at: None,
            unused_since: None,
        }
    }

    fn input(holdings: Vec<Holding>, free: u128, now: i64) -> GrowthInput {
        GrowthInput {
            holdings,
            free: BTreeMap::from([(("metallb".into(), "dc".into()), free)]),
            pending_grace: 5,
            now,
        }
    }

    #[test]
    fn a_refused_service_grows_one_increment_once() {
        let h = holding(vec![initial(0, 1)], &[("default/web", 100, true)], &[0, 1]);
        let out = decide(&input(vec![h.clone()], 10, 100));
        assert_eq!(out[0].grow, 2);
        assert!(
            matches!(&out[0].notes[0], Note::Grew { addresses: 2, services } if services == &["default/web".to_string()])
        );
        // Grown, not yet taken: the same waiting Service asks for nothing more.
        let mut grown = h;
        grown.pieces.push(Piece {
            range: r(2, 3),
            kind: PieceKind::Grown,
            grown_at: Some(100),
            unused_since: None,
        });
        let out = decide(&input(vec![grown], 8, 101));
        assert_eq!(out[0].grow, 0, "{:?}", out[0]);
    }

    #[test]
    fn unrefused_services_wait_out_the_grace_and_many_take_several_increments() {
        let waiting = [
            ("a/1", 100, false),
            ("a/2", 100, false),
            ("a/3", 100, false),
        ];
        let h = holding(vec![initial(0, 1)], &waiting, &[0, 1]);
        assert_eq!(decide(&input(vec![h.clone()], 10, 103))[0].grow, 0);
        assert_eq!(decide(&input(vec![h], 10, 105))[0].grow, 4);
    }

    #[test]
    fn max_and_a_full_pool_are_named() {
        let waiting: Vec<(String, i64, bool)> = (0..10)
            .map(|i| (format!("a/s{i}"), 100 + i, true))
            .collect();
        let waiting: Vec<(&str, i64, bool)> = waiting
            .iter()
            .map(|(s, t, f)| (s.as_str(), *t, *f))
            .collect();
        let h = holding(vec![initial(0, 1)], &waiting, &[0, 1]);
        let out = decide(&input(vec![h.clone()], 100, 200));
        assert_eq!(out[0].grow, 6, "up to max 8");
        let max = out[0]
            .notes
            .iter()
            .find_map(|n| match n {
                Note::MaxReached { services, .. } => Some(services.clone()),
                _ => None,
            })
            .unwrap();
        assert_eq!(max, vec!["a/s6", "a/s7", "a/s8", "a/s9"]);
        let out = decide(&input(vec![h], 3, 200));
        assert_eq!(out[0].grow, 3);
        assert!(
            out[0]
                .notes
                .iter()
                .any(|n| matches!(n, Note::PoolFull { .. }))
        );
    }

    #[test]
    fn oldest_waiting_first_when_the_pool_is_short() {
        let mut young = holding(vec![initial(0, 1)], &[("a/young", 150, true)], &[0, 1]);
        young.cluster = "a-young".into();
        let mut old = holding(vec![initial(2, 3)], &[("a/old", 100, true)], &[2, 3]);
        old.cluster = "z-old".into();
        let out = decide(&input(vec![young, old], 2, 200));
        assert_eq!(out[0].grow, 0);
        assert_eq!(out[1].grow, 2);
    }

    #[test]
    fn shrink_waits_for_sustained_absence_and_keeps_initial_and_pinned() {
        let grown = Piece {
            range: r(2, 3),
            kind: PieceKind::Grown,
            grown_at: Some(0),
            unused_since: None,
        };
        let h = holding(vec![initial(0, 1), grown.clone()], &[], &[]);
        let out = decide(&input(vec![h.clone()], 0, 1000));
        assert!(out[0].release.is_empty());
        assert_eq!(out[0].pieces[1].unused_since, Some(1000));
        assert_eq!(
            out[0].pieces[0].unused_since, None,
            "initial pieces keep no clock"
        );
        let mut later = h.clone();
        later.pieces = out[0].pieces.clone();
        assert!(
            decide(&input(vec![later.clone()], 0, 1599))[0]
                .release
                .is_empty()
        );
        assert_eq!(
            decide(&input(vec![later.clone()], 0, 1600))[0].release,
            vec![r(2, 3)]
        );
        // Used once in between: the clock starts again.
        let mut used = later.clone();
        used.demand.used.insert(3);
        let out = decide(&input(vec![used], 0, 1300));
        assert_eq!(out[0].pieces[1].unused_since, None);
        // A waiting Service holds every piece.
        let mut waiting = later.clone();
        waiting.demand.waiting.push(Waiting {
            service: "a/b".into(),
            since: 1600,
            refused: false,
        });
        assert!(decide(&input(vec![waiting], 0, 1601))[0].release.is_empty());
        // An unreadable user cluster restarts the clock.
        let mut unknown = later;
        unknown.demand.known = false;
        let out = decide(&input(vec![unknown], 0, 5000));
        assert!(out[0].release.is_empty());
        assert_eq!(out[0].pieces[1].unused_since, None);
    }

    #[test]
    fn a_piece_given_back_is_not_grown_into_in_the_same_pass() {
        use crate::allocator::{PoolConfig, PoolKind, Request, Strategy};
        use crate::planner::{Change, Decision, Plan, PoolStates};
        let cidr: crate::address::Cidr = "0.0.0.0/30".parse().unwrap();
        let mut a = PoolAllocator::new(PoolConfig::new(
            cidr,
            PoolKind::Range {
                allocation_range: 1,
            },
            Strategy::FirstFit,
        ))
        .unwrap();
        a.allocate("a", Request::Addresses(1)).unwrap();
        a.allocate("b", Request::Addresses(1)).unwrap();
        a.grow("a", 2).unwrap(); // a: .0, .2 (grown)
        a.grow("b", 2).unwrap(); // b: .1, .3
        let keep = |c: &str, held: Allocation| Decision {
            cluster: c.into(),
            pool: "p".into(),
            datacenter: "dc".into(),
            type_: crate::resources::AllocationType::Range,
            change: Change::Keep,
            held: Some(held),
            previous: None,
            message: String::new(),
        };
        let mut plan = Plan {
            decisions: vec![
                keep("a", a.get("a").cloned().unwrap()),
                keep("b", a.get("b").cloned().unwrap()),
            ],
            usage: Default::default(),
            quarantined: Vec::new(),
        };
        let mut states = PoolStates::single("p", "dc", a);
        let grown = |range| Piece {
            range,
            kind: PieceKind::Grown,
            grown_at: Some(0),
            unused_since: Some(0),
        };
        let outcome = |c: &str, grow, release: Vec<AddrRange>, pieces| Outcome {
            cluster: c.into(),
            pool: "p".into(),
            datacenter: "dc".into(),
            grow,
            release,
            pieces,
            unmet: vec![],
            notes: vec![],
        };
        // a gives back 0.0.0.2 (listed first), b asks for one more: the pool has none
        // left in this pass.
        let outcomes = [
            outcome("a", 0, vec![r(2, 2)], vec![initial(0, 0), grown(r(2, 2))]),
            outcome("b", 1, vec![], vec![initial(1, 1), grown(r(3, 3))]),
        ];
        let (applied, refused) =
            apply(&mut plan, &mut states, &outcomes, 10, &|_: &str, _: &str| 0);
        assert_eq!(applied.len(), 1, "{applied:?}");
        assert_eq!(applied[0].cluster, "a");
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0.cluster, "b");
    }

    #[test]
    fn classify_trusts_only_recorded_grown_pieces() {
        let held = [r(0, 1), r(2, 3), r(8, 9)];
        let recorded = [RecordedPiece {
            addresses: r(2, 3).to_string(),
            kind: PieceKind::Grown,
            grown_at: Some(5),
            unused_since: Some(7),
        }];
        let pieces = classify(&held, &recorded, false);
        let kinds: Vec<PieceKind> = pieces.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [PieceKind::Initial, PieceKind::Grown, PieceKind::Initial]
        );
        assert_eq!(pieces[1].unused_since, Some(7));
        // Two grown pieces that come back merged are still grown, with the later clock;
        // a piece only partly recorded as grown is not.
        let two = [
            RecordedPiece {
                addresses: r(2, 3).to_string(),
                kind: PieceKind::Grown,
                grown_at: Some(5),
                unused_since: Some(7),
            },
            RecordedPiece {
                addresses: r(4, 5).to_string(),
                kind: PieceKind::Grown,
                grown_at: Some(6),
                unused_since: Some(9),
            },
        ];
        let merged = classify(&[r(2, 5), r(2, 6)], &two, false);
        assert_eq!(merged[0].kind, PieceKind::Grown);
        assert_eq!(merged[0].unused_since, Some(9));
        assert_eq!(merged[1].kind, PieceKind::Initial);
        assert!(
            classify(&held, &recorded, true)
                .iter()
                .all(|p| p.kind == PieceKind::Pinned)
        );
    }
}
