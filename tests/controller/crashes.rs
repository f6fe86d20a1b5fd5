//! Crashes at random points and two replicas at once: afterwards no overlap, no leak, every
//! cluster allocated.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::support::Seed;

/// Pools large enough for hundreds of clusters: an IPv4 range pool and an IPv6 prefix pool.
pub const POOLS: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: lb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/20
      allocationRange: 8
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: lb6
spec:
  datacenters:
    dc-1:
      type: prefix
      poolCidr: 2001:db8::/48
      allocationPrefix: 64
";

struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(7);
        eprintln!("random seed {seed}");
        Rng(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn all_allocated(seed: &Seed, clusters: usize) -> bool {
    (0..clusters).all(|i| {
        let c = format!("c{i:03}");
        seed.phase(&c, "lb") == "Allocated" && seed.phase(&c, "lb6") == "Allocated"
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_points_while_200_clusters_arrive() {
    let seed = Seed::start("sigkill").await;
    seed.apply(POOLS);
    let mut rng = Rng::seeded();
    let mut generation = 0;
    let mut ctl = seed.controller("ctl-0");
    let mut created = 0;
    while created < 200 {
        // A burst of clusters, then maybe a crash somewhere in the middle of serving them.
        let burst = 20 + rng.below(30) as usize;
        for _ in 0..burst.min(200 - created) {
            seed.cluster(&format!("c{created:03}"), "dc-1");
            created += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(800))).await;
        if rng.below(3) > 0 {
            ctl.kill();
            generation += 1;
            ctl = seed.controller(&format!("ctl-{generation}"));
        }
    }
    let last = ctl.identity.clone();
    seed.wait_for(
        "all 200 clusters allocated after the crashes",
        Duration::from_secs(90),
        &last,
        |s| all_allocated(s, 200),
    )
    .await;
    assert!(generation >= 1, "at least one crash happened");
    assert_eq!(seed.assert_no_overlap_no_leak(), 400);
    // Restarting once more changes nothing.
    ctl.kill();
    let before: Vec<_> = seed
        .allocations()
        .into_iter()
        .map(|a| (a.metadata.namespace, a.spec))
        .collect();
    let _again = seed.controller("ctl-final");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after: Vec<_> = seed
        .allocations()
        .into_iter()
        .map(|a| (a.metadata.namespace, a.spec))
        .collect();
    assert_eq!(before, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_at_once_then_the_leader_dies() {
    let seed = Seed::start("two").await;
    // A lagging watch cache: both replicas see every change 300 ms late.
    seed.api.set_watch_delay(Duration::from_millis(300));
    seed.apply(POOLS);
    let mut one = seed.controller("one");
    let mut two = seed.controller("two");
    for i in 0..100 {
        seed.cluster(&format!("c{i:03}"), "dc-1");
    }
    seed.wait_for(
        "100 clusters allocated by two replicas",
        Duration::from_secs(60),
        "one",
        |s| all_allocated(s, 100),
    )
    .await;
    assert_eq!(seed.assert_no_overlap_no_leak(), 200);
    let lease = seed
        .get("leases", Some("kipam-system"), "kipam-seed")
        .expect("lease exists");
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(holder == "one" || holder == "two", "holder {holder}");
    // Kill the leader without a hand-over: the other takes over and serves new clusters.
    if holder == "one" {
        one.kill();
    } else {
        two.kill();
    }
    for i in 100..120 {
        seed.cluster(&format!("c{i:03}"), "dc-1");
    }
    let survivor = if holder == "one" { "two" } else { "one" };
    seed.wait_for(
        "the survivor takes over",
        Duration::from_secs(60),
        survivor,
        |s| all_allocated(s, 120),
    )
    .await;
    assert_eq!(seed.assert_no_overlap_no_leak(), 240);
    let lease = seed
        .get("leases", Some("kipam-system"), "kipam-seed")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], survivor);
    assert!(one.is_running() || two.is_running());
}
