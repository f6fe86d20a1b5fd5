//! The value a cluster holds from a pool.

use std::fmt;

use crate::address::{AddrRange, AddressCount, Cidr};

/// The addresses one cluster holds from one pool, as stored in an `IPAMAllocation`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Allocation {
    /// `spec.addresses` of a range allocation: one or more disjoint pieces, in the order they
    /// were handed out (growth appends, it never rewrites a piece).
    Range(Vec<AddrRange>),
    /// `spec.cidr` of a prefix allocation.
    Prefix(Cidr),
}

impl Allocation {
    /// The pieces as address ranges (a prefix allocation is one piece).
    pub fn ranges(&self) -> impl Iterator<Item = AddrRange> + '_ {
        let (pieces, block) = match self {
            Allocation::Range(pieces) => (pieces.as_slice(), None),
            Allocation::Prefix(cidr) => (&[][..], Some(cidr.range())),
        };
        pieces.iter().copied().chain(block)
    }

    /// Number of addresses held.
    pub fn size(&self) -> AddressCount {
        match self {
            Allocation::Range(pieces) => pieces
                .iter()
                .fold(AddressCount::ZERO, |acc, p| acc.saturating_add(p.size())),
            Allocation::Prefix(cidr) => cidr.size(),
        }
    }

    /// `range` or `prefix`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Allocation::Range(_) => "range",
            Allocation::Prefix(_) => "prefix",
        }
    }
}

/// Pieces joined by commas, or the CIDR.
impl fmt::Display for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Allocation::Range(pieces) => {
                for (i, piece) in pieces.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    piece.fmt(f)?;
                }
                Ok(())
            }
            Allocation::Prefix(cidr) => cidr.fmt(f),
        }
    }
}
