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

pub mod adoption;
pub mod html;
pub mod lookup;
pub mod map;
pub mod pack;
pub mod quarantine;
pub mod report;
pub mod view;

use std::collections::BTreeSet;

use crate::address::{AddrRange, AddressCount, Cidr, Family};
use crate::resources::{
    AllocationPhase, AllocationType, IPAMAllocationSpec, IPAMAllocationStatus, IPAMPool,
    IPAMPoolDatacenter, allocation_phase, cluster_of_namespace,
};

/// What the page reads of a claim's `IPAddress` ([`Holding::claim`]).
pub struct ClaimShown<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub pool: &'a str,
    pub datacenter: &'a str,
    /// `spec.address` and `spec.prefix`.
    pub address: &'a str,
    pub prefix: i32,
    /// Its pool datacenter hands out subnets: the address and prefix are one.
    pub prefix_pool: bool,
    /// The claim is `Ready`.
    pub ready: bool,
    pub message: String,
}

/// One allocation (or a machine's claim) as the page shows it.
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
    /// What a machine's claim holds, from its `IPAddress` (a subnet in a prefix pool): named
    /// by its holder name, `claim/<namespace>/<name>`.
    pub fn claim(c: ClaimShown<'_>) -> Holding {
        let ClaimShown {
            namespace,
            name,
            pool,
            datacenter,
            address,
            prefix,
            prefix_pool,
            ready,
            message,
        } = c;
        let parsed = crate::address::parse_address(address.trim());
        let (ranges, unreadable, addresses) = match parsed {
            Ok((family, value)) if prefix_pool => {
                match u8::try_from(prefix)
                    .ok()
                    .and_then(|len| Cidr::new(family, value, len))
                {
                    Some(c) => (vec![c.range()], None, c.to_string()),
                    None => (
                        Vec::new(),
                        Some(format!(
                            "spec.prefix: {prefix} does not make a subnet of {address}"
                        )),
                        format!("{address}/{prefix}"),
                    ),
                }
            }
            Ok((family, value)) => (
                AddrRange::new(family, value, value).into_iter().collect(),
                None,
                address.to_string(),
            ),
            Err(e) => (
                Vec::new(),
                Some(format!("spec.address: {e}")),
                address.to_string(),
            ),
        };
        Holding {
            cluster: crate::resources::capi::claim_holder(namespace, name),
            namespace: namespace.to_string(),
            pool: pool.to_string(),
            datacenter: datacenter.to_string(),
            ranges,
            addresses,
            phase: if ready {
                AllocationPhase::Allocated
            } else {
                AllocationPhase::Pending
            },
            message,
            unreadable,
        }
    }

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
    /// Exclusions inside the pool, as given (they may overlap each other), cut to the CIDRs.
    pub exclusions: Vec<AddrRange>,
    /// What a cluster gets by default: `8 addresses`, `/30`.
    pub request: String,
    /// What cannot be read or does not fit: the page shows it instead of guessing.
    pub problems: Vec<String>,
    /// Every CIDR that parses, in fill order: `poolCidr`, then `additionalCidrs`.
    pub cidrs: Vec<Cidr>,
    /// Every CIDR as written, in the same order (those that do not parse too).
    pub cidrs_text: Vec<String>,
    /// `reuseAfter`, as written.
    pub reuse_after: Option<String>,
    /// The quarantined addresses, when the caller has them (the offline state file, or the
    /// pool records every replica watches: [`quarantine`]).
    pub quarantine: Vec<Quarantine>,
    /// `status.datacenters.<dc>.quarantined`, the count the leader writes: used for the
    /// figures when [`PoolDc::quarantine`] is not known.
    pub quarantined_count: Option<AddressCount>,
}

impl PoolDc {
    /// Addresses are quarantined here but which ones is not known: the status counts some
    /// (only while `reuseAfter` keeps them), yet no entry was given.
    pub fn quarantine_unknown(&self) -> bool {
        self.quarantine.is_empty() && self.quarantined_count.is_some_and(|c| !c.is_zero())
    }

    /// The CIDRs in short, for a list: `10.0.0.0/24 +2`.
    pub fn cidrs_short(&self) -> String {
        match self.cidrs_text.len() {
            0 | 1 => self.cidr_text.clone(),
            n => format!("{} +{}", self.cidr_text, n - 1),
        }
    }
}

/// Addresses quarantined for their former holder (`reuseAfter`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantine {
    pub pool: String,
    pub datacenter: String,
    /// The cluster that held them, and gets them back if it returns in time.
    pub holder: String,
    /// When the quarantine ends (RFC 3339).
    pub until: String,
    pub ranges: Vec<AddrRange>,
}

/// Every CIDR of a pool datacenter that parses (`poolCidr`, then `additionalCidrs`): cheap,
/// for choosing lookup candidates.
pub fn cidrs_of(dc: &IPAMPoolDatacenter) -> Vec<Cidr> {
    std::iter::once(&dc.pool_cidr)
        .chain(&dc.additional_cidrs)
        .filter_map(|t| t.trim().parse().ok())
        .collect()
}

/// Every datacenter of a pool, in name order, with the quarantine count of its status.
pub fn pool_dcs(pool: &IPAMPool) -> Vec<PoolDc> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    pool.spec
        .datacenters
        .iter()
        .map(|(dc, spec)| {
            let mut out = pool_dc(&name, dc, spec);
            out.quarantined_count = status_quarantined(pool, dc);
            out
        })
        .collect()
}

/// `status.datacenters.<dc>.quarantined` of `pool`, when it is there and reads.
pub fn status_quarantined(pool: &IPAMPool, dc: &str) -> Option<AddressCount> {
    pool.status
        .as_ref()?
        .datacenters
        .get(dc)?
        .quarantined
        .as_deref()?
        .parse()
        .ok()
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
    let mut cidrs: Vec<Cidr> = cidr.into_iter().collect();
    for (i, text) in spec.additional_cidrs.iter().enumerate() {
        match text.trim().parse::<Cidr>() {
            Ok(c) if cidr.is_some_and(|p| p.family() != c.family()) => {
                problems.push(format!(
                    "additionalCidrs[{i}]: {text:?} is not of poolCidr's family"
                ));
            }
            Ok(c) if cidrs.iter().any(|o| o.range().overlaps(&c.range())) => {
                problems.push(format!(
                    "additionalCidrs[{i}]: {text:?} overlaps another CIDR of the pool"
                ));
            }
            Ok(c) => cidrs.push(c),
            Err(e) => problems.push(format!("additionalCidrs[{i}]: {e}")),
        }
    }
    if cidr.is_none() {
        // Without poolCidr nothing of the datacenter is laid out (it is the first to fill).
        cidrs.clear();
    }
    let mut exclusions = Vec::new();
    let given = spec
        .exclude_ranges
        .iter()
        .map(|t| ("excludeRanges", t))
        .chain(spec.exclude_prefixes.iter().map(|t| ("excludePrefixes", t)));
    for (field, text) in given {
        match AddrRange::parse_lenient(text) {
            Ok(_) if cidrs.is_empty() => {}
            Ok(r) => {
                let pieces: Vec<AddrRange> = cidrs
                    .iter()
                    .filter(|c| c.range().overlaps(&r))
                    .map(|c| clip(&r, &c.range()))
                    .collect();
                let covered = pieces
                    .iter()
                    .fold(AddressCount::ZERO, |sum, p| sum.saturating_add(p.size()));
                if pieces.is_empty() {
                    problems.push(format!("{field}: {text:?} is outside the pool"));
                } else if covered < r.size() {
                    problems.push(format!("{field}: {text:?} reaches outside the pool"));
                }
                exclusions.extend(pieces);
            }
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
        cidrs,
        cidrs_text: std::iter::once(&spec.pool_cidr)
            .chain(&spec.additional_cidrs)
            .cloned()
            .collect(),
        reuse_after: spec.reuse_after.clone(),
        quarantine: Vec::new(),
        quarantined_count: None,
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
    /// Quarantined for a former holder: [`PoolDc::quarantine`] at this index.
    Quarantined(usize),
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

/// One pool datacenter as disjoint segments in address order, over all its CIDRs. Where two
/// holdings overlap (a conflict kipam reports), the one that starts first owns the shared
/// addresses and both are in [`Layout::overlapping`]; where a holding overlaps an exclusion
/// or a quarantine, the holding owns it (the address is not free either way).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub family: Family,
    /// The CIDRs' bounds, in fill order (`poolCidr` first); never empty.
    pub cidrs: Vec<(u128, u128)>,
    pub segments: Vec<Segment>,
    /// Indexes of holdings that share addresses with another holding.
    pub overlapping: BTreeSet<usize>,
    /// The quarantine is a count from the status, not known address by address: free
    /// figures have it taken off, but the segments do not show it.
    pub quarantined_count: Option<AddressCount>,
}

impl Layout {
    /// The layout of `dc` with `holdings` (those of this pool datacenter) and its
    /// quarantine; `None` when `poolCidr` does not parse. Pieces outside the CIDRs or of the
    /// other family are left out (what they hold is not in this pool).
    pub fn build(dc: &PoolDc, holdings: &[&Holding]) -> Option<Layout> {
        let first_cidr = *dc.cidrs.first()?;
        let cidrs: Vec<(u128, u128)> = dc
            .cidrs
            .iter()
            .map(|c| (c.range().first(), c.range().last()))
            .collect();
        let mut by_address = cidrs.clone();
        by_address.sort_unstable();
        let n = holdings.len();
        let mut pieces: Vec<(u128, u128, usize)> = Vec::new();
        let ranges = holdings
            .iter()
            .enumerate()
            .flat_map(|(i, h)| h.ranges.iter().map(move |r| (i, r)))
            .chain(
                dc.quarantine
                    .iter()
                    .enumerate()
                    .flat_map(|(q, e)| e.ranges.iter().map(move |r| (n + q, r))),
            );
        for (i, r) in ranges {
            if r.family() != first_cidr.family() {
                continue;
            }
            for &(a, b) in &by_address {
                if r.first() <= b && r.last() >= a {
                    pieces.push((r.first().max(a), r.last().min(b), i));
                }
            }
        }
        pieces.sort_unstable();
        let mut held: Vec<Segment> = Vec::with_capacity(pieces.len());
        let mut overlapping = BTreeSet::new();
        // The first address not yet owned (`None`: the family's end was reached).
        let mut next: Option<u128> = Some(0);
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
                        && i < n
                    {
                        overlapping.insert(j);
                        overlapping.insert(i);
                    }
                }
                // A holding over a quarantine: the holding owns the addresses.
                if i < n {
                    take_over(&mut held, first, end, i);
                }
            }
            let Some(from) = next else { continue };
            if last < from {
                continue;
            }
            held.push(Segment {
                first: first.max(from),
                last,
                owner: if i < n {
                    Owner::Held(i)
                } else {
                    Owner::Quarantined(i - n)
                },
            });
            next = last.checked_add(1);
        }
        let mut exclusions: Vec<(u128, u128)> = dc
            .exclusions
            .iter()
            .filter(|r| r.family() == first_cidr.family())
            .map(|r| (r.first(), r.last()))
            .collect();
        exclusions.sort_unstable();
        let excluded = subtract(&merge(&exclusions), &held);
        let mut segments = held;
        segments.extend(excluded);
        segments.sort_unstable_by_key(|s| s.first);
        Some(Layout {
            family: first_cidr.family(),
            cidrs,
            segments,
            overlapping,
            quarantined_count: if dc.quarantine.is_empty() {
                dc.quarantined_count.filter(|c| !c.is_zero())
            } else {
                None
            },
        })
    }

    /// The CIDR (its bounds) holding all of `first..=last`, if one does.
    pub fn cidr_holding(&self, first: u128, last: u128) -> Option<(u128, u128)> {
        self.cidrs
            .iter()
            .copied()
            .find(|&(a, b)| a <= first && last <= b)
    }

    /// The segments that meet `first..=last`, in order (binary search, then a walk).
    pub fn segments_in(&self, first: u128, last: u128) -> &[Segment] {
        let start = self.segments.partition_point(|s| s.last < first);
        let end = self.segments.partition_point(|s| s.first <= last);
        &self.segments[start..end.max(start)]
    }

    /// Held, excluded, quarantined and free addresses in `first..=last` (a span inside one
    /// CIDR), and the largest free run there.
    pub fn count(&self, first: u128, last: u128) -> Counts {
        let mut held = AddressCount::ZERO;
        let mut excluded = AddressCount::ZERO;
        let mut quarantined = AddressCount::ZERO;
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
                Owner::Quarantined(_) => quarantined = quarantined.saturating_add(size),
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
            quarantined,
            free,
            largest_free: largest,
        }
    }

    /// [`Layout::count`] of every CIDR, summed (the largest free run is the largest of
    /// theirs: a run never crosses from one CIDR to the next).
    pub fn count_all(&self) -> Counts {
        let mut sum = Counts {
            held: AddressCount::ZERO,
            excluded: AddressCount::ZERO,
            quarantined: AddressCount::ZERO,
            free: AddressCount::ZERO,
            largest_free: AddressCount::ZERO,
        };
        for &(a, b) in &self.cidrs {
            let c = self.count(a, b);
            sum.held = sum.held.saturating_add(c.held);
            sum.excluded = sum.excluded.saturating_add(c.excluded);
            sum.quarantined = sum.quarantined.saturating_add(c.quarantined);
            sum.free = sum.free.saturating_add(c.free);
            sum.largest_free = sum.largest_free.max(c.largest_free);
        }
        sum
    }

    /// The pool's usage over all its CIDRs, exact (see [`Layout::usage_of`]).
    pub fn usage(&self, holdings: &[&Holding]) -> Usage {
        let total = self.cidrs.iter().fold(AddressCount::ZERO, |sum, &(a, b)| {
            sum.saturating_add(AddressCount::span(a, b))
        });
        self.usage_of(self.count_all(), total, holdings, true)
    }

    /// The usage of one CIDR (`first..=last`).
    pub fn cidr_usage(&self, first: u128, last: u128, holdings: &[&Holding]) -> Usage {
        // A quarantine known only as a count belongs to this CIDR only when it is the one.
        let whole = self.cidrs.len() == 1;
        let mut u = self.usage_of(
            self.count(first, last),
            AddressCount::span(first, last),
            holdings,
            whole,
        );
        u.holders = holdings
            .iter()
            .filter(|h| {
                h.ranges
                    .iter()
                    .any(|r| r.family() == self.family && r.first() <= last && r.last() >= first)
            })
            .count();
        u
    }

    /// Figures of counts `c` out of `total`. With a quarantine known only as a count (the
    /// served page), that count is taken off the free addresses, and the largest free run
    /// is at most what stays free: it may still be overstated (which addresses are
    /// quarantined is not known), never the free count.
    fn usage_of(
        &self,
        mut c: Counts,
        total: AddressCount,
        holdings: &[&Holding],
        whole: bool,
    ) -> Usage {
        // Only for the whole pool datacenter: one CIDR of several cannot say its share.
        if let Some(q) = self.quarantined_count.filter(|_| whole) {
            let q = q.min(c.free);
            c.quarantined = c.quarantined.saturating_add(q);
            c.free = c.free.saturating_sub(q);
            c.largest_free = c.largest_free.min(c.free);
        }
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
            quarantined: c.quarantined,
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

/// Gives `first..=last` (owned so far by quarantine segments of `held`, sorted) to holding
/// `i`: a quarantined address that a holding holds is counted as held.
fn take_over(held: &mut Vec<Segment>, first: u128, last: u128, i: usize) {
    let start = held.partition_point(|s| s.last < first);
    let mut k = start;
    let mut out: Vec<Segment> = Vec::new();
    while k < held.len() && held[k].first <= last {
        let s = held[k];
        if let Owner::Quarantined(_) = s.owner {
            if s.first < first {
                out.push(Segment {
                    last: first - 1,
                    ..s
                });
            }
            out.push(Segment {
                first: s.first.max(first),
                last: s.last.min(last),
                owner: Owner::Held(i),
            });
            if s.last > last {
                out.push(Segment {
                    first: last + 1,
                    ..s
                });
            }
        } else {
            out.push(s);
        }
        k += 1;
    }
    held.splice(start..k, out);
}

/// What a span of a pool holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub held: AddressCount,
    pub excluded: AddressCount,
    pub quarantined: AddressCount,
    pub free: AddressCount,
    pub largest_free: AddressCount,
}

/// A pool datacenter's figures. `allocated + excluded + quarantined + free == total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub total: AddressCount,
    pub allocated: AddressCount,
    pub excluded: AddressCount,
    /// Released addresses kept for their former holder (`reuseAfter`), not handed out.
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
