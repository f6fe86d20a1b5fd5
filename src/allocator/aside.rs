//! Addresses set aside: not free in this pool datacenter, yet held by none of its
//! allocations — quarantined for a former holder (`reuseAfter`), or held through another pool
//! of the same address space.
//!
//! Set-aside addresses count neither as allocated nor as available; [`PoolUsage`] shows them
//! as `quarantined` and `shared`. Only free addresses are ever set aside, so nothing set aside
//! overlaps an allocation or an exclusion, and giving a set back returns exactly those
//! addresses to the free space.

use std::sync::Arc;

use super::{AllocError, Allocation, PoolAllocator, PoolKind, Request};
use crate::address::{AddrRange, AddressCount, Cidr};

/// Why addresses are set aside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Aside {
    /// Released here and quarantined for their former holder.
    Quarantined,
    /// Held through another pool of the same address space and datacenter.
    Shared,
}

impl PoolAllocator {
    /// Sets aside, under `tag`, every address of `ranges` that lies in the pool and is free;
    /// returns what was set aside. A tag names one set: setting aside more under the same tag
    /// adds to it (it must be of the same kind).
    pub fn set_aside(
        &mut self,
        tag: &str,
        kind: Aside,
        ranges: impl IntoIterator<Item = AddrRange>,
    ) -> Vec<AddrRange> {
        let family = self.config.cidr.family();
        let mut got = Vec::new();
        for piece in ranges {
            if piece.family() != family {
                continue;
            }
            // Cut at the edges of every CIDR of the pool (`poolCidr` and `additionalCidrs`):
            // what lies outside all of them is not this pool's to set aside.
            for (s, l) in self.free.take_overlap(piece.first(), piece.last()) {
                got.push(AddrRange::from_bounds(family, s, l));
            }
        }
        if got.is_empty() {
            return got;
        }
        let key: Arc<str> = Arc::from(tag);
        let size = got
            .iter()
            .fold(AddressCount::ZERO, |n, r| n.saturating_add(r.size()));
        match kind {
            Aside::Quarantined => self.quarantined = self.quarantined.saturating_add(size),
            Aside::Shared => self.shared = self.shared.saturating_add(size),
        }
        for r in &got {
            self.aside_taken.insert(r.first(), (r.last(), key.clone()));
        }
        let entry = self.aside.entry(key).or_insert_with(|| (kind, Vec::new()));
        entry.1.extend(got.iter().copied());
        got
    }

    /// Returns everything set aside under `tag` to the free space.
    pub fn give_back(&mut self, tag: &str) -> Vec<AddrRange> {
        let Some((kind, ranges)) = self.aside.remove(tag) else {
            return Vec::new();
        };
        for r in &ranges {
            self.aside_taken.remove(&r.first());
            self.free.insert(r.first(), r.last());
            match kind {
                Aside::Quarantined => self.quarantined = self.quarantined.saturating_sub(r.size()),
                Aside::Shared => self.shared = self.shared.saturating_sub(r.size()),
            }
        }
        ranges
    }

    /// What is set aside under `tag`.
    pub fn aside(&self, tag: &str) -> &[AddrRange] {
        self.aside
            .get(tag)
            .map(|(_, r)| r.as_slice())
            .unwrap_or(&[])
    }

    /// The tag of the set holding `address`, if it is set aside.
    pub fn aside_holder_of(&self, address: u128) -> Option<&str> {
        self.aside_taken
            .range(..=address)
            .next_back()
            .filter(|(_, (last, _))| *last >= address)
            .map(|(_, (_, tag))| tag.as_ref())
    }

    /// The tag of the lowest set-aside address in `first..=last`.
    pub(super) fn first_aside_in(&self, first: u128, last: u128) -> Option<&str> {
        if let Some(tag) = self.aside_holder_of(first) {
            return Some(tag);
        }
        self.aside_taken
            .range(first..=last)
            .next()
            .map(|(_, (_, tag))| tag.as_ref())
    }

    /// Hands `owner` a new allocation, taking first what it can of `preferred` (free
    /// addresses, in the order given), then by the pool's strategy: a `range` request takes as
    /// many preferred addresses as it needs and the rest as usual; a `prefix` request takes a
    /// free aligned subnet of the asked length lying in `preferred`, if there is one. This is
    /// how a former holder gets its quarantined addresses back.
    pub fn allocate_preferring(
        &mut self,
        owner: &str,
        request: Request,
        preferred: &[AddrRange],
    ) -> Result<&Allocation, AllocError> {
        self.ensure_absent(owner)?;
        let family = self.config.cidr.family();
        match (self.config.kind, request) {
            (PoolKind::Range { .. }, Request::Addresses(count)) if count > 0 => {
                let mut pieces = Vec::new();
                let mut missing = count;
                for piece in preferred {
                    if missing == 0 {
                        break;
                    }
                    if piece.family() != family {
                        continue;
                    }
                    // Free addresses of the piece in any CIDR of the pool.
                    let free = self.free.free_within(piece.first(), piece.last());
                    for (s, l) in free {
                        if missing == 0 {
                            break;
                        }
                        let end = if l - s >= missing - 1 {
                            s + (missing - 1)
                        } else {
                            l
                        };
                        self.free.take(s, end);
                        pieces.push(AddrRange::from_bounds(family, s, end));
                        missing -= end - s + 1;
                    }
                }
                if missing > 0 {
                    match self.take_addresses(owner, missing) {
                        Ok(rest) if pieces.is_empty() => pieces = rest,
                        Ok(rest) => pieces.extend(rest),
                        Err(e) => {
                            for p in &pieces {
                                self.free.insert(p.first(), p.last());
                            }
                            return Err(e);
                        }
                    }
                }
                Ok(self.record(owner, Allocation::Range(pieces)))
            }
            (PoolKind::Prefix { .. }, Request::Prefix(length)) => {
                let fits = preferred.iter().find_map(|p| {
                    let cidr = Cidr::new(p.family(), p.first(), length)?;
                    (cidr.last() <= p.last()).then_some(cidr).filter(|c| {
                        // A subnet lies inside one CIDR of the pool, and is free.
                        self.free.in_one_cidr(c.first(), c.last())
                            && self.free.contains_all(c.first(), c.last())
                    })
                });
                match fits {
                    Some(cidr) => {
                        self.free.take(cidr.first(), cidr.last());
                        Ok(self.record(owner, Allocation::Prefix(cidr)))
                    }
                    None => self.allocate(owner, request),
                }
            }
            _ => self.allocate(owner, request),
        }
    }
}
