//! The leader's copy of the `IPAMPoolRecord`s and the compare-and-swap that commits them.
//!
//! Loaded from a fresh (quorum) LIST at every gain of leadership, then kept from this
//! replica's own writes. Every commit carries the `resourceVersion` it was planned from, so
//! the API server refuses it (409) when anybody wrote the record since — in particular a newer
//! leader. Even a commit that changes nothing is sent before new objects are written: a write
//! with a stale `resourceVersion` fails before the server compares contents, so it doubles as
//! a check that this replica still writes on the latest record.
//!
//! A commit to an existing record is a JSON merge patch (RFC 7386) holding only the entries
//! that change and `metadata.resourceVersion`, which the API server treats as a precondition
//! exactly like the `resourceVersion` of a full update. The server answers with the record's
//! metadata only; the copy here then gets the same entries changed and the new metadata. This
//! is exact because the patch applied to the version this copy holds: the server's record at
//! that version is this copy, so the patched record is this copy with the patch applied.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::Status;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::Context;
use crate::resources::{
    IPAMPool, IPAMPoolRecord, IPAMPoolRecordSpec, MAX_RECORD_BYTES, Reservation, record_name,
};

/// (pool, datacenter).
pub type RecordKey = (String, String);

/// Cluster name -> its new entry, or `None` to remove it.
pub type Changes = BTreeMap<String, Option<Reservation>>;

#[derive(Debug, Default)]
pub struct Records {
    map: BTreeMap<RecordKey, Held>,
}

/// One record and the summed serialised size of its entries (each `"cluster":{...}`), kept
/// up to date with every change so the size guard needs no serialisation of the whole record.
#[derive(Debug)]
struct Held {
    record: IPAMPoolRecord,
    entry_bytes: usize,
}

impl Held {
    fn new(record: IPAMPoolRecord) -> Held {
        let entry_bytes = record
            .spec
            .reservations
            .iter()
            .map(|(cluster, r)| entry_size(cluster, r))
            .sum();
        Held {
            record,
            entry_bytes,
        }
    }
}

impl Records {
    pub fn reset(&mut self, items: Vec<IPAMPoolRecord>) {
        self.map = items
            .into_iter()
            .map(|r| {
                (
                    (r.spec.pool.clone(), r.spec.datacenter.clone()),
                    Held::new(r),
                )
            })
            .collect();
    }

    pub fn snapshot(&self) -> BTreeMap<RecordKey, IPAMPoolRecord> {
        self.map
            .iter()
            .map(|(k, h)| (k.clone(), h.record.clone()))
            .collect()
    }

    /// The size guard's figure for the record of `key`: what the record as held here would
    /// serialise to (`None` when no record is held).
    pub fn serialized_size(&self, key: &RecordKey) -> Option<usize> {
        let held = self.map.get(key)?;
        Some(record_size(
            &held.record.metadata,
            &held.record.spec,
            held.record.spec.reservations.len(),
            held.entry_bytes,
        ))
    }

    /// Whether any record holds an entry for `cluster`.
    pub fn holds(&self, cluster: &str) -> bool {
        self.map
            .values()
            .any(|h| h.record.spec.reservations.contains_key(cluster))
    }

    fn put(&mut self, r: IPAMPoolRecord) {
        self.map.insert(
            (r.spec.pool.clone(), r.spec.datacenter.clone()),
            Held::new(r),
        );
    }

    fn forget(&mut self, key: &RecordKey) {
        self.map.remove(key);
    }

    /// Brings the held copy of `key` to what a patch of it made at the server: `changes`
    /// applied (leaving `entry_bytes`) and the metadata the server answered with. Only when
    /// the copy is still the `version` the patch was conditional on.
    fn patched(
        &mut self,
        key: &RecordKey,
        version: &str,
        changes: Changes,
        entry_bytes: usize,
        metadata: ObjectMeta,
    ) -> Patched {
        let Some(held) = self.map.get_mut(key) else {
            return Patched::Moved;
        };
        if held.record.metadata.resource_version.as_deref() != Some(version) {
            return Patched::Moved;
        }
        match metadata.resource_version.as_deref() {
            None | Some("") => return Patched::Moved,
            // A server does not give a new version to a write that changes nothing.
            Some(v) if v == version && !changes.is_empty() => return Patched::Diverged,
            Some(_) => {}
        }
        let entries = &mut held.record.spec.reservations;
        for (cluster, new) in changes {
            match new {
                Some(r) => {
                    entries.insert(cluster, r);
                }
                None => {
                    entries.remove(&cluster);
                }
            }
        }
        held.entry_bytes = entry_bytes;
        held.record.metadata = metadata;
        Patched::Applied
    }
}

/// What became of the held copy after a patch landed.
enum Patched {
    /// It now equals the record at the server.
    Applied,
    /// It had been replaced (re-read) while the patch was in flight, or the answer carried no
    /// version: it must be read again.
    Moved,
    /// The server kept the version although the patch changed entries of the copy: the
    /// server's record was not what the copy holds.
    Diverged,
}

/// Counts the bytes written to it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes `value` serialises to as JSON.
fn json_size<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut c = Counter(0);
    // Serialising these types into a counter cannot fail.
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

/// Bytes of one entry of the `reservations` object: `"cluster":{...}`.
fn entry_size(cluster: &str, r: &Reservation) -> usize {
    json_size(cluster) + 1 + json_size(r)
}

/// Bytes of a whole record with `metadata`, the pool and datacenter of `spec`, and `count`
/// entries of `entry_bytes` bytes together — exactly what `serde_json` makes of it.
fn record_size(
    metadata: &ObjectMeta,
    spec: &IPAMPoolRecordSpec,
    count: usize,
    entry_bytes: usize,
) -> usize {
    let shell = IPAMPoolRecord {
        metadata: metadata.clone(),
        spec: IPAMPoolRecordSpec {
            pool: spec.pool.clone(),
            datacenter: spec.datacenter.clone(),
            reservations: BTreeMap::new(),
        },
    };
    // The shell holds `{}`; the entries go inside, separated by commas.
    json_size(&shell) + entry_bytes + count.saturating_sub(1)
}

/// Why a commit did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("record {0} would exceed {MAX_RECORD_BYTES} bytes: no new allocation fits in it")]
    TooLarge(String),
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Writes the record of `key` so that it holds exactly `reservations`, conditional on the
/// version this replica last saw. On a conflict the record is re-read for the next pass.
///
/// Only the entries that differ from the held copy are sent (see [`commit_changes`]).
pub async fn commit(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    reservations: BTreeMap<String, Reservation>,
) -> Result<(), CommitError> {
    let write = {
        let records = ctx.records.lock().await;
        let held = records.map.get(key);
        let changes = match held {
            Some(h) => changes_between(&h.record.spec.reservations, reservations),
            None => reservations
                .into_iter()
                .map(|(k, v)| (k, Some(v)))
                .collect(),
        };
        prepare(held, pool, key, changes)
    };
    match write {
        Ok(w) => send(ctx, key, w).await,
        Err(e) => Err(failed(ctx, key, e).await),
    }
}

/// Writes the record of `key` with `changes` applied to the copy this replica holds (`None`
/// removes a cluster's entry), conditional on the version of that copy, like [`commit`]. For
/// callers that already know what changes: no comparison of the whole record. An empty
/// `changes` is still sent (the check that the copy is current). Without a held record, the
/// record is created with the entries of `changes`.
pub async fn commit_changes(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    changes: Changes,
) -> Result<(), CommitError> {
    let write = {
        let records = ctx.records.lock().await;
        prepare(records.map.get(key), pool, key, changes)
    };
    match write {
        Ok(w) => send(ctx, key, w).await,
        Err(e) => Err(failed(ctx, key, e).await),
    }
}

/// What turns `current` into `desired`.
fn changes_between(
    current: &BTreeMap<String, Reservation>,
    desired: BTreeMap<String, Reservation>,
) -> Changes {
    let mut changes: Changes = current
        .keys()
        .filter(|k| !desired.contains_key(*k))
        .map(|k| (k.clone(), None))
        .collect();
    for (k, v) in desired {
        if current.get(&k) != Some(&v) {
            changes.insert(k, Some(v));
        }
    }
    changes
}

/// A commit ready to send.
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
    },
}

/// Builds the write for `changes` on `held` (the held copy, if any), and applies the size
/// guard to the record it would make.
fn prepare(
    held: Option<&Held>,
    pool: &IPAMPool,
    key: &RecordKey,
    changes: Changes,
) -> Result<Write, CommitError> {
    let name = record_name(&key.0, &key.1);
    // Owned by the pool: deleting the pool removes its records (allocations a `Retain` pool
    // leaves behind are still reserved by their objects, and the records are rebuilt from them).
    let owners = Some(vec![OwnerReference {
        api_version: IPAMPool::api_version(&()).into_owned(),
        kind: IPAMPool::kind(&()).into_owned(),
        name: pool.name_any(),
        uid: pool.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
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
                reservations: changes
                    .into_iter()
                    .filter_map(|(k, v)| Some((k, v?)))
                    .collect(),
            },
        };
        if json_size(&record) > MAX_RECORD_BYTES {
            return Err(CommitError::TooLarge(name));
        }
        return Ok(Write::Create(Box::new(record)));
    };
    let current = &held.record;
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
    let size = if new_owners {
        let metadata = ObjectMeta {
            owner_references: owners,
            ..current.metadata.clone()
        };
        record_size(&metadata, &current.spec, count, entry_bytes)
    } else {
        record_size(&current.metadata, &current.spec, count, entry_bytes)
    };
    if size > MAX_RECORD_BYTES {
        return Err(CommitError::TooLarge(name));
    }
    let mut body = Map::new();
    body.insert("metadata".into(), Value::Object(meta));
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
        body.insert("spec".into(), json!({ "reservations": entries }));
    }
    Ok(Write::Patch {
        name,
        body: Value::Object(body),
        version,
        changes: kept,
        entry_bytes,
    })
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

/// `e`, after re-reading the record when it says somebody else wrote or deleted it.
async fn failed(ctx: &Context, key: &RecordKey, e: CommitError) -> CommitError {
    if matches!(&e, CommitError::Api(kube::Error::Api(s)) if s.code == 409 || s.code == 404) {
        refresh(ctx, key).await;
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
            ctx.metrics.wrote("create", "ipampoolrecords");
            match api.create(&pp, &record).await {
                Ok(written) => {
                    ctx.records.lock().await.put(written);
                    Ok(())
                }
                Err(e) => Err(failed(ctx, key, e.into()).await),
            }
        }
        Write::Patch {
            name,
            body,
            version,
            changes,
            entry_bytes,
        } => {
            let pp = PatchParams {
                field_manager: Some("kipam".into()),
                ..Default::default()
            };
            ctx.metrics.wrote("patch", "ipampoolrecords");
            // The server answers with the record's metadata only, not its entries.
            let written = match api.patch_metadata(&name, &pp, &Patch::Merge(&body)).await {
                Ok(w) => w,
                Err(e) => return Err(failed(ctx, key, e.into()).await),
            };
            let outcome = ctx.records.lock().await.patched(
                key,
                &version,
                changes,
                entry_bytes,
                written.metadata,
            );
            match outcome {
                Patched::Applied => Ok(()),
                Patched::Moved => {
                    // The patch landed on the version it was made for, so the commit holds;
                    // the copy here was replaced meanwhile and is read again.
                    refresh(ctx, key).await;
                    Ok(())
                }
                Patched::Diverged => Err(failed(
                    ctx,
                    key,
                    conflict(format!(
                        "pool record {name}: the server found nothing to change in a commit of \
                         changed entries, so its record differs from this replica's copy"
                    )),
                )
                .await),
            }
        }
    }
}

/// Deletes the record of a datacenter the pool no longer has, once no object is left there.
pub async fn remove(ctx: &Context, key: &RecordKey) -> Result<(), kube::Error> {
    let Some((name, preconditions)) = ctx.records.lock().await.map.get(key).map(|h| {
        (
            h.record.name_any(),
            Preconditions {
                resource_version: h.record.resource_version(),
                uid: h.record.uid(),
            },
        )
    }) else {
        return Ok(());
    };
    let api: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    let dp = DeleteParams {
        preconditions: Some(preconditions),
        ..Default::default()
    };
    ctx.metrics.wrote("delete", "ipampoolrecords");
    match api.delete(&name, &dp).await {
        Ok(_) => {
            ctx.records.lock().await.forget(key);
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            ctx.records.lock().await.forget(key);
            Ok(())
        }
        Err(e) => {
            refresh(ctx, key).await;
            Err(e)
        }
    }
}

/// Re-reads one record (after a conflict).
async fn refresh(ctx: &Context, key: &RecordKey) {
    let api: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    match api.get_opt(&record_name(&key.0, &key.1)).await {
        Ok(Some(r)) => ctx.records.lock().await.put(r),
        Ok(None) => ctx.records.lock().await.forget(key),
        Err(e) => {
            tracing::warn!(error = %e, pool = %key.0, datacenter = %key.1, "cannot re-read the pool record")
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
                reservations: entries,
            },
        }]);
        records
    }

    fn exact(records: &Records) -> usize {
        json_size(&records.map[&key()].record)
    }

    /// Prepares `changes` and lands them as the server would, with version `next`.
    fn land(records: &mut Records, pool: &IPAMPool, changes: Changes, next: u64) -> Value {
        let write = prepare(records.map.get(&key()), pool, &key(), changes).unwrap();
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
        let mut metadata = records.map[&key()].record.metadata.clone();
        metadata.resource_version = Some(next.to_string());
        if let Some(owners) = body["metadata"].get("ownerReferences") {
            metadata.owner_references = serde_json::from_value(owners.clone()).unwrap();
        }
        let outcome = records.patched(&key(), &version, changes, entry_bytes, metadata);
        assert!(matches!(outcome, Patched::Applied));
        body
    }

    #[test]
    fn the_size_kept_through_changes_is_the_exact_serialised_size() {
        let mut records = held((0..5).map(|i| (format!("c{i}"), range(i))).collect());
        assert_eq!(records.serialized_size(&key()), Some(exact(&records)));
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
                records.serialized_size(&key()),
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
                "spec": {"reservations": {
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
        let entries = &records.map[&key()].record.spec.reservations;
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
        let size = |n: usize| first(n).serialized_size(&key()).unwrap();
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
            prepare(records.map.get(&key()), &pool("u1"), &key(), grow),
            Err(CommitError::TooLarge(_))
        ));
        let trim = Changes::from([(entries[0].0.clone(), None)]);
        assert!(prepare(records.map.get(&key()), &pool("u1"), &key(), trim).is_ok());
    }

    #[test]
    fn a_version_kept_by_the_server_is_fine_for_a_no_op_and_a_divergence_otherwise() {
        let pool = pool("u1");
        let entries = BTreeMap::from([("a".to_string(), range(0))]);
        let mut records = held(entries.clone());
        let same = records.map[&key()].record.metadata.clone();
        let commit = |records: &mut Records, changes: Changes| {
            let Ok(Write::Patch {
                version,
                changes,
                entry_bytes,
                ..
            }) = prepare(records.map.get(&key()), &pool, &key(), changes)
            else {
                panic!("an existing record is patched");
            };
            records.patched(&key(), &version, changes, entry_bytes, same.clone())
        };
        let no_op = Changes::from([("a".to_string(), Some(range(0)))]);
        assert!(matches!(commit(&mut records, no_op), Patched::Applied));
        let added = Changes::from([("b".to_string(), Some(range(4)))]);
        assert!(matches!(commit(&mut records, added), Patched::Diverged));
        assert_eq!(records.map[&key()].record.spec.reservations, entries);
    }
}
