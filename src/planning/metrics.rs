//! The planning loop's metrics: passes, allocations written and waited for, and the pool
//! figures of the last plan, registered in the seed's registry
//! ([`crate::seed::metrics::Metrics::register`]).
//!
//! Pool figures are computed by [`pool_gauges`], a pure function of the plan, and published by
//! [`Metrics::observe_plan`], which the planning pass calls once per pass.
//!
//! Address counts are exact integers up to 2^128 (an IPv6 `::/0`), but Prometheus samples are
//! 64-bit floats. A count is published as the nearest `f64`: exact up to 2^53 (every IPv4 pool
//! and IPv6 pools up to a /75), and above that rounded to 53 significant bits, a relative
//! error below 1.2e-16 (powers of two, such as the size of any CIDR, stay exact). The exact
//! figures are in the pool's `status.datacenters`.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::address::AddressCount;
use crate::planner::{Change, Decision, Plan};
use crate::resources::AllocationPhase;
use crate::seed::metrics::Metrics as SeedMetrics;

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
    pub datacenter: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolStateLabels {
    pub pool: String,
    pub datacenter: String,
    /// `total`, `allocated`, `excluded` or `available`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub pool: String,
    pub datacenter: String,
    /// An `IPAMAllocation` phase: `Pending`, `Allocated`, `Failed`, `Released`, `Conflict`.
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PassKindLabels {
    /// What a pass did: `whole` (planned the whole seed), `partial` (planned the pools a
    /// change concerns), `new` (served new clusters or claims from the kept allocators),
    /// `growth` (decided growth on the kept plan), `statuses` (wrote pool statuses only) or
    /// `idle` (woken with nothing to do).
    pub kind: String,
}

/// What the planning loop reports.
pub struct Metrics {
    seed: Arc<SeedMetrics>,
    pub passes: Counter,
    /// Passes by what they did.
    pub pass_kinds: Family<PassKindLabels, Counter>,
    pub pass_failures: Counter,
    /// Duration of every planning pass.
    pub pass_duration: Histogram,
    pub allocations_created: Counter,
    pub allocations_released: Counter,
    pub allocation_failures: Counter,
    /// From the first pass that found a cluster's request unmet to the allocation written.
    pub allocation_duration: Histogram,
    /// When each (cluster, pool) request still unmet was first seen by a pass.
    unmet_since: Mutex<Unmet>,
    pub pool_addresses: Family<PoolStateLabels, FloatGauge>,
    pub pool_utilization: Family<PoolLabels, FloatGauge>,
    pub pool_largest_free_block: Family<PoolLabels, FloatGauge>,
    pub allocations: Family<PhaseLabels, Gauge>,
    /// Machines' Cluster API claims holding an address, per pool datacenter.
    pub claims: Family<PoolLabels, Gauge>,
    /// The (pool, datacenter) pairs published by the last pass, to remove those that went.
    published: Mutex<BTreeSet<(String, String)>>,
    /// Fragmentation per pool datacenter, and the figures of each of its CIDRs.
    pub cidrs: CidrGauges,
    /// Demand-driven growth: allocations grown, grown pieces given back, and LoadBalancer
    /// Services waiting that growth could not serve (max reached, pool full), per pool
    /// datacenter.
    pub growths: Family<PoolLabels, Counter>,
    pub shrinks: Family<PoolLabels, Counter>,
    pub growth_unmet: Family<PoolLabels, Gauge>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("planning::Metrics").finish_non_exhaustive()
    }
}

/// The phases [`Metrics::allocations`] is published for. (`Released` objects are deleted, not
/// kept, so no allocation stays in that phase.)
pub const PUBLISHED_PHASES: [AllocationPhase; 4] = [
    AllocationPhase::Pending,
    AllocationPhase::Allocated,
    AllocationPhase::Failed,
    AllocationPhase::Conflict,
];

/// The figures published for one pool in one datacenter.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolFigures {
    pub pool: String,
    pub datacenter: String,
    pub total: f64,
    pub allocated: f64,
    pub excluded: f64,
    pub available: f64,
    /// Share of the addresses that can be allocated (total less exclusions) that is not
    /// available (allocated, quarantined or shared), 0 to
    /// 1; 1 for a pool excluded entirely.
    pub utilization: f64,
    pub largest_free_block: f64,
    /// Allocations by phase, for every phase of [`PUBLISHED_PHASES`] (zeros included).
    pub phases: Vec<(AllocationPhase, u64)>,
    /// Addresses quarantined for their former holders (`reuseAfter`).
    pub quarantined: f64,
    /// Addresses held through another pool of the same address space.
    pub shared: f64,
    /// Machines' Cluster API claims holding an address.
    pub claims: u64,
}

/// An exact address count as the nearest `f64` (see the module documentation).
pub fn count_to_f64(count: AddressCount) -> f64 {
    match count.to_u128() {
        // Rust rounds integer-to-float conversions to the nearest value.
        Some(n) => n as f64,
        None => count.to_string().parse().unwrap_or(f64::INFINITY),
    }
}

/// The pool figures of a plan: one entry per pool and datacenter the plan reports usage for,
/// sorted by pool then datacenter. Pure: plain data in, plain data out.
pub fn pool_gauges(plan: &Plan) -> Vec<PoolFigures> {
    let mut phases: HashMap<(&str, &str), [u64; PUBLISHED_PHASES.len()]> = HashMap::new();
    let mut claims: HashMap<(&str, &str), u64> = HashMap::new();
    for d in &plan.decisions {
        if crate::resources::capi::claim_of_holder(&d.cluster).is_some() {
            // A machine's claim: counted on its own, not as an `IPAMAllocation`.
            if d.held.is_some() && d.change != crate::planner::Change::Release {
                *claims
                    .entry((d.pool.as_str(), d.datacenter.as_str()))
                    .or_default() += 1;
            }
            continue;
        }
        let Some(phase) = crate::desired::phase_of(d) else {
            continue;
        };
        if let Some(i) = PUBLISHED_PHASES.iter().position(|p| *p == phase) {
            phases
                .entry((d.pool.as_str(), d.datacenter.as_str()))
                .or_default()[i] += 1;
        }
    }
    plan.usage
        .values()
        .map(|r| {
            let counts = phases
                .get(&(r.pool.as_str(), r.datacenter.as_str()))
                .copied()
                .unwrap_or_default();
            let mut f = usage_figures(r, PUBLISHED_PHASES.iter().copied().zip(counts).collect());
            f.claims = claims
                .get(&(r.pool.as_str(), r.datacenter.as_str()))
                .copied()
                .unwrap_or(0);
            f
        })
        .collect()
}

/// The figures of one pool datacenter's usage, with the phase counts given.
fn usage_figures(
    r: &crate::planner::DatacenterReport,
    phases: Vec<(AllocationPhase, u64)>,
) -> PoolFigures {
    {
        {
            let u = &r.usage;
            let usable = u.total.saturating_sub(u.excluded);
            let utilization = if usable.is_zero() {
                1.0
            } else {
                count_to_f64(usable.saturating_sub(u.available)) / count_to_f64(usable)
            };
            PoolFigures {
                pool: r.pool.clone(),
                datacenter: r.datacenter.clone(),
                total: count_to_f64(u.total),
                allocated: count_to_f64(u.allocated),
                excluded: count_to_f64(u.excluded),
                available: count_to_f64(u.available),
                utilization,
                largest_free_block: count_to_f64(u.largest_free_block),
                claims: 0,
                phases,
                quarantined: count_to_f64(u.quarantined),
                shared: count_to_f64(u.shared),
            }
        }
    }
}

/// True when a decision leaves the cluster waiting for addresses it asked for (or planned
/// them in this pass, to be written next).
fn unmet(d: &Decision) -> bool {
    matches!(
        d.change,
        Change::Create | Change::Grow | Change::Replace | Change::Fail
    )
}

/// When each (cluster, pool) request still unmet was first seen, by cluster: a burst of new
/// clusters has every one of its requests here at once (100,000 at 10,000 clusters × 10
/// pools), so each cluster's name is kept once, not once per pool.
#[derive(Debug, Default)]
struct Unmet(HashMap<String, Vec<(String, Instant)>>);

impl Unmet {
    fn note(&mut self, cluster: &str, pool: &str, at: Instant) {
        let pools = match self.0.get_mut(cluster) {
            Some(pools) => pools,
            None => self.0.entry(cluster.to_string()).or_default(),
        };
        if !pools.iter().any(|(p, _)| p == pool) {
            // A cluster has a request per pool: grown one at a time, not doubled.
            pools.reserve_exact(1);
            pools.push((pool.to_string(), at));
        }
    }

    fn take(&mut self, cluster: &str, pool: &str) -> Option<Instant> {
        let pools = self.0.get_mut(cluster)?;
        let i = pools.iter().position(|(p, _)| p == pool)?;
        let (_, since) = pools.swap_remove(i);
        if pools.is_empty() {
            self.0.remove(cluster);
        }
        Some(since)
    }

    fn retain(&mut self, live: impl Fn(&str, &str) -> bool) {
        self.0.retain(|cluster, pools| {
            pools.retain(|(pool, _)| live(cluster, pool));
            !pools.is_empty()
        });
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// The planning loop's metrics, registered in the seed's registry.
    pub fn new(seed: &Arc<SeedMetrics>) -> Arc<Self> {
        let m = Metrics {
            seed: seed.clone(),
            passes: Counter::default(),
            pass_kinds: Family::default(),
            pass_failures: Counter::default(),
            pass_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            allocations_created: Counter::default(),
            allocations_released: Counter::default(),
            allocation_failures: Counter::default(),
            allocation_duration: Histogram::new(exponential_buckets(0.025, 2.0, 16)),
            unmet_since: Mutex::new(Unmet::default()),
            pool_addresses: Family::default(),
            pool_utilization: Family::default(),
            pool_largest_free_block: Family::default(),
            allocations: Family::default(),
            claims: Family::default(),
            published: Mutex::new(BTreeSet::new()),
            cidrs: CidrGauges::default(),
            growths: Family::default(),
            shrinks: Family::default(),
            growth_unmet: Family::default(),
        };
        seed.register(|registry| {
            registry.register(
                "growths",
                "Allocations grown for LoadBalancer Services waiting for an address",
                m.growths.clone(),
            );
            registry.register(
                "shrinks",
                "Grown pieces given back after staying unused for shrinkAfter",
                m.shrinks.clone(),
            );
            registry.register(
                "growth_unmet_services",
                "LoadBalancer Services waiting that growth could not serve (max reached, pool full)",
                m.growth_unmet.clone(),
            );
        });
        seed.register(|registry| {
            registry.register("reconcile_passes", "Planning passes run", m.passes.clone());
            registry.register(
                "reconcile_passes_by_kind",
                "Planning passes by what they did: whole, partial, new, growth, statuses or idle",
                m.pass_kinds.clone(),
            );
            registry.register(
                "reconcile_pass_failures",
                "Planning passes that ended with an error",
                m.pass_failures.clone(),
            );
            registry.register(
                "reconcile_pass_duration_seconds",
                "Duration of each planning pass (plan and writes)",
                m.pass_duration.clone(),
            );
            registry.register(
                "allocations_created",
                "Allocations created, grown or re-pinned",
                m.allocations_created.clone(),
            );
            registry.register(
                "allocations_released",
                "Allocations released",
                m.allocations_released.clone(),
            );
            registry.register(
                "allocation_failures",
                "Allocation requests that could not be met (counted when their reason changes)",
                m.allocation_failures.clone(),
            );
            registry.register(
            "allocation_duration_seconds",
            "From the first pass that found a cluster's request unmet to its allocation written \
             (time spent Failed waiting for space included)",
            m.allocation_duration.clone(),
        );
            registry.register(
                "pool_addresses",
                "Addresses per pool and datacenter, by state (total, allocated, excluded, \
             available, quarantined, shared: held through another pool of the address \
             space); published by the leader",
                m.pool_addresses.clone(),
            );
            registry.register(
            "pool_utilization_ratio",
            "Share (0-1) of the addresses that can be allocated (total less excluded) that is not available (allocated, quarantined or held through another pool of the space)",
            m.pool_utilization.clone(),
        );
            registry.register(
                "pool_largest_free_block",
                "Largest run of consecutive free addresses per pool and datacenter",
                m.pool_largest_free_block.clone(),
            );
            registry.register(
                "allocations",
                "IPAMAllocations per pool, datacenter and phase",
                m.allocations.clone(),
            );
            registry.register(
                "claims",
                "Cluster API IPAddressClaims holding an address, per pool and datacenter",
                m.claims.clone(),
            );
            m.cidrs.register(registry);
        });
        Arc::new(m)
    }

    /// Publishes the pool figures of a plan ([`pool_gauges`]), removes those of pools and
    /// datacenters no longer planned, and notes which requests are still unmet (for
    /// `kipam_allocation_duration_seconds`). Called once per pass.
    pub fn observe_plan(&self, plan: &Plan) {
        let figures = pool_gauges(plan);
        let now: BTreeSet<(String, String)> = figures
            .iter()
            .map(|f| (f.pool.clone(), f.datacenter.clone()))
            .collect();
        {
            let mut published = lock(&self.published);
            for (pool, datacenter) in published.difference(&now) {
                self.remove_pool(pool, datacenter);
            }
            for f in &figures {
                let labels = PoolLabels {
                    pool: f.pool.clone(),
                    datacenter: f.datacenter.clone(),
                };
                self.set_usage(&labels, f);
                for (phase, count) in &f.phases {
                    self.allocations
                        .get_or_create(&phase_labels(&labels, *phase))
                        .set(*count as i64);
                }
                self.claims.get_or_create(&labels).set(f.claims as i64);
            }
            *published = now;
        }
        self.cidrs.observe(plan.usage.values(), true);
        let at = Instant::now();
        let mut unmet_since = lock(&self.unmet_since);
        let mut live: std::collections::HashSet<(&str, &str)> = std::collections::HashSet::new();
        for d in plan.decisions.iter().filter(|d| unmet(d)) {
            live.insert((d.cluster.as_str(), d.pool.as_str()));
        }
        unmet_since.retain(|cluster, pool| live.contains(&(cluster, pool)));
        for (cluster, pool) in live {
            unmet_since.note(cluster, pool, at);
        }
    }

    /// What a short pass changed: `added` decisions (clusters new to the seed) and the usage
    /// of the pool datacenters they were served from. Phase counts grow by the added
    /// decisions instead of being counted again over the whole plan.
    pub fn observe_added(&self, plan: &Plan, added: &[Decision]) {
        let at = Instant::now();
        let mut touched: BTreeSet<(&str, &str)> = BTreeSet::new();
        {
            let mut unmet_since = lock(&self.unmet_since);
            for d in added {
                touched.insert((d.pool.as_str(), d.datacenter.as_str()));
                if unmet(d) {
                    unmet_since.note(&d.cluster, &d.pool, at);
                }
            }
        }
        let published = lock(&self.published);
        for (pool, datacenter) in touched {
            let key = (pool.to_string(), datacenter.to_string());
            if !published.contains(&key) {
                continue;
            }
            let Some(report) = plan.usage.get(&key) else {
                continue;
            };
            let f = usage_figures(report, Vec::new());
            self.cidrs.observe(std::iter::once(report), false);
            let labels = PoolLabels {
                pool: key.0.clone(),
                datacenter: key.1.clone(),
            };
            self.set_usage(&labels, &f);
            for d in added
                .iter()
                .filter(|d| d.pool == key.0 && d.datacenter == key.1)
            {
                if let Some(phase) = crate::desired::phase_of(d)
                    && PUBLISHED_PHASES.contains(&phase)
                {
                    self.allocations
                        .get_or_create(&phase_labels(&labels, phase))
                        .inc();
                }
            }
        }
    }

    /// The address, utilization and free-block gauges of one pool datacenter.
    fn set_usage(&self, labels: &PoolLabels, f: &PoolFigures) {
        for (state, value) in [
            ("total", f.total),
            ("allocated", f.allocated),
            ("excluded", f.excluded),
            ("available", f.available),
            ("quarantined", f.quarantined),
            ("shared", f.shared),
        ] {
            self.pool_addresses
                .get_or_create(&state_labels(labels, state))
                .set(value);
        }
        self.pool_utilization
            .get_or_create(labels)
            .set(f.utilization);
        self.pool_largest_free_block
            .get_or_create(labels)
            .set(f.largest_free_block);
    }

    fn remove_pool(&self, pool: &str, datacenter: &str) {
        let labels = PoolLabels {
            pool: pool.to_string(),
            datacenter: datacenter.to_string(),
        };
        for state in [
            "total",
            "allocated",
            "excluded",
            "available",
            "quarantined",
            "shared",
        ] {
            self.pool_addresses.remove(&state_labels(&labels, state));
        }
        self.pool_utilization.remove(&labels);
        self.pool_largest_free_block.remove(&labels);
        for phase in PUBLISHED_PHASES {
            self.allocations.remove(&phase_labels(&labels, phase));
        }
        self.claims.remove(&labels);
    }

    /// Records whether this replica leads. A replica that does not lead publishes no pool
    /// figures (they would go stale), so summing them over replicas stays right.
    pub fn set_leader(&self, holds: bool) {
        self.seed.leader.set(holds as i64);
        if !holds {
            let mut published = lock(&self.published);
            for (pool, datacenter) in published.iter() {
                self.remove_pool(pool, datacenter);
            }
            published.clear();
            self.cidrs.clear();
            lock(&self.unmet_since).clear();
        }
    }

    /// Records the end of one planning pass.
    /// One pass of `kind` ran (see [`PassKindLabels`]).
    pub fn pass_kind(&self, kind: &str) {
        self.pass_kinds
            .get_or_create(&PassKindLabels {
                kind: kind.to_string(),
            })
            .inc();
    }

    pub fn pass_finished(&self, took: Duration) {
        self.pass_duration.observe(took.as_secs_f64());
    }

    /// Counts an allocation written (created, grown or re-pinned) and how long its cluster
    /// waited for it.
    pub fn allocation_written(&self, cluster: &str, pool: &str) {
        self.allocations_created.inc();
        let since = lock(&self.unmet_since).take(cluster, pool);
        if let Some(since) = since {
            self.allocation_duration
                .observe(since.elapsed().as_secs_f64());
        }
    }
}

fn state_labels(pool: &PoolLabels, state: &str) -> PoolStateLabels {
    PoolStateLabels {
        pool: pool.pool.clone(),
        datacenter: pool.datacenter.clone(),
        state: state.to_string(),
    }
}

fn phase_labels(pool: &PoolLabels, phase: AllocationPhase) -> PhaseLabels {
    PhaseLabels {
        pool: pool.pool.clone(),
        datacenter: pool.datacenter.clone(),
        phase: phase.as_str().to_string(),
    }
}

/// The labels of one CIDR of a pool datacenter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct CidrLabels {
    pub pool: String,
    pub datacenter: String,
    pub cidr: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CidrStateLabels {
    pub pool: String,
    pub datacenter: String,
    pub cidr: String,
    /// `total`, `allocated`, `excluded` or `available`.
    pub state: String,
}

/// The fragmentation of each pool datacenter, and the figures of each of its CIDRs
/// (`poolCidr` and `additionalCidrs`), so that an admin sees which CIDR is full and which
/// one new allocations come from.
#[derive(Default)]
pub struct CidrGauges {
    pub pool_fragmentation: Family<PoolLabels, FloatGauge>,
    pub addresses: Family<CidrStateLabels, FloatGauge>,
    pub largest_free_block: Family<CidrLabels, FloatGauge>,
    pub fragmentation: Family<CidrLabels, FloatGauge>,
    /// What the last whole pass published, to remove what went.
    published: Mutex<CidrsPublished>,
}

/// Pool datacenters and CIDRs with published gauges.
type CidrsPublished = (BTreeSet<(String, String)>, BTreeSet<CidrLabels>);

const CIDR_STATES: [&str; 4] = ["total", "allocated", "excluded", "available"];

impl CidrGauges {
    fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "pool_fragmentation_ratio",
            "Share (0-1) of the free addresses outside the largest free block, per pool and \
             datacenter",
            self.pool_fragmentation.clone(),
        );
        registry.register(
            "pool_cidr_addresses",
            "Addresses per CIDR of a pool datacenter, by state (total, allocated, excluded, \
             available)",
            self.addresses.clone(),
        );
        registry.register(
            "pool_cidr_largest_free_block",
            "Largest run of consecutive free addresses per CIDR of a pool datacenter",
            self.largest_free_block.clone(),
        );
        registry.register(
            "pool_cidr_fragmentation_ratio",
            "Share (0-1) of a CIDR's free addresses outside its largest free block",
            self.fragmentation.clone(),
        );
    }

    /// Publishes the figures of `reports`; `whole`: they are every pool datacenter of the
    /// plan, so what is not among them is removed.
    fn observe<'a>(
        &self,
        reports: impl Iterator<Item = &'a crate::planner::DatacenterReport>,
        whole: bool,
    ) {
        let mut pools = BTreeSet::new();
        let mut cidrs = BTreeSet::new();
        for r in reports {
            let labels = PoolLabels {
                pool: r.pool.clone(),
                datacenter: r.datacenter.clone(),
            };
            self.pool_fragmentation
                .get_or_create(&labels)
                .set(f64::from(r.usage.fragmentation_percent) / 100.0);
            pools.insert((r.pool.clone(), r.datacenter.clone()));
            for c in &r.cidrs {
                let labels = CidrLabels {
                    pool: r.pool.clone(),
                    datacenter: r.datacenter.clone(),
                    cidr: c.cidr.to_string(),
                };
                for (state, value) in
                    CIDR_STATES
                        .iter()
                        .zip([c.total, c.allocated, c.excluded, c.available])
                {
                    self.addresses
                        .get_or_create(&cidr_state(&labels, state))
                        .set(count_to_f64(value));
                }
                self.largest_free_block
                    .get_or_create(&labels)
                    .set(count_to_f64(c.largest_free_block));
                self.fragmentation
                    .get_or_create(&labels)
                    .set(f64::from(c.fragmentation_percent) / 100.0);
                cidrs.insert(labels);
            }
        }
        let mut published = lock(&self.published);
        if whole {
            for gone in published.0.difference(&pools) {
                self.pool_fragmentation.remove(&PoolLabels {
                    pool: gone.0.clone(),
                    datacenter: gone.1.clone(),
                });
            }
            for gone in published.1.difference(&cidrs) {
                self.remove_cidr(gone);
            }
            *published = (pools, cidrs);
        } else {
            // A short pass changes no pool's CIDRs: only adds what it touched.
            published.0.extend(pools);
            published.1.extend(cidrs);
        }
    }

    fn remove_cidr(&self, labels: &CidrLabels) {
        for state in CIDR_STATES {
            self.addresses.remove(&cidr_state(labels, state));
        }
        self.largest_free_block.remove(labels);
        self.fragmentation.remove(labels);
    }

    /// Removes everything (this replica stopped leading).
    fn clear(&self) {
        let mut published = lock(&self.published);
        for (pool, datacenter) in &published.0 {
            self.pool_fragmentation.remove(&PoolLabels {
                pool: pool.clone(),
                datacenter: datacenter.clone(),
            });
        }
        for labels in &published.1 {
            self.remove_cidr(labels);
        }
        *published = Default::default();
    }
}

fn cidr_state(labels: &CidrLabels, state: &str) -> CidrStateLabels {
    CidrStateLabels {
        pool: labels.pool.clone(),
        datacenter: labels.datacenter.clone(),
        cidr: labels.cidr.clone(),
        state: state.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{Cluster, IPAMPool};

    fn plan_of(pools_yaml: &str, clusters: &[(&str, &str)]) -> Plan {
        let pools: Vec<IPAMPool> = pools_yaml
            .split("\n---\n")
            .map(|doc| serde_saphyr::from_str(doc).expect("pool parses"))
            .collect();
        let pool_inputs: Vec<_> = pools
            .iter()
            .map(|p| crate::validation::pool_input(p).expect("valid pool"))
            .collect();
        let cluster_inputs: Vec<_> = clusters
            .iter()
            .enumerate()
            .map(|(i, (name, dc))| {
                let c: Cluster = serde_saphyr::from_str(&format!(
                    "apiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n  creationTimestamp: \"2026-01-01T00:00:0{i}Z\"\nspec:\n  datacenter: {dc}\n"
                ))
                .expect("cluster parses");
                crate::validation::cluster_input(&c).expect("valid cluster")
            })
            .collect();
        crate::planner::plan(&pool_inputs, &cluster_inputs, &[])
    }

    /// The pools of the end-to-end metrics test.
    const EDGE: &str = include_str!("../../tests/controller/metrics-pools.yaml");

    #[test]
    fn pool_figures_count_every_state_and_phase_exactly() {
        let plan = plan_of(
            EDGE,
            &[("a", "dc-1"), ("b", "dc-1"), ("c", "dc-1"), ("d", "dc-1")],
        );
        let figures = pool_gauges(&plan);
        let names: Vec<(&str, &str)> = figures
            .iter()
            .map(|f| (f.pool.as_str(), f.datacenter.as_str()))
            .collect();
        assert_eq!(names, [("edge", "dc-1"), ("edge", "dc-2"), ("v6", "dc-1")]);
        // 16 addresses, 1 excluded, three clusters of 4: the fourth does not fit in the 3 left.
        let edge = &figures[0];
        assert_eq!(
            (edge.total, edge.allocated, edge.excluded, edge.available),
            (16.0, 12.0, 1.0, 3.0)
        );
        assert_eq!(edge.utilization, 12.0 / 15.0);
        assert_eq!(edge.largest_free_block, 3.0);
        assert_eq!(
            edge.phases,
            [
                (AllocationPhase::Pending, 0),
                (AllocationPhase::Allocated, 3),
                (AllocationPhase::Failed, 1),
                (AllocationPhase::Conflict, 0),
            ]
        );
        let empty = &figures[1];
        assert_eq!(
            (empty.total, empty.available, empty.utilization),
            (256.0, 256.0, 0.0)
        );
        // Four /64s of a /48: 2^66 of 2^80, exact in f64.
        let v6 = &figures[2];
        assert_eq!(v6.total, 2f64.powi(80));
        assert_eq!(v6.allocated, 2f64.powi(66));
        assert_eq!(v6.available, 2f64.powi(80) - 2f64.powi(66));
        assert_eq!(v6.largest_free_block, 2f64.powi(80) - 2f64.powi(66));
        assert_eq!(v6.utilization, 2f64.powi(-14));
    }

    #[test]
    fn counts_become_the_nearest_float() {
        assert_eq!(count_to_f64(AddressCount::pow2(128)), 2f64.powi(128));
        assert_eq!(
            count_to_f64(AddressCount::from_u128(u128::MAX)),
            2f64.powi(128)
        );
        assert_eq!(
            count_to_f64(AddressCount::from_u128((1 << 53) + 1)),
            2f64.powi(53)
        );
        assert_eq!(count_to_f64(AddressCount::from_u128(12345)), 12345.0);
    }

    #[test]
    fn gauges_of_a_pool_that_went_are_removed_and_a_follower_publishes_none() {
        let m = Metrics::new(&SeedMetrics::new());
        m.observe_plan(&plan_of(EDGE, &[("a", "dc-1")]));
        let text = m.seed.encode();
        assert!(
            text.contains(
                "kipam_pool_addresses{pool=\"edge\",datacenter=\"dc-2\",state=\"total\"} 256.0"
            ),
            "{text}"
        );
        assert!(text.contains(
            "kipam_allocations{pool=\"edge\",datacenter=\"dc-1\",phase=\"Allocated\"} 1"
        ));
        let only_v6 = EDGE.split("\n---\n").nth(1).unwrap_or_default();
        m.observe_plan(&plan_of(only_v6, &[("a", "dc-1")]));
        let text = m.seed.encode();
        assert!(!text.contains("pool=\"edge\""), "{text}");
        assert!(text.contains("kipam_pool_utilization_ratio{pool=\"v6\",datacenter=\"dc-1\"}"));
        m.set_leader(false);
        assert!(!m.seed.encode().contains("pool=\"v6\""));
    }

    #[test]
    fn each_cidr_of_a_pool_has_its_figures_and_a_cidr_removed_loses_them() {
        const TWO: &str = "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata:\n  name: grown\nspec:\n  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/30\n      allocationRange: 6\n      additionalCidrs: [10.0.1.0/29]\n";
        let m = Metrics::new(&SeedMetrics::new());
        m.observe_plan(&plan_of(TWO, &[("a", "dc-1")]));
        let text = m.seed.encode();
        for line in [
            "kipam_pool_cidr_addresses{pool=\"grown\",datacenter=\"dc-1\",cidr=\"10.0.0.0/30\",state=\"available\"} 0.0",
            "kipam_pool_cidr_addresses{pool=\"grown\",datacenter=\"dc-1\",cidr=\"10.0.1.0/29\",state=\"allocated\"} 2.0",
            "kipam_pool_cidr_largest_free_block{pool=\"grown\",datacenter=\"dc-1\",cidr=\"10.0.1.0/29\"} 6.0",
            "kipam_pool_cidr_fragmentation_ratio{pool=\"grown\",datacenter=\"dc-1\",cidr=\"10.0.1.0/29\"} 0.0",
            "kipam_pool_fragmentation_ratio{pool=\"grown\",datacenter=\"dc-1\"} 0.0",
            "kipam_pool_addresses{pool=\"grown\",datacenter=\"dc-1\",state=\"total\"} 12.0",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        let one = TWO.replace("      additionalCidrs: [10.0.1.0/29]\n", "");
        m.observe_plan(&plan_of(
            &one.replace("allocationRange: 6", "allocationRange: 4"),
            &[],
        ));
        let text = m.seed.encode();
        assert!(!text.contains("10.0.1.0/29"), "{text}");
        assert!(text.contains("cidr=\"10.0.0.0/30\""), "{text}");
        m.set_leader(false);
        assert!(!m.seed.encode().contains("cidr="));
    }

    #[test]
    fn allocation_duration_runs_from_the_first_unmet_pass_to_the_write() {
        let m = Metrics::new(&SeedMetrics::new());
        let plan = plan_of(EDGE, &[("a", "dc-1")]);
        m.observe_plan(&plan);
        std::thread::sleep(Duration::from_millis(30));
        // The next pass sees the request still unmet: the clock keeps its first start.
        m.observe_plan(&plan);
        m.allocation_written("a", "edge");
        // Written once: a second write of the same allocation (a grow) is not timed again.
        m.allocation_written("a", "edge");
        let text = m.seed.encode();
        assert!(
            text.contains("kipam_allocation_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("kipam_allocations_created_total 2"), "{text}");
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("kipam_allocation_duration_seconds_sum "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        assert!(sum >= 0.03, "{sum}");
    }
}
