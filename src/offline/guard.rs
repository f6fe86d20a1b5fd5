//! The release guard of `kipam offline`: releases that look like a mistake in the input
//! rather than an intent are refused unless `--allow-release` is given.
//!
//! Offline, the input *is* the desired world: a file left out of `-f`, a directory renamed,
//! a datacenter mistyped would each release allocations that are still in use, and the next
//! run would hand those addresses to someone else. Pure: the plan and its inputs in, the
//! suspicious releases out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::planner::{Change, ClusterInput, Plan, PoolInput, StoredAllocation};

/// Why the guard refuses a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Concern {
    /// Clusters and pools missing from the input would release every allocation of the state,
    /// or more than half of them.
    MassRelease {
        /// Allocations (holding addresses) that would be released because their cluster or
        /// pool is not in the input.
        released: usize,
        /// Allocations holding addresses in the state.
        held: usize,
        /// Clusters missing from the input, with how many allocations each would lose.
        clusters: BTreeMap<String, usize>,
        /// Pools missing from the input, with how many allocations each would lose.
        pools: BTreeMap<String, usize>,
    },
    /// A cluster moved to a datacenter that no pool serves at all: most likely a typo.
    UnknownDatacenter {
        cluster: String,
        datacenter: String,
        /// The datacenter it held its allocations in.
        previous: String,
        /// A datacenter the pools do serve that is spelled almost the same.
        suggestion: Option<String>,
    },
}

impl fmt::Display for Concern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Concern::MassRelease {
                released,
                held,
                clusters,
                pools,
            } => {
                let share = if released == held {
                    "every allocation".to_string()
                } else {
                    format!("more than half of the allocations ({released} of {held})")
                };
                write!(f, "this run would release {share} of the state")?;
                let mut parts = Vec::new();
                if !clusters.is_empty() {
                    parts.push(format!(
                        "clusters missing from the input: {}",
                        counted(clusters)
                    ));
                }
                if !pools.is_empty() {
                    parts.push(format!("pools missing from the input: {}", counted(pools)));
                }
                if !parts.is_empty() {
                    write!(f, " because {}", parts.join("; "))?;
                }
                Ok(())
            }
            Concern::UnknownDatacenter {
                cluster,
                datacenter,
                previous,
                suggestion,
            } => {
                write!(
                    f,
                    "cluster {cluster} moved from datacenter {previous} to {datacenter}, and no \
                     pool serves datacenter `{datacenter}`"
                )?;
                if let Some(s) = suggestion {
                    write!(f, "; did you mean `{s}`?")?;
                }
                write!(f, " (its allocations in {previous} would be released)")
            }
        }
    }
}

fn counted(map: &BTreeMap<String, usize>) -> String {
    map.iter()
        .map(|(name, n)| {
            if *n == 1 {
                format!("{name} (1 allocation)")
            } else {
                format!("{name} ({n} allocations)")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The releases of `plan` that are probably a mistake:
///
/// - releases because a cluster or a pool is missing from the input, when together they
///   would release every allocation (holding addresses) of the state or more than half;
/// - a cluster whose datacenter changed to one that no pool serves at all (each one).
pub fn suspicious_releases(
    plan: &Plan,
    stored: &[StoredAllocation],
    pools: &[PoolInput],
    clusters: &[ClusterInput],
) -> Vec<Concern> {
    let cluster_by_name: BTreeMap<&str, &ClusterInput> =
        clusters.iter().map(|c| (c.name.as_str(), c)).collect();
    let pool_names: BTreeSet<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    let served: BTreeSet<&str> = pools
        .iter()
        .flat_map(|p| p.datacenters.keys().map(String::as_str))
        .collect();
    let held = stored.iter().filter(|s| s.held.is_some()).count();

    let mut missing_clusters: BTreeMap<String, usize> = BTreeMap::new();
    let mut missing_pools: BTreeMap<String, usize> = BTreeMap::new();
    let mut released = 0;
    let mut moved: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for d in plan
        .decisions
        .iter()
        .filter(|d| d.change == Change::Release)
    {
        let holds = d.previous.is_some();
        match cluster_by_name.get(d.cluster.as_str()) {
            None => {
                if holds {
                    released += 1;
                    *missing_clusters.entry(d.cluster.clone()).or_default() += 1;
                }
            }
            Some(_) if !pool_names.contains(d.pool.as_str()) => {
                if holds {
                    released += 1;
                    *missing_pools.entry(d.pool.clone()).or_default() += 1;
                }
            }
            Some(c) => {
                let moved_away = !c.deleting && c.datacenter != d.datacenter;
                if moved_away && !served.contains(c.datacenter.as_str()) {
                    moved.insert(&c.name, (&c.datacenter, &d.datacenter));
                }
            }
        }
    }

    let mut concerns = Vec::new();
    if released > 0 && (released == held || released * 2 > held) {
        concerns.push(Concern::MassRelease {
            released,
            held,
            clusters: missing_clusters,
            pools: missing_pools,
        });
    }
    for (cluster, (datacenter, previous)) in moved {
        concerns.push(Concern::UnknownDatacenter {
            cluster: cluster.to_string(),
            datacenter: datacenter.to_string(),
            previous: previous.to_string(),
            suggestion: closest(datacenter, served.iter().copied()),
        });
    }
    concerns
}

/// The candidate closest to `word` when it is a plausible typo (at most two edits, and fewer
/// edits than half the word's length).
fn closest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Option<String> {
    let limit = 2.min(word.chars().count().div_ceil(2));
    candidates
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| c.to_string())
}

/// Levenshtein distance, counting an adjacent transposition as one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev2: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                cur[j] = cur[j].min(prev2[j - 2] + 1);
            }
        }
        prev2 = std::mem::replace(&mut prev, cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::Allocation;
    use crate::planner::Decision;
    use crate::resources::{AllocationType, Cluster, IPAMAllocation, IPAMPool};
    use crate::validation;

    // Inputs are built from manifests through the validation functions, as `kipam offline`
    // builds them, so these tests do not depend on the planner's struct layouts.

    fn held() -> Option<Allocation> {
        Some(Allocation::Prefix("10.0.0.0/30".parse().unwrap()))
    }

    fn stored(cluster: &str, pool: &str, dc: &str) -> StoredAllocation {
        stored_from(cluster, pool, dc, Some("10.0.0.0/30"))
    }

    fn stored_from(cluster: &str, pool: &str, dc: &str, cidr: Option<&str>) -> StoredAllocation {
        let obj: IPAMAllocation = serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMAllocation",
            "metadata": {"name": pool, "namespace": format!("cluster-{cluster}")},
            "spec": {"type": "prefix", "dc": dc, "cidr": cidr},
        }))
        .unwrap();
        validation::stored_allocation(&obj).unwrap()
    }

    fn release(cluster: &str, pool: &str, dc: &str) -> Decision {
        Decision {
            cluster: cluster.into(),
            pool: pool.into(),
            datacenter: dc.into(),
            type_: AllocationType::Prefix,
            change: Change::Release,
            held: None,
            previous: held(),
            message: String::new(),
        }
    }

    fn keep(cluster: &str, pool: &str, dc: &str) -> Decision {
        Decision {
            change: Change::Keep,
            held: held(),
            previous: None,
            ..release(cluster, pool, dc)
        }
    }

    fn pool(name: &str, dcs: &[&str]) -> PoolInput {
        let datacenters: serde_json::Map<String, serde_json::Value> = dcs
            .iter()
            .map(|d| {
                (
                    d.to_string(),
                    serde_json::json!({
                        "type": "prefix", "poolCidr": "10.0.0.0/16", "allocationPrefix": 30,
                    }),
                )
            })
            .collect();
        let obj: IPAMPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPool",
            "metadata": {"name": name},
            "spec": {"datacenters": datacenters},
        }))
        .unwrap();
        validation::pool_input(&obj).unwrap()
    }

    fn cluster(name: &str, dc: &str) -> ClusterInput {
        let obj: Cluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name},
            "spec": {"datacenter": dc},
        }))
        .unwrap();
        validation::cluster_input(&obj).unwrap()
    }

    fn plan(decisions: Vec<Decision>) -> Plan {
        Plan {
            decisions,
            usage: BTreeMap::new(),
            quarantined: Vec::new(),
        }
    }

    #[test]
    fn deleting_one_cluster_of_two_is_fine() {
        let stored = [stored("a", "p", "dc-1"), stored("b", "p", "dc-1")];
        let plan = plan(vec![keep("a", "p", "dc-1"), release("b", "p", "dc-1")]);
        let concerns = suspicious_releases(
            &plan,
            &stored,
            &[pool("p", &["dc-1"])],
            &[cluster("a", "dc-1")],
        );
        assert_eq!(concerns, vec![]);
    }

    #[test]
    fn more_than_half_or_all_clusters_missing_is_refused() {
        let stored = [
            stored("a", "p", "dc-1"),
            stored("b", "p", "dc-1"),
            stored("c", "p", "dc-1"),
        ];
        let pools = [pool("p", &["dc-1"])];
        let two_of_three = plan(vec![
            keep("a", "p", "dc-1"),
            release("b", "p", "dc-1"),
            release("c", "p", "dc-1"),
        ]);
        let concerns = suspicious_releases(&two_of_three, &stored, &pools, &[cluster("a", "dc-1")]);
        assert_eq!(concerns.len(), 1);
        let text = concerns[0].to_string();
        assert_eq!(
            text,
            "this run would release more than half of the allocations (2 of 3) of the state \
             because clusters missing from the input: b (1 allocation), c (1 allocation)"
        );

        let all = plan(vec![
            release("a", "p", "dc-1"),
            release("b", "p", "dc-1"),
            release("c", "p", "dc-1"),
        ]);
        let text = suspicious_releases(&all, &stored, &pools, &[])[0].to_string();
        assert!(
            text.starts_with("this run would release every allocation of the state"),
            "{text}"
        );

        // The only allocation of a state is "every allocation".
        let one = plan(vec![release("a", "p", "dc-1")]);
        assert_eq!(
            suspicious_releases(&one, &stored[..1], &pools, &[]).len(),
            1
        );
    }

    #[test]
    fn all_pools_missing_is_refused() {
        let stored = [stored("a", "p", "dc-1"), stored("a", "q", "dc-1")];
        let plan = plan(vec![release("a", "p", "dc-1"), release("a", "q", "dc-1")]);
        let concerns = suspicious_releases(&plan, &stored, &[], &[cluster("a", "dc-1")]);
        assert_eq!(
            concerns[0].to_string(),
            "this run would release every allocation of the state because pools missing from \
             the input: p (1 allocation), q (1 allocation)"
        );
    }

    #[test]
    fn released_failed_requests_do_not_count() {
        // b never got addresses: releasing its failed request loses nothing.
        let b = stored_from("b", "p", "dc-1", None);
        assert_eq!(b.held, None);
        let stored = [stored("a", "p", "dc-1"), b];
        let mut rb = release("b", "p", "dc-1");
        rb.previous = None;
        let plan = plan(vec![keep("a", "p", "dc-1"), rb]);
        assert_eq!(
            suspicious_releases(
                &plan,
                &stored,
                &[pool("p", &["dc-1"])],
                &[cluster("a", "dc-1")]
            ),
            vec![]
        );
    }

    #[test]
    fn a_datacenter_no_pool_serves_is_a_typo() {
        let stored = [
            stored("a", "p", "dc-1"),
            stored("b", "p", "dc-1"),
            stored("c", "p", "dc-1"),
        ];
        let pools = [pool("p", &["dc-1", "dc-2"])];
        let plan = plan(vec![
            release("a", "p", "dc-1"),
            keep("b", "p", "dc-1"),
            keep("c", "p", "dc-1"),
        ]);
        let concerns = suspicious_releases(
            &plan,
            &stored,
            &pools,
            &[
                cluster("a", "dc-l"),
                cluster("b", "dc-1"),
                cluster("c", "dc-1"),
            ],
        );
        assert_eq!(concerns.len(), 1);
        let text = concerns[0].to_string();
        assert!(
            text.contains("no pool serves datacenter `dc-l`; did you mean `dc-1`?"),
            "{text}"
        );
        // A move to a datacenter some pool serves is an intent.
        let concerns = suspicious_releases(
            &plan,
            &stored,
            &pools,
            &[
                cluster("a", "dc-2"),
                cluster("b", "dc-1"),
                cluster("c", "dc-1"),
            ],
        );
        assert_eq!(concerns, vec![]);
        // Far from every known name: no suggestion.
        let concerns = suspicious_releases(
            &plan,
            &stored,
            &pools,
            &[
                cluster("a", "elsewhere"),
                cluster("b", "dc-1"),
                cluster("c", "dc-1"),
            ],
        );
        assert!(matches!(
            &concerns[0],
            Concern::UnknownDatacenter {
                suggestion: None,
                ..
            }
        ));
    }

    #[test]
    fn edit_distance_counts_typos() {
        assert_eq!(edit_distance("dc-l", "dc-1"), 1);
        assert_eq!(edit_distance("dc-21", "dc-12"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(
            closest("dc-l", ["dc-1", "dc-2"].into_iter()),
            Some("dc-1".into())
        );
        assert_eq!(closest("x", ["dc-1"].into_iter()), None);
    }
}
