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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::address::{AddrRange, AddressCount};
use crate::resources::IPAMPool;

use super::lookup::{Match, Query, answer_in};
use super::map::{AddressMap, address_map};
use super::pack::{PackError, Packer};
use super::view::{
    CellView, Detail, HolderView, MapView, PoolAttention, Summary, Totals, describe_match, detail,
    match_view, notable_conditions, of_dc, pool_dcs_with, pool_summary,
};
use super::{Holding, Layout, PoolDc, Quarantine};

/// Zoomed maps the report holds per pool datacenter at most (each is 256 cells).
pub const REPORT_ZOOMS: usize = 16;

/// Everything the offline report shows, for every pool.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// When the report was written (RFC 3339), as the caller says.
    pub generated_at: String,
    pub summary: Summary,
    /// The suffix lists of the maps' cell bounds (see [`ReportMap`]): two per cell, its
    /// first and its last address.
    pub bounds: Vec<Vec<String>>,
    /// `pool/datacenter` → what the page shows of it.
    pub datacenters: BTreeMap<String, ReportDc>,
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
    /// The fields every answer here has alike (the pool, the datacenter, …), written once.
    pub common: Map<String, Value>,
    /// Each answer as the lookup route gives it in `matches`, without `common`'s fields and
    /// without `range` (it names the address asked; the page does not draw it); with
    /// `message`, what the route's message says after the address. `holders` and
    /// `quarantine` are indexes into the detail's holders followed by [`ReportLookup::holders`].
    pub answers: Vec<Map<String, Value>>,
    /// Rows the answers show that the detail's holders do not list.
    pub holders: Vec<HolderView>,
}

/// Suffix lists of cell bounds, each written once.
#[derive(Default)]
struct BoundsTable {
    lists: Vec<Vec<String>>,
    ids: HashMap<String, usize>,
}

impl BoundsTable {
    /// `cells` (bounds and the rest) as a [`ReportMap`] of `map` (whose cells are gone).
    fn map(&mut self, mut map: MapView) -> ReportMap {
        let cells = std::mem::take(&mut map.cells);
        let mut bounds: Vec<String> = Vec::with_capacity(cells.len() * 2);
        let mut runs: Vec<usize> = Vec::new();
        let mut kinds: Vec<RunCell> = Vec::new();
        for c in cells {
            let (first, last, rest) = RunCell::split(c);
            bounds.push(first);
            bounds.push(last);
            if let (Some(k), Some(n)) = (kinds.last(), runs.last_mut())
                && *k == rest
            {
                *n += 1;
            } else {
                kinds.push(rest);
                runs.push(1);
            }
        }
        let prefix = common_prefix(&bounds).to_string();
        let key = bounds
            .iter()
            .map(|b| &b[prefix.len()..])
            .collect::<Vec<_>>()
            .join(" ");
        let next = self.lists.len();
        let id = *self.ids.entry(key).or_insert(next);
        if id == next {
            self.lists.push(
                bounds
                    .iter()
                    .map(|b| b[prefix.len()..].to_string())
                    .collect(),
            );
        }
        ReportMap {
            map,
            prefix,
            bounds: id,
            runs,
            cells: kinds,
        }
    }
}

/// The longest text every one of `texts` starts with (cut at a character boundary).
fn common_prefix(texts: &[String]) -> &str {
    let Some(first) = texts.first() else {
        return "";
    };
    let mut len = first.len();
    for t in &texts[1..] {
        len = first
            .bytes()
            .zip(t.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count();
    }
    while !first.is_char_boundary(len) {
        len -= 1;
    }
    &first[..len]
}

/// Whether every address of `first..=last` is in one and the same segment, or free.
fn uniform(layout: &Layout, first: u128, last: u128) -> bool {
    match layout.segments_in(first, last) {
        [] => true,
        [s] => s.first <= first && s.last >= last,
        _ => false,
    }
}

/// The maps of one pool datacenter: `main` (the detail's, of `poolCidr`), every other
/// CIDR's, and the zooms.
fn maps_of(
    layout: &Layout,
    holdings: &[&Holding],
    main: MapView,
    table: &mut BoundsTable,
) -> Vec<ReportMap> {
    let mut maps = vec![table.map(main)];
    let mut queue: std::collections::VecDeque<AddressMap> = Default::default();
    let mut zooms = 0;
    for (i, &(a, b)) in layout.cidrs.iter().enumerate() {
        let Ok(m) = address_map(layout, a, b) else {
            continue;
        };
        if i > 0 {
            maps.push(table.map(MapView::of(&m, holdings)));
        }
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
            maps.push(table.map(MapView::of(&z, holdings)));
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
    let mut rows: HashMap<HolderView, usize> = HashMap::new();
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
        common: Map::new(),
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
    let mut seen: HashMap<Said, usize> = HashMap::new();
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
                let mut view = match_view(&m);
                let message = describe_match(&view);
                let holders: Vec<usize> = std::mem::take(&mut view.holders)
                    .into_iter()
                    .map(&mut row_of)
                    .collect();
                let quarantine: Vec<usize> = std::mem::take(&mut view.quarantine)
                    .into_iter()
                    .map(&mut row_of)
                    .collect();
                let Ok(Value::Object(mut answer)) = serde_json::to_value(&view) else {
                    continue;
                };
                answer.remove("range");
                answer.insert("holders".into(), Value::from(holders));
                if !quarantine.is_empty() {
                    answer.insert("quarantine".into(), Value::from(quarantine));
                }
                answer.insert("message".into(), Value::String(message));
                out.answers.push(answer);
            }
            out.starts.push(show(x));
            out.answer.push(index);
        }
    }
    // Fields alike in every answer, written once.
    if let Some(first) = out.answers.first() {
        out.common = first
            .iter()
            .filter(|(k, v)| out.answers.iter().all(|a| a.get(*k) == Some(*v)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for a in &mut out.answers {
            a.retain(|k, _| !out.common.contains_key(k));
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
            let Ok((mut detail, layout)) = detail(&dc, &here, None, conditions.clone()) else {
                continue;
            };
            attention.extend(
                detail
                    .holders
                    .iter()
                    .filter(|h| h.attention.is_some())
                    .cloned(),
            );
            let main = MapView {
                cells: std::mem::take(&mut detail.map.cells),
                ..detail.map.clone()
            };
            let maps = maps_of(&layout, &here, main, &mut table);
            let lookup = lookup_of(&dc, &here, &layout, &detail.holders);
            datacenters.insert(
                format!("{}/{}", dc.pool, dc.datacenter),
                ReportDc {
                    detail,
                    maps,
                    lookup,
                },
            );
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
            matched,
            offset: 0,
            limit: matched,
        },
        bounds: table.lists,
        datacenters,
    }
}

impl Report {
    /// The report as the page's script reads it, as JSON text: the summary and each pool
    /// datacenter packed ([`super::pack`]), each pool datacenter with its CIDRs' bounds
    /// beside it (so that a search unpacks only the pool datacenters holding the address).
    pub fn packed(&self) -> Result<String, PackError> {
        let mut packer = Packer::default();
        let summary = packer.unit(&self.summary)?;
        let mut out = String::with_capacity(1 << 20);
        out.push_str("{\"datacenters\":{");
        for (i, (key, dc)) in self.datacenters.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&json(key)?);
            out.push_str(":{\"cidrs\":");
            out.push_str(&json(&dc.lookup.cidrs)?);
            out.push_str(",\"unit\":");
            out.push_str(&packer.unit(dc)?);
            out.push('}');
        }
        out.push_str("},\"generatedAt\":");
        out.push_str(&json(&self.generated_at)?);
        out.push_str(",\"bounds\":");
        out.push_str(&json(&self.bounds)?);
        out.push_str(",\"summary\":");
        out.push_str(&summary);
        out.push_str(",\"shapes\":");
        out.push_str(&json(&packer.shapes())?);
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
