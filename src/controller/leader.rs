//! Leader election over a `coordination.k8s.io/v1` Lease, written by hand.
//!
//! Only the holder writes. The holder renews every `retry_period`; it considers itself leader
//! only while its last successful renewal is younger than `renew_deadline`, which is shorter
//! than `lease_duration`, so it stops writing before anybody else may take over. A candidate
//! takes over only when the lease record has not changed for `lease_duration` as measured on
//! its own clock (no trust in other machines' clocks). Every update is conditional on the
//! Lease's `resourceVersion`, so two candidates can never both win one round.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

/// Lease timings.
#[derive(Clone, Copy, Debug)]
pub struct LeaseTiming {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        LeaseTiming {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Whether this replica may write, shared with the workers.
#[derive(Debug)]
pub struct LeaderState {
    renewed_at: Mutex<Option<Instant>>,
    renew_deadline: Duration,
    changes: watch::Sender<bool>,
}

impl LeaderState {
    pub fn new(renew_deadline: Duration) -> Arc<Self> {
        let (changes, _) = watch::channel(false);
        Arc::new(LeaderState {
            renewed_at: Mutex::new(None),
            renew_deadline,
            changes,
        })
    }

    /// True while the lease was renewed within the renew deadline: check before writing.
    pub fn holds(&self) -> bool {
        let renewed = self.renewed_at.lock().map(|g| *g).unwrap_or(None);
        renewed.is_some_and(|t| t.elapsed() < self.renew_deadline)
    }

    /// Wakes up on every gain or loss.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    fn renewed(&self) {
        if let Ok(mut g) = self.renewed_at.lock() {
            *g = Some(Instant::now());
        }
        self.changes
            .send_if_modified(|v| !std::mem::replace(v, true));
    }

    fn lost(&self) {
        if let Ok(mut g) = self.renewed_at.lock() {
            *g = None;
        }
        self.changes
            .send_if_modified(|v| std::mem::replace(v, false));
    }
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    state: Arc<LeaderState>,
    /// The record last seen and when (our clock) it was first seen.
    observed: Option<(String, Instant)>,
}

impl Elector {
    pub fn new(
        api: Api<Lease>,
        name: &str,
        identity: &str,
        timing: LeaseTiming,
        state: Arc<LeaderState>,
    ) -> Self {
        Elector {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            timing,
            state,
            observed: None,
        }
    }

    /// Runs until the process ends.
    pub async fn run(mut self) {
        loop {
            match self.round().await {
                Ok(true) => self.state.renewed(),
                Ok(false) => self.state.lost(),
                Err(e) => {
                    tracing::warn!(error = %e, "lease round failed");
                    if !self.state.holds() {
                        self.state.lost();
                    }
                }
            }
            tokio::time::sleep(self.timing.retry_period).await;
        }
    }

    /// Gives the lease up (on shutdown) so another replica takes over at once.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await
            && let Some(spec) = lease.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(self.identity.as_str())
        {
            spec.holder_identity = None;
            let _ = self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await;
        }
        self.state.lost();
    }

    /// One attempt to acquire or renew; `Ok(true)` when we hold the lease afterwards.
    async fn round(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let duration_secs = self.timing.lease_duration.as_secs().max(1) as i32;
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let record = format!(
            "{}|{:?}",
            holder,
            spec.renew_time.as_ref().map(|t| t.0.to_string())
        );
        let seen_at = match &self.observed {
            Some((r, at)) if *r == record => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((record, at));
                at
            }
        };
        let ours = holder == self.identity;
        let expired = holder.is_empty() || seen_at.elapsed() > self.timing.lease_duration;
        if !ours && !expired {
            return Ok(false);
        }
        let mut new_spec = spec.clone();
        new_spec.holder_identity = Some(self.identity.clone());
        new_spec.lease_duration_seconds = Some(duration_secs);
        new_spec.renew_time = Some(now.clone());
        if !ours {
            new_spec.acquire_time = Some(now);
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(new_spec);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if !ours {
                    tracing::info!(identity = %self.identity, "acquired the leader lease");
                }
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}
