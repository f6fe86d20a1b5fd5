//! What the discovery reader (`crate::discover`) saw in the user clusters that adopt, for the
//! planning pass: per user cluster, the MetalLB pools typed in by hand and the addresses its
//! `LoadBalancer` Services hold ([`Discovered`]), or why it cannot be read.
//!
//! Invariants:
//! - Only user clusters the reader reads have an entry; one it stops reading is dropped.
//! - Every change of an entry (what was found, whether it is complete, readable or not) adds
//!   one to [`DiscoveryCache::generation`], marks the seed dirty and wakes the planning loop.
//!   Writing what is already there changes nothing and wakes nobody.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;

use crate::planner::adopt::Discovered;

use super::Dirty;

/// What is known of one user cluster's MetalLB setup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// Read through its kubeconfig.
    Read {
        /// When what `found` holds was last changed (seconds since the epoch); the watches
        /// keep it current from then on.
        at: i64,
        found: Discovered,
        /// Both the pool and the Service watch have listed everything at least once since
        /// the user cluster was last reachable: `found` is the whole of it, not a part.
        complete: bool,
    },
    /// It cannot be read (no Secret, a bad kubeconfig, no answer, RBAC).
    Unreadable {
        /// One line, naming what failed.
        reason: String,
        /// Since when it has been unreadable (seconds since the epoch).
        since: i64,
    },
}

impl Discovery {
    /// What was found, when the user cluster was read completely.
    pub fn complete(&self) -> Option<&Discovered> {
        match self {
            Discovery::Read {
                found,
                complete: true,
                ..
            } => Some(found),
            _ => None,
        }
    }
}

/// The discovery cache. One lock, held for map operations only.
#[derive(Debug)]
pub struct DiscoveryCache {
    inner: Mutex<BTreeMap<String, Discovery>>,
    generation: watch::Sender<u64>,
    dirty: OnceLock<Arc<Dirty>>,
}

impl Default for DiscoveryCache {
    fn default() -> Self {
        DiscoveryCache {
            inner: Mutex::new(BTreeMap::new()),
            generation: watch::Sender::new(0),
            dirty: OnceLock::new(),
        }
    }
}

impl DiscoveryCache {
    /// Changes mark `dirty` (and wake the planning loop).
    pub fn set_dirty(&self, dirty: Arc<Dirty>) {
        let _ = self.dirty.set(dirty);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Discovery>> {
        // Plain data: a panic elsewhere leaves it usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.generation.send_modify(|g| *g += 1);
        if let Some(d) = self.dirty.get() {
            d.other();
            d.wake();
        }
    }

    /// What is known of `cluster`; `None` when it is not read.
    pub fn get(&self, cluster: &str) -> Option<Discovery> {
        self.lock().get(cluster).cloned()
    }

    /// Every user cluster read, by Cluster name.
    pub fn snapshot(&self) -> BTreeMap<String, Discovery> {
        self.lock().clone()
    }

    /// Counts changes; it only grows.
    pub fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// A receiver that sees every change of [`DiscoveryCache::generation`].
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// `cluster` was read: `found`, `complete` once both watches have listed; `now` in seconds
    /// since the epoch.
    pub fn read(&self, cluster: &str, found: Discovered, complete: bool, now: i64) {
        let mut all = self.lock();
        let same = matches!(all.get(cluster),
            Some(Discovery::Read { found: f, complete: c, .. }) if *f == found && *c == complete);
        if same {
            return;
        }
        all.insert(
            cluster.to_string(),
            Discovery::Read {
                at: now,
                found,
                complete,
            },
        );
        drop(all);
        self.changed();
    }

    /// `cluster` cannot be read, for `reason`.
    pub fn unreadable(&self, cluster: &str, reason: String, now: i64) {
        let mut all = self.lock();
        let since = match all.get(cluster) {
            Some(Discovery::Unreadable { reason: r, .. }) if *r == reason => return,
            Some(Discovery::Unreadable { since, .. }) => *since,
            _ => now,
        };
        all.insert(cluster.to_string(), Discovery::Unreadable { reason, since });
        drop(all);
        self.changed();
    }

    /// Stops keeping `cluster` (no longer read).
    pub fn forget(&self, cluster: &str) {
        let removed = self.lock().remove(cluster).is_some();
        if removed {
            self.changed();
        }
    }

    /// User clusters that cannot be read, with why.
    pub fn problems(&self) -> BTreeMap<String, String> {
        self.lock()
            .iter()
            .filter_map(|(c, d)| match d {
                Discovery::Unreadable { reason, .. } => Some((c.clone(), reason.clone())),
                Discovery::Read { .. } => None,
            })
            .collect()
    }

    /// Number of user clusters kept.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::adopt::HandMadePool;

    fn found(pool: &str) -> Discovered {
        Discovered {
            pools: vec![HandMadePool {
                namespace: "metallb-system".into(),
                name: pool.into(),
                addresses: vec!["10.0.0.0/28".into()],
            }],
            services: vec![],
        }
    }

    #[test]
    fn only_changes_count_and_wake() {
        let cache = DiscoveryCache::default();
        let dirty = Arc::new(Dirty::default());
        cache.set_dirty(dirty.clone());
        let mut rx = cache.subscribe();
        cache.read("c1", found("a"), false, 100);
        assert_eq!(cache.generation(), 1);
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        assert!(dirty.take().1, "the planning pass is told");
        cache.read("c1", found("a"), false, 110);
        assert_eq!(cache.generation(), 1, "the same content again is no change");
        assert!(!dirty.take().1);
        cache.read("c1", found("a"), true, 120);
        assert_eq!(
            cache.get("c1").and_then(|d| d.complete().cloned()),
            Some(found("a"))
        );
        cache.unreadable("c1", "connection refused".into(), 130);
        cache.unreadable("c1", "timed out".into(), 140);
        assert_eq!(
            cache.get("c1"),
            Some(Discovery::Unreadable {
                reason: "timed out".into(),
                since: 130
            }),
            "unreadable since the first failure, with the latest reason"
        );
        assert_eq!(cache.generation(), 4);
        cache.forget("c1");
        assert!(cache.snapshot().is_empty());
        assert_eq!(cache.generation(), 5);
        cache.forget("c1");
        assert_eq!(cache.generation(), 5);
    }
}
