//! The allocation engine seen from outside: KKP's documented behaviour, pins, growth, errors
//! and randomised invariants.

mod behaviour;
mod cidrs;
mod properties;

use kipam::address::{AddrRange, Cidr};
use kipam::allocator::{PoolAllocator, PoolConfig, PoolKind, Strategy};

pub fn range_pool(cidr: &str, size: u128, strategy: Strategy) -> PoolAllocator {
    let cidr: Cidr = cidr.parse().expect("test CIDR");
    PoolAllocator::new(PoolConfig::new(
        cidr,
        PoolKind::Range {
            allocation_range: size,
        },
        strategy,
    ))
    .expect("valid pool")
}

pub fn prefix_pool(cidr: &str, length: u8) -> PoolAllocator {
    let cidr: Cidr = cidr.parse().expect("test CIDR");
    PoolAllocator::new(PoolConfig::new(
        cidr,
        PoolKind::Prefix {
            allocation_prefix: length,
        },
        Strategy::FirstFit,
    ))
    .expect("valid pool")
}

pub fn range(text: &str) -> AddrRange {
    AddrRange::parse_lenient(text).expect("test range")
}
