//! The sequences a model-based tester of `kipam offline` found (issue 51), each run as a GitOps
//! user runs it: one edit, one run with the state carried over and an explicit `--now`. Each
//! test asserts what a user would check: who holds which address after the last run, and that
//! nothing released went to another cluster inside its quarantine.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use kipam::offline::{OfflineError, OfflineOptions, OfflineReport};

use super::{Workdir, run_in_process};

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
        run_in_process(&OfflineOptions {
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
        &format!(
            "{}{b}{}",
            a(", excludeRanges: [10.0.0.0]"),
            cluster("c2", "")
        ),
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
    let last = s.ok(
        &format!("{q}{v}{}{}", cluster("c1", ""), cluster("c2", "")),
        120,
    );
    assert!(of(&last, "c2", "q").is_disjoint(&r_held));
    assert!(of(&last, "c1", "q").is_disjoint(&r_held));

    // The same state as an older kipam wrote it (no recorded space): refused, and told how.
    let old = s
        .state()
        .replace("ipam.kipam.dev/address-space", "example.com/unrelated");
    s.w.write("state.yaml", &old);
    let err = match s.run(
        &format!("{q}{v}{}{}", cluster("c1", ""), cluster("c2", "")),
        180,
    ) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a pool gone without a recorded space counts in every space"),
    };
    assert!(
        err.contains(
            "pool r is not in the input, so the space of IPAMAllocation cluster-c1/r is unknown"
        ) && err.contains("set its annotation ipam.kipam.dev/address-space to that space"),
        "{err}"
    );
}

/// A cluster that moves releases what a deleted `Retain` pool kept for it in its old
/// datacenter, as it releases every other allocation there: it is served, and its addons
/// rendered, in the new datacenter only.
#[test]
fn a_move_releases_what_a_retain_pool_kept() {
    let s = Sequence::new("retain-move");
    let r = pool(
        "r",
        "  reclaimPolicy: Retain\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 2}\n",
    );
    let first = s.ok(&format!("{r}{}", cluster("c1", "")), 0);
    assert_eq!(of(&first, "c1", "r").len(), 2);
    let kept = s.ok(&cluster("c1", ""), 60);
    assert_eq!(
        of(&kept, "c1", "r").len(),
        2,
        "kept by Retain while c1 stays"
    );
    let moved = cluster("c1", "").replace("datacenter: dc-1", "datacenter: dc-2");
    let after = s.ok(&moved, 120);
    let d = after
        .plan
        .decisions
        .iter()
        .find(|d| d.cluster == "c1" && d.pool == "r")
        .expect("a decision for c1's kept allocation");
    assert_eq!(d.change.to_string(), "released", "{d:?}");
    assert!(
        d.message.contains("moved from datacenter dc-1 to dc-2"),
        "{}",
        d.message
    );
    assert!(of(&after, "c1", "r").is_empty());
    assert!(!s.state().contains("cluster-c1"), "{}", s.state());
}

/// After every kind of edit, running again with no change writes nothing: the state file a
/// GitOps pipeline commits changes only when the inputs do.
#[test]
fn a_rerun_after_any_edit_writes_nothing() {
    let s = Sequence::new("rerun");
    let pools = |size: u32| {
        format!(
            "{}{}",
            pool(
                "lb",
                &format!(
                    "  datacenters:\n    dc-1: {{type: range, poolCidr: 10.0.0.0/27, allocationRange: {size}, reuseAfter: 1h}}\n    dc-2: {{type: range, poolCidr: 10.1.0.0/27, allocationRange: {size}}}\n"
                )
            ),
            pool(
                "nodes",
                "  datacenters:\n    dc-1: {type: prefix, poolCidr: 10.2.0.0/26, allocationPrefix: 29}\n",
            )
        )
    };
    let steps: Vec<(&str, String)> = vec![
        (
            "create",
            format!("{}{}{}", pools(4), cluster("c1", ""), cluster("c2", "")),
        ),
        (
            "pin",
            format!(
                "{}{}{}",
                pools(4),
                cluster("c1", ", ipam: {lb: {addresses: [10.0.0.20-10.0.0.23]}}"),
                cluster("c2", "")
            ),
        ),
        (
            "pin changed",
            format!(
                "{}{}{}",
                pools(4),
                cluster("c1", ", ipam: {lb: {addresses: [10.0.0.24-10.0.0.27]}}"),
                cluster("c2", "")
            ),
        ),
        (
            "subnet pinned",
            format!(
                "{}{}{}",
                pools(4),
                cluster("c1", ", ipam: {nodes: {cidr: 10.2.0.16/28}}"),
                cluster("c2", "")
            ),
        ),
        (
            "resized",
            format!("{}{}{}", pools(6), cluster("c1", ""), cluster("c2", "")),
        ),
        (
            "opted out",
            format!(
                "{}{}{}",
                pools(6),
                cluster("c1", ", ipam: {lb: {optOut: true}}"),
                cluster("c2", "")
            ),
        ),
        (
            "moved",
            format!(
                "{}{}{}",
                pools(6),
                cluster("c1", ""),
                cluster("c2", "").replace("dc-1", "dc-2")
            ),
        ),
        ("removed", format!("{}{}", pools(6), cluster("c1", ""))),
    ];
    let mut at = 0;
    for (what, manifests) in &steps {
        at += 60;
        s.ok(manifests, at);
        let before = s.state();
        at += 60;
        let again = s.ok(manifests, at);
        assert!(
            !again.state_written,
            "after {what}, a run with no change rewrote the state:\n--- before\n{before}\n--- after\n{}",
            s.state()
        );
    }
}

/// Unpinning a subnet, or removing a cluster's own `allocationPrefix`, leaves it a subnet of
/// another length than the pool's: that is no change of the pool's `allocationPrefix`, and is
/// not refused as one. A real change still is, naming what the pool said before.
#[test]
fn a_subnet_a_pin_or_override_gave_is_no_change_of_the_pools_allocation_prefix() {
    let nodes = |length: u32| {
        pool(
            "nodes",
            &format!(
                "  datacenters:\n    dc-1: {{type: prefix, poolCidr: 10.0.0.0/26, allocationPrefix: {length}}}\n"
            ),
        )
    };
    let s = Sequence::new("prefix-unpin");
    s.ok(&format!("{}{}", nodes(29), cluster("c1", "")), 0);
    let pinned = s.ok(
        &format!(
            "{}{}",
            nodes(29),
            cluster("c1", ", ipam: {nodes: {cidr: 10.0.0.16/28}}")
        ),
        60,
    );
    assert_eq!(of(&pinned, "c1", "nodes").len(), 16);
    s.ok(&format!("{}{}", nodes(29), cluster("c1", "")), 120);
    s.ok(
        &format!(
            "{}{}{}",
            nodes(29),
            cluster("c1", ""),
            cluster("c2", ", ipam: {nodes: {allocationPrefix: 28}}")
        ),
        180,
    );
    s.ok(
        &format!("{}{}{}", nodes(29), cluster("c1", ""), cluster("c2", "")),
        240,
    );
    let err = match s.run(
        &format!("{}{}{}", nodes(30), cluster("c1", ""), cluster("c2", "")),
        300,
    ) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a changed allocationPrefix is refused"),
    };
    assert!(
        err.contains(
            "IPAMPool nodes: spec.datacenters[dc-1].allocationPrefix \"30\": is immutable (was 29)"
        ),
        "{err}"
    );
}
