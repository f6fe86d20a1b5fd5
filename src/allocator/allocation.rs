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

#[cfg(test)]
mod tests {
    use super::*;

    /// A seed of 100,000 allocations holds one of these per allocation several times over
    /// (the ledger's reading, the kept decisions, the stored allocations a pass reads, the
    /// allocators): the address types are packed to 8-byte alignment so that an allocation
    /// takes 32 bytes, not 48 (a `u128` aligns to 16 and padded every one of them).
    #[test]
    fn an_allocation_takes_32_bytes() {
        assert_eq!(std::mem::size_of::<Cidr>(), 24);
        assert_eq!(std::mem::size_of::<AddrRange>(), 40);
        assert_eq!(std::mem::size_of::<Allocation>(), 32);
        assert_eq!(std::mem::size_of::<Option<Allocation>>(), 32);
    }
}
