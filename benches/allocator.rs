//! Allocation engine benchmark: `cargo bench --bench allocator`.
//!
//! Prints, in one run, the figures of issue #2: successive allocations from large IPv4 and
//! IPv6 pools, one more allocation in a loaded pool (100,000 allocations, 90 % full), live heap
//! for 100,000 allocations, and the same workloads (where they fit in memory and time) run by
//! two baselines written here: KKP's approach (enumerate every address of the pool as strings
//! for each allocation) and Butler's (a bitmap of the whole pool, scanned for the best fit for
//! each allocation).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashSet;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kipam::address::{AddrRange, Cidr};
use kipam::allocator::{PoolAllocator, PoolConfig, PoolKind, Request, Strategy};

/// Counts live heap bytes so the bench can report what the allocator's state costs.
struct CountingAlloc;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const N: usize = 100_000;

fn main() {
    println!("kipam allocator benchmark (one thread, release build)\n");
    let mut failures = Vec::new();

    println!("== 100,000 successive allocations ==");
    for strategy in [Strategy::FirstFit, Strategy::BestFit] {
        let (elapsed, live) = successive_range_v4(strategy);
        report_run(
            &format!("range 8 from 10.0.0.0/8, {strategy}"),
            elapsed,
            live,
        );
        check(
            &mut failures,
            "100,000-allocation run under 1 s",
            elapsed < Duration::from_secs(1),
        );
        check(
            &mut failures,
            "memory for 100,000 allocations under 50 MB",
            live < 50 << 20,
        );
    }
    for strategy in [Strategy::FirstFit, Strategy::BestFit] {
        let (elapsed, live) = successive_prefix_v6(strategy);
        report_run(
            &format!("prefix /64 from 2001:db8::/40, {strategy}"),
            elapsed,
            live,
        );
        check(
            &mut failures,
            "100,000-allocation run under 1 s",
            elapsed < Duration::from_secs(1),
        );
        check(
            &mut failures,
            "memory for 100,000 allocations under 50 MB",
            live < 50 << 20,
        );
    }

    println!("\n== one more allocation in a loaded pool (100,000 allocations, 90 % full) ==");
    let mut loaded_ns = Vec::new();
    for strategy in [Strategy::FirstFit, Strategy::BestFit] {
        let mut pool = loaded_range_pool(strategy);
        describe_pool(&pool);
        let ns = time_one_more(&mut pool, Request::Addresses(8));
        report_single(&format!("range 8 in 10.0.0.0/12, {strategy}"), &ns);
        check(
            &mut failures,
            "single loaded allocation under 5 us",
            mean(&ns) < 5_000.0,
        );
        loaded_ns.push((strategy, mean(&ns)));
    }
    println!(
        "\n== the same load in a pool datacenter of 16 CIDRs (16 x /16, none adjacent, fill order \
         not address order) =="
    );
    for strategy in [Strategy::FirstFit, Strategy::BestFit] {
        let mut pool = loaded_range_pool_16_cidrs(strategy);
        describe_pool(&pool);
        let ns = time_one_more(&mut pool, Request::Addresses(8));
        report_single(&format!("range 8 in 16 CIDRs, {strategy}"), &ns);
        check(
            &mut failures,
            "single loaded allocation in 16 CIDRs under 5 us",
            mean(&ns) < 5_000.0,
        );
    }
    {
        let mut pool = loaded_prefix_pool_v6();
        describe_pool(&pool);
        let ns = time_one_more(&mut pool, Request::Prefix(64));
        report_single("prefix /64 in 2001:db8::/47, FirstFit", &ns);
        check(
            &mut failures,
            "single loaded allocation under 5 us",
            mean(&ns) < 5_000.0,
        );
    }

    println!("\n== baselines ==");
    // The loaded pool, as the two baselines see it.
    let layout = LoadedLayout::new();
    let kkp = kkp_loaded(&layout);
    let butler = butler_loaded(&layout);
    let first_fit = loaded_ns[0].1;
    let best_fit = loaded_ns[1].1;
    println!(
        "loaded pool, one allocation: KKP approach {}, Butler approach {}",
        human(kkp),
        human(butler)
    );
    println!(
        "  speed-up of kipam FirstFit over KKP: {:.0}x; kipam BestFit over Butler: {:.0}x",
        kkp / first_fit,
        butler / best_fit
    );

    // KKP's own largest range pool is a /20: fill it with allocations of 8.
    let (kipam_fill, kkp_fill, butler_fill) = fill_slash_20();
    println!(
        "fill 10.0.0.0/20 with 512 allocations of 8: kipam {}, KKP approach {}, Butler approach {}",
        human(kipam_fill),
        human(kkp_fill),
        human(butler_fill)
    );
    println!(
        "  speed-up of kipam over KKP: {:.0}x; over Butler: {:.2}x",
        kkp_fill / kipam_fill,
        butler_fill / kipam_fill
    );

    // Butler's bitmap on the /8 workload: sampled, then projected to 100,000 allocations.
    let (sample, per_op) = butler_successive_sample();
    let kipam_per_op = successive_range_v4(Strategy::BestFit).0.as_nanos() as f64 / N as f64;
    println!(
        "range 8 from 10.0.0.0/8: Butler approach {} per allocation over the first {sample} \
         (projected {} for 100,000); kipam BestFit {} per allocation; speed-up {:.0}x",
        human(per_op),
        human(per_op * N as f64),
        human(kipam_per_op),
        per_op / kipam_per_op
    );
    println!(
        "range 8 from 10.0.0.0/8 with the KKP approach: not run (16,777,216 address strings per \
         allocation; KKP caps range pools at /20)"
    );
    println!("IPv6 workloads: neither baseline fits (a /40 has 2^88 addresses)");

    println!();
    if failures.is_empty() {
        println!("all targets met");
    } else {
        for f in &failures {
            println!("TARGET MISSED: {f}");
        }
        std::process::exit(1);
    }
}

fn check(failures: &mut Vec<String>, what: &str, ok: bool) {
    if !ok {
        failures.push(what.to_string());
    }
}

fn human(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn mean(ns: &[u64]) -> f64 {
    ns.iter().sum::<u64>() as f64 / ns.len() as f64
}

fn report_run(what: &str, elapsed: Duration, live: usize) {
    println!(
        "{what:<44} total {:>9}  per allocation {:>9}  live heap {:.1} MB",
        human(elapsed.as_nanos() as f64),
        human(elapsed.as_nanos() as f64 / N as f64),
        live as f64 / (1 << 20) as f64
    );
}

fn report_single(what: &str, ns: &[u64]) {
    let mut sorted = ns.to_vec();
    sorted.sort_unstable();
    let p99 = sorted[sorted.len() * 99 / 100];
    println!(
        "{what:<44} mean {:>9}  p99 {:>9}  max {:>9}  ({} samples)",
        human(mean(ns)),
        human(p99 as f64),
        human(*sorted.last().unwrap_or(&0) as f64),
        ns.len()
    );
}

fn describe_pool(pool: &PoolAllocator) {
    let u = pool.usage();
    let more = match pool.config().additional.len() {
        0 => String::new(),
        n => format!(" and {n} more CIDRs"),
    };
    println!(
        "  pool {}{more}: {} allocations, allocated {} + excluded {} of {} ({}% used), {} free in blocks of at most {}",
        pool.config().cidr,
        u.allocations,
        u.allocated,
        u.excluded,
        u.total,
        u.allocated.saturating_add(u.excluded).percent_of(u.total),
        u.available,
        u.largest_free_block
    );
}

fn pool(cidr: &str, kind: PoolKind, strategy: Strategy) -> PoolAllocator {
    let cidr: Cidr = cidr.parse().expect("bench CIDR");
    PoolAllocator::new(PoolConfig::new(cidr, kind, strategy)).expect("bench pool")
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("cluster-{i:06}")).collect()
}

/// 100,000 allocations of 8 from an IPv4 /8; returns the time and the live heap afterwards.
fn successive_range_v4(strategy: Strategy) -> (Duration, usize) {
    let names = names(N);
    let before = LIVE.load(Ordering::Relaxed);
    let mut p = pool(
        "10.0.0.0/8",
        PoolKind::Range {
            allocation_range: 8,
        },
        strategy,
    );
    let start = Instant::now();
    for name in &names {
        black_box(p.allocate(name, Request::Addresses(8)).expect("room"));
    }
    let elapsed = start.elapsed();
    let live = LIVE.load(Ordering::Relaxed) - before;
    drop(p);
    (elapsed, live)
}

/// 100,000 /64 subnets from an IPv6 /40.
fn successive_prefix_v6(strategy: Strategy) -> (Duration, usize) {
    let names = names(N);
    let before = LIVE.load(Ordering::Relaxed);
    let mut p = pool(
        "2001:db8::/40",
        PoolKind::Prefix {
            allocation_prefix: 64,
        },
        strategy,
    );
    let start = Instant::now();
    for name in &names {
        black_box(p.allocate(name, Request::Prefix(64)).expect("room"));
    }
    let elapsed = start.elapsed();
    let live = LIVE.load(Ordering::Relaxed) - before;
    drop(p);
    (elapsed, live)
}

/// A deterministic pseudo-random sequence (no dependency needed for a shuffle).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// The loaded layout in slots of 8 addresses: the top of the pool excluded, every other slot
/// allocated, then a random 13,107 of them released, leaving 100,000 allocations and holes of
/// 8 scattered everywhere: 90 % of the pool is allocated or excluded.
struct LoadedLayout {
    /// Pool size in addresses (2^20).
    size: u64,
    /// First excluded offset; `size - excluded_from` addresses are excluded.
    excluded_from: u64,
    /// Offsets (multiples of 8) of the 100,000 live allocations.
    allocated: Vec<u64>,
}

impl LoadedLayout {
    fn new() -> Self {
        let size = 1u64 << 20;
        let excluded = 143_719u64;
        let excluded_from = size - excluded;
        let slots = excluded_from / 8;
        let mut order: Vec<u64> = (0..slots).collect();
        let mut rng = Lcg(42);
        for i in (1..order.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let mut allocated: Vec<u64> = order[..N].iter().map(|s| s * 8).collect();
        allocated.sort_unstable();
        LoadedLayout {
            size,
            excluded_from,
            allocated,
        }
    }
}

fn loaded_range_pool(strategy: Strategy) -> PoolAllocator {
    let layout = LoadedLayout::new();
    let cidr: Cidr = "10.0.0.0/12".parse().expect("bench CIDR");
    let mut p = PoolAllocator::new(PoolConfig::new(
        cidr,
        PoolKind::Range {
            allocation_range: 8,
        },
        strategy,
    ))
    .expect("bench pool");
    let base = cidr.first();
    let family = cidr.family();
    p.exclude(
        AddrRange::new(family, base + layout.excluded_from as u128, cidr.last()).expect("range"),
    )
    .expect("exclusion");
    for (i, off) in layout.allocated.iter().enumerate() {
        let first = base + *off as u128;
        let piece = AddrRange::new(family, first, first + 7).expect("range");
        p.load(
            &format!("cluster-{i:06}"),
            kipam::allocator::Allocation::Range(vec![piece]),
        )
        .expect("load");
    }
    p
}

/// The loaded layout of [`loaded_range_pool`] in 16 CIDRs of 2^16 addresses: slot offsets
/// `k * 2^16 ..` lie in the k-th CIDR of the fill order, which is `10.(2 * ORDER[k]).0.0/16`.
fn loaded_range_pool_16_cidrs(strategy: Strategy) -> PoolAllocator {
    const ORDER: [u32; 16] = [5, 12, 0, 9, 3, 14, 7, 1, 10, 15, 2, 8, 13, 4, 11, 6];
    let layout = LoadedLayout::new();
    let cidrs: Vec<Cidr> = ORDER
        .iter()
        .map(|k| format!("10.{}.0.0/16", 2 * k).parse().expect("bench CIDR"))
        .collect();
    let mut p = PoolAllocator::new(
        PoolConfig::new(
            cidrs[0],
            PoolKind::Range {
                allocation_range: 8,
            },
            strategy,
        )
        .with_additional(cidrs[1..].to_vec()),
    )
    .expect("bench pool");
    let at = |offset: u64| cidrs[(offset >> 16) as usize].first() + (offset & 0xffff) as u128;
    let family = cidrs[0].family();
    // The exclusion of the top of the layout, one piece per CIDR it covers.
    let mut from = layout.excluded_from;
    while from < layout.size {
        let end = ((from >> 16) + 1) << 16;
        p.exclude(AddrRange::new(family, at(from), at(end - 1)).expect("range"))
            .expect("exclusion");
        from = end;
    }
    for (i, off) in layout.allocated.iter().enumerate() {
        let first = at(*off);
        let piece = AddrRange::new(family, first, first + 7).expect("range");
        p.load(
            &format!("cluster-{i:06}"),
            kipam::allocator::Allocation::Range(vec![piece]),
        )
        .expect("load");
    }
    p
}

fn loaded_prefix_pool_v6() -> PoolAllocator {
    let layout = LoadedLayout::new();
    let cidr: Cidr = "2001:db8::/47".parse().expect("bench CIDR");
    let mut p = PoolAllocator::new(PoolConfig::new(
        cidr,
        PoolKind::Prefix {
            allocation_prefix: 64,
        },
        Strategy::FirstFit,
    ))
    .expect("bench pool");
    let base = cidr.first();
    let slot = 1u128 << 64;
    // The same layout as the IPv4 pool, one /64 per slot of 8.
    let excluded_first = base + (layout.excluded_from as u128 / 8) * slot;
    p.exclude(AddrRange::new(cidr.family(), excluded_first, cidr.last()).expect("range"))
        .expect("exclusion");
    for (i, off) in layout.allocated.iter().enumerate() {
        let network = base + (*off as u128 / 8) * slot;
        let subnet = Cidr::new(cidr.family(), network, 64).expect("subnet");
        p.load(
            &format!("cluster-{i:06}"),
            kipam::allocator::Allocation::Prefix(subnet),
        )
        .expect("load");
    }
    p
}

/// Times 10,000 single allocations, each released again so the pool stays at 90 %.
fn time_one_more(p: &mut PoolAllocator, request: Request) -> Vec<u64> {
    let mut samples = Vec::with_capacity(10_000);
    for i in 0..10_000 {
        let name = format!("new-{i}");
        let start = Instant::now();
        black_box(p.allocate(&name, request).expect("room"));
        samples.push(start.elapsed().as_nanos() as u64);
        p.release(&name);
    }
    samples
}

// ---------------------------------------------------------------------------------------------
// Baseline 1, KKP's approach: for each allocation, expand every existing allocation into a set
// of address strings, enumerate every address of the pool as a string, and take the first free
// ones.

fn v4(offset: u64) -> String {
    Ipv4Addr::from(0x0a00_0000u32 + offset as u32).to_string()
}

fn kkp_allocate(pool_size: u64, used: &[(u64, u64)], count: usize) -> Vec<String> {
    let mut taken: HashSet<String> = HashSet::new();
    for (first, last) in used {
        for a in *first..=*last {
            taken.insert(v4(a));
        }
    }
    let all: Vec<String> = (0..pool_size).map(v4).collect();
    all.into_iter()
        .filter(|a| !taken.contains(a))
        .take(count)
        .collect()
}

fn kkp_loaded(layout: &LoadedLayout) -> f64 {
    let mut used: Vec<(u64, u64)> = layout.allocated.iter().map(|o| (*o, o + 7)).collect();
    used.push((layout.excluded_from, layout.size - 1));
    let runs = 3;
    let start = Instant::now();
    for _ in 0..runs {
        black_box(kkp_allocate(layout.size, &used, 8));
    }
    start.elapsed().as_nanos() as f64 / runs as f64
}

// ---------------------------------------------------------------------------------------------
// Baseline 2, Butler's approach: a bitmap of the whole pool; each allocation scans it for the
// smallest free run that fits and marks the bits.

struct Bitmap {
    words: Vec<u64>,
    size: u64,
}

impl Bitmap {
    fn new(size: u64) -> Self {
        Bitmap {
            words: vec![0; size.div_ceil(64) as usize],
            size,
        }
    }

    fn set(&mut self, first: u64, last: u64) {
        for a in first..=last {
            self.words[(a / 64) as usize] |= 1 << (a % 64);
        }
    }

    fn clear(&mut self, first: u64, last: u64) {
        for a in first..=last {
            self.words[(a / 64) as usize] &= !(1 << (a % 64));
        }
    }

    /// Best fit: scans every run of free bits, keeps the smallest that holds `count`.
    fn best_fit(&self, count: u64) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None; // (len, start)
        let mut run_start = 0u64;
        let mut run_len = 0u64;
        let close = |start: u64, len: u64, best: &mut Option<(u64, u64)>| {
            if len >= count && best.is_none_or(|(l, _)| len < l) {
                *best = Some((len, start));
            }
        };
        for (i, word) in self.words.iter().enumerate() {
            let base = i as u64 * 64;
            match *word {
                0 => {
                    if run_len == 0 {
                        run_start = base;
                    }
                    run_len += 64;
                }
                u64::MAX => {
                    close(run_start, run_len, &mut best);
                    run_len = 0;
                }
                w => {
                    for bit in 0..64 {
                        if w & (1 << bit) == 0 {
                            if run_len == 0 {
                                run_start = base + bit;
                            }
                            run_len += 1;
                        } else {
                            close(run_start, run_len, &mut best);
                            run_len = 0;
                        }
                    }
                }
            }
        }
        close(run_start, run_len.min(self.size - run_start), &mut best);
        best.map(|(_, start)| start)
    }

    fn allocate(&mut self, count: u64) -> Option<u64> {
        let start = self.best_fit(count)?;
        self.set(start, start + count - 1);
        Some(start)
    }
}

fn butler_loaded(layout: &LoadedLayout) -> f64 {
    let mut bitmap = Bitmap::new(layout.size);
    bitmap.set(layout.excluded_from, layout.size - 1);
    for off in &layout.allocated {
        bitmap.set(*off, off + 7);
    }
    let runs = 200;
    let mut total = 0u128;
    for _ in 0..runs {
        let start = Instant::now();
        let got = black_box(bitmap.allocate(8)).expect("room");
        total += start.elapsed().as_nanos();
        bitmap.clear(got, got + 7);
    }
    total as f64 / runs as f64
}

/// Fills 10.0.0.0/20 (KKP's largest range pool) with 512 allocations of 8, three ways.
fn fill_slash_20() -> (f64, f64, f64) {
    let size = 4096u64;
    let slots = (size / 8) as usize;
    let names = names(slots);

    let start = Instant::now();
    let mut p = pool(
        "10.0.0.0/20",
        PoolKind::Range {
            allocation_range: 8,
        },
        Strategy::FirstFit,
    );
    for name in &names {
        black_box(p.allocate(name, Request::Addresses(8)).expect("room"));
    }
    let kipam = start.elapsed().as_nanos() as f64;

    let start = Instant::now();
    let mut used: Vec<(u64, u64)> = Vec::new();
    for _ in 0..slots {
        let got = kkp_allocate(size, &used, 8);
        let first = used.last().map(|(_, l)| l + 1).unwrap_or(0);
        black_box(got);
        used.push((first, first + 7));
    }
    let kkp = start.elapsed().as_nanos() as f64;

    let start = Instant::now();
    let mut bitmap = Bitmap::new(size);
    for _ in 0..slots {
        black_box(bitmap.allocate(8).expect("room"));
    }
    let butler = start.elapsed().as_nanos() as f64;
    (kipam, kkp, butler)
}

/// Butler's bitmap on an IPv4 /8, allocations of 8: the first 1,000 allocations, timed.
fn butler_successive_sample() -> (usize, f64) {
    let sample = 1_000;
    let mut bitmap = Bitmap::new(1 << 24);
    let start = Instant::now();
    for _ in 0..sample {
        black_box(bitmap.allocate(8).expect("room"));
    }
    (sample, start.elapsed().as_nanos() as f64 / sample as f64)
}
