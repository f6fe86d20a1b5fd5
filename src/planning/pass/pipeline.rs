//! Each cluster's writes as a chain of its own, all chains sharing the pass's write slots.
//!
//! A cluster needs, in order: its finalizer and its namespace (at once: neither needs the
//! other), then its `IPAMAllocation`s — which live in the namespace and, where they hand out
//! addresses, wait for the commit of their pool datacenter's record (the fence) — then its
//! status, which reports them. Statuses go last, once every chain of the pass is over: nothing
//! waits for a status, and written among the allocations they would delay them. Before, a pass wrote every cluster's finalizer, then every
//! namespace, then every allocation, then every status: on a real API server, where a write
//! costs a few milliseconds, the first allocation of a 1,000-cluster burst waited for 2,000
//! writes that no allocation needed. Now every cluster moves on as soon as its own
//! predecessors landed, and the record commits run beside the chains.
//!
//! Every write of a pass — finalizer, namespace, allocation, status, whichever chain it
//! belongs to — takes one of the pass's slots (`--write-concurrency`), so the pass keeps that
//! many writes in flight whatever it is writing, and never more.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use tokio::sync::{Semaphore, watch};

use super::*;
use crate::planner::Decision;
use crate::planning::records::RecordKey;
use crate::seed::ledger::Key;
use crate::validation::FieldError;

/// The writes a pass has in flight at once, shared by all of them.
pub(super) struct Slots(Semaphore);

impl Slots {
    pub(super) fn new(width: usize) -> Slots {
        Slots(Semaphore::new(width.max(1)))
    }

    /// Runs one write in a slot, waiting for one first.
    pub(super) async fn run<F: std::future::Future>(&self, write: F) -> F::Output {
        // The semaphore is never closed, so this never fails; a write is never sent without
        // its slot either way.
        let _slot = self.0.acquire().await.ok();
        write.await
    }
}

/// Which pool record commits of this pass have landed, as they land: the chains of the
/// clusters whose allocations they fence wait on it.
#[derive(Debug, Default, Clone)]
struct Commits {
    landed: HashSet<RecordKey>,
    refused: HashSet<RecordKey>,
    /// Every commit of the pass is over; a key in neither set had none to wait for.
    over: bool,
}

/// The record commits' progress, published to the chains.
pub(super) struct Landing(watch::Sender<Commits>);

impl Landing {
    pub(super) fn new() -> Landing {
        Landing(watch::Sender::new(Commits::default()))
    }

    /// The commit of `key` landed in this term: objects it fences may be written.
    pub(super) fn landed(&self, key: RecordKey) {
        self.0.send_modify(|c| {
            c.landed.insert(key);
        });
    }

    /// The commit of `key` did not land: nothing it fences is written by this pass.
    pub(super) fn refused(&self, key: RecordKey) {
        self.0.send_modify(|c| {
            c.refused.insert(key);
        });
    }

    /// Every commit of the pass is over.
    pub(super) fn over(&self) {
        self.0.send_modify(|c| c.over = true);
    }

    /// Waits until each of `keys` has landed or been refused (or every commit is over), and
    /// returns those that landed.
    async fn wait(&self, keys: &BTreeSet<RecordKey>) -> HashSet<RecordKey> {
        let mut rx = self.0.subscribe();
        let ready = |c: &Commits| {
            c.over
                || keys
                    .iter()
                    .all(|k| c.landed.contains(k) || c.refused.contains(k))
        };
        // The sender lives as long as the pass: it is not dropped while a chain waits.
        match rx.wait_for(ready).await {
            Ok(c) => keys
                .iter()
                .filter(|k| c.landed.contains(*k))
                .cloned()
                .collect(),
            Err(_) => HashSet::new(),
        }
    }
}

/// What one cluster's chain is to write.
pub(super) struct Chain {
    pub(super) name: String,
    /// The cluster as the pass read it; `None` for a holder that is gone (its releases only).
    pub(super) cluster: Option<Arc<Cluster>>,
    /// Add kipam's finalizer first.
    pub(super) finalize: bool,
    /// Create the cluster's namespace first.
    pub(super) namespace: bool,
    /// The decisions (indexes into [`Env::decisions`]) whose objects are to be written.
    pub(super) jobs: Vec<usize>,
    /// Check (and write when changed) the cluster's status at the end.
    pub(super) status: bool,
}

impl Chain {
    pub(super) fn of(name: String, cluster: Option<Arc<Cluster>>) -> Chain {
        Chain {
            name,
            cluster,
            finalize: false,
            namespace: false,
            jobs: Vec::new(),
            status: false,
        }
    }

    pub(super) fn has_work(&self) -> bool {
        self.finalize || self.namespace || self.status || !self.jobs.is_empty()
    }
}

/// What every chain of a pass shares.
pub(super) struct Env<'a> {
    pub(super) ctx: &'a Arc<Context>,
    pub(super) term: u64,
    pub(super) metrics: &'a Metrics,
    pub(super) slots: &'a Slots,
    pub(super) landing: &'a Landing,
    pub(super) decisions: &'a [Decision],
    /// Every decision of each holder (indexes into `decisions`): what its status reports.
    pub(super) of_holder: &'a HashMap<&'a str, Vec<usize>>,
    /// The write a decision asks for, built when the chain gets to it.
    pub(super) build: &'a (dyn Fn(&Decision) -> Option<AllocationWrite> + Sync),
    pub(super) errors: &'a HashMap<String, Vec<FieldError>>,
    /// What the demand reader says of each cluster (read once per pass).
    pub(super) demand: &'a BTreeMap<String, Option<String>>,
    /// The adoption plan: what each adopting cluster's status reports.
    pub(super) adoption: &'a crate::planner::adopt::AdoptionPlan,
    pub(super) now: &'a str,
}

/// What the chains of a pass left to report and retry.
#[derive(Default)]
pub(super) struct Done {
    pub(super) outcome: PassOutcome,
    pub(super) retry_pools: BTreeSet<String>,
    /// Clusters whose status write did not land.
    pub(super) retry_clusters: BTreeSet<String>,
    /// Allocations found stale (conflict, gone): re-read once every chain is over.
    pub(super) stale: Vec<Key>,
    pub(super) notes: BTreeMap<String, Vec<allocations::ClusterNote>>,
    pub(super) failures: HashMap<String, Vec<String>>,
    /// Statuses the chains left for the end of the pass.
    statuses: Vec<StatusJob>,
}

impl Done {
    fn merge(&mut self, other: Done) {
        self.outcome.writes += other.outcome.writes;
        self.outcome.again |= other.outcome.again;
        self.retry_pools.extend(other.retry_pools);
        self.retry_clusters.extend(other.retry_clusters);
        self.stale.extend(other.stale);
        for (k, v) in other.notes {
            self.notes.entry(k).or_default().extend(v);
        }
        for (k, v) in other.failures {
            self.failures.entry(k).or_default().extend(v);
        }
        self.statuses.extend(other.statuses);
    }
}

/// Runs the chains, `width` of them at once (their writes share `env.slots`), in the order
/// given, each result taken as it comes; then the statuses they left. A status reports and
/// nothing waits for it: written after every allocation of the pass, it never delays one.
pub(super) async fn run(env: &Env<'_>, chains: Vec<Chain>, width: usize) -> Done {
    let mut done = Done::default();
    let mut results = futures::stream::iter(chains)
        .map(|c| run_one(env, c))
        .buffer_unordered(width.max(1));
    while let Some(one) = results.next().await {
        done.merge(one);
    }
    drop(results);
    let jobs = std::mem::take(&mut done.statuses);
    let failures = std::mem::take(&mut done.failures);
    let mut results = futures::stream::iter(jobs)
        .map(|job| {
            let failed = failures.get(job.cluster.metadata.name.as_deref().unwrap_or_default());
            write_status(env, job, failed)
        })
        .buffer_unordered(width.max(1));
    let mut written = Done::default();
    while let Some(one) = results.next().await {
        written.merge(one);
    }
    drop(results);
    done.merge(written);
    done.failures = failures;
    done
}

/// One cluster's writes: finalizer and namespace, then allocations, then status.
async fn run_one(env: &Env<'_>, chain: Chain) -> Done {
    let ctx = env.ctx;
    let mut done = Done::default();
    let cluster = chain.cluster.as_deref();

    // 1. The finalizer and the namespace, at once.
    let finalizer = async {
        let c = cluster.filter(|_| chain.finalize)?;
        Some(
            env.slots
                .run(lifecycle::add_cluster_finalizer(ctx, c))
                .await,
        )
    };
    let namespace = async {
        let c = cluster.filter(|_| chain.namespace)?;
        Some(env.slots.run(lifecycle::create_namespace(ctx, c)).await)
    };
    let (finalizer, namespace) = tokio::join!(finalizer, namespace);
    let mut read_at = cluster.and_then(|c| c.resource_version());
    // The copy the status is built on: the cached one, or the one the finalizer patch read
    // again after a conflict.
    let mut status_copy = chain.cluster.clone();
    match finalizer {
        Some(Ok(f)) => {
            done.outcome.writes += f.writes;
            if f.gone {
                status_copy = None;
            }
            if f.version.is_some() {
                read_at = f.version;
            }
            if let Some(fresh) = f.fresh {
                status_copy = Some(fresh);
            }
        }
        Some(Err(e)) if is_conflict(&e) => done.outcome.again = true,
        Some(Err(e)) => {
            write_failed(ctx, "finalizer", "", "patch", &e);
            done.outcome.again = true;
        }
        None => {}
    }
    match namespace {
        Some(Ok(created)) => done.outcome.writes += created as u64,
        Some(Err(e)) => {
            write_failed(ctx, "Namespace", "", "create", &e);
            done.outcome.again = true;
        }
        None => {}
    }

    // 2. The allocations, once the record commits covering them are over: those handing out
    // addresses only where their commit landed in this term (the fence).
    if !chain.jobs.is_empty() {
        let keys: BTreeSet<RecordKey> = chain
            .jobs
            .iter()
            .map(|&i| {
                let d = &env.decisions[i];
                (d.pool.clone(), d.datacenter.clone())
            })
            .collect();
        let landed = &env.landing.wait(&keys).await;
        // Each object is built in its write slot, not before: every chain of a burst waits
        // above at once, and building their objects first held all of them together.
        let results = futures::future::join_all(chain.jobs.iter().map(|&i| {
            env.slots.run(async move {
                let job = (env.build)(&env.decisions[i])?;
                let d = &job.decision;
                let fenced = job.desired.is_some() && !job.is_status_only();
                if fenced && !landed.contains(&(d.pool.clone(), d.datacenter.clone())) {
                    return Some(Err(d.pool.clone()));
                }
                if !due(ctx, "IPAMAllocation", &job.name()) {
                    return Some(Err(d.pool.clone()));
                }
                // Boxed: the request's state (a few KiB) exists only once its slot is taken,
                // not in each of a burst's waiting futures.
                Some(Ok(
                    Box::pin(write_one(ctx, env.metrics, env.term, job)).await
                ))
            })
        }))
        .await;
        for result in results.into_iter().flatten() {
            match result {
                Ok((job, result)) => allocation_result(ctx, job, result, &mut done),
                // Held back (its commit did not land in this term, or a backoff): next pass.
                Err(pool) => {
                    done.outcome.again = true;
                    done.retry_pools.insert(pool);
                }
            }
        }
    }

    // 3. The status: once every chain of the pass is over (see `run`).
    if let Some(c) = status_copy
        .as_ref()
        .filter(|_| chain.status || done.failures.contains_key(&chain.name))
    {
        done.statuses.push(StatusJob {
            cluster: c.clone(),
            read_at,
        });
    }
    done
}

/// A cluster status to check, and write when it changed.
pub(super) struct StatusJob {
    cluster: Arc<Cluster>,
    /// The `resourceVersion` its conditions were read at (or its finalizer patch left).
    read_at: Option<String>,
}

/// How often a cluster status that meets a conflict is read again and written over what
/// changed, before the cluster is left to the next pass.
const STATUS_ATTEMPTS: usize = 3;

/// One cluster's status, built when its write starts (a burst writes the status of every
/// cluster: building them all first would hold every one at once).
///
/// The patch carries the `resourceVersion` the conditions were read at: the applier writes
/// `AddonsReady` into the same list, and a patch from an older copy would put its old value
/// back. When that precondition fails because somebody else wrote the cluster since (most
/// often the applier, just after this pass changed what the cluster holds), the cluster is
/// read again and the status built on it and written again, a few times: what the status
/// reports (this pass's decisions) did not change. Leaving it to the next pass instead asked
/// for planning again, and a growth pass's conflicts made the next pass plan the seed while
/// refusals and new clusters waited. Only a cluster whose spec changed since (its
/// `generation`), that was created again (its uid), or that keeps conflicting, is left to the
/// next pass, which plans it again.
async fn write_status(env: &Env<'_>, job: StatusJob, failed: Option<&Vec<String>>) -> Done {
    let ctx = env.ctx;
    let mut done = Done::default();
    let name = job.cluster.name_any();
    let mine: Vec<&Decision> = env
        .of_holder
        .get(name.as_str())
        .into_iter()
        .flatten()
        .map(|&i| &env.decisions[i])
        .collect();
    let mut cluster = job.cluster;
    let mut read_at = job.read_at;
    for attempt in 0..STATUS_ATTEMPTS {
        let Some(next) = statuses::next_cluster_status(
            &cluster,
            &mine,
            env.errors.get(&name),
            failed,
            env.demand,
            env.adoption.get(&name),
            env.now,
        ) else {
            return done;
        };
        if attempt == 0 && !due(ctx, "Cluster", &name) {
            done.outcome.again = true;
            done.retry_clusters.insert(name);
            return done;
        }
        let r = env
            .slots
            .run(statuses::patch_cluster_status(
                ctx,
                &name,
                read_at.take(),
                next,
            ))
            .await;
        match r {
            Ok(()) => {
                done.outcome.writes += 1;
                write_succeeded(ctx, "Cluster", &name);
                return done;
            }
            Err(e) if is_conflict(&e) => {
                let (uid, generation) = (cluster.uid(), cluster.metadata.generation);
                match env.slots.run(lifecycle::read_cluster(ctx, &name)).await {
                    Ok(Some(fresh))
                        if fresh.uid() == uid && fresh.metadata.generation == generation =>
                    {
                        tracing::debug!(cluster = %name, "cluster changed under its status update; writing it again on what changed");
                        read_at = fresh.resource_version();
                        cluster = Arc::new(fresh);
                    }
                    // Gone: nothing to report.
                    Ok(None) => return done,
                    Ok(Some(_)) => {
                        tracing::debug!(cluster = %name, "cluster spec changed (or the cluster was created again) under its status update; planning again");
                        break;
                    }
                    Err(e) => {
                        write_failed(ctx, "Cluster", &name, "get", &e);
                        break;
                    }
                }
            }
            Err(e) => {
                write_failed(ctx, "Cluster", &name, "patch status of", &e);
                break;
            }
        }
    }
    done.outcome.again = true;
    done.retry_clusters.insert(name);
    done
}

/// Takes one allocation write's result: the backoff, the events, what to retry.
fn allocation_result(
    ctx: &Context,
    job: Finished,
    result: Result<allocations::WriteDone, kube::Error>,
    done: &mut Done,
) {
    match result {
        Ok(written) => {
            done.outcome.writes += written.writes;
            write_succeeded(ctx, "IPAMAllocation", &job.name);
            if job.gives_up {
                // A release, a move to another datacenter, a pin changed or a piece given
                // back: the record still holds what the object showed (it covers the
                // objects), so the next pass trims it now that no object shows it, which
                // frees it (see `commit`): at once, a holder may wait. Nothing else asks for
                // that pass: the watch takes this write as our own echo. (An object kept by
                // somebody else's finalizer is still a holder then; its deletion's watch
                // event wakes the planner.)
                done.retry_pools.insert(job.pool.clone());
                done.outcome.again = true;
                ctx.dirty.wake();
            }
            if let Some(note) = job.note {
                done.notes
                    .entry(job.cluster.clone())
                    .or_default()
                    .push(note);
            }
        }
        Err(e) if is_conflict(&e) || is_not_found(&e) => {
            tracing::info!(cluster = %job.cluster, pool = %job.pool, datacenter = %job.datacenter, error = %crate::seed::preconditions::short(&e), "stale view of an allocation; re-reading");
            ctx.metrics
                .write_failed("IPAMAllocation", preconditions::reason(&e));
            done.stale.push(job.key);
            done.retry_pools.insert(job.pool.clone());
            done.outcome.again = true;
        }
        Err(e) => {
            let message = write_failed(ctx, "IPAMAllocation", &job.name, job.verb, &e);
            done.retry_pools.insert(job.pool.clone());
            done.outcome.again = true;
            let note = format!("IPAMAllocation {}: {message}", job.name);
            done.notes
                .entry(job.cluster.clone())
                .or_default()
                .push(allocations::ClusterNote {
                    warning: true,
                    reason: "WriteFailed".into(),
                    note: note.clone(),
                });
            done.failures
                .entry(job.cluster.clone())
                .or_default()
                .push(note);
        }
    }
}

/// Every decision's index, by holder.
pub(super) fn by_holder(decisions: &[Decision]) -> HashMap<&str, Vec<usize>> {
    let mut out: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, d) in decisions.iter().enumerate() {
        out.entry(d.cluster.as_str()).or_default().push(i);
    }
    out
}
