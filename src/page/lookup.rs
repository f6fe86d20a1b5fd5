//! "Who holds 10.1.2.3?": an address or a CIDR, answered for every pool datacenter whose
//! CIDR meets it.

use crate::address::{AddrRange, AddressCount, Cidr, parse_address};

use super::{Holding, Layout, PoolDc, Quarantine};

/// What was asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    Address(AddrRange),
    Cidr(Cidr),
}

impl Query {
    /// Parses an address (`10.1.2.3`, `2001:db8::1`) or a CIDR (`10.1.2.0/24`). The error
    /// names the value and says what is expected.
    pub fn parse(text: &str) -> Result<Query, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("address: is empty; expected an IP address or a CIDR".into());
        }
        if t.contains('/') {
            return t
                .parse::<Cidr>()
                .map(Query::Cidr)
                .map_err(|e| format!("address: {e}; expected an IP address or a CIDR"));
        }
        let (family, value) = parse_address(t).map_err(|_| {
            format!("address: {t:?} is not an IP address or a CIDR (10.1.2.3, 10.1.2.0/24, 2001:db8::/64)")
        })?;
        AddrRange::new(family, value, value)
            .map(Query::Address)
            .ok_or_else(|| format!("address: {t:?} is not an IP address"))
    }

    pub fn range(&self) -> AddrRange {
        match self {
            Query::Address(r) => *r,
            Query::Cidr(c) => c.range(),
        }
    }

    /// The query as written back (`10.1.2.3`, `10.1.2.0/24`).
    pub fn text(&self) -> String {
        match self {
            Query::Address(r) => r.family().display(r.first()).to_string(),
            Query::Cidr(c) => c.to_string(),
        }
    }

    /// Whether a pool with this CIDR (one of a pool datacenter's) can answer it.
    pub fn meets(&self, pool: &Cidr) -> bool {
        self.range().overlaps(&pool.range())
    }
}

/// Holders listed per pool datacenter at most; the answer says how many more there are.
pub const MAX_HOLDERS: usize = 100;

/// The answer in one pool datacenter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match<'a> {
    pub dc: &'a PoolDc,
    /// The part of the query inside the pool's CIDRs (from the first address there to the
    /// last; a CIDR query may span several of them).
    pub first: u128,
    pub last: u128,
    /// The pool's CIDRs the query meets, in fill order.
    pub cidrs: Vec<String>,
    /// `allocated`, `excluded`, `quarantined`, `free`, `unheld` (held by no allocation, but
    /// the pool datacenter keeps a quarantine that is only known as a count: it may be
    /// quarantined) or, for a CIDR, `partial`.
    pub state: &'static str,
    /// Holdings holding any of it (overlapping holders all appear), in address order.
    pub holders: Vec<&'a Holding>,
    /// Holders left out beyond [`MAX_HOLDERS`].
    pub more: usize,
    /// Quarantine entries keeping any of it.
    pub quarantine: Vec<&'a Quarantine>,
    pub allocated: AddressCount,
    pub excluded: AddressCount,
    pub quarantined: AddressCount,
    pub free: AddressCount,
}

/// The answer of one pool datacenter (one of its CIDRs meets the query) with its holdings.
pub fn answer<'a>(query: &Query, dc: &'a PoolDc, holdings: &[&'a Holding]) -> Option<Match<'a>> {
    let layout = Layout::build(dc, holdings)?;
    answer_in(&layout, query, dc, holdings)
}

/// [`answer`] with the layout of `dc` and `holdings` already built (the offline report asks
/// it once per piece of the pool).
pub fn answer_in<'a>(
    layout: &Layout,
    query: &Query,
    dc: &'a PoolDc,
    holdings: &[&'a Holding],
) -> Option<Match<'a>> {
    let q = query.range();
    if q.family() != layout.family {
        return None;
    }
    let met: Vec<(usize, u128, u128)> = layout
        .cidrs
        .iter()
        .enumerate()
        .filter(|(_, (a, b))| q.first() <= *b && q.last() >= *a)
        .map(|(i, &(a, b))| (i, q.first().max(a), q.last().min(b)))
        .collect();
    let first = met.iter().map(|m| m.1).min()?;
    let last = met.iter().map(|m| m.2).max()?;
    let parts: Vec<AddrRange> = met
        .iter()
        .filter_map(|&(_, a, b)| AddrRange::new(layout.family, a, b))
        .collect();
    let meets = |r: &AddrRange| parts.iter().any(|p| r.overlaps(p));
    let mut hit: Vec<(u128, &'a Holding)> = holdings
        .iter()
        .filter_map(|h| {
            h.ranges
                .iter()
                .filter(|r| meets(r))
                .map(|r| r.first())
                .min()
                .map(|at| (at, *h))
        })
        .collect();
    hit.sort_by(|a, b| (a.0, &a.1.cluster).cmp(&(b.0, &b.1.cluster)));
    let more = hit.len().saturating_sub(MAX_HOLDERS);
    let quarantine: Vec<&'a Quarantine> = dc
        .quarantine
        .iter()
        .filter(|e| e.ranges.iter().any(meets))
        .collect();
    let (mut held, mut excluded, mut quarantined, mut free) = (
        AddressCount::ZERO,
        AddressCount::ZERO,
        AddressCount::ZERO,
        AddressCount::ZERO,
    );
    for &(_, a, b) in &met {
        let c = layout.count(a, b);
        held = held.saturating_add(c.held);
        excluded = excluded.saturating_add(c.excluded);
        quarantined = quarantined.saturating_add(c.quarantined);
        free = free.saturating_add(c.free);
    }
    let kinds = [
        ("allocated", held),
        ("excluded", excluded),
        ("quarantined", quarantined),
        ("free", free),
    ];
    let mut used = kinds.iter().filter(|(_, n)| !n.is_zero());
    let state = match (used.next(), used.next()) {
        (Some(("free", _)), None) if dc.quarantine_unknown() => "unheld",
        (Some((kind, _)), None) => kind,
        _ => "partial",
    };
    Some(Match {
        dc,
        first,
        last,
        cidrs: met
            .iter()
            .filter_map(|&(i, _, _)| dc.cidrs.get(i).map(ToString::to_string))
            .collect(),
        state,
        holders: hit.into_iter().take(MAX_HOLDERS).map(|(_, h)| h).collect(),
        more,
        quarantine,
        allocated: held,
        excluded,
        quarantined,
        free,
    })
}
