//! A set of disjoint, non-adjacent inclusive `u128` intervals.
//!
//! Two indexes are kept in step: intervals by start (for "lowest free address" walks and
//! containment checks) and by span (for "smallest block that fits" and "largest free block").
//! Every operation is `O(log n)` in the number of intervals, plus the intervals it returns;
//! nothing depends on how many addresses the intervals cover.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use crate::address::AddressCount;

#[derive(Clone, Debug, Default)]
pub(crate) struct IntervalSet {
    /// start -> last
    by_start: BTreeMap<u128, u128>,
    /// (last - start, start): ordered by size, then by position.
    by_span: BTreeSet<(u128, u128)>,
    total: AddressCount,
}

impl IntervalSet {
    /// Number of addresses in the set.
    pub fn total(&self) -> AddressCount {
        self.total
    }

    /// Intervals in ascending order, starting with the one holding or following `from`.
    pub fn iter_from(&self, from: u128) -> impl Iterator<Item = (u128, u128)> + '_ {
        let head = self
            .by_start
            .range(..=from)
            .next_back()
            .filter(|(_, last)| **last >= from)
            .map(|(s, l)| (*s, *l));
        let start = match head {
            Some((s, _)) => Bound::Excluded(s),
            None => Bound::Included(from),
        };
        head.into_iter().chain(
            self.by_start
                .range((start, Bound::Unbounded))
                .map(|(s, l)| (*s, *l)),
        )
    }

    /// All intervals in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.by_start.iter().map(|(s, l)| (*s, *l))
    }

    /// The interval holding `value`, if any.
    pub fn containing(&self, value: u128) -> Option<(u128, u128)> {
        self.by_start
            .range(..=value)
            .next_back()
            .filter(|(_, last)| **last >= value)
            .map(|(s, l)| (*s, *l))
    }

    /// True when every address of `first..=last` is in the set.
    pub fn contains_all(&self, first: u128, last: u128) -> bool {
        self.containing(first).is_some_and(|(_, l)| l >= last)
    }

    /// True when some address of `first..=last` is in the set.
    pub fn intersects(&self, first: u128, last: u128) -> bool {
        // Intervals are disjoint and sorted, so the one starting last at or before `last`
        // also ends last among them.
        self.by_start
            .range(..=last)
            .next_back()
            .is_some_and(|(_, l)| *l >= first)
    }

    /// The smallest interval of at least `count` addresses (lowest first among equals).
    pub fn smallest_fitting(&self, count: u128) -> Option<(u128, u128)> {
        let min_span = count.checked_sub(1)?;
        self.by_span
            .range((min_span, 0)..)
            .next()
            .map(|(span, start)| (*start, start + span))
    }

    /// Intervals spanning at least `min_span + 1` addresses, smallest first.
    pub fn blocks_by_size(&self, min_span: u128) -> impl Iterator<Item = (u128, u128)> + '_ {
        self.by_span
            .range((min_span, 0)..)
            .map(|(span, start)| (*start, start + span))
    }

    /// The largest interval (lowest first among equals of that size).
    pub fn largest(&self) -> Option<(u128, u128)> {
        let (span, _) = self.by_span.last()?;
        let (_, start) = self.by_span.range((*span, 0)..).next()?;
        Some((*start, start + span))
    }

    /// Adds `first..=last`, which must not intersect the set, merging with neighbours.
    pub fn insert(&mut self, mut first: u128, mut last: u128) {
        debug_assert!(first <= last && !self.intersects(first, last));
        self.total = self.total.saturating_add(AddressCount::span(first, last));
        if let Some((s, l)) = self
            .by_start
            .range(..first)
            .next_back()
            .map(|(s, l)| (*s, *l))
            && l.checked_add(1) == Some(first)
        {
            self.remove_interval(s, l);
            first = s;
        }
        if let Some(next) = last.checked_add(1)
            && let Some(l) = self.by_start.get(&next).copied()
        {
            self.remove_interval(next, l);
            last = l;
        }
        self.by_start.insert(first, last);
        self.by_span.insert((last - first, first));
    }

    /// Removes `first..=last`, which must lie inside one interval of the set.
    pub fn take(&mut self, first: u128, last: u128) {
        let Some((s, l)) = self.containing(first) else {
            debug_assert!(false, "take outside the set");
            return;
        };
        debug_assert!(l >= last);
        self.total = self.total.saturating_sub(AddressCount::span(first, last));
        self.remove_interval(s, l);
        if s < first {
            self.add_interval(s, first - 1);
        }
        if last < l {
            self.add_interval(last + 1, l);
        }
    }

    /// Removes every address of `first..=last` that is in the set; returns the pieces removed.
    pub fn take_overlap(&mut self, first: u128, last: u128) -> Vec<(u128, u128)> {
        let pieces: Vec<(u128, u128)> = self
            .iter_from(first)
            .take_while(|(s, _)| *s <= last)
            .map(|(s, l)| (s.max(first), l.min(last)))
            .collect();
        for (s, l) in &pieces {
            self.take(*s, *l);
        }
        pieces
    }

    fn remove_interval(&mut self, start: u128, last: u128) {
        self.by_start.remove(&start);
        self.by_span.remove(&(last - start, start));
    }

    fn add_interval(&mut self, start: u128, last: u128) {
        self.by_start.insert(start, last);
        self.by_span.insert((last - start, start));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_and_splits() {
        let mut set = IntervalSet::default();
        set.insert(10, 19);
        set.insert(30, 39);
        set.insert(20, 29);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![(10, 39)]);
        set.take(15, 16);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![(10, 14), (17, 39)]);
        assert_eq!(set.total(), AddressCount::from(28u64));
        assert_eq!(set.smallest_fitting(5), Some((10, 14)));
        assert_eq!(set.smallest_fitting(6), Some((17, 39)));
        assert_eq!(set.largest(), Some((17, 39)));
        assert_eq!(set.take_overlap(12, 20), vec![(12, 14), (17, 20)]);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![(10, 11), (21, 39)]);
    }

    #[test]
    fn handles_the_whole_u128_space() {
        let mut set = IntervalSet::default();
        set.insert(0, u128::MAX);
        assert_eq!(set.total(), AddressCount::pow2(128));
        set.take(u128::MAX, u128::MAX);
        set.take(0, 0);
        assert_eq!(set.largest(), Some((1, u128::MAX - 1)));
        set.insert(u128::MAX, u128::MAX);
        set.insert(0, 0);
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![(0, u128::MAX)]);
        assert!(set.contains_all(5, u128::MAX));
    }
}
