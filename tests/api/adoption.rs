//! `GET /api/v2/seeds/{seed}/adoption`: the fleet's adoption plan, from the Clusters'
//! `status.adoption` in the cache, as the leader's planning pass writes them.

use std::path::Path;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use super::harness::*;
use super::openapi::{check, response_schema};

const ADOPTION: &str = "/api/v2/seeds/seed-1/adoption";

/// The three user clusters of `tests/fixtures/adopt` as Clusters whose `status.adoption` is
/// what the planning pass writes for that plan (the same planner, run by `kipam adopt`), and a
/// fourth cluster that does not adopt.
async fn fleet() -> Harness {
    let h = Harness::start().await;
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/adopt");
    let report = kipam::offline::adopt::run(&kipam::offline::adopt::AdoptOptions {
        pools: vec![fixtures.join("pools.yaml")],
        from: Some(fixtures.join("from")),
        ..Default::default()
    })
    .expect("the fixtures plan");
    for a in &report.plan.clusters {
        let adopt = if a.cluster == "bravo" {
            "\n  adopt: DryRun"
        } else {
            ""
        };
        h.api
            .apply_yaml(&format!(
                "apiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {}\nspec:\n  datacenter: {}{adopt}\n",
                a.cluster, a.datacenter
            ))
            .unwrap();
        let status = kipam::status::adoption_status(a);
        h.api
            .set_status(
                "clusters",
                None,
                &a.cluster,
                json!({"adoption": serde_json::to_value(&status).unwrap()}),
            )
            .unwrap();
    }
    h.api
        .apply_yaml("apiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: echo\nspec:\n  datacenter: dc-2\n")
        .unwrap();
    // The cache sees the statuses through the watch.
    for _ in 0..300 {
        let seen = h
            .ctx
            .clusters
            .state()
            .iter()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.adoption.is_some()))
            .count();
        if seen == 3 && h.ctx.clusters.state().len() == 4 {
            return h;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the cluster cache never saw the statuses");
}

fn cluster<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cluster"] == name)
        .unwrap_or_else(|| panic!("no {name} in {body}"))
}

#[tokio::test]
async fn the_fleets_adoption_is_served_from_the_cluster_statuses() {
    let h = fleet().await;
    h.api.reset_stats();
    let (status, body) = h.get(ADOPTION, "reader").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Only the clusters that adopt, by name; echo does not.
    let names: Vec<&str> = body["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cluster"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "bravo", "charlie"]);
    assert_eq!(
        body["summary"],
        json!({"clusters": 3, "states": {"NeedsLook": 2, "Adopting": 1}, "served": 8,
               "verdicts": {"Adopt": 5, "Contested": 2, "Outside": 1}, "conflicts": 2,
               "needsLook": ["alpha", "bravo"]})
    );
    // Both sides of the conflict name the other and the address.
    for (me, other) in [("alpha", "bravo"), ("bravo", "alpha")] {
        let c = cluster(&body, me);
        assert_eq!(c["datacenter"], "dc-1");
        assert_eq!(c["state"], "NeedsLook");
        assert_eq!(
            c["conflicts"],
            json!([{"with": other, "kind": "BothServe", "addresses": ["10.0.0.20"]}])
        );
        assert!(
            c["reasons"][0].as_str().unwrap().contains(other),
            "{}",
            c["reasons"]
        );
    }
    assert_eq!(cluster(&body, "bravo")["mode"], "DryRun");
    let charlie = cluster(&body, "charlie");
    assert_eq!(charlie["mode"], "Adopt");
    assert_eq!(
        charlie["adopt"],
        json!([{"pool": "metallb", "addresses": ["10.0.1.5-10.0.1.6", "10.0.1.9"]}])
    );
    assert_eq!(
        charlie["served"][3],
        json!({"address": "192.168.50.10", "services": ["apps/public"], "verdict": "Outside"})
    );
    assert_eq!(charlie["handMadePools"][0]["takenOverBy"], "metallb");
    // The answer is what the document says.
    let doc = kipam::api::openapi::document();
    check(
        &doc,
        response_schema(&doc, kipam::api::ADOPTION, "get", 200),
        &body,
        "adoption",
    )
    .unwrap();
    // Served from the cache: only the reviews reached the API server.
    let stats = h.api.stats();
    assert_eq!(stats.resource("clusters"), 0, "{:?}", stats.by_request);
}

#[tokio::test]
async fn the_datacenter_filter_narrows_the_clusters_and_the_figures() {
    let h = fleet().await;
    let (status, body) = h
        .get(&format!("{ADOPTION}?datacenter=dc-1"), "reader")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["summary"]["clusters"], 3);
    let (status, body) = h
        .get(&format!("{ADOPTION}?datacenter=dc-2"), "reader")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["clusters"], json!([]));
    assert_eq!(body["summary"]["clusters"], 0);
    assert_eq!(body["summary"]["needsLook"], json!([]));
    let (status, body) = h.get(&format!("{ADOPTION}?datacenter="), "reader").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("datacenter"),
        "{body}"
    );
    let (status, _) = h.call("GET", ADOPTION, None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = h.get("/api/v2/seeds/other/adoption", "reader").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn the_page_lists_adoption_and_its_clusters_needing_a_look() {
    let h = fleet().await;
    let (status, body) = h.get("/ui/api/summary", "reader").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let a = &body["adoption"];
    assert_eq!(a["summary"]["needsLook"], json!(["alpha", "bravo"]));
    // Those needing a look first, with the other cluster and the address.
    let rows = a["rows"].as_array().unwrap();
    let order: Vec<&str> = rows
        .iter()
        .map(|r| r["cluster"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["alpha", "bravo", "charlie"]);
    assert_eq!(
        rows[0]["conflicts"],
        json!([{"with": "bravo", "kind": "BothServe", "addresses": ["10.0.0.20"]}])
    );
    assert_eq!(rows[2]["verdicts"], json!({"Adopt": 3, "Outside": 1}));
    assert_eq!(
        rows[2]["handMade"],
        json!([
            "metallb-system/charlie-pool → metallb",
            "metallb-system/external"
        ])
    );
    // They count among what needs a look.
    assert_eq!(body["totals"]["attention"], 2);
}

async fn version(h: &Harness) -> Value {
    h.get("/ui/api/version", "reader").await.1["version"].clone()
}

#[tokio::test]
async fn the_page_version_moves_when_an_adoption_status_changes() {
    let h = fleet().await;
    let before = version(&h).await;
    assert_eq!(before, version(&h).await);
    h.api
        .set_status(
            "clusters",
            None,
            "charlie",
            json!({"adoption": {"mode": "Adopt", "state": "Adopted", "servedTotal": 3}}),
        )
        .unwrap();
    for _ in 0..300 {
        if version(&h).await != before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the version never moved");
}
