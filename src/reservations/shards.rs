//! How the record of a pool datacenter is divided into shards by address block (pure: no
//! client).
//!
//! One `IPAMPoolRecord` listing every cluster of a pool datacenter grows with the seed: at
//! 10,000 clusters it is half a megabyte, and the API server rewrites and validates all of it
//! for every new cluster. So the record is kept as several objects, one per aligned block of
//! the pool's addresses (a *shard*), each listing the part of every cluster's holding that
//! lies in its block. The fence is unchanged per address: an address lies in exactly one
//! block, so any two commits that could hand it out write the same shard, each conditional on
//! the version it planned from, and the API server lets only one of them through.
//!
//! The block size comes from the pool's type, its network and, for `prefix` pools, the
//! allocation prefix — and once a pool datacenter has shards, from the shards themselves
//! ([`Layout::keeping`]), so that widening `poolCidr` or adding `additionalCidrs` never changes
//! the division: every replica divides the same addresses the same way, whichever version of
//! the pool it read; see `docs/design.md`.

use std::collections::BTreeMap;

use super::{allocation_of, merged};
use crate::address::{AddrRange, Cidr};
use crate::resources::{AllocationType, IPAMPoolDatacenter, Reservation};

/// Blocks one entry may cover before its commit is refused: a holding covers at most the
/// pool's 4,096 blocks (once per piece), so this guards against a bug, not a limit anyone
/// meets.
pub const MAX_BLOCKS_PER_ENTRY: usize = 1 << 16;

/// How one pool datacenter's addresses are divided into blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The pool datacenter's network: nothing outside it and `more` can be handed out from
    /// the pool, so nothing outside them needs fencing (a holding is recorded as far as it
    /// lies inside).
    pool: Cidr,
    /// The pool datacenter's `additionalCidrs`.
    more: Vec<Cidr>,
    /// The prefix length of a block.
    block_len: u8,
    /// The longest block length that keeps every allocation subnet in one block (`prefix`
    /// pools: the allocation prefix; `range` pools: the family's width).
    longest: u8,
}

impl Layout {
    /// The layout of a pool datacenter:
    /// - `prefix` pools: blocks of 256 allocation subnets, or larger so that the pool has at
    ///   most 4,096 blocks; a subnet of the allocation prefix always lies in one block.
    /// - `range` pools: blocks of 256 addresses, or larger so that the pool has at most 4,096
    ///   blocks (the allocation size may change, so it does not count).
    ///
    /// Never larger than the pool itself.
    pub fn of(dc: &IPAMPoolDatacenter) -> Result<Layout, String> {
        let pool: Cidr = dc
            .pool_cidr
            .parse()
            .map_err(|e| format!("poolCidr {:?}: {e}", dc.pool_cidr))?;
        let bits = pool.family().bits();
        let pool_host = bits - pool.prefix_len();
        let (block_host, longest) = match dc.type_ {
            AllocationType::Prefix => {
                let p = dc
                    .allocation_prefix
                    .ok_or_else(|| "allocationPrefix is missing".to_string())?;
                let p = u8::try_from(p)
                    .ok()
                    .filter(|p| (pool.prefix_len()..=bits).contains(p))
                    .ok_or_else(|| {
                        format!(
                            "allocationPrefix {p}: not between the pool's prefix length {} and {bits}",
                            pool.prefix_len()
                        )
                    })?;
                let host = (bits - p)
                    .saturating_add(8)
                    .max(pool_host.saturating_sub(12));
                (host, p)
            }
            AllocationType::Range => (8u8.max(pool_host.saturating_sub(12)), bits),
        };
        let more = dc
            .additional_cidrs
            .iter()
            .map(|t| {
                t.parse::<Cidr>()
                    .map_err(|e| format!("additionalCidrs {t:?}: {e}"))
            })
            .collect::<Result<Vec<Cidr>, String>>()?;
        Ok(Layout {
            pool,
            more,
            block_len: bits - block_host.min(pool_host),
            longest,
        })
    }

    /// The division the pool datacenter's existing shards (their `spec.block`s) already use,
    /// when they all agree on a block length that suits the pool; else this layout. A
    /// division once taken stays: a pool widened, or given another CIDR, keeps dividing its
    /// old addresses exactly as before, so two replicas that read different versions of the
    /// pool still write the same shard for the same address.
    pub fn keeping(mut self, existing: impl IntoIterator<Item = Cidr>) -> Layout {
        let family = self.pool.family();
        let mut lengths = existing
            .into_iter()
            .filter(|b| b.family() == family)
            .map(|b| b.prefix_len());
        let Some(first) = lengths.next() else {
            return self;
        };
        if lengths.any(|l| l != first) {
            return self;
        }
        // A `prefix` pool's layout never splits an allocation subnet: a block at most as long
        // as the allocation prefix (the old layout's was, and allocationPrefix is immutable).
        if first > self.longest {
            return self;
        }
        self.block_len = first;
        self
    }

    /// This layout with blocks of prefix length `len` — the length the pool datacenter's
    /// layout record fixes (`spec.blockLength`), whatever the pool's fields say now. A length
    /// beyond the family's width is taken as the width (a record kept across a change of the
    /// pool's family: every replica computes the same).
    pub fn with_block_len(mut self, len: u8) -> Layout {
        self.block_len = len.min(self.pool.family().bits());
        self
    }

    /// A layout of blocks of `len` over every address of `family`: for raising the fences of
    /// an invalid pool whose networks cannot be read (its blocks are known from its layout
    /// record or its shards, its reach is not).
    pub fn unbounded(family: crate::address::Family, len: u8) -> Option<Layout> {
        let bits = family.bits();
        Some(Layout {
            // `::/0` and `0.0.0.0/0`: `new` accepts them.
            pool: Cidr::new(family, 0, 0)?,
            more: Vec::new(),
            block_len: len.min(bits),
            longest: bits,
        })
    }

    /// The family of the pool's addresses.
    pub fn family(&self) -> crate::address::Family {
        self.pool.family()
    }

    /// The block length, for tests and messages.
    pub fn block_len(&self) -> u8 {
        self.block_len
    }

    /// Every CIDR of the pool datacenter.
    pub fn cidrs(&self) -> impl Iterator<Item = &Cidr> {
        std::iter::once(&self.pool).chain(self.more.iter())
    }

    /// This layout reaching `networks` as well (those of the same family): the networks its
    /// layout record remembers, where a replica that has not seen the pool narrowed may still
    /// commit, so fences are raised and holdings recorded there too.
    pub fn with_networks(mut self, networks: impl IntoIterator<Item = Cidr>) -> Layout {
        let family = self.pool.family();
        for n in networks {
            if n.family() == family && !self.cidrs().any(|c| c.contains(&n.range())) {
                self.more.push(n);
            }
        }
        self
    }

    /// The blocks covering the addresses of `ranges` that lie in the pool (at most
    /// [`MAX_BLOCKS_PER_ENTRY`]; `Err` beyond, which only a bug can reach).
    pub fn blocks_covering(
        &self,
        ranges: impl IntoIterator<Item = AddrRange>,
    ) -> Result<std::collections::BTreeSet<Cidr>, String> {
        let mut out = std::collections::BTreeSet::new();
        let family = self.pool.family();
        for r in ranges {
            if r.family() != family {
                continue;
            }
            // Every CIDR of the pool datacenter: a holding in an additional CIDR is fenced
            // as surely as one in `poolCidr`.
            for c in self.cidrs() {
                let (mut first, last) = (r.first().max(c.first()), r.last().min(c.last()));
                while first <= last {
                    let block = self.block_of(first);
                    out.insert(block);
                    if out.len() > MAX_BLOCKS_PER_ENTRY {
                        return Err(format!(
                            "{r} covers more than {MAX_BLOCKS_PER_ENTRY} blocks"
                        ));
                    }
                    match block.last().checked_add(1) {
                        Some(next) => first = next,
                        None => break,
                    }
                }
            }
        }
        Ok(out)
    }

    /// The block holding `address` (an address of the pool).
    fn block_of(&self, address: u128) -> Cidr {
        let family = self.pool.family();
        let host = u32::from(family.bits() - self.block_len);
        let first = if host >= 128 {
            0
        } else {
            (address >> host) << host
        };
        // Aligned by construction, inside the pool: `new` cannot refuse it.
        Cidr::new(family, first, self.block_len).unwrap_or(self.pool)
    }

    /// `entry` divided by block: each block's part, in a canonical form (so that a part
    /// compares equal to what an earlier split of the same holding wrote). A subnet that fits
    /// in one block keeps its `cidr` form; everything else becomes sorted, merged `addresses`.
    /// Addresses outside the pool (only an object edited by hand shows such) are left out:
    /// the pool never hands them out, so no commit needs to meet another over them.
    pub fn split(&self, entry: &Reservation) -> Result<BTreeMap<Cidr, Reservation>, String> {
        let mut out = BTreeMap::new();
        if let (Some(text), true) = (&entry.cidr, entry.addresses.is_empty()) {
            let cidr: Cidr = text.parse().map_err(|e| format!("cidr {text:?}: {e}"))?;
            if self.cidrs().any(|c| c.contains(&cidr.range())) {
                let block = self.block_of(cidr.first());
                if block.prefix_len() <= cidr.prefix_len() {
                    out.insert(block, entry.clone());
                    return Ok(out);
                }
            }
        }
        let held = allocation_of(entry)?;
        let family = self.pool.family();
        let mut pieces: BTreeMap<Cidr, Vec<AddrRange>> = BTreeMap::new();
        let mut count = 0usize;
        for range in held.ranges() {
            if range.family() != family {
                continue;
            }
            // The part of the range inside each CIDR of the pool.
            let inside: Vec<(u128, u128)> = self
                .cidrs()
                .map(|c| (range.first().max(c.first()), range.last().min(c.last())))
                .filter(|(f, e)| f <= e)
                .collect();
            for (mut first, end) in inside {
                loop {
                    let block = self.block_of(first);
                    let last = block.last().min(end);
                    pieces
                        .entry(block)
                        .or_default()
                        .push(AddrRange::new(family, first, last).unwrap_or(range));
                    count += 1;
                    if count > MAX_BLOCKS_PER_ENTRY {
                        return Err(format!(
                            "it covers more than {MAX_BLOCKS_PER_ENTRY} record blocks of /{}",
                            self.block_len
                        ));
                    }
                    if last >= end {
                        break;
                    }
                    first = last + 1;
                }
            }
        }
        for (block, ranges) in pieces {
            let ranges = merged(ranges);
            let whole_block = ranges.len() == 1 && ranges[0] == block.range();
            let part = if whole_block && entry.addresses.is_empty() {
                // A subnet larger than a block: each block it covers, as a subnet.
                Reservation {
                    cidr: Some(block.to_string()),
                    addresses: Vec::new(),
                }
            } else {
                Reservation {
                    cidr: None,
                    addresses: ranges.iter().map(|r| r.to_string()).collect(),
                }
            };
            out.insert(block, part);
        }
        Ok(out)
    }
}

/// The name of the shard of `pool`'s record in `datacenter` that covers `block`:
/// `<pool>.<datacenter>.<first address in hex>-<prefix length>`, for example
/// `metallb.dc-1.0a000400-22` for `10.0.4.0/22`. (The record written before records were
/// sharded is `<pool>.<datacenter>`; pool and datacenter names hold no dot.)
pub fn shard_name(pool: &str, datacenter: &str, block: &Cidr) -> String {
    let width = usize::from(block.family().bits() / 4);
    format!(
        "{pool}.{datacenter}.{:0width$x}-{}",
        block.first(),
        block.prefix_len()
    )
}

/// The networks a layout record remembers, `held` and `current` together: each CIDR once,
/// those inside another left out, sorted.
pub fn union_networks(held: &[Cidr], current: &[Cidr]) -> Vec<Cidr> {
    let all: Vec<Cidr> = held.iter().chain(current).copied().collect();
    let mut out: Vec<Cidr> = Vec::new();
    for (i, c) in all.iter().enumerate() {
        let inside_another = all
            .iter()
            .enumerate()
            .any(|(j, o)| j != i && o.contains(&c.range()) && (o.range() != c.range() || j < i));
        if !inside_another {
            out.push(*c);
        }
    }
    out.sort_by_key(|c| (c.family().bits(), c.first(), c.prefix_len()));
    out
}

/// Where a layout record stands against a pool read at `generation` with the networks
/// `current` ([`LayoutState`]): `networks` and `written_for` are its `spec.networks` and
/// `spec.poolGeneration`.
pub fn layout_state(
    networks: &[String],
    written_for: Option<i64>,
    current: &[Cidr],
    generation: i64,
) -> LayoutState {
    let written_for = written_for.unwrap_or(0);
    if written_for > generation {
        return LayoutState::Ahead;
    }
    let had: Vec<Cidr> = networks.iter().filter_map(|n| n.parse().ok()).collect();
    let union = union_networks(&had, current);
    if written_for == generation && union == had {
        LayoutState::Current
    } else {
        LayoutState::Behind(union)
    }
}

/// A layout record against the pool as one replica reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutState {
    /// Written for this generation, every current network listed.
    Current,
    /// Written for a newer generation of the pool: the reader's view is older.
    Ahead,
    /// To be written for this generation, listing these networks.
    Behind(Vec<Cidr>),
}

/// The parts of `networks` (a layout record's) that none of `current` holds: where a pool
/// datacenter reached before it was narrowed.
pub fn former_networks(networks: &[Cidr], current: &[Cidr]) -> Vec<Cidr> {
    networks
        .iter()
        .filter(|n| !current.iter().any(|c| c.contains(&n.range())))
        .copied()
        .collect()
}

/// The name of the layout record of `pool` in `datacenter`: `<pool>.<datacenter>.layout`
/// (a shard's last part is `<hex>-<length>`, never `layout`).
pub fn layout_name(pool: &str, datacenter: &str) -> String {
    format!("{pool}.{datacenter}.layout")
}

/// One cluster's holding put together again from its parts in several shards: the
/// addresses of all parts, sorted and merged; a single subnet when the parts were subnets
/// that make one. A part that does not parse is kept as written, so that reading the entry
/// reports it.
pub fn join<'a>(parts: impl IntoIterator<Item = &'a Reservation>) -> Reservation {
    let parts: Vec<&Reservation> = parts.into_iter().collect();
    if let [one] = parts.as_slice() {
        return (*one).clone();
    }
    let mut ranges = Vec::new();
    let mut subnets_only = true;
    for part in &parts {
        subnets_only &= part.addresses.is_empty();
        match allocation_of(part) {
            Ok(a) => ranges.extend(a.ranges()),
            Err(_) => return concatenated(&parts),
        }
    }
    let ranges = merged(ranges);
    if subnets_only
        && let [range] = ranges.as_slice()
        && let Some(cidr) = as_cidr(range)
    {
        return Reservation {
            cidr: Some(cidr.to_string()),
            addresses: Vec::new(),
        };
    }
    Reservation {
        cidr: None,
        addresses: ranges.iter().map(|r| r.to_string()).collect(),
    }
}

/// Every part's text as one entry (the first subnet as `cidr`, everything else as
/// `addresses`).
fn concatenated(parts: &[&Reservation]) -> Reservation {
    let mut out = Reservation::default();
    for part in parts {
        if let Some(c) = &part.cidr {
            if out.cidr.is_none() {
                out.cidr = Some(c.clone());
            } else {
                out.addresses.push(c.clone());
            }
        }
        out.addresses.extend(part.addresses.iter().cloned());
    }
    out
}

/// The subnet that is exactly `range`, if there is one.
fn as_cidr(range: &AddrRange) -> Option<Cidr> {
    let span = range.last() - range.first();
    let host = 128 - span.leading_zeros();
    // `span + 1` a power of two: all bits of `span` below its highest are set.
    if span != 0 && span.count_ones() != host {
        return None;
    }
    let len = range
        .family()
        .bits()
        .checked_sub(u8::try_from(host).ok()?)?;
    Cidr::new(range.family(), range.first(), len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::AllocationType;

    fn cidrs(list: &[&str]) -> Vec<Cidr> {
        list.iter().map(|c| c.parse().unwrap()).collect()
    }

    #[test]
    fn a_layout_record_remembers_every_network_once_and_reports_where_it_stands() {
        // Widened: the wider network holds the narrower one.
        assert_eq!(
            union_networks(&cidrs(&["10.0.0.0/26"]), &cidrs(&["10.0.0.0/25"])),
            cidrs(&["10.0.0.0/25"])
        );
        // Narrowed back, and a CIDR added: nothing is forgotten, each listed once.
        let held = cidrs(&["10.0.0.0/25", "10.1.0.0/24"]);
        assert_eq!(
            union_networks(&held, &cidrs(&["10.0.0.0/26", "10.1.0.0/24", "fd00::/64"])),
            cidrs(&["10.0.0.0/25", "10.1.0.0/24", "fd00::/64"])
        );
        assert_eq!(
            former_networks(&held, &cidrs(&["10.0.0.0/26"])),
            cidrs(&["10.0.0.0/25", "10.1.0.0/24"])
        );
        assert!(former_networks(&held, &cidrs(&["10.0.0.0/24", "10.1.0.0/24"])).is_empty());
        let texts: Vec<String> = held.iter().map(ToString::to_string).collect();
        let current = cidrs(&["10.0.0.0/26"]);
        assert_eq!(
            layout_state(&texts, Some(3), &current, 3),
            LayoutState::Current
        );
        assert_eq!(
            layout_state(&texts, Some(4), &current, 3),
            LayoutState::Ahead
        );
        assert_eq!(
            layout_state(&texts, Some(2), &current, 3),
            LayoutState::Behind(held.clone())
        );
        // A layout record written before it kept networks.
        assert_eq!(
            layout_state(&[], None, &current, 1),
            LayoutState::Behind(current.clone())
        );
    }

    fn dc(type_: AllocationType, cidr: &str, prefix: Option<i32>) -> IPAMPoolDatacenter {
        IPAMPoolDatacenter {
            type_,
            pool_cidr: cidr.into(),
            allocation_prefix: prefix,
            allocation_range: (type_ == AllocationType::Range).then_some(4),
            ..Default::default()
        }
    }

    fn addresses(list: &[&str]) -> Reservation {
        Reservation {
            cidr: None,
            addresses: list.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn subnet(text: &str) -> Reservation {
        Reservation {
            cidr: Some(text.into()),
            addresses: Vec::new(),
        }
    }

    #[test]
    fn blocks_hold_a_bounded_share_of_the_pool() {
        let len = |d: IPAMPoolDatacenter| Layout::of(&d).unwrap().block_len;
        // 256 subnets of /64 per block, a /44 pool in 4,096 blocks.
        assert_eq!(
            len(dc(AllocationType::Prefix, "2001:db8::/44", Some(64))),
            56
        );
        // A /8 of /30s: 256 subnets per block would be 2^14 blocks; 4,096 at most.
        assert_eq!(len(dc(AllocationType::Prefix, "10.0.0.0/8", Some(30))), 20);
        // A pool smaller than a block is one block.
        assert_eq!(len(dc(AllocationType::Prefix, "10.0.0.0/26", Some(28))), 26);
        // Ranges: blocks of 256 addresses, at most 4,096 of them.
        assert_eq!(len(dc(AllocationType::Range, "10.0.0.0/12", None)), 24);
        assert_eq!(len(dc(AllocationType::Range, "10.0.0.0/8", None)), 20);
        assert_eq!(len(dc(AllocationType::Range, "10.0.0.0/28", None)), 28);
        assert_eq!(len(dc(AllocationType::Range, "::/0", None)), 12);
        assert!(Layout::of(&dc(AllocationType::Prefix, "10.0.0.0/8", None)).is_err());
        assert!(Layout::of(&dc(AllocationType::Prefix, "10.0.0.0/8", Some(4))).is_err());
        assert!(Layout::of(&dc(AllocationType::Range, "10.0.0.1/8", None)).is_err());
    }

    #[test]
    fn a_holding_is_split_at_block_edges_and_joined_back() {
        let layout = Layout::of(&dc(AllocationType::Range, "10.0.0.0/16", None)).unwrap();
        // Blocks of 256: a piece across an edge, pieces out of order, adjacent pieces.
        let entry = addresses(&[
            "10.0.3.250-10.0.4.5",
            "10.0.1.8-10.0.1.11",
            "10.0.1.4-10.0.1.7",
        ]);
        let parts = layout.split(&entry).unwrap();
        let shown: Vec<(String, Vec<String>)> = parts
            .iter()
            .map(|(b, r)| (b.to_string(), r.addresses.clone()))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("10.0.1.0/24".into(), vec!["10.0.1.4-10.0.1.11".into()]),
                ("10.0.3.0/24".into(), vec!["10.0.3.250-10.0.3.255".into()]),
                ("10.0.4.0/24".into(), vec!["10.0.4.0-10.0.4.5".into()]),
            ]
        );
        let joined = join(parts.values());
        assert_eq!(
            joined.addresses,
            vec!["10.0.1.4-10.0.1.11", "10.0.3.250-10.0.4.5"]
        );
        // The same addresses: the same parts, whatever their order.
        assert_eq!(layout.split(&joined).unwrap(), parts);
    }

    #[test]
    fn a_subnet_stays_a_subnet() {
        let layout = Layout::of(&dc(AllocationType::Prefix, "10.0.0.0/16", Some(28))).unwrap();
        let parts = layout.split(&subnet("10.0.17.32/28")).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts.keys().next().unwrap().to_string(), "10.0.16.0/20");
        assert_eq!(parts.values().next().unwrap(), &subnet("10.0.17.32/28"));
        // A subnet larger than a block (a pin): one subnet part per block, joined back whole.
        let parts = layout.split(&subnet("10.0.0.0/18")).unwrap();
        assert_eq!(parts.len(), 4);
        assert!(parts.iter().all(|(b, r)| r == &subnet(&b.to_string())));
        assert_eq!(join(parts.values()), subnet("10.0.0.0/18"));
    }

    #[test]
    fn addresses_outside_the_pool_are_left_out_and_unreadable_parts_kept() {
        let layout = Layout::of(&dc(AllocationType::Range, "10.0.0.0/16", None)).unwrap();
        let other_family = layout.split(&addresses(&["2001:db8::1-2001:db8::4"]));
        assert!(other_family.unwrap().is_empty());
        // A hand-made holding of everything: only the pool's part, block by block.
        let parts = layout
            .split(&addresses(&["0.0.0.0-255.255.255.255"]))
            .unwrap();
        assert_eq!(parts.len(), 256);
        assert!(
            parts
                .iter()
                .all(|(b, r)| r.addresses == vec![b.range().to_string()])
        );
        let parts = layout.split(&subnet("10.0.0.0/8")).unwrap();
        assert_eq!(parts.len(), 256);
        assert!(parts.iter().all(|(b, r)| r == &subnet(&b.to_string())));
        assert!(layout.split(&addresses(&["10.0.0.300"])).is_err());
        let odd = join([
            &addresses(&["10.0.0.1-10.0.0.2"]),
            &addresses(&["nonsense"]),
        ]);
        assert!(allocation_of(&odd).is_err());
        assert!(odd.addresses.contains(&"nonsense".to_string()));
    }

    #[test]
    fn a_widened_pool_keeps_the_division_its_shards_use() {
        let small = dc(AllocationType::Range, "10.0.0.0/26", None);
        let before = Layout::of(&small).unwrap();
        assert_eq!(before.block_len(), 26);
        let mut wide = dc(AllocationType::Range, "10.0.0.0/25", None);
        wide.additional_cidrs = vec!["10.9.0.0/24".into()];
        // Without shards, the widened pool would be divided in /25s ...
        assert_eq!(Layout::of(&wide).unwrap().block_len(), 25);
        // ... but its shards are /26 blocks: it keeps those, for old and new addresses.
        let block: Cidr = "10.0.0.0/26".parse().unwrap();
        let after = Layout::of(&wide).unwrap().keeping([block]);
        assert_eq!(after.block_len(), 26);
        let entry = addresses(&["10.0.0.60-10.0.0.67", "10.9.0.1"]);
        let blocks: Vec<String> = after
            .split(&entry)
            .unwrap()
            .keys()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(blocks, vec!["10.0.0.0/26", "10.0.0.64/26", "10.9.0.0/26"]);
        // The old pool's view of the same holding writes the same shard for its addresses.
        let old: Vec<String> = before
            .split(&entry)
            .unwrap()
            .keys()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(old, vec!["10.0.0.0/26"]);
        // Shards that disagree, or blocks that would cut an allocation subnet: the pool's own.
        let other: Cidr = "10.0.0.64/27".parse().unwrap();
        assert_eq!(
            Layout::of(&wide)
                .unwrap()
                .keeping([block, other])
                .block_len(),
            25
        );
        let prefix = dc(AllocationType::Prefix, "10.0.0.0/24", Some(28));
        let fine: Cidr = "10.0.0.0/30".parse().unwrap();
        assert_eq!(Layout::of(&prefix).unwrap().keeping([fine]).block_len(), 24);
    }

    #[test]
    fn addresses_in_additional_cidrs_are_recorded_and_gaps_are_not() {
        let mut settings = dc(AllocationType::Range, "10.0.0.0/24", None);
        settings.additional_cidrs = vec!["10.0.2.0/24".into()];
        let layout = Layout::of(&settings).unwrap();
        let parts = layout.split(&addresses(&["10.0.0.250-10.0.2.3"])).unwrap();
        let shown: Vec<(String, Vec<String>)> = parts
            .iter()
            .map(|(b, r)| (b.to_string(), r.addresses.clone()))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("10.0.0.0/24".into(), vec!["10.0.0.250-10.0.0.255".into()]),
                ("10.0.2.0/24".into(), vec!["10.0.2.0-10.0.2.3".into()]),
            ]
        );
        let mut bad = settings.clone();
        bad.additional_cidrs = vec!["10.0.2.1/24".into()];
        assert!(Layout::of(&bad).is_err());
    }

    /// The fence over an address space raises the blocks of another pool that a new holding
    /// covers: those in its additional CIDRs as well as those in its `poolCidr`.
    #[test]
    fn the_blocks_covering_a_holding_include_additional_cidrs() {
        let mut settings = dc(AllocationType::Range, "10.0.0.0/24", None);
        settings.additional_cidrs = vec!["10.0.2.0/24".into()];
        let layout = Layout::of(&settings).unwrap();
        let blocks: Vec<String> = layout
            .blocks_covering([
                AddrRange::parse_lenient("10.0.2.8-10.0.2.15").unwrap(),
                AddrRange::parse_lenient("10.0.1.0-10.0.1.9").unwrap(),
            ])
            .unwrap()
            .iter()
            .map(|b| b.to_string())
            .collect();
        // 10.0.1.x lies in neither CIDR: nothing of this pool to fence there.
        assert_eq!(blocks, vec!["10.0.2.0/24".to_string()]);
    }

    #[test]
    fn shard_names_are_dns_subdomains_that_name_the_block() {
        let v4: Cidr = "10.0.4.0/22".parse().unwrap();
        assert_eq!(
            shard_name("metallb", "dc-1", &v4),
            "metallb.dc-1.0a000400-22"
        );
        let v6: Cidr = "2001:db8:100::/56".parse().unwrap();
        assert_eq!(
            shard_name("p", "d", &v6),
            "p.d.20010db8010000000000000000000000-56"
        );
    }
}
