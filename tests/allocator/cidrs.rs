//! Pools of several CIDRs (`poolCidr` and `additionalCidrs`): the fill order, the edges
//! between CIDRs, and random sequences checked against a model with one slot per address.

use std::collections::BTreeSet;

use proptest::prelude::*;

use kipam::address::{AddrRange, AddressCount, Cidr};
use kipam::allocator::{Allocation, PoolAllocator, PoolConfig, PoolKind, Request, Strategy as Fit};

use super::range;

fn cidr(text: &str) -> Cidr {
    text.parse().expect("test CIDR")
}

fn pool(cidrs: &[&str], kind: PoolKind, strategy: Fit) -> PoolAllocator {
    let first = cidr(cidrs[0]);
    let more = cidrs[1..].iter().map(|c| cidr(c)).collect();
    PoolAllocator::new(PoolConfig::new(first, kind, strategy).with_additional(more))
        .expect("valid pool")
}

fn ranges(pool: &mut PoolAllocator, owner: &str, n: u128) -> Vec<String> {
    match pool.allocate(owner, Request::Addresses(n)) {
        Ok(Allocation::Range(pieces)) => pieces.iter().map(|p| p.to_string()).collect(),
        other => panic!("{owner}: {other:?}"),
    }
}

#[test]
fn the_first_cidr_is_filled_before_the_next_is_touched() {
    // The additional CIDR lies *below* poolCidr: order, not address, decides.
    let kind = PoolKind::Range {
        allocation_range: 4,
    };
    for strategy in [Fit::FirstFit, Fit::BestFit] {
        let mut p = pool(&["10.0.1.0/29", "10.0.0.0/29"], kind, strategy);
        assert_eq!(ranges(&mut p, "a", 4), ["10.0.1.0-10.0.1.3"], "{strategy}");
        assert_eq!(ranges(&mut p, "b", 4), ["10.0.1.4-10.0.1.7"], "{strategy}");
        assert_eq!(ranges(&mut p, "c", 4), ["10.0.0.0-10.0.0.3"], "{strategy}");
    }
}

#[test]
fn range_pieces_never_span_a_gap_but_join_across_adjacent_cidrs() {
    let kind = PoolKind::Range {
        allocation_range: 6,
    };
    // A gap between the CIDRs: two pieces, one in each.
    let mut gap = pool(&["10.0.0.0/30", "10.0.0.8/30"], kind, Fit::FirstFit);
    assert_eq!(
        ranges(&mut gap, "a", 6),
        ["10.0.0.0-10.0.0.3", "10.0.0.8-10.0.0.9"]
    );
    // Adjacent CIDRs in address order: one piece across their edge.
    let mut adjacent = pool(&["10.0.0.0/30", "10.0.0.4/30"], kind, Fit::FirstFit);
    assert_eq!(ranges(&mut adjacent, "a", 6), ["10.0.0.0-10.0.0.5"]);
    // BestFit looks for one block inside one CIDR; when none holds it, it fills like FirstFit.
    let mut best = pool(&["10.0.0.0/30", "10.0.0.4/30"], kind, Fit::BestFit);
    assert_eq!(ranges(&mut best, "a", 6), ["10.0.0.0-10.0.0.5"]);
    let mut best = pool(&["10.0.0.0/30", "10.0.0.8/29"], kind, Fit::BestFit);
    assert_eq!(ranges(&mut best, "a", 6), ["10.0.0.8-10.0.0.13"]);
}

#[test]
fn best_fit_takes_the_smallest_block_of_the_first_cidr_that_can_hold_it() {
    let kind = PoolKind::Range {
        allocation_range: 2,
    };
    let mut p = pool(&["10.0.0.0/28", "10.0.1.0/30"], kind, Fit::BestFit);
    // poolCidr: holes of 3 (10.0.0.0-2) and 12 (10.0.0.4-15) addresses.
    p.pin("hole", Allocation::Range(vec![range("10.0.0.3")]))
        .unwrap();
    // The second CIDR has a block of 4, smaller than 12, but the first CIDR comes first.
    assert_eq!(ranges(&mut p, "a", 3), ["10.0.0.0-10.0.0.2"]);
    assert_eq!(ranges(&mut p, "b", 4), ["10.0.0.4-10.0.0.7"]);
}

#[test]
fn prefix_subnets_are_aligned_inside_one_cidr() {
    let kind = PoolKind::Prefix {
        allocation_prefix: 29,
    };
    // The second CIDR is smaller than a /29: it never holds one.
    let mut p = pool(
        &["10.0.0.0/29", "10.0.5.0/30", "10.0.9.0/28"],
        kind,
        Fit::FirstFit,
    );
    let got: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|o| match p.allocate(o, Request::Prefix(29)) {
            Ok(a) => a.to_string(),
            Err(e) => e.to_string(),
        })
        .collect();
    assert_eq!(got[0], "10.0.0.0/29");
    assert_eq!(got[1], "10.0.9.0/29");
    assert_eq!(got[2], "10.0.9.8/29");
    assert!(p.allocate("d", Request::Prefix(29)).is_err());
    // Two adjacent /30s make up an aligned /29 together, but it lies inside neither of them:
    // never handed out.
    let mut q = pool(
        &["10.0.1.0/29", "10.0.0.8/30", "10.0.0.12/30"],
        kind,
        Fit::FirstFit,
    );
    assert_eq!(
        q.allocate("a", Request::Prefix(29)).unwrap().to_string(),
        "10.0.1.0/29"
    );
    assert!(q.allocate("b", Request::Prefix(29)).is_err());
    assert_eq!(
        q.allocate("c", Request::Prefix(30)).unwrap().to_string(),
        "10.0.0.8/30"
    );
}

#[test]
fn exclusions_and_pins_may_lie_in_any_cidr_but_not_in_a_gap() {
    let kind = PoolKind::Range {
        allocation_range: 1,
    };
    let mut p = pool(&["10.0.0.0/30", "10.0.1.0/30"], kind, Fit::FirstFit);
    p.exclude(range("10.0.1.0-10.0.1.1"))
        .expect("inside the second CIDR");
    assert!(p.exclude(range("10.0.0.2-10.0.1.0")).is_err(), "a gap");
    p.pin("a", Allocation::Range(vec![range("10.0.1.3")]))
        .expect("a pin in the second CIDR");
    assert!(
        p.pin("b", Allocation::Range(vec![range("10.0.0.200")]))
            .is_err()
    );
    let usage = p.usage();
    assert_eq!(usage.total, AddressCount::from(8u64));
    assert_eq!(usage.excluded, AddressCount::from(2u64));
    let per: Vec<(String, AddressCount, AddressCount, AddressCount)> = p
        .cidr_usage()
        .iter()
        .map(|c| (c.cidr.to_string(), c.allocated, c.excluded, c.available))
        .collect();
    assert_eq!(
        per,
        vec![
            ("10.0.0.0/30".into(), 0u64.into(), 0u64.into(), 4u64.into()),
            ("10.0.1.0/30".into(), 1u64.into(), 2u64.into(), 1u64.into()),
        ]
    );
}

#[test]
fn overlapping_or_mixed_family_cidrs_are_refused() {
    let kind = PoolKind::Range {
        allocation_range: 1,
    };
    for more in ["10.0.0.128/25", "2001:db8::/64"] {
        let config = PoolConfig::new(cidr("10.0.0.0/24"), kind, Fit::FirstFit)
            .with_additional(vec![cidr(more)]);
        let e = PoolAllocator::new(config).expect_err(more);
        assert!(e.to_string().contains("additionalCidrs"), "{e}");
    }
}

// ---- random sequences against a model -------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Allocate { owner: u8, size: u32 },
    Grow { owner: u8, size: u32 },
    Release { owner: u8 },
    Exclude { cidr: usize, offset: u32, size: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u8..10, 1u32..24).prop_map(|(owner, size)| Op::Allocate { owner, size }),
        1 => (0u8..10, 1u32..40).prop_map(|(owner, size)| Op::Grow { owner, size }),
        2 => (0u8..10).prop_map(|owner| Op::Release { owner }),
        1 => (0usize..8, 0u32..32, 1u32..6)
            .prop_map(|(cidr, offset, size)| Op::Exclude { cidr, offset, size }),
    ]
}

/// Up to six CIDRs in 10.0.0.0/22, at the start or the end of distinct 32-address chunks (so
/// some are adjacent and some are not), in random fill order.
fn cidrs() -> impl Strategy<Value = Vec<Cidr>> {
    proptest::collection::vec((0u32..32, 2u32..=5, any::<bool>(), any::<u16>()), 1..=6).prop_map(
        |mut picks| {
            picks.sort_by_key(|p| p.0);
            picks.dedup_by_key(|p| p.0);
            picks.sort_by_key(|p| p.3);
            picks
                .into_iter()
                .map(|(chunk, host, at_end, _)| {
                    let size = 1u128 << host;
                    let offset = if at_end { 32 - size } else { 0 };
                    let first = 0x0a00_0000u128 + u128::from(chunk) * 32 + offset;
                    Cidr::new(kipam::address::Family::V4, first, (32 - host) as u8).unwrap()
                })
                .collect()
        },
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slot {
    Free,
    Excluded,
    Held(u8),
}

/// One slot per address, CIDR by CIDR in fill order.
struct Model {
    cidrs: Vec<(Cidr, Vec<Slot>)>,
}

impl Model {
    fn new(cidrs: &[Cidr]) -> Model {
        Model {
            cidrs: cidrs
                .iter()
                .map(|c| (*c, vec![Slot::Free; c.size().to_u128().unwrap() as usize]))
                .collect(),
        }
    }

    fn free(&self) -> usize {
        self.cidrs
            .iter()
            .map(|(_, s)| s.iter().filter(|x| **x == Slot::Free).count())
            .sum()
    }

    /// Free runs of one CIDR as (start index, length).
    fn runs(slots: &[Slot]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < slots.len() {
            if slots[i] == Slot::Free {
                let start = i;
                while i < slots.len() && slots[i] == Slot::Free {
                    i += 1;
                }
                out.push((start, i - start));
            } else {
                i += 1;
            }
        }
        out
    }

    /// The addresses a range request of `count` takes.
    fn range(&self, count: usize, best_fit: bool) -> Option<BTreeSet<u128>> {
        if self.free() < count {
            return None;
        }
        if best_fit {
            for (c, slots) in &self.cidrs {
                let mut fitting: Vec<(usize, usize)> = Model::runs(slots)
                    .into_iter()
                    .filter(|(_, len)| *len >= count)
                    .collect();
                fitting.sort_by_key(|(start, len)| (*len, *start));
                if let Some((start, _)) = fitting.first() {
                    return Some(
                        (0..count)
                            .map(|i| c.first() + (start + i) as u128)
                            .collect(),
                    );
                }
            }
        }
        let mut out = BTreeSet::new();
        for (c, slots) in &self.cidrs {
            for (i, s) in slots.iter().enumerate() {
                if out.len() == count {
                    return Some(out);
                }
                if *s == Slot::Free {
                    out.insert(c.first() + i as u128);
                }
            }
        }
        Some(out)
    }

    fn set(&mut self, addresses: &BTreeSet<u128>, slot: Slot) {
        for (c, slots) in &mut self.cidrs {
            for a in addresses {
                if *a >= c.first() && *a <= c.last() {
                    slots[(a - c.first()) as usize] = slot;
                }
            }
        }
    }

    fn held_by(&self, owner: u8) -> BTreeSet<u128> {
        let mut out = BTreeSet::new();
        for (c, slots) in &self.cidrs {
            for (i, s) in slots.iter().enumerate() {
                if *s == Slot::Held(owner) {
                    out.insert(c.first() + i as u128);
                }
            }
        }
        out
    }
}

fn addresses(a: &Allocation) -> BTreeSet<u128> {
    a.ranges().flat_map(|r| r.first()..=r.last()).collect()
}

fn check(pool: &PoolAllocator, model: &Model) -> Result<(), TestCaseError> {
    // Every holder holds exactly what the model says, nothing outside the CIDRs, no overlap.
    let mut seen = BTreeSet::new();
    for (owner, allocation) in pool.allocations() {
        let n: u8 = owner.trim_start_matches('c').parse().unwrap();
        let got = addresses(allocation);
        prop_assert_eq!(&got, &model.held_by(n), "holder {}", owner);
        for a in &got {
            prop_assert!(seen.insert(*a), "{} held twice", a);
        }
        for piece in allocation.ranges() {
            // A piece never crosses a gap: each of its addresses lies in some CIDR.
            let inside = (piece.first()..=piece.last()).all(|a| {
                model
                    .cidrs
                    .iter()
                    .any(|(c, _)| a >= c.first() && a <= c.last())
            });
            prop_assert!(inside, "{} crosses a gap", piece);
        }
    }
    let usage = pool.usage();
    let per = pool.cidr_usage();
    prop_assert_eq!(per.len(), model.cidrs.len());
    let mut total = AddressCount::ZERO;
    let mut largest = AddressCount::ZERO;
    for (u, (c, slots)) in per.iter().zip(&model.cidrs) {
        prop_assert_eq!(u.cidr, *c);
        let count = |want: fn(&Slot) -> bool| {
            AddressCount::from(slots.iter().filter(|s| want(s)).count() as u64)
        };
        prop_assert_eq!(u.available, count(|s| *s == Slot::Free));
        prop_assert_eq!(u.excluded, count(|s| *s == Slot::Excluded));
        prop_assert_eq!(u.allocated, count(|s| matches!(s, Slot::Held(_))));
        let run = Model::runs(slots).iter().map(|r| r.1).max().unwrap_or(0);
        prop_assert_eq!(u.largest_free_block, AddressCount::from(run as u64));
        total = total.saturating_add(u.total);
        largest = largest.max(u.largest_free_block);
    }
    prop_assert_eq!(usage.total, total);
    prop_assert_eq!(usage.largest_free_block, largest);
    prop_assert_eq!(usage.available, AddressCount::from(model.free() as u64));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// FirstFit and BestFit over several CIDRs choose exactly what the model's definition
    /// says: fill order first, then the strategy inside the first CIDR that can serve.
    #[test]
    fn several_cidrs_match_the_model(
        cidrs in cidrs(),
        best_fit in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let strategy = if best_fit { Fit::BestFit } else { Fit::FirstFit };
        let config = PoolConfig::new(cidrs[0], PoolKind::Range { allocation_range: 1 }, strategy)
            .with_additional(cidrs[1..].to_vec());
        let mut pool = PoolAllocator::new(config).expect("valid pool");
        let mut model = Model::new(&cidrs);
        for op in ops {
            match op {
                Op::Allocate { owner, size } => {
                    let name = format!("c{owner}");
                    if pool.get(&name).is_some() {
                        prop_assert!(pool.allocate(&name, Request::Addresses(size as u128)).is_err());
                        continue;
                    }
                    let want = model.range(size as usize, best_fit);
                    match pool.allocate(&name, Request::Addresses(size as u128)) {
                        Ok(got) => {
                            let got = addresses(got);
                            prop_assert_eq!(Some(&got), want.as_ref());
                            model.set(&got, Slot::Held(owner));
                        }
                        Err(_) => prop_assert!(want.is_none()),
                    }
                }
                Op::Grow { owner, size } => {
                    let name = format!("c{owner}");
                    let held = model.held_by(owner).len();
                    if pool.get(&name).is_none() {
                        continue;
                    }
                    let missing = (size as usize).saturating_sub(held);
                    let want = if missing == 0 { Some(BTreeSet::new()) } else { model.range(missing, best_fit) };
                    match pool.grow(&name, size as u128) {
                        Ok(_) => {
                            let want = want.expect("the model grows too");
                            model.set(&want, Slot::Held(owner));
                        }
                        Err(_) => prop_assert!(want.is_none()),
                    }
                }
                Op::Release { owner } => {
                    let name = format!("c{owner}");
                    let held = model.held_by(owner);
                    prop_assert_eq!(pool.release(&name).is_some(), !held.is_empty());
                    model.set(&held, Slot::Free);
                }
                Op::Exclude { cidr, offset, size } => {
                    let (c, slots) = &model.cidrs[cidr % model.cidrs.len()];
                    let len = slots.len() as u32;
                    let start = offset % len;
                    let end = (start + size - 1).min(len - 1);
                    let first = c.first() + u128::from(start);
                    let last = c.first() + u128::from(end);
                    let hits = (start..=end).any(|i| matches!(slots[i as usize], Slot::Held(_)));
                    let r = AddrRange::new(c.family(), first, last).unwrap();
                    let result = pool.exclude(r);
                    prop_assert_eq!(result.is_err(), hits);
                    if !hits {
                        let set = (first..=last).collect();
                        model.set(&set, Slot::Excluded);
                    }
                }
            }
            check(&pool, &model)?;
        }
    }
}
