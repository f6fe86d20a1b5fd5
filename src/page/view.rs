//! The page's JSON model: what the served page fetches and what the offline report inlines.
//! Counts are decimal strings (exact for IPv6); addresses are written in their usual form.

use schemars::JsonSchema;
use serde::Serialize;

use crate::address::{AddressCount, Family};
use crate::resources::IPAMPool;

use super::lookup::{Match, Query};
use super::map::{AddressMap, Cell, SliceError, address_map};
use super::{Holding, Layout, PoolDc, Quarantine, Usage, pool_dcs};

/// A pool datacenter's figures.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageView {
    pub total: String,
    pub allocated: String,
    pub excluded: String,
    /// Released addresses kept for their former holder (`reuseAfter`) before reuse.
    pub quarantined: String,
    pub free: String,
    pub largest_free_block: String,
    pub fragmentation_percent: u8,
    /// Allocated share of the addresses that are not excluded.
    pub utilisation_percent: u8,
    /// Shares of the whole pool, floored, for the usage bar.
    pub allocated_percent: u8,
    pub excluded_percent: u8,
    pub quarantined_percent: u8,
    /// Allocations holding addresses here.
    pub holders: usize,
}

impl UsageView {
    pub fn of(u: &Usage) -> UsageView {
        UsageView {
            total: u.total.to_string(),
            allocated: u.allocated.to_string(),
            excluded: u.excluded.to_string(),
            quarantined: u.quarantined.to_string(),
            free: u.free.to_string(),
            largest_free_block: u.largest_free_block.to_string(),
            fragmentation_percent: u.fragmentation_percent,
            utilisation_percent: u.utilisation_percent,
            allocated_percent: u.allocated.percent_of(u.total),
            excluded_percent: u.excluded.percent_of(u.total),
            quarantined_percent: u.quarantined.percent_of(u.total),
            holders: u.holders,
        }
    }
}

/// One allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HolderView {
    pub cluster: String,
    pub namespace: String,
    pub pool: String,
    pub datacenter: String,
    /// `spec.cidr` or `spec.addresses`, as stored.
    pub addresses: String,
    /// Addresses held.
    pub size: String,
    /// `Pending`, `Allocated`, `Failed`, `Released` or `Conflict`.
    pub phase: String,
    /// Why it needs a look: `Failed`, `Conflict`, `Overlap` (shares addresses with another
    /// allocation of the pool) or `Unreadable`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attention: Option<String>,
    /// `status.message`, or what does not parse.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl HolderView {
    pub fn of(h: &Holding, overlapping: bool) -> HolderView {
        let attention = h
            .attention()
            .or(overlapping.then_some("Overlap"))
            .map(str::to_string);
        let message = match (&h.unreadable, h.message.is_empty()) {
            (Some(why), _) => why.clone(),
            (None, _) => h.message.clone(),
        };
        HolderView {
            cluster: h.cluster.clone(),
            namespace: h.namespace.clone(),
            pool: h.pool.clone(),
            datacenter: h.datacenter.clone(),
            addresses: h.addresses.clone(),
            size: h.size().to_string(),
            phase: h.phase.as_str().to_string(),
            attention,
            message,
        }
    }
}

impl HolderView {
    /// A quarantine entry as a row of the holders: addresses its former holder gets back if
    /// it returns in time, handed to nobody else.
    pub fn quarantined(q: &Quarantine, dc: &PoolDc) -> HolderView {
        HolderView {
            cluster: q.holder.clone(),
            namespace: crate::resources::cluster_namespace(&q.holder),
            pool: dc.pool.clone(),
            datacenter: dc.datacenter.clone(),
            addresses: q
                .ranges
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            size: q
                .ranges
                .iter()
                .fold(AddressCount::ZERO, |sum, r| sum.saturating_add(r.size()))
                .to_string(),
            phase: "Quarantined".to_string(),
            attention: None,
            message: format!("quarantined for {} until {}", q.holder, q.until),
        }
    }
}

/// A pool condition worth showing (not Ready, overlapping, over a capacity threshold).
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConditionView {
    #[serde(rename = "type")]
    pub type_: String,
    pub reason: String,
    pub message: String,
}

/// The notable conditions of a pool's status.
pub fn notable_conditions(pool: &IPAMPool) -> Vec<ConditionView> {
    let Some(status) = &pool.status else {
        return Vec::new();
    };
    status
        .conditions
        .iter()
        .filter(|c| match c.type_.as_str() {
            "Ready" => c.status == "False",
            "Overlap" | "CapacityWarning" | "CapacityCritical" | "CapacityExhausted" => {
                c.status == "True"
            }
            _ => false,
        })
        .map(|c| ConditionView {
            type_: c.type_.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        })
        .collect()
}

/// One pool datacenter in the list.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatacenterSummary {
    pub name: String,
    #[serde(rename = "type")]
    pub type_: String,
    /// `poolCidr`, followed by `+N` when the datacenter has N `additionalCidrs`.
    pub cidr: String,
    /// Every CIDR, in fill order (`poolCidr` first).
    pub cidrs: Vec<String>,
    /// What a cluster gets by default (`8 addresses`, `/30`).
    pub request: String,
    /// Totals over every CIDR; `None` when `poolCidr` does not parse (see `problems`).
    pub usage: Option<UsageView>,
    /// Allocations here that need a look.
    pub attention: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// One pool in the list.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolSummary {
    pub name: String,
    pub reclaim_policy: String,
    pub conditions: Vec<ConditionView>,
    pub datacenters: Vec<DatacenterSummary>,
}

/// The holdings of `holdings` in datacenter `dc`.
pub(super) fn of_dc<'a>(holdings: &'a [Holding], dc: &str) -> Vec<&'a Holding> {
    holdings.iter().filter(|h| h.datacenter == dc).collect()
}

/// Attention marks of a pool datacenter's holdings: their own, and overlaps.
fn attention_count(layout: Option<&Layout>, holdings: &[&Holding]) -> usize {
    holdings
        .iter()
        .enumerate()
        .filter(|(i, h)| {
            h.attention().is_some() || layout.is_some_and(|l| l.overlapping.contains(i))
        })
        .count()
}

/// A pool with its usage per datacenter (`dcs`, from [`pool_dcs`] or [`pool_dcs_with`]);
/// `holdings` are the pool's (any datacenter).
pub fn pool_summary(pool: &IPAMPool, dcs: &[PoolDc], holdings: &[Holding]) -> PoolSummary {
    summary_of(pool, dcs, holdings)
}

/// The pool datacenters of `pool` with the quarantine known address by address (the pool
/// records, or the offline state file): `quarantine` (any pool) replaces the status count.
pub fn pool_dcs_with(pool: &IPAMPool, quarantine: &[Quarantine]) -> Vec<PoolDc> {
    let mut dcs = pool_dcs(pool);
    for dc in &mut dcs {
        dc.quarantined_count = None;
        dc.quarantine = quarantine
            .iter()
            .filter(|q| q.pool == dc.pool && q.datacenter == dc.datacenter)
            .cloned()
            .collect();
    }
    dcs
}

fn summary_of(pool: &IPAMPool, dcs: &[PoolDc], holdings: &[Holding]) -> PoolSummary {
    let datacenters = dcs
        .iter()
        .map(|dc| {
            let mine = of_dc(holdings, &dc.datacenter);
            let layout = Layout::build(dc, &mine);
            DatacenterSummary {
                name: dc.datacenter.clone(),
                type_: dc.type_.to_string(),
                cidr: dc.cidrs_short(),
                cidrs: dc.cidrs_text.clone(),
                request: dc.request.clone(),
                usage: layout.as_ref().map(|l| UsageView::of(&l.usage(&mine))),
                attention: attention_count(layout.as_ref(), &mine),
                problems: dc.problems.clone(),
            }
        })
        .collect();
    PoolSummary {
        name: pool.metadata.name.clone().unwrap_or_default(),
        reclaim_policy: format!("{:?}", pool.spec.reclaim_policy),
        conditions: notable_conditions(pool),
        datacenters,
    }
}

/// Seed-wide figures.
#[derive(Clone, Debug, Default, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub pools: usize,
    pub datacenters: usize,
    /// Allocations stored.
    pub allocations: usize,
    /// Allocations that are `Failed` or `Conflict` (the served summary; the offline report
    /// also counts overlapping and unreadable ones), pools with a notable condition, and
    /// clusters whose adoption needs a look.
    pub attention: usize,
}

/// The first screen: seed-wide figures, what needs a look, and one page of pools.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub seed: String,
    pub totals: Totals,
    /// Allocations needing a look, the first [`MAX_ATTENTION`] of them.
    pub attention: Vec<HolderView>,
    /// Pools with a notable condition (by name).
    pub attention_pools: Vec<PoolAttention>,
    /// Pools on this page, by name.
    pub pools: Vec<PoolSummary>,
    /// The adoption section: present when any cluster adopts (`spec.adopt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption: Option<super::adoption::AdoptionPage>,
    /// Pools matching the filter (all pages).
    pub matched: usize,
    pub offset: usize,
    pub limit: usize,
}

/// A pool with a notable condition.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolAttention {
    pub pool: String,
    pub conditions: Vec<ConditionView>,
}

/// Allocations needing a look listed in a summary at most.
pub const MAX_ATTENTION: usize = 50;

/// Holdings needing a look go first: Failed, Conflict, Overlap, Unreadable; then by address.
fn holder_order(
    a: &HolderView,
    ra: Option<u128>,
    b: &HolderView,
    rb: Option<u128>,
) -> std::cmp::Ordering {
    let rank = |v: &HolderView| match v.attention.as_deref() {
        Some("Failed") => 0,
        Some("Conflict") => 1,
        Some("Overlap") => 2,
        Some(_) => 3,
        None => 4,
    };
    (rank(a), ra.is_none(), ra, &a.cluster).cmp(&(rank(b), rb.is_none(), rb, &b.cluster))
}

/// One cell of the address map.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CellView {
    pub first: String,
    pub last: String,
    /// `free`, `allocated`, `excluded`, `quarantined` or `partial` (some used, some free).
    pub state: String,
    /// Used (allocated, excluded or quarantined) share, floored.
    pub used_percent: u8,
    /// The cluster holding most of the cell (not a former holder of quarantined addresses).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Distinct holders in the cell.
    pub holders: usize,
}

/// The address map of a slice of a pool.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MapView {
    pub first: String,
    pub last: String,
    /// Addresses per cell (the last cell may hold fewer).
    pub cell_size: String,
    pub cells: Vec<CellView>,
}

impl CellView {
    /// Cell `c` of a map drawn with `holdings`, its bounds written as `first` and `last`
    /// (the offline report writes them its own compact way, and passes empty texts).
    pub fn of(c: &Cell, holdings: &[&Holding], first: String, last: String) -> CellView {
        CellView {
            first,
            last,
            state: c.state.as_str().to_string(),
            used_percent: c.used_percent(),
            holder: c
                .holder
                .and_then(|i| holdings.get(i))
                .map(|h| h.cluster.clone()),
            holders: c.holders,
        }
    }
}

impl MapView {
    pub fn of(map: &AddressMap, holdings: &[&Holding]) -> MapView {
        let show = |v| map.family.display(v).to_string();
        MapView {
            cells: map
                .cells
                .iter()
                .map(|c| CellView::of(c, holdings, show(c.first), show(c.last)))
                .collect(),
            ..MapView::frame(map)
        }
    }

    /// The map without its cells.
    pub fn frame(map: &AddressMap) -> MapView {
        let show = |v| map.family.display(v).to_string();
        MapView {
            first: show(map.first),
            last: show(map.last),
            cell_size: AddressCount::from_u128(map.step).to_string(),
            cells: Vec::new(),
        }
    }
}

/// One pool datacenter in full.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    pub pool: String,
    pub datacenter: String,
    #[serde(rename = "type")]
    pub type_: String,
    /// `poolCidr`.
    pub cidr: String,
    /// Every CIDR of the pool datacenter in fill order, with its own figures; the map shows
    /// one of them at a time (the first by default).
    pub cidrs: Vec<CidrView>,
    pub request: String,
    pub problems: Vec<String>,
    pub conditions: Vec<ConditionView>,
    /// Totals over every CIDR.
    pub usage: UsageView,
    /// Set when addresses are quarantined here but the map cannot show which (the served
    /// page before its watch of the pool records has listed); says so in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantine_note: Option<String>,
    pub exclusions: Vec<String>,
    pub map: MapView,
    /// Needing a look first, then by address; the first [`MAX_HOLDERS`].
    pub holders: Vec<HolderView>,
    pub holders_total: usize,
}

/// One CIDR of a pool datacenter.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CidrView {
    pub cidr: String,
    /// Its first and last addresses (the map's slice for the whole CIDR).
    pub first: String,
    pub last: String,
    pub usage: UsageView,
}

/// Holders listed in a detail at most (the search finds any other).
pub const MAX_HOLDERS: usize = 2_000;

/// Why a detail cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DetailError {
    #[error("the pool's CIDR cannot be read: {0}")]
    NoCidr(String),
    #[error(transparent)]
    Slice(#[from] SliceError),
}

/// A pool datacenter with its map of `slice` (the whole pool when `None`).
pub fn detail(
    dc: &PoolDc,
    holdings: &[&Holding],
    slice: Option<(u128, u128)>,
    conditions: Vec<ConditionView>,
) -> Result<(Detail, Layout), DetailError> {
    let (mut detail, layout, map) = detail_frame(dc, holdings, slice, conditions)?;
    detail.map = MapView::of(&map, holdings);
    Ok((detail, layout))
}

/// [`detail`] with the map's cells left out ([`MapView::frame`]), and the map itself: the
/// offline report writes the cells its own compact way.
pub fn detail_frame(
    dc: &PoolDc,
    holdings: &[&Holding],
    slice: Option<(u128, u128)>,
    conditions: Vec<ConditionView>,
) -> Result<(Detail, Layout, AddressMap), DetailError> {
    let layout =
        Layout::build(dc, holdings).ok_or_else(|| DetailError::NoCidr(dc.problems.join("; ")))?;
    let (first, last) = slice.unwrap_or(layout.cidrs[0]);
    let map = address_map(&layout, first, last)?;
    let mut holders: Vec<(HolderView, Option<u128>)> = holdings
        .iter()
        .enumerate()
        .map(|(i, h)| {
            (
                HolderView::of(h, layout.overlapping.contains(&i)),
                h.ranges.first().map(|r| r.first()),
            )
        })
        .chain(dc.quarantine.iter().map(|q| {
            (
                HolderView::quarantined(q, dc),
                q.ranges.first().map(|r| r.first()),
            )
        }))
        .collect();
    holders.sort_by(|(a, ra), (b, rb)| holder_order(a, *ra, b, *rb));
    let total = holders.len();
    let show = |v| layout.family.display(v).to_string();
    let detail = Detail {
        pool: dc.pool.clone(),
        datacenter: dc.datacenter.clone(),
        type_: dc.type_.to_string(),
        cidr: dc.cidr_text.clone(),
        cidrs: layout
            .cidrs
            .iter()
            .zip(&dc.cidrs)
            .map(|(&(a, b), c)| CidrView {
                cidr: c.to_string(),
                first: show(a),
                last: show(b),
                usage: UsageView::of(&layout.cidr_usage(a, b, holdings)),
            })
            .collect(),
        request: dc.request.clone(),
        problems: dc.problems.clone(),
        conditions,
        usage: UsageView::of(&layout.usage(holdings)),
        quarantine_note: layout.quarantined_count.map(|n| {
            format!(
                "{n} released addresses are quarantined here for their former holders; the map \
                 and the search cannot tell which yet (this replica is still loading the pool \
                 records), so the map draws them as free"
            )
        }),
        exclusions: dc
            .exclusions
            .iter()
            .map(|r| {
                if r.first() == r.last() {
                    show(r.first())
                } else {
                    format!("{}-{}", show(r.first()), show(r.last()))
                }
            })
            .collect(),
        map: MapView::frame(&map),
        holders: holders
            .into_iter()
            .take(MAX_HOLDERS)
            .map(|(v, _)| v)
            .collect(),
        holders_total: total,
    };
    Ok((detail, layout, map))
}

/// A slice of a pool, parsed from its two addresses (`from`, `to`).
pub fn parse_slice(family: Family, from: &str, to: &str) -> Result<(u128, u128), String> {
    let parse = |field: &str, text: &str| match crate::address::parse_address(text) {
        Ok((f, v)) if f == family => Ok(v),
        Ok(_) => Err(format!("{field}: {text:?} is not an {family} address")),
        Err(_) => Err(format!("{field}: {text:?} is not an IP address")),
    };
    Ok((parse("from", from)?, parse("to", to)?))
}

/// One pool datacenter's answer to a lookup.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatchView {
    pub pool: String,
    pub datacenter: String,
    pub pool_cidr: String,
    #[serde(rename = "type")]
    pub type_: String,
    /// The part of the query inside this pool's CIDRs (`first-last`).
    pub range: String,
    /// The pool's CIDRs (`poolCidr`, `additionalCidrs`) that the query meets.
    pub cidrs: Vec<String>,
    /// `allocated`, `excluded`, `quarantined` (kept for a former holder), `free`, `unheld`
    /// (held by no allocation, but the pool datacenter has quarantined addresses that this
    /// replica cannot list: it may be one of them, so it is not called free), or `partial`
    /// for a CIDR partly used.
    pub state: String,
    pub allocated: String,
    pub excluded: String,
    pub quarantined: String,
    pub free: String,
    /// Allocations holding any of it (all of them when they overlap).
    pub holders: Vec<HolderView>,
    /// Holders not listed.
    pub more: usize,
    /// Quarantine entries keeping any of it: the former holder, and until when.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quarantine: Vec<HolderView>,
}

/// The answer to "who holds this address or CIDR?".
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LookupView {
    pub query: String,
    /// One entry per pool datacenter whose CIDR meets the query, by pool and datacenter;
    /// empty when no pool covers it.
    pub matches: Vec<MatchView>,
    /// One line for a person.
    pub message: String,
}

/// The view of one match.
pub fn match_view(m: &Match<'_>) -> MatchView {
    let family = m.dc.cidr.map(|c| c.family()).unwrap_or(Family::V4);
    let show = |v| family.display(v).to_string();
    MatchView {
        pool: m.dc.pool.clone(),
        datacenter: m.dc.datacenter.clone(),
        pool_cidr: m.dc.cidr_text.clone(),
        type_: m.dc.type_.to_string(),
        range: format!("{}-{}", show(m.first), show(m.last)),
        cidrs: m.cidrs.clone(),
        state: m.state.to_string(),
        allocated: m.allocated.to_string(),
        excluded: m.excluded.to_string(),
        quarantined: m.quarantined.to_string(),
        free: m.free.to_string(),
        holders: m.holders.iter().map(|h| HolderView::of(h, false)).collect(),
        more: m.more,
        quarantine: m
            .quarantine
            .iter()
            .map(|q| HolderView::quarantined(q, m.dc))
            .collect(),
    }
}

/// The view of a lookup's matches.
pub fn lookup_view(query: &Query, matches: &[Match<'_>]) -> LookupView {
    let text = query.text();
    let views: Vec<MatchView> = matches.iter().map(match_view).collect();
    let message = match views.as_slice() {
        [] => format!("no pool covers {text}"),
        [m] => describe(&text, m),
        many => many
            .iter()
            .map(|m| describe(&text, m))
            .collect::<Vec<_>>()
            .join("; "),
    };
    LookupView {
        query: text,
        matches: views,
        message,
    }
}

/// What [`LookupView::message`] says of one match, after the query text (` is held by web
/// (pool lb in dc-1)`): the offline report puts the asked address in front of it.
pub fn describe_match(m: &MatchView) -> String {
    describe("", m)
}

fn describe(text: &str, m: &MatchView) -> String {
    let at = format!("pool {} in {}", m.pool, m.datacenter);
    let who = m
        .holders
        .iter()
        .map(|h| h.cluster.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let kept = m
        .quarantine
        .iter()
        .map(|q| q.message.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    match m.state.as_str() {
        "allocated" => format!("{text} is held by {who} ({at})"),
        "excluded" => format!("{text} is excluded ({at})"),
        "quarantined" => format!("{text} is {kept} ({at})"),
        "free" => format!("{text} is free ({at})"),
        "unheld" => format!(
            "{text} is not held by any allocation ({at}); {} addresses there are quarantined and this replica cannot tell which, so it may be one of them",
            m.quarantined
        ),
        _ if who.is_empty() && kept.is_empty() => {
            format!("{text} is partly excluded, partly free ({at})")
        }
        _ if who.is_empty() => format!("{text} is partly {kept} ({at})"),
        _ => format!("{text} is partly held by {who} ({at})"),
    }
}
