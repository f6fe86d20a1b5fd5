//! The whole fleet's adoption (`spec.adopt`), as the REST API and the page show it, read from
//! the Clusters' `status.adoption` (written by the leader's planning pass). Pure: it takes the
//! Clusters as stored, so every replica answers from its own cache, never the leader's state.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;

use crate::resources::{AdoptionConflict, AdoptionStatus, Cluster};

/// One cluster's adoption: its name and datacenter, and its `status.adoption` as written.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAdoptionView {
    pub cluster: String,
    pub datacenter: String,
    #[serde(flatten)]
    pub adoption: AdoptionStatus,
}

/// Figures over every cluster shown.
#[derive(Clone, Debug, Default, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionSummary {
    /// Clusters whose adoption is reported (`adopt` is `DryRun` or `Adopt`).
    pub clusters: usize,
    /// Clusters per state: `Waiting`, `NeedsLook`, `DryRun`, `Adopting`, `Adopted`.
    pub states: BTreeMap<String, usize>,
    /// Addresses the user clusters serve, in all (`servedTotal` summed).
    pub served: i64,
    /// Served addresses per verdict (`Adopt`, `Held`, `Outside`, `Contested`, `Taken`,
    /// `Excluded`), over the addresses each status lists (its first 512).
    pub verdicts: BTreeMap<String, usize>,
    /// Conflicts (one per cluster and other side), over every cluster.
    pub conflicts: usize,
    /// The clusters whose adoption needs a look, by name.
    pub needs_look: Vec<String>,
}

/// The fleet's adoption plan: figures, and every cluster by name.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionFleet {
    pub summary: AdoptionSummary,
    pub clusters: Vec<ClusterAdoptionView>,
}

/// Every Cluster carrying `status.adoption` (of `datacenter`, when given), by name.
pub fn fleet<'a>(
    clusters: impl IntoIterator<Item = &'a Cluster>,
    datacenter: Option<&str>,
) -> AdoptionFleet {
    let mut views: Vec<ClusterAdoptionView> = clusters
        .into_iter()
        .filter(|c| datacenter.is_none_or(|dc| c.spec.datacenter == dc))
        .filter_map(|c| {
            let adoption = c.status.as_ref()?.adoption.clone()?;
            Some(ClusterAdoptionView {
                cluster: c.metadata.name.clone().unwrap_or_default(),
                datacenter: c.spec.datacenter.clone(),
                adoption,
            })
        })
        .collect();
    views.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    AdoptionFleet {
        summary: summary(&views),
        clusters: views,
    }
}

fn summary(views: &[ClusterAdoptionView]) -> AdoptionSummary {
    let mut s = AdoptionSummary {
        clusters: views.len(),
        ..AdoptionSummary::default()
    };
    for v in views {
        let a = &v.adoption;
        *s.states.entry(a.state.clone()).or_default() += 1;
        s.served = s.served.saturating_add(a.served_total);
        for address in &a.served {
            *s.verdicts.entry(address.verdict.clone()).or_default() += 1;
        }
        s.conflicts += a.conflicts.len();
        if a.state == NEEDS_LOOK {
            s.needs_look.push(v.cluster.clone());
        }
    }
    s
}

/// The state of a cluster a person must act on before kipam takes it over.
pub const NEEDS_LOOK: &str = "NeedsLook";

/// One cluster on the page: what it serves, counted, and what stands in the way.
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionRow {
    pub cluster: String,
    pub datacenter: String,
    pub mode: String,
    pub state: String,
    /// Addresses served in all.
    pub served: i64,
    /// Listed served addresses per verdict.
    pub verdicts: BTreeMap<String, usize>,
    /// The hand-made MetalLB pools, `namespace/name`, with the kipam pool taking each over.
    pub hand_made: Vec<String>,
    pub conflicts: Vec<AdoptionConflict>,
    /// Why it waits or needs a look.
    pub reasons: Vec<String>,
}

/// The page's adoption section: the figures and the first [`MAX_ROWS`] clusters, those
/// needing a look first.
#[derive(Clone, Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionPage {
    pub summary: AdoptionSummary,
    pub rows: Vec<AdoptionRow>,
}

/// Clusters listed in the page's adoption section at most (the REST API lists them all).
pub const MAX_ROWS: usize = 200;

/// The page's section, or `None` when no cluster adopts.
pub fn page<'a>(clusters: impl IntoIterator<Item = &'a Cluster>) -> Option<AdoptionPage> {
    let fleet = fleet(clusters, None);
    if fleet.clusters.is_empty() {
        return None;
    }
    let rank = |state: &str| match state {
        NEEDS_LOOK => 0,
        "Waiting" => 1,
        "DryRun" => 2,
        "Adopting" => 3,
        _ => 4,
    };
    let mut views = fleet.clusters;
    views.sort_by(|a, b| {
        (rank(&a.adoption.state), &a.cluster).cmp(&(rank(&b.adoption.state), &b.cluster))
    });
    let rows = views
        .into_iter()
        .take(MAX_ROWS)
        .map(|v| {
            let a = v.adoption;
            let mut verdicts = BTreeMap::new();
            for s in &a.served {
                *verdicts.entry(s.verdict.clone()).or_default() += 1;
            }
            AdoptionRow {
                cluster: v.cluster,
                datacenter: v.datacenter,
                mode: a.mode,
                state: a.state,
                served: a.served_total,
                verdicts,
                hand_made: a
                    .hand_made_pools
                    .iter()
                    .map(|h| match &h.taken_over_by {
                        Some(pool) => format!("{}/{} → {pool}", h.namespace, h.name),
                        None => format!("{}/{}", h.namespace, h.name),
                    })
                    .collect(),
                conflicts: a.conflicts,
                reasons: a.reasons,
            }
        })
        .collect();
    Some(AdoptionPage {
        summary: fleet.summary,
        rows,
    })
}
