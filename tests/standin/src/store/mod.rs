//! The object store of one instance: objects per resource, the global resource version,
//! the change history watches resume from, and the write semantics of the real server
//! (preconditions, status subresource, generation, finalizers, garbage collection, namespace
//! and CRD cleanup, server-side apply ownership).

mod delete;
mod validate;
mod write;

pub(crate) use delete::{DeleteOptions, Propagation};

/// How a write treats fields its schema does not know (`fieldValidation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and say so in a `Warning` header (the real server's default).
    #[default]
    Warn,
    /// Refuse the write (400), as kubectl asks by default.
    Strict,
}

impl FieldValidation {
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        match s {
            "" | "Warn" => Ok(Self::Warn),
            "Ignore" => Ok(Self::Ignore),
            "Strict" => Ok(Self::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation must be one of Ignore, Warn or Strict, got {other:?}"
            ))),
        }
    }
}

/// Options of one write request.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WriteOptions {
    /// `dryRun=All`: validate everything, store nothing.
    pub dry_run: bool,
    pub field_validation: FieldValidation,
}

use crate::error::ApiError;
use crate::patch::FieldPath;
use crate::resources::{Registry, ResourceType, StorageKey};
use crate::selectors::Selectors;
use crate::util::{self, Ids, meta_mut, meta_str};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Namespaces every instance starts with; they cannot be deleted.
const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
/// The finalizer the real server puts on a CRD while it deletes the CRD's objects.
const CRD_CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// The kind of a stored change, as watch events name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One write, as kept in the history and sent to watchers.
#[derive(Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub kind: ChangeKind,
    pub key: StorageKey,
    /// The object after the change (for a deletion: its last state, with the deletion's rv).
    pub object: Arc<Value>,
    /// The object before the change, so watchers with selectors can tell "stopped matching".
    pub previous: Option<Arc<Value>>,
}

struct Subscriber {
    key: StorageKey,
    namespace: Option<String>,
    tx: UnboundedSender<Arc<Change>>,
}

/// Where a new watch starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WatchFrom {
    /// `resourceVersion` empty or `0`: synthetic ADDED events for what exists, then changes.
    Snapshot,
    /// Changes after this resource version.
    After(u64),
}

/// What a new watch needs: the starting state and a channel of later changes.
pub(crate) struct Subscription {
    /// Objects to announce as ADDED first (snapshot watches).
    pub initial: Vec<Arc<Value>>,
    /// Changes from the history to replay first (resumed watches).
    pub replay: Vec<Arc<Change>>,
    /// The resource version at the moment of subscribing.
    pub start_rv: u64,
    pub rx: UnboundedReceiver<Arc<Change>>,
}

/// The request a store operation serves: a resource type (at the requested version), the
/// namespace from the path, the object name and whether `/status` was addressed.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub rt: ResourceType,
    pub namespace: Option<String>,
    pub name: String,
    pub status: bool,
}

impl Target {
    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }
}

type ObjKey = (String, String);
/// Where an object lives: its storage and its `(namespace, name)`.
type Loc = (StorageKey, ObjKey);
/// Server-side apply ownership of one object: (status subresource?, manager) → owned fields.
type Owners = BTreeMap<(bool, String), BTreeSet<FieldPath>>;

/// Result of a create, update or patch: the object as the client sees it, and whether the
/// write created it (answered with 201).
pub(crate) type WriteResult = Result<(Shown, bool), ApiError>;

pub(crate) struct Store {
    pub(crate) registry: Registry,
    rv: u64,
    objects: HashMap<StorageKey, BTreeMap<ObjKey, Arc<Value>>>,
    history: VecDeque<Arc<Change>>,
    /// Watches may resume from any rv at or above this one.
    history_floor: u64,
    history_limit: Option<usize>,
    subscribers: Vec<Subscriber>,
    owners: HashMap<String, Owners>,
    /// uid → location of every stored object.
    uids: HashMap<String, Loc>,
    /// owner uid → objects whose `ownerReferences` name it.
    dependents: HashMap<String, BTreeSet<Loc>>,
    ids: Ids,
    /// `Warning` headers for the current request (unknown fields dropped).
    warnings: Vec<String>,
}

/// The object as a client sees it through `rt`: apiVersion and kind of the requested version.
pub(crate) fn present(rt: &ResourceType, obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.insert("apiVersion".into(), Value::String(rt.api_version()));
        m.insert("kind".into(), Value::String(rt.kind.clone()));
    }
    v
}

/// An object as a client sees it through a resource type, ready to answer with. It shares
/// the stored object when that already carries the requested apiVersion and kind (always,
/// for single-version types), so answering with a large object does not copy it; otherwise
/// it holds a converted copy.
#[derive(Debug, Clone)]
pub(crate) struct Shown(Arc<Value>);

impl Shown {
    pub(crate) fn new(rt: &ResourceType, obj: &Arc<Value>) -> Shown {
        let as_requested = obj.get("kind").and_then(Value::as_str) == Some(rt.kind.as_str())
            && obj.get("apiVersion").and_then(Value::as_str) == Some(rt.api_version().as_str());
        if as_requested {
            Shown(obj.clone())
        } else {
            Shown(Arc::new(present(rt, obj)))
        }
    }

    /// The object itself (copied only if it is still shared with the store).
    pub(crate) fn into_value(self) -> Value {
        Arc::unwrap_or_clone(self.0)
    }
}

impl From<Value> for Shown {
    fn from(v: Value) -> Shown {
        Shown(Arc::new(v))
    }
}

impl std::ops::Deref for Shown {
    type Target = Value;
    fn deref(&self) -> &Value {
        &self.0
    }
}

impl Store {
    pub(crate) fn new() -> Self {
        let mut s = Store {
            registry: Registry::new(),
            rv: 0,
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_floor: 0,
            history_limit: None,
            subscribers: Vec::new(),
            owners: HashMap::new(),
            uids: HashMap::new(),
            dependents: HashMap::new(),
            ids: Ids::new(),
            warnings: Vec::new(),
        };
        if let Some(rt) = s.registry.lookup("", "v1", "namespaces").cloned() {
            for ns in SYSTEM_NAMESPACES {
                let obj =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                // Cannot fail: the names are valid and the store is empty.
                let _ = s.create_object(&rt, None, obj, WriteOptions::default());
            }
        }
        s
    }

    /// The warnings of the last write, emptied.
    pub(crate) fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    pub(crate) fn ids(&mut self) -> &mut Ids {
        &mut self.ids
    }

    pub(crate) fn current_rv(&self) -> u64 {
        self.rv
    }

    /// Drops the whole change history: watches resuming from an older rv get 410 Expired.
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.history_floor = self.rv;
    }

    /// Keeps at most `limit` changes (`None`: keep everything).
    pub(crate) fn set_history_limit(&mut self, limit: Option<usize>) {
        self.history_limit = limit;
        self.trim_history();
    }

    fn trim_history(&mut self) {
        if let Some(limit) = self.history_limit {
            while self.history.len() > limit {
                if let Some(c) = self.history.pop_front() {
                    self.history_floor = c.rv;
                }
            }
        }
    }

    /// The resource version of the latest retained change of `rt` (in `ns`, when given), or
    /// the oldest version watches may resume from when none is retained.
    pub(crate) fn last_change_of(&self, rt: &ResourceType, ns: Option<&str>) -> u64 {
        let key = rt.storage_key();
        self.history
            .iter()
            .rev()
            .find(|c| c.key == key && ns.is_none_or(|n| meta_str(&c.object, "namespace") == n))
            .map_or(self.history_floor, |c| c.rv)
    }

    /// Ends every watch stream (their channels close).
    pub(crate) fn drop_subscribers(&mut self) {
        self.subscribers.clear();
    }

    fn find(&self, key: &StorageKey, ns: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(key)
            .and_then(|b| b.get(&(ns.to_string(), name.to_string())))
    }

    /// Objects of one storage key, optionally in one namespace, in key order.
    fn scan<'a>(
        &'a self,
        key: &StorageKey,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
        self.objects.get(key).into_iter().flat_map(move |b| {
            let it: Box<dyn Iterator<Item = (&ObjKey, &Arc<Value>)>> = match ns {
                Some(ns) => Box::new(
                    b.range((ns.to_string(), String::new())..)
                        .take_while(move |((n, _), _)| n == ns),
                ),
                None => Box::new(b.iter()),
            };
            it.map(|(_, v)| v)
        })
    }

    /// The stored version of a resource (its flags drive internal deletions).
    fn storage_type(&self, key: &StorageKey) -> Option<ResourceType> {
        self.registry
            .versions_of(&key.0, &key.1)
            .first()
            .map(|t| (*t).clone())
    }

    // ---------------------------------------------------------------- change recording

    fn record(&mut self, change: Change) {
        let change = Arc::new(change);
        let ns = meta_str(&change.object, "namespace").to_string();
        self.subscribers.retain(|s| {
            if s.key != change.key || s.namespace.as_ref().is_some_and(|n| *n != ns) {
                return !s.tx.is_closed();
            }
            s.tx.send(change.clone()).is_ok()
        });
        self.history.push_back(change);
        self.trim_history();
    }

    /// Stores a new state of an object under a fresh resource version.
    fn commit_put(
        &mut self,
        key: &StorageKey,
        mut obj: Value,
        previous: Option<Arc<Value>>,
    ) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv.to_string()));
        let okey = (
            meta_str(&obj, "namespace").to_string(),
            meta_str(&obj, "name").to_string(),
        );
        let arc = Arc::new(obj);
        self.objects
            .entry(key.clone())
            .or_default()
            .insert(okey.clone(), arc.clone());
        self.reindex(&(key.clone(), okey), previous.as_deref(), Some(&arc));
        let kind = if previous.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        self.record(Change {
            rv,
            kind,
            key: key.clone(),
            object: arc.clone(),
            previous,
        });
        arc
    }

    /// Keeps the uid and owner-reference indexes in step with a write (`after` is `None` for
    /// a removal).
    fn reindex(&mut self, loc: &Loc, before: Option<&Value>, after: Option<&Value>) {
        let old_owners = before.map(util::owner_uids).unwrap_or_default();
        let new_owners = after.map(util::owner_uids).unwrap_or_default();
        for o in old_owners.iter().filter(|o| !new_owners.contains(o)) {
            if let Some(set) = self.dependents.get_mut(o) {
                set.remove(loc);
                if set.is_empty() {
                    self.dependents.remove(o);
                }
            }
        }
        for o in new_owners.iter().filter(|o| !old_owners.contains(o)) {
            self.dependents
                .entry(o.clone())
                .or_default()
                .insert(loc.clone());
        }
        match after {
            Some(obj) => {
                self.uids
                    .insert(meta_str(obj, "uid").to_string(), loc.clone());
            }
            None => {
                if let Some(obj) = before {
                    self.uids.remove(meta_str(obj, "uid"));
                }
            }
        }
    }

    /// Whether an object with this uid is stored.
    fn uid_exists(&self, uid: &str) -> bool {
        self.uids.contains_key(uid)
    }

    /// Objects whose owner references name `uid`.
    fn dependents_of(&self, uid: &str) -> Vec<Loc> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Removes an object for good, then runs what follows a removal: garbage collection of
    /// dependents, finishing a terminating namespace or CRD, unregistering a CRD's types.
    fn commit_remove(
        &mut self,
        key: &StorageKey,
        mut last: Value,
        previous: Arc<Value>,
    ) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut last).insert("resourceVersion".into(), json!(rv.to_string()));
        let ns = meta_str(&last, "namespace").to_string();
        let name = meta_str(&last, "name").to_string();
        let uid = meta_str(&last, "uid").to_string();
        if let Some(b) = self.objects.get_mut(key) {
            b.remove(&(ns.clone(), name.clone()));
        }
        self.reindex(
            &(key.clone(), (ns.clone(), name.clone())),
            Some(&previous),
            None,
        );
        self.owners.remove(&uid);
        let arc = Arc::new(last);
        self.record(Change {
            rv,
            kind: ChangeKind::Deleted,
            key: key.clone(),
            object: arc.clone(),
            previous: Some(previous),
        });

        if key.0 == "apiextensions.k8s.io" && key.1 == "customresourcedefinitions" {
            self.registry.unregister_crd(&name);
            let group = util::get_dotted(&arc, "spec.group")
                .and_then(Value::as_str)
                .unwrap_or("");
            let plural = util::get_dotted(&arc, "spec.names.plural")
                .and_then(Value::as_str)
                .unwrap_or("");
            if self.registry.versions_of(group, plural).is_empty() {
                // The type is gone: its watches end (clients re-list and get 404).
                let gone: StorageKey = (group.to_string(), plural.to_string());
                self.objects.remove(&gone);
                self.subscribers.retain(|s| s.key != gone);
            }
        }
        self.collect_dependents(&uid);
        if !ns.is_empty() && self.namespace_terminating(&ns) == Some(true) {
            self.try_finish_namespace(&ns);
        }
        if let Some(crd) = self.storage_type(key).and_then(|t| t.crd) {
            self.try_finish_crd(&crd);
        }
        arc
    }

    // ---------------------------------------------------------------- reads

    pub(crate) fn get(&self, t: &Target) -> Result<Shown, ApiError> {
        self.find(&t.rt.storage_key(), t.ns(), &t.name)
            .map(|o| Shown::new(&t.rt, o))
            .ok_or_else(|| ApiError::not_found(&t.rt.group, &t.rt.plural, &t.name))
    }

    /// Lists objects; `limit` and `continue` page through them in key order.
    pub(crate) fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        sel: &Selectors,
        limit: Option<usize>,
        cont: Option<&str>,
    ) -> Result<Value, ApiError> {
        let key = rt.storage_key();
        let (list_rv, after) = match cont.filter(|c| !c.is_empty()) {
            Some(c) => {
                let bad = || ApiError::bad_request(format!("continue key is not valid: {c:?}"));
                let mut parts = c.splitn(3, '/');
                let rv: u64 = parts.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
                let kns = parts.next().ok_or_else(bad)?.to_string();
                let kname = parts.next().ok_or_else(bad)?.to_string();
                (rv, Some((kns, kname)))
            }
            None => (self.rv, None),
        };
        let mut items = Vec::new();
        let mut more = None;
        let mut remaining = 0u64;
        // A list of one name in a namespace (or of a cluster-scoped type) reads that key alone,
        // as the real server does; the selector still applies to it.
        let single = sel.fields.single_name().and_then(|name| match ns {
            Some(ns) => Some(self.find(&key, ns, name)),
            None if !rt.namespaced => Some(self.find(&key, "", name)),
            None => None,
        });
        let candidates: Box<dyn Iterator<Item = &Arc<Value>>> = match single {
            Some(one) => Box::new(one.into_iter()),
            None => Box::new(self.scan(&key, ns)),
        };
        let matching = candidates.filter(|o| {
            let past_token = after.as_ref().is_none_or(|(ans, aname)| {
                (meta_str(o, "namespace"), meta_str(o, "name")) > (ans.as_str(), aname.as_str())
            });
            past_token && sel.matches(o)
        });
        for o in matching {
            if let Some(l) = limit.filter(|l| *l > 0)
                && items.len() >= l
            {
                if more.is_none() {
                    more = Some(format!(
                        "{list_rv}/{}/{}",
                        meta_str(&items[items.len() - 1], "namespace"),
                        meta_str(&items[items.len() - 1], "name")
                    ));
                }
                remaining += 1;
                continue;
            }
            items.push(present(rt, o));
        }
        let mut metadata = json!({ "resourceVersion": list_rv.to_string() });
        if let Some(c) = more {
            metadata["continue"] = json!(c);
            metadata["remainingItemCount"] = json!(remaining);
        }
        Ok(json!({
            "apiVersion": rt.api_version(),
            "kind": rt.list_kind,
            "metadata": metadata,
            "items": items,
        }))
    }

    // ---------------------------------------------------------------- watch

    /// Registers a watcher atomically with the snapshot or replay it starts from.
    pub(crate) fn subscribe(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        from: WatchFrom,
    ) -> Result<Subscription, ApiError> {
        let key = rt.storage_key();
        let (initial, replay) = match from {
            WatchFrom::Snapshot => (self.scan(&key, ns).cloned().collect(), Vec::new()),
            WatchFrom::After(rv) => {
                if rv < self.history_floor {
                    return Err(ApiError::expired(rv, self.history_floor));
                }
                let start = self.history.partition_point(|c| c.rv <= rv);
                let replay = self
                    .history
                    .iter()
                    .skip(start)
                    .filter(|c| {
                        c.key == key && ns.is_none_or(|n| meta_str(&c.object, "namespace") == n)
                    })
                    .cloned()
                    .collect();
                (Vec::new(), replay)
            }
        };
        let (tx, rx) = unbounded_channel();
        self.subscribers.push(Subscriber {
            key,
            namespace: ns.map(str::to_string),
            tx,
        });
        Ok(Subscription {
            initial,
            replay,
            start_rv: self.rv,
            rx,
        })
    }

    // ---------------------------------------------------------------- direct access

    /// Objects of a type for test assertions (no selectors), optionally in one namespace.
    pub(crate) fn objects_of(&self, rt: &ResourceType, ns: Option<&str>) -> Vec<Value> {
        self.scan(&rt.storage_key(), ns)
            .map(|o| present(rt, o))
            .collect()
    }

    pub(crate) fn object(&self, rt: &ResourceType, ns: Option<&str>, name: &str) -> Option<Value> {
        self.find(&rt.storage_key(), ns.unwrap_or(""), name)
            .map(|o| present(rt, o))
    }

    /// Number of objects stored, all types together.
    pub(crate) fn object_count(&self) -> usize {
        self.objects.values().map(BTreeMap::len).sum()
    }

    /// Total retained history entries.
    pub(crate) fn history_len(&self) -> usize {
        self.history.len()
    }
}
