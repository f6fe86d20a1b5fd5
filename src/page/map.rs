//! The address map: a slice of a pool cut into at most [`CELLS`] equal cells, each coloured by
//! what it holds. A /24 is one address per cell; a /48 is 2^72 addresses per cell, and a click
//! on a cell zooms into its slice. The cost is that of the segments in the slice plus the
//! cells, never the number of addresses.

use crate::address::{AddressCount, Family};

use super::{Layout, Owner};

/// Cells of a map (a 16 × 16 grid).
pub const CELLS: u128 = 256;

/// What a cell shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellState {
    /// Nothing held or excluded.
    Free,
    /// Every address used, most of them held.
    Allocated,
    /// Every address used, most of them excluded.
    Excluded,
    /// Some addresses used, some free.
    Partial,
    /// Every address used, most of them quarantined for a former holder.
    Quarantined,
}

impl CellState {
    pub fn as_str(self) -> &'static str {
        match self {
            CellState::Free => "free",
            CellState::Allocated => "allocated",
            CellState::Excluded => "excluded",
            CellState::Partial => "partial",
            CellState::Quarantined => "quarantined",
        }
    }
}

/// One cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub first: u128,
    pub last: u128,
    pub state: CellState,
    pub held: AddressCount,
    pub excluded: AddressCount,
    pub quarantined: AddressCount,
    /// The holding (index into the layout's holdings) holding most of the cell.
    pub holder: Option<usize>,
    /// Distinct holdings in the cell.
    pub holders: usize,
}

impl Cell {
    pub fn size(&self) -> AddressCount {
        AddressCount::span(self.first, self.last)
    }

    /// Used (held, excluded or quarantined) share of the cell, floored.
    pub fn used_percent(&self) -> u8 {
        self.used().percent_of(self.size())
    }

    fn used(&self) -> AddressCount {
        self.held
            .saturating_add(self.excluded)
            .saturating_add(self.quarantined)
    }
}

/// A map of one slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressMap {
    pub family: Family,
    pub first: u128,
    pub last: u128,
    /// Addresses per cell (the last cell may hold fewer).
    pub step: u128,
    pub cells: Vec<Cell>,
}

/// Why a slice cannot be mapped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    #[error("the slice {first}-{last} is not inside the pool (inside one of its CIDRs: {pool})")]
    Outside {
        first: String,
        last: String,
        pool: String,
    },
    #[error("the slice starts after it ends ({first}-{last})")]
    Reversed { first: String, last: String },
}

/// The map of `first..=last` (inside one CIDR of the layout's pool).
pub fn address_map(layout: &Layout, first: u128, last: u128) -> Result<AddressMap, SliceError> {
    let show = |v| layout.family.display(v).to_string();
    if first > last {
        return Err(SliceError::Reversed {
            first: show(first),
            last: show(last),
        });
    }
    if layout.cidr_holding(first, last).is_none() {
        return Err(SliceError::Outside {
            first: show(first),
            last: show(last),
            pool: layout
                .cidrs
                .iter()
                .map(|&(a, b)| format!("{}-{}", show(a), show(b)))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    // ceil(span / CELLS), written so that a span of 2^128 needs no wider integer.
    let step = (last - first) / CELLS + 1;
    let count = ((last - first) / step + 1) as usize;
    let mut cells: Vec<Cell> = (0..count)
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
    // (cell, holding, addresses), to find each cell's main holder.
    let mut shares: Vec<(usize, usize, AddressCount)> = Vec::new();
    for s in layout.segments_in(first, last) {
        let (a, b) = (s.first.max(first), s.last.min(last));
        let (from, to) = (((a - first) / step) as usize, ((b - first) / step) as usize);
        for (i, cell) in cells.iter_mut().enumerate().take(to + 1).skip(from) {
            let part = AddressCount::span(a.max(cell.first), b.min(cell.last));
            match s.owner {
                Owner::Held(h) => {
                    cell.held = cell.held.saturating_add(part);
                    shares.push((i, h, part));
                }
                Owner::Excluded => cell.excluded = cell.excluded.saturating_add(part),
                Owner::Quarantined(_) => cell.quarantined = cell.quarantined.saturating_add(part),
            }
        }
    }
    shares.sort_unstable_by_key(|(cell, holder, _)| (*cell, *holder));
    let mut best = vec![AddressCount::ZERO; cells.len()];
    let mut k = 0;
    while k < shares.len() {
        let (cell, holder, mut sum) = shares[k];
        k += 1;
        while k < shares.len() && shares[k].0 == cell && shares[k].1 == holder {
            sum = sum.saturating_add(shares[k].2);
            k += 1;
        }
        let c = &mut cells[cell];
        c.holders += 1;
        // The largest share wins; on a tie, the lowest index (shares come in index order).
        if c.holder.is_none() || sum > best[cell] {
            c.holder = Some(holder);
            best[cell] = sum;
        }
    }
    for c in &mut cells {
        let used = c.used();
        c.state = if used.is_zero() {
            CellState::Free
        } else if used < c.size() {
            CellState::Partial
        } else if c.held >= c.excluded && c.held >= c.quarantined {
            CellState::Allocated
        } else if c.quarantined > c.excluded {
            CellState::Quarantined
        } else {
            CellState::Excluded
        };
    }
    Ok(AddressMap {
        family: layout.family,
        first,
        last,
        step,
        cells,
    })
}
