//! The compare-and-swap that commits the pool records (the fence), kept in the seed's
//! [`Records`].
//!
//! The record of a pool datacenter is kept in shards, one object per block of the pool's
//! addresses ([`crate::reservations::shards`]); a commit writes only the shards whose entries
//! change. Loaded from a fresh (quorum) LIST at every gain of leadership, then kept from this
//! replica's own writes. Every write carries the `resourceVersion` of the shard it was planned
//! from, so the API server refuses it (409) when anybody wrote the shard since — in particular
//! a newer leader. Before objects are written for clusters whose shards do not change, those
//! shards still get a write that changes nothing: a write with a stale `resourceVersion` fails
//! before the server compares contents, so it doubles as a check that this replica still
//! writes on the latest shard.
//!
//! A write to an existing shard is a JSON merge patch (RFC 7386) holding only the entries that
//! change and `metadata.resourceVersion`, which the API server treats as a precondition
//! exactly like the `resourceVersion` of a full update. The server answers with the shard's
//! metadata only; the copy here then gets the same entries changed and the new metadata. This
//! is exact because the patch applied to the version this copy holds: the server's shard at
//! that version is this copy, so the patched shard is this copy with the patch applied.
//!
//! A commit adds before it removes: the shards that gain or change entries are written first,
//! and only once all of them landed are entries removed from the others (a holding that moves
//! between shards, or out of a record written before sharding), so at no moment does a
//! holding leave every record.
//!
//! The division into blocks is the one the pool datacenter's *layout record* fixes
//! (`<pool>.<datacenter>.layout`, `spec.blockLength`), created before its first shard: every
//! replica divides alike whatever version of the pool it reads. Every shard write stamps
//! `spec.poolsSeen`, the newest pool version its plan read ([`PlannedOn`]); a replica refuses to
//! write a shard stamped above its own plan's (its view of the pools is older), so an edit of
//! the pools seen by one replica and not the other cannot let the latter commit past the
//! former. See `docs/design.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::Status;
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};

use crate::address::Cidr;
use crate::reservations::shards::{self, Layout};
use crate::resources::{
    IPAMPool, IPAMPoolRecord, IPAMPoolRecordSpec, MAX_RECORD_BYTES, RECORD_FORMAT, Reservation,
};
use crate::seed::Context;
pub use crate::seed::records::{Changes, RecordKey};
use crate::seed::records::{Held, Patched, Records, entry_size, json_size, key_of, record_size};

/// Shard writes of one commit in flight at once.
const SHARD_CONCURRENCY: usize = 8;

/// What a commit asks of a pool datacenter's record.
enum Target {
    /// Exactly these entries, and a check of the shards of the `check` clusters.
    Whole {
        desired: BTreeMap<String, Reservation>,
        check: BTreeSet<String>,
    },
    /// These entries changed (`None`: removed), all others as they are.
    Changes(Changes),
}

/// The writes that bring the shards of `key` to `target` under `layout`, in the order
/// they must land: first every shard that gains or changes an entry or is checked, then
/// those that only lose entries.
fn plan(
    records: &Records,
    pool: &IPAMPool,
    key: &RecordKey,
    layout: &Layout,
    target: Target,
    seen: i64,
) -> Result<[Vec<Write>; 2], CommitError> {
    let held = records.map.get(key);
    let no_shards = BTreeMap::new();
    let held = held.unwrap_or(&no_shards);
    let split = |cluster: &str, r: &Reservation| {
        layout.split(r).map_err(|why| {
            CommitError::Unsplittable(format!(
                "pool record of {}/{}: the entry of cluster {cluster}: {why}",
                key.0, key.1
            ))
        })
    };
    // Cluster -> shard name -> (block, part), for every cluster the commit is about.
    let mut parts: BTreeMap<String, BTreeMap<String, (Cidr, Reservation)>> = BTreeMap::new();
    let (whole, check) = match target {
        Target::Whole { desired, check } => {
            for (cluster, r) in desired {
                let named = split(&cluster, &r)?
                    .into_iter()
                    .map(|(b, p)| (shards::shard_name(&key.0, &key.1, &b), (b, p)))
                    .collect();
                parts.insert(cluster, named);
            }
            (true, check)
        }
        Target::Changes(changes) => {
            for (cluster, r) in changes {
                let named = match r {
                    Some(r) => split(&cluster, &r)?
                        .into_iter()
                        .map(|(b, p)| (shards::shard_name(&key.0, &key.1, &b), (b, p)))
                        .collect(),
                    None => BTreeMap::new(),
                };
                parts.insert(cluster, named);
            }
            (false, BTreeSet::new())
        }
    };
    // Shard name -> (block, changes).
    let mut changes: BTreeMap<String, (Option<Cidr>, Changes)> = BTreeMap::new();
    let mut compare = |name: &str, h: &Held, cluster: &str, old: &Reservation| {
        let new = parts.get(cluster).and_then(|p| p.get(name)).map(|(_, r)| r);
        if new != Some(old) {
            changes
                .entry(name.to_string())
                .or_insert_with(|| (h.block, Changes::new()))
                .1
                .insert(cluster.to_string(), new.cloned());
        }
    };
    for (name, h) in held {
        if whole {
            for (cluster, old) in &h.record.spec.reservations {
                compare(name, h, cluster, old);
            }
        } else {
            for cluster in parts.keys() {
                if let Some(old) = h.record.spec.reservations.get(cluster) {
                    compare(name, h, cluster, old);
                }
            }
        }
    }
    for (cluster, named) in &parts {
        for (name, (block, part)) in named {
            let present = held
                .get(name)
                .is_some_and(|h| h.record.spec.reservations.contains_key(cluster));
            if !present {
                changes
                    .entry(name.clone())
                    .or_insert_with(|| (Some(*block), Changes::new()))
                    .1
                    .insert(cluster.clone(), Some(part.clone()));
            }
        }
    }
    // The shards of clusters about to get objects written, checked even if unchanged.
    for cluster in &check {
        for (name, (block, _)) in parts.get(cluster).into_iter().flatten() {
            changes
                .entry(name.clone())
                .or_insert_with(|| (Some(*block), Changes::new()));
        }
    }
    let mut phases: [Vec<Write>; 2] = [Vec::new(), Vec::new()];
    for (name, (block, changes)) in changes {
        let shard = held.get(&name);
        let removes_only = !changes.is_empty() && changes.values().all(Option::is_none);
        let on_layout = block.is_some_and(|b| shards::shard_name(&key.0, &key.1, &b) == name);
        let write = match shard {
            Some(h)
                if removes_only
                    && !on_layout
                    && changes.len() == h.record.spec.reservations.len() =>
            {
                // A shard of another division (or written before sharding) left empty:
                // deleted, on the same precondition.
                behind(h, &name, seen)?;
                Write::Delete {
                    name,
                    preconditions: Preconditions {
                        resource_version: h.record.resource_version(),
                        uid: h.record.uid(),
                    },
                }
            }
            _ => prepare(shard, pool, key, &name, block, changes, seen)?,
        };
        phases[usize::from(removes_only)].push(write);
    }
    Ok(phases)
}

/// Why a commit did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("record {0} would exceed {MAX_RECORD_BYTES} bytes: no new allocation fits in it")]
    TooLarge(String),
    /// The pool datacenter's settings give no division into blocks.
    #[error("pool record of {0}: {1}")]
    Layout(String, String),
    /// An entry cannot be divided into blocks.
    #[error("{0}")]
    Unsplittable(String),
    /// A shard was last written by a replica that had seen newer pools than the plan of this
    /// commit: planned again once this replica's view of the pools has caught up.
    #[error(
        "pool record {shard}: written by a replica that had seen the pools at revision {stamp}; this plan saw them at {seen}, so it waits for the pools to catch up"
    )]
    PoolsBehind {
        shard: String,
        stamp: i64,
        seen: u64,
    },
    /// A record of the pool datacenter was written in a newer record format than this
    /// kipam knows (a newer release is rolling out): nothing is committed there.
    #[error(
        "pool record {shard} was written in record format {format} by a newer kipam; this replica knows format {RECORD_FORMAT} and commits nothing into it until the upgrade is finished"
    )]
    NewerFormat { shard: String, format: i32 },
    #[error(transparent)]
    Api(#[from] kube::Error),
}

impl CommitError {
    /// The metric reason of an error found before anything was sent.
    pub fn reason(&self) -> &'static str {
        match self {
            CommitError::TooLarge(_) => "TooLarge",
            CommitError::Layout(..) => "InvalidPool",
            CommitError::Unsplittable(_) => "Unsplittable",
            CommitError::PoolsBehind { .. } => "PoolsBehind",
            CommitError::NewerFormat { .. } => "NewerFormat",
            CommitError::Api(_) => "Api",
        }
    }

    /// Somebody else wrote or deleted a shard since this replica read it.
    pub fn is_stale(&self) -> bool {
        matches!(self, CommitError::Api(kube::Error::Api(s)) if s.code == 409 || s.code == 404)
    }
}

/// The division into blocks of `key`'s datacenter of `pool`.
fn layout(pool: &IPAMPool, key: &RecordKey) -> Result<Layout, CommitError> {
    let label = format!("{}/{}", key.0, key.1);
    let dc = pool.spec.datacenters.get(&key.1).ok_or_else(|| {
        CommitError::Layout(label.clone(), "the pool has no such datacenter".into())
    })?;
    Layout::of(dc).map_err(|why| CommitError::Layout(label, why))
}

/// What a commit was planned on, as far as the fence needs to know: the `IPAMPool`s the plan
/// read, and how many shards this replica had read again (after conflicts) by then.
#[derive(Clone, Debug, Default)]
pub struct PlannedOn {
    /// The highest `resourceVersion` among the pools the plan read: the plan's view of the
    /// pools includes every change of the pools up to that revision (a watch cache is the
    /// state at one revision, at or past each object it holds). Stamped on every shard
    /// written (`spec.poolsSeen`).
    pools_seen: u64,
    /// The pools the plan read, as (name, `resourceVersion`), sorted: compared with a fresh
    /// list when a shard says another replica saw newer pools.
    pools: Vec<(String, String)>,
    /// The revision of a fresh list of the pools that showed exactly `pools`, once one did
    /// (the plan's view is then the pools as they stand at that revision).
    confirmed: Arc<tokio::sync::OnceCell<Option<u64>>>,
    /// [`Records::rereads`] when the plan read the records (`None`: not checked).
    rereads: Option<u64>,
}

impl PlannedOn {
    /// A plan made on `pools` (the pool cache as the plan read it).
    pub fn pools<'a>(pools: impl IntoIterator<Item = &'a IPAMPool>) -> PlannedOn {
        let mut list: Vec<(String, String)> = pools
            .into_iter()
            .map(|p| {
                (
                    p.name_any(),
                    p.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        list.sort();
        PlannedOn {
            pools_seen: list
                .iter()
                .filter_map(|(_, v)| v.parse::<u64>().ok())
                .max()
                .unwrap_or(0),
            pools: list,
            confirmed: Default::default(),
            rereads: None,
        }
    }

    /// The plan read the records when [`Records::rereads`] was `mark`: a commit refuses a
    /// pool datacenter one of whose shards was read again since (the plan did not see what
    /// the re-read brought).
    pub fn with_rereads(mut self, mark: u64) -> PlannedOn {
        self.rereads = Some(mark);
        self
    }

    /// The revision up to which the plan's view of the pools is known complete.
    pub fn pools_seen(&self) -> u64 {
        let confirmed = self.confirmed.get().copied().flatten().unwrap_or(0);
        self.pools_seen.max(confirmed)
    }

    /// The revision to stamp, when it is at least `stamp` (the highest stamp of the shards
    /// about to be written); else one fresh list of the pools (once per plan) may show that
    /// the plan's view is current at a later revision.
    async fn cover(&self, ctx: &Context, stamp: i64, shard: &str) -> Result<u64, CommitError> {
        let needed = u64::try_from(stamp).unwrap_or(0);
        if self.pools_seen() >= needed {
            return Ok(self.pools_seen());
        }
        let confirmed = self
            .confirmed
            .get_or_init(|| async {
                // The same pools as a list showed before (a pool deleted keeps the versions
                // held below a stamp until the pools change): no need to list them again.
                if let Some((pools, revision)) = &ctx.records.lock().await.pools_listed
                    && *pools == self.pools
                    && *revision >= needed
                {
                    return Some(*revision);
                }
                // RBAC: src/rbac.rs (list of pools). A list without a resourceVersion is
                // served from etcd (quorum), and its own version is the current revision.
                let api: Api<IPAMPool> = Api::all(ctx.writer.clone());
                let list = api.list(&kube::api::ListParams::default()).await.ok()?;
                let mut now: Vec<(String, String)> = list
                    .items
                    .iter()
                    .map(|p| {
                        (
                            p.name_any(),
                            p.metadata.resource_version.clone().unwrap_or_default(),
                        )
                    })
                    .collect();
                now.sort();
                if now != self.pools {
                    return None;
                }
                let revision = list.metadata.resource_version?.parse::<u64>().ok()?;
                ctx.records.lock().await.pools_listed = Some((now, revision));
                Some(revision)
            })
            .await;
        if self.pools_seen() >= needed {
            return Ok(self.pools_seen());
        }
        tracing::debug!(shard, stamp, seen = self.pools_seen(), confirmed = ?confirmed, "pools behind a shard's stamp");
        Err(CommitError::PoolsBehind {
            shard: shard.to_string(),
            stamp,
            seen: self.pools_seen(),
        })
    }

    /// `Err` (a conflict: planned again) when a shard of `key` was read again since the plan.
    fn check_rereads(&self, records: &Records, key: &RecordKey) -> Result<(), CommitError> {
        match self.rereads {
            Some(mark) if records.reread_since(key, mark) => Err(conflict(format!(
                "pool record of {}/{}: a shard was read again after this pass planned",
                key.0, key.1
            ))),
            _ => Ok(()),
        }
    }
}

/// The stamp the shards of `key` carry at most, as this replica holds them.
fn highest_stamp(records: &Records, key: &RecordKey) -> (i64, String) {
    let layout = records
        .layouts
        .get(key)
        .map(|l| (l.spec.pools_seen.unwrap_or(0), l.name_any()));
    records
        .map
        .get(key)
        .into_iter()
        .flatten()
        .map(|(name, h)| (h.record.spec.pools_seen.unwrap_or(0), name.clone()))
        .chain(layout)
        .max()
        .unwrap_or_default()
}

/// Raises the fence of `key`'s layout record, on the version this replica holds: what every
/// commit (and every fence raise) that created shards of `key` sends once they exist and
/// before any entry is written into them. A replica that planned on a pool datacenter since
/// deleted — a datacenter removed from the pool and added back, a pool deleted and created
/// again under the same name — may still hold the old layout record and divide by it; the
/// shards it creates do not exist under the new division, so their creates pass, but the
/// old layout record is gone (or is another object now) and this raise is refused. Its new
/// shards hold no entry yet, so a refused commit has handed nothing out. See
/// `docs/design.md`.
async fn raise_layout(ctx: &Context, key: &RecordKey, seen: i64) -> Result<(), CommitError> {
    let name = shards::layout_name(&key.0, &key.1);
    let current = ctx.records.lock().await.layouts.get(key).map(|l| {
        (
            l.resource_version(),
            l.spec.fence.unwrap_or(0),
            l.spec.pools_seen.unwrap_or(0),
        )
    });
    let Some((Some(version), fence, stamp)) =
        current.map(|(v, f, s)| (v.filter(|v| !v.is_empty()), f, s))
    else {
        return Err(conflict(format!(
            "layout record {name}: not held by this replica, so the shards it created cannot be confirmed"
        )));
    };
    if stamp > seen {
        return Err(CommitError::PoolsBehind {
            shard: name,
            stamp,
            seen: u64::try_from(seen).unwrap_or(0),
        });
    }
    raise(
        ctx,
        key,
        &name,
        Raised::Layout,
        &version,
        fence,
        stamp,
        seen,
    )
    .await
}

/// Which record a fence raise is for.
enum Raised {
    Shard,
    Layout,
}

/// Raises the fence of record `name` of `key` from `fence`, conditional on `version` (the
/// copy held), stamping `seen` when it is above the copy's `stamp`; then brings the copy to
/// what the server made of it. A raise of the layout record also stamps this kipam's format.
#[allow(clippy::too_many_arguments)]
async fn raise(
    ctx: &Context,
    key: &RecordKey,
    name: &str,
    which: Raised,
    version: &str,
    fence: i64,
    stamp: i64,
    seen: i64,
) -> Result<(), CommitError> {
    let next = fence.saturating_add(1);
    let restamp = (seen > stamp).then_some(seen);
    let mut spec = json!({"fence": next});
    if matches!(which, Raised::Layout) {
        spec["format"] = json!(RECORD_FORMAT);
    }
    if let Some(v) = restamp {
        spec["poolsSeen"] = json!(v);
    }
    write_spec(
        ctx,
        key,
        name,
        version,
        spec,
        |records, written| match which {
            Raised::Shard => records.fenced(key, name, version, next, restamp, written),
            Raised::Layout => records.layout_fenced(key, version, next, restamp, written),
        },
    )
    .await
}

/// Sends `spec` as a merge patch of record `name` of `key`, conditional on `version` (the
/// copy held), then brings the copy to what the server made of it with `apply` (given the
/// metadata the server answered with). A copy replaced meanwhile is read again; a server that
/// kept the version of a write that changes something disagrees with the copy: a conflict.
async fn write_spec(
    ctx: &Context,
    key: &RecordKey,
    name: &str,
    version: &str,
    spec: Value,
    apply: impl FnOnce(&mut Records, ObjectMeta) -> Patched,
) -> Result<(), CommitError> {
    let body = json!({"metadata": {"resourceVersion": version}, "spec": spec});
    let pp = PatchParams {
        field_manager: Some("kipam".into()),
        ..Default::default()
    };
    // RBAC: src/rbac.rs (ipampoolrecords).
    let api: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    ctx.metrics.wrote("patch", "ipampoolrecords");
    let written = match api.patch_metadata(name, &pp, &Patch::Merge(&body)).await {
        Ok(w) => w,
        Err(e) => return Err(failed(ctx, key, name, e.into()).await),
    };
    let outcome = apply(&mut *ctx.records.lock().await, written.metadata);
    match outcome {
        Patched::Applied => Ok(()),
        Patched::Moved => {
            refresh(ctx, key, name).await;
            Ok(())
        }
        Patched::Diverged => Err(failed(
            ctx,
            key,
            name,
            conflict(format!(
                "pool record {name}: the server kept the version of a write that changes it"
            )),
        )
        .await),
    }
}

/// How `key`'s addresses are divided into blocks, and the block length of its layout record
/// to create first when this replica holds none. The layout record decides once it exists;
/// before, the shards held (a record written before layout records existed), else `base`
/// (the pool's fields).
fn division(
    records: &Records,
    key: &RecordKey,
    base: Result<Layout, CommitError>,
    family: Option<crate::address::Family>,
) -> Result<(Layout, Option<i32>), CommitError> {
    let existing: Vec<Cidr> = records
        .map
        .get(key)
        .into_iter()
        .flat_map(|shards| shards.values().filter_map(|h| h.block))
        .collect();
    if let Some(len) = records.block_length(key) {
        let len = u8::try_from(len).unwrap_or(u8::MAX);
        return match (base, family) {
            (Ok(layout), _) => Ok((
                layout
                    .with_block_len(len)
                    .with_networks(records.layout_networks(key)),
                None,
            )),
            (Err(_), Some(f)) => Ok((
                Layout::unbounded(f, len).ok_or_else(|| unbounded_failed(key))?,
                None,
            )),
            (Err(e), None) => Err(e),
        };
    }
    match base {
        Ok(layout) => {
            let layout = layout.keeping(existing);
            let len = i32::from(layout.block_len());
            Ok((layout, Some(len)))
        }
        // An invalid pool (only its fences are raised): the division of its shards, else the
        // one a `range` pool gets by default, 256 addresses.
        Err(e) => {
            let Some(family) = family else {
                return Err(e);
            };
            let mut lengths = existing.iter().map(|b| b.prefix_len());
            let len = match lengths.next() {
                Some(first) if lengths.all(|l| l == first) => first,
                Some(_) => return Err(e),
                None => family.bits() - 8,
            };
            let layout = Layout::unbounded(family, len).ok_or_else(|| unbounded_failed(key))?;
            Ok((layout, Some(i32::from(len))))
        }
    }
}

fn unbounded_failed(key: &RecordKey) -> CommitError {
    CommitError::Layout(
        format!("{}/{}", key.0, key.1),
        "no division covers its addresses".into(),
    )
}

/// Creates `key`'s layout record fixing blocks of prefix length `len`, before the first shard
/// this replica writes there. Two replicas creating it meet in `409 AlreadyExists`: the one
/// that loses reads it and plans again, so both divide alike from then on.
async fn create_layout(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    len: i32,
) -> Result<(), CommitError> {
    let name = shards::layout_name(&key.0, &key.1);
    let record = IPAMPoolRecord {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            owner_references: Some(vec![owner(pool)]),
            ..Default::default()
        },
        spec: IPAMPoolRecordSpec {
            pool: key.0.clone(),
            datacenter: key.1.clone(),
            block_length: Some(len),
            networks: current_networks(pool, key)
                .iter()
                .map(ToString::to_string)
                .collect(),
            pool_generation: pool.metadata.generation,
            format: Some(RECORD_FORMAT),
            ..Default::default()
        },
    };
    send(ctx, key, Write::Create(Box::new(record))).await
}

/// The networks of `key`'s datacenter of `pool` as this replica reads the pool (none when
/// they do not read).
fn current_networks(pool: &IPAMPool, key: &RecordKey) -> Vec<Cidr> {
    layout(pool, key)
        .map(|l| shards::union_networks(&[], &l.cidrs().copied().collect::<Vec<_>>()))
        .unwrap_or_default()
}

/// Brings `key`'s layout record up to the pool as this replica reads it, before anything is
/// planned or committed there: it exists (created with the division the pool's fields give),
/// remembers every network of the pool datacenter (`spec.networks`, which only grows), and
/// names the pool's `metadata.generation` it was written for (`spec.poolGeneration`). A write
/// is sent only when something is missing, on the version held (a real compare-and-swap).
/// Refused (`PoolsBehind`) when the layout record names a newer generation than this
/// replica's pool: another replica has seen an edit this one has not.
///
/// Why: a pool narrowed so that it stops overlapping another pool of its space is planned
/// apart from it by the replica that has seen the edit, which would then raise no fence of
/// it; a replica frozen across the edit still plans both together and may commit into the
/// narrowed pool where the other hands the same address out. The leader writes the layout
/// record after every edit of the pool's spec before it plans, so its copy holds every
/// network a stale replica can have added (that replica's write came first, or is refused
/// after), and it keeps grouping and fencing the narrowed pool over them (`docs/design.md`).
/// Returns the writes sent. Pools whose networks do not read are left alone.
pub async fn keep_layout(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    planned: &PlannedOn,
) -> Result<u64, CommitError> {
    let current = current_networks(pool, key);
    if current.is_empty() {
        return Ok(0);
    }
    let generation = pool.metadata.generation.unwrap_or(0);
    let name = shards::layout_name(&key.0, &key.1);
    let (held, create) = {
        let records = ctx.records.lock().await;
        known_format(&records, key)?;
        match records.layouts.get(key) {
            Some(l) => (Some(l.clone()), None),
            None => (None, division(&records, key, layout(pool, key), None)?.1),
        }
    };
    let Some(held) = held else {
        let Some(len) = create else {
            return Ok(0);
        };
        create_layout(ctx, pool, key, len).await?;
        return Ok(1);
    };
    let networks = match shards::layout_state(
        &held.spec.networks,
        held.spec.pool_generation,
        &current,
        generation,
    ) {
        shards::LayoutState::Current => return Ok(0),
        shards::LayoutState::Ahead => {
            return Err(CommitError::PoolsBehind {
                shard: name,
                stamp: held.spec.pools_seen.unwrap_or(0),
                seen: planned.pools_seen(),
            });
        }
        shards::LayoutState::Behind(networks) => networks,
    };
    let texts: Vec<String> = networks.iter().map(ToString::to_string).collect();
    if texts.len() > crate::resources::bounds::MAX_LAYOUT_NETWORKS as usize {
        return Err(CommitError::Layout(
            format!("{}/{}", key.0, key.1),
            format!(
                "spec.networks of layout record {name} would list {} networks, more than {}",
                texts.len(),
                crate::resources::bounds::MAX_LAYOUT_NETWORKS
            ),
        ));
    }
    let stamp = held.spec.pools_seen.unwrap_or(0);
    let seen = planned.cover(ctx, stamp, &name).await?;
    let seen = i64::try_from(seen).unwrap_or(i64::MAX);
    let Some(version) = held.resource_version().filter(|v| !v.is_empty()) else {
        return Err(conflict(format!(
            "layout record {name}: the copy held carries no resourceVersion to write on"
        )));
    };
    let restamp = (seen > stamp).then_some(seen);
    let mut spec = json!({
        "networks": texts,
        "poolGeneration": generation,
        "format": RECORD_FORMAT,
    });
    if let Some(v) = restamp {
        spec["poolsSeen"] = json!(v);
    }
    write_spec(ctx, key, &name, &version, spec, |records, written| {
        records.layout_kept(key, &version, texts, generation, restamp, written)
    })
    .await?;
    Ok(1)
}

/// [`keep_layout`] for every datacenter of every valid pool given (those being deleted left
/// out).
/// Returns the writes sent, or the first refusal.
pub async fn keep_layouts(
    ctx: &Context,
    pools: &[Arc<IPAMPool>],
    planned: &PlannedOn,
) -> Result<u64, CommitError> {
    let mut sent = 0;
    for pool in pools {
        // An invalid pool is left out of the plan (its holdings are fenced as an invalid
        // pool's): nothing to keep up to.
        if pool.metadata.deletion_timestamp.is_some()
            || crate::validation::pool_input(pool).is_err()
        {
            continue;
        }
        for dc in pool.spec.datacenters.keys() {
            let key = (pool.name_any(), dc.clone());
            sent += keep_layout(ctx, pool, &key, planned).await?;
        }
    }
    Ok(sent)
}

fn owner(pool: &IPAMPool) -> OwnerReference {
    crate::resources::record_owner(pool)
}

/// Writes the record of `key` so that it holds exactly `reservations`, each shard conditional
/// on the version this replica last saw, and checks (a write that changes nothing) the shards
/// of the clusters in `check`, whose objects are about to be written. Returns the number of
/// writes sent (none when everything is current already). On a conflict the shard is re-read
/// for the next pass.
pub async fn commit(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    reservations: BTreeMap<String, Reservation>,
    check: BTreeSet<String>,
    planned: &PlannedOn,
) -> Result<u64, CommitError> {
    let target = Target::Whole {
        desired: reservations,
        check,
    };
    run(ctx, pool, key, target, planned).await
}

/// Raises the fence of every shard of `key` — the record of another pool of the same address
/// space, or of an invalid pool of the datacenter — covering `added` (addresses a commit of
/// this replica is about to hand out in the overlapping pool), creating the shards that do
/// not exist yet (and the pool datacenter's layout record first, if this replica holds none).
/// Each raise is a real write (it changes `spec.fence`, so the shard gets a new
/// `resourceVersion`) conditional on the version this replica holds: it fails if anybody
/// wrote the shard since, and any commit of the other pool planned on the version before it
/// fails in turn. See `docs/design.md`.
pub async fn raise_fences(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    added: &[crate::address::AddrRange],
    planned: &PlannedOn,
) -> Result<u64, CommitError> {
    let mut families: Vec<crate::address::Family> = added.iter().map(|r| r.family()).collect();
    families.sort_by_key(|f| f.bits());
    families.dedup();
    let mut sent = 0;
    for family in families {
        sent += raise_in(ctx, pool, key, added, planned, family).await?;
    }
    Ok(sent)
}

/// [`raise_fences`] for the addresses of one family.
async fn raise_in(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    added: &[crate::address::AddrRange],
    planned: &PlannedOn,
    family: crate::address::Family,
) -> Result<u64, CommitError> {
    let mut sent = match layout(pool, key) {
        Ok(l) if l.family() != family => return Ok(0),
        _ => keep_layout(ctx, pool, key, planned).await?,
    };
    let (layout, create) = {
        let records = ctx.records.lock().await;
        planned.check_rereads(&records, key)?;
        known_format(&records, key)?;
        // A pool whose settings do not read (an invalid pool) is fenced all the same: over
        // the division of its layout record or its shards, wherever the addresses lie.
        let base = match layout(pool, key) {
            // A pool of the other family: none of these addresses is its.
            Ok(l) if l.family() != family => return Ok(0),
            other => other,
        };
        division(&records, key, base, Some(family))?
    };
    let blocks = layout
        .blocks_covering(added.iter().copied())
        .map_err(|why| {
            CommitError::Unsplittable(format!("pool record of {}/{}: {why}", key.0, key.1))
        })?;
    if blocks.is_empty() {
        return Ok(0);
    }
    if let Some(len) = create {
        sent += 1;
        create_layout(ctx, pool, key, len).await?;
    }
    // Shards created here: confirmed by a raise of the layout record once they all exist.
    let mut created = false;
    let mut highest = 0;
    for block in blocks {
        let name = shards::shard_name(&key.0, &key.1, &block);
        let current = {
            let records = ctx.records.lock().await;
            planned.check_rereads(&records, key)?;
            records.map.get(key).and_then(|s| s.get(&name)).map(|h| {
                (
                    h.record.resource_version(),
                    h.record.spec.fence.unwrap_or(0),
                    h.record.spec.pools_seen.unwrap_or(0),
                )
            })
        };
        let seen = planned
            .cover(ctx, current.as_ref().map_or(0, |c| c.2), &name)
            .await?;
        let seen = i64::try_from(seen).unwrap_or(i64::MAX);
        highest = highest.max(seen);
        sent += 1;
        let Some((version, fence, stamp)) = current else {
            let write = prepare(None, pool, key, &name, Some(block), Changes::new(), seen)?;
            let Write::Create(mut record) = write else {
                return Err(conflict(format!(
                    "pool record {name}: expected a new shard"
                )));
            };
            record.spec.fence = Some(1);
            send(ctx, key, Write::Create(record)).await?;
            created = true;
            continue;
        };
        let Some(version) = version.filter(|v| !v.is_empty()) else {
            return Err(conflict(format!(
                "pool record {name}: the copy held carries no resourceVersion to commit on"
            )));
        };
        raise(ctx, key, &name, Raised::Shard, &version, fence, stamp, seen).await?;
    }
    if created {
        let layout = shards::layout_name(&key.0, &key.1);
        let seen = planned
            .cover(ctx, layout_stamp(ctx, key).await, &layout)
            .await?;
        let seen = i64::try_from(seen).unwrap_or(i64::MAX).max(highest);
        sent += 1;
        raise_layout(ctx, key, seen).await?;
    }
    Ok(sent)
}

/// The `spec.poolsSeen` of `key`'s layout record as this replica holds it.
async fn layout_stamp(ctx: &Context, key: &RecordKey) -> i64 {
    ctx.records
        .lock()
        .await
        .layouts
        .get(key)
        .and_then(|l| l.spec.pools_seen)
        .unwrap_or(0)
}

/// [`commit`] for a pool datacenter that shares addresses with others (`others`: their pools
/// and record keys — the overlapping pools of its address space and the invalid pools of its
/// datacenter; none makes it [`commit`]): first the fences of the other pools' shards
/// covering the addresses this commit adds are raised ([`raise_fences`]), and only once all of
/// them landed is the record of `key` committed. A replica planning on a stale view of any of
/// those shards is refused before it has written anything.
pub async fn commit_shared(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    reservations: BTreeMap<String, Reservation>,
    check: BTreeSet<String>,
    others: &[(IPAMPool, RecordKey)],
    planned: &PlannedOn,
) -> Result<u64, CommitError> {
    let mut raised = 0;
    if !others.is_empty() {
        let added = added_addresses(ctx, key, &reservations).await;
        if !added.is_empty() {
            for (other_pool, other) in others {
                raised += raise_fences(ctx, other_pool, other, &added, planned).await?;
            }
        }
    }
    Ok(commit(ctx, pool, key, reservations, check, planned).await? + raised)
}

/// The addresses `desired` lists that the record of `key` (as this replica holds it) does not
/// list for the same entry: what a commit of it hands out.
async fn added_addresses(
    ctx: &Context,
    key: &RecordKey,
    desired: &BTreeMap<String, Reservation>,
) -> Vec<crate::address::AddrRange> {
    let held: BTreeMap<String, Reservation> = ctx.records.lock().await.joined(key).collect();
    let mut added = Vec::new();
    for (entry, wanted) in desired {
        let Ok(wanted) = crate::reservations::allocation_of(wanted) else {
            continue;
        };
        let had: Vec<crate::address::AddrRange> = held
            .get(entry)
            .and_then(|r| crate::reservations::allocation_of(r).ok())
            .map(|a| a.ranges().collect())
            .unwrap_or_default();
        added.extend(crate::reservations::subtract_ranges(
            wanted.ranges().collect(),
            had,
        ));
    }
    added
}

/// Writes the record of `key` with `changes` applied to the copy this replica holds (`None`
/// removes a cluster's entry), each shard conditional on the version of its copy, like
/// [`commit`]. For callers that already know what changes: no comparison of the whole record.
pub async fn commit_changes(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    changes: Changes,
    planned: &PlannedOn,
) -> Result<u64, CommitError> {
    run(ctx, pool, key, Target::Changes(changes), planned).await
}

async fn run(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    target: Target,
    planned: &PlannedOn,
) -> Result<u64, CommitError> {
    // A shard last written by a replica that saw newer pools than this plan: this replica may
    // not have seen an edit that commit saw (see `docs/design.md`).
    let (stamp, shard) = {
        let records = ctx.records.lock().await;
        planned.check_rereads(&records, key)?;
        known_format(&records, key)?;
        highest_stamp(&records, key)
    };
    let seen = planned.cover(ctx, stamp, &shard).await?;
    let seen = i64::try_from(seen).unwrap_or(i64::MAX);
    // The layout record up to the pool this plan read (the pass did it already: no write).
    let kept = keep_layout(ctx, pool, key, planned).await?;
    let (create, [adds, removes]) = {
        let records = ctx.records.lock().await;
        planned.check_rereads(&records, key)?;
        // The division the layout record fixes; without one (a pool datacenter that never
        // held anything), the one the shards or the pool's fields give, and the layout record
        // is created first.
        let (layout, create) = division(&records, key, layout(pool, key), None)?;
        (create, plan(&records, pool, key, &layout, target, seen)?)
    };
    if adds.is_empty() && removes.is_empty() {
        return Ok(kept);
    }
    let mut sent = kept;
    if let Some(len) = create {
        sent += 1;
        create_layout(ctx, pool, key, len).await?;
    }
    // New shards are created empty and confirmed by a raise of the layout record before any
    // entry goes into them ([`raise_layout`]); their entries then go in with the other writes.
    let (creates, mut adds): (Vec<Write>, Vec<Write>) = adds
        .into_iter()
        .partition(|w| matches!(w, Write::Create(_)));
    if !creates.is_empty() {
        let mut filled = Vec::new();
        let mut empty = Vec::new();
        for write in creates {
            let Write::Create(mut record) = write else {
                continue;
            };
            let entries = std::mem::take(&mut record.spec.reservations);
            if !entries.is_empty() {
                let block = record.spec.block.as_deref().and_then(|b| b.parse().ok());
                filled.push((record.name_any(), block, entries));
            }
            empty.push(Write::Create(record));
        }
        sent += empty.len() as u64 + 1;
        let results: Vec<Result<(), CommitError>> = futures::stream::iter(empty)
            .map(|w| send(ctx, key, w))
            .buffer_unordered(SHARD_CONCURRENCY)
            .collect()
            .await;
        if let Some(e) = results.into_iter().find_map(Result::err) {
            return Err(e);
        }
        raise_layout(ctx, key, seen).await?;
        let records = ctx.records.lock().await;
        for (name, block, entries) in filled {
            let held = records.map.get(key).and_then(|s| s.get(&name));
            if held.is_none() {
                return Err(conflict(format!(
                    "pool record {name}: created by this commit, but no longer held"
                )));
            }
            let changes: Changes = entries.into_iter().map(|(k, v)| (k, Some(v))).collect();
            adds.push(prepare(held, pool, key, &name, block, changes, seen)?);
        }
    }
    for phase in [adds, removes] {
        sent += phase.len() as u64;
        let results: Vec<Result<(), CommitError>> = futures::stream::iter(phase)
            .map(|w| send(ctx, key, w))
            .buffer_unordered(SHARD_CONCURRENCY)
            .collect()
            .await;
        // A phase that did not land whole stops the commit: nothing is removed while an
        // addition may be missing.
        if let Some(e) = results.into_iter().find_map(Result::err) {
            return Err(e);
        }
    }
    Ok(sent)
}

/// A shard write ready to send.
enum Write {
    Create(Box<IPAMPoolRecord>),
    Patch {
        name: String,
        body: Value,
        /// The version the patch is conditional on.
        version: String,
        /// The entry changes it holds (those that change the held copy only).
        changes: Changes,
        entry_bytes: usize,
        /// The new `spec.poolsSeen`, when it goes up.
        stamp: Option<i64>,
    },
    Delete {
        name: String,
        preconditions: Preconditions,
    },
}

/// Builds the write for `changes` on shard `name` (`held`, if this replica holds it; else it
/// is created covering `block`), and applies the size guard to the shard it would make.
fn prepare(
    held: Option<&Held>,
    pool: &IPAMPool,
    key: &RecordKey,
    name: &str,
    block: Option<Cidr>,
    changes: Changes,
    seen: i64,
) -> Result<Write, CommitError> {
    let name = name.to_string();
    let owners = Some(vec![owner(pool)]);
    let Some(held) = held else {
        let record = IPAMPoolRecord {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                owner_references: owners,
                ..Default::default()
            },
            spec: IPAMPoolRecordSpec {
                pool: key.0.clone(),
                datacenter: key.1.clone(),
                block: block.map(|b| b.to_string()),
                reservations: changes
                    .into_iter()
                    .filter_map(|(k, v)| Some((k, v?)))
                    .collect(),
                pools_seen: (seen > 0).then_some(seen),
                format: Some(RECORD_FORMAT),
                ..Default::default()
            },
        };
        if json_size(&record) > MAX_RECORD_BYTES {
            return Err(CommitError::TooLarge(name));
        }
        return Ok(Write::Create(Box::new(record)));
    };
    behind(held, &name, seen)?;
    let current = &held.record;
    // The stamp goes up with any write of a replica that saw newer pools than the last writer.
    let stamp = (seen > current.spec.pools_seen.unwrap_or(0)).then_some(seen);
    // Only what changes the held copy; the sizes of the record that results.
    let mut count = current.spec.reservations.len();
    let mut entry_bytes = held.entry_bytes;
    let mut kept = Changes::new();
    for (cluster, new) in changes {
        let old = current.spec.reservations.get(&cluster);
        if old == new.as_ref() {
            continue;
        }
        match old {
            Some(o) => entry_bytes = entry_bytes.saturating_sub(entry_size(&cluster, o)),
            None => count += 1,
        }
        match &new {
            Some(n) => entry_bytes += entry_size(&cluster, n),
            None => count = count.saturating_sub(1),
        }
        kept.insert(cluster, new);
    }
    // Without a version the patch would be unconditional: no fence at all.
    let Some(version) = current
        .metadata
        .resource_version
        .clone()
        .filter(|v| !v.is_empty())
    else {
        return Err(conflict(format!(
            "pool record {name}: the copy held carries no resourceVersion to commit on"
        )));
    };
    let mut meta = Map::new();
    meta.insert("resourceVersion".into(), json!(version));
    let new_owners = current.metadata.owner_references != owners;
    if new_owners {
        meta.insert("ownerReferences".into(), json!(owners));
    }
    // The shard as the write leaves it: this kipam's format is stamped with any write.
    let format = Some(RECORD_FORMAT);
    let size = if new_owners {
        let metadata = ObjectMeta {
            owner_references: owners,
            ..current.metadata.clone()
        };
        record_size(&metadata, &current.spec, format, count, entry_bytes)
    } else {
        record_size(&current.metadata, &current.spec, format, count, entry_bytes)
    };
    if size > MAX_RECORD_BYTES {
        return Err(CommitError::TooLarge(name));
    }
    let mut body = Map::new();
    body.insert("metadata".into(), Value::Object(meta));
    let mut spec = Map::new();
    if !kept.is_empty() {
        let entries: Map<String, Value> = kept
            .iter()
            .map(|(cluster, new)| {
                (
                    cluster.clone(),
                    new.as_ref().map_or(Value::Null, entry_patch),
                )
            })
            .collect();
        spec.insert("reservations".into(), Value::Object(entries));
    }
    if let Some(v) = stamp {
        spec.insert("poolsSeen".into(), json!(v));
    }
    // A shard written before formats were stamped gets this kipam's format with the first
    // write that changes it anyway (a newer one was refused above).
    if !spec.is_empty() && current.spec.format != Some(RECORD_FORMAT) {
        spec.insert("format".into(), json!(RECORD_FORMAT));
    }
    if !spec.is_empty() {
        body.insert("spec".into(), Value::Object(spec));
    }
    Ok(Write::Patch {
        name,
        body: Value::Object(body),
        version,
        changes: kept,
        entry_bytes,
        stamp,
    })
}

/// `Err` when a record of `key` is of a newer format than this kipam knows.
fn known_format(records: &Records, key: &RecordKey) -> Result<(), CommitError> {
    match records.newer_format(key) {
        Some((shard, format)) => Err(CommitError::NewerFormat { shard, format }),
        None => Ok(()),
    }
}

/// `Err` when the copy of shard `name` says its last writer saw newer pools than `seen`.
fn behind(held: &Held, name: &str, seen: i64) -> Result<(), CommitError> {
    match held.record.spec.pools_seen {
        Some(stamp) if stamp > seen => Err(CommitError::PoolsBehind {
            shard: name.to_string(),
            stamp,
            seen: u64::try_from(seen).unwrap_or(0),
        }),
        _ => Ok(()),
    }
}

/// The merge patch of one entry: every field kipam knows, `null` when empty, so that the
/// patch replaces the entry instead of merging into it (a merge patch merges objects key by
/// key: an entry changed from a `cidr` to `addresses` must lose its `cidr`).
fn entry_patch(r: &Reservation) -> Value {
    // Destructured so that a new field cannot be forgotten here.
    let Reservation { cidr, addresses } = r;
    json!({
        "cidr": cidr,
        "addresses": if addresses.is_empty() { Value::Null } else { json!(addresses) },
    })
}

/// A conflict found by this replica: handled like the server's 409 (the record is re-read,
/// the pass plans again).
fn conflict(message: String) -> CommitError {
    CommitError::Api(kube::Error::Api(
        Status::failure(&message, "Conflict").with_code(409).boxed(),
    ))
}

/// `e`, after re-reading shard `name` when it says somebody else wrote or deleted it.
async fn failed(ctx: &Context, key: &RecordKey, name: &str, e: CommitError) -> CommitError {
    if e.is_stale() {
        refresh(ctx, key, name).await;
    }
    e
}

async fn send(ctx: &Context, key: &RecordKey, write: Write) -> Result<(), CommitError> {
    // RBAC: src/rbac.rs (ipampoolrecords).
    let api: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    match write {
        Write::Create(record) => {
            let pp = PostParams {
                field_manager: Some("kipam".into()),
                ..Default::default()
            };
            let name = record.name_any();
            ctx.metrics.wrote("create", "ipampoolrecords");
            match api.create(&pp, &record).await {
                Ok(written) => {
                    let mut records = ctx.records.lock().await;
                    records.put(written);
                    // The shards written before this one, which the watch has shown since.
                    records.share_pool(key, &ctx.record_view.store);
                    Ok(())
                }
                // 409 AlreadyExists: somebody else created it; read it for the next pass.
                Err(e) => Err(failed(ctx, key, &name, e.into()).await),
            }
        }
        Write::Patch {
            name,
            body,
            version,
            changes,
            entry_bytes,
            stamp,
        } => {
            let pp = PatchParams {
                field_manager: Some("kipam".into()),
                ..Default::default()
            };
            ctx.metrics.wrote("patch", "ipampoolrecords");
            // The server answers with the shard's metadata only, not its entries.
            let written = match api.patch_metadata(&name, &pp, &Patch::Merge(&body)).await {
                Ok(w) => w,
                Err(e) => return Err(failed(ctx, key, &name, e.into()).await),
            };
            let mut records = ctx.records.lock().await;
            let outcome = records.patched(
                key,
                &name,
                &version,
                changes,
                entry_bytes,
                stamp,
                written.metadata,
            );
            records.share_pool(key, &ctx.record_view.store);
            drop(records);
            match outcome {
                Patched::Applied => Ok(()),
                Patched::Moved => {
                    // The patch landed on the version it was made for, so the commit holds;
                    // the copy here was replaced meanwhile and is read again.
                    refresh(ctx, key, &name).await;
                    Ok(())
                }
                Patched::Diverged => Err(failed(
                    ctx,
                    key,
                    &name,
                    conflict(format!(
                        "pool record {name}: the server found nothing to change in a commit of \
                         changed entries, so its record differs from this replica's copy"
                    )),
                )
                .await),
            }
        }
        Write::Delete {
            name,
            preconditions,
        } => delete(ctx, key, &name, preconditions)
            .await
            .map_err(Into::into),
    }
}

/// Deletes shard `name`, on the version and uid this replica holds.
async fn delete(
    ctx: &Context,
    key: &RecordKey,
    name: &str,
    preconditions: Preconditions,
) -> Result<(), kube::Error> {
    let api: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    let dp = DeleteParams {
        preconditions: Some(preconditions),
        ..Default::default()
    };
    ctx.metrics.wrote("delete", "ipampoolrecords");
    match api.delete(name, &dp).await {
        Ok(_) => {
            ctx.records.lock().await.forget(key, name);
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            ctx.records.lock().await.forget(key, name);
            Ok(())
        }
        Err(e) => {
            refresh(ctx, key, name).await;
            Err(e)
        }
    }
}

/// Deletes every shard of the record of a datacenter the pool no longer has, once no object is
/// left there. Returns the number of deletes sent.
pub async fn remove(ctx: &Context, key: &RecordKey) -> Result<u64, kube::Error> {
    let records = ctx.records.lock().await;
    // What a newer kipam wrote may hold what this one cannot read: left to it.
    if let Some((shard, format)) = records.newer_format(key) {
        tracing::warn!(record = %shard, format, known = RECORD_FORMAT, "pool record of a newer format kept: this replica deletes nothing a newer kipam wrote");
        return Ok(0);
    }
    let shards: Vec<(String, Preconditions)> = records
        .map
        .get(key)
        .into_iter()
        .flatten()
        .map(|(name, h)| {
            (
                name.clone(),
                Preconditions {
                    resource_version: h.record.resource_version(),
                    uid: h.record.uid(),
                },
            )
        })
        .collect();
    drop(records);
    let mut sent = 0;
    for (name, preconditions) in shards {
        sent += 1;
        delete(ctx, key, &name, preconditions).await?;
    }
    // The layout record last: it goes with the pool datacenter.
    let layout = ctx.records.lock().await.layouts.get(key).map(|l| {
        (
            l.name_any(),
            Preconditions {
                resource_version: l.resource_version(),
                uid: l.uid(),
            },
        )
    });
    if let Some((name, preconditions)) = layout {
        sent += 1;
        delete(ctx, key, &name, preconditions).await?;
    }
    Ok(sent)
}

/// Re-reads one shard (after a conflict).
async fn refresh(ctx: &Context, key: &RecordKey, name: &str) {
    let api: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    match api.get_opt(name).await {
        Ok(Some(r)) => {
            let mut records = ctx.records.lock().await;
            records.reread(key);
            let other = key_of(&r);
            if other != *key {
                // The name now holds another pool datacenter's shard (written by hand):
                // forgotten here, held under its own key.
                records.forget(key, name);
                records.reread(&other);
            }
            records.put(r);
        }
        Ok(None) => {
            let mut records = ctx.records.lock().await;
            records.reread(key);
            records.forget(key, name);
        }
        Err(e) => {
            tracing::warn!(error = %crate::seed::preconditions::short(&e), pool = %key.0, datacenter = %key.1, shard = %name, "cannot re-read the pool record")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(uid: &str) -> IPAMPool {
        serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "p", "uid": uid},
            "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.0.0.0/8", "allocationRange": 4}}},
        }))
        .unwrap()
    }

    fn range(i: usize) -> Reservation {
        Reservation {
            cidr: None,
            addresses: vec![format!(
                "10.0.{}.{}-10.0.{}.{}",
                i / 64,
                i % 64 * 4,
                i / 64,
                i % 64 * 4 + 3
            )],
        }
    }

    fn subnet(i: usize) -> Reservation {
        Reservation {
            cidr: Some(format!("10.{i}.0.0/28")),
            addresses: Vec::new(),
        }
    }

    fn key() -> RecordKey {
        ("p".into(), "dc-1".into())
    }

    /// The one shard the tests hold.
    const NAME: &str = "p.dc-1";

    fn shard(records: &Records) -> &Held {
        &records.map[&key()][NAME]
    }

    fn held(entries: BTreeMap<String, Reservation>) -> Records {
        let mut records = Records::default();
        records.reset(vec![IPAMPoolRecord {
            metadata: ObjectMeta {
                name: Some("p.dc-1".into()),
                resource_version: Some("1".into()),
                uid: Some("r1".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "ipam.kipam.dev/v1alpha1".into(),
                    kind: "IPAMPool".into(),
                    name: "p".into(),
                    uid: "u1".into(),
                    controller: Some(true),
                    block_owner_deletion: None,
                }]),
                ..Default::default()
            },
            spec: IPAMPoolRecordSpec {
                pool: "p".into(),
                datacenter: "dc-1".into(),
                block: None,
                reservations: entries,
                ..Default::default()
            },
        }]);
        records
    }

    fn exact(records: &Records) -> usize {
        json_size(&*shard(records).record)
    }

    /// Prepares `changes` and lands them as the server would, with version `next`.
    fn land(records: &mut Records, pool: &IPAMPool, changes: Changes, next: u64) -> Value {
        let write = prepare(Some(shard(records)), pool, &key(), NAME, None, changes, 0).unwrap();
        let Write::Patch {
            body,
            version,
            changes,
            entry_bytes,
            ..
        } = write
        else {
            panic!("an existing record is patched");
        };
        let mut metadata = shard(records).record.metadata.clone();
        metadata.resource_version = Some(next.to_string());
        if let Some(owners) = body["metadata"].get("ownerReferences") {
            metadata.owner_references = serde_json::from_value(owners.clone()).unwrap();
        }
        let outcome = records.patched(&key(), NAME, &version, changes, entry_bytes, None, metadata);
        assert!(matches!(outcome, Patched::Applied));
        body
    }

    #[test]
    fn the_size_kept_through_changes_is_the_exact_serialised_size() {
        let mut records = held((0..5).map(|i| (format!("c{i}"), range(i))).collect());
        assert_eq!(records.serialized_size(&key(), NAME), Some(exact(&records)));
        let pool = pool("u1");
        // Adds, changes (range to subnet and back), removals, no-ops, down to an empty
        // record and up again.
        for step in 0..60usize {
            let mut changes = Changes::new();
            changes.insert(format!("c{}", step % 7), Some(range(step)));
            changes.insert(format!("c{}", (step + 3) % 7), Some(subnet(step)));
            if step % 3 == 0 {
                changes.insert(format!("c{}", (step + 5) % 7), None);
            }
            if (20..30).contains(&step) {
                changes = (0..7).map(|i| (format!("c{i}"), None)).collect();
            }
            land(&mut records, &pool, changes, step as u64 + 2);
            assert_eq!(
                records.serialized_size(&key(), NAME),
                Some(exact(&records)),
                "step {step}"
            );
        }
    }

    #[test]
    fn a_changed_entry_is_replaced_not_merged_and_the_owner_is_sent_only_when_it_changes() {
        let mut records = held(BTreeMap::from([
            ("a".to_string(), subnet(1)),
            ("b".to_string(), range(2)),
        ]));
        // The pool was created again: a new uid.
        let pool = pool("u2");
        let body = land(
            &mut records,
            &pool,
            Changes::from([
                ("a".to_string(), Some(range(1))),
                ("b".to_string(), None),
                ("c".to_string(), Some(subnet(3))),
            ]),
            2,
        );
        assert_eq!(
            body,
            json!({
                "metadata": {
                    "resourceVersion": "1",
                    "ownerReferences": [{
                        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
                        "name": "p", "uid": "u2", "controller": true,
                    }],
                },
                // The held shard was written before formats were stamped: this write stamps it.
                "spec": {"format": RECORD_FORMAT, "reservations": {
                    "a": {"cidr": null, "addresses": ["10.0.0.4-10.0.0.7"]},
                    "b": null,
                    "c": {"cidr": "10.3.0.0/28", "addresses": null},
                }},
            })
        );
        // The owner is now held: not sent again; an entry set to what it holds is no change.
        let body = land(
            &mut records,
            &pool,
            Changes::from([("c".to_string(), Some(subnet(3)))]),
            3,
        );
        assert_eq!(body, json!({"metadata": {"resourceVersion": "2"}}));
        let entries = &shard(&records).record.spec.reservations;
        assert_eq!(
            entries,
            &BTreeMap::from([("a".to_string(), range(1)), ("c".to_string(), subnet(3))])
        );
    }

    #[test]
    fn the_size_guard_refuses_a_record_that_would_grow_too_large() {
        let entries: Vec<(String, Reservation)> = (0..20_000)
            .map(|i| (format!("cluster-{i:05}"), range(i)))
            .collect();
        let first = |n: usize| held(entries[..n].iter().cloned().collect());
        let size = |n: usize| first(n).serialized_size(&key(), NAME).unwrap();
        assert!(size(entries.len()) > MAX_RECORD_BYTES);
        // The most entries that fit.
        let (mut fits, mut too_many) = (0, entries.len());
        while too_many - fits > 1 {
            let mid = (fits + too_many) / 2;
            if size(mid) <= MAX_RECORD_BYTES {
                fits = mid;
            } else {
                too_many = mid;
            }
        }
        let records = first(fits);
        let (next, entry) = entries[fits].clone();
        let grow = Changes::from([(next, Some(entry))]);
        assert!(matches!(
            prepare(
                Some(shard(&records)),
                &pool("u1"),
                &key(),
                NAME,
                None,
                grow,
                0
            ),
            Err(CommitError::TooLarge(_))
        ));
        let trim = Changes::from([(entries[0].0.clone(), None)]);
        assert!(
            prepare(
                Some(shard(&records)),
                &pool("u1"),
                &key(),
                NAME,
                None,
                trim,
                0
            )
            .is_ok()
        );
    }

    #[test]
    fn a_version_kept_by_the_server_is_fine_for_a_no_op_and_a_divergence_otherwise() {
        let pool = pool("u1");
        let entries = BTreeMap::from([("a".to_string(), range(0))]);
        let mut records = held(entries.clone());
        let same = shard(&records).record.metadata.clone();
        let commit = |records: &mut Records, changes: Changes| {
            let Ok(Write::Patch {
                version,
                changes,
                entry_bytes,
                ..
            }) = prepare(Some(shard(records)), &pool, &key(), NAME, None, changes, 0)
            else {
                panic!("an existing record is patched");
            };
            records.patched(
                &key(),
                NAME,
                &version,
                changes,
                entry_bytes,
                None,
                same.clone(),
            )
        };
        let no_op = Changes::from([("a".to_string(), Some(range(0)))]);
        assert!(matches!(commit(&mut records, no_op), Patched::Applied));
        let added = Changes::from([("b".to_string(), Some(range(4)))]);
        assert!(matches!(commit(&mut records, added), Patched::Diverged));
        assert_eq!(shard(&records).record.spec.reservations, entries);
    }

    fn pool_of(cidr: &str) -> IPAMPool {
        serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "p", "uid": "u1", "resourceVersion": "7"},
            "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": cidr, "allocationRange": 4}}},
        }))
        .unwrap()
    }

    fn layout_record(len: i32) -> IPAMPoolRecord {
        IPAMPoolRecord {
            metadata: ObjectMeta {
                name: Some(shards::layout_name("p", "dc-1")),
                resource_version: Some("3".into()),
                ..Default::default()
            },
            spec: IPAMPoolRecordSpec {
                pool: "p".into(),
                datacenter: "dc-1".into(),
                block_length: Some(len),
                ..Default::default()
            },
        }
    }

    /// Issue 35, item 2: a pool datacenter that has never held anything, read before and
    /// after a widening by two replicas. Without a layout record each divides by the pool it
    /// reads (/26 blocks against /25): their first shards for one address would have two
    /// names, and both creates would pass. Both must create the one layout record first, and
    /// once it exists both divide by it, whatever they read of the pool.
    #[test]
    fn the_layout_record_decides_the_division_whatever_the_pool_says() {
        let (narrow, wide) = (pool_of("10.0.0.0/26"), pool_of("10.0.0.0/25"));
        let empty = Records::default();
        let (before, create) = division(&empty, &key(), layout(&narrow, &key()), None).unwrap();
        assert_eq!((before.block_len(), create), (26, Some(26)));
        let (after, create) = division(&empty, &key(), layout(&wide, &key()), None).unwrap();
        assert_eq!((after.block_len(), create), (25, Some(25)));
        // Once the layout record is held, it decides for every reading of the pool.
        let mut held = Records::default();
        held.reset(vec![layout_record(26)]);
        assert!(held.map.is_empty(), "a layout record is not a shard");
        for pool in [&narrow, &wide] {
            let (l, create) = division(&held, &key(), layout(pool, &key()), None).unwrap();
            assert_eq!((l.block_len(), create), (26, None));
        }
        // A pool datacenter recorded before layout records existed: its shards' division.
        let old = held_shard("p.dc-1.0a000000-26", "10.0.0.0/26");
        let (l, create) = division(&old, &key(), layout(&wide, &key()), None).unwrap();
        assert_eq!((l.block_len(), create), (26, Some(26)));
    }

    fn held_shard(name: &str, block: &str) -> Records {
        let mut records = Records::default();
        records.reset(vec![IPAMPoolRecord {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            spec: IPAMPoolRecordSpec {
                pool: "p".into(),
                datacenter: "dc-1".into(),
                block: Some(block.into()),
                ..Default::default()
            },
        }]);
        records
    }

    /// Issue 35, item 4: an invalid pool whose networks do not read is fenced over the
    /// division of its layout record or its shards, wherever the addresses lie; with neither,
    /// over blocks of 256 addresses, whose layout record is created first.
    #[test]
    fn an_unreadable_pool_is_fenced_over_the_division_its_records_give() {
        let broken = pool_of("10.0.0.0/33");
        let v4 = crate::address::Family::V4;
        let base = || layout(&broken, &key());
        assert!(base().is_err());
        let mut held = Records::default();
        held.reset(vec![layout_record(26)]);
        let (l, create) = division(&held, &key(), base(), Some(v4)).unwrap();
        assert_eq!((l.block_len(), create), (26, None));
        let added = [crate::address::AddrRange::parse_lenient("192.168.7.1-192.168.7.2").unwrap()];
        let blocks: Vec<String> = l
            .blocks_covering(added)
            .unwrap()
            .iter()
            .map(|b| b.to_string())
            .collect();
        assert_eq!(blocks, vec!["192.168.7.0/26"]);
        let old = held_shard("p.dc-1.0a000000-27", "10.0.0.0/27");
        let (l, create) = division(&old, &key(), base(), Some(v4)).unwrap();
        assert_eq!((l.block_len(), create), (27, Some(27)));
        let (l, create) = division(&Records::default(), &key(), base(), Some(v4)).unwrap();
        assert_eq!((l.block_len(), create), (24, Some(24)));
        // Nothing to go by: refused with the pool's own error, not skipped.
        assert!(matches!(
            division(&Records::default(), &key(), base(), None),
            Err(CommitError::Layout(..))
        ));
    }

    /// Issue 35, item 3: a shard written by a replica that saw newer pools is refused to a
    /// plan that saw older ones; a write of a plan that saw newer pools raises the stamp.
    #[test]
    fn a_shard_stamped_with_newer_pools_is_refused_to_an_older_view() {
        let mut records = held(BTreeMap::from([("a".to_string(), range(0))]));
        Arc::make_mut(
            &mut records
                .map
                .get_mut(&key())
                .unwrap()
                .get_mut(NAME)
                .unwrap()
                .record,
        )
        .spec
        .pools_seen = Some(40);
        let add = || Changes::from([("b".to_string(), Some(range(4)))]);
        let pool = pool("u1");
        assert!(matches!(
            prepare(Some(shard(&records)), &pool, &key(), NAME, None, add(), 39),
            Err(CommitError::PoolsBehind {
                stamp: 40,
                seen: 39,
                ..
            })
        ));
        let Ok(Write::Patch { body, stamp, .. }) =
            prepare(Some(shard(&records)), &pool, &key(), NAME, None, add(), 40)
        else {
            panic!("an equal view writes");
        };
        assert_eq!((stamp, body["spec"].get("poolsSeen")), (None, None));
        let Ok(Write::Patch { body, stamp, .. }) =
            prepare(Some(shard(&records)), &pool, &key(), NAME, None, add(), 41)
        else {
            panic!("a newer view writes");
        };
        assert_eq!(stamp, Some(41));
        assert_eq!(body["spec"]["poolsSeen"], json!(41));
        // The plan's view: the highest version of the pools it read.
        let planned = PlannedOn::pools([&pool_of("10.0.0.0/26"), &pool]);
        assert_eq!(planned.pools_seen(), 7);
    }
}
