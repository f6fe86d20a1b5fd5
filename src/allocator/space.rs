//! The free space of a pool of one or more CIDRs, kept per CIDR.
//!
//! Each CIDR has its own [`IntervalSet`], so a free interval never crosses from one CIDR into
//! another (even an adjacent one): a walk in fill order sees every free address of the first
//! CIDR before any of the second, and an aligned subnet found inside one interval lies inside
//! one CIDR. Ranges given from outside (a stored allocation, an exclusion, a release) may span
//! adjacent CIDRs; they are cut at the CIDR edges here. With at most a handful of CIDRs every
//! operation stays `O(k log n)` in the number `k` of CIDRs and `n` of intervals.

use crate::address::{AddressCount, Cidr};

use super::interval_set::IntervalSet;

#[derive(Clone, Debug)]
pub(crate) struct Space {
    /// The CIDRs in fill order, each with its free intervals.
    parts: Vec<(Cidr, IntervalSet)>,
    /// Indexes into `parts`, by first address (and so by last: the CIDRs do not overlap).
    by_address: Vec<usize>,
    /// Free addresses over all CIDRs.
    total: AddressCount,
}

/// One CIDR's free space, as [`Space::per_cidr`] reports it.
pub(crate) struct FreeInCidr {
    pub cidr: Cidr,
    pub free: AddressCount,
    pub largest: AddressCount,
}

impl Space {
    /// Every address of `cidrs` free. The CIDRs must not overlap (the caller checks).
    pub fn new(cidrs: &[Cidr]) -> Space {
        let parts: Vec<(Cidr, IntervalSet)> = cidrs
            .iter()
            .map(|c| {
                let mut set = IntervalSet::default();
                set.insert(c.first(), c.last());
                (*c, set)
            })
            .collect();
        let mut by_address: Vec<usize> = (0..parts.len()).collect();
        by_address.sort_by_key(|i| parts[*i].0.first());
        let total = parts.iter().fold(AddressCount::ZERO, |sum, (_, set)| {
            sum.saturating_add(set.total())
        });
        Space {
            parts,
            by_address,
            total,
        }
    }

    /// Free addresses over all CIDRs.
    pub fn total(&self) -> AddressCount {
        self.total
    }

    /// `first..=last` cut at the CIDR edges: (part index, first, last) for each CIDR it
    /// touches, by address. Addresses outside every CIDR are left out.
    fn cut(&self, first: u128, last: u128) -> impl Iterator<Item = (usize, u128, u128)> + '_ {
        // The first CIDR that does not end before `first`.
        let start = self
            .by_address
            .partition_point(|&i| self.parts[i].0.last() < first);
        self.by_address[start..]
            .iter()
            .take_while(move |&&i| self.parts[i].0.first() <= last)
            .map(move |&i| {
                let c = self.parts[i].0;
                (i, first.max(c.first()), last.min(c.last()))
            })
    }

    /// The one CIDR holding all of `first..=last`, if there is one (the common case: a piece
    /// this pool handed out), so that its set changes without cutting.
    fn within_one(&self, first: u128, last: u128) -> Option<usize> {
        let start = self
            .by_address
            .partition_point(|&i| self.parts[i].0.last() < first);
        let i = *self.by_address.get(start)?;
        let c = self.parts[i].0;
        (c.first() <= first && last <= c.last()).then_some(i)
    }

    /// True when every address of `first..=last` lies in one of the CIDRs (adjacent CIDRs
    /// together cover a range across their edge; a gap between them does not).
    pub fn covers(&self, first: u128, last: u128) -> bool {
        let mut next = first;
        for (_, s, l) in self.cut(first, last) {
            if s != next {
                return false;
            }
            if l == last {
                return true;
            }
            next = l + 1;
        }
        false
    }

    /// True when every address of `first..=last` is free.
    pub fn contains_all(&self, first: u128, last: u128) -> bool {
        self.covers(first, last)
            && self
                .cut(first, last)
                .all(|(i, s, l)| self.parts[i].1.contains_all(s, l))
    }

    /// Removes `first..=last`, every address of which must be free.
    pub fn take(&mut self, first: u128, last: u128) {
        if let Some(i) = self.within_one(first, last) {
            self.parts[i].1.take(first, last);
        } else {
            let cuts: Vec<(usize, u128, u128)> = self.cut(first, last).collect();
            for (i, s, l) in cuts {
                self.parts[i].1.take(s, l);
            }
        }
        self.total = self.total.saturating_sub(AddressCount::span(first, last));
    }

    /// Adds `first..=last` back, which must lie in the CIDRs and not be free.
    pub fn insert(&mut self, first: u128, last: u128) {
        if let Some(i) = self.within_one(first, last) {
            self.parts[i].1.insert(first, last);
            self.total = self.total.saturating_add(AddressCount::span(first, last));
            return;
        }
        let cuts: Vec<(usize, u128, u128)> = self.cut(first, last).collect();
        for (i, s, l) in cuts {
            self.parts[i].1.insert(s, l);
            self.total = self.total.saturating_add(AddressCount::span(s, l));
        }
    }

    /// Removes every free address of `first..=last`; returns the pieces removed, by address.
    pub fn take_overlap(&mut self, first: u128, last: u128) -> Vec<(u128, u128)> {
        let cuts: Vec<(usize, u128, u128)> = self.cut(first, last).collect();
        let mut out = Vec::new();
        for (i, s, l) in cuts {
            for (ts, tl) in self.parts[i].1.take_overlap(s, l) {
                self.total = self.total.saturating_sub(AddressCount::span(ts, tl));
                out.push((ts, tl));
            }
        }
        out
    }

    /// True when `first..=last` lies inside one CIDR.
    pub fn in_one_cidr(&self, first: u128, last: u128) -> bool {
        self.within_one(first, last).is_some()
    }

    /// The free addresses of `first..=last`, cut at the CIDR edges, by address.
    pub fn free_within(&self, first: u128, last: u128) -> Vec<(u128, u128)> {
        let mut out = Vec::new();
        for (i, s, l) in self.cut(first, last) {
            out.extend(
                self.parts[i]
                    .1
                    .iter_from(s)
                    .take_while(|(a, _)| *a <= l)
                    .map(|(a, b)| (a.max(s), b.min(l)))
                    .filter(|(a, b)| a <= b),
            );
        }
        out
    }

    /// Free intervals in fill order: all of the first CIDR by address, then the next CIDR.
    pub fn iter(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.parts.iter().flat_map(|(_, set)| set.iter())
    }

    /// The smallest free interval of at least `count` addresses in the first CIDR (in fill
    /// order) that has one.
    pub fn smallest_fitting(&self, count: u128) -> Option<(u128, u128)> {
        self.parts
            .iter()
            .find_map(|(_, set)| set.smallest_fitting(count))
    }

    /// For each CIDR in fill order, its free intervals of at least `min_span + 1` addresses,
    /// smallest first.
    pub fn blocks_by_size_per_cidr(
        &self,
        min_span: u128,
    ) -> impl Iterator<Item = impl Iterator<Item = (u128, u128)> + '_> + '_ {
        self.parts
            .iter()
            .map(move |(_, set)| set.blocks_by_size(min_span))
    }

    /// The largest free interval of any CIDR (the earliest CIDR in fill order among equals).
    pub fn largest(&self) -> Option<(u128, u128)> {
        let mut best: Option<(u128, u128)> = None;
        for (_, set) in &self.parts {
            if let Some((s, l)) = set.largest()
                && best.is_none_or(|(bs, bl)| l - s > bl - bs)
            {
                best = Some((s, l));
            }
        }
        best
    }

    /// Each CIDR's free addresses and largest free interval, in fill order.
    pub fn per_cidr(&self) -> impl Iterator<Item = FreeInCidr> + '_ {
        self.parts.iter().map(|(cidr, set)| FreeInCidr {
            cidr: *cidr,
            free: set.total(),
            largest: set
                .largest()
                .map(|(s, l)| AddressCount::span(s, l))
                .unwrap_or(AddressCount::ZERO),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Cidr {
        text.parse().unwrap()
    }

    #[test]
    fn walks_in_fill_order_and_cuts_at_cidr_edges() {
        // The second CIDR lies below the first one, and adjacent to it.
        let a = cidr("10.0.1.0/30");
        let b = cidr("10.0.0.252/30");
        let mut space = Space::new(&[a, b]);
        assert_eq!(space.total(), AddressCount::from(8u64));
        let order: Vec<(u128, u128)> = space.iter().collect();
        assert_eq!(order, vec![(a.first(), a.last()), (b.first(), b.last())]);
        // A range across the edge is covered and cut in two.
        assert!(space.covers(b.first() + 2, a.first() + 1));
        space.take(b.first() + 2, a.first() + 1);
        assert_eq!(
            space.iter().collect::<Vec<_>>(),
            vec![(a.first() + 2, a.last()), (b.first(), b.first() + 1)]
        );
        space.insert(b.first() + 2, a.first() + 1);
        assert_eq!(space.total(), AddressCount::from(8u64));
        // Intervals stay per CIDR even when the CIDRs touch.
        assert_eq!(space.iter().count(), 2);
    }

    #[test]
    fn a_gap_between_cidrs_is_not_covered() {
        let space = Space::new(&[cidr("10.0.0.0/30"), cidr("10.0.0.8/30")]);
        assert!(space.covers(0x0a00_0000, 0x0a00_0003));
        assert!(!space.covers(0x0a00_0002, 0x0a00_0009));
        assert!(!space.covers(0x0a00_0004, 0x0a00_0004));
    }

    #[test]
    fn best_fit_looks_in_the_first_cidr_that_can_hold_the_request() {
        let mut space = Space::new(&[cidr("10.0.0.0/29"), cidr("10.0.1.0/30")]);
        // The first CIDR keeps 5 free addresses in one block, the second has a block of 4.
        space.take(0x0a00_0000, 0x0a00_0002);
        assert_eq!(space.smallest_fitting(4), Some((0x0a00_0003, 0x0a00_0007)));
        assert_eq!(space.smallest_fitting(6), None);
    }
}
