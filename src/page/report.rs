//! What `kipam offline --report` embeds: the served page's JSON for every pool datacenter,
//! computed here by the same functions the routes use, written compactly.
//!
//! The report's script draws only what is embedded; it computes no map cell and no lookup
//! answer, so the served page and the report cannot disagree. What it does with the data is
//! reading, never address arithmetic:
//!
//! - **Unpacking** ([`super::pack`]): keys and repeated strings put back, knowing nothing of
//!   what they mean.
//! - **A map's cells** come as runs: `runs[r]` cells alike (`cells[r]`: state, used share,
//!   main holder, holders), in order. A cell's bounds are the Rust side's own text, cut into
//!   a prefix the map's cells share (`10.0.5.`) and suffixes (`0`, `1`, …); the suffix lists
//!   repeat from map to map (every IPv4 /24 has the same), so they are written once in the
//!   report ([`Report::bounds`]) and a map names its list. The script glues prefix and
//!   suffix: no address is computed or formatted in the browser.
//! - **The lookup**: each pool datacenter is cut into pieces, in address order, wherever
//!   the answer for a single address changes; the answers (every one the Rust lookup gave,
//!   for the first address of the piece) are written once each. To answer an address the
//!   script parses it, keeps the pool datacenters whose CIDRs (bounds written here) hold
//!   it, and takes the last piece starting at or before it: a binary search over addresses
//!   the Rust side sorted, comparing them and nothing else. That is finding what to draw,
//!   as a reader finds a page by its number; which addresses answer alike, and what, was
//!   decided here. (The script already parses what a person types; comparing two parsed
//!   addresses is all it adds.)
//!
//! The report's cost grows with the holdings of the pools, like the served page's: the maps
//! are as many runs as there are changes along them, the lookup as many pieces as there are
//! holdings, exclusions and quarantine entries, and every name is written once per pool
//! datacenter.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::address::{AddrRange, AddressCount, Family};
use crate::resources::IPAMPool;

use super::lookup::{Match, Query, answer_in};
use super::map::{AddressMap, CellState, address_map};
use super::pack::{PackError, Packer, QuickMap};
use super::view::{
    CellView, Detail, HolderView, MapView, MatchView, PoolAttention, Summary, Totals,
    describe_match, detail_frame, match_view, notable_conditions, of_dc, pool_dcs_with,
    pool_summary,
};
use super::{Holding, Layout, PoolDc, Quarantine};

/// Zoomed maps the report holds per pool datacenter at most (each is 256 cells).
pub const REPORT_ZOOMS: usize = 16;

/// Everything the offline report shows, for every pool.
#[derive(Debug)]
pub struct Report {
    /// When the report was written (RFC 3339), as the caller says.
    pub generated_at: String,
    pub summary: Summary,
    /// The suffix lists of the maps' cell bounds (see [`ReportMap`]): two per cell, its
    /// first and its last address.
    pub bounds: Vec<Vec<String>>,
    /// `pool/datacenter` → what the page shows of it ([`ReportDc`]), packed as soon as it
    /// is made: the views of a whole seed at once would take several times the memory.
    datacenters: BTreeMap<String, PackedDc>,
    /// The packer of the pool datacenters (its shapes serve the summary too).
    packer: Packer,
    /// Why a pool datacenter could not be packed, if one could not.
    failed: Option<PackError>,
}

/// A pool datacenter packed: its CIDRs' bounds as JSON text (for a search to unpack only
/// the pool datacenters holding the address) and the unit of its [`ReportDc`].
#[derive(Debug)]
struct PackedDc {
    cidrs: String,
    unit: String,
}

/// A pool datacenter in the report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportDc {
    /// What the served page fetches for the pool datacenter, but the map's cells: they are
    /// in [`ReportDc::maps`], under the map's slice.
    pub detail: Detail,
    /// The maps: `poolCidr`'s, every other CIDR's, and the zoom into cells that hold more
    /// than one thing, breadth first, at most [`REPORT_ZOOMS`] of them. The page finds a
    /// map by its first and last address (a zoom's are its cell's); a cell whose map is not
    /// here does not zoom.
    pub maps: Vec<ReportMap>,
    pub lookup: ReportLookup,
}

/// One map, as the served page fetches it, its cells as runs.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportMap {
    /// The map without its cells.
    pub map: MapView,
    /// What every cell's bounds start with.
    pub prefix: String,
    /// Index into [`Report::bounds`]: cell `i` runs from `prefix` + `bounds[2i]` to
    /// `prefix` + `bounds[2i + 1]`.
    pub bounds: usize,
    /// `runs[r]` cells in a row, each drawn as `cells[r]`.
    pub runs: Vec<usize>,
    pub cells: Vec<RunCell>,
}

/// A cell without its bounds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunCell {
    pub state: String,
    pub used_percent: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    pub holders: usize,
}

impl RunCell {
    /// A cell's bounds and the rest. Every field is named, so that a field added to
    /// [`CellView`] cannot be left out of the report unnoticed.
    fn split(c: CellView) -> (String, String, RunCell) {
        let CellView {
            first,
            last,
            state,
            used_percent,
            holder,
            holders,
        } = c;
        let rest = RunCell {
            state,
            used_percent,
            holder,
            holders,
        };
        (first, last, rest)
    }
}

/// The lookup of any single address of a pool datacenter, precomputed.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportLookup {
    /// Every CIDR's first and last address, in address order.
    pub cidrs: Vec<[String; 2]>,
    /// The first address of every piece, in address order; a piece runs to the next start
    /// or to the end of its CIDR, and every address in it gets the same answer.
    pub starts: Vec<String>,
    /// The answer of each piece: an index into `answers`.
    pub answer: Vec<usize>,
    /// The fields every answer here has alike (the pool datacenter's own), written once;
    /// `None` when there is no answer.
    pub common: Option<AnswerCommon>,
    /// Each answer as the lookup route gives it in `matches`, without `common`'s fields.
    pub answers: Vec<ReportAnswer>,
    /// Rows the answers show that the detail's holders do not list.
    pub holders: Vec<HolderView>,
}

/// The fields of a lookup answer ([`MatchView`]) that name the pool datacenter: alike in
/// all of its answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AnswerCommon {
    pub pool: String,
    pub datacenter: String,
    pub pool_cidr: String,
    #[serde(rename = "type")]
    pub type_: String,
}

/// A lookup answer ([`MatchView`]) without [`AnswerCommon`]'s fields and without `range`
/// (it names the address asked; the page does not draw it); with `message`, what the
/// route's message says after the address. `holders` and `quarantine` are rows: indexes
/// into the detail's holders followed by [`ReportLookup::holders`].
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportAnswer {
    pub cidrs: Vec<String>,
    pub state: String,
    pub allocated: String,
    pub excluded: String,
    pub quarantined: String,
    pub free: String,
    pub holders: Vec<usize>,
    pub more: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quarantine: Vec<usize>,
    pub message: String,
}

impl ReportAnswer {
    /// The answer `view` with its rows as indexes (`row_of`). Every field is named, so that
    /// a field added to [`MatchView`] cannot be left out of the report unnoticed.
    fn split(
        view: MatchView,
        mut row_of: impl FnMut(HolderView) -> usize,
    ) -> (AnswerCommon, ReportAnswer) {
        let message = describe_match(&view);
        let MatchView {
            pool,
            datacenter,
            pool_cidr,
            type_,
            range: _,
            cidrs,
            state,
            allocated,
            excluded,
            quarantined,
            free,
            holders,
            more,
            quarantine,
        } = view;
        let common = AnswerCommon {
            pool,
            datacenter,
            pool_cidr,
            type_,
        };
        let answer = ReportAnswer {
            cidrs,
            state,
            allocated,
            excluded,
            quarantined,
            free,
            holders: holders.into_iter().map(&mut row_of).collect(),
            more,
            quarantine: quarantine.into_iter().map(&mut row_of).collect(),
            message,
        };
        (common, answer)
    }
}

/// Suffix lists of cell bounds, each written once.
#[derive(Default)]
struct BoundsTable {
    lists: Vec<Vec<String>>,
    /// The lists by a cheap fingerprint ([`BoundsTable::print`]); a match is then compared
    /// in full.
    by_print: QuickMap<(usize, usize, u64), Vec<usize>>,
    /// The list of a map by its [`Tail`], when it has one.
    by_tail: QuickMap<Tail, usize>,
    /// The bounds of the map being written, one after the other, and where each ends.
    text: String,
    ends: Vec<usize>,
}

/// What the suffix list of a map follows from, for a map whose bounds all start with the
/// same leading groups (IPv6, none of them zero) or octets (IPv4): the text of every bound is
/// then those groups' text followed by a text that depends on the other bits alone. (IPv6
/// text shortens the longest run of zero groups; with no zero group in front, every run is
/// among the other bits. An IPv4-mapped address starts with zero groups.) So two maps with
/// the same tail have the same suffixes, and the prefix of each is its first bound less the
/// first suffix: `report_maps_with_one_tail_share_suffixes` holds that against writing
/// every bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Tail {
    family: Family,
    /// Leading bits every bound shares (whole groups or octets).
    shared: u32,
    /// The other bits of the first and the last address, and the cell size.
    first: u128,
    last: u128,
    step: u128,
}

impl Tail {
    fn of(m: &AddressMap) -> Option<Tail> {
        let (bits, unit) = match m.family {
            Family::V4 => (32, 8),
            Family::V6 => (128, 16),
        };
        let (first, last) = (m.first, m.last);
        let mut shared = 0;
        while shared + unit < bits {
            let low = bits - shared - unit;
            let group = first >> low;
            if group != last >> low {
                break;
            }
            if m.family == Family::V6 && group & 0xffff == 0 {
                break;
            }
            shared += unit;
        }
        if shared == 0 {
            return None;
        }
        let low = |v: u128| v & ((1u128 << (bits - shared)) - 1);
        Some(Tail {
            family: m.family,
            shared,
            first: low(first),
            last: low(last),
            step: m.step,
        })
    }
}

impl BoundsTable {
    /// Map `m` drawn with `holdings` as a [`ReportMap`]; `map` is its [`MapView::frame`].
    /// Each cell is what [`MapView::of`] makes of it: its bounds are written by the same
    /// [`crate::address::Family::display`], straight into one text (or found by their
    /// [`Tail`]), and its other fields by [`CellView::of`], once per run.
    fn map(&mut self, m: &AddressMap, holdings: &[&Holding], map: MapView) -> ReportMap {
        let mut runs: Vec<usize> = Vec::new();
        let mut kinds: Vec<RunCell> = Vec::new();
        // What a cell's view is made of, its bounds aside (see `CellView::of`): cells alike
        // in it are drawn alike.
        let mut previous: Option<(CellState, u8, Option<&str>, usize)> = None;
        for c in &m.cells {
            let alike = (
                c.state,
                c.used_percent(),
                c.holder
                    .and_then(|i| holdings.get(i))
                    .map(|h| h.cluster.as_str()),
                c.holders,
            );
            match runs.last_mut() {
                Some(n) if previous == Some(alike) => *n += 1,
                _ => {
                    let (_, _, rest) =
                        RunCell::split(CellView::of(c, holdings, String::new(), String::new()));
                    kinds.push(rest);
                    runs.push(1);
                    previous = Some(alike);
                }
            }
        }
        let (prefix, bounds) = self.bounds_of(m, true);
        ReportMap {
            map,
            prefix,
            bounds,
            runs,
            cells: kinds,
        }
    }

    /// The prefix and the suffix list (its index) of `m`'s cell bounds; `by_tail`: whether a
    /// map with the same [`Tail`] may answer (otherwise every bound is written).
    fn bounds_of(&mut self, m: &AddressMap, by_tail: bool) -> (String, usize) {
        let tail = Tail::of(m).filter(|_| by_tail);
        if let Some(id) = tail.and_then(|t| self.by_tail.get(&t).copied())
            && let (Some(c), Some(suffix)) = (m.cells.first(), self.lists[id].first())
        {
            let mut first = String::new();
            m.family.display(c.first).push_to(&mut first);
            if let Some(prefix) = first.strip_suffix(suffix.as_str()) {
                return (prefix.to_string(), id);
            }
        }
        self.text.clear();
        self.ends.clear();
        for c in &m.cells {
            m.family.display(c.first).push_to(&mut self.text);
            self.ends.push(self.text.len());
            m.family.display(c.last).push_to(&mut self.text);
            self.ends.push(self.text.len());
        }
        let prefix = self.prefix_len();
        let print = self.print(prefix);
        let known = self.by_print.get(&print).and_then(|ids| {
            ids.iter().copied().find(|&id| {
                self.suffixes(prefix)
                    .eq(self.lists[id].iter().map(String::as_str))
            })
        });
        let id = known.unwrap_or_else(|| {
            let id = self.lists.len();
            self.lists
                .push(self.suffixes(prefix).map(str::to_string).collect());
            self.by_print.entry(print).or_default().push(id);
            id
        });
        if let Some(t) = tail {
            self.by_tail.insert(t, id);
        }
        (self.text[..prefix].to_string(), id)
    }

    /// The bounds written, in order.
    fn bounds(&self) -> impl Iterator<Item = &str> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(a, b)| &self.text[a..b])
    }

    /// The bounds without their first `prefix` bytes.
    fn suffixes(&self, prefix: usize) -> impl Iterator<Item = &str> {
        self.bounds().map(move |b| &b[prefix..])
    }

    /// The length of the text every bound starts with (cut at a character boundary).
    fn prefix_len(&self) -> usize {
        let mut all = self.bounds();
        let Some(first) = all.next() else {
            return 0;
        };
        let mut len = first.len();
        for b in all {
            len = first
                .bytes()
                .zip(b.bytes())
                .take(len)
                .take_while(|(x, y)| x == y)
                .count();
        }
        while !first.is_char_boundary(len) {
            len -= 1;
        }
        len
    }

    /// A fingerprint of the suffix list: how many, their bytes, and a hash of the last two
    /// (where lists of the same length part most often).
    fn print(&self, prefix: usize) -> (usize, usize, u64) {
        use std::hash::{Hash, Hasher};
        let bytes = self.text.len() - self.ends.len() * prefix;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for s in self
            .suffixes(prefix)
            .skip(self.ends.len().saturating_sub(2))
        {
            s.hash(&mut h);
        }
        (self.ends.len(), bytes, h.finish())
    }
}

/// Whether every address of `first..=last` is in one and the same segment, or free.
fn uniform(layout: &Layout, first: u128, last: u128) -> bool {
    match layout.segments_in(first, last) {
        [] => true,
        [s] => s.first <= first && s.last >= last,
        _ => false,
    }
}

/// The maps of one pool datacenter: `main` (the detail's, of `poolCidr`, with its
/// [`MapView::frame`]), every other CIDR's, and the zooms.
fn maps_of(
    layout: &Layout,
    holdings: &[&Holding],
    (main, frame): (AddressMap, MapView),
    table: &mut BoundsTable,
) -> Vec<ReportMap> {
    let mut maps = vec![table.map(&main, holdings, frame)];
    let mut queue: std::collections::VecDeque<AddressMap> = Default::default();
    let mut zooms = 0;
    queue.push_back(main);
    for &(a, b) in layout.cidrs.iter().skip(1) {
        let Ok(m) = address_map(layout, a, b) else {
            continue;
        };
        maps.push(table.map(&m, holdings, MapView::frame(&m)));
        queue.push_back(m);
    }
    // Breadth first: a cell of a map drawn that holds more than one thing gets its own map.
    while let Some(m) = queue.pop_front() {
        for c in &m.cells {
            if zooms >= REPORT_ZOOMS {
                return maps;
            }
            if c.first == c.last || uniform(layout, c.first, c.last) {
                continue;
            }
            let Ok(z) = address_map(layout, c.first, c.last) else {
                continue;
            };
            maps.push(table.map(&z, holdings, MapView::frame(&z)));
            queue.push_back(z);
            zooms += 1;
        }
    }
    maps
}

/// Where the answer for a single address of `first..=last` (one CIDR) may change: its
/// first address, and the ends of every segment, holding, quarantine entry and exclusion
/// inside it (so that overlapping holders are exact). Sorted, without repeats.
fn piece_starts(
    dc: &PoolDc,
    holdings: &[&Holding],
    layout: &Layout,
    a: u128,
    b: u128,
) -> Vec<u128> {
    let mut starts: Vec<u128> = vec![a];
    let mut mark = |first: u128, last: u128| {
        if first > a && first <= b {
            starts.push(first);
        }
        if let Some(next) = last.checked_add(1)
            && next > a
            && next <= b
        {
            starts.push(next);
        }
    };
    for s in layout.segments_in(a, b) {
        mark(s.first, s.last);
    }
    let ranges = holdings
        .iter()
        .flat_map(|h| h.ranges.iter())
        .chain(dc.quarantine.iter().flat_map(|q| q.ranges.iter()))
        .chain(dc.exclusions.iter());
    for r in ranges.filter(|r| r.family() == layout.family) {
        mark(r.first(), r.last());
    }
    starts.sort_unstable();
    starts.dedup();
    starts
}

/// The lookup of every single address of `dc`, piece by piece; `listed` are the detail's
/// holders (the answers point into them where they can).
fn lookup_of(
    dc: &PoolDc,
    holdings: &[&Holding],
    layout: &Layout,
    listed: &[HolderView],
) -> ReportLookup {
    let show = |v| layout.family.display(v).to_string();
    let mut rows: QuickMap<HolderView, usize> = QuickMap::default();
    for (i, h) in listed.iter().enumerate() {
        rows.entry(h.clone()).or_insert(i);
    }
    let mut extra: Vec<HolderView> = Vec::new();
    let mut row_of = |h: HolderView| -> usize {
        let next = listed.len() + extra.len();
        *rows.entry(h).or_insert_with_key(|h| {
            extra.push(h.clone());
            next
        })
    };
    let mut by_address = layout.cidrs.clone();
    by_address.sort_unstable();
    let mut out = ReportLookup {
        cidrs: by_address
            .iter()
            .map(|&(a, b)| [show(a), show(b)])
            .collect(),
        starts: Vec::new(),
        answer: Vec::new(),
        common: None,
        answers: Vec::new(),
        holders: Vec::new(),
    };
    // An answer, by what it says (not the address asked, nor the pool datacenter, which
    // are the same for every piece); holdings and quarantine entries by where they are.
    type Said = (
        Vec<String>,
        &'static str,
        Vec<usize>,
        usize,
        Vec<usize>,
        [AddressCount; 4],
    );
    let mut seen: QuickMap<Said, usize> = QuickMap::default();
    for &(a, b) in &by_address {
        for x in piece_starts(dc, holdings, layout, a, b) {
            let Some(r) = AddrRange::new(layout.family, x, x) else {
                continue;
            };
            let Some(m) = answer_in(layout, &Query::Address(r), dc, holdings) else {
                continue;
            };
            // Every field named: one added to `Match` must be thought of here.
            let Match {
                dc: _,
                first: _,
                last: _,
                cidrs,
                state,
                holders,
                more,
                quarantine,
                allocated,
                excluded,
                quarantined,
                free,
            } = &m;
            let said: Said = (
                cidrs.clone(),
                state,
                holders
                    .iter()
                    .map(|h| std::ptr::from_ref(*h) as usize)
                    .collect(),
                *more,
                quarantine
                    .iter()
                    .map(|q| std::ptr::from_ref(*q) as usize)
                    .collect(),
                [*allocated, *excluded, *quarantined, *free],
            );
            let next = out.answers.len();
            let index = *seen.entry(said).or_insert(next);
            if index == next {
                let (common, answer) = ReportAnswer::split(match_view(&m), &mut row_of);
                // Every answer here is of `dc`: its own fields are alike in all of them.
                debug_assert!(out.common.as_ref().is_none_or(|c| *c == common));
                out.common.get_or_insert(common);
                out.answers.push(answer);
            }
            out.starts.push(show(x));
            out.answer.push(index);
        }
    }
    out.holders = extra;
    out
}

/// The whole report of a seed (`pools` with every holding and every quarantined address):
/// no paging, every detail.
pub fn report(
    seed: &str,
    now: &str,
    pools: &[IPAMPool],
    holdings: &[Holding],
    quarantine: &[Quarantine],
) -> Report {
    let mut by_pool: BTreeMap<&str, Vec<Holding>> = BTreeMap::new();
    for h in holdings {
        by_pool.entry(h.pool.as_str()).or_default().push(h.clone());
    }
    let mut sorted: Vec<&IPAMPool> = pools.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut table = BoundsTable::default();
    let mut datacenters = BTreeMap::new();
    let mut packer = Packer::default();
    let mut failed = None;
    let mut summaries = Vec::new();
    let mut attention = Vec::new();
    let mut attention_pools = Vec::new();
    let mut dc_count = 0;
    for pool in &sorted {
        let name = pool.metadata.name.clone().unwrap_or_default();
        let mine = by_pool.get(name.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        let dcs = pool_dcs_with(pool, quarantine);
        summaries.push(pool_summary(pool, &dcs, mine));
        let conditions = notable_conditions(pool);
        if !conditions.is_empty() {
            attention_pools.push(PoolAttention {
                pool: name.clone(),
                conditions: conditions.clone(),
            });
        }
        for dc in dcs {
            dc_count += 1;
            let here = of_dc(mine, &dc.datacenter);
            let Ok((detail, layout, main)) = detail_frame(&dc, &here, None, conditions.clone())
            else {
                continue;
            };
            attention.extend(
                detail
                    .holders
                    .iter()
                    .filter(|h| h.attention.is_some())
                    .cloned(),
            );
            let maps = maps_of(&layout, &here, (main, detail.map.clone()), &mut table);
            let lookup = lookup_of(&dc, &here, &layout, &detail.holders);
            let packed = ReportDc {
                detail,
                maps,
                lookup,
            }
            .pack(&mut packer);
            match packed {
                Ok(packed) => {
                    datacenters.insert(format!("{}/{}", dc.pool, dc.datacenter), packed);
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
    }
    // Holdings of pools that are not in the input (kept in the state): still shown as
    // needing a look, since no pool explains them.
    let known: BTreeSet<&str> = sorted
        .iter()
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    for h in holdings.iter().filter(|h| !known.contains(h.pool.as_str())) {
        let mut v = HolderView::of(h, false);
        v.attention.get_or_insert_with(|| "NoPool".to_string());
        attention.push(v);
    }
    let matched = summaries.len();
    Report {
        generated_at: now.to_string(),
        summary: Summary {
            seed: seed.to_string(),
            totals: Totals {
                pools: matched,
                datacenters: dc_count,
                allocations: holdings.len(),
                attention: attention.len() + attention_pools.len(),
            },
            attention,
            attention_pools,
            pools: summaries,
            // `kipam offline` reads no user cluster; `kipam adopt` reports adoption.
            adoption: None,
            matched,
            offset: 0,
            limit: matched,
        },
        bounds: table.lists,
        datacenters,
        packer,
        failed,
    }
}

impl ReportDc {
    fn pack(&self, packer: &mut Packer) -> Result<PackedDc, PackError> {
        Ok(PackedDc {
            cidrs: json(&self.lookup.cidrs)?,
            unit: packer.unit(self)?,
        })
    }
}

impl Report {
    /// The report as the page's script reads it, as JSON text: the summary and each pool
    /// datacenter packed ([`super::pack`]), each pool datacenter with its CIDRs' bounds
    /// beside it (so that a search unpacks only the pool datacenters holding the address).
    pub fn packed(mut self) -> Result<String, PackError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let summary = self.packer.unit(&self.summary)?;
        let size: usize = self
            .datacenters
            .iter()
            .map(|(k, d)| k.len() + d.cidrs.len() + d.unit.len() + 24)
            .sum();
        let mut out = String::with_capacity(size + summary.len() + (1 << 16));
        out.push_str("{\"datacenters\":{");
        for (i, (key, dc)) in std::mem::take(&mut self.datacenters)
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&json(&key)?);
            out.push_str(":{\"cidrs\":");
            out.push_str(&dc.cidrs);
            out.push_str(",\"unit\":");
            out.push_str(&dc.unit);
            out.push('}');
        }
        out.push_str("},\"generatedAt\":");
        out.push_str(&json(&self.generated_at)?);
        out.push_str(",\"bounds\":");
        out.push_str(&json(&self.bounds)?);
        out.push_str(",\"summary\":");
        out.push_str(&summary);
        out.push_str(",\"shapes\":");
        out.push_str(&json(self.packer.shapes())?);
        out.push('}');
        Ok(out)
    }
}

/// Plain JSON text.
fn json<T: Serialize + ?Sized>(value: &T) -> Result<String, PackError> {
    serde_json::to_string(value).map_err(<PackError as serde::ser::Error>::custom)
}

/// The report as its page reads it back, the way the script of the page does (`app.js`):
/// the summary, and per pool datacenter its detail with the map's cells, every map by its
/// slice, and the lookup's pieces (each answer with `first`, the address it starts at).
/// For checks: what the page draws is exactly this.
pub fn read(packed: &Value) -> Result<Value, String> {
    let shapes: Vec<Vec<String>> =
        serde_json::from_value(packed["shapes"].clone()).map_err(|e| format!("shapes: {e}"))?;
    let bounds: Vec<Vec<String>> =
        serde_json::from_value(packed["bounds"].clone()).map_err(|e| format!("bounds: {e}"))?;
    let summary = super::pack::unpack(&packed["summary"], &shapes)?;
    let mut datacenters = Map::new();
    let entries = packed["datacenters"].as_object().ok_or("no datacenters")?;
    for (key, entry) in entries {
        let dc = super::pack::unpack(&entry["unit"], &shapes)?;
        let mut maps = Map::new();
        for m in dc["maps"].as_array().ok_or("no maps")? {
            let slice = format!(
                "{}-{}",
                m["map"]["first"].as_str().unwrap_or_default(),
                m["map"]["last"].as_str().unwrap_or_default()
            );
            maps.insert(slice, cells_of(m, &bounds)?);
        }
        let mut detail = dc["detail"].clone();
        let main = format!(
            "{}-{}",
            detail["map"]["first"].as_str().unwrap_or_default(),
            detail["map"]["last"].as_str().unwrap_or_default()
        );
        detail["map"] = maps.get(&main).cloned().ok_or("no main map")?;
        let l = &dc["lookup"];
        let rows: Vec<Value> = [&detail["holders"], &l["holders"]]
            .into_iter()
            .filter_map(Value::as_array)
            .flatten()
            .cloned()
            .collect();
        let rows_of = |v: &Value| -> Value {
            Value::Array(
                v.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|i| i.as_u64().and_then(|i| rows.get(i as usize)).cloned())
                    .collect(),
            )
        };
        let starts = l["starts"].as_array().ok_or("no starts")?;
        let answer = l["answer"].as_array().ok_or("no answers")?;
        let mut pieces = Vec::new();
        for (start, i) in starts.iter().zip(answer) {
            let mut a = l["common"].as_object().cloned().unwrap_or_default();
            let own = i
                .as_u64()
                .and_then(|i| l["answers"].get(i as usize))
                .and_then(Value::as_object)
                .ok_or("no such answer")?;
            a.extend(own.clone());
            let holders = rows_of(&a["holders"]);
            a.insert("holders".into(), holders);
            if let Some(q) = a.get("quarantine").map(&rows_of) {
                a.insert("quarantine".into(), q);
            }
            a.insert("first".into(), start.clone());
            pieces.push(Value::Object(a));
        }
        datacenters.insert(
            key.clone(),
            serde_json::json!({"detail": detail, "maps": maps, "pieces": pieces}),
        );
    }
    Ok(serde_json::json!({
        "generatedAt": packed["generatedAt"],
        "summary": summary,
        "datacenters": datacenters,
    }))
}

/// A [`ReportMap`] (unpacked) as the served map: its cells back, one per run step.
fn cells_of(m: &Value, bounds: &[Vec<String>]) -> Result<Value, String> {
    let prefix = m["prefix"].as_str().ok_or("no prefix")?;
    let list = m["bounds"]
        .as_u64()
        .and_then(|i| bounds.get(i as usize))
        .ok_or("no bounds")?;
    let mut cells = Vec::new();
    let kinds = m["cells"].as_array().ok_or("no cells")?;
    for (n, kind) in m["runs"].as_array().ok_or("no runs")?.iter().zip(kinds) {
        for _ in 0..n.as_u64().unwrap_or(0) {
            let k = cells.len();
            let (Some(first), Some(last)) = (list.get(2 * k), list.get(2 * k + 1)) else {
                return Err(format!("no bounds for cell {k}"));
            };
            let mut cell = Map::new();
            cell.insert("first".into(), Value::String(format!("{prefix}{first}")));
            cell.insert("last".into(), Value::String(format!("{prefix}{last}")));
            cell.extend(kind.as_object().cloned().unwrap_or_default());
            cells.push(Value::Object(cell));
        }
    }
    let mut map = m["map"].clone();
    map["cells"] = Value::Array(cells);
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::map::{CELLS, Cell};

    /// The map of `first..=last` with every cell free (the bounds are all that matters here).
    fn bare(family: Family, first: u128, last: u128) -> AddressMap {
        let step = (last - first) / CELLS + 1;
        let count = ((last - first) / step + 1) as usize;
        let cells = (0..count)
            .map(|i| {
                let a = first + step * i as u128;
                Cell {
                    first: a,
                    last: a.saturating_add(step - 1).min(last),
                    state: CellState::Free,
                    held: AddressCount::ZERO,
                    excluded: AddressCount::ZERO,
                    quarantined: AddressCount::ZERO,
                    holder: None,
                    holders: 0,
                }
            })
            .collect();
        AddressMap {
            family,
            first,
            last,
            step,
            cells,
        }
    }

    #[test]
    fn report_maps_with_one_tail_share_suffixes() {
        let v6 = |text: &str| -> u128 { text.parse::<std::net::Ipv6Addr>().unwrap().into() };
        let mut maps = Vec::new();
        for k in 0..200u128 {
            // IPv4 /24s, /16s and odd slices; IPv6 /48s, their /56 zooms, and their /64s.
            let a = 0x0a00_0000 + (k << 8);
            maps.push(bare(Family::V4, a, a + 255));
            maps.push(bare(Family::V4, a + 7, a + 7 + 99 + k % 3));
            maps.push(bare(
                Family::V4,
                (k << 16) & 0xffff_0000,
                (k << 16) | 0xffff,
            ));
            let p = (0x2001_0db8u128 << 96) | (k << 80);
            maps.push(bare(Family::V6, p, p + (1 << 80) - 1));
            maps.push(bare(Family::V6, p, p + (1 << 72) - 1));
            maps.push(bare(
                Family::V6,
                p + (k << 64),
                p + (k << 64) + (1 << 64) - 1,
            ));
            // Zero groups in front and amid, runs reaching into the shared groups, and the
            // IPv4-mapped range.
            let z = (k % 7) << 112 | (k % 5) << 96 | (k % 3) << 80;
            maps.push(bare(Family::V6, z, z + (1 << 72) - 1));
            maps.push(bare(
                Family::V6,
                z | 0xffff << 32,
                z | 0xffff << 32 | 0xffff_ffff,
            ));
        }
        maps.push(bare(Family::V6, v6("::ffff:0:0"), v6("::ffff:ffff:ffff")));
        maps.push(bare(
            Family::V6,
            v6("1:0:0:1::"),
            v6("1:0:0:1:ffff:ffff:ffff:ffff"),
        ));
        maps.push(bare(
            Family::V6,
            v6("1:2:0:0:1::"),
            v6("1:2:0:0:1:0:ffff:ffff"),
        ));
        maps.push(bare(Family::V6, 0, u128::MAX));
        let (mut quick, mut plain) = (BoundsTable::default(), BoundsTable::default());
        let mut found = 0;
        for m in &maps {
            let known = Tail::of(m).is_some_and(|t| quick.by_tail.contains_key(&t));
            let (a, i) = quick.bounds_of(m, true);
            let (b, j) = plain.bounds_of(m, false);
            let texts = |prefix: &str, list: &[String]| -> Vec<String> {
                list.iter().map(|s| format!("{prefix}{s}")).collect()
            };
            let written: Vec<String> = m
                .cells
                .iter()
                .flat_map(|c| [c.first, c.last])
                .map(|v| m.family.display(v).to_string())
                .collect();
            assert_eq!(texts(&b, &plain.lists[j]), written, "{}", written[0]);
            assert_eq!(
                (&a, &quick.lists[i]),
                (&b, &plain.lists[j]),
                "{}",
                written[0]
            );
            found += usize::from(known);
        }
        assert!(found > 1000, "{found} maps found by their tail");
        assert!(quick.lists.len() < 100, "{} lists", quick.lists.len());
    }
}
