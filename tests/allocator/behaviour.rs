use kipam::address::{AddressCount, Cidr};
use kipam::allocator::{
    AllocError, Allocation, Growth, PoolAllocator, PoolConfig, PoolKind, Request, Strategy,
};

use super::{prefix_pool, range, range_pool};

fn texts(allocation: &Allocation) -> String {
    allocation.to_string()
}

#[test]
fn kkp_range_example_first_allocation() {
    for strategy in [Strategy::FirstFit, Strategy::BestFit] {
        let mut pool = range_pool("192.168.1.0/26", 8, strategy);
        let got = pool.allocate("cluster-a", Request::Addresses(8)).unwrap();
        assert_eq!(texts(got), "192.168.1.0-192.168.1.7", "{strategy}");
    }
}

#[test]
fn kkp_prefix_example_first_and_second() {
    let mut pool = prefix_pool("192.168.1.0/26", 30);
    let a = pool.allocate("a", Request::Prefix(30)).unwrap().clone();
    let b = pool.allocate("b", Request::Prefix(30)).unwrap().clone();
    assert_eq!(texts(&a), "192.168.1.0/30");
    assert_eq!(texts(&b), "192.168.1.4/30");
}

#[test]
fn kkp_range_exclusions_give_disjoint_pieces() {
    let mut pool = range_pool("192.168.1.0/26", 8, Strategy::FirstFit);
    pool.exclude(range("192.168.1.1")).unwrap();
    pool.exclude(range("192.168.1.5-192.168.1.7")).unwrap();
    let got = pool.allocate("a", Request::Addresses(8)).unwrap();
    assert_eq!(
        texts(got),
        "192.168.1.0-192.168.1.0,192.168.1.2-192.168.1.4,192.168.1.8-192.168.1.11"
    );
    let usage = pool.usage();
    assert_eq!(usage.excluded, AddressCount::from(4u64));
    assert_eq!(usage.allocated, AddressCount::from(8u64));
    assert_eq!(usage.available, AddressCount::from(52u64));
}

#[test]
fn kkp_prefix_exclusions_are_skipped() {
    let mut pool = prefix_pool("192.168.1.0/26", 30);
    pool.exclude(range("192.168.1.0/30")).unwrap();
    pool.exclude(range("192.168.1.8/30")).unwrap();
    let a = pool.allocate("a", Request::Prefix(30)).unwrap().clone();
    let b = pool.allocate("b", Request::Prefix(30)).unwrap().clone();
    assert_eq!(texts(&a), "192.168.1.4/30");
    assert_eq!(texts(&b), "192.168.1.12/30");
}

#[test]
fn prefix_exclusion_given_as_a_range_is_compared_as_addresses() {
    // 192.168.1.4-192.168.1.7 is the same address set as 192.168.1.4/30.
    let mut pool = prefix_pool("192.168.1.0/26", 30);
    pool.exclude(range("192.168.1.4-192.168.1.7")).unwrap();
    pool.exclude(range("192.168.1.4/30")).unwrap();
    pool.allocate("a", Request::Prefix(30)).unwrap();
    let b = pool.allocate("b", Request::Prefix(30)).unwrap();
    assert_eq!(texts(b), "192.168.1.8/30");
    assert_eq!(pool.usage().excluded, AddressCount::from(4u64));
}

#[test]
fn prefix_skips_unaligned_free_space() {
    let mut pool = prefix_pool("10.0.0.0/24", 29);
    pool.exclude(range("10.0.0.0-10.0.0.2")).unwrap();
    // 10.0.0.3-10.0.0.7 is free but holds no aligned /29.
    let got = pool.allocate("a", Request::Prefix(29)).unwrap();
    assert_eq!(texts(got), "10.0.0.8/29");
}

#[test]
fn network_and_broadcast_addresses_are_allocated() {
    let mut pool = range_pool("10.0.0.0/30", 4, Strategy::FirstFit);
    let got = pool.allocate("a", Request::Addresses(4)).unwrap();
    assert_eq!(texts(got), "10.0.0.0-10.0.0.3");
}

#[test]
fn best_fit_takes_the_smallest_hole() {
    let mut first = range_pool("10.0.0.0/24", 4, Strategy::FirstFit);
    let mut best = range_pool("10.0.0.0/24", 4, Strategy::BestFit);
    for pool in [&mut first, &mut best] {
        // Free holes: 10.0.0.0-10.0.0.9 (10), 10.0.0.20-10.0.0.23 (4), 10.0.0.40-... (216).
        pool.exclude(range("10.0.0.10-10.0.0.19")).unwrap();
        pool.exclude(range("10.0.0.24-10.0.0.39")).unwrap();
    }
    let f = first.allocate("a", Request::Addresses(4)).unwrap();
    let b = best.allocate("a", Request::Addresses(4)).unwrap();
    assert_eq!(texts(f), "10.0.0.0-10.0.0.3");
    assert_eq!(texts(b), "10.0.0.20-10.0.0.23");
}

#[test]
fn best_fit_falls_back_to_filling_scattered_space() {
    let mut pool = range_pool("10.0.0.0/28", 6, Strategy::BestFit);
    pool.exclude(range("10.0.0.4-10.0.0.7")).unwrap();
    pool.exclude(range("10.0.0.12-10.0.0.15")).unwrap();
    // Two holes of 4: no contiguous block of 6, but 8 addresses free.
    let got = pool.allocate("a", Request::Addresses(6)).unwrap();
    assert_eq!(texts(got), "10.0.0.0-10.0.0.3,10.0.0.8-10.0.0.9");
}

#[test]
fn best_fit_prefix_takes_the_subnet_in_the_smallest_block() {
    let config = PoolConfig::new(
        "10.0.0.0/24".parse().unwrap(),
        PoolKind::Prefix {
            allocation_prefix: 30,
        },
        Strategy::BestFit,
    );
    let mut pool = PoolAllocator::new(config).unwrap();
    pool.exclude(range("10.0.0.8-10.0.0.15")).unwrap();
    pool.exclude(range("10.0.0.20-10.0.0.255")).unwrap();
    // Free: 10.0.0.0/29 (8) and 10.0.0.16/30 (4).
    let got = pool.allocate("a", Request::Prefix(30)).unwrap();
    assert_eq!(texts(got), "10.0.0.16/30");
}

#[test]
fn exhaustion_is_a_clear_error_and_changes_nothing() {
    let mut pool = range_pool("10.0.0.0/30", 2, Strategy::FirstFit);
    let err = pool.allocate("a", Request::Addresses(8)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool 10.0.0.0/30 has 4 free addresses, 8 requested by a"
    );
    assert_eq!(pool.usage().allocations, 0);
    assert_eq!(pool.usage().available, AddressCount::from(4u64));
}

#[test]
fn prefix_exhaustion_names_the_largest_block() {
    let mut pool = prefix_pool("10.0.0.0/29", 30);
    pool.exclude(range("10.0.0.1")).unwrap();
    pool.exclude(range("10.0.0.5")).unwrap();
    let err = pool.allocate("a", Request::Prefix(30)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool 10.0.0.0/29 has no free aligned /30 subnet for a (6 free addresses, largest free block 3)"
    );
}

#[test]
fn errors_name_the_pool_label() {
    let config = PoolConfig::new(
        "10.0.0.0/30".parse().unwrap(),
        PoolKind::Range {
            allocation_range: 2,
        },
        Strategy::FirstFit,
    )
    .with_label("metallb/dc-1 (10.0.0.0/30)");
    let mut pool = PoolAllocator::new(config).unwrap();
    pool.allocate("a", Request::Addresses(2)).unwrap();
    let err = pool.allocate("a", Request::Addresses(2)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool metallb/dc-1 (10.0.0.0/30) already holds 10.0.0.0-10.0.0.1 for a"
    );
}

#[test]
fn released_space_is_reused_lowest_first() {
    let mut pool = range_pool("10.0.0.0/28", 4, Strategy::FirstFit);
    for name in ["a", "b", "c", "d"] {
        pool.allocate(name, Request::Addresses(4)).unwrap();
    }
    assert!(matches!(
        pool.allocate("e", Request::Addresses(4)),
        Err(AllocError::Exhausted { .. })
    ));
    let released = pool.release("b").unwrap();
    assert_eq!(texts(&released), "10.0.0.4-10.0.0.7");
    assert_eq!(pool.release("b"), None);
    let e = pool.allocate("e", Request::Addresses(4)).unwrap();
    assert_eq!(texts(e), "10.0.0.4-10.0.0.7");
}

#[test]
fn growth_appends_only_the_missing_addresses() {
    let mut pool = range_pool("10.0.0.0/24", 4, Strategy::FirstFit);
    pool.allocate("a", Request::Addresses(4)).unwrap();
    pool.allocate("b", Request::Addresses(4)).unwrap();
    let growth = pool.grow("a", 6).unwrap();
    assert_eq!(growth, Growth::Appended(vec![range("10.0.0.8-10.0.0.9")]));
    assert_eq!(
        texts(pool.get("a").unwrap()),
        "10.0.0.0-10.0.0.3,10.0.0.8-10.0.0.9"
    );
    // Lowering releases nothing.
    assert_eq!(pool.grow("a", 2).unwrap(), Growth::Unchanged);
    assert_eq!(pool.get("a").unwrap().size(), AddressCount::from(6u64));
    // Growth beyond the free space changes nothing.
    let before = pool.usage();
    assert!(matches!(
        pool.grow("a", 1000),
        Err(AllocError::Exhausted { .. })
    ));
    assert_eq!(pool.usage(), before);
    assert!(matches!(
        pool.grow("nobody", 8),
        Err(AllocError::NotAllocated { .. })
    ));
}

#[test]
fn pins_are_taken_exactly_or_refused_with_the_reason() {
    let mut pool = range_pool("10.0.0.0/24", 4, Strategy::FirstFit);
    pool.exclude(range("10.0.0.100-10.0.0.109")).unwrap();
    pool.allocate("a", Request::Addresses(4)).unwrap();

    let pinned = Allocation::Range(vec![range("10.0.0.50-10.0.0.53"), range("10.0.0.60")]);
    let got = pool.pin("p", pinned.clone()).unwrap();
    assert_eq!(got, &pinned);

    let cases = [
        (
            "10.0.1.0-10.0.1.3",
            "pool 10.0.0.0/24: pinned 10.0.1.0-10.0.1.3 of q is outside the pool",
        ),
        (
            "10.0.0.98-10.0.0.101",
            "pool 10.0.0.0/24: pinned 10.0.0.98-10.0.0.101 of q is excluded (exclusion 10.0.0.100-10.0.0.109)",
        ),
        (
            "10.0.0.2-10.0.0.5",
            "pool 10.0.0.0/24: pinned 10.0.0.2-10.0.0.5 of q is already taken by a",
        ),
        (
            "10.0.0.53",
            "pool 10.0.0.0/24: pinned 10.0.0.53-10.0.0.53 of q is already taken by p",
        ),
    ];
    for (request, message) in cases {
        let before = pool.usage();
        let err = pool
            .pin("q", Allocation::Range(vec![range(request)]))
            .unwrap_err();
        assert_eq!(err.to_string(), message);
        assert_eq!(pool.usage(), before, "a refused pin changes nothing");
    }
    let err = pool
        .pin(
            "q",
            Allocation::Range(vec![range("10.0.0.200-10.0.0.210"), range("10.0.0.205")]),
        )
        .unwrap_err();
    assert!(err.to_string().contains("overlap"), "{err}");
    let err = pool
        .pin("q", Allocation::Range(vec![range("2001:db8::1")]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool 10.0.0.0/24: 2001:db8::1-2001:db8::1 is IPv6, the pool is IPv4 (pinned by q)"
    );
    let cidr: Cidr = "10.0.0.128/30".parse().unwrap();
    let err = pool.pin("q", Allocation::Prefix(cidr)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool 10.0.0.0/24 is a range pool: q cannot have pinned prefix 10.0.0.128/30"
    );
}

#[test]
fn prefix_pins_and_stored_allocations() {
    let mut pool = prefix_pool("10.0.0.0/24", 28);
    let stored: Cidr = "10.0.0.0/28".parse().unwrap();
    pool.load("old", Allocation::Prefix(stored)).unwrap();
    let pinned: Cidr = "10.0.0.32/27".parse().unwrap();
    pool.pin("big", Allocation::Prefix(pinned)).unwrap();
    let next = pool.allocate("new", Request::Prefix(28)).unwrap();
    assert_eq!(texts(next), "10.0.0.16/28");
    let err = pool
        .load("dup", Allocation::Prefix("10.0.0.0/26".parse().unwrap()))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool 10.0.0.0/24: stored 10.0.0.0-10.0.0.63 of dup is already taken by old"
    );
}

#[test]
fn exclusions_never_take_allocated_addresses() {
    let mut pool = range_pool("10.0.0.0/24", 8, Strategy::FirstFit);
    pool.allocate("a", Request::Addresses(8)).unwrap();
    let before = pool.usage();
    let err = pool.exclude(range("10.0.0.4-10.0.0.20")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool 10.0.0.0/24: exclusion 10.0.0.4-10.0.0.20 hits the allocation of a (10.0.0.0-10.0.0.7)"
    );
    assert_eq!(pool.usage(), before);
    let err = pool.exclude(range("10.0.1.0/30")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool 10.0.0.0/24: exclusion 10.0.1.0-10.0.1.3 is outside the pool"
    );
}

#[test]
fn pool_configuration_is_checked() {
    let cidr: Cidr = "10.0.0.0/28".parse().unwrap();
    let err = PoolAllocator::new(PoolConfig::new(
        cidr,
        PoolKind::Range {
            allocation_range: 17,
        },
        Strategy::FirstFit,
    ))
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pool 10.0.0.0/28: allocationRange 17 is invalid: must be between 1 and the pool size 16"
    );
    let err = PoolAllocator::new(PoolConfig::new(
        cidr,
        PoolKind::Prefix {
            allocation_prefix: 27,
        },
        Strategy::FirstFit,
    ))
    .unwrap_err();
    assert!(err.to_string().contains("allocationPrefix 27"), "{err}");
    let mut pool = range_pool("10.0.0.0/28", 4, Strategy::FirstFit);
    assert!(matches!(
        pool.allocate("a", Request::Prefix(30)),
        Err(AllocError::WrongType { .. })
    ));
    assert!(matches!(
        pool.allocate("a", Request::Addresses(0)),
        Err(AllocError::InvalidRequest { .. })
    ));
}

#[test]
fn ipv6_slash_48_counts_are_exact() {
    let mut pool = range_pool("2001:db8:1::/48", 8, Strategy::FirstFit);
    let got = pool.allocate("a", Request::Addresses(8)).unwrap();
    assert_eq!(texts(got), "2001:db8:1::-2001:db8:1::7");
    let usage = pool.usage();
    assert_eq!(usage.total, AddressCount::pow2(80));
    assert_eq!(usage.total.to_string(), "1208925819614629174706176");
    assert_eq!(usage.available.to_string(), "1208925819614629174706168");
}

#[test]
fn whole_ipv6_space_is_a_valid_range_pool() {
    let mut pool = range_pool("::/0", 1 << 100, Strategy::BestFit);
    pool.exclude(range("::/1")).unwrap();
    let got = pool.allocate("a", Request::Addresses(1 << 100)).unwrap();
    assert_eq!(texts(got), "8000::-8000:f:ffff:ffff:ffff:ffff:ffff:ffff");
    let usage = pool.usage();
    assert_eq!(usage.total, AddressCount::pow2(128));
    assert_eq!(
        usage
            .allocated
            .saturating_add(usage.excluded)
            .saturating_add(usage.available),
        usage.total
    );
    assert_eq!(usage.fragmentation_percent, 0);
}

#[test]
fn fragmentation_and_largest_block() {
    let mut pool = range_pool("10.0.0.0/28", 2, Strategy::FirstFit);
    pool.exclude(range("10.0.0.4-10.0.0.7")).unwrap();
    // Free: 0-3 (4) and 8-15 (8): largest 8 of 12 free -> 33 % fragmented.
    let usage = pool.usage();
    assert_eq!(usage.largest_free_block, AddressCount::from(8u64));
    assert_eq!(usage.fragmentation_percent, 33);
    assert_eq!(usage.utilisation_percent(), 0);
    pool.allocate("a", Request::Addresses(2)).unwrap();
    assert_eq!(pool.usage().utilisation_percent(), 16);
}

#[test]
fn holder_lookup() {
    let mut pool = range_pool("10.0.0.0/28", 4, Strategy::FirstFit);
    pool.allocate("a", Request::Addresses(4)).unwrap();
    pool.allocate("b", Request::Addresses(4)).unwrap();
    let (_, five) = kipam::address::parse_address("10.0.0.5").unwrap();
    assert_eq!(pool.holder_of(five), Some("b"));
    assert_eq!(pool.holder_of(five + 10), None);
}
