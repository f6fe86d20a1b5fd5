//! Leader election over a `coordination.k8s.io/v1` Lease, written by hand.
//!
//! Only the holder writes. The holder renews every `retry_period`; it considers itself leader
//! only while its last successful renewal is younger than `renew_deadline`, counted from the
//! moment the renewal request was *sent* (the API server may have committed it any time after),
//! so it stops writing before anybody else may take over. A candidate takes over only when the
//! lease record has not changed for the Lease's own `leaseDurationSeconds` (or ours, whichever
//! is longer) as measured on its own clock (no trust in other machines' clocks). Every update
//! is conditional on the Lease's `resourceVersion`, so two candidates can never both win one
//! round. Each gain of leadership starts a new *term*; work planned in one term is never
//! written in another (the caller rebuilds its view from a fresh list first).
//!
//! The Lease is only a way to keep replicas from working against each other; it is not what
//! keeps addresses unique. That is the pool record's compare-and-swap (`docs/design.md`).
//!
//! Why not the `kube-lease-manager` crate (0.13.1, checked against this module under the same
//! faults, with an in-process Lease API): its leader flag does not fall when renewals fail —
//! on an API error its watch logs and backs off without reporting the loss — so a leader cut
//! off from the API server still read "leader" 20 s into a 3 s lease while another replica
//! held it (this module stopped writing after its 2 s renew deadline, and the other replica
//! took over at 3 s); it judges expiry by the holder's `renewTime` against the local clock, so
//! a replica whose clock ran 10 s ahead took a healthy leader's lease within a second (here a
//! candidate only trusts the time it has itself watched the record stay unchanged); its
//! updates carry no `resourceVersion`; and it exposes no term or renewal time to fence writes
//! on. Each of those is what this module exists for.

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
    /// Counts gains of leadership.
    term: std::sync::atomic::AtomicU64,
    /// Set on shutdown: no write starts any more.
    resigning: std::sync::atomic::AtomicBool,
}

impl LeaderState {
    pub fn new(renew_deadline: Duration) -> Arc<Self> {
        let (changes, _) = watch::channel(false);
        Arc::new(LeaderState {
            renewed_at: Mutex::new(None),
            renew_deadline,
            changes,
            term: std::sync::atomic::AtomicU64::new(0),
            resigning: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// True while the lease was renewed within the renew deadline: check before writing.
    pub fn holds(&self) -> bool {
        if self.resigning.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        let renewed = self.renewed_at.lock().map(|g| *g).unwrap_or(None);
        renewed.is_some_and(|t| t.elapsed() < self.renew_deadline)
    }

    /// The current term: it changes on every gain of leadership.
    pub fn term(&self) -> u64 {
        self.term.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// True while this replica leads in `term` (and has not lost the lease since).
    pub fn holds_term(&self, term: u64) -> bool {
        self.holds() && self.term() == term
    }

    /// No write starts from now on (shutdown).
    pub fn resign(&self) {
        self.resigning
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.changes
            .send_if_modified(|v| std::mem::replace(v, false));
    }

    /// Wakes up on every gain or loss.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    /// A renewal sent at `sent` succeeded.
    fn renewed(&self, sent: Instant) {
        if let Ok(mut g) = self.renewed_at.lock() {
            let was_valid = g.is_some_and(|t| t.elapsed() < self.renew_deadline);
            if !was_valid {
                // A gain (or a gap long enough that another replica may have led meanwhile).
                self.term.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            *g = Some(sent);
        }
        self.changes
            .send_if_modified(|v| !std::mem::replace(v, true));
    }

    fn lost(&self) {
        if let Ok(mut g) = self.renewed_at.lock() {
            if g.is_some() {
                self.term.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            *g = None;
        }
        self.changes
            .send_if_modified(|v| std::mem::replace(v, false));
    }
}

pub struct Elector {
    // RBAC: src/rbac.rs (leases: get, create, update).
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: LeaseTiming,
    state: Arc<LeaderState>,
    /// The record last seen and when (our clock) it was first seen.
    observed: Option<(String, Instant)>,
    /// Where to say why the Lease cannot be used (`/readyz`), and the last thing said.
    metrics: Option<Arc<super::metrics::Metrics>>,
    last_problem: Option<String>,
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
            metrics: None,
            last_problem: None,
        }
    }

    /// Reports Lease problems on `/readyz` too.
    pub fn with_metrics(mut self, metrics: Arc<super::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Runs until the process ends.
    pub async fn run(mut self) {
        loop {
            if self
                .state
                .resigning
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                return;
            }
            let result = self.round().await;
            if result.is_ok() && self.last_problem.take().is_some() {
                tracing::info!("the leader Lease is usable again");
                if let Some(m) = &self.metrics {
                    m.set_not_ready(None);
                }
            }
            match result {
                Ok(Some(sent)) => self.state.renewed(sent),
                Ok(None) => self.state.lost(),
                Err(e) => {
                    let hint = super::preconditions::explain(&e, "update", "leases", &self.name);
                    // One line per distinct problem, not one every retry period.
                    if self.last_problem.as_deref() != Some(hint.as_str()) {
                        tracing::error!("cannot use the leader Lease: {hint}");
                        self.last_problem = Some(hint.clone());
                    }
                    if let Some(m) = &self.metrics {
                        m.set_not_ready(Some(hint));
                    }
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

    /// One attempt to acquire or renew; `Ok(Some(sent))` when we hold the lease afterwards,
    /// `sent` being when the winning request left (the lease counts from then).
    async fn round(&mut self) -> Result<Option<Instant>, kube::Error> {
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
            let sent = Instant::now();
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Some(sent)),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
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
        // The holder promised to stop writing within its own lease duration: honour the longer
        // of the record's and ours.
        let recorded = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or_default();
        let wait = recorded.max(self.timing.lease_duration);
        let expired = holder.is_empty() || seen_at.elapsed() > wait;
        if !ours && !expired {
            return Ok(None);
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
        let sent = Instant::now();
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                if !ours {
                    tracing::info!(identity = %self.identity, "acquired the leader lease");
                }
                Ok(Some(sent))
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }
}
