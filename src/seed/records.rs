//! The leader's copy of the `IPAMPoolRecord`s: the fence's state, loaded from a fresh
//! (quorum) LIST at every gain of leadership, then kept from this replica's own writes.
//!
//! The record of a pool datacenter is kept in shards, one object per block of the pool's
//! addresses ([`crate::reservations::shards`]). Readers (a pass's inputs) take its
//! [`Records::versions`] and [`Records::joined`] records; only the planning loop's commit
//! (`crate::planning::records`) changes it, through the crate-internal methods here, with
//! exactly what the API server answered.
//!
//! Every replica also watches the records ([`crate::seed::watches::RecordView`]) for the
//! webhook and the page, so on the leader each shard would be held twice. The copy therefore
//! holds its shards behind an `Arc`, and [`Records::share`] swaps a shard for the watch's object
//! when that is the very version it holds (the same uid and `resourceVersion`: the same state of
//! the same object at the server). Its content does not change by that, only where it lives: a
//! commit that changes a shared shard writes into a copy of its own
//! ([`Arc::make_mut`]), and the watch's object stays as the watch left it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Serialize;

use crate::address::Cidr;
use crate::reservations::shards;
use crate::resources::{IPAMPoolRecord, IPAMPoolRecordSpec, Reservation, record_name};

pub type RecordKey = (String, String);

/// Cluster name -> its new entry, or `None` to remove it.
pub type Changes = BTreeMap<String, Option<Reservation>>;

#[derive(Debug, Default)]
pub struct Records {
    /// Pool datacenter -> its shards by object name.
    pub(crate) map: BTreeMap<RecordKey, BTreeMap<String, Held>>,
    /// Pool datacenter -> its layout record (`spec.blockLength`, no entries): the division
    /// of its addresses into blocks, the same for every replica ([`shards::layout_name`]).
    pub(crate) layouts: BTreeMap<RecordKey, IPAMPoolRecord>,
    /// Shards read again from the server after a conflict so far (a count that only grows).
    pub(crate) rereads: u64,
    /// Pool datacenter -> [`Records::rereads`] when one of its shards was last read again: a
    /// commit planned before that count was on a copy that has changed under it since.
    pub(crate) reread_at: BTreeMap<RecordKey, u64>,
    /// The pools, as (name, `resourceVersion`), that a fresh list last showed exactly, and that
    /// list's revision: a later plan on the same pools is current at that revision too.
    pub(crate) pools_listed: Option<(Vec<(String, String)>, u64)>,
}

/// One shard and the summed serialised size of its entries (each `"cluster":{...}`), kept
/// up to date with every change so the size guard needs no serialisation of the whole shard.
#[derive(Debug)]
pub(crate) struct Held {
    /// The shard, shared with the record watch's cache while both hold the same version.
    pub(crate) record: Arc<IPAMPoolRecord>,
    pub(crate) entry_bytes: usize,
    /// `spec.block`, parsed (`None`: a record written before sharding, or a block that does
    /// not parse).
    pub(crate) block: Option<Cidr>,
}

impl Held {
    pub(crate) fn new(record: IPAMPoolRecord) -> Held {
        let entry_bytes = record
            .spec
            .reservations
            .iter()
            .map(|(cluster, r)| entry_size(cluster, r))
            .sum();
        let block = record.spec.block.as_deref().and_then(|b| b.parse().ok());
        Held {
            record: Arc::new(record),
            entry_bytes,
            block,
        }
    }
}

pub(crate) fn key_of(r: &IPAMPoolRecord) -> RecordKey {
    (r.spec.pool.clone(), r.spec.datacenter.clone())
}

impl Records {
    pub fn reset(&mut self, items: Vec<IPAMPoolRecord>) {
        self.map.clear();
        self.layouts.clear();
        self.reread_at.clear();
        for r in items {
            self.put(r);
        }
    }

    /// Every pool datacenter's record as one: each cluster's parts from all shards joined
    /// ([`shards::join`]). Its `resourceVersion` is the one [`Records::versions`] gives.
    pub fn snapshot(&self) -> BTreeMap<RecordKey, IPAMPoolRecord> {
        self.versions()
            .into_iter()
            .map(|(key, version)| {
                let record = IPAMPoolRecord {
                    metadata: ObjectMeta {
                        name: Some(record_name(&key.0, &key.1)),
                        resource_version: Some(version),
                        ..Default::default()
                    },
                    spec: IPAMPoolRecordSpec {
                        pool: key.0.clone(),
                        datacenter: key.1.clone(),
                        block: None,
                        reservations: self.joined(&key).collect(),
                        ..Default::default()
                    },
                };
                (key, record)
            })
            .collect()
    }

    /// Every pool datacenter held (a shard or its layout record), with its version: the
    /// versions of its shards and layout record, joined, so it changes whenever any does.
    pub fn versions(&self) -> BTreeMap<RecordKey, String> {
        let mut out: BTreeMap<RecordKey, String> = self
            .map
            .iter()
            .filter(|(_, shards)| !shards.is_empty())
            .map(|(key, shards)| {
                let version: Vec<&str> = shards
                    .values()
                    .map(|h| h.record.metadata.resource_version.as_deref().unwrap_or(""))
                    .collect();
                (key.clone(), version.join(","))
            })
            .collect();
        for (key, layout) in &self.layouts {
            let version = layout.metadata.resource_version.as_deref().unwrap_or("");
            let joined = out.entry(key.clone()).or_default();
            joined.push_str(";layout=");
            joined.push_str(version);
        }
        out
    }

    /// A record of `key` (its layout record or a shard) written in a newer format than this
    /// kipam knows, as (name, format): nothing may be committed there.
    pub fn newer_format(&self, key: &RecordKey) -> Option<(String, i32)> {
        let layout = self.layouts.get(key).into_iter();
        let shards = self.map.get(key).into_iter().flat_map(|s| s.values());
        layout
            .chain(shards.map(|h| h.record.as_ref()))
            .find_map(|r| Some((r.metadata.name.clone()?, r.spec.newer_format()?)))
    }

    /// The networks the layout record of `key` remembers (`spec.networks`), as far as they
    /// read.
    pub fn layout_networks(&self, key: &RecordKey) -> Vec<Cidr> {
        self.layouts
            .get(key)
            .map(|l| {
                l.spec
                    .networks
                    .iter()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Gives `input` the networks each of its datacenters reached before it was narrowed,
    /// as their layout records remember them (`DatacenterInput::former`): the planner groups
    /// and fences the pool over them too.
    pub fn add_former(&self, input: &mut crate::planner::PoolInput) {
        for (dc, d) in input.datacenters.iter_mut() {
            let remembered = self.layout_networks(&(input.name.clone(), dc.clone()));
            let current: Vec<Cidr> = d.config.cidrs().collect();
            d.former = shards::former_networks(&remembered, &current);
        }
    }

    /// The block length the layout record of `key` fixes, when this replica holds one.
    pub fn block_length(&self, key: &RecordKey) -> Option<i32> {
        self.layouts.get(key)?.spec.block_length
    }

    /// Notes that a shard of `key` was just read again from the server (after a conflict).
    pub(crate) fn reread(&mut self, key: &RecordKey) {
        self.rereads += 1;
        self.reread_at.insert(key.clone(), self.rereads);
    }

    /// Whether a shard of `key` was read again since [`Records::rereads`] was `mark`.
    pub(crate) fn reread_since(&self, key: &RecordKey, mark: u64) -> bool {
        self.reread_at.get(key).is_some_and(|at| *at > mark)
    }

    /// What one pool datacenter's shards reserve, each cluster's parts joined, by cluster.
    pub fn joined<'a>(
        &'a self,
        key: &RecordKey,
    ) -> impl Iterator<Item = (String, Reservation)> + use<'a> {
        let mut parts: BTreeMap<&str, Vec<&Reservation>> = BTreeMap::new();
        for held in self.map.get(key).into_iter().flat_map(|s| s.values()) {
            for (cluster, r) in &held.record.spec.reservations {
                parts.entry(cluster.as_str()).or_default().push(r);
            }
        }
        parts
            .into_iter()
            .map(|(c, p)| (c.to_string(), shards::join(p)))
    }

    /// The names of the shards held for `key`.
    pub fn shard_names(&self, key: &RecordKey) -> Vec<String> {
        self.map
            .get(key)
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// The size guard's figure for the shard `name` of `key`: what it would serialise to as
    /// held here (`None` when no such shard is held).
    pub fn serialized_size(&self, key: &RecordKey, name: &str) -> Option<usize> {
        let held = self.map.get(key)?.get(name)?;
        Some(record_size(
            &held.record.metadata,
            &held.record.spec,
            held.record.spec.format,
            held.record.spec.reservations.len(),
            held.entry_bytes,
        ))
    }

    /// Whether any record holds an entry for `cluster`.
    pub fn holds(&self, cluster: &str) -> bool {
        self.map
            .values()
            .flat_map(|s| s.values())
            .any(|h| h.record.spec.reservations.contains_key(cluster))
    }

    pub(crate) fn put(&mut self, mut r: IPAMPoolRecord) {
        // What a real API server answers carries `managedFields`, which list every entry once
        // more; nothing here reads them.
        r.metadata.managed_fields = None;
        if r.spec.block_length.is_some() {
            self.layouts.insert(key_of(&r), r);
            return;
        }
        let name = r.name_any();
        self.map
            .entry(key_of(&r))
            .or_default()
            .insert(name, Held::new(r));
    }

    /// The pool datacenter whose shard (or layout record) `name` this copy holds, with the
    /// uid `uid`.
    pub(crate) fn key_holding(&self, name: &str, uid: &str) -> Option<RecordKey> {
        let same = |r: &IPAMPoolRecord| r.metadata.uid.as_deref().unwrap_or_default() == uid;
        self.map
            .iter()
            .find(|(_, shards)| shards.get(name).is_some_and(|h| same(&h.record)))
            .map(|(key, _)| key.clone())
            .or_else(|| {
                self.layouts
                    .iter()
                    .find(|(_, l)| l.metadata.name.as_deref() == Some(name) && same(l))
                    .map(|(key, _)| key.clone())
            })
    }

    pub(crate) fn forget(&mut self, key: &RecordKey, name: &str) {
        if self.layouts.get(key).is_some_and(|l| l.name_any() == name) {
            self.layouts.remove(key);
        }
        if let Some(shards) = self.map.get_mut(key) {
            shards.remove(name);
            if shards.is_empty() {
                self.map.remove(key);
            }
        }
    }

    /// Brings the held copy of shard `name` to what a patch of it made at the server:
    /// `changes` applied (leaving `entry_bytes`) and the metadata the server answered with.
    /// Only when the copy is still the `version` the patch was conditional on.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn patched(
        &mut self,
        key: &RecordKey,
        name: &str,
        version: &str,
        changes: Changes,
        entry_bytes: usize,
        stamp: Option<i64>,
        metadata: ObjectMeta,
    ) -> Patched {
        let Some(held) = self.map.get_mut(key).and_then(|s| s.get_mut(name)) else {
            return Patched::Moved;
        };
        if held.record.metadata.resource_version.as_deref() != Some(version) {
            return Patched::Moved;
        }
        match metadata.resource_version.as_deref() {
            None | Some("") => return Patched::Moved,
            // A server does not give a new version to a write that changes nothing.
            Some(v) if v == version && (!changes.is_empty() || stamp.is_some()) => {
                return Patched::Diverged;
            }
            Some(_) => {}
        }
        let record = Arc::make_mut(&mut held.record);
        // Every write of the spec carries this kipam's record format.
        if !changes.is_empty() || stamp.is_some() {
            record.spec.format = Some(crate::resources::RECORD_FORMAT);
        }
        let entries = &mut record.spec.reservations;
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
        if stamp.is_some() {
            record.spec.pools_seen = stamp;
        }
        record.metadata = without_managed_fields(metadata);
        Patched::Applied
    }

    /// Holds the record watch's object instead of this copy's own for every shard at which
    /// `view` shows the same version (same uid and `resourceVersion`) as held here, so that the
    /// leader keeps each settled shard once. Returns how many shards it swapped.
    pub fn share(&mut self, view: &Store<IPAMPoolRecord>) -> usize {
        share_all(self.map.values_mut().flat_map(|s| s.values_mut()), view)
    }

    /// [`Records::share`] for the shards of one pool datacenter: what a commit calls after
    /// each write, so that a burst that creates and fills shards does not hold the ones it
    /// wrote before twice until the pass is over.
    pub fn share_pool(&mut self, key: &RecordKey, view: &Store<IPAMPoolRecord>) -> usize {
        share_all(
            self.map
                .get_mut(key)
                .into_iter()
                .flat_map(|s| s.values_mut()),
            view,
        )
    }
}

/// [`share_held`] for each of `shards`; how many it swapped.
fn share_all<'a>(
    shards: impl Iterator<Item = &'a mut Held>,
    view: &Store<IPAMPoolRecord>,
) -> usize {
    shards
        .filter_map(|held| share_held(held, view).then_some(()))
        .count()
}

/// Swaps `held`'s shard for `view`'s object when that is the same version; true when it did.
fn share_held(held: &mut Held, view: &Store<IPAMPoolRecord>) -> bool {
    // Held elsewhere already (by the watch's cache, as a rule).
    if Arc::strong_count(&held.record) > 1 {
        return false;
    }
    let Some(name) = held.record.metadata.name.as_deref() else {
        return false;
    };
    let Some(seen) = view.get(&ObjectRef::new(name)) else {
        return false;
    };
    let (m, mine) = (&seen.metadata, &held.record.metadata);
    let same = m.uid == mine.uid
        && m.resource_version == mine.resource_version
        && m.resource_version.as_deref().is_some_and(|v| !v.is_empty());
    if same {
        held.record = seen;
    }
    same
}

fn without_managed_fields(mut metadata: ObjectMeta) -> ObjectMeta {
    metadata.managed_fields = None;
    metadata
}

impl Records {
    /// Brings the held copy of shard `name` to what a raise of its fence to `fence` made at
    /// the server. Only when the copy is still the `version` the raise was conditional on and
    /// the server gave a new version.
    pub(crate) fn fenced(
        &mut self,
        key: &RecordKey,
        name: &str,
        version: &str,
        fence: i64,
        stamp: Option<i64>,
        metadata: ObjectMeta,
    ) -> Patched {
        let Some(held) = self.map.get_mut(key).and_then(|s| s.get_mut(name)) else {
            return Patched::Moved;
        };
        if held.record.metadata.resource_version.as_deref() != Some(version) {
            return Patched::Moved;
        }
        raised(
            Arc::make_mut(&mut held.record),
            version,
            fence,
            stamp,
            metadata,
        )
    }
}

impl Records {
    /// Brings the held copy of `key`'s layout record to what a raise of its fence made at the
    /// server, like [`Records::fenced`] for a shard.
    pub(crate) fn layout_fenced(
        &mut self,
        key: &RecordKey,
        version: &str,
        fence: i64,
        stamp: Option<i64>,
        metadata: ObjectMeta,
    ) -> Patched {
        let Some(layout) = self.layouts.get_mut(key) else {
            return Patched::Moved;
        };
        if layout.metadata.resource_version.as_deref() != Some(version) {
            return Patched::Moved;
        }
        let outcome = raised(layout, version, fence, stamp, metadata);
        if matches!(outcome, Patched::Applied) {
            layout.spec.format = Some(crate::resources::RECORD_FORMAT);
        }
        outcome
    }
}

impl Records {
    /// Brings the held copy of `key`'s layout record to what a write of its networks and pool
    /// generation made at the server (which answered `metadata`).
    pub(crate) fn layout_kept(
        &mut self,
        key: &RecordKey,
        version: &str,
        networks: Vec<String>,
        generation: i64,
        stamp: Option<i64>,
        metadata: ObjectMeta,
    ) -> Patched {
        let Some(layout) = self.layouts.get_mut(key) else {
            return Patched::Moved;
        };
        if layout.metadata.resource_version.as_deref() != Some(version) {
            return Patched::Moved;
        }
        match metadata.resource_version.as_deref() {
            None | Some("") => return Patched::Moved,
            Some(v) if v == version => return Patched::Diverged,
            Some(_) => {}
        }
        layout.spec.networks = networks;
        layout.spec.pool_generation = Some(generation);
        layout.spec.format = Some(crate::resources::RECORD_FORMAT);
        if stamp.is_some() {
            layout.spec.pools_seen = stamp;
        }
        layout.metadata = without_managed_fields(metadata);
        Patched::Applied
    }
}

/// `record` (held at `version`) as a raise of its fence to `fence` made it at the server,
/// which answered `metadata`.
fn raised(
    record: &mut IPAMPoolRecord,
    version: &str,
    fence: i64,
    stamp: Option<i64>,
    metadata: ObjectMeta,
) -> Patched {
    match metadata.resource_version.as_deref() {
        None | Some("") => return Patched::Moved,
        Some(v) if v == version => return Patched::Diverged,
        Some(_) => {}
    }
    record.spec.fence = Some(fence);
    if stamp.is_some() {
        record.spec.pools_seen = stamp;
    }
    record.metadata = without_managed_fields(metadata);
    Patched::Applied
}

/// What became of the held copy after a patch landed.
pub(crate) enum Patched {
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
pub(crate) fn json_size<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut c = Counter(0);
    // Serialising these types into a counter cannot fail.
    let _ = serde_json::to_writer(&mut c, value);
    c.0
}

/// Bytes of one entry of the `reservations` object: `"cluster":{...}`.
pub(crate) fn entry_size(cluster: &str, r: &Reservation) -> usize {
    json_size(cluster) + 1 + json_size(r)
}

/// Bytes of a whole record with `metadata`, the pool, datacenter and block of `spec`, and
/// `count` entries of `entry_bytes` bytes together — exactly what `serde_json` makes of it.
pub(crate) fn record_size(
    metadata: &ObjectMeta,
    spec: &IPAMPoolRecordSpec,
    format: Option<i32>,
    count: usize,
    entry_bytes: usize,
) -> usize {
    let shell = IPAMPoolRecord {
        metadata: metadata.clone(),
        spec: IPAMPoolRecordSpec {
            pool: spec.pool.clone(),
            datacenter: spec.datacenter.clone(),
            block: spec.block.clone(),
            reservations: BTreeMap::new(),
            fence: spec.fence,
            pools_seen: spec.pools_seen,
            block_length: spec.block_length,
            networks: spec.networks.clone(),
            pool_generation: spec.pool_generation,
            format,
        },
    };
    // The shell holds `{}`; the entries go inside, separated by commas.
    json_size(&shell) + entry_bytes + count.saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::*;

    const NAME: &str = "p-0";

    fn key() -> RecordKey {
        ("p".into(), "dc-1".into())
    }

    fn entry(i: u8) -> Reservation {
        Reservation {
            cidr: None,
            addresses: vec![format!("10.0.0.{i}-10.0.0.{i}")],
        }
    }

    fn shard(uid: &str, version: &str, clusters: &[(&str, u8)]) -> IPAMPoolRecord {
        IPAMPoolRecord {
            metadata: ObjectMeta {
                name: Some(NAME.into()),
                uid: Some(uid.into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            spec: IPAMPoolRecordSpec {
                pool: "p".into(),
                datacenter: "dc-1".into(),
                block: Some("10.0.0.0/24".into()),
                reservations: clusters
                    .iter()
                    .map(|(c, i)| (c.to_string(), entry(*i)))
                    .collect(),
                // As kipam writes it.
                format: Some(crate::resources::RECORD_FORMAT),
                ..Default::default()
            },
        }
    }

    fn held(records: &Records) -> &Arc<IPAMPoolRecord> {
        &records.map[&key()][NAME].record
    }

    /// A shard the watch shows at the version the leader holds is kept once: the leader then
    /// holds the watch's object. A commit still changes only the leader's copy, and a version
    /// the watch has not reached yet, or another object by the same name, is not shared.
    #[test]
    fn a_shard_the_watch_shows_at_the_same_version_is_held_once() {
        let (store, mut writer) = reflector::store::<IPAMPoolRecord>();
        let mut records = Records::default();
        records.reset(vec![shard("u1", "5", &[("a", 1)])]);

        // The watch has not seen the shard yet: nothing to share.
        assert_eq!(records.share(&store), 0);
        // The same name under another uid (deleted and created again) is another object.
        writer.apply_watcher_event(&Event::Apply(shard("u2", "5", &[("a", 1)])));
        assert_eq!(records.share(&store), 0);

        writer.apply_watcher_event(&Event::Apply(shard("u1", "5", &[("a", 1)])));
        assert_eq!(records.share(&store), 1);
        let seen = store
            .get(&ObjectRef::new(NAME))
            .expect("in the watch's cache");
        assert!(Arc::ptr_eq(held(&records), &seen), "one object, not two");
        assert_eq!(records.share(&store), 0, "already shared");

        // A commit adds `b`: the leader's copy changes, the watch's object does not.
        let changes = Changes::from([("b".to_string(), Some(entry(2)))]);
        let bytes = entry_size("a", &entry(1)) + entry_size("b", &entry(2));
        let answer = ObjectMeta {
            name: Some(NAME.into()),
            uid: Some("u1".into()),
            resource_version: Some("6".into()),
            ..Default::default()
        };
        assert!(matches!(
            records.patched(&key(), NAME, "5", changes, bytes, None, answer),
            Patched::Applied
        ));
        assert_eq!(
            serde_json::to_value(&**held(&records)).unwrap(),
            serde_json::to_value(shard("u1", "6", &[("a", 1), ("b", 2)])).unwrap()
        );
        assert_eq!(
            serde_json::to_value(&*seen).unwrap(),
            serde_json::to_value(shard("u1", "5", &[("a", 1)])).unwrap()
        );
        // The watch is one version behind: the leader keeps its own.
        assert_eq!(records.share(&store), 0);
        writer.apply_watcher_event(&Event::Apply(shard("u1", "6", &[("a", 1), ("b", 2)])));
        // What a commit does after each write: the shards of that pool datacenter only.
        assert_eq!(records.share_pool(&("q".into(), "dc-1".into()), &store), 0);
        assert_eq!(records.share_pool(&key(), &store), 1);
    }

    /// What a real API server answers carries `managedFields`; the copy does not keep them.
    #[test]
    fn the_copy_keeps_no_managed_fields() {
        let mut with_fields = shard("u1", "5", &[("a", 1)]);
        with_fields.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kipam".into()),
            ..Default::default()
        }]);
        let mut records = Records::default();
        records.put(with_fields);
        assert_eq!(held(&records).metadata.managed_fields, None);
        let answer = ObjectMeta {
            resource_version: Some("6".into()),
            managed_fields: Some(vec![ManagedFieldsEntry::default()]),
            ..held(&records).metadata.clone()
        };
        assert!(matches!(
            records.fenced(&key(), NAME, "5", 3, None, answer),
            Patched::Applied
        ));
        assert_eq!(held(&records).metadata.managed_fields, None);
        assert_eq!(held(&records).spec.fence, Some(3));
    }
}
