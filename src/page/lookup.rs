//! "Who holds 10.1.2.3?": an address or a CIDR, answered for every pool datacenter whose
//! CIDR meets it.

use crate::address::{AddrRange, AddressCount, Cidr, parse_address};

use super::{Holding, Layout, PoolDc};

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

    /// Whether a pool with this CIDR can answer it.
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
    /// The part of the query inside the pool.
    pub first: u128,
    pub last: u128,
    /// `allocated`, `excluded`, `free` or, for a CIDR, `partial`.
    pub state: &'static str,
    /// Holdings holding any of it (overlapping holders all appear), in address order.
    pub holders: Vec<&'a Holding>,
    /// Holders left out beyond [`MAX_HOLDERS`].
    pub more: usize,
    pub allocated: AddressCount,
    pub excluded: AddressCount,
    pub free: AddressCount,
}

/// The answer of one pool datacenter (its CIDR meets the query) with its holdings.
pub fn answer<'a>(query: &Query, dc: &'a PoolDc, holdings: &[&'a Holding]) -> Option<Match<'a>> {
    let layout = Layout::build(dc, holdings)?;
    let q = query.range();
    if q.family() != layout.family || q.last() < layout.first || q.first() > layout.last {
        return None;
    }
    let (first, last) = (q.first().max(layout.first), q.last().min(layout.last));
    let wanted = AddrRange::new(layout.family, first, last)?;
    let mut hit: Vec<(u128, &'a Holding)> = holdings
        .iter()
        .filter_map(|h| {
            h.ranges
                .iter()
                .filter(|r| r.overlaps(&wanted))
                .map(|r| r.first())
                .min()
                .map(|at| (at, *h))
        })
        .collect();
    hit.sort_by(|a, b| (a.0, &a.1.cluster).cmp(&(b.0, &b.1.cluster)));
    let more = hit.len().saturating_sub(MAX_HOLDERS);
    let counts = layout.count(first, last);
    let state = if counts.free.is_zero() && counts.excluded.is_zero() {
        "allocated"
    } else if counts.free.is_zero() && counts.held.is_zero() {
        "excluded"
    } else if counts.held.is_zero() && counts.excluded.is_zero() {
        "free"
    } else {
        "partial"
    };
    Some(Match {
        dc,
        first,
        last,
        state,
        holders: hit.into_iter().take(MAX_HOLDERS).map(|(_, h)| h).collect(),
        more,
        allocated: counts.held,
        excluded: counts.excluded,
        free: counts.free,
    })
}
