//! Who holds what in a state, before anything is planned or rendered from it.
//!
//! A state file lives in Git: two branches that each gave a new cluster the same free range
//! merge into one file where two clusters hold the same addresses, and nothing in the file
//! itself looks wrong. [`state_clashes`] finds every address held twice in one datacenter and
//! address space, so that `kipam offline`, `kipam validate --state` and `kipam render --state`
//! refuse such a state, naming both holders, instead of planning or rendering from it.
//!
//! [`held_elsewhere`] says what the planner must keep out of every pool of a datacenter although
//! no pool it plans holds it: allocations kept by `reclaimPolicy: Retain` after their pool (or
//! its datacenter) went, and the pools' gateways. Pure: plain data in, plain data out.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::address::AddrRange;
use crate::planner::{ClusterInput, HeldElsewhere, PoolInput, StoredAllocation};
use crate::resources::{
    ANNOTATION_ADDRESS_SPACE, ANNOTATION_POOL_ALLOCATION_PREFIX, IPAMAllocation, ReclaimPolicy,
    cluster_namespace, cluster_of_namespace,
};
use crate::validation::{DEFAULT_SPACE, RecordedPrefixes};

/// Most clashes listed; the rest are counted.
const SHOWN: usize = 20;

/// Where the addresses a holder holds count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space<'a> {
    /// In this address space of the datacenter (`""`: the default one).
    Of(&'a str),
    /// In every address space of the datacenter: its pool is not in the input (kept by
    /// `reclaimPolicy: Retain`, or about to be released), so which space it was is unknown.
    Every,
    /// Not known (`validate` and `render` are not given every pool): compared with the
    /// holders of its own pool only.
    Unknown,
}

/// One thing that holds addresses in a datacenter.
#[derive(Clone, Debug)]
enum Holder<'a> {
    Allocation(&'a StoredAllocation),
    Gateway { pool: &'a str },
}

impl fmt::Display for Holder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Allocation(s) => write!(
                f,
                "cluster {} (pool {}, IPAMAllocation {}/{})",
                s.cluster,
                s.pool,
                cluster_namespace(&s.cluster),
                s.pool
            ),
            Holder::Gateway { pool } => write!(f, "the gateway of pool {pool}"),
        }
    }
}

/// Two holders of the same addresses in one datacenter and address space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clash {
    pub datacenter: String,
    /// Both holders, as people read them.
    pub first: String,
    pub second: String,
    /// The addresses both hold.
    pub addresses: AddrRange,
    /// What to do about it.
    pub way_out: String,
}

impl fmt::Display for Clash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} and {} both hold {} in datacenter {}; {}",
            self.first, self.second, self.addresses, self.datacenter, self.way_out
        )
    }
}

/// The clashes of `stored`, as messages (at most 20, then a count of the rest).
pub fn clash_messages(clashes: &[Clash]) -> Vec<String> {
    let mut out: Vec<String> = clashes.iter().take(SHOWN).map(|c| c.to_string()).collect();
    if clashes.len() > SHOWN {
        out.push(format!("... and {} more", clashes.len() - SHOWN));
    }
    out
}

/// (cluster, pool) -> the address space an allocation's annotation records (the planner's
/// name: empty for the default space).
pub type RecordedSpaces = HashMap<(String, String), String>;

/// (cluster, pool) and the value of `annotation` of every allocation of the state that
/// carries it.
fn annotated<'a>(
    objects: &'a [IPAMAllocation],
    annotation: &'a str,
) -> impl Iterator<Item = ((String, String), &'a str)> + 'a {
    objects.iter().filter_map(move |obj| {
        let value = obj.metadata.annotations.as_ref()?.get(annotation)?;
        let cluster = cluster_of_namespace(obj.metadata.namespace.as_deref()?)?;
        let pool = obj.metadata.name.clone()?;
        Some(((cluster.to_string(), pool), value.as_str()))
    })
}

/// The address spaces the state's allocations record ([`ANNOTATION_ADDRESS_SPACE`]).
pub fn recorded_spaces(objects: &[IPAMAllocation]) -> RecordedSpaces {
    annotated(objects, ANNOTATION_ADDRESS_SPACE)
        .map(|(key, space)| {
            let space = if space == DEFAULT_SPACE { "" } else { space };
            (key, space.to_string())
        })
        .collect()
}

/// The pool `allocationPrefix`es the state's allocations record
/// ([`ANNOTATION_POOL_ALLOCATION_PREFIX`]); a value that does not read is left out.
pub fn recorded_prefixes(objects: &[IPAMAllocation]) -> RecordedPrefixes {
    annotated(objects, ANNOTATION_POOL_ALLOCATION_PREFIX)
        .filter_map(|(key, length)| Some((key, length.parse::<i32>().ok()?)))
        .collect()
}

/// Every address held twice in `stored` within one datacenter and address space, and every
/// stored allocation holding a gateway of its address space.
///
/// `pools` are the pools known (with their address spaces); `gateways` their gateways
/// ([`gateways`]); `recorded` the spaces the allocations themselves record. An allocation of a
/// pool that is not in `pools`, or that no longer serves its datacenter, counts in the space
/// it records; when it records none, with `whole_world` (`kipam offline`, whose input is
/// every pool) it holds its addresses in every address space of the datacenter, and otherwise
/// (`validate`, `render`, given some pools) it is compared with the allocations of its own
/// pool only.
pub fn state_clashes(
    stored: &[StoredAllocation],
    pools: &[PoolInput],
    gateways: &[HeldElsewhere],
    recorded: &RecordedSpaces,
    whole_world: bool,
) -> Vec<Clash> {
    let by_name: HashMap<&str, &PoolInput> = pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let space_of = |cluster: &str, pool: &str, dc: &str| -> Space<'_> {
        match by_name.get(pool) {
            Some(p) if p.datacenters.contains_key(dc) => Space::Of(p.address_space.as_str()),
            _ => match recorded.get(&(cluster.to_string(), pool.to_string())) {
                Some(space) => Space::Of(space.as_str()),
                None if whole_world => Space::Every,
                None => Space::Unknown,
            },
        }
    };
    // Per datacenter: (first, last, family, holder, space, pool).
    type Entry<'a> = (AddrRange, Holder<'a>, Space<'a>, &'a str);
    let mut by_dc: BTreeMap<&str, Vec<Entry<'_>>> = BTreeMap::new();
    for s in stored {
        let Some(held) = &s.held else { continue };
        let space = space_of(&s.cluster, &s.pool, &s.datacenter);
        let list = by_dc.entry(s.datacenter.as_str()).or_default();
        list.extend(
            held.ranges()
                .map(|r| (r, Holder::Allocation(s), space, s.pool.as_str())),
        );
    }
    for g in gateways {
        let space = space_of("", &g.pool, &g.datacenter);
        let list = by_dc.entry(g.datacenter.as_str()).or_default();
        list.extend(g.addresses.iter().map(|r| {
            (
                *r,
                Holder::Gateway { pool: &g.pool },
                space,
                g.pool.as_str(),
            )
        }));
    }
    let mut out = Vec::new();
    for (dc, mut list) in by_dc {
        list.sort_by_key(|(r, ..)| (r.family(), r.first(), r.last()));
        // Sweep: the entries still open when the next one starts overlap it.
        let mut open: Vec<usize> = Vec::new();
        for i in 0..list.len() {
            let (r, ..) = &list[i];
            open.retain(|j| {
                let o = &list[*j].0;
                o.family() == r.family() && o.last() >= r.first()
            });
            for j in &open {
                if let Some(clash) = clash_of(dc, &list[*j], &list[i]) {
                    out.push(clash);
                }
            }
            open.push(i);
        }
    }
    out
}

/// The clash of two overlapping entries, if they count in one space.
fn clash_of(
    dc: &str,
    a: &(AddrRange, Holder<'_>, Space<'_>, &str),
    b: &(AddrRange, Holder<'_>, Space<'_>, &str),
) -> Option<Clash> {
    let (ra, ha, sa, pa) = a;
    let (rb, hb, sb, pb) = b;
    let shared = match (sa, sb) {
        _ if pa == pb => true,
        (Space::Every, _) | (_, Space::Every) => true,
        (Space::Of(x), Space::Of(y)) => x == y,
        _ => false,
    };
    let gateways = matches!(ha, Holder::Gateway { .. }) && matches!(hb, Holder::Gateway { .. });
    if !shared || gateways {
        return None;
    }
    let first = ra.first().max(rb.first());
    let last = ra.last().min(rb.last());
    let addresses = AddrRange::new(ra.family(), first, last)?;
    let way_out = match (ha, hb) {
        (Holder::Allocation(x), Holder::Allocation(y)) => {
            let mut way_out = format!(
                "decide which cluster keeps them and delete the other's IPAMAllocation \
                 document ({}/{} or {}/{}) from the state file; the next run gives that \
                 cluster new addresses",
                cluster_namespace(&x.cluster),
                x.pool,
                cluster_namespace(&y.cluster),
                y.pool
            );
            // A pool that is gone, written by a kipam that did not record spaces: say how to
            // tell which space it was, which may end the clash.
            for (h, space) in [(x, sa), (y, sb)] {
                if *space == Space::Every {
                    way_out.push_str(&format!(
                        "; pool {} is not in the input, so the space of IPAMAllocation {}/{} \
                         is unknown and it counts in every space: if its pool was in another \
                         addressSpace, set its annotation {ANNOTATION_ADDRESS_SPACE} to that \
                         space",
                        h.pool,
                        cluster_namespace(&h.cluster),
                        h.pool
                    ));
                }
            }
            way_out
        }
        (Holder::Allocation(x), Holder::Gateway { .. })
        | (Holder::Gateway { .. }, Holder::Allocation(x)) => format!(
            "delete the IPAMAllocation document {}/{} from the state file; the next run gives \
             cluster {} new addresses",
            cluster_namespace(&x.cluster),
            x.pool,
            x.cluster
        ),
        _ => return None,
    };
    Some(Clash {
        datacenter: dc.to_string(),
        first: ha.to_string(),
        second: hb.to_string(),
        addresses,
        way_out,
    })
}

/// What the planner must keep out of every pool of a datacenter although it plans no pool
/// holding it: the allocations `reclaimPolicy: Retain` keeps after their pool, or its
/// datacenter, went (while their cluster stays), and `gateways`.
pub fn held_elsewhere(
    pools: &[PoolInput],
    clusters: &[ClusterInput],
    stored: &[StoredAllocation],
    gateways: Vec<HeldElsewhere>,
) -> Vec<HeldElsewhere> {
    let by_name: HashMap<&str, &PoolInput> = pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let staying: HashMap<&str, bool> = clusters
        .iter()
        .map(|c| (c.name.as_str(), !c.deleting))
        .collect();
    let mut out = gateways;
    for s in stored {
        let Some(held) = &s.held else { continue };
        if !staying.get(s.cluster.as_str()).copied().unwrap_or(false) {
            continue;
        }
        let retained = match by_name.get(s.pool.as_str()) {
            None => s.reclaim_policy == Some(ReclaimPolicy::Retain),
            Some(p) => {
                !p.datacenters.contains_key(&s.datacenter)
                    && p.reclaim_policy == ReclaimPolicy::Retain
            }
        };
        if retained {
            out.push(HeldElsewhere {
                pool: s.pool.clone(),
                datacenter: s.datacenter.clone(),
                holder: s.cluster.clone(),
                addresses: held.ranges().collect(),
            });
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{IPAMAllocation, IPAMPool};
    use crate::validation;

    fn stored(cluster: &str, pool: &str, range: &str) -> StoredAllocation {
        let obj: IPAMAllocation = serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMAllocation",
            "metadata": {"name": pool, "namespace": format!("cluster-{cluster}")},
            "spec": {"type": "range", "dc": "dc-1", "addresses": [range]},
        }))
        .unwrap();
        validation::stored_allocation(&obj).unwrap()
    }

    fn pool(name: &str, space: Option<&str>) -> PoolInput {
        let obj: IPAMPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPool",
            "metadata": {"name": name},
            "spec": {"addressSpace": space, "datacenters": {"dc-1": {
                "type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 4,
            }}},
        }))
        .unwrap();
        validation::pool_input(&obj).unwrap()
    }

    #[test]
    fn spaces_decide_what_counts_as_held_twice() {
        let none = RecordedSpaces::new();
        let a = stored("a", "p", "10.0.0.0-10.0.0.3");
        let b = stored("b", "q", "10.0.0.2-10.0.0.5");
        let same = stored("c", "p", "10.0.0.3-10.0.0.3");
        // Pools of two spaces may each hand an address out once.
        let two_spaces = [pool("p", None), pool("q", Some("vrf-2"))];
        assert_eq!(
            state_clashes(&[a.clone(), b.clone()], &two_spaces, &[], &none, true),
            vec![]
        );
        // One space (`default` is the default one): held twice.
        let one_space = [pool("p", None), pool("q", Some("default"))];
        let found = state_clashes(&[a.clone(), b.clone()], &one_space, &[], &none, true);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].addresses.to_string(), "10.0.0.2-10.0.0.3");
        // A pool not in the input (kept by Retain) holds its addresses in every space offline;
        // `validate`, which is not given every pool, compares it with its own pool only.
        assert_eq!(
            state_clashes(&[a.clone(), b.clone()], &two_spaces[..1], &[], &none, true).len(),
            1
        );
        assert_eq!(
            state_clashes(&[a.clone(), b.clone()], &[], &[], &none, false),
            vec![]
        );
        // Two holders in one pool: always.
        assert_eq!(state_clashes(&[a, same], &[], &[], &none, false).len(), 1);
    }
}
