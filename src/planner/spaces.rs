//! One address space per datacenter, and quarantine with sticky reclaim.
//!
//! **Spaces.** Pools that list the same datacenter and name the same `addressSpace` (or none)
//! share that datacenter's addresses. Each pool datacenter keeps its own allocator (its own
//! network, exclusions, sizes and strategy); what a cluster holds in one of them is *set
//! aside* in every other allocator of the space whose network overlaps it, so none of them
//! hands it out. Pools whose networks do not overlap never meet, so they cost nothing here,
//! and the plan of a pool still depends only on the pools it overlaps in its space (its
//! *group*): [`close_over_spaces`] widens a set of pools to whole groups, which the
//! incremental planner plans together.
//!
//! **Quarantine.** An address released from a pool datacenter with `reuseAfter` is kept for
//! its former holder until the period ends: set aside in its allocator (and in those of the
//! space), listed in the plan's `quarantined`, which the controller commits in the pool
//! record and offline keeps in the state file. A holder asking again in that datacenter before
//! the end gets those addresses first (sticky reclaim).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{HeldElsewhere, Key, Planner, PoolInput, Quarantined, StoredAllocation};
use crate::address::AddrRange;
use crate::allocator::Aside;
use crate::resources::capi::ADOPTABLE_PREFIX;

/// The tag under which a cluster's quarantined addresses are set aside in its pool.
pub(super) fn quarantine_tag(holder: &str) -> String {
    format!("{holder} (quarantined)")
}

/// The tag under which what `cluster` holds through `pool` is set aside in the other pools
/// of the space.
pub(super) fn shared_tag(pool: &str, cluster: &str) -> String {
    format!("{cluster} (through pool {pool})")
}

/// (pool, datacenter) -> the other pool datacenters of the same space and datacenter whose
/// networks overlap it. Pool datacenters that overlap nothing are absent.
pub(super) fn siblings(pools: &[&PoolInput]) -> HashMap<Key, Vec<Key>> {
    /// A network: first, last, family (4 or 6), pool.
    type Net<'p> = (u128, u128, u8, &'p str);
    let mut by_space: BTreeMap<(&str, &str), Vec<Net>> = BTreeMap::new();
    for pool in pools {
        for (dc, input) in &pool.datacenters {
            // Every CIDR of the pool datacenter (`poolCidr` and `additionalCidrs`): a pool
            // meets another wherever any of its CIDRs overlaps one of the other's.
            // And the networks it had before it was narrowed (see `DatacenterInput::former`).
            for cidr in input.config.cidrs().chain(input.former.iter().copied()) {
                let family = match cidr.family() {
                    crate::address::Family::V4 => 4,
                    crate::address::Family::V6 => 6,
                };
                by_space
                    .entry((pool.address_space.as_str(), dc.as_str()))
                    .or_default()
                    .push((cidr.first(), cidr.last(), family, pool.name.as_str()));
            }
        }
    }
    let mut out: HashMap<Key, Vec<Key>> = HashMap::new();
    for ((_, dc), mut nets) in by_space {
        if nets.len() < 2 {
            continue;
        }
        nets.sort_by_key(|n| (n.2, n.0, n.1));
        // Sweep: the networks still open when the next one starts overlap it.
        let mut open: Vec<(u128, u8, &str)> = Vec::new();
        for (first, last, family, name) in nets {
            open.retain(|(end, f, _)| *f == family && *end >= first);
            for (_, _, other) in open.iter().filter(|(_, _, other)| *other != name) {
                let a = (name.to_string(), dc.to_string());
                let b = (other.to_string(), dc.to_string());
                out.entry(a.clone()).or_default().push(b.clone());
                out.entry(b).or_default().push(a);
            }
            open.push((last, family, name));
        }
    }
    for list in out.values_mut() {
        list.sort();
        list.dedup();
    }
    out
}

/// (pool, datacenter) -> the other pool datacenters of the same address space and datacenter
/// whose networks overlap it (absent when none does).
pub fn space_siblings(pools: &[PoolInput]) -> HashMap<Key, Vec<Key>> {
    let refs: Vec<&PoolInput> = pools.iter().collect();
    siblings(&refs)
}

/// Pool -> every pool it shares addresses with, directly or through others, itself included;
/// pools that share nothing are absent.
pub fn space_groups(pools: &[PoolInput]) -> HashMap<String, BTreeSet<String>> {
    let edges = space_siblings(pools);
    // Connected components over the sharing edges, each found once.
    let mut neighbours: HashMap<&str, Vec<&str>> = HashMap::new();
    for ((pool, _), others) in &edges {
        let list = neighbours.entry(pool.as_str()).or_default();
        list.extend(others.iter().map(|(p, _)| p.as_str()));
    }
    let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
    let starts: Vec<&str> = neighbours.keys().copied().collect();
    for start in starts {
        if out.contains_key(start) {
            continue;
        }
        let mut group = BTreeSet::from([start.to_string()]);
        let mut todo = vec![start];
        while let Some(pool) = todo.pop() {
            for other in neighbours.get(pool).into_iter().flatten() {
                if group.insert(other.to_string()) {
                    todo.push(other);
                }
            }
        }
        for member in &group {
            out.insert(member.clone(), group.clone());
        }
    }
    out
}

/// Stored holdings that lie, in part or whole, outside the networks of the pool datacenter
/// they are held through (the pool narrowed under them, or made again smaller over what it
/// kept): their pool's allocator holds only what lies inside, so they are set aside whole in
/// every other pool datacenter of their datacenter, whatever the space, as what an invalid
/// pool holds is. Computed from the inputs alone, so a plan of some pools sets aside exactly
/// what the whole plan does. Holdings of pool datacenters that are gone are not listed (the
/// planner keeps those aside on its own).
pub(crate) fn outside_their_pools<'a>(
    pools: impl IntoIterator<Item = &'a PoolInput>,
    stored: impl IntoIterator<Item = &'a StoredAllocation>,
) -> Vec<HeldElsewhere> {
    let pools: HashMap<&str, &PoolInput> =
        pools.into_iter().map(|p| (p.name.as_str(), p)).collect();
    let mut out = Vec::new();
    for s in stored {
        let (Some(held), None) = (&s.held, &s.unreadable) else {
            continue;
        };
        let Some(dc) = pools
            .get(s.pool.as_str())
            .and_then(|p| p.datacenters.get(&s.datacenter))
        else {
            continue;
        };
        let ranges: Vec<AddrRange> = held.ranges().collect();
        let inside: Vec<AddrRange> = dc.config.cidrs().map(|c| c.range()).collect();
        if minus(&ranges, &inside).is_empty() {
            continue;
        }
        out.push(HeldElsewhere {
            pool: s.pool.clone(),
            datacenter: s.datacenter.clone(),
            holder: s.cluster.clone(),
            addresses: ranges,
        });
    }
    out
}

/// Widens `set` to every pool that shares addresses, directly or through others, with a pool
/// in it, under the settings of `before` or of `after`.
pub fn close_over_spaces(before: &[PoolInput], after: &[PoolInput], set: &mut BTreeSet<String>) {
    let mut edges: HashMap<String, BTreeSet<String>> = HashMap::new();
    for pools in [before, after] {
        let refs: Vec<&PoolInput> = pools.iter().collect();
        for ((pool, _), others) in siblings(&refs) {
            edges
                .entry(pool)
                .or_default()
                .extend(others.into_iter().map(|(p, _)| p));
        }
    }
    if edges.is_empty() {
        return;
    }
    let mut todo: Vec<String> = set.iter().cloned().collect();
    while let Some(pool) = todo.pop() {
        for other in edges.get(&pool).into_iter().flatten() {
            if set.insert(other.clone()) {
                todo.push(other.clone());
            }
        }
    }
}

/// Sorted, merged pieces (of one family each).
pub(super) fn merged(mut ranges: Vec<AddrRange>) -> Vec<AddrRange> {
    ranges.sort();
    let mut out: Vec<AddrRange> = Vec::new();
    for r in ranges {
        if let Some(last) = out.last_mut()
            && last.family() == r.family()
            && (last.last() == u128::MAX || r.first() <= last.last() + 1)
        {
            if r.last() > last.last() {
                *last = AddrRange::new(r.family(), last.first(), r.last()).unwrap_or(*last);
            }
            continue;
        }
        out.push(r);
    }
    out
}

/// The addresses of `from` not in `minus`, sorted and merged.
pub(super) fn minus(from: &[AddrRange], minus: &[AddrRange]) -> Vec<AddrRange> {
    let minus = merged(minus.to_vec());
    let mut out = Vec::new();
    for r in merged(from.to_vec()) {
        let (family, mut first, last) = (r.family(), r.first(), r.last());
        let mut done = false;
        for m in minus.iter().filter(|m| m.overlaps(&r)) {
            if m.first() > first {
                out.extend(AddrRange::new(family, first, m.first() - 1));
            }
            if m.last() >= last {
                done = true;
                break;
            }
            first = first.max(m.last() + 1);
        }
        if !done {
            out.extend(AddrRange::new(family, first, last));
        }
    }
    out
}

/// A holder's quarantine entries in one pool datacenter: (released at, addresses).
pub(super) type Entries = Vec<(i64, Vec<AddrRange>)>;

impl Planner<'_> {
    /// Sets what `cluster` holds (and has quarantined) in `key` aside in every other pool
    /// datacenter of the space that overlaps it, replacing what was set aside for it before.
    pub(super) fn mirror(&mut self, key: &Key, cluster: &str) {
        let Some(others) = self.siblings.get(key) else {
            return;
        };
        let mut ranges: Vec<AddrRange> = Vec::new();
        if let Some(Ok(a)) = self.allocators.get(key)
            && let Some(h) = a.get(cluster)
        {
            ranges.extend(h.ranges());
        }
        // The whole quarantine entry, not only what this allocator could set aside: an
        // address excluded here (or held here through a pool that has gone) is still
        // quarantined for the space.
        if let Some(entries) = self.quarantine.get(key).and_then(|h| h.get(cluster)) {
            ranges.extend(entries.iter().flat_map(|(_, r)| r.iter().copied()));
        }
        self.mirror_ranges(key, cluster, ranges, others.clone());
    }

    /// [`Self::mirror`] of addresses given (a stored allocation whose own pool datacenter
    /// has no allocator to load it in).
    pub(super) fn mirror_ranges(
        &mut self,
        key: &Key,
        cluster: &str,
        ranges: Vec<AddrRange>,
        others: Vec<Key>,
    ) {
        let tag = shared_tag(&key.0, cluster);
        for other in &others {
            if let Some(Ok(a)) = self.allocators.get_mut(other) {
                let freed = a.give_back(&tag);
                a.set_aside(&tag, Aside::Shared, ranges.iter().copied());
                // What this set no longer covers may be quarantined in `other` for its own
                // former holders: set aside again for them, never left free.
                if freed.is_empty() {
                    continue;
                }
                if let Some(holders) = self.quarantine.get(other) {
                    for (holder, entries) in holders {
                        let theirs = entries.iter().flat_map(|(_, r)| r.iter().copied());
                        a.set_aside(&quarantine_tag(holder), Aside::Quarantined, theirs);
                    }
                }
            }
        }
        self.shared_tags
            .insert(tag, (key.0.clone(), cluster.to_string()));
    }

    /// Step 1a: what is held through pools the planner does not plan is set aside in every
    /// pool datacenter of the same datacenter whose network overlaps it.
    pub(super) fn set_aside_elsewhere(&mut self, elsewhere: &[&HeldElsewhere]) {
        for e in elsewhere {
            let tag = shared_tag(&e.pool, &e.holder);
            if let Some(claim) = e.holder.strip_prefix(ADOPTABLE_PREFIX) {
                self.adoptable.insert(claim.to_string(), tag.clone());
            }
            for ((pool, dc), allocator) in self.allocators.iter_mut() {
                if *dc != e.datacenter || *pool == e.pool {
                    continue;
                }
                if let Ok(a) = allocator {
                    a.set_aside(&tag, Aside::Shared, e.addresses.iter().copied());
                }
            }
        }
    }

    /// Step 1b: the quarantine as the inputs keep it (entries of pool datacenters gone, with
    /// no `reuseAfter` any more, or past their end are dropped), plus what step 1 released
    /// now, set aside for the former holders.
    pub(super) fn settle_quarantine(&mut self, kept: &[&Quarantined]) {
        for q in kept {
            let Some(reuse_after) = self.reuse_after(&q.pool, &q.datacenter) else {
                continue;
            };
            if reuse_after == 0 || q.until(reuse_after) <= self.now {
                continue;
            }
            self.quarantine
                .entry((q.pool.clone(), q.datacenter.clone()))
                .or_default()
                .entry(q.holder.clone())
                .or_default()
                .push((q.released_at, merged(q.addresses.clone())));
        }
        let released: Vec<(Key, String, Vec<AddrRange>)> = self
            .decisions
            .values()
            .filter(|d| d.change == super::Change::Release)
            .filter_map(|d| {
                let previous = d.previous.as_ref()?;
                Some((
                    (d.pool.clone(), d.datacenter.clone()),
                    d.cluster.clone(),
                    previous.ranges().collect(),
                ))
            })
            .collect();
        for (key, holder, ranges) in released {
            self.add_quarantine(&key, &holder, ranges);
        }
        let keys: Vec<(Key, Vec<String>)> = self
            .quarantine
            .iter()
            .map(|(k, h)| (k.clone(), h.keys().cloned().collect()))
            .collect();
        for (key, holders) in keys {
            for holder in holders {
                let ranges: Vec<AddrRange> = self.quarantine[&key][&holder]
                    .iter()
                    .flat_map(|(_, r)| r.iter().copied())
                    .collect();
                // Only what its former holder holds again here leaves the quarantine. What
                // this allocator cannot set aside now (excluded, a gateway, held through a
                // pool that has gone, outside a narrowed network) stays quarantined until its
                // period ends: the entry is kept whole, and mirrored whole to the space.
                let held: Vec<AddrRange> = match self.allocators.get_mut(&key) {
                    Some(Ok(a)) => {
                        a.set_aside(&quarantine_tag(&holder), Aside::Quarantined, ranges);
                        a.get(&holder)
                            .map(|h| h.ranges().collect())
                            .unwrap_or_default()
                    }
                    _ => Vec::new(),
                };
                if let Some(entries) = self.quarantine.get_mut(&key) {
                    let list = entries.remove(&holder).unwrap_or_default();
                    let kept: Entries = list
                        .into_iter()
                        .filter_map(|(at, r)| {
                            let rest = minus(&r, &held);
                            (!rest.is_empty()).then_some((at, rest))
                        })
                        .collect();
                    if !kept.is_empty() {
                        entries.insert(holder.clone(), kept);
                    }
                }
                self.mirror(&key, &holder);
            }
        }
    }

    /// `reuseAfter` of a pool datacenter that exists.
    fn reuse_after(&self, pool: &str, dc: &str) -> Option<u64> {
        Some(self.pools.get(pool)?.datacenters.get(dc)?.reuse_after)
    }

    /// Quarantines `ranges`, released now by `holder` from `key`, if the pool datacenter has
    /// a `reuseAfter`; addresses already quarantined for it keep their release time. (Not set
    /// aside here: see the callers.)
    pub(super) fn add_quarantine(&mut self, key: &Key, holder: &str, ranges: Vec<AddrRange>) {
        if self.reuse_after(&key.0, &key.1).unwrap_or(0) == 0 {
            return;
        }
        let entries = self
            .quarantine
            .entry(key.clone())
            .or_default()
            .entry(holder.to_string())
            .or_default();
        let known: Vec<AddrRange> = entries
            .iter()
            .flat_map(|(_, r)| r.iter().copied())
            .collect();
        let new = minus(&ranges, &known);
        if !new.is_empty() {
            entries.push((self.now, new));
        }
    }

    /// Takes `holder`'s quarantine in `key` out of the allocator (its addresses become free
    /// for it alone, for one operation); [`Self::restore_quarantine`] puts back what it did
    /// not take.
    pub(super) fn lift_quarantine(&mut self, key: &Key, holder: &str) -> Option<Entries> {
        let entries = self.quarantine.get_mut(key)?.remove(holder)?;
        if let Some(Ok(a)) = self.allocators.get_mut(key) {
            a.give_back(&quarantine_tag(holder));
        }
        Some(entries)
    }

    /// Sets aside again what of `entries` `holder` does not hold now in `key`, and tells the
    /// space.
    pub(super) fn restore_quarantine(&mut self, key: &Key, holder: &str, entries: Entries) {
        let held: Vec<AddrRange> = match self.allocators.get(key) {
            Some(Ok(a)) => a
                .get(holder)
                .map(|h| h.ranges().collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let kept: Entries = entries
            .into_iter()
            .filter_map(|(at, r)| {
                let rest = minus(&r, &held);
                (!rest.is_empty()).then_some((at, rest))
            })
            .collect();
        if !kept.is_empty() {
            if let Some(Ok(a)) = self.allocators.get_mut(key) {
                let ranges: Vec<AddrRange> =
                    kept.iter().flat_map(|(_, r)| r.iter().copied()).collect();
                a.set_aside(&quarantine_tag(holder), Aside::Quarantined, ranges);
            }
            self.quarantine
                .entry(key.clone())
                .or_default()
                .insert(holder.to_string(), kept);
        }
        self.mirror(key, holder);
    }

    /// The quarantine after the plan, sorted.
    pub(super) fn quarantine_list(&self) -> Vec<Quarantined> {
        let mut out = Vec::new();
        for ((pool, dc), holders) in &self.quarantine {
            for (holder, entries) in holders {
                // One entry per release time: a record names an entry by holder and time,
                // so two releases of one holder in the same second are one entry.
                let mut by_time: BTreeMap<i64, Vec<AddrRange>> = BTreeMap::new();
                for (at, ranges) in entries {
                    by_time
                        .entry(*at)
                        .or_default()
                        .extend(ranges.iter().copied());
                }
                for (at, ranges) in by_time {
                    out.push(Quarantined {
                        pool: pool.clone(),
                        datacenter: dc.clone(),
                        holder: holder.clone(),
                        released_at: at,
                        addresses: merged(ranges),
                    });
                }
            }
        }
        out.sort();
        out
    }
}
