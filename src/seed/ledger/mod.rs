//! The controller's authoritative view of `IPAMAllocation`s.
//!
//! Overlap safety rests on this view never missing an allocation that exists. It is rebuilt
//! from a fresh (quorum) LIST whenever this replica becomes leader, then kept current by the
//! replica's own write responses — applied at once, before the watch reports them — and by
//! watch events. A `resourceVersion` guard makes sure a late watch event never replaces a newer
//! version of an object with an older one (for instance, showing an allocation before it grew),
//! and tombstones stop a late event from resurrecting an object this replica deleted.
//!
//! On a replica that does not lead, the watch alone keeps it. It is the only copy of the
//! allocations a replica keeps: the addon applier, the admission webhook and the REST API read
//! theirs from here ([`Ledger::in_namespace`], [`Ledger::in_pool`]) instead of watching
//! allocations themselves. Each allocation is held as a compact [`Entry`] (see `entry.rs`):
//! readers that need the whole object ask it for one.
//!
//! Resource versions are compared as integers: they are etcd revisions on a real API server
//! (and on the test stand-in). A version that does not parse is treated as newer.

mod entry;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

pub use entry::Entry;

use crate::resources::IPAMAllocation;

pub type Key = (String, String);

fn rv_of(obj: &IPAMAllocation) -> Option<u64> {
    obj.metadata.resource_version.as_deref()?.parse().ok()
}

fn key_of(obj: &IPAMAllocation) -> Key {
    (
        obj.metadata.namespace.clone().unwrap_or_default(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

/// `a` is at least as new as `b` (an unparsable version counts as newer).
fn not_older(a: Option<u64>, b: Option<u64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a >= b,
        _ => true,
    }
}

/// An entry ordered by its namespace alone: one pool's allocations, one per namespace.
#[derive(Debug)]
struct ByNamespace(Arc<Entry>);

impl PartialEq for ByNamespace {
    fn eq(&self, other: &Self) -> bool {
        self.0.namespace() == other.0.namespace()
    }
}

impl Eq for ByNamespace {}

impl PartialOrd for ByNamespace {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByNamespace {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.namespace().cmp(other.0.namespace())
    }
}

/// What happened to one key while this replica was writing it.
#[derive(Debug, Default)]
struct Flight {
    /// Writes of ours to the key not yet over.
    writes: usize,
    /// The newest version our own writes produced (their responses).
    own: Option<u64>,
    /// Our own write deleted it.
    own_delete: bool,
    /// The newest version the watch showed meanwhile.
    seen: Option<u64>,
    /// The watch showed it deleted meanwhile.
    seen_delete: bool,
}

impl Flight {
    /// Whether the watch showed something our writes do not explain: a newer version than
    /// any response of ours (somebody wrote after us), a delete we did not send, or anything
    /// at all when none of our writes got a response (they failed).
    fn saw_foreign_change(&self) -> bool {
        let newer = match (self.seen, self.own) {
            (Some(seen), Some(own)) => seen > own,
            (Some(_), None) => !self.own_delete,
            (None, _) => false,
        };
        newer || (self.seen_delete && !self.own_delete)
    }
}

#[derive(Debug, Default)]
pub struct Ledger {
    /// Every allocation by namespace, each namespace's in name order (a cluster holds one per
    /// pool, so these lists are short). The namespace is shared with the entries.
    objects: BTreeMap<Arc<str>, Vec<Arc<Entry>>>,
    /// The same entries by pool (their name), each pool's in namespace order. Changed only
    /// together with `objects` (see [`Ledger::put`] and [`Ledger::take`]). It holds no key
    /// of its own per entry: the entries order themselves by their namespace.
    by_pool: BTreeMap<Arc<str>, BTreeSet<ByNamespace>>,
    /// Keys whose content changed other than by this replica's own writes, since the last
    /// [`Ledger::take_changed`].
    changed: BTreeSet<Key>,
    /// Keys this replica is writing right now: a watch event for one of them may be the echo
    /// of that write (arriving before its response), so it is stored without being reported
    /// at once; when the write is over, whatever the watch showed that the write did not
    /// produce is reported then (see [`Flight`]).
    in_flight: HashMap<Key, Flight>,
    /// Deleted keys with the version they were deleted at.
    tombstones: HashMap<Key, u64>,
    /// Keys seen during a watch re-list, and the highest version seen then.
    relist: Option<(Vec<Key>, u64)>,
}

impl Ledger {
    /// Replaces everything with a fresh list (on becoming leader).
    pub fn reset(&mut self, objects: Vec<IPAMAllocation>) {
        self.in_flight.clear();
        self.objects.clear();
        self.by_pool.clear();
        for o in objects {
            let entry = self.entry_of(o);
            self.put(Arc::new(entry));
        }
        self.tombstones.clear();
        self.relist = None;
        self.changed.clear();
    }

    /// Every entry (shared, not copied), in key order (namespace, then name).
    pub fn snapshot(&self) -> Vec<Arc<Entry>> {
        self.objects.values().flatten().cloned().collect()
    }

    /// The keys changed by others (watch events with new content, re-reads, re-lists) since
    /// the last call.
    pub fn take_changed(&mut self) -> BTreeSet<Key> {
        std::mem::take(&mut self.changed)
    }

    fn lookup(&self, namespace: &str, name: &str) -> Option<&Arc<Entry>> {
        let list = self.objects.get(namespace)?;
        let i = list.binary_search_by(|e| e.name().cmp(name)).ok()?;
        list.get(i)
    }

    pub fn get(&self, key: &Key) -> Option<&Entry> {
        self.lookup(&key.0, &key.1).map(Arc::as_ref)
    }

    pub fn len(&self) -> usize {
        self.objects.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Any allocation held by `cluster`'s namespace.
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.objects.contains_key(namespace)
    }

    /// The allocations in `namespace` (one cluster's), by name, shared.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<Entry>> {
        self.objects.get(namespace).cloned().unwrap_or_default()
    }

    /// Allocations named after `pool` (one per cluster), by namespace.
    pub fn of_pool<'a>(&'a self, pool: &'a str) -> impl Iterator<Item = &'a Entry> + 'a {
        self.by_pool
            .get(pool)
            .into_iter()
            .flatten()
            .map(|o| o.0.as_ref())
    }

    /// The names of the pools allocations are named after (pools that exist or that went,
    /// leaving allocations kept by `reclaimPolicy: Retain`).
    pub fn pools(&self) -> impl Iterator<Item = &str> + '_ {
        self.by_pool.keys().map(|k| k.as_ref())
    }

    /// [`Ledger::of_pool`], shared, to be read after the lock is released.
    pub fn in_pool(&self, pool: &str) -> Vec<Arc<Entry>> {
        self.by_pool
            .get(pool)
            .into_iter()
            .flatten()
            .map(|o| o.0.clone())
            .collect()
    }

    /// The compact form of `obj`, its namespace and name shared with the indexes when they
    /// already hold them.
    fn entry_of(&self, obj: IPAMAllocation) -> Entry {
        let namespace = obj.metadata.namespace.as_deref().unwrap_or_default();
        let namespace = match self.objects.get_key_value(namespace) {
            Some((shared, _)) => shared.clone(),
            None => Arc::from(namespace),
        };
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        let name = match self.by_pool.get_key_value(name) {
            Some((shared, _)) => shared.clone(),
            None => Arc::from(name),
        };
        Entry::new(obj, namespace, name)
    }

    fn put(&mut self, entry: Arc<Entry>) {
        let list = self
            .objects
            .entry(entry.namespace_shared().clone())
            .or_default();
        match list.binary_search_by(|e| e.name().cmp(entry.name())) {
            Ok(i) => list[i] = entry.clone(),
            Err(i) => list.insert(i, entry.clone()),
        }
        match self.by_pool.get_mut(entry.name()) {
            Some(pool) => {
                pool.replace(ByNamespace(entry));
            }
            None => {
                self.by_pool.insert(
                    entry.name_shared().clone(),
                    BTreeSet::from([ByNamespace(entry)]),
                );
            }
        }
    }

    /// Removes `key`; true when it was held.
    fn take(&mut self, key: &Key) -> bool {
        let Some(list) = self.objects.get_mut(key.0.as_str()) else {
            return false;
        };
        let Ok(i) = list.binary_search_by(|e| e.name().cmp(&key.1)) else {
            return false;
        };
        let entry = list.remove(i);
        if list.is_empty() {
            self.objects.remove(key.0.as_str());
        }
        if let Some(pool) = self.by_pool.get_mut(key.1.as_str()) {
            pool.remove(&ByNamespace(entry));
            if pool.is_empty() {
                self.by_pool.remove(key.1.as_str());
            }
        }
        true
    }

    /// This replica starts writing `key`; [`Ledger::end_own`] when the write is over.
    pub fn begin_own(&mut self, key: &Key) {
        self.in_flight.entry(key.clone()).or_default().writes += 1;
    }

    /// The write is over. Returns true when the watch showed, meanwhile, a change our writes
    /// do not explain (somebody else edited or deleted the object right after us): it is then
    /// reported like any other change, so the pool is planned again.
    pub fn end_own(&mut self, key: &Key) -> bool {
        let Some(flight) = self.in_flight.get_mut(key) else {
            return false;
        };
        flight.writes = flight.writes.saturating_sub(1);
        if flight.writes > 0 {
            return false;
        }
        let foreign = flight.saw_foreign_change();
        self.in_flight.remove(key);
        if foreign {
            self.changed.insert(key.clone());
        }
        foreign
    }

    /// Changes not yet taken by a pass.
    pub fn has_changes(&self) -> bool {
        !self.changed.is_empty()
    }

    /// The response of this replica's own write: the plan that made it already knows it.
    pub fn apply_own(&mut self, obj: IPAMAllocation) {
        let key = key_of(&obj);
        let rv = rv_of(&obj);
        if let Some(flight) = self.in_flight.get_mut(&key) {
            flight.own = flight.own.max(rv);
        }
        self.store(obj);
    }

    /// A version of an object from the watch or a re-read. Returns true when what the
    /// planner reads of it changed (the key is then remembered for
    /// [`Ledger::take_changed`]).
    pub fn apply(&mut self, obj: IPAMAllocation) -> bool {
        let key = key_of(&obj);
        let rv = rv_of(&obj);
        let stored = self.store(obj);
        if let Some(flight) = self.in_flight.get_mut(&key) {
            // Our echo, or somebody else's change: told apart when the write is over.
            flight.seen = flight.seen.max(rv);
            return false;
        }
        if stored {
            self.changed.insert(key);
        }
        stored
    }

    /// Stores a version unless it is older; true when the content changed.
    fn store(&mut self, obj: IPAMAllocation) -> bool {
        let key = key_of(&obj);
        let rv = rv_of(&obj);
        if let Some((seen, max)) = self.relist.as_mut() {
            seen.push(key.clone());
            *max = (*max).max(rv.unwrap_or(0));
        }
        if let (Some(dead), Some(rv)) = (self.tombstones.get(&key), rv)
            && rv <= *dead
        {
            return false;
        }
        let current = self.lookup(&key.0, &key.1);
        if let Some(current) = current
            && !not_older(rv, current.version())
        {
            return false;
        }
        let entry = self.entry_of(obj);
        let changed = current.is_none_or(|c| !c.same_content(&entry));
        self.tombstones.remove(&key);
        self.put(Arc::new(entry));
        changed
    }

    /// The object is gone (our delete succeeded, or the watch said so). Returns true when
    /// the ledger still held it (for a watch event: somebody else deleted it).
    pub fn remove(&mut self, obj: &IPAMAllocation) -> bool {
        let key = key_of(obj);
        let rv = rv_of(obj);
        if let Some(current) = self.lookup(&key.0, &key.1)
            && !not_older(rv, current.version())
        {
            return false; // a newer incarnation exists
        }
        let mut held = self.take(&key);
        if let Some(flight) = self.in_flight.get_mut(&key) {
            flight.seen_delete = true;
            held = false;
        }
        if let Some(rv) = rv {
            self.tombstones.insert(key.clone(), rv);
        }
        if held {
            self.changed.insert(key);
        }
        held
    }

    /// This replica deleted the object: the plan that did it already knows.
    pub fn remove_own(&mut self, obj: &IPAMAllocation) {
        let key = key_of(obj);
        if let Some(flight) = self.in_flight.get_mut(&key) {
            flight.own_delete = true;
        }
        let was_changed = self.changed.contains(&key);
        self.remove(obj);
        if !was_changed {
            self.changed.remove(&key);
        }
    }

    /// Forgets a key whose object we know is gone (a delete answered 404).
    pub fn forget(&mut self, key: &Key) {
        if self.take(key) {
            self.changed.insert(key.clone());
        }
    }

    /// The watch starts a re-list.
    pub fn relist_started(&mut self) {
        self.relist = Some((Vec::new(), 0));
    }

    /// The re-list ended: objects it did not contain and that are not newer than anything it
    /// showed were deleted meanwhile. Newer ones are this replica's own recent writes and stay
    /// (holding addresses we might not need is safe; forgetting held ones is not).
    pub fn relist_done(&mut self) {
        let Some((seen, max)) = self.relist.take() else {
            return;
        };
        let seen: std::collections::HashSet<Key> = seen.into_iter().collect();
        let gone: Vec<Key> = self
            .objects
            .values()
            .flatten()
            .filter(|e| e.version().is_some_and(|rv| rv <= max))
            .map(|e| (e.namespace().to_string(), e.name().to_string()))
            .filter(|k| !seen.contains(k))
            .collect();
        for key in gone {
            self.take(&key);
            self.changed.insert(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(ns: &str, rv: u64, addr: &str) -> IPAMAllocation {
        let mut o = IPAMAllocation::new("metallb", Default::default());
        o.metadata.namespace = Some(ns.into());
        o.metadata.resource_version = Some(rv.to_string());
        o.spec.addresses = vec![addr.into()];
        o
    }

    fn in_pool(ns: &str, pool: &str, rv: u64) -> IPAMAllocation {
        let mut o = obj(ns, rv, "a");
        o.metadata.name = Some(pool.into());
        o
    }

    fn keys(objs: &[Arc<Entry>]) -> Vec<(String, String)> {
        objs.iter()
            .map(|o| (o.namespace().to_string(), o.name().to_string()))
            .collect()
    }

    fn pair(ns: &str, pool: &str) -> (String, String) {
        (ns.to_string(), pool.to_string())
    }

    #[test]
    fn readers_get_one_namespace_or_one_pool_and_nothing_next_to_it() {
        let mut l = Ledger::default();
        l.reset(vec![
            in_pool("cluster-a", "metallb", 1),
            in_pool("cluster-a", "nodes", 2),
            in_pool("cluster-a-1", "metallb", 3),
            in_pool("cluster-b", "metallb", 4),
            in_pool("cluster-b", "metallb-v6", 5),
            in_pool("cluster-", "metallb", 6),
        ]);
        assert_eq!(
            keys(&l.in_namespace("cluster-a")),
            vec![pair("cluster-a", "metallb"), pair("cluster-a", "nodes")]
        );
        assert!(l.in_namespace("cluster").is_empty());
        assert!(l.has_namespace("cluster-a-1") && !l.has_namespace("cluster-c"));
        assert_eq!(
            keys(&l.in_pool("metallb")),
            vec![
                pair("cluster-", "metallb"),
                pair("cluster-a", "metallb"),
                pair("cluster-a-1", "metallb"),
                pair("cluster-b", "metallb"),
            ]
        );
        assert_eq!(l.of_pool("metallb-v6").count(), 1);
        assert!(l.in_pool("metal").is_empty());

        // Every way an object leaves or changes keeps the pool index equal to the objects.
        l.apply(in_pool("cluster-c", "nodes", 7));
        l.remove(&in_pool("cluster-a", "nodes", 8));
        l.forget(&pair("cluster-b", "metallb-v6"));
        l.relist_started();
        for o in [
            ("cluster-a", "metallb"),
            ("cluster-b", "metallb"),
            ("cluster-c", "nodes"),
        ] {
            l.apply(in_pool(o.0, o.1, 9));
        }
        l.relist_done();
        let mut by_pool = keys(&l.in_pool("metallb"));
        by_pool.extend(keys(&l.in_pool("nodes")));
        by_pool.extend(keys(&l.in_pool("metallb-v6")));
        by_pool.sort();
        assert_eq!(by_pool, keys(&l.snapshot()));
        assert_eq!(
            by_pool,
            vec![
                pair("cluster-a", "metallb"),
                pair("cluster-b", "metallb"),
                pair("cluster-c", "nodes"),
            ]
        );
        l.reset(vec![in_pool("cluster-d", "nodes", 10)]);
        assert!(l.in_pool("metallb").is_empty());
        assert_eq!(keys(&l.in_pool("nodes")), vec![pair("cluster-d", "nodes")]);
    }

    #[test]
    fn late_events_never_roll_back_or_resurrect() {
        let mut l = Ledger::default();
        l.apply(obj("cluster-a", 5, "grown"));
        l.apply(obj("cluster-a", 3, "old"));
        assert_eq!(l.snapshot()[0].spec().addresses, vec!["grown"]);
        l.remove(&obj("cluster-a", 6, "grown"));
        l.apply(obj("cluster-a", 5, "grown"));
        assert_eq!(l.len(), 0);
        l.apply(obj("cluster-a", 9, "recreated"));
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn relist_drops_only_what_it_proves_deleted() {
        let mut l = Ledger::default();
        l.apply(obj("cluster-a", 3, "a"));
        l.apply(obj("cluster-b", 4, "b"));
        l.apply(obj("cluster-c", 20, "ours, newer than the list"));
        l.relist_started();
        l.apply(obj("cluster-a", 3, "a"));
        l.apply(obj("cluster-d", 10, "d"));
        l.relist_done();
        let names: Vec<String> = l
            .snapshot()
            .iter()
            .map(|o| o.namespace().to_string())
            .collect();
        assert_eq!(names, vec!["cluster-a", "cluster-c", "cluster-d"]);
    }

    #[test]
    fn echoes_of_own_writes_are_not_changes() {
        let mut l = Ledger::default();
        let key = ("cluster-a".to_string(), "metallb".to_string());
        // Our create's response, then its watch echo: nothing changed for the planner.
        l.apply_own(obj("cluster-a", 3, "a"));
        assert!(!l.apply(obj("cluster-a", 3, "a")));
        // The echo may also arrive before the response, while the write is in flight.
        l.begin_own(&key);
        assert!(!l.apply(obj("cluster-a", 4, "grown")));
        l.apply_own(obj("cluster-a", 4, "grown"));
        l.end_own(&key);
        assert!(l.take_changed().is_empty());
        // Somebody else's edit, and somebody else's delete, are changes.
        assert!(l.apply(obj("cluster-a", 5, "edited")));
        assert_eq!(
            l.take_changed().into_iter().collect::<Vec<_>>(),
            vec![key.clone()]
        );
        assert!(l.remove(&obj("cluster-a", 6, "edited")));
        assert_eq!(
            l.take_changed().into_iter().collect::<Vec<_>>(),
            vec![key.clone()]
        );
        // Our own delete is not.
        l.apply_own(obj("cluster-a", 7, "again"));
        l.remove_own(&obj("cluster-a", 7, "again"));
        assert!(!l.remove(&obj("cluster-a", 8, "again")));
        assert!(l.take_changed().is_empty());
        // Somebody else's edit landing right after our write, seen while the write is still
        // in flight: reported when the write is over.
        l.begin_own(&key);
        l.apply_own(obj("cluster-a", 10, "ours"));
        assert!(!l.apply(obj("cluster-a", 11, "edited by hand")));
        assert!(l.end_own(&key));
        assert_eq!(
            l.take_changed().into_iter().collect::<Vec<_>>(),
            vec![key.clone()]
        );
        // The same when their edit's event comes before our response.
        l.begin_own(&key);
        assert!(!l.apply(obj("cluster-a", 13, "edited by hand")));
        l.apply_own(obj("cluster-a", 12, "ours"));
        assert!(l.end_own(&key));
        assert_eq!(l.take_changed().len(), 1);
        // Somebody else's delete while ours is an update.
        l.begin_own(&key);
        l.apply_own(obj("cluster-a", 14, "ours"));
        assert!(!l.remove(&obj("cluster-a", 15, "ours")));
        assert!(l.end_own(&key));
        assert_eq!(l.take_changed().len(), 1);
        // Our own delete, its event in flight: nothing to report.
        l.apply(obj("cluster-a", 16, "again"));
        l.take_changed();
        l.begin_own(&key);
        assert!(!l.remove(&obj("cluster-a", 16, "again")));
        l.remove_own(&obj("cluster-a", 16, "again"));
        assert!(!l.end_own(&key));
        assert!(l.take_changed().is_empty());
        // managedFields are not kept.
        let mut heavy = obj("cluster-b", 9, "b");
        heavy.metadata.managed_fields = Some(vec![Default::default()]);
        l.apply(heavy);
        let b = ("cluster-b".to_string(), "metallb".to_string());
        assert!(
            l.get(&b)
                .is_some_and(|o| o.to_object().metadata.managed_fields.is_none())
        );
    }
}
