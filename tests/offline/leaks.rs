//! The sequences a model-based tester of `kipam offline` found (issue 51), each run as a GitOps
//! user runs it: one edit, one run with the state carried over and an explicit `--now`. Each
//! test asserts what a user would check: who holds which address after the last run, and that
//! nothing released went to another cluster inside its quarantine.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use kipam::offline::{OfflineError, OfflineOptions, OfflineReport, run};

use super::Workdir;

/// 2026-11-25T18:00:00Z.
const T0: i64 = 1_764_093_600;

/// One user's sequence of edits and runs over one state file.
struct Sequence {
    w: Workdir,
}

impl Sequence {
    fn new(name: &str) -> Self {
        Sequence {
            w: Workdir::new(name),
        }
    }

    /// One run over `manifests` at `T0 + seconds`.
    fn run(&self, manifests: &str, seconds: i64) -> Result<OfflineReport, OfflineError> {
        let file = self.w.write("in.yaml", manifests);
        run(&OfflineOptions {
            files: vec![file],
            state: self.w.path("state.yaml"),
            now: kipam::offline::quarantine::time_text(T0 + seconds),
            allow_release: true,
            allow_empty_state: false,
        })
    }

    /// [`Self::run`], which must succeed.
    fn ok(&self, manifests: &str, seconds: i64) -> OfflineReport {
        match self.run(manifests, seconds) {
            Ok(r) => r,
            Err(e) => panic!("run at +{seconds}s refused:\n{e}\nmanifests:\n{manifests}"),
        }
    }

    fn state(&self) -> String {
        self.w.read("state.yaml")
    }
}

/// (cluster, pool) -> the IPv4 addresses it holds after `report`.
fn holdings(report: &OfflineReport) -> BTreeMap<(String, String), BTreeSet<Ipv4Addr>> {
    let mut out: BTreeMap<(String, String), BTreeSet<Ipv4Addr>> = BTreeMap::new();
    for obj in &report.allocations {
        let s = kipam::validation::stored_allocation(obj).expect("the state reads");
        let Some(held) = s.held else { continue };
        let set = out.entry((s.cluster, s.pool)).or_default();
        for r in held.ranges() {
            for a in r.first()..=r.last() {
                set.insert(Ipv4Addr::from(a as u32));
            }
        }
    }
    out
}

/// What `cluster` holds through `pool`.
fn of(report: &OfflineReport, cluster: &str, pool: &str) -> BTreeSet<Ipv4Addr> {
    holdings(report)
        .remove(&(cluster.to_string(), pool.to_string()))
        .unwrap_or_default()
}

fn ip(text: &str) -> Ipv4Addr {
    text.parse().expect("an IPv4 address")
}

fn cluster(name: &str, extra: &str) -> String {
    format!(
        "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: {name}}}\nspec: {{datacenter: dc-1{extra}}}\n"
    )
}

fn pool(name: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {{name: {name}}}\nspec:\n{spec}"
    )
}

/// Excluding a quarantined address in one pool must not end its quarantine for the other
/// pools of the address space: only a `reuseAfter` change or the pool's deletion do.
#[test]
fn excluding_a_quarantined_address_keeps_it_quarantined_for_the_space() {
    let s = Sequence::new("leak-exclude");
    let a = |exclude: &str| {
        pool(
            "a",
            &format!(
                "  datacenters:\n    dc-1: {{type: range, poolCidr: 10.0.0.0/28, allocationRange: 2, reuseAfter: 1h{exclude}}}\n"
            ),
        )
    };
    let b = pool(
        "b",
        "  datacenters:\n    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}\n",
    );
    let first = s.ok(&format!("{}{b}{}", a(""), cluster("c1", "")), 0);
    let released = of(&first, "c1", "a");
    assert_eq!(
        released,
        BTreeSet::from([ip("10.0.0.0"), ip("10.0.0.1")]),
        "c1 holds the pool's first addresses through a"
    );
    s.ok(&format!("{}{b}", a("")), 60);
    s.ok(&format!("{}{b}", a(", excludeRanges: [10.0.0.0]")), 120);
    let last = s.ok(
        &format!("{}{b}{}", a(", excludeRanges: [10.0.0.0]"), cluster("c2", "")),
        180,
    );
    for p in ["a", "b"] {
        let got = of(&last, "c2", p);
        assert!(
            got.is_disjoint(&released),
            "c2 got {got:?} through {p} three minutes after c1 released {released:?} (an hour's quarantine)"
        );
    }
}

/// A pool's gateway that lies in another space's quarantined range: the whole release is
/// quarantined, and the former holder gets its addresses back.
#[test]
fn a_gateway_inside_a_released_range_is_quarantined_with_it() {
    let v = pool(
        "v",
        "  addressSpace: vrf-b\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2, reuseAfter: 1h}\n",
    );
    let gw = pool(
        "gw",
        "  datacenters:\n    dc-1:\n      type: range\n      poolCidr: 10.0.0.0/28\n      allocationRange: 2\n      excludeRanges: [10.0.0.1]\n      network: {gateway: 10.0.0.1}\n",
    );
    for comes_back in ["c2", "c1"] {
        let s = Sequence::new(&format!("leak-gateway-{comes_back}"));
        let first = s.ok(&format!("{v}{}", cluster("c1", "")), 0);
        let released = of(&first, "c1", "v");
        assert_eq!(released, BTreeSet::from([ip("10.0.0.0"), ip("10.0.0.1")]));
        s.ok(&format!("{v}{gw}{}", cluster("c1", "")), 60);
        s.ok(&format!("{v}{gw}"), 120);
        s.ok(&v, 180);
        let last = s.ok(&format!("{v}{}", cluster(comes_back, "")), 240);
        let got = of(&last, comes_back, "v");
        if comes_back == "c1" {
            assert_eq!(
                got, released,
                "c1, re-created inside its quarantine, gets its old addresses back"
            );
        } else {
            assert!(
                got.is_disjoint(&released),
                "c2 got {got:?} inside c1's hour of quarantine of {released:?}"
            );
        }
    }
}

/// Deleting a `Retain` pool of another address space that held the same addresses must not
/// drop the quarantine of the pool the cluster opted out of.
#[test]
fn deleting_a_retain_pool_keeps_another_pools_quarantine() {
    let s = Sequence::new("leak-retain");
    let q = pool(
        "q",
        "  datacenters:\n    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2, reuseAfter: 1h}\n",
    );
    let r = pool(
        "r",
        "  addressSpace: vrf-b\n  reclaimPolicy: Retain\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}\n",
    );
    let first = s.ok(&format!("{q}{r}{}", cluster("c1", "")), 0);
    let released = of(&first, "c1", "q");
    assert_eq!(released, BTreeSet::from([ip("10.0.0.0"), ip("10.0.0.1")]));
    let opt_out = ", ipam: {q: {optOut: true}}";
    s.ok(&format!("{q}{r}{}", cluster("c1", opt_out)), 60);
    s.ok(&format!("{q}{}", cluster("c1", opt_out)), 120);
    s.ok(&q, 180);
    let last = s.ok(&format!("{q}{}", cluster("c2", "")), 240);
    let got = of(&last, "c2", "q");
    assert!(
        got.is_disjoint(&released),
        "c2 got {got:?} through q four minutes after c1 let {released:?} go (an hour's quarantine)"
    );
}

/// Deleting a `Retain` pool whose network another address space reuses: the kept allocation
/// stays reserved in its own space, and kipam does not refuse its own state. A state written
/// before allocations recorded their space is refused with the annotation that settles it.
#[test]
fn deleting_a_retain_pool_keeps_its_allocation_in_its_own_space() {
    let s = Sequence::new("retain-space");
    let r = pool(
        "r",
        "  reclaimPolicy: Retain\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}\n",
    );
    let v = pool(
        "v",
        "  addressSpace: vrf-b\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}\n",
    );
    let first = s.ok(&format!("{r}{v}{}", cluster("c1", "")), 0);
    let r_held = of(&first, "c1", "r");
    let v_held = of(&first, "c1", "v");
    assert_eq!(r_held, v_held, "two spaces: the same addresses once each");
    assert!(s.state().contains("ipam.kipam.dev/address-space: default"));
    let after = s.ok(&format!("{v}{}", cluster("c1", "")), 60);
    assert_eq!(of(&after, "c1", "r"), r_held, "kept by Retain");
    assert_eq!(of(&after, "c1", "v"), v_held);
    // A newcomer of the default space does not get what r keeps.
    let q = pool(
        "q",
        "  datacenters:\n    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}\n",
    );
    let last = s.ok(&format!("{q}{v}{}{}", cluster("c1", ""), cluster("c2", "")), 120);
    assert!(of(&last, "c2", "q").is_disjoint(&r_held));
    assert!(of(&last, "c1", "q").is_disjoint(&r_held));

    // The same state as an older kipam wrote it (no recorded space): refused, and told how.
    let old = s.state().replace("ipam.kipam.dev/address-space", "example.com/unrelated");
    s.w.write("state.yaml", &old);
    let err = match s.run(&format!("{q}{v}{}{}", cluster("c1", ""), cluster("c2", "")), 180) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a pool gone without a recorded space counts in every space"),
    };
    assert!(
        err.contains("pool r is not in the input, so the space of IPAMAllocation cluster-c1/r is unknown")
            && err.contains("set its annotation ipam.kipam.dev/address-space to that space"),
        "{err}"
    );
}
