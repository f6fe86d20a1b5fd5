//! Usage figures of one pool.

use crate::address::AddressCount;

/// What a pool holds, exact for every pool size.
///
/// `allocated + excluded + quarantined + shared + available == total` always holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// Addresses in the pool's CIDRs (`poolCidr` and every additional one).
    pub total: AddressCount,
    /// Addresses held by allocations.
    pub allocated: AddressCount,
    /// Addresses removed by exclusions.
    pub excluded: AddressCount,
    /// Addresses free to allocate.
    pub available: AddressCount,
    /// Number of allocations.
    pub allocations: usize,
    /// The largest contiguous run of free addresses inside one CIDR (the largest over the
    /// CIDRs; a run is never counted across the edge of two CIDRs).
    pub largest_free_block: AddressCount,
    /// `floor(100 * (1 - largest_free_block / available))`; 0 when nothing is free.
    pub fragmentation_percent: u8,
    /// Addresses quarantined for a former holder (not allocated, not available).
    pub quarantined: AddressCount,
    /// Addresses held through another pool of the same address space (not available).
    pub shared: AddressCount,
}

impl PoolUsage {
    /// Percent of the addresses that can ever be allocated (total less exclusions) that are
    /// not available (allocated, quarantined or held through another pool of the address
    /// space), floored; 100 for a pool excluded entirely.
    pub fn utilisation_percent(&self) -> u8 {
        let usable = self.total.saturating_sub(self.excluded);
        if usable.is_zero() {
            return 100;
        }
        usable.saturating_sub(self.available).percent_of(usable)
    }
}

/// What one CIDR of a pool holds ([`crate::allocator::PoolAllocator::cidr_usage`]).
///
/// `allocated + excluded + available <= total` per CIDR, the rest being set aside
/// (quarantined, or held through another pool of the address space); the sums over the CIDRs
/// of a pool are the pool's [`PoolUsage`] figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CidrUsage {
    pub cidr: crate::address::Cidr,
    /// Addresses in the CIDR.
    pub total: AddressCount,
    /// Addresses of the CIDR held by allocations.
    pub allocated: AddressCount,
    /// Addresses of the CIDR removed by exclusions.
    pub excluded: AddressCount,
    /// Addresses of the CIDR free to allocate.
    pub available: AddressCount,
    /// The largest contiguous run of free addresses inside the CIDR.
    pub largest_free_block: AddressCount,
    /// `floor(100 * (1 - largest_free_block / available))`; 0 when nothing is free.
    pub fragmentation_percent: u8,
}
