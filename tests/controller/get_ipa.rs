//! Issue 25, item 6: what `kubectl get ipa` shows. The API server builds the table from the
//! CRD's printer columns, each a JSONPath into the stored object; these tests read the columns
//! of the CRD as installed and evaluate them on the objects the controller wrote.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use super::support::{POOLS, Seed};

const WAIT: Duration = Duration::from_secs(30);

/// The value at a printer column's JSONPath (`.a.b`, `\.` inside a key), as the table shows
/// it: a string as it is, anything else as JSON, an empty cell when absent.
fn cell(object: &Value, path: &str) -> String {
    let mut keys = Vec::new();
    let mut key = String::new();
    let mut chars = path.trim_start_matches('.').chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => key.extend(chars.next()),
            '.' => keys.push(std::mem::take(&mut key)),
            _ => key.push(c),
        }
    }
    keys.push(key);
    let mut value = object;
    for k in &keys {
        match value.get(k) {
            Some(v) => value = v,
            None => return String::new(),
        }
    }
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// One row of `kubectl get ipa -o wide -n cluster-<cluster>`, by column name.
fn row(seed: &Seed, cluster: &str, pool: &str) -> BTreeMap<String, String> {
    let crd = seed
        .get(
            "customresourcedefinitions",
            None,
            "ipamallocations.ipam.kipam.dev",
        )
        .expect("the CRD is installed");
    let object = seed
        .get("ipamallocations", Some(&format!("cluster-{cluster}")), pool)
        .unwrap_or(Value::Null);
    let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    columns
        .iter()
        .filter(|c| c["type"] != "date")
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                cell(&object, c["jsonPath"].as_str().unwrap_or_default()),
            )
        })
        .collect()
}

fn shows(seed: &Seed, cluster: &str, pool: &str, column: &str) -> String {
    row(seed, cluster, pool)
        .get(column)
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_ipa_shows_phase_and_addresses_and_a_healthy_allocation_costs_one_write() {
    let seed = Seed::start("get-ipa").await;
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    seed.cluster("a", "dc-1");
    seed.cluster("b", "dc-1");
    seed.cluster("c", "dc-2");
    seed.wait_for("a, b and c allocated", WAIT, "ctl", |s| {
        s.allocations().len() == 5
            && s.allocations()
                .iter()
                .all(|a| a.phase().as_str() == "Allocated")
    })
    .await;
    // Whatever else the passes would write has had time to land.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let expected = |pool: &str, dc: &str, type_: &str, addresses: &str| {
        BTreeMap::from([
            ("Pool".to_string(), pool.to_string()),
            ("DC".to_string(), dc.to_string()),
            ("Type".to_string(), type_.to_string()),
            ("Addresses".to_string(), addresses.to_string()),
            ("Phase".to_string(), "Allocated".to_string()),
            ("Message".to_string(), String::new()),
        ])
    };
    assert_eq!(
        row(&seed, "a", "metallb"),
        expected("metallb", "dc-1", "range", "10.0.0.0-.3")
    );
    assert_eq!(
        row(&seed, "b", "metallb"),
        expected("metallb", "dc-1", "range", "10.0.0.4-.7")
    );
    assert_eq!(
        row(&seed, "a", "metallb-ipv6"),
        expected("metallb-ipv6", "dc-1", "range", "2001:db8::-2001:db8::f")
    );
    assert_eq!(
        row(&seed, "c", "metallb"),
        expected("metallb", "dc-2", "prefix", "10.1.0.0/28")
    );

    // One write per allocation: its create, which carried the phase and the addresses.
    let stats = seed.api.stats();
    assert_eq!(stats.count("create", "ipamallocations"), 5);
    for verb in ["update", "patch"] {
        for resource in ["ipamallocations", "ipamallocations/status"] {
            assert_eq!(stats.count(verb, resource), 0, "{verb} {resource}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_ipa_shows_failed_and_conflict() {
    let seed = Seed::start("get-ipa-phases").await;
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    // The dc-1 /28 holds four clusters of four: e waits.
    for c in ["a", "b", "c", "d", "e"] {
        seed.cluster(c, "dc-1");
    }
    seed.wait_for("a..d allocated, e failed", WAIT, "ctl", |s| {
        ["a", "b", "c", "d"]
            .iter()
            .all(|c| s.phase(c, "metallb") == "Allocated")
            && s.phase("e", "metallb") == "Failed"
    })
    .await;
    assert_eq!(shows(&seed, "e", "metallb", "Phase"), "Failed");
    assert_eq!(shows(&seed, "e", "metallb", "Addresses"), "");
    let message = shows(&seed, "e", "metallb", "Message");
    assert!(message.contains("free addresses"), "{message}");
    // Its IPv6 allocation is served.
    assert_eq!(shows(&seed, "e", "metallb-ipv6", "Phase"), "Allocated");

    // An exclusion over a's addresses: a's allocation is in conflict, kept as stored.
    let updates_before = seed.api.stats().count("update", "ipamallocations");
    let mut pool: Value = seed.get("ipampools", None, "metallb").expect("pool");
    pool["spec"]["datacenters"]["dc-1"]["excludeRanges"] = json!(["10.0.0.2"]);
    let pool = json!({"apiVersion": pool["apiVersion"], "kind": "IPAMPool",
        "metadata": {"name": "metallb"}, "spec": pool["spec"]});
    seed.api.apply(&pool).expect("exclusion added");
    seed.wait_for("a shown in conflict", WAIT, "ctl", |s| {
        shows(s, "a", "metallb", "Phase") == "Conflict"
    })
    .await;
    assert_eq!(shows(&seed, "a", "metallb", "Addresses"), "10.0.0.0-.3");
    assert!(
        shows(&seed, "a", "metallb", "Message").contains("10.0.0.2"),
        "{:?}",
        row(&seed, "a", "metallb")
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The phase changed once: one update for the label (the status has its own write).
    assert_eq!(
        seed.api.stats().count("update", "ipamallocations") - updates_before,
        1
    );
}
