//! Rolling upgrades: every pool record carries the record format of the kipam that wrote it,
//! and a replica never commits into a record of a newer format than it knows.

use std::time::Duration;

use serde_json::{Value, json};

use kipam::resources::RECORD_FORMAT;

use super::support::Seed;

const POOL: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: lb}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 4}
";

fn records_of(seed: &Seed, pool: &str) -> Vec<Value> {
    seed.api
        .list("ipampoolrecords", None)
        .into_iter()
        .filter(|r| r["spec"]["pool"] == pool)
        .collect()
}

/// A newer kipam (one record format above this one's) has written the pool's records while
/// this replica still leads, as during a rolling upgrade: it hands nothing out there, writes none of
/// those records, and says so on the pool and in its log. Once only replicas that know the
/// format run, the cluster that waited is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_commits_nothing_into_records_of_a_newer_format() {
    let seed = Seed::start("record-format").await;
    seed.apply(POOL);
    let mut old = seed.controller("r0");
    seed.cluster("c1", "dc-1");
    seed.wait_for("c1 allocated", Duration::from_secs(30), "r0", |s| {
        s.phase("c1", "lb") == "Allocated"
    })
    .await;
    let written = records_of(&seed, "lb");
    assert!(!written.is_empty());
    for r in &written {
        assert_eq!(
            r["spec"]["format"],
            json!(RECORD_FORMAT),
            "every record kipam writes carries its format: {r}"
        );
    }

    // A newer kipam writes every record of the pool in its format.
    for mut r in written {
        r["spec"]["format"] = json!(RECORD_FORMAT + 1);
        seed.api.apply(&r).expect("the newer kipam's write");
    }
    let newer: Vec<Value> = records_of(&seed, "lb");
    seed.cluster("c2", "dc-1");
    seed.wait_for(
        "the pool says a newer format holds it back",
        Duration::from_secs(30),
        "r0",
        |s| {
            s.condition("ipampools", "lb", "RecordsOfNewerFormat")
                .is_some_and(|c| c["status"] == "True" && c["reason"] == "UpgradeInProgress")
        },
    )
    .await;
    seed.wait_for(
        "the refusal is logged",
        Duration::from_secs(30),
        "r0",
        |s| {
            s.log("r0").contains(&format!(
                "written in record format {} by a newer kipam",
                RECORD_FORMAT + 1
            ))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        seed.held("c2", "lb"),
        "",
        "nothing handed out under rules it does not know"
    );
    let after = records_of(&seed, "lb");
    let versions = |list: &[Value]| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = list
            .iter()
            .map(|r| {
                (
                    r["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    r["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        versions(&after),
        versions(&newer),
        "no record of the newer format was written"
    );

    // The upgrade finishes: the old replica goes, one that knows the format (here: the same
    // binary over records it knows) leads.
    old.kill();
    for mut r in after {
        r["spec"]["format"] = json!(RECORD_FORMAT);
        seed.api.apply(&r).expect("records of a known format");
    }
    let _new = seed.controller("r1");
    seed.wait_for("c2 served", Duration::from_secs(60), "r1", |s| {
        s.phase("c2", "lb") == "Allocated"
    })
    .await;
    seed.wait_for(
        "the condition is gone",
        Duration::from_secs(30),
        "r1",
        |s| {
            s.condition("ipampools", "lb", "RecordsOfNewerFormat")
                .is_none()
        },
    )
    .await;
    assert_eq!(seed.assert_no_overlap_no_leak(), 2);
}
