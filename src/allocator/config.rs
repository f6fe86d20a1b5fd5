//! What one pool of one datacenter hands out, and how it picks.

use std::fmt;

use crate::address::Cidr;

/// How free space is chosen for a new allocation or a growth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// KKP's behaviour: the lowest free addresses from the pool start (range pools: possibly
    /// several disjoint pieces), the lowest free aligned subnet (prefix pools).
    #[default]
    FirstFit,
    /// Butler's behaviour: the smallest free contiguous block that fits, lowest first among
    /// blocks of equal size. When no single block fits but enough addresses are free, range
    /// pools fall back to filling like `FirstFit` rather than failing.
    BestFit,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::FirstFit => "FirstFit",
            Strategy::BestFit => "BestFit",
        })
    }
}

/// The allocation type of a pool with its default size per cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    /// `allocation_range` addresses per cluster.
    Range { allocation_range: u128 },
    /// One aligned subnet of length `allocation_prefix` per cluster.
    Prefix { allocation_prefix: u8 },
}

impl PoolKind {
    /// `range` or `prefix`, as written in manifests.
    pub fn type_name(&self) -> &'static str {
        match self {
            PoolKind::Range { .. } => "range",
            PoolKind::Prefix { .. } => "prefix",
        }
    }

    /// The request a cluster without an override makes.
    pub fn default_request(&self) -> Request {
        match *self {
            PoolKind::Range { allocation_range } => Request::Addresses(allocation_range),
            PoolKind::Prefix { allocation_prefix } => Request::Prefix(allocation_prefix),
        }
    }
}

/// One pool of one datacenter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// How errors name the pool; [`PoolConfig::new`] uses the CIDR.
    pub label: String,
    pub cidr: Cidr,
    pub kind: PoolKind,
    pub strategy: Strategy,
    /// Further CIDRs of the same family after `cidr`, in the order they are used: the free
    /// space of one is taken only once no earlier one can serve the request (see
    /// [`PoolConfig::cidrs`]). Empty for a pool of one CIDR.
    pub additional: Vec<Cidr>,
}

impl PoolConfig {
    /// A pool labelled by its CIDR.
    pub fn new(cidr: Cidr, kind: PoolKind, strategy: Strategy) -> Self {
        PoolConfig {
            label: cidr.to_string(),
            cidr,
            kind,
            strategy,
            additional: Vec::new(),
        }
    }

    /// The same pool with further CIDRs, used after `cidr` in this order.
    pub fn with_additional(mut self, additional: Vec<Cidr>) -> Self {
        self.additional = additional;
        self
    }

    /// Every CIDR of the pool in fill order: `cidr`, then `additional`.
    pub fn cidrs(&self) -> impl Iterator<Item = Cidr> + '_ {
        std::iter::once(self.cidr).chain(self.additional.iter().copied())
    }

    /// The same pool, named differently in error messages.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }
}

/// What a cluster asks a pool for (pinned requests go through `PoolAllocator::pin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Request {
    /// A number of addresses from a range pool.
    Addresses(u128),
    /// One aligned subnet of this length from a prefix pool.
    Prefix(u8),
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Addresses(n) => write!(f, "{n} addresses"),
            Request::Prefix(len) => write!(f, "a /{len} subnet"),
        }
    }
}
