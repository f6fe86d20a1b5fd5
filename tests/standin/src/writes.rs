//! What a write costs on a real API server: an optional latency model for writes.
//!
//! On a real kube-apiserver every write is an etcd commit. One alone takes a few milliseconds;
//! several at once share the server, so each takes longer while the total rate still grows,
//! up to a ceiling. The stand-in, by default, stores a write in microseconds, so a controller
//! that orders its writes badly (one phase of the whole seed before the next) or sends too
//! few at once looks as fast as one that fills the server. [`WriteModel`] gives every write a
//! service time drawn from a measured throughput curve, with a bounded number served at once.
//!
//! The model, for a write that starts service while `n` writes (itself included) are in
//! service: it takes `n / X(n)`, where `X(n)` is the server's measured throughput with `n`
//! writers, interpolated linearly between the measured points. At most `slots` writes are in
//! service; more wait, first come first served, for a slot. So one writer alone gets `X(1)`
//! writes per second, `n` writers in a steady stream get `X(n)`, and the ceiling is
//! `X(slots)`. The time is taken at the start of service and the write is applied to the
//! store at its end, as an etcd commit lands at the end of its round trip.
//!
//! Reads, lists and watches stay free: a real server answers them from its watch cache, and
//! what kipam does with them is not what the model is for.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A throughput curve and a bound on writes served at once (see the module's doc).
#[derive(Debug, Clone, PartialEq)]
pub struct WriteModel {
    /// `(writers, writes per second)`, writers ascending, the first at 1.
    curve: Vec<(usize, f64)>,
    /// Writes served at once; more wait for a slot.
    slots: usize,
}

impl WriteModel {
    /// A kube-apiserver v1.36 with etcd on 2 cores, as measured by a bare client creating
    /// small ConfigMaps (issue 39): 190 writes/s over 1 connection (5.2 ms each), 577 over 8,
    /// 648 over 16, 752 over 32 and 847 over 64. Served at once: 64, so its ceiling is 847
    /// writes/s.
    pub fn kube_apiserver_2_cores() -> WriteModel {
        WriteModel {
            curve: vec![
                (1, 190.0),
                (8, 577.0),
                (16, 648.0),
                (32, 752.0),
                (64, 847.0),
            ],
            slots: 64,
        }
    }

    /// A model from measured `(writers, writes per second)` points and the writes served at
    /// once. The points are sorted by writers; writers below 1 and non-positive or non-finite
    /// rates are refused, as is an empty curve or zero slots. Past the last point the rate
    /// stays the last one.
    pub fn new(mut curve: Vec<(usize, f64)>, slots: usize) -> Result<WriteModel, String> {
        if curve.is_empty() {
            return Err("a write model needs at least one (writers, writes/s) point".into());
        }
        if slots == 0 {
            return Err("a write model needs at least one slot".into());
        }
        if let Some((n, rate)) = curve
            .iter()
            .find(|(n, rate)| *n == 0 || !rate.is_finite() || *rate <= 0.0)
        {
            return Err(format!(
                "write model point ({n} writers, {rate} writes/s): writers must be at least 1 and the rate positive"
            ));
        }
        curve.sort_by_key(|(n, _)| *n);
        curve.dedup_by_key(|(n, _)| *n);
        Ok(WriteModel { curve, slots })
    }

    /// Writes served at once.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The server's throughput with `writers` in service: the curve, interpolated linearly
    /// (flat before the first point and after the last).
    pub fn throughput(&self, writers: usize) -> f64 {
        let n = writers.max(1);
        let first = self.curve[0];
        if n <= first.0 {
            return first.1;
        }
        for pair in self.curve.windows(2) {
            let ((a, ra), (b, rb)) = (pair[0], pair[1]);
            if n <= b {
                let t = (n - a) as f64 / (b - a) as f64;
                return ra + t * (rb - ra);
            }
        }
        self.curve[self.curve.len() - 1].1
    }

    /// The most writes per second the model serves: its throughput with every slot busy.
    pub fn ceiling(&self) -> f64 {
        self.throughput(self.slots)
    }

    /// How long a write takes that starts service while `in_service` writes (itself
    /// included) are in service.
    pub fn service_time(&self, in_service: usize) -> Duration {
        let n = in_service.clamp(1, self.slots);
        Duration::from_secs_f64(n as f64 / self.throughput(n))
    }
}

/// The model at work: the slots and the count of writes in service.
pub struct WriteGate {
    model: WriteModel,
    slots: Arc<Semaphore>,
    in_service: Arc<AtomicUsize>,
}

/// A write in service: holds its slot until dropped (after the write was applied).
pub struct InService {
    _slot: OwnedSemaphorePermit,
    in_service: Arc<AtomicUsize>,
}

impl Drop for InService {
    fn drop(&mut self) {
        self.in_service.fetch_sub(1, Ordering::SeqCst);
    }
}

impl WriteGate {
    pub fn new(model: WriteModel) -> WriteGate {
        WriteGate {
            slots: Arc::new(Semaphore::new(model.slots)),
            in_service: Arc::new(AtomicUsize::new(0)),
            model,
        }
    }

    pub fn model(&self) -> &WriteModel {
        &self.model
    }

    /// Waits for a slot, then for the write's service time; the write is applied while the
    /// returned guard is held.
    pub async fn enter(&self) -> InService {
        // The semaphore is never closed.
        let slot = match self.slots.clone().acquire_owned().await {
            Ok(s) => s,
            Err(_) => unreachable!("the write model's semaphore is never closed"),
        };
        let n = self.in_service.fetch_add(1, Ordering::SeqCst) + 1;
        let guard = InService {
            _slot: slot,
            in_service: self.in_service.clone(),
        };
        tokio::time::sleep(self.model.service_time(n)).await;
        guard
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// `writers` tasks, each sending `each` writes one after the other through one gate; the
    /// writes per second reached.
    async fn rate(model: &WriteModel, writers: usize, each: usize) -> f64 {
        let gate = Arc::new(WriteGate::new(model.clone()));
        let start = Instant::now();
        let tasks: Vec<_> = (0..writers)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move {
                    for _ in 0..each {
                        drop(gate.enter().await);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        (writers * each) as f64 / start.elapsed().as_secs_f64()
    }

    #[test]
    fn the_curve_is_interpolated_between_measured_points() {
        let m = WriteModel::kube_apiserver_2_cores();
        assert_eq!(m.throughput(1), 190.0);
        assert_eq!(m.throughput(16), 648.0);
        assert_eq!(m.throughput(24), 700.0);
        assert_eq!(m.throughput(1000), 847.0);
        assert_eq!(m.ceiling(), 847.0);
        let alone = m.service_time(1).as_secs_f64() * 1000.0;
        assert!((5.2..5.3).contains(&alone), "{alone} ms");
        // Past the slots, a write takes what a write with every slot busy takes.
        assert_eq!(m.service_time(64), m.service_time(500));
    }

    #[test]
    fn bad_models_are_refused() {
        assert!(WriteModel::new(vec![], 4).is_err());
        assert!(WriteModel::new(vec![(1, 100.0)], 0).is_err());
        let e = WriteModel::new(vec![(0, 100.0)], 4).unwrap_err();
        assert!(e.contains("0 writers"), "{e}");
        assert!(WriteModel::new(vec![(1, -1.0)], 4).is_err());
    }

    /// Sixteen writers get more written per second than one (they share the server), but
    /// far from sixteen times as much. Only the order is asserted: a loaded machine oversleeps.
    /// The rates reached are printed (`-- --nocapture`): about 190 and 650 writes/s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sixteen_writers_share_the_server() {
        let m = WriteModel::kube_apiserver_2_cores();
        let one = rate(&m, 1, 100).await;
        let sixteen = rate(&m, 16, 40).await;
        println!(
            "write model: 1 writer {one:.0} writes/s, 16 writers {sixteen:.0} writes/s (model: {:.0} and {:.0})",
            m.throughput(1),
            m.throughput(16)
        );
        assert!(
            one < sixteen,
            "1 writer {one:.0}/s, 16 writers {sixteen:.0}/s"
        );
        assert!(
            sixteen < 8.0 * one,
            "16 writers {sixteen:.0}/s against 1 writer {one:.0}/s: the server is not shared"
        );
    }

    /// A write alone waits at least its service time (5.2 ms).
    #[tokio::test]
    async fn a_write_alone_waits_its_service_time() {
        let gate = WriteGate::new(WriteModel::kube_apiserver_2_cores());
        let t = Instant::now();
        drop(gate.enter().await);
        assert!(t.elapsed() >= Duration::from_millis(5));
    }
}
