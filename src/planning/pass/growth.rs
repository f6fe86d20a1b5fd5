//! Step "growth": demand-driven growth and shrink, applied to the plan before the fence.
//!
//! The decision is the pure [`planner::growth::decide`]; this step gathers its input — the
//! plan's kept range allocations of pool datacenters with `growth`, what their objects record
//! of their pieces (`status.pieces`), the demand the reader saw ([`crate::seed::demand`]) —
//! and applies the outcome to the plan and its allocators ([`planner::growth::apply`]). The
//! changed decisions then go through the same record commit and object writes as every
//! other: nothing here writes.
//!
//! While any user cluster's demand is read, every pass plans the whole seed: a growth must be
//! taken from allocators that hold everything (see [`needs_full_plan`]).

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

/// Growth needs a plan of everything in this pass.
pub(super) fn needs_full_plan(ctx: &Context) -> bool {
    !ctx.demand.is_empty()
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

/// Runs the step over `plan` (a plan of the whole seed) and its allocators.
pub(super) fn step(
    ctx: &Context,
    plan: &mut Plan,
    states: &mut PoolStates,
    pools: &[Arc<IPAMPool>],
    inputs: &[crate::planner::PoolInput],
    clusters: &[Arc<Cluster>],
    stored: &[Arc<Entry>],
) -> GrowthDone {
    let mut done = GrowthDone::default();
    if ctx.demand.is_empty() {
        return done;
    }
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    // (pool, dc) -> (policy, allocationRange).
    let mut policies: HashMap<(String, String), (GrowthPolicy, u128)> = HashMap::new();
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
    if policies.is_empty() {
        return done;
    }
    let by_name: HashMap<String, &Cluster> = clusters
        .iter()
        .map(|c| (c.name_any(), c.as_ref()))
        .collect();
    let mut demand = ctx.demand.take();
    let mut holdings = Vec::new();
    for d in &plan.decisions {
        if d.change != Change::Keep {
            continue;
        }
        let Some(Allocation::Range(held)) = &d.held else {
            continue;
        };
        let Some((policy, pool_initial)) = policies.get(&(d.pool.clone(), d.datacenter.clone()))
        else {
            continue;
        };
        let Some(cluster) = by_name.get(&d.cluster) else {
            continue;
        };
        let Some(seen) = demand.get(&d.cluster) else {
            continue;
        };
        let ov = cluster.spec.ipam.get(&d.pool);
        let pinned = ov.is_some_and(|o| !o.addresses.is_empty());
        let initial = ov
            .and_then(|o| o.allocation_range)
            .map(|n| n.max(1) as u128)
            .unwrap_or(*pool_initial);
        let growth_override: Option<GrowthOverride> = crate::validation::cluster_growth(cluster)
            .get(&d.pool)
            .copied();
        let recorded = recorded_pieces(stored, &d.cluster, &d.pool);
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
    // Demand handed over but not used (no holding): nothing else needs it.
    demand.clear();
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
    let reuse: HashMap<(&str, &str), u64> = inputs
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

/// What `status.pieces` of the stored (cluster, pool) object records.
fn recorded_pieces(stored: &[Arc<Entry>], cluster: &str, pool: &str) -> Vec<RecordedPiece> {
    let namespace = cluster_namespace(cluster);
    let Ok(i) = stored.binary_search_by(|o| (o.namespace(), o.name()).cmp(&(&namespace, pool)))
    else {
        return Vec::new();
    };
    stored[i]
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
