//! What the planner returns: one decision per (cluster, pool) and the pools' usage.

use std::collections::BTreeMap;
use std::fmt;

use crate::allocator::{Allocation, CidrUsage, PoolUsage};
use crate::resources::AllocationType;

/// What happens to one cluster's allocation from one pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Change {
    /// A new allocation.
    Create,
    /// Addresses appended to a range allocation.
    Grow,
    /// Held as it is.
    Keep,
    /// A pin changed: the old addresses were released and the new ones taken.
    Replace,
    /// Returned to the pool; the stored allocation goes away.
    Release,
    /// The pool or datacenter is gone but its `reclaimPolicy` is `Retain`: kept, unmanaged.
    Retain,
    /// The request could not be met; `held` says what the cluster still holds, if anything.
    Fail,
    /// A stored allocation that can no longer be honoured as it is (it overlaps another
    /// allocation, an exclusion, leaves the pool or is of the other type). It is kept exactly
    /// as stored and every address of it that is free stays reserved; a human must resolve it.
    Conflict,
    /// Grown pieces given back after staying unused (demand-driven growth); the rest is kept.
    Shrink,
}

impl Change {
    pub fn as_str(&self) -> &'static str {
        match self {
            Change::Create => "created",
            Change::Grow => "grown",
            Change::Keep => "kept",
            Change::Replace => "replaced",
            Change::Release => "released",
            Change::Retain => "retained",
            Change::Fail => "failed",
            Change::Conflict => "conflict",
            Change::Shrink => "shrunk",
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The planner's verdict for one (cluster, pool).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub cluster: String,
    pub pool: String,
    pub datacenter: String,
    /// The pool's allocation type in that datacenter (from what is held, else the pool).
    pub type_: AllocationType,
    pub change: Change,
    /// What the cluster holds after the plan (`None` when released or never allocated).
    pub held: Option<Allocation>,
    /// What the cluster held before, when that differs.
    pub previous: Option<Allocation>,
    /// Why, in words a user can act on.
    pub message: String,
}

impl Decision {
    /// What a `Replace` gave up: the addresses it held before and holds no more (empty for
    /// any other change).
    pub fn given_up(&self) -> Vec<crate::address::AddrRange> {
        match (self.change, &self.previous, &self.held) {
            (Change::Replace, Some(before), Some(after)) => super::spaces::minus(
                &before.ranges().collect::<Vec<_>>(),
                &after.ranges().collect::<Vec<_>>(),
            ),
            _ => Vec::new(),
        }
    }

    /// True when the cluster got what it asked for.
    pub fn is_ok(&self) -> bool {
        !matches!(self.change, Change::Fail | Change::Conflict)
    }
}

/// Usage of one pool in one datacenter after the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatacenterReport {
    pub pool: String,
    pub datacenter: String,
    pub usage: PoolUsage,
    /// The same figures per CIDR of the pool datacenter, in fill order.
    pub cidrs: Vec<CidrUsage>,
}

/// Everything the planner decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Sorted by cluster, then pool.
    pub decisions: Vec<Decision>,
    /// Keyed by (pool, datacenter).
    pub usage: BTreeMap<(String, String), DatacenterReport>,
    /// What stays quarantined after the plan (`reuseAfter`), sorted by pool, datacenter,
    /// holder and release time: the entries kept, less those past their end, plus what the
    /// plan released.
    pub quarantined: Vec<super::Quarantined>,
}

impl Plan {
    /// The decisions that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Decision> {
        self.decisions.iter().filter(|d| !d.is_ok())
    }

    /// The plan as it stands once its writes landed, to be kept for the next pass: every
    /// allocation created, grown, shrunk or replaced is then simply held (`Keep`), as a plan
    /// made afresh would say. (A write that did not land has its pool planned again.) Growth
    /// decides on kept holdings only, so without this an allocation served by a short pass
    /// would never grow until its pool was planned again.
    pub fn settle(&mut self) {
        self.decisions.iter_mut().for_each(settle_one);
    }

    /// [`Plan::settle`] for one cluster's decisions: those a short pass added and wrote.
    pub fn settle_cluster(&mut self, cluster: &str) {
        let first = self
            .decisions
            .partition_point(|d| d.cluster.as_str() < cluster);
        self.decisions[first..]
            .iter_mut()
            .take_while(|d| d.cluster == cluster)
            .for_each(settle_one);
    }

    /// The decision for one (cluster, pool).
    pub fn decision(&self, cluster: &str, pool: &str) -> Option<&Decision> {
        self.decisions
            .iter()
            .find(|d| d.cluster == cluster && d.pool == pool)
    }
}

/// A decision as it stands once its write landed (see [`Plan::settle`]).
fn settle_one(d: &mut Decision) {
    if matches!(
        d.change,
        Change::Create | Change::Grow | Change::Shrink | Change::Replace
    ) && d.held.is_some()
    {
        d.change = Change::Keep;
        d.previous = None;
    }
}
