//! Adoption through the planner: what a user cluster serves becomes its allocation, contested
//! addresses go to nobody, and nobody else is given what read user clusters serve.

use kipam::planner::adopt::{self, Candidate, Discovered, HandMadePool, Reading, ServedService};
use kipam::planner::{Change, PlanInputs};
use kipam::resources::AdoptMode;

use super::{cluster_in, pool_input, stored_after};

const POOL: &str = "apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/26
      allocationRange: 8
";

fn found(pool: (&str, &str), served: &[(&str, &str)]) -> Discovered {
    Discovered {
        pools: vec![HandMadePool {
            namespace: "metallb-system".into(),
            name: pool.0.into(),
            addresses: vec![pool.1.into()],
        }],
        services: served
            .iter()
            .map(|(n, a)| ServedService {
                name: n.to_string(),
                addresses: vec![a.to_string()],
                pool: None,
            })
            .collect(),
    }
}

fn held(plan: &kipam::planner::Plan, cluster: &str) -> String {
    plan.decision(cluster, "metallb")
        .and_then(|d| d.held.as_ref())
        .map(|a| a.to_string())
        .unwrap_or_default()
}

#[test]
fn the_adopter_keeps_what_it_serves_the_contested_pair_waits_and_a_newcomer_gets_neither() {
    let pools = vec![pool_input(POOL)];
    // a and b both serve 10.0.0.5; c serves 10.0.0.20 and .22 from its own hand-made pool.
    let a = found(
        ("a-lb", "10.0.0.0-10.0.0.7"),
        &[("x/one", "10.0.0.5"), ("x/two", "10.0.0.2")],
    );
    let b = found(("b-lb", "10.0.0.5-10.0.0.9"), &[("y/one", "10.0.0.5")]);
    let c = found(
        ("c-lb", "10.0.0.16-10.0.0.23"),
        &[("z/one", "10.0.0.20"), ("z/two", "10.0.0.22")],
    );
    let candidates = [
        Candidate {
            name: "a",
            datacenter: "dc-1",
            mode: AdoptMode::Adopt,
            reading: Reading::Read(&a),
        },
        Candidate {
            name: "b",
            datacenter: "dc-1",
            mode: AdoptMode::Adopt,
            reading: Reading::Read(&b),
        },
        Candidate {
            name: "c",
            datacenter: "dc-1",
            mode: AdoptMode::Adopt,
            reading: Reading::Read(&c),
        },
    ];
    let adoption = adopt::plan(&pools, &[], &candidates);
    let mut clusters = vec![
        cluster_in("a", "dc-1", 1),
        cluster_in("b", "dc-1", 2),
        cluster_in("c", "dc-1", 3),
        // Registered afterwards, not adopting: served as any new cluster.
        cluster_in("d", "dc-1", 4),
    ];
    adopt::apply(&adoption, &mut clusters, &pools);
    let inputs = PlanInputs {
        pools: pools.clone(),
        clusters: clusters.clone(),
        stored: Vec::new(),
        quarantined: Vec::new(),
        now: 0,
        held_elsewhere: adoption.set_aside.clone(),
    };
    let plan = inputs.plan();
    // c: exactly what it serves, not allocationRange.
    assert_eq!(held(&plan, "c"), "10.0.0.20-10.0.0.20,10.0.0.22-10.0.0.22");
    assert_eq!(
        plan.decision("c", "metallb").map(|d| d.change),
        Some(Change::Create)
    );
    // a and b: held, nothing written, each told about the other.
    for (me, other) in [("a", "b"), ("b", "a")] {
        let d = plan.decision(me, "metallb");
        assert!(d.is_none_or(|d| d.held.is_none()), "{me} got {d:?}");
        let why = clusters
            .iter()
            .find(|x| x.name == me)
            .and_then(|x| x.hold.clone());
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains(other) && w.contains("10.0.0.5")),
            "{why:?}"
        );
    }
    // d: nothing any of them serves or may still hand out.
    let d = held(&plan, "d");
    assert_eq!(
        d, "10.0.0.10-10.0.0.15,10.0.0.24-10.0.0.25",
        "d must skip 0-9 (the pools of a and b) and 16-23 (the pool of c)"
    );

    // Next round: c keeps its two addresses (no growth to allocationRange), d keeps its own.
    let stored = stored_after(&plan, &pools);
    let again = PlanInputs { stored, ..inputs }.plan();
    assert_eq!(held(&again, "c"), "10.0.0.20-10.0.0.20,10.0.0.22-10.0.0.22");
    assert_eq!(
        again.decision("c", "metallb").map(|d| d.change),
        Some(Change::Keep)
    );
    assert_eq!(held(&again, "d"), "10.0.0.10-10.0.0.15,10.0.0.24-10.0.0.25");
}

#[test]
fn a_dry_run_writes_nothing_and_an_unread_cluster_waits() {
    let pools = vec![pool_input(POOL)];
    let a = found(("a-lb", "10.0.0.0-10.0.0.7"), &[("x/one", "10.0.0.5")]);
    let candidates = [
        Candidate {
            name: "a",
            datacenter: "dc-1",
            mode: AdoptMode::DryRun,
            reading: Reading::Read(&a),
        },
        Candidate {
            name: "b",
            datacenter: "dc-1",
            mode: AdoptMode::Adopt,
            reading: Reading::NotYet,
        },
    ];
    let adoption = adopt::plan(&pools, &[], &candidates);
    let mut clusters = vec![cluster_in("a", "dc-1", 1), cluster_in("b", "dc-1", 2)];
    adopt::apply(&adoption, &mut clusters, &pools);
    let plan = PlanInputs {
        pools,
        clusters: clusters.clone(),
        stored: Vec::new(),
        quarantined: Vec::new(),
        now: 0,
        held_elsewhere: adoption.set_aside.clone(),
    }
    .plan();
    assert!(
        plan.decision("a", "metallb")
            .is_none_or(|d| d.held.is_none())
    );
    assert!(
        plan.decision("b", "metallb")
            .is_none_or(|d| d.held.is_none())
    );
    assert!(
        clusters[0]
            .hold
            .as_deref()
            .is_some_and(|h| h.contains("DryRun"))
    );
    assert!(
        clusters[1]
            .hold
            .as_deref()
            .is_some_and(|h| h.contains("not been read"))
    );
}
