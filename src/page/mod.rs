//! The pool web page's data, computed from plain data: the pools as stored, and what each
//! allocation holds. No client, no clock, no file.
//!
//! The controller's REST API serves it from its caches and ledger (`crate::api::ui`), and
//! `kipam offline --report` writes it into one HTML file (`crate::offline`); both build it
//! here, so the served page and the report show the same figures.
//!
//! - [`PoolDc`] and [`Holding`] are what the page reads of a pool datacenter and of an
//!   allocation.
//! - [`Layout`] is one pool datacenter as disjoint segments (held, excluded), in address
//!   order. Usage, the address map and the lookup are read from it. Building it costs
//!   `O(k log k)` for `k` holdings and exclusions: the pool's size never matters, so an IPv6
//!   /48 costs what an IPv4 /24 with the same holders costs.
//! - [`map`] cuts a slice of a pool into a fixed number of equal cells, [`lookup`] answers
//!   "who holds this address or CIDR", [`view`] is the JSON model and [`html`] the page
//!   itself.
//!
//! All address arithmetic is exact (`u128` and [`AddressCount`]): no floats.

pub mod html;
pub mod lookup;
pub mod map;
pub mod view;

use std::collections::BTreeSet;

use crate::address::{AddrRange, AddressCount, Cidr, Family};
use crate::resources::{
    AllocationPhase, AllocationType, IPAMAllocationSpec, IPAMAllocationStatus, IPAMPool,
    IPAMPoolDatacenter, allocation_phase, cluster_of_namespace,
};

/// One allocation as the page shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    pub cluster: String,
    /// The allocation's namespace (`cluster-<name>`).
    pub namespace: String,
    pub pool: String,
    pub datacenter: String,
    /// What it holds, as stored; empty for a failed, pending or released allocation.
    pub ranges: Vec<AddrRange>,
    /// `spec.cidr` or `spec.addresses`, as written.
    pub addresses: String,
    pub phase: AllocationPhase,
    /// `status.message`.
    pub message: String,
    /// A piece of the spec that does not parse (what and why).
    pub unreadable: Option<String>,
}

impl Holding {
    /// Reads an allocation's parts. A piece that does not parse is skipped and named in
    /// [`Holding::unreadable`]; nothing is guessed.
    pub fn of(
        namespace: &str,
        pool: &str,
        spec: &IPAMAllocationSpec,
        status: Option<&IPAMAllocationStatus>,
    ) -> Holding {
        let phase = allocation_phase(spec, status);
        let mut ranges = Vec::new();
        let mut unreadable = None;
        let released = phase == AllocationPhase::Released;
        let addresses = match spec.type_ {
            AllocationType::Prefix => spec.cidr.clone().unwrap_or_default(),
            AllocationType::Range => spec.addresses.join(", "),
        };
        if !released {
            match (&spec.type_, &spec.cidr) {
                (AllocationType::Prefix, Some(text)) => match text.parse::<Cidr>() {
                    Ok(c) => ranges.push(c.range()),
                    Err(e) => unreadable = Some(format!("spec.cidr: {e}")),
                },
                (AllocationType::Prefix, None) => {}
                (AllocationType::Range, _) => {
                    for (i, text) in spec.addresses.iter().enumerate() {
                        match text.parse::<AddrRange>() {
                            Ok(r) => ranges.push(r),
                            Err(e) => unreadable = Some(format!("spec.addresses[{i}]: {e}")),
                        }
                    }
                }
            }
        }
        ranges.sort();
        Holding {
            cluster: cluster_of_namespace(namespace)
                .unwrap_or(namespace)
                .to_string(),
            namespace: namespace.to_string(),
            pool: pool.to_string(),
            datacenter: spec.dc.clone(),
            ranges,
            addresses,
            phase,
            message: status.and_then(|s| s.message.clone()).unwrap_or_default(),
            unreadable,
        }
    }

    /// Why an admin should look at it first: `Failed`, `Conflict`, or a spec that does not
    /// parse. Overlaps between holders are found by [`Layout`].
    pub fn attention(&self) -> Option<&'static str> {
        if self.unreadable.is_some() {
            return Some("Unreadable");
        }
        match self.phase {
            AllocationPhase::Failed => Some("Failed"),
            AllocationPhase::Conflict => Some("Conflict"),
            _ => None,
        }
    }

    /// Addresses held (pieces summed; pieces of another family than the pool's count too).
    pub fn size(&self) -> AddressCount {
        self.ranges
            .iter()
            .fold(AddressCount::ZERO, |sum, r| sum.saturating_add(r.size()))
    }
}

/// A pool in one datacenter, as the page reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolDc {
    pub pool: String,
    pub datacenter: String,
    /// `range` or `prefix`.
    pub type_: &'static str,
    /// `None` when `poolCidr` does not parse (see `problems`).
    pub cidr: Option<Cidr>,
    pub cidr_text: String,
    /// Exclusions inside the pool, as given (they may overlap each other).
    pub exclusions: Vec<AddrRange>,
    /// What a cluster gets by default: `8 addresses`, `/30`.
    pub request: String,
    /// What cannot be read or does not fit: the page shows it instead of guessing.
    pub problems: Vec<String>,
}

/// The pool's CIDR in one datacenter, when it parses (cheap: for choosing lookup candidates).
pub fn cidr_of(dc: &IPAMPoolDatacenter) -> Option<Cidr> {
    dc.pool_cidr.trim().parse().ok()
}

/// Every datacenter of a pool, in name order.
pub fn pool_dcs(pool: &IPAMPool) -> Vec<PoolDc> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    pool.spec
        .datacenters
        .iter()
        .map(|(dc, spec)| pool_dc(&name, dc, spec))
        .collect()
}

/// One datacenter of pool `pool`.
pub fn pool_dc(pool: &str, datacenter: &str, spec: &IPAMPoolDatacenter) -> PoolDc {
    let mut problems = Vec::new();
    let cidr = match spec.pool_cidr.trim().parse::<Cidr>() {
        Ok(c) => Some(c),
        Err(e) => {
            problems.push(format!("poolCidr: {e}"));
            None
        }
    };
    let mut exclusions = Vec::new();
    let given = spec
        .exclude_ranges
        .iter()
        .map(|t| ("excludeRanges", t))
        .chain(spec.exclude_prefixes.iter().map(|t| ("excludePrefixes", t)));
    for (field, text) in given {
        match AddrRange::parse_lenient(text) {
            Ok(r) => match cidr {
                Some(c) if c.contains(&r) => exclusions.push(r),
                Some(c) if c.range().overlaps(&r) => {
                    problems.push(format!("{field}: {text:?} reaches outside the pool"));
                    exclusions.push(clip(&r, &c.range()));
                }
                Some(_) => problems.push(format!("{field}: {text:?} is outside the pool")),
                None => {}
            },
            Err(e) => problems.push(format!("{field}: {e}")),
        }
    }
    let (type_, request) = match spec.type_ {
        AllocationType::Range => (
            "range",
            match spec.allocation_range {
                Some(1) => "1 address".to_string(),
                Some(n) => format!("{n} addresses"),
                None => String::new(),
            },
        ),
        AllocationType::Prefix => (
            "prefix",
            spec.allocation_prefix
                .map(|p| format!("/{p}"))
                .unwrap_or_default(),
        ),
    };
    PoolDc {
        pool: pool.to_string(),
        datacenter: datacenter.to_string(),
        type_,
        cidr,
        cidr_text: spec.pool_cidr.clone(),
        exclusions,
        request,
        problems,
    }
}

/// `r` cut to `bounds` (they overlap).
fn clip(r: &AddrRange, bounds: &AddrRange) -> AddrRange {
    AddrRange::new(
        r.family(),
        r.first().max(bounds.first()),
        r.last().min(bounds.last()),
    )
    .unwrap_or(*bounds)
}

/// What a segment of a pool is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Held by the holding at this index (of the slice the layout was built from).
    Held(usize),
    Excluded,
}

/// A run of addresses with one owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub first: u128,
    pub last: u128,
    pub owner: Owner,
}

impl Segment {
    pub fn size(&self) -> AddressCount {
        AddressCount::span(self.first, self.last)
    }
}

/// One pool datacenter as disjoint segments in address order. Where two holdings overlap
/// (a conflict kipam reports), the one that starts first owns the shared addresses and both
/// are in [`Layout::overlapping`]; where a holding overlaps an exclusion, the holding owns
/// it (the address is not free either way).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub family: Family,
    pub first: u128,
    pub last: u128,
    pub segments: Vec<Segment>,
    /// Indexes of holdings that share addresses with another holding.
    pub overlapping: BTreeSet<usize>,
}

impl Layout {
    /// The layout of `dc` with `holdings` (those of this pool datacenter); `None` when the
    /// pool's CIDR does not parse. Pieces outside the pool or of the other family are left
    /// out (what they hold is not in this pool).
    pub fn build(dc: &PoolDc, holdings: &[&Holding]) -> Option<Layout> {
        let cidr = dc.cidr?;
        let bounds = cidr.range();
        let mut pieces: Vec<(u128, u128, usize)> = Vec::new();
        for (i, h) in holdings.iter().enumerate() {
            for r in &h.ranges {
                if r.overlaps(&bounds) {
                    let c = clip(r, &bounds);
                    pieces.push((c.first(), c.last(), i));
                }
            }
        }
        pieces.sort_unstable();
        let mut held: Vec<Segment> = Vec::with_capacity(pieces.len());
        let mut overlapping = BTreeSet::new();
        // The first address not yet owned (`None`: the family's end was reached).
        let mut next: Option<u128> = Some(bounds.first());
        for (first, last, i) in pieces {
            // Addresses of this piece already owned: every segment there overlaps it.
            let owned_to = match next {
                Some(from) if first >= from => None,
                Some(from) => Some(last.min(from - 1)),
                None => Some(last),
            };
            if let Some(end) = owned_to {
                let start = held.partition_point(|s| s.last < first);
                for s in held[start..].iter().take_while(|s| s.first <= end) {
                    if let Owner::Held(j) = s.owner
                        && j != i
                    {
                        overlapping.insert(j);
                        overlapping.insert(i);
                    }
                }
            }
            let Some(from) = next else { continue };
            if last < from {
                continue;
            }
            held.push(Segment {
                first: first.max(from),
                last,
                owner: Owner::Held(i),
            });
            next = last.checked_add(1);
        }
        let mut exclusions: Vec<(u128, u128)> = dc
            .exclusions
            .iter()
            .filter(|r| r.overlaps(&bounds))
            .map(|r| {
                let c = clip(r, &bounds);
                (c.first(), c.last())
            })
            .collect();
        exclusions.sort_unstable();
        let excluded = subtract(&merge(&exclusions), &held);
        let mut segments = held;
        segments.extend(excluded);
        segments.sort_unstable_by_key(|s| s.first);
        Some(Layout {
            family: cidr.family(),
            first: bounds.first(),
            last: bounds.last(),
            segments,
            overlapping,
        })
    }

    /// The segments that meet `first..=last`, in order (binary search, then a walk).
    pub fn segments_in(&self, first: u128, last: u128) -> &[Segment] {
        let start = self.segments.partition_point(|s| s.last < first);
        let end = self.segments.partition_point(|s| s.first <= last);
        &self.segments[start..end.max(start)]
    }

    /// Held, excluded and free addresses in `first..=last`, and the largest free run there.
    pub fn count(&self, first: u128, last: u128) -> Counts {
        let mut held = AddressCount::ZERO;
        let mut excluded = AddressCount::ZERO;
        let mut largest = AddressCount::ZERO;
        let mut free = AddressCount::ZERO;
        let mut cursor: Option<u128> = Some(first);
        for s in self.segments_in(first, last) {
            let (a, b) = (s.first.max(first), s.last.min(last));
            if let Some(c) = cursor
                && a > c
            {
                let gap = AddressCount::span(c, a - 1);
                free = free.saturating_add(gap);
                largest = largest.max(gap);
            }
            let size = AddressCount::span(a, b);
            match s.owner {
                Owner::Held(_) => held = held.saturating_add(size),
                Owner::Excluded => excluded = excluded.saturating_add(size),
            }
            cursor = b.checked_add(1).filter(|n| *n <= last);
        }
        if let Some(c) = cursor {
            let gap = AddressCount::span(c, last);
            free = free.saturating_add(gap);
            largest = largest.max(gap);
        }
        Counts {
            held,
            excluded,
            free,
            largest_free: largest,
        }
    }

    /// The pool's usage, exact.
    pub fn usage(&self, holdings: &[&Holding]) -> Usage {
        let c = self.count(self.first, self.last);
        let total = AddressCount::span(self.first, self.last);
        let fragmentation_percent = if c.free.is_zero() {
            0
        } else {
            c.free.saturating_sub(c.largest_free).percent_of(c.free)
        };
        let usable = total.saturating_sub(c.excluded);
        Usage {
            total,
            allocated: c.held,
            excluded: c.excluded,
            quarantined: AddressCount::ZERO,
            free: c.free,
            largest_free_block: c.largest_free,
            fragmentation_percent,
            utilisation_percent: if usable.is_zero() {
                100
            } else {
                c.held.percent_of(usable)
            },
            holders: holdings.iter().filter(|h| !h.ranges.is_empty()).count(),
        }
    }
}

/// What a span of a pool holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub held: AddressCount,
    pub excluded: AddressCount,
    pub free: AddressCount,
    pub largest_free: AddressCount,
}

/// A pool datacenter's figures. `allocated + excluded + quarantined + free == total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub total: AddressCount,
    pub allocated: AddressCount,
    pub excluded: AddressCount,
    /// Released addresses not yet handed out again. kipam keeps no quarantine yet, so this is
    /// always zero; the page shows the slot so that it reads the same once it does.
    pub quarantined: AddressCount,
    pub free: AddressCount,
    pub largest_free_block: AddressCount,
    /// `floor(100 * (free - largest) / free)`, as the pool status reports it.
    pub fragmentation_percent: u8,
    /// Allocated share of the addresses that are not excluded, floored.
    pub utilisation_percent: u8,
    /// Holdings that hold addresses.
    pub holders: usize,
}

/// Sorted, possibly overlapping intervals merged.
fn merge(sorted: &[(u128, u128)]) -> Vec<(u128, u128)> {
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(sorted.len());
    for &(a, b) in sorted {
        match out.last_mut() {
            Some(last) if last.1 == u128::MAX || a <= last.1 + 1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Merged `exclusions` without what `held` (sorted, disjoint) owns, as excluded segments.
fn subtract(exclusions: &[(u128, u128)], held: &[Segment]) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut h = 0;
    for &(a, b) in exclusions {
        let mut from = Some(a);
        while h < held.len() && held[h].last < a {
            h += 1;
        }
        let mut k = h;
        while let Some(f) = from {
            if k >= held.len() || held[k].first > b {
                out.push(Segment {
                    first: f,
                    last: b,
                    owner: Owner::Excluded,
                });
                break;
            }
            let s = held[k];
            if s.first > f {
                out.push(Segment {
                    first: f,
                    last: s.first - 1,
                    owner: Owner::Excluded,
                });
            }
            from = s.last.checked_add(1).filter(|n| *n <= b);
            k += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests;
