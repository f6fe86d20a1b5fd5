//! Drift repair between resyncs: the leader watches, in every user cluster it serves, the
//! objects it applied there, and syncs the cluster again as soon as one of them is changed or
//! deleted by someone else.
//!
//! - One watch per kind and namespace kipam applied to (for the `metallb` addon: two per user
//!   cluster), selected by the label [`ADDON_LABEL`], metadata only: the user cluster sends
//!   names, uids, generations, resource versions, labels and annotations, never a spec.
//! - Nothing is cached but a [`Stamp`] per applied object: what kipam's own apply returned.
//! - An object has drifted when its generation is past the one kipam's apply returned (its
//!   spec changed; a label, an annotation or a status written by someone else does not move
//!   the generation), when a label or annotation kipam renders has another value or is gone,
//!   or when the object is gone or was made again by someone else. Kinds without a
//!   generation compare the resource version instead.
//! - While a sync of the cluster runs, what the watches see is only noted, and judged when it
//!   ends, against what that sync applied: the echo of kipam's own apply is never drift.
//! - Drift that keeps coming back right after each repair (another writer setting the same
//!   fields) is repaired at once five times in a row, then after 200 ms, doubling up to 30 s,
//!   and said once: kipam does not fight another controller in a tight loop.
//! - A failing watch is retried with kube's capped, growing backoff (0.8 s doubling to 30 s),
//!   said once in the log and shown in `kipam_addon_drift_watches{state="failing"}`; it holds
//!   nothing up, and the periodic resync still repairs that cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::metrics::Metrics;
use crate::render::ADDON_LABEL;
use crate::resources::AppliedObject;
use crate::seed::tenant_watch::{self, Params};
use crate::seed::{backoff, preconditions};

/// Drift found again within this long of the last repair counts as the same streak.
const STREAK: Duration = Duration::from_secs(10);
/// Repairs of one streak made at once, before the delays start.
const AT_ONCE: u32 = 5;

/// How long the repair waits when it is the `streak`-th of a streak (0 for the first).
pub fn repair_delay(streak: u32) -> Duration {
    if streak < AT_ONCE {
        Duration::ZERO
    } else {
        backoff::delay(streak - AT_ONCE + 1)
    }
}

/// What a drift watch receives of an object: its metadata.
type Meta = PartialObjectMeta<DynamicObject>;

/// What kipam's own server-side apply of one object returned, and the labels and annotations
/// it sent: the state a watch event is compared with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    uid: String,
    generation: Option<i64>,
    resource_version: String,
    /// `(key, value)` of every label kipam sent.
    labels: Vec<(String, String)>,
    /// `(key, value)` of every annotation kipam sent.
    annotations: Vec<(String, String)>,
}

impl Stamp {
    /// The stamp of an apply: `answer` is what the user cluster returned, `sent` the object
    /// kipam applied.
    pub fn of(answer: &DynamicObject, sent: &Value) -> Stamp {
        let pairs = |field: &str| -> Vec<(String, String)> {
            sent["metadata"][field]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        };
        Stamp {
            uid: answer.metadata.uid.clone().unwrap_or_default(),
            generation: answer.metadata.generation,
            resource_version: answer.metadata.resource_version.clone().unwrap_or_default(),
            labels: pairs("labels"),
            annotations: pairs("annotations"),
        }
    }
}

/// What a watch saw of an object kipam applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Present {
        uid: String,
        generation: Option<i64>,
        resource_version: String,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
    },
    /// Deleted, or no longer carrying the label (`uid` when the event named one), or missing
    /// from a fresh list (`None`).
    Gone { uid: Option<String> },
}

impl Seen {
    fn present(meta: &kube::core::ObjectMeta) -> Seen {
        Seen::Present {
            uid: meta.uid.clone().unwrap_or_default(),
            generation: meta.generation,
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
        }
    }
}

/// How the object differs from what kipam applied, if it does.
pub fn drift(stamp: &Stamp, seen: &Seen) -> Option<&'static str> {
    match seen {
        Seen::Gone { uid } => uid
            .as_ref()
            .is_none_or(|u| *u == stamp.uid)
            .then_some("deleted (or its label removed)"),
        Seen::Present {
            uid,
            generation,
            resource_version,
            labels,
            annotations,
        } => {
            if *uid != stamp.uid {
                return Some("deleted and made again by someone else");
            }
            let changed = match (generation, stamp.generation) {
                (Some(now), Some(applied)) => *now > applied,
                _ => *resource_version != stamp.resource_version,
            };
            if changed {
                return Some("changed");
            }
            let differs = |mine: &[(String, String)], theirs: &BTreeMap<String, String>| {
                mine.iter().any(|(k, v)| theirs.get(k) != Some(v))
            };
            if differs(&stamp.labels, labels) || differs(&stamp.annotations, annotations) {
                return Some("a label or annotation kipam sets changed");
            }
            None
        }
    }
}

/// One watch: a kind in a namespace (empty for a cluster-scoped kind).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct WatchKey {
    api_version: String,
    kind: String,
    namespace: String,
}

impl WatchKey {
    fn of(object: &AppliedObject) -> WatchKey {
        WatchKey {
            api_version: object.api_version.clone(),
            kind: object.kind.clone(),
            namespace: object.namespace.clone(),
        }
    }

    fn object(&self, name: &str) -> AppliedObject {
        AppliedObject {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: name.to_string(),
        }
    }

    fn describe(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} ({})", self.kind, self.api_version)
        } else {
            format!("{} ({}) in {}", self.kind, self.api_version, self.namespace)
        }
    }
}

/// A watch task, stopped when dropped.
struct Task(JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One watch of a user cluster: its kind and namespace, the resource it reads (once a sync
/// has looked the kind up; kept across a new kubeconfig, whose first sync may apply nothing
/// and so look up no kind) and its task.
struct Watch {
    key: WatchKey,
    resource: Option<(ApiResource, bool)>,
    task: Option<Task>,
}

/// What the drift watches know of one user cluster. Kept small: at 10,000 user clusters each
/// KiB here is 10 MiB (a map of two entries is a vector, not a tree with room for eleven).
#[derive(Default)]
struct Watched {
    /// Per object, what kipam's last apply of it returned: the sync's own map, shared.
    stamps: Arc<BTreeMap<AppliedObject, Stamp>>,
    /// A sync of this cluster is running.
    syncing: bool,
    /// What the watches saw while it ran, judged when it ends.
    seen_while_syncing: BTreeMap<AppliedObject, Seen>,
    /// Drift was found: the cluster is synced again in full once `repair_at` has come.
    drifted: bool,
    repair_at: Option<Instant>,
    /// Drift found one after the other, each within [`STREAK`] of the repair before.
    streak: u32,
    /// When the last repair was due.
    last_repair: Option<Instant>,
    /// The kubeconfig the watches' client comes from (`TenantClient::source`).
    source: String,
    client: Option<Client>,
    watches: Vec<Watch>,
}

/// What a finished sync leaves for the drift watches: its client configuration and what it
/// applied.
pub struct Applied<'a> {
    /// Where the configuration comes from; a new source restarts the watches.
    pub source: &'a str,
    /// The user cluster's shared client (HTTP/2: the watches are streams on its connection).
    pub client: &'a Client,
    /// Discovery's answers, `apiVersion` -> resources.
    pub kinds: &'a HashMap<String, Vec<(ApiResource, ApiCapabilities)>>,
    pub stamps: &'a Arc<BTreeMap<AppliedObject, Stamp>>,
}

/// The drift watches of every user cluster this replica serves as the leader.
pub struct Drift {
    clusters: Mutex<HashMap<String, Watched>>,
    /// Wakes the scheduler when drift is found.
    wake: Arc<Notify>,
    metrics: Arc<Metrics>,
    /// Handed to the watch tasks, which must not keep this alive.
    this: Weak<Drift>,
}

impl Drift {
    pub fn new(metrics: Arc<Metrics>, wake: Arc<Notify>) -> Arc<Drift> {
        Arc::new_cyclic(|this| Drift {
            clusters: Mutex::new(HashMap::new()),
            wake,
            metrics,
            this: this.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Watched>> {
        // A panic while holding the lock leaves plain data behind, still usable.
        self.clusters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drift was found in this cluster since its last sync began, and its repair is due.
    pub fn drifted(&self, cluster: &str) -> bool {
        let now = Instant::now();
        self.lock()
            .get(cluster)
            .is_some_and(|w| w.drifted && w.repair_at.is_none_or(|at| at <= now))
    }

    /// Time until the earliest repair that waits is due.
    pub fn next_due(&self) -> Option<Duration> {
        let now = Instant::now();
        self.lock()
            .values()
            .filter(|w| w.drifted)
            .filter_map(|w| w.repair_at)
            .map(|at| at.saturating_duration_since(now))
            .min()
    }

    /// A sync of this cluster starts: from now on, what the watches see waits for its end.
    pub fn sync_started(&self, cluster: &str) {
        if let Some(w) = self.lock().get_mut(cluster) {
            w.syncing = true;
            w.drifted = false;
            w.repair_at = None;
            w.seen_while_syncing.clear();
        }
    }

    /// A sync of this cluster ended with what it applied: what the watches saw meanwhile is
    /// judged against it, and the watches follow the kinds and namespaces it applied to.
    pub fn sync_ended(&self, cluster: &str, applied: Applied<'_>) {
        let mut clusters = self.lock();
        if applied.stamps.is_empty() {
            // Nothing applied there (or no longer served): nothing to watch.
            clusters.remove(cluster);
            return;
        }
        let w = clusters.entry(cluster.to_string()).or_default();
        w.syncing = false;
        w.stamps = applied.stamps.clone();
        let seen = std::mem::take(&mut w.seen_while_syncing);
        for (object, seen) in seen {
            if let Some(how) = w.stamps.get(&object).and_then(|s| drift(s, &seen)) {
                self.found(cluster, w, &object, how);
                break;
            }
        }
        if w.source != applied.source {
            for watch in &mut w.watches {
                watch.task = None;
            }
            w.client = None;
            w.source = applied.source.to_string();
        }
        let wanted: BTreeSet<WatchKey> = w.stamps.keys().map(WatchKey::of).collect();
        w.watches.retain(|watch| wanted.contains(&watch.key));
        for key in wanted {
            let found = applied.kinds.get(&key.api_version).and_then(|rs| {
                rs.iter()
                    .find(|(r, _)| r.kind == key.kind && !r.plural.contains('/'))
            });
            let i = match w.watches.iter().position(|watch| watch.key == key) {
                Some(i) => i,
                None => {
                    w.watches.push(Watch {
                        key: key.clone(),
                        resource: None,
                        task: None,
                    });
                    w.watches.len() - 1
                }
            };
            if let Some((resource, caps)) = found {
                let namespaced = caps.scope == Scope::Namespaced;
                w.watches[i].resource = Some((resource.clone(), namespaced));
            }
            if w.watches[i].task.is_some() {
                continue;
            }
            let Some((resource, namespaced)) = w.watches[i].resource.clone() else {
                continue;
            };
            let client = w
                .client
                .get_or_insert_with(|| applied.client.clone())
                .clone();
            // Metadata only: the user cluster sends no spec, and nothing is kept but a stamp.
            let api: Api<Meta> = if namespaced {
                Api::namespaced_with(client, &key.namespace, &resource)
            } else {
                Api::all_with(client, &resource)
            };
            let task = tokio::spawn(watch(
                self.this.clone(),
                self.metrics.clone(),
                cluster.to_string(),
                key.clone(),
                api,
            ));
            w.watches[i].task = Some(Task(task));
        }
    }

    /// Stops watching this cluster.
    pub fn stop(&self, cluster: &str) {
        self.lock().remove(cluster);
    }

    /// Stops every watch: this replica no longer leads.
    pub fn stop_all(&self) {
        self.lock().clear();
    }

    /// Keeps only the clusters `keep` says yes to.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|name, _| keep(name));
    }

    /// A watch saw an object.
    fn observe(&self, cluster: &str, object: AppliedObject, seen: Seen) {
        let mut clusters = self.lock();
        let Some(w) = clusters.get_mut(cluster) else {
            return;
        };
        if w.syncing {
            // Kept even before this process applied it: the running sync may be creating it.
            w.seen_while_syncing.insert(object, seen);
            return;
        }
        if let Some(how) = w.stamps.get(&object).and_then(|s| drift(s, &seen)) {
            self.found(cluster, w, &object, how);
        }
    }

    /// A watch listed its kind afresh: an applied object missing from the list is gone.
    fn listed(&self, cluster: &str, key: &WatchKey, names: &BTreeSet<String>) {
        let missing: Vec<AppliedObject> = {
            let clusters = self.lock();
            let Some(w) = clusters.get(cluster) else {
                return;
            };
            w.stamps
                .keys()
                .filter(|o| WatchKey::of(o) == *key && !names.contains(&o.name))
                .cloned()
                .collect()
        };
        for object in missing {
            self.observe(cluster, object, Seen::Gone { uid: None });
        }
    }

    /// Drift found: the cluster is synced in full once its repair is due. Said once per repair.
    fn found(&self, cluster: &str, w: &mut Watched, object: &AppliedObject, how: &str) {
        if w.drifted {
            return;
        }
        let now = Instant::now();
        w.streak = match w.last_repair {
            Some(at) if now.saturating_duration_since(at) < STREAK => w.streak.saturating_add(1),
            _ => 0,
        };
        let wait = repair_delay(w.streak);
        w.drifted = true;
        w.repair_at = Some(now + wait);
        w.last_repair = w.repair_at;
        self.metrics.addon_drift_repairs.inc();
        let name = if object.namespace.is_empty() {
            object.name.clone()
        } else {
            format!("{}/{}", object.namespace, object.name)
        };
        let object = format!("{} {name}", object.kind);
        if w.streak == AT_ONCE {
            tracing::warn!(cluster = %cluster, object = %object, "an object kipam applied keeps being {how} in the user cluster, as if another writer set the same fields; repairing it with growing delays, up to {} s", backoff::delay(u32::MAX).as_secs());
        } else if w.streak < AT_ONCE {
            tracing::info!(cluster = %cluster, object = %object, "an object kipam applied was {how} in the user cluster; applying again");
        }
        self.wake.notify_one();
    }
}

/// The reason and one line of text for a watch error (never a dump of the error's fields).
fn describe(e: &watcher::Error) -> (&'static str, String) {
    let api = |e: &kube::Error| match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    };
    match e {
        watcher::Error::InitialListFailed(e) => {
            (preconditions::reason(e), format!("list failed: {}", api(e)))
        }
        watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => (
            preconditions::reason(e),
            format!("watch failed: {}", api(e)),
        ),
        watcher::Error::WatchError(s) => (
            "WatchError",
            format!("watch failed: {} {}: {}", s.code, s.reason, s.message),
        ),
        watcher::Error::NoResourceVersion => ("Other", e.to_string()),
    }
}

/// Holds one watch's place in `kipam_addon_drift_watches`, by state.
struct Gauge {
    metrics: Arc<Metrics>,
    failing: bool,
}

impl Gauge {
    fn new(metrics: Arc<Metrics>) -> Gauge {
        metrics.drift_watches("watching").inc();
        Gauge {
            metrics,
            failing: false,
        }
    }

    fn state(failing: bool) -> &'static str {
        if failing { "failing" } else { "watching" }
    }

    fn set(&mut self, failing: bool) {
        if self.failing != failing {
            self.metrics.drift_watches(Self::state(self.failing)).dec();
            self.metrics.drift_watches(Self::state(failing)).inc();
            self.failing = failing;
        }
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        self.metrics.drift_watches(Self::state(self.failing)).dec();
    }
}

/// One watch, until its task is stopped. The watcher retries on its own, with backoff.
async fn watch(
    drift: Weak<Drift>,
    metrics: Arc<Metrics>,
    cluster: String,
    key: WatchKey,
    api: Api<Meta>,
) {
    let mut gauge = Gauge::new(metrics);
    let params = Params {
        labels: Some(ADDON_LABEL.to_string()),
        ..Params::default()
    };
    let mut events = tenant_watch::watch(api, params).default_backoff().boxed();
    let mut failing: Option<&'static str> = None;
    let mut names = BTreeSet::new();
    while let Some(event) = events.next().await {
        let Some(drift) = drift.upgrade() else {
            return;
        };
        let name = |m: &Meta| m.metadata.name.clone().unwrap_or_default();
        match event {
            Err(e) => {
                gauge.set(true);
                let (reason, text) = describe(&e);
                if failing != Some(reason) {
                    let hint = if reason == "Forbidden" {
                        " (grant the kubeconfig's user list and watch on this kind, see docs/multicluster.md)"
                    } else {
                        ""
                    };
                    tracing::warn!(cluster = %cluster, watch = %key.describe(), reason, "drift watch failed: {text}{hint}; retrying with backoff, the resync repairs drift meanwhile");
                    failing = Some(reason);
                }
            }
            Ok(Event::Init) => names.clear(),
            Ok(Event::InitApply(m)) => {
                names.insert(name(&m));
                drift.observe(&cluster, key.object(&name(&m)), Seen::present(&m.metadata));
            }
            Ok(Event::InitDone) => {
                drift.listed(&cluster, &key, &names);
                names.clear();
                gauge.set(false);
                if failing.take().is_some() {
                    tracing::info!(cluster = %cluster, watch = %key.describe(), "drift watch works again");
                }
            }
            Ok(Event::Apply(m)) => {
                drift.observe(&cluster, key.object(&name(&m)), Seen::present(&m.metadata));
            }
            Ok(Event::Delete(m)) => {
                let uid = m.metadata.uid.clone();
                drift.observe(&cluster, key.object(&name(&m)), Seen::Gone { uid });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(generation: Option<i64>) -> Stamp {
        Stamp {
            uid: "u1".into(),
            generation,
            resource_version: "10".into(),
            labels: vec![(ADDON_LABEL.into(), "metallb".into())],
            annotations: Vec::new(),
        }
    }

    fn seen(uid: &str, generation: Option<i64>, rv: &str, labels: &[(&str, &str)]) -> Seen {
        Seen::Present {
            uid: uid.into(),
            generation,
            resource_version: rv.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: BTreeMap::new(),
        }
    }

    const MINE: (&str, &str) = (ADDON_LABEL, "metallb");

    #[test]
    fn the_echo_of_kipams_apply_and_changes_to_others_fields_are_not_drift() {
        let s = stamp(Some(3));
        // The echo, an older event, a status write or someone else's label: same generation.
        assert_eq!(drift(&s, &seen("u1", Some(3), "10", &[MINE])), None);
        assert_eq!(drift(&s, &seen("u1", Some(2), "9", &[MINE])), None);
        assert_eq!(
            drift(&s, &seen("u1", Some(3), "12", &[MINE, ("team", "x")])),
            None
        );
        // The old object's deletion, seen after kipam made it again.
        assert_eq!(
            drift(
                &s,
                &Seen::Gone {
                    uid: Some("u0".into())
                }
            ),
            None
        );
    }

    #[test]
    fn spec_edits_deletions_and_kipams_labels_are_drift() {
        let s = stamp(Some(3));
        assert!(drift(&s, &seen("u1", Some(4), "11", &[MINE])).is_some());
        assert!(drift(&s, &Seen::Gone { uid: None }).is_some());
        assert!(
            drift(
                &s,
                &Seen::Gone {
                    uid: Some("u1".into())
                }
            )
            .is_some()
        );
        assert!(drift(&s, &seen("u2", Some(1), "20", &[MINE])).is_some());
        assert!(drift(&s, &seen("u1", Some(3), "11", &[(ADDON_LABEL, "other")])).is_some());
    }

    #[test]
    fn drift_that_keeps_coming_back_is_repaired_with_growing_delays() {
        assert_eq!(repair_delay(0), Duration::ZERO);
        assert_eq!(repair_delay(AT_ONCE - 1), Duration::ZERO);
        assert_eq!(repair_delay(AT_ONCE), Duration::from_millis(200));
        assert_eq!(repair_delay(AT_ONCE + 1), Duration::from_millis(400));
        assert_eq!(repair_delay(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn kinds_without_a_generation_compare_the_resource_version() {
        let s = stamp(None);
        assert_eq!(drift(&s, &seen("u1", None, "10", &[MINE])), None);
        assert!(drift(&s, &seen("u1", None, "11", &[MINE])).is_some());
    }

    #[test]
    fn a_stamp_keeps_what_kipam_sent_and_what_the_cluster_answered() {
        let mut answer = DynamicObject::new(
            "pool",
            &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        answer.metadata.uid = Some("u1".into());
        answer.metadata.generation = Some(2);
        answer.metadata.resource_version = Some("7".into());
        let sent = serde_json::json!({"metadata": {"name": "pool",
            "labels": {ADDON_LABEL: "metallb"}, "annotations": {"a": "b"}}});
        let s = Stamp::of(&answer, &sent);
        assert_eq!(s.generation, Some(2));
        assert_eq!(
            s.labels,
            vec![(ADDON_LABEL.to_string(), "metallb".to_string())]
        );
        assert_eq!(s.annotations, vec![("a".to_string(), "b".to_string())]);
    }
}
