//! Random sequences of operations against random pools.
//!
//! Small pools (up to 4,096 addresses, IPv4 or IPv6) are checked against a naive model that
//! keeps one slot per address, so the engine must choose exactly what KKP's or Butler's
//! definition says. Large pools (up to all of IPv6) are checked for the invariants only.

use std::collections::HashMap;

use proptest::prelude::*;

use kipam::address::{AddrRange, AddressCount, Cidr, Family};
use kipam::allocator::{Allocation, PoolAllocator, PoolConfig, PoolKind, Request, Strategy as Fit};

#[derive(Clone, Debug)]
enum Op {
    Allocate { owner: u8, size: u32 },
    Grow { owner: u8, size: u32 },
    Pin { owner: u8, offset: u64, size: u32 },
    Release { owner: u8 },
    Exclude { offset: u64, size: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12, 1u32..40).prop_map(|(owner, size)| Op::Allocate { owner, size }),
        1 => (0u8..12, 1u32..60).prop_map(|(owner, size)| Op::Grow { owner, size }),
        1 => (0u8..12, any::<u64>(), 1u32..20).prop_map(|(owner, offset, size)| Op::Pin { owner, offset, size }),
        2 => (0u8..12).prop_map(|owner| Op::Release { owner }),
        1 => (any::<u64>(), 1u32..30).prop_map(|(offset, size)| Op::Exclude { offset, size }),
    ]
}

#[derive(Clone, Copy, Debug)]
struct PoolShape {
    family: Family,
    /// Pool network, as an offset of the family's space (aligned by the test).
    seed: u128,
    host_bits: u32,
    prefix: bool,
    best_fit: bool,
    /// Prefix pools: allocation length = pool length + this (capped by the family width).
    extra: u8,
}

fn shape(max_host_bits: u32) -> impl Strategy<Value = PoolShape> {
    (
        any::<bool>(),
        any::<u128>(),
        2u32..=max_host_bits,
        any::<bool>(),
        any::<bool>(),
        0u8..6,
    )
        .prop_map(|(v6, seed, host_bits, prefix, best_fit, extra)| PoolShape {
            family: if v6 { Family::V6 } else { Family::V4 },
            seed,
            host_bits,
            prefix,
            best_fit,
            extra,
        })
}

impl PoolShape {
    fn host_bits(&self) -> u32 {
        self.host_bits.min(self.family.bits() as u32)
    }

    fn cidr(&self) -> Cidr {
        let bits = self.family.bits() as u32;
        let host_bits = self.host_bits();
        let len = (bits - host_bits) as u8;
        let mask = if host_bits == 128 {
            u128::MAX
        } else {
            (1u128 << host_bits) - 1
        };
        let network = (self.seed & self.family.max_address()) & !mask;
        Cidr::new(self.family, network, len).expect("aligned network")
    }

    fn allocation_prefix(&self) -> u8 {
        let cidr = self.cidr();
        (cidr.prefix_len() + self.extra).min(self.family.bits())
    }

    fn allocator(&self) -> PoolAllocator {
        let kind = if self.prefix {
            PoolKind::Prefix {
                allocation_prefix: self.allocation_prefix(),
            }
        } else {
            PoolKind::Range {
                allocation_range: 1,
            }
        };
        let strategy = if self.best_fit {
            Fit::BestFit
        } else {
            Fit::FirstFit
        };
        PoolAllocator::new(PoolConfig::new(self.cidr(), kind, strategy)).expect("valid pool")
    }

    /// A range inside (or, for some offsets, straddling the end of) the pool.
    fn range_at(&self, offset: u64, size: u32) -> AddrRange {
        let cidr = self.cidr();
        let pool_size = cidr.size().to_u128().unwrap_or(u128::MAX);
        let first = cidr.first() + (offset as u128 % pool_size);
        let last = first
            .saturating_add(size as u128 - 1)
            .min(self.family.max_address());
        AddrRange::new(self.family, first, last).expect("ordered")
    }

    /// An aligned subnet of the allocation length at some offset of the pool.
    fn subnet_at(&self, offset: u64) -> Cidr {
        let cidr = self.cidr();
        let length = self.allocation_prefix();
        let host_bits = (self.family.bits() - length) as u32;
        let blocks = 1u128 << (length - cidr.prefix_len()).min(127);
        let index = offset as u128 % blocks;
        let network = cidr.first()
            + if host_bits == 128 {
                0
            } else {
                index << host_bits
            };
        Cidr::new(self.family, network, length).expect("aligned subnet")
    }
}

fn owner_name(owner: u8) -> String {
    format!("cluster-{owner}")
}

fn snapshot(pool: &PoolAllocator) -> HashMap<String, Allocation> {
    pool.allocations()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Merged union of ranges as (first, last) pairs.
fn union(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort();
    let mut out: Vec<(u128, u128)> = Vec::new();
    for (s, l) in ranges {
        match out.last_mut() {
            Some(prev) if prev.1 == u128::MAX || s <= prev.1 + 1 => prev.1 = prev.1.max(l),
            _ => out.push((s, l)),
        }
    }
    out
}

fn count(ranges: &[(u128, u128)]) -> AddressCount {
    ranges.iter().fold(AddressCount::ZERO, |acc, (s, l)| {
        acc.saturating_add(AddressCount::span(*s, *l))
    })
}

/// The invariants every pool must keep after every operation.
fn check_invariants(pool: &PoolAllocator) -> Result<(), TestCaseError> {
    let cidr = pool.config().cidr;
    let mut pieces: Vec<(u128, u128, String)> = Vec::new();
    let mut allocated = AddressCount::ZERO;
    for (owner, allocation) in pool.allocations() {
        for piece in allocation.ranges() {
            prop_assert_eq!(piece.family(), cidr.family());
            prop_assert!(
                cidr.contains(&piece),
                "{} of {} outside {}",
                piece,
                owner,
                cidr
            );
            pieces.push((piece.first(), piece.last(), owner.to_string()));
        }
        allocated = allocated.saturating_add(allocation.size());
    }
    pieces.sort();
    for pair in pieces.windows(2) {
        prop_assert!(
            pair[0].1 < pair[1].0,
            "overlap between {:?} and {:?}",
            pair[0],
            pair[1]
        );
    }
    let exclusions: Vec<(u128, u128)> = pool
        .exclusions()
        .iter()
        .map(|e| (e.first(), e.last()))
        .collect();
    for (s, l, owner) in &pieces {
        for (es, el) in &exclusions {
            prop_assert!(l < es || s > el, "{} holds excluded addresses", owner);
        }
    }
    let usage = pool.usage();
    prop_assert_eq!(usage.allocated, allocated);
    prop_assert_eq!(usage.allocations, pool.allocations().count());
    prop_assert_eq!(usage.excluded, count(&union(exclusions)));
    prop_assert_eq!(usage.total, cidr.size());
    prop_assert_eq!(
        usage
            .allocated
            .saturating_add(usage.excluded)
            .saturating_add(usage.available),
        usage.total
    );
    prop_assert!(usage.largest_free_block <= usage.available);
    Ok(())
}

/// One slot per address of a small pool.
#[derive(Clone, PartialEq, Eq)]
enum Slot {
    Free,
    Excluded,
    Held(u8),
}

struct Model {
    base: u128,
    slots: Vec<Slot>,
}

impl Model {
    fn new(cidr: Cidr) -> Self {
        let size = cidr.size().to_u64().expect("small pool") as usize;
        Model {
            base: cidr.first(),
            slots: vec![Slot::Free; size],
        }
    }

    fn free_runs(&self) -> Vec<(usize, usize)> {
        let mut runs = Vec::new();
        let mut start = None;
        for (i, slot) in self.slots.iter().enumerate() {
            match (slot == &Slot::Free, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    runs.push((s, i - 1));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            runs.push((s, self.slots.len() - 1));
        }
        runs
    }

    /// Addresses FirstFit takes for `count`, as offsets; `None` when too few are free.
    fn first_fit(&self, count: usize) -> Option<Vec<usize>> {
        let free: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.slots[*i] == Slot::Free)
            .collect();
        (free.len() >= count).then(|| free[..count].to_vec())
    }

    /// Addresses BestFit takes: the start of the smallest run that fits, else FirstFit.
    fn best_fit(&self, count: usize) -> Option<Vec<usize>> {
        let best = self
            .free_runs()
            .into_iter()
            .filter(|(s, l)| l - s + 1 >= count)
            .min_by_key(|(s, l)| (l - s, *s));
        match best {
            Some((s, _)) => Some((s..s + count).collect()),
            None => self.first_fit(count),
        }
    }

    /// The first aligned block of `block` addresses that is all free (FirstFit prefix), or the
    /// first aligned block inside the smallest run holding one (BestFit prefix).
    fn subnet(&self, block: usize, best_fit: bool) -> Option<usize> {
        let fits = |s: usize, l: usize| -> Option<usize> {
            let aligned = s.div_ceil(block) * block;
            (aligned + block - 1 <= l).then_some(aligned)
        };
        let mut runs = self.free_runs();
        if best_fit {
            runs.sort_by_key(|(s, l)| (l - s, *s));
        }
        runs.into_iter().find_map(|(s, l)| fits(s, l))
    }

    fn offsets(&self, allocation: &Allocation) -> Vec<usize> {
        let mut out = Vec::new();
        for piece in allocation.ranges() {
            for a in piece.first()..=piece.last() {
                out.push((a - self.base) as usize);
            }
        }
        out
    }

    fn all_free(&self, first: u128, last: u128) -> bool {
        (first..=last).all(|a| {
            a >= self.base
                && ((a - self.base) as usize) < self.slots.len()
                && self.slots[(a - self.base) as usize] == Slot::Free
        })
    }
}

fn run(shape: PoolShape, ops: Vec<Op>, with_model: bool) -> Result<(), TestCaseError> {
    let mut pool = shape.allocator();
    let cidr = pool.config().cidr;
    let mut model = with_model.then(|| Model::new(cidr));
    for op in ops {
        let before_usage = pool.usage();
        let before = snapshot(&pool);
        let outcome: Result<(), String> = match &op {
            Op::Allocate { owner, size } => {
                let request = if shape.prefix {
                    Request::Prefix(shape.allocation_prefix())
                } else {
                    Request::Addresses(*size as u128)
                };
                let name = owner_name(*owner);
                let had = before.contains_key(&name);
                match pool.allocate(&name, request).cloned() {
                    Ok(got) => {
                        prop_assert!(!had, "allocated twice to {}", name);
                        if let Some(model) = model.as_mut() {
                            let expected = if shape.prefix {
                                let block = cidr_block(&shape);
                                model
                                    .subnet(block, shape.best_fit)
                                    .map(|s| (s..s + block).collect())
                            } else if shape.best_fit {
                                model.best_fit(*size as usize)
                            } else {
                                model.first_fit(*size as usize)
                            };
                            prop_assert_eq!(Some(model.offsets(&got)), expected, "{:?}", op);
                            for o in model.offsets(&got) {
                                model.slots[o] = Slot::Held(*owner);
                            }
                        }
                        Ok(())
                    }
                    Err(e) => {
                        if let Some(model) = model.as_ref()
                            && !had
                        {
                            let possible = if shape.prefix {
                                model.subnet(cidr_block(&shape), shape.best_fit).is_some()
                            } else {
                                model.first_fit(*size as usize).is_some()
                            };
                            prop_assert!(!possible, "refused although possible: {}", e);
                        }
                        Err(e.to_string())
                    }
                }
            }
            Op::Grow { owner, size } => {
                let name = owner_name(*owner);
                match pool.grow(&name, *size as u128) {
                    Ok(_) => {
                        prop_assert!(!shape.prefix, "a prefix allocation grew");
                        let old = before.get(&name).cloned();
                        let new = pool.get(&name).cloned();
                        if let (Some(old), Some(new)) = (old, new) {
                            let (Allocation::Range(old_pieces), Allocation::Range(new_pieces)) =
                                (&old, &new)
                            else {
                                return Err(TestCaseError::fail("range allocation expected"));
                            };
                            prop_assert_eq!(&new_pieces[..old_pieces.len()], &old_pieces[..]);
                            let want = AddressCount::from(*size as u128).max(old.size());
                            prop_assert_eq!(new.size(), want);
                            if let Some(model) = model.as_mut() {
                                for o in model.offsets(&new) {
                                    model.slots[o] = Slot::Held(*owner);
                                }
                            }
                        }
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
            Op::Pin {
                owner,
                offset,
                size,
            } => {
                let name = owner_name(*owner);
                let allocation = if shape.prefix {
                    Allocation::Prefix(shape.subnet_at(*offset))
                } else {
                    Allocation::Range(vec![shape.range_at(*offset, *size)])
                };
                let expected_ok = !before.contains_key(&name)
                    && allocation.ranges().all(|r| cidr.contains(&r))
                    && model.as_ref().is_none_or(|m| {
                        allocation.ranges().all(|r| m.all_free(r.first(), r.last()))
                    });
                match pool.pin(&name, allocation.clone()) {
                    Ok(got) => {
                        prop_assert_eq!(got, &allocation);
                        prop_assert!(expected_ok || model.is_none(), "pin accepted: {:?}", op);
                        if let Some(model) = model.as_mut() {
                            for o in model.offsets(&allocation) {
                                model.slots[o] = Slot::Held(*owner);
                            }
                        }
                        Ok(())
                    }
                    Err(e) => {
                        if model.is_some() {
                            prop_assert!(!expected_ok, "pin refused: {}", e);
                        }
                        Err(e.to_string())
                    }
                }
            }
            Op::Release { owner } => {
                let name = owner_name(*owner);
                let released = pool.release(&name);
                prop_assert_eq!(released.as_ref(), before.get(&name));
                if let Some(model) = model.as_mut() {
                    for slot in model.slots.iter_mut() {
                        if *slot == Slot::Held(*owner) {
                            *slot = Slot::Free;
                        }
                    }
                }
                Ok(())
            }
            Op::Exclude { offset, size } => {
                let range = shape.range_at(*offset, *size);
                match pool.exclude(range) {
                    Ok(()) => {
                        prop_assert!(cidr.contains(&range));
                        if let Some(model) = model.as_mut() {
                            for a in range.first()..=range.last() {
                                let slot = &mut model.slots[(a - model.base) as usize];
                                prop_assert!(
                                    !matches!(slot, Slot::Held(_)),
                                    "excluded a held address"
                                );
                                *slot = Slot::Excluded;
                            }
                        }
                        Ok(())
                    }
                    Err(e) => {
                        if let Some(model) = model.as_ref()
                            && cidr.contains(&range)
                        {
                            let hits = (range.first()..=range.last()).any(|a| {
                                matches!(model.slots[(a - model.base) as usize], Slot::Held(_))
                            });
                            prop_assert!(hits, "exclusion refused: {}", e);
                        }
                        Err(e.to_string())
                    }
                }
            }
        };
        if outcome.is_err() {
            prop_assert_eq!(
                pool.usage(),
                before_usage,
                "a refused {:?} changed the usage",
                op
            );
            prop_assert_eq!(
                snapshot(&pool),
                before,
                "a refused {:?} changed allocations",
                op
            );
        }
        check_invariants(&pool)?;
    }
    Ok(())
}

fn cidr_block(shape: &PoolShape) -> usize {
    1usize << (shape.family.bits() - shape.allocation_prefix())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn small_pools_match_the_model(shape in shape(12), ops in proptest::collection::vec(op(), 1..80)) {
        run(shape, ops, true)?;
    }

    #[test]
    fn large_pools_keep_the_invariants(
        shape in shape(128),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run(shape, ops, false)?;
    }
}
