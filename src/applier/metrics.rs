//! The addon applier's metrics (`kipam_addon_*`), registered in the seed's registry.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::seed::metrics::{HistogramFamily, Metrics as SeedMetrics};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SyncLabels {
    /// `settled` or `failed`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `apply` or `delete`.
    pub verb: String,
    /// `ok` or `error`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    pub verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `watching` or `failing`.
    pub state: String,
}

fn tenant_request_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 13))
}

/// What the addon applier reports.
pub struct Metrics {
    /// User-cluster syncs by result.
    pub addon_syncs: Family<SyncLabels, Counter>,
    /// Duration of each user-cluster sync.
    pub addon_sync_duration: Histogram,
    /// Addons that could not be rendered, applied or pruned, by reason.
    pub addon_failures: Family<ReasonLabels, Counter>,
    /// Requests sent to user clusters, by verb and result.
    pub addon_requests: Family<RequestLabels, Counter>,
    pub addon_request_duration: HistogramFamily<VerbLabels>,
    pub addon_objects_applied: Counter,
    pub addon_objects_pruned: Counter,
    pub addon_syncs_in_flight: Gauge,
    /// Syncs started because an object kipam applied was changed or deleted in its user
    /// cluster.
    pub addon_drift_repairs: Counter,
    /// Drift watches in user clusters, by state.
    pub addon_drift_watches: Family<StateLabels, Gauge>,
}

impl Metrics {
    /// The applier's metrics, registered in the seed's registry.
    pub fn new(seed: &SeedMetrics) -> Arc<Self> {
        let m = Metrics {
            addon_syncs: Family::default(),
            addon_sync_duration: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            addon_failures: Family::default(),
            addon_requests: Family::default(),
            addon_request_duration: Family::new_with_constructor(tenant_request_buckets),
            addon_objects_applied: Counter::default(),
            addon_objects_pruned: Counter::default(),
            addon_syncs_in_flight: Gauge::default(),
            addon_drift_repairs: Counter::default(),
            addon_drift_watches: Family::default(),
        };
        seed.register(|registry| {
            registry.register(
                "addon_syncs",
                "User-cluster syncs of the addon applier, by result",
                m.addon_syncs.clone(),
            );
            registry.register(
                "addon_sync_duration_seconds",
                "Duration of each user-cluster sync",
                m.addon_sync_duration.clone(),
            );
            registry.register(
                "addon_failures",
                "Addons that could not be rendered, applied or pruned, by reason (Unreachable, \
             Unauthorized, Forbidden, MissingCRD, KubeconfigInvalid, TemplateError, ApplyFailed)",
                m.addon_failures.clone(),
            );
            registry.register(
            "addon_requests",
            "Requests sent to user clusters (server-side applies and deletes), by verb and result",
            m.addon_requests.clone(),
        );
            registry.register(
                "addon_request_duration_seconds",
                "Duration of each request to a user cluster, by verb",
                m.addon_request_duration.clone(),
            );
            registry.register(
                "addon_objects_applied",
                "Objects applied to user clusters",
                m.addon_objects_applied.clone(),
            );
            registry.register(
                "addon_objects_pruned",
                "Objects deleted from user clusters because no Addon renders them any more",
                m.addon_objects_pruned.clone(),
            );
            registry.register(
                "addon_syncs_in_flight",
                "User clusters being synced right now (at most --tenant-concurrency)",
                m.addon_syncs_in_flight.clone(),
            );
            registry.register(
                "addon_drift_repairs",
                "User-cluster syncs started because an object kipam applied there was changed or \
             deleted by someone else",
                m.addon_drift_repairs.clone(),
            );
            registry.register(
                "addon_drift_watches",
                "Watches of the objects kipam applied in user clusters, by state (watching, failing)",
                m.addon_drift_watches.clone(),
            );
        });
        Arc::new(m)
    }

    /// Records the end of one user-cluster sync.
    pub fn addon_sync(&self, settled: bool, took: Duration) {
        let result = if settled { "settled" } else { "failed" };
        self.addon_syncs
            .get_or_create(&SyncLabels {
                result: result.into(),
            })
            .inc();
        self.addon_sync_duration.observe(took.as_secs_f64());
    }

    /// Counts an Addon that could not be rendered, applied or pruned.
    pub fn addon_failed(&self, reason: &str) {
        self.addon_failures
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// The gauge of drift watches in `state` (`watching` or `failing`).
    pub fn drift_watches(&self, state: &str) -> Gauge {
        self.addon_drift_watches
            .get_or_create(&StateLabels {
                state: state.into(),
            })
            .clone()
    }

    /// Records one request to a user cluster (`apply` or `delete`).
    pub fn addon_request(&self, verb: &str, ok: bool, took: Duration) {
        self.addon_requests
            .get_or_create(&RequestLabels {
                verb: verb.into(),
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
        self.addon_request_duration
            .get_or_create(&VerbLabels { verb: verb.into() })
            .observe(took.as_secs_f64());
    }
}
