//! Step "growth": demand-driven growth and shrink, applied to the plan before the fence.
//!
//! The decision is the pure [`planner::growth::decide`]; this step gathers its input — the
//! plan's kept range allocations of pool datacenters with `growth`, what their objects record
//! of their pieces (`status.pieces`), the demand the reader saw ([`crate::seed::demand`]) —
//! and applies the outcome to the plan and its allocators ([`planner::growth::apply`]). The
//! changed decisions then go through the same record commit and object writes as every
//! other: nothing here writes.
//!
//! A growth is taken from allocators that hold everything: the ones the last plan left, which
//! short passes keep up to date (`PassState::states`). So growth never needs the whole seed
//! planned again: every full pass decides it on its plan, whole or patched, and when only the
//! demand changed (or a timer came due, see [`due`]) the growth pass (`regrow`) decides it on
//! the kept plan alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;

use crate::allocator::Allocation;
use crate::planner::growth::{
    self, Applied, GrowthInput, GrowthOverride, GrowthPolicy, Holding, Note, Outcome, RecordedPiece,
};
use crate::planner::{Change, Plan, PoolStates};
use crate::resources::{Cluster, IPAMPool, PieceKind, PieceStatus, cluster_namespace};
use crate::seed::Context;
use crate::seed::ledger::Entry;

/// A Service that MetalLB has not refused counts as demand after waiting this long.
pub const PENDING_GRACE: i64 = 10;

/// What the step leaves for the writes and the report.
#[derive(Default)]
pub(super) struct GrowthDone {
    /// (cluster, pool) -> what `status.pieces` should say.
    pub pieces: HashMap<(String, String), Vec<PieceStatus>>,
    /// Refusals to report: (cluster, pool, reason, note).
    pub events: Vec<(String, String, &'static str, String)>,
    /// The next moment a grown piece may be given back.
    pub next_due: Option<Duration>,
    /// (pool, datacenter) -> demand not met.
    pub unmet: BTreeMap<(String, String), usize>,
}

/// Growth is to be decided in this pass: demand is read, and it changed since the last
/// decision or a timer that decision set came due. Every full pass decides anyway; a short
/// pass for new clusters runs only when this is false (the growth pass goes first).
pub(super) fn due(ctx: &Context, state: &super::PassState) -> bool {
    !ctx.demand.is_empty()
        && (state.growth_generation != Some(ctx.demand.generation())
            || state
                .growth_due
                .is_some_and(|due| std::time::Instant::now() >= due))
}

/// Keeps what the decision made at demand generation `generation` asks of later passes.
pub(super) fn decided(state: &mut super::PassState, generation: u64, done: &GrowthDone) {
    state.growth_generation = Some(generation);
    state.growth_due = done.next_due.map(|d| std::time::Instant::now() + d);
}

/// How long until the growth timer of the last decision comes due, if it set one (at least
/// 10 ms: a timer already due is served by the next pass, not by a loop).
pub(super) fn wake_in(ctx: &Context, state: &super::PassState) -> Option<Duration> {
    let due = state.growth_due?;
    if ctx.demand.is_empty() {
        return None;
    }
    Some(
        due.saturating_duration_since(std::time::Instant::now())
            .max(Duration::from_millis(10)),
    )
}

/// The growth settings of every pool datacenter that has them: (pool, datacenter) ->
/// (policy, the pool's `allocationRange`).
pub(super) fn policies(pools: &[Arc<IPAMPool>]) -> HashMap<(String, String), (GrowthPolicy, u128)> {
    let mut policies = HashMap::new();
    for pool in pools {
        if pool.metadata.deletion_timestamp.is_some() {
            continue;
        }
        for (dc, settings) in &pool.spec.datacenters {
            if let Ok(Some(policy)) = crate::validation::datacenter_growth(dc, settings) {
                let initial = settings.allocation_range.unwrap_or(1).max(1) as u128;
                policies.insert((pool.name_any(), dc.clone()), (policy, initial));
            }
        }
    }
    policies
}

/// The decisions of `cluster` that growth looks at: range allocations it keeps in a pool
/// datacenter with growth. The plan is sorted by (cluster, pool): found by binary search,
/// never by a walk over the whole seed's decisions.
pub(super) fn holdings_of<'p>(
    plan: &'p Plan,
    policies: &HashMap<(String, String), (GrowthPolicy, u128)>,
    cluster: &str,
) -> impl Iterator<Item = &'p crate::planner::Decision> {
    let first = plan
        .decisions
        .partition_point(|d| d.cluster.as_str() < cluster);
    plan.decisions[first..]
        .iter()
        .take_while(move |d| d.cluster == cluster)
        .filter(move |d| {
            d.change == Change::Keep
                && matches!(d.held, Some(Allocation::Range(_)))
                && policies.contains_key(&(d.pool.clone(), d.datacenter.clone()))
        })
}

/// What a growth decision reads besides the plan and its allocators.
pub(super) struct Reads<'a> {
    pub pools: &'a [Arc<IPAMPool>],
    /// The plan's pool inputs (for `reuseAfter`).
    pub inputs: &'a [crate::planner::PoolInput],
    /// A cluster by name.
    pub cluster: &'a dyn Fn(&str) -> Option<Arc<Cluster>>,
    /// What the stored (cluster, pool) object records of its pieces.
    pub recorded: &'a dyn Fn(&str, &str) -> Vec<RecordedPiece>,
}

fn seconds(text: &str) -> Option<i64> {
    text.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

fn rfc3339(at: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(at)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn status_of(p: &growth::Piece) -> PieceStatus {
    PieceStatus {
        addresses: p.range.to_string(),
        kind: p.kind,
        grown_at: p.grown_at.map(rfc3339),
        unused_since: p.unused_since.map(rfc3339),
    }
}

/// Runs the step over `plan` (the whole seed's, whole or patched) and the allocators it left
/// (`states`, which hold everything: growth takes its addresses from them).
pub(super) fn step(
    ctx: &Context,
    plan: &mut Plan,
    states: &mut PoolStates,
    reads: &Reads<'_>,
) -> GrowthDone {
    let mut done = GrowthDone::default();
    if ctx.demand.is_empty() {
        return done;
    }
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let policies = policies(reads.pools);
    if policies.is_empty() {
        return done;
    }
    let demand = ctx.demand.take();
    let mut holdings = Vec::new();
    for (name, seen) in &demand {
        let mut of_cluster = holdings_of(plan, &policies, name).peekable();
        if of_cluster.peek().is_none() {
            continue;
        }
        let Some(cluster) = (reads.cluster)(name) else {
            continue;
        };
        for d in of_cluster {
            let Some(Allocation::Range(held)) = &d.held else {
                continue;
            };
            let Some((policy, pool_initial)) =
                policies.get(&(d.pool.clone(), d.datacenter.clone()))
            else {
                continue;
            };
            let ov = cluster.spec.ipam.get(&d.pool);
            let pinned = ov.is_some_and(|o| !o.addresses.is_empty());
            let initial = ov
                .and_then(|o| o.allocation_range)
                .map(|n| n.max(1) as u128)
                .unwrap_or(*pool_initial);
            let growth_override: Option<GrowthOverride> =
                crate::validation::cluster_growth(&cluster)
                    .get(&d.pool)
                    .copied();
            let recorded = (reads.recorded)(&d.cluster, &d.pool);
            holdings.push(Holding {
                cluster: d.cluster.clone(),
                pool: d.pool.clone(),
                datacenter: d.datacenter.clone(),
                pieces: growth::classify(held, &recorded, pinned),
                initial,
                policy: if pinned {
                    None
                } else {
                    policy.for_cluster(growth_override.as_ref(), initial)
                },
                shrink_after: (!pinned).then_some(policy.shrink_after),
                demand: seen.clone(),
            });
        }
    }
    // Demand handed over but not used (no holding): nothing else needs it.
    drop(demand);
    // A Service MetalLB has not refused starts to count after `PENDING_GRACE`: a decision
    // must come by then, which no watch event asks for.
    for h in &holdings {
        for w in h.demand.waiting.iter().filter(|w| !w.refused) {
            let counts_at = w.since.saturating_add(PENDING_GRACE);
            if counts_at > now {
                let due = Duration::from_secs((counts_at - now) as u64);
                done.next_due = Some(done.next_due.map_or(due, |d| d.min(due)));
            }
        }
    }
    let free = plan
        .usage
        .iter()
        .map(|(k, r)| (k.clone(), r.usage.available.to_u128().unwrap_or(u128::MAX)))
        .collect();
    let input = GrowthInput {
        holdings,
        free,
        pending_grace: PENDING_GRACE,
        now,
    };
    let outcomes = growth::decide(&input);
    // A grown piece given back is quarantined as any released address is (`reuseAfter`).
    let reuse: HashMap<(&str, &str), u64> = reads
        .inputs
        .iter()
        .flat_map(|p| {
            p.datacenters
                .iter()
                .map(move |(dc, d)| ((p.name.as_str(), dc.as_str()), d.reuse_after))
        })
        .collect();
    let reuse_after = |pool: &str, dc: &str| reuse.get(&(pool, dc)).copied().unwrap_or(0);
    let (applied, refused) = growth::apply(plan, states, &outcomes, now, &reuse_after);
    let applied: HashMap<(String, String), &Applied> = applied
        .iter()
        .map(|a| ((a.cluster.clone(), a.pool.clone()), a))
        .collect();
    for (o, why) in &refused {
        tracing::warn!(cluster = %o.cluster, pool = %o.pool, "growth not applied: {why}");
    }
    for (o, h) in outcomes.iter().zip(&input.holdings) {
        let key = (o.cluster.clone(), o.pool.clone());
        let pieces: Vec<PieceStatus> = match applied.get(&key) {
            Some(a) => {
                // A piece given back stays listed until the pool record lets it go: the
                // next pass gives it back again instead of taking the record's copy for a
                // growth whose object write was lost.
                let mut list: Vec<PieceStatus> = a.pieces.iter().map(status_of).collect();
                list.extend(
                    o.pieces
                        .iter()
                        .filter(|p| a.released.contains(&p.range))
                        .map(status_of),
                );
                list
            }
            None => o.pieces.iter().map(status_of).collect(),
        };
        done.pieces.insert(key.clone(), pieces);
        report(&mut done, o);
        if !o.unmet.is_empty() && o.grow == 0 {
            *done
                .unmet
                .entry((o.pool.clone(), o.datacenter.clone()))
                .or_default() += o.unmet.len();
        }
        // When the next grown piece may go; and a pass again in a second for a piece whose
        // last Service let go of it since the last pass (its clock starts then), which no
        // watch event will ask for.
        if let Some(after) = h.shrink_after {
            for p in &o.pieces {
                let in_use = h
                    .demand
                    .used
                    .range(p.range.first()..=p.range.last())
                    .next()
                    .is_some();
                let due = match (p.kind, p.unused_since) {
                    (PieceKind::Grown, Some(since)) => since
                        .saturating_add(after as i64)
                        .saturating_sub(now)
                        .max(1),
                    (PieceKind::Grown, None) if h.demand.known && !in_use => 1,
                    _ => continue,
                };
                let due = Duration::from_secs(due as u64);
                done.next_due = Some(done.next_due.map_or(due, |d| d.min(due)));
            }
        }
    }
    done
}

/// What `status.pieces` of the stored (cluster, pool) object records, found in `stored` (in
/// key order).
pub(super) fn recorded_pieces(
    stored: &[Arc<Entry>],
    cluster: &str,
    pool: &str,
) -> Vec<RecordedPiece> {
    let namespace = cluster_namespace(cluster);
    let Ok(i) = stored.binary_search_by(|o| (o.namespace(), o.name()).cmp(&(&namespace, pool)))
    else {
        return Vec::new();
    };
    pieces_of(&stored[i])
}

/// What `status.pieces` of a stored object records.
pub(super) fn pieces_of(entry: &Entry) -> Vec<RecordedPiece> {
    entry
        .status()
        .map(|s| {
            s.pieces
                .iter()
                .map(|p| RecordedPiece {
                    addresses: p.addresses.clone(),
                    kind: p.kind,
                    grown_at: p.grown_at.as_deref().and_then(seconds),
                    unused_since: p.unused_since.as_deref().and_then(seconds),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn services(list: &[String]) -> String {
    growth::some(list)
}

/// Refusals, as events (growth and shrink are reported when their write lands).
fn report(done: &mut GrowthDone, o: &Outcome) {
    for note in &o.notes {
        let (reason, text) = match note {
            Note::MaxReached { max, services: s } => (
                "GrowthMaxReached",
                format!(
                    "pool {} ({}): at its growth max of {max} addresses; still waiting: {}",
                    o.pool,
                    o.datacenter,
                    services(s)
                ),
            ),
            Note::PoolFull { services: s } => (
                "GrowthPoolFull",
                format!(
                    "pool {} ({}) has no free address to grow by; still waiting: {}",
                    o.pool,
                    o.datacenter,
                    services(s)
                ),
            ),
            _ => continue,
        };
        done.events
            .push((o.cluster.clone(), o.pool.clone(), reason, text));
    }
}

/// Adds to `notes` the refusals that changed since last reported (max reached, pool full, a
/// user cluster whose demand cannot be read), and sets the unmet-demand metric.
pub(super) fn report_refusals(
    ctx: &Context,
    state: &mut super::PassState,
    done: &GrowthDone,
    notes: &mut BTreeMap<String, Vec<super::allocations::ClusterNote>>,
) {
    let mut now_said: BTreeMap<(String, String, &'static str), String> = BTreeMap::new();
    for (cluster, pool, reason, text) in &done.events {
        now_said.insert((cluster.clone(), pool.clone(), *reason), text.clone());
    }
    for (cluster, why) in ctx.demand.problems() {
        now_said.insert(
            (cluster, String::new(), "GrowthDemandUnreadable"),
            format!("demand for growth cannot be read from the user cluster: {why}"),
        );
    }
    for (key, text) in &now_said {
        if state.growth_said.get(key) != Some(text) {
            tracing::info!(cluster = %key.0, reason = key.2, "{text}");
            notes
                .entry(key.0.clone())
                .or_default()
                .push(super::allocations::ClusterNote {
                    warning: true,
                    reason: key.2.to_string(),
                    note: text.clone(),
                });
        }
    }
    state.growth_said = now_said;
    let metrics = &state.metrics;
    metrics.growth_unmet.clear();
    for ((pool, datacenter), n) in &done.unmet {
        metrics
            .growth_unmet
            .get_or_create(&crate::planning::metrics::PoolLabels {
                pool: pool.clone(),
                datacenter: datacenter.clone(),
            })
            .set(*n as i64);
    }
}
