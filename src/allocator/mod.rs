//! The allocation engine: one pool of one datacenter, no Kubernetes, no I/O.
//!
//! Free space is a set of disjoint intervals over `u128`, indexed by position and by size, so
//! the cost of an operation grows with the number of allocations and exclusions and never with
//! the size of the pool: an IPv6 `::/0` range pool is as cheap as a /28.

mod allocation;
mod aside;
mod config;
mod error;
mod interval_set;
mod space;
mod usage;

pub use allocation::Allocation;
pub use aside::Aside;
pub use config::{PoolConfig, PoolKind, Request, Strategy};
pub use error::{AllocError, ClaimOrigin};
pub use usage::{CidrUsage, PoolUsage};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::address::{AddrRange, AddressCount, Cidr, Family};
use interval_set::IntervalSet;
use space::Space;

/// The state of one pool: free space, exclusions and who holds what.
#[derive(Clone, Debug)]
pub struct PoolAllocator {
    config: PoolConfig,
    /// Free addresses, per CIDR of the pool.
    free: Space,
    excluded: IntervalSet,
    /// Exclusions as they were given, to name them in messages.
    exclusions: Vec<AddrRange>,
    /// Allocated pieces: start -> (last, holder).
    taken: BTreeMap<u128, (u128, Arc<str>)>,
    holders: HashMap<Arc<str>, Allocation>,
    allocated: AddressCount,
    /// Addresses set aside (see `aside`): tag -> (why, pieces).
    aside: HashMap<Arc<str>, (Aside, Vec<AddrRange>)>,
    /// Set-aside pieces: start -> (last, tag).
    aside_taken: BTreeMap<u128, (u128, Arc<str>)>,
    quarantined: AddressCount,
    shared: AddressCount,
}

/// What [`PoolAllocator::grow`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Growth {
    /// The allocation already held at least the requested number of addresses; nothing changed
    /// (lowering `allocationRange` never releases addresses).
    Unchanged,
    /// These pieces were appended.
    Appended(Vec<AddrRange>),
}

impl PoolAllocator {
    /// An empty pool; refuses a default request the pool can never satisfy.
    pub fn new(config: PoolConfig) -> Result<Self, AllocError> {
        let cidr = config.cidr;
        check_cidrs(&config)?;
        let size = pool_size(&config);
        match config.kind {
            PoolKind::Range { allocation_range } => {
                if allocation_range == 0 || AddressCount::from(allocation_range) > size {
                    return Err(AllocError::InvalidConfig {
                        pool: config.label.clone(),
                        field: "allocationRange",
                        value: allocation_range.to_string(),
                        reason: format!("must be between 1 and the pool size {size}"),
                    });
                }
            }
            PoolKind::Prefix { allocation_prefix } => {
                if allocation_prefix < cidr.prefix_len() || allocation_prefix > cidr.family().bits()
                {
                    return Err(AllocError::InvalidConfig {
                        pool: config.label.clone(),
                        field: "allocationPrefix",
                        value: allocation_prefix.to_string(),
                        reason: format!(
                            "must be between the pool prefix length {} and {}",
                            cidr.prefix_len(),
                            cidr.family().bits()
                        ),
                    });
                }
            }
        }
        let cidrs: Vec<Cidr> = config.cidrs().collect();
        let free = Space::new(&cidrs);
        Ok(PoolAllocator {
            config,
            free,
            excluded: IntervalSet::default(),
            exclusions: Vec::new(),
            taken: BTreeMap::new(),
            holders: HashMap::new(),
            allocated: AddressCount::ZERO,
            aside: HashMap::new(),
            aside_taken: BTreeMap::new(),
            quarantined: AddressCount::ZERO,
            shared: AddressCount::ZERO,
        })
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The allocation held by `owner`.
    pub fn get(&self, owner: &str) -> Option<&Allocation> {
        self.holders.get(owner)
    }

    /// Every allocation with its holder, in no particular order.
    pub fn allocations(&self) -> impl Iterator<Item = (&str, &Allocation)> {
        self.holders.iter().map(|(k, v)| (k.as_ref(), v))
    }

    /// The exclusions as given.
    pub fn exclusions(&self) -> &[AddrRange] {
        &self.exclusions
    }

    /// Who holds `address`, if anyone.
    pub fn holder_of(&self, address: u128) -> Option<&str> {
        self.taken
            .range(..=address)
            .next_back()
            .filter(|(_, (last, _))| *last >= address)
            .map(|(_, (_, holder))| holder.as_ref())
    }

    /// The pool's figures.
    pub fn usage(&self) -> PoolUsage {
        let available = self.free.total();
        let largest = self
            .free
            .largest()
            .map(|(s, l)| AddressCount::span(s, l))
            .unwrap_or(AddressCount::ZERO);
        let fragmentation_percent = if available.is_zero() {
            0
        } else {
            available.saturating_sub(largest).percent_of(available)
        };
        PoolUsage {
            total: pool_size(&self.config),
            allocated: self.allocated,
            excluded: self.excluded.total(),
            available,
            allocations: self.holders.len(),
            largest_free_block: largest,
            fragmentation_percent,
            quarantined: self.quarantined,
            shared: self.shared,
        }
    }

    /// The figures of each CIDR of the pool, in fill order.
    pub fn cidr_usage(&self) -> Vec<CidrUsage> {
        self.free
            .per_cidr()
            .map(|f| {
                let total = f.cidr.size();
                let excluded = self
                    .excluded
                    .iter_from(f.cidr.first())
                    .take_while(|(s, _)| *s <= f.cidr.last())
                    .fold(AddressCount::ZERO, |sum, (s, l)| {
                        let span = AddressCount::span(s.max(f.cidr.first()), l.min(f.cidr.last()));
                        sum.saturating_add(span)
                    });
                // Set aside (quarantined, or held through another pool of the space): counted
                // neither as allocated nor as available, as for the whole pool.
                let aside = self.aside_taken.range(f.cidr.first()..=f.cidr.last()).fold(
                    AddressCount::ZERO,
                    |sum, (s, (l, _))| {
                        sum.saturating_add(AddressCount::span(*s, (*l).min(f.cidr.last())))
                    },
                );
                let fragmentation_percent = if f.free.is_zero() {
                    0
                } else {
                    f.free.saturating_sub(f.largest).percent_of(f.free)
                };
                CidrUsage {
                    cidr: f.cidr,
                    total,
                    allocated: total
                        .saturating_sub(excluded)
                        .saturating_sub(f.free)
                        .saturating_sub(aside),
                    excluded,
                    available: f.free,
                    largest_free_block: f.largest,
                    fragmentation_percent,
                }
            })
            .collect()
    }

    /// Removes `range` from the free space. Parts already excluded are fine; a part held by an
    /// allocation is refused (and nothing changes).
    pub fn exclude(&mut self, range: AddrRange) -> Result<(), AllocError> {
        self.check_family(range.family(), &range.to_string(), "exclusion")?;
        if !self.free.covers(range.first(), range.last()) {
            return Err(AllocError::ExclusionOutsidePool {
                pool: self.config.label.clone(),
                exclusion: range.to_string(),
            });
        }
        if let Some(holder) = self.first_holder_in(range.first(), range.last()) {
            return Err(AllocError::ExclusionHitsAllocation {
                pool: self.config.label.clone(),
                exclusion: range.to_string(),
                held: self
                    .holders
                    .get(holder)
                    .map(|a| a.to_string())
                    .unwrap_or_default(),
                holder: holder.to_string(),
            });
        }
        self.free.take_overlap(range.first(), range.last());
        self.excluded.take_overlap(range.first(), range.last());
        self.excluded.insert(range.first(), range.last());
        self.exclusions.push(range);
        Ok(())
    }

    /// Hands `owner` a new allocation chosen by the pool's strategy.
    pub fn allocate(&mut self, owner: &str, request: Request) -> Result<&Allocation, AllocError> {
        self.ensure_absent(owner)?;
        let allocation = match (self.config.kind, request) {
            (PoolKind::Range { .. }, Request::Addresses(count)) => {
                if count == 0 {
                    return Err(self.invalid_request(owner, &request, "at least 1 address"));
                }
                Allocation::Range(self.take_addresses(owner, count)?)
            }
            (PoolKind::Prefix { .. }, Request::Prefix(length)) => {
                let cidr = self.config.cidr;
                let shortest = self
                    .config
                    .cidrs()
                    .map(|c| c.prefix_len())
                    .min()
                    .unwrap_or(cidr.prefix_len());
                if length < shortest || length > cidr.family().bits() {
                    let reason = format!(
                        "the length must be between {} and {}",
                        shortest,
                        cidr.family().bits()
                    );
                    return Err(self.invalid_request(owner, &request, &reason));
                }
                Allocation::Prefix(self.take_subnet(owner, length)?)
            }
            (kind, request) => {
                return Err(AllocError::WrongType {
                    pool: self.config.label.clone(),
                    owner: owner.to_string(),
                    pool_type: kind.type_name(),
                    request: request.to_string(),
                });
            }
        };
        Ok(self.record(owner, allocation))
    }

    /// Gives `owner` exactly the addresses it asked for, or refuses with the reason.
    pub fn pin(&mut self, owner: &str, allocation: Allocation) -> Result<&Allocation, AllocError> {
        self.claim(owner, allocation, ClaimOrigin::Pinned)
    }

    /// Takes back an allocation stored earlier, exactly as it was stored.
    pub fn load(&mut self, owner: &str, allocation: Allocation) -> Result<&Allocation, AllocError> {
        self.claim(owner, allocation, ClaimOrigin::Stored)
    }

    /// Reserves for `owner` every address of `allocation` that lies in the pool and is still
    /// free, whatever else is wrong with it (another family, partly outside the pool, over an
    /// exclusion, overlapping another holder, the other allocation type). Used for a stored
    /// allocation that can no longer be loaded as it is: what it holds must never be handed to
    /// anybody else. Returns the pieces reserved (possibly none); `owner` must hold nothing yet.
    pub fn reserve(&mut self, owner: &str, allocation: &Allocation) -> Vec<AddrRange> {
        if self.holders.contains_key(owner) {
            return Vec::new();
        }
        let family = self.config.cidr.family();
        let mut reserved = Vec::new();
        for piece in allocation.ranges() {
            if piece.family() != family {
                continue;
            }
            // Only free addresses are taken, and only the pool's CIDRs hold free addresses.
            for (s, l) in self.free.take_overlap(piece.first(), piece.last()) {
                reserved.push(AddrRange::from_bounds(family, s, l));
            }
        }
        if !reserved.is_empty() {
            self.record(owner, Allocation::Range(reserved.clone()));
        }
        reserved
    }

    /// Raises a range allocation to `count` addresses by appending only the missing ones;
    /// never shrinks. Nothing changes when the growth cannot be satisfied.
    pub fn grow(&mut self, owner: &str, count: u128) -> Result<Growth, AllocError> {
        let Some(current) = self.holders.get(owner) else {
            return Err(AllocError::NotAllocated {
                pool: self.config.label.clone(),
                owner: owner.to_string(),
            });
        };
        let Allocation::Range(_) = current else {
            return Err(AllocError::WrongType {
                pool: self.config.label.clone(),
                owner: owner.to_string(),
                pool_type: self.config.kind.type_name(),
                request: format!("growth to {count} addresses"),
            });
        };
        let held = current.size();
        let wanted = AddressCount::from(count);
        let Some(missing) = wanted.checked_sub(held).and_then(|m| m.to_u128()) else {
            return Ok(Growth::Unchanged);
        };
        if missing == 0 {
            return Ok(Growth::Unchanged);
        }
        let added = self.take_addresses(owner, missing)?;
        let key: Arc<str> = Arc::from(owner);
        for piece in &added {
            self.taken
                .insert(piece.first(), (piece.last(), key.clone()));
            self.allocated = self.allocated.saturating_add(piece.size());
        }
        if let Some(Allocation::Range(pieces)) = self.holders.get_mut(owner) {
            pieces.extend(added.iter().copied());
        }
        Ok(Growth::Appended(added))
    }

    /// Returns `owner`'s addresses to the free space.
    pub fn release(&mut self, owner: &str) -> Option<Allocation> {
        let allocation = self.holders.remove(owner)?;
        for piece in allocation.ranges() {
            self.taken.remove(&piece.first());
            self.free.insert(piece.first(), piece.last());
            self.allocated = self.allocated.saturating_sub(piece.size());
        }
        Some(allocation)
    }

    fn claim(
        &mut self,
        owner: &str,
        allocation: Allocation,
        origin: ClaimOrigin,
    ) -> Result<&Allocation, AllocError> {
        self.ensure_absent(owner)?;
        let pieces = match (&self.config.kind, &allocation) {
            (PoolKind::Range { .. }, Allocation::Range(pieces)) if !pieces.is_empty() => {
                pieces.clone()
            }
            (PoolKind::Prefix { .. }, Allocation::Prefix(cidr)) => vec![cidr.range()],
            (PoolKind::Range { .. }, Allocation::Range(_)) => {
                return Err(AllocError::InvalidRequest {
                    pool: self.config.label.clone(),
                    owner: owner.to_string(),
                    request: format!("{origin} addresses"),
                    reason: "the list is empty".into(),
                });
            }
            (kind, other) => {
                return Err(AllocError::WrongType {
                    pool: self.config.label.clone(),
                    owner: owner.to_string(),
                    pool_type: kind.type_name(),
                    request: format!("{origin} {} {other}", other.type_name()),
                });
            }
        };
        for piece in &pieces {
            self.check_claimable(owner, piece, origin)?;
        }
        let mut sorted = pieces.clone();
        sorted.sort();
        if let Some(pair) = sorted.windows(2).find(|w| w[0].overlaps(&w[1])) {
            return Err(AllocError::InvalidRequest {
                pool: self.config.label.clone(),
                owner: owner.to_string(),
                request: format!("{origin} {allocation}"),
                reason: format!("{} and {} overlap", pair[0], pair[1]),
            });
        }
        for piece in &pieces {
            self.free.take(piece.first(), piece.last());
        }
        Ok(self.record(owner, allocation))
    }

    /// Refuses a piece that is of the wrong family, outside the pool, excluded or taken.
    fn check_claimable(
        &self,
        owner: &str,
        piece: &AddrRange,
        origin: ClaimOrigin,
    ) -> Result<(), AllocError> {
        let value = piece.to_string();
        self.check_family(piece.family(), &value, &format!("{origin} by {owner}"))?;
        if !self.free.covers(piece.first(), piece.last()) {
            return Err(AllocError::OutsidePool {
                pool: self.config.label.clone(),
                owner: owner.to_string(),
                origin,
                value,
            });
        }
        if self.free.contains_all(piece.first(), piece.last()) {
            return Ok(());
        }
        if self.excluded.intersects(piece.first(), piece.last()) {
            let exclusion = self
                .exclusions
                .iter()
                .find(|e| e.overlaps(piece))
                .map(|e| e.to_string())
                .unwrap_or_default();
            return Err(AllocError::Excluded {
                pool: self.config.label.clone(),
                owner: owner.to_string(),
                origin,
                value,
                exclusion,
            });
        }
        let holder = self
            .first_holder_in(piece.first(), piece.last())
            .or_else(|| self.first_aside_in(piece.first(), piece.last()))
            .unwrap_or_default()
            .to_string();
        Err(AllocError::Taken {
            pool: self.config.label.clone(),
            owner: owner.to_string(),
            origin,
            value,
            holder,
        })
    }

    /// Takes `count` addresses by the pool's strategy; nothing changes on failure.
    fn take_addresses(&mut self, owner: &str, count: u128) -> Result<Vec<AddrRange>, AllocError> {
        let family = self.config.cidr.family();
        if self.free.total() < AddressCount::from(count) {
            return Err(AllocError::Exhausted {
                pool: self.config.label.clone(),
                owner: owner.to_string(),
                requested: AddressCount::from(count),
                free: self.free.total(),
            });
        }
        if self.config.strategy == Strategy::BestFit
            && let Some((start, _)) = self.free.smallest_fitting(count)
        {
            let last = start + (count - 1);
            self.free.take(start, last);
            return Ok(vec![AddrRange::from_bounds(family, start, last)]);
        }
        // Lowest free addresses first (CIDR by CIDR in fill order), as many pieces as it takes.
        let mut pieces: Vec<AddrRange> = Vec::new();
        let mut missing = count;
        for (start, last) in self.free.iter() {
            let room = last - start;
            let piece_last = if room >= missing - 1 {
                start + (missing - 1)
            } else {
                last
            };
            match pieces.last_mut() {
                // The end of one CIDR and the start of the next, adjacent one: one piece.
                Some(prev) if prev.last().checked_add(1) == Some(start) => {
                    *prev = AddrRange::from_bounds(family, prev.first(), piece_last);
                }
                _ => pieces.push(AddrRange::from_bounds(family, start, piece_last)),
            }
            missing -= piece_last - start + 1;
            if missing == 0 {
                break;
            }
        }
        for piece in &pieces {
            self.free.take(piece.first(), piece.last());
        }
        pieces.shrink_to_fit();
        Ok(pieces)
    }

    /// Takes one free aligned subnet of `length`; nothing changes on failure.
    fn take_subnet(&mut self, owner: &str, length: u8) -> Result<Cidr, AllocError> {
        let family = self.config.cidr.family();
        let host_bits = (family.bits() - length) as u32;
        let mask = match host_bits {
            128 => u128::MAX,
            n => (1u128 << n) - 1,
        };
        // The first aligned block inside free interval (start, last), if any.
        let fit = |(start, last): (u128, u128)| -> Option<u128> {
            let aligned = start.checked_add(mask)? & !mask;
            (aligned >= start && aligned.checked_add(mask)? <= last).then_some(aligned)
        };
        let found = match self.config.strategy {
            Strategy::FirstFit => self.free.iter().find_map(fit),
            // The smallest fitting block of the first CIDR (in fill order) that has one.
            Strategy::BestFit => self
                .free
                .blocks_by_size_per_cidr(mask)
                .find_map(|mut blocks| blocks.find_map(fit)),
        };
        let Some(network) = found else {
            let usage = self.usage();
            return Err(AllocError::NoFreeSubnet {
                pool: self.config.label.clone(),
                owner: owner.to_string(),
                length,
                free: usage.available,
                largest: usage.largest_free_block,
            });
        };
        let cidr =
            Cidr::new(family, network, length).ok_or_else(|| AllocError::InvalidRequest {
                pool: self.config.label.clone(),
                owner: owner.to_string(),
                request: Request::Prefix(length).to_string(),
                reason: "no aligned subnet of that length exists".into(),
            })?;
        self.free.take(cidr.first(), cidr.last());
        Ok(cidr)
    }

    /// Stores a new allocation whose addresses were already removed from the free space.
    fn record(&mut self, owner: &str, mut allocation: Allocation) -> &Allocation {
        // Kept for as long as the allocation lives: no spare capacity (a `Vec` grown by one
        // piece holds room for four).
        if let Allocation::Range(pieces) = &mut allocation {
            pieces.shrink_to_fit();
        }
        let key: Arc<str> = Arc::from(owner);
        for piece in allocation.ranges() {
            self.taken
                .insert(piece.first(), (piece.last(), key.clone()));
        }
        self.allocated = self.allocated.saturating_add(allocation.size());
        self.holders.entry(key).or_insert(allocation)
    }

    fn ensure_absent(&self, owner: &str) -> Result<(), AllocError> {
        match self.holders.get(owner) {
            Some(existing) => Err(AllocError::AlreadyAllocated {
                pool: self.config.label.clone(),
                owner: owner.to_string(),
                existing: existing.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// The holder of the lowest allocated address in `first..=last`.
    fn first_holder_in(&self, first: u128, last: u128) -> Option<&str> {
        if let Some(holder) = self.holder_of(first) {
            return Some(holder);
        }
        self.taken
            .range(first..=last)
            .next()
            .map(|(_, (_, holder))| holder.as_ref())
    }

    fn check_family(&self, found: Family, value: &str, context: &str) -> Result<(), AllocError> {
        let expected = self.config.cidr.family();
        if found == expected {
            return Ok(());
        }
        Err(AllocError::FamilyMismatch {
            pool: self.config.label.clone(),
            value: value.to_string(),
            found,
            expected,
            context: context.to_string(),
        })
    }

    fn invalid_request(&self, owner: &str, request: &Request, reason: &str) -> AllocError {
        AllocError::InvalidRequest {
            pool: self.config.label.clone(),
            owner: owner.to_string(),
            request: request.to_string(),
            reason: reason.to_string(),
        }
    }
}

/// Addresses in all the pool's CIDRs.
fn pool_size(config: &PoolConfig) -> AddressCount {
    config
        .cidrs()
        .fold(AddressCount::ZERO, |sum, c| sum.saturating_add(c.size()))
}

/// Refuses further CIDRs of another family, or overlapping the pool's CIDR or each other.
fn check_cidrs(config: &PoolConfig) -> Result<(), AllocError> {
    let family = config.cidr.family();
    let cidrs: Vec<Cidr> = config.cidrs().collect();
    for (i, c) in cidrs.iter().enumerate().skip(1) {
        let invalid = |reason: String| AllocError::InvalidConfig {
            pool: config.label.clone(),
            field: "additionalCidrs",
            value: c.to_string(),
            reason,
        };
        if c.family() != family {
            return Err(invalid(format!("is {}, the pool is {family}", c.family())));
        }
        if let Some(other) = cidrs[..i].iter().find(|o| o.range().overlaps(&c.range())) {
            return Err(invalid(format!(
                "overlaps {other}, another CIDR of the pool"
            )));
        }
    }
    Ok(())
}
