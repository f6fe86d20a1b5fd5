//! The planning loop: an adapter over the seed's core that, on the leader only, plans the
//! whole seed from the caches and the ledger and writes the differences.
//!
//! Any change wakes the loop, which runs a [`pass`]; the pass commits the pool [`records`]
//! (the fence) before it writes any `IPAMAllocation`. See `docs/design.md` for why no
//! address can be handed out twice.

pub mod metrics;
pub mod pass;
pub mod records;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::ListParams;
use tokio::sync::Notify;

use crate::resources::{IPAMAllocation, IPAMPoolRecord};
use crate::seed::{Context, backoff, preconditions};

/// Runs the planning loop until it is aborted: waits for the caches, then plans whenever the
/// watches wake it (or every `resync`) while this replica leads.
pub async fn run(ctx: Arc<Context>, wake: Arc<Notify>, resync: Duration, write_concurrency: usize) {
    let metrics = metrics::Metrics::new(&ctx.metrics);
    planning_loop(
        ctx,
        wake,
        resync,
        pass::PassState::new(write_concurrency, metrics),
    )
    .await
}

/// How long the planning loop waits after a wake-up before planning.
const DEBOUNCE: Duration = Duration::from_millis(10);

/// Waits for changes (or the resync period) and runs a pass while leader.
/// A pass at least this long built and dropped large temporary structures (a whole-seed plan
/// takes seconds at 100,000 allocations); afterwards the free memory is handed back.
const TRIM_AFTER: Duration = Duration::from_millis(250);

/// Hands the allocator's free pages back to the system. glibc keeps memory freed in the middle
/// of its heaps: after a pass that planned the whole seed, that is tens of MiB of resident
/// memory no object uses, and the next pass's peak stacks on top of it. Costs a few
/// milliseconds after a pass that took far longer; nothing on other C libraries.
fn give_back_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory; it is safe to call at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

async fn planning_loop(
    ctx: Arc<Context>,
    wake: Arc<Notify>,
    resync: Duration,
    mut state: pass::PassState,
) {
    // Caches first: a pass on a partial view would release what it cannot see. This is the
    // one task that waits on these stores (a second waiter would take the wake-up from this
    // one); the others wait for `caches_listed`.
    let _ = tokio::join!(
        ctx.pools.wait_until_ready(),
        ctx.clusters.wait_until_ready(),
        ctx.namespaces.wait_until_ready(),
    );
    ctx.caches_listed.send_replace(true);
    ctx.metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut leadership = ctx.leader.subscribe();
    // The leadership term the ledger and records were rebuilt in.
    let mut built_for: Option<u64> = None;
    let mut failures: u32 = 0;
    let mut last_problem: Option<String> = None;
    let mut last_full: Option<Instant> = None;
    loop {
        let holds = ctx.leader.holds();
        state.metrics.set_leader(holds);
        if !holds {
            built_for = None;
            tokio::select! {
                _ = leadership.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            continue;
        }
        let term = ctx.leader.term();
        if built_for != Some(term) {
            // Every gain of leadership starts from a fresh quorum list: what any earlier
            // leader committed is all there.
            match rebuild(&ctx).await {
                Ok(()) => {
                    built_for = Some(term);
                    state.replan_all();
                    failures = 0;
                    last_problem = None;
                    tracing::info!(
                        term,
                        "leading: allocations and pool records rebuilt from a fresh list"
                    );
                }
                Err(message) => {
                    failures += 1;
                    if last_problem.as_deref() != Some(message.as_str()) {
                        tracing::error!("{message} (retrying with backoff)");
                        last_problem = Some(message.clone());
                    }
                    ctx.metrics.set_not_ready(Some(message));
                    tokio::time::sleep(backoff::delay(failures)).await;
                    continue;
                }
            }
        }
        let started = Instant::now();
        if last_full.is_none_or(|t| t.elapsed() >= resync) {
            // The periodic resync: plan and check the whole seed, whatever changed.
            state.replan_all();
            last_full = Some(started);
        }
        state.metrics.passes.inc();
        let guard = ctx.pass_lock.lock().await;
        forget_deleted_shards(&ctx, &mut state).await;
        // The shards the watch has caught up with are kept once, not twice (again after the
        // pass, for the shards it wrote).
        ctx.records.lock().await.share(&ctx.record_view.store);
        let result = pass::run(&ctx, term, &mut state).await;
        ctx.records.lock().await.share(&ctx.record_view.store);
        drop(guard);
        if started.elapsed() >= TRIM_AFTER {
            give_back_free_memory();
        }
        let wait = match result {
            Ok(outcome) => {
                failures = 0;
                tracing::debug!(writes = outcome.writes, again = outcome.again, "pass done");
                let wait = match (outcome.again, outcome.retry_after) {
                    (true, Some(after)) => after.max(Duration::from_millis(200)),
                    (true, None) => Duration::from_millis(200),
                    (false, Some(after)) => after.min(resync),
                    (false, None) => resync,
                };
                outcome.status_after.map_or(wait, |s| wait.min(s))
            }
            Err(e) => {
                failures += 1;
                state.replan_all();
                state.metrics.pass_failures.inc();
                tracing::warn!(error = %e, "pass failed (retrying with backoff)");
                backoff::delay(failures)
            }
        };
        state.metrics.pass_finished(started.elapsed());
        tokio::select! {
            _ = wake.notified(), if failures == 0 => {
                // Let the events of one change (or of a burst being written) arrive together.
                // Short: changes that arrive while a pass runs are batched into the next one
                // anyway, and a new cluster should not wait.
                tokio::time::sleep(DEBOUNCE).await;
            }
            _ = tokio::time::sleep(wait) => {}
            _ = leadership.changed() => {}
        }
    }
}

/// Takes the shards the record watch saw deleted out of the leader's copy (those it holds
/// under the same uid: a shard this replica created again since stays), and has their pools
/// planned and committed again. The copy is otherwise kept from this replica's own writes, so
/// without this a shard the garbage collector took (its pool deleted, and created again by
/// the same name) would stay in the copy for the whole term: the commit would find its
/// entries already there and write nothing, and the holders would show addresses that no
/// record holds.
async fn forget_deleted_shards(ctx: &Context, state: &mut pass::PassState) {
    let deleted = ctx.record_view.take_deleted();
    if deleted.is_empty() {
        return;
    }
    let mut records = ctx.records.lock().await;
    for (name, uid) in deleted {
        let Some(key) = records.key_holding(&name, &uid) else {
            continue;
        };
        tracing::info!(record = %name, pool = %key.0, datacenter = %key.1, "pool record shard deleted by somebody else; committing its pool again");
        records.forget(&key, &name);
        // A commit planned on the copy before this is refused.
        records.reread(&key);
        state.recheck_pool(key.0);
    }
}

/// Rebuilds the ledger and the pool records from fresh lists.
// RBAC: src/rbac.rs (list of allocations and pool records).
async fn rebuild(ctx: &Context) -> Result<(), String> {
    let allocations: Api<IPAMAllocation> = Api::all(ctx.writer.clone());
    let list = allocations
        .list(&ListParams::default())
        .await
        .map_err(|e| preconditions::explain(&e, "list", "ipamallocations.ipam.kipam.dev", ""))?;
    let records: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    let record_list = records
        .list(&ListParams::default())
        .await
        .map_err(|e| preconditions::explain(&e, "list", "ipampoolrecords.ipam.kipam.dev", ""))?;
    ctx.ledger.lock().await.reset(list.items);
    ctx.ledger_updates.send_replace(true);
    ctx.records.lock().await.reset(record_list.items);
    ctx.metrics.set_not_ready(None);
    Ok(())
}
