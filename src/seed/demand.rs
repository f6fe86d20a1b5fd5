//! What the demand reader (`crate::demand`) saw in the user clusters, for the planning pass.
//!
//! Per user cluster: whether its Services could be read, the LoadBalancer Services that wait
//! for an address from kipam's pool (since when, refused by MetalLB or not), the addresses
//! Services hold, and the addresses some Service let go of since the last pass took them.
//! Every change that matters to growth moves the cache's [`generation`](DemandCache::generation)
//! and wakes the planning loop, which decides growth again (without planning the rest of the
//! seed). Only what the growth decision needs is kept: a few numbers per Service.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::planner::growth::{Demand, Waiting};

use super::Dirty;

/// What one Service asks of kipam's pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceDemand {
    /// It waits for an address from kipam's pool (see `crate::demand::services`).
    pub waiting: bool,
    /// The load-balancer addresses it holds (any pool).
    pub addresses: Vec<u128>,
}

#[derive(Clone, Debug, Default)]
struct ClusterState {
    /// The Services could be listed and are watched.
    known: bool,
    /// Why the user cluster cannot be read, when it cannot.
    problem: Option<String>,
    /// `namespace/name` -> (demand, first seen waiting, refused by MetalLB).
    services: BTreeMap<String, (ServiceDemand, Option<i64>, bool)>,
    /// Refusals (`AllocationFailed`) seen before their Service: `namespace/name`.
    refused_early: BTreeSet<String>,
    /// Addresses let go of since the last pass.
    touched: BTreeSet<u128>,
}

/// The demand cache. Cheap to share: one lock, held for map operations only.
#[derive(Debug, Default)]
pub struct DemandCache {
    inner: Mutex<BTreeMap<String, ClusterState>>,
    dirty: std::sync::OnceLock<Arc<Dirty>>,
    /// Counts the changes that matter to growth: a decision made at one count need not be
    /// made again until it moves (or a timer that decision set comes due).
    generation: AtomicU64,
}

impl DemandCache {
    /// Changes wake the planning loop through `dirty`.
    pub fn set_dirty(&self, dirty: Arc<Dirty>) {
        let _ = self.dirty.set(dirty);
    }

    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        if let Some(d) = self.dirty.get() {
            d.wake();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ClusterState>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every Service of `cluster`, as a (re)list gave them; `now` in seconds since the epoch.
    pub fn replace(&self, cluster: &str, services: BTreeMap<String, ServiceDemand>, now: i64) {
        let mut all = self.lock();
        let state = all.entry(cluster.to_string()).or_default();
        let mut changed = !state.known || state.problem.is_some();
        state.known = true;
        state.problem = None;
        let old = std::mem::take(&mut state.services);
        for (name, (d, _, _)) in &old {
            if services.get(name).is_none_or(|n| n != d) {
                changed = true;
                let kept: BTreeSet<u128> = services
                    .get(name)
                    .map(|n| n.addresses.iter().copied().collect())
                    .unwrap_or_default();
                state
                    .touched
                    .extend(d.addresses.iter().filter(|a| !kept.contains(a)));
            }
        }
        for (name, d) in services {
            let (since, refused) = match old.get(&name) {
                Some((_, since, refused)) if d.waiting => (since.or(Some(now)), *refused),
                _ if d.waiting => (Some(now), state.refused_early.remove(&name)),
                _ => (None, false),
            };
            if !old.contains_key(&name) {
                changed = true;
            }
            state.services.insert(name, (d, since, refused));
        }
        drop(all);
        if changed {
            self.changed();
        }
    }

    /// One Service changed (`Some`) or went away (`None`).
    pub fn service(&self, cluster: &str, name: &str, demand: Option<ServiceDemand>, now: i64) {
        let mut all = self.lock();
        let state = all.entry(cluster.to_string()).or_default();
        let old = state.services.remove(name);
        let same = match (&old, &demand) {
            (Some((o, _, _)), Some(n)) => o == n,
            (None, None) => true,
            _ => false,
        };
        if let Some((o, _, _)) = &old {
            let kept: BTreeSet<u128> = demand
                .as_ref()
                .map(|n| n.addresses.iter().copied().collect())
                .unwrap_or_default();
            state
                .touched
                .extend(o.addresses.iter().filter(|a| !kept.contains(a)));
        }
        if let Some(d) = demand {
            let (since, refused) = match &old {
                Some((_, since, refused)) if d.waiting => (since.or(Some(now)), *refused),
                _ if d.waiting => (Some(now), state.refused_early.remove(name)),
                _ => (None, false),
            };
            state.services.insert(name.to_string(), (d, since, refused));
        } else {
            state.refused_early.remove(name);
        }
        drop(all);
        if !same {
            self.changed();
        }
    }

    /// MetalLB refused `name` (`AllocationFailed`).
    pub fn refused(&self, cluster: &str, name: &str) {
        let mut all = self.lock();
        let state = all.entry(cluster.to_string()).or_default();
        let newly = match state.services.get_mut(name) {
            Some((d, _, refused)) if d.waiting && !*refused => {
                *refused = true;
                true
            }
            Some(_) => false,
            None => {
                // Bounded: at most one entry per Service name MetalLB refused, dropped when
                // the Service shows up or goes.
                if state.refused_early.len() < 10_000 {
                    state.refused_early.insert(name.to_string());
                }
                false
            }
        };
        drop(all);
        if newly {
            self.changed();
        }
    }

    /// `cluster`'s Services cannot be read (why). Its demand is unknown until they can.
    pub fn unreachable(&self, cluster: &str, why: String) {
        let mut all = self.lock();
        let state = all.entry(cluster.to_string()).or_default();
        let changed = state.known || state.problem.as_deref() != Some(why.as_str());
        state.known = false;
        state.problem = Some(why);
        drop(all);
        if changed {
            self.changed();
        }
    }

    /// Stops keeping `cluster` (no longer read).
    pub fn forget(&self, cluster: &str) {
        let removed = self.lock().remove(cluster).is_some();
        if removed {
            self.changed();
        }
    }

    /// How many changes that matter to growth the cache has seen. Read before
    /// [`DemandCache::take`], it tells whether anything changed since a decision.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Every user cluster kept: `None` when its Services are read, else why they cannot be.
    pub fn states(&self) -> BTreeMap<String, Option<String>> {
        self.lock()
            .iter()
            .map(|(c, s)| {
                let problem = match (&s.problem, s.known) {
                    (Some(p), _) => Some(p.clone()),
                    (None, false) => Some("not read yet".to_string()),
                    (None, true) => None,
                };
                (c.clone(), problem)
            })
            .collect()
    }

    /// Why each user cluster that cannot be read cannot, by cluster.
    pub fn problems(&self) -> BTreeMap<String, String> {
        self.lock()
            .iter()
            .filter_map(|(c, s)| s.problem.clone().map(|p| (c.clone(), p)))
            .collect()
    }

    /// The demand of every cluster the reader keeps, for one decision; the addresses let go
    /// of are handed over once (the next call starts afresh).
    pub fn take(&self) -> BTreeMap<String, Demand> {
        let mut all = self.lock();
        all.iter_mut()
            .map(|(cluster, s)| {
                let waiting = s
                    .services
                    .iter()
                    .filter(|(_, (d, _, _))| d.waiting)
                    .map(|(name, (_, since, refused))| Waiting {
                        service: name.clone(),
                        since: since.unwrap_or(0),
                        refused: *refused,
                    })
                    .collect();
                let used = s
                    .services
                    .values()
                    .flat_map(|(d, _, _)| d.addresses.iter().copied())
                    .collect();
                let demand = Demand {
                    known: s.known,
                    waiting,
                    used,
                    touched: std::mem::take(&mut s.touched),
                };
                (cluster.clone(), demand)
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

    fn waiting() -> ServiceDemand {
        ServiceDemand {
            waiting: true,
            addresses: vec![],
        }
    }

    #[test]
    fn waiting_since_and_refusals_and_let_go_addresses() {
        let cache = DemandCache::default();
        cache.replace("c1", BTreeMap::new(), 90);
        cache.refused("c1", "ns/early");
        cache.service("c1", "ns/early", Some(waiting()), 100);
        cache.service("c1", "ns/a", Some(waiting()), 101);
        cache.service("c1", "ns/a", Some(waiting()), 150);
        cache.refused("c1", "ns/a");
        let d = cache.take()["c1"].clone();
        assert!(d.known);
        let w: Vec<(String, i64, bool)> = d
            .waiting
            .iter()
            .map(|w| (w.service.clone(), w.since, w.refused))
            .collect();
        assert_eq!(
            w,
            vec![("ns/a".into(), 101, true), ("ns/early".into(), 100, true)]
        );
        cache.service(
            "c1",
            "ns/a",
            Some(ServiceDemand {
                waiting: false,
                addresses: vec![7],
            }),
            160,
        );
        assert_eq!(cache.take()["c1"].used, BTreeSet::from([7]));
        cache.service("c1", "ns/a", None, 170);
        let d = cache.take()["c1"].clone();
        assert!(d.used.is_empty());
        assert_eq!(d.touched, BTreeSet::from([7]));
        assert!(cache.take()["c1"].touched.is_empty(), "handed over once");
        cache.unreachable("c1", "connection refused".into());
        assert!(!cache.take()["c1"].known);
        assert_eq!(cache.problems()["c1"], "connection refused");
    }
}
