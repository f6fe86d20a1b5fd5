//! Validation and planning over plain manifests (no files, no API server).

mod adopt;
mod claims;
mod demand_growth;
mod growth;
mod incremental;
mod network;
mod planner;
mod spaces;
mod validation;

use kipam::planner::{ClusterInput, PoolInput, StoredAllocation};
use kipam::resources::{Cluster, IPAMAllocation, IPAMPool};

pub fn pool(yaml: &str) -> IPAMPool {
    serde_saphyr::from_str(yaml).expect("test pool YAML")
}

pub fn cluster(yaml: &str) -> Cluster {
    serde_saphyr::from_str(yaml).expect("test cluster YAML")
}

pub fn pool_input(yaml: &str) -> PoolInput {
    kipam::validation::pool_input(&pool(yaml)).expect("valid test pool")
}

/// A cluster in `dc`, created on day `day` of January 2026.
pub fn cluster_in(name: &str, dc: &str, day: u32) -> ClusterInput {
    ClusterInput {
        name: name.into(),
        created: Some(format!("2026-01-{day:02}T00:00:00Z")),
        datacenter: dc.into(),
        overrides: Default::default(),
        deleting: false,
        paused: false,
        invalid: None,
        only_pool: None,
        hold: None,
    }
}

/// The plan's allocations as stored objects, then read back: what the next run starts from.
pub fn stored_after(plan: &kipam::planner::Plan, pools: &[PoolInput]) -> Vec<StoredAllocation> {
    plan.decisions
        .iter()
        .filter_map(|d| {
            let policy = pools
                .iter()
                .find(|p| p.name == d.pool)
                .map(|p| p.reclaim_policy);
            let obj: IPAMAllocation =
                kipam::desired::allocation_object(d, None, policy, "2026-02-01T00:00:00Z")?;
            Some(kipam::validation::stored_allocation(&obj).expect("stored allocation parses"))
        })
        .collect()
}
