//! Every route and its status codes, with an admin token.

use axum::http::StatusCode;
use serde_json::json;

use super::harness::*;

fn usage_status() -> serde_json::Value {
    json!({"datacenters": {"dc-1": {
        "total": "256", "allocated": "8", "excluded": "4", "available": "244",
        "allocations": 1, "largestFreeBlock": "240", "fragmentationPercent": 1,
        "utilisationPercent": 3
    }}})
}

#[tokio::test]
async fn list_and_get_answer_kkp_model_with_usage_from_the_cache() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    h.api
        .set_status("ipampools", None, "metallb", usage_status())
        .unwrap();
    // The cache sees the status through the watch.
    for _ in 0..200 {
        let (_, v) = h.get(&format!("{POOLS}/metallb"), "admin").await;
        if v["datacenters"]["dc-1"]["usage"].is_object() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    h.api.reset_stats();
    let (status, list) = h.get(POOLS, "admin").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(
        list,
        json!([{
            "name": "metallb",
            "reclaimPolicy": "Delete",
            "datacenters": {
                "dc-1": {
                    "type": "range", "poolCidr": "10.0.0.0/24", "allocationRange": 8,
                    "excludeRanges": ["10.0.0.1", "10.0.0.5-10.0.0.7"], "strategy": "FirstFit",
                    "usage": {
                        "total": "256", "allocated": "8", "excluded": "4", "available": "244",
                        "largestFreeBlock": "240", "utilisationPercent": 3,
                        "fragmentationPercent": 1, "allocations": 1
                    }
                },
                "dc-2": {
                    "type": "prefix", "poolCidr": "10.1.0.0/24", "allocationPrefix": 28,
                    "excludePrefixes": ["10.1.0.0/28"], "strategy": "FirstFit"
                }
            }
        }])
    );
    let (status, one) = h.get(&format!("{POOLS}/metallb"), "admin").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one, list[0]);
    // Reads are served from the cache: only the reviews reached the API server.
    let stats = h.api.stats();
    assert_eq!(stats.resource("ipampools"), 0, "{:?}", stats.by_request);

    let (status, body) = h.get(&format!("{POOLS}/nothing"), "admin").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_of(status, &body).contains("\"nothing\" not found"));
}

#[tokio::test]
async fn post_creates_a_validated_pool_and_refuses_a_second_one() {
    let h = Harness::start().await;
    let (status, created) = h.send("POST", POOLS, "admin", kkp_pool("metallb")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["name"], "metallb");
    assert_eq!(
        created["datacenters"]["aws-eu-central-1a"]["excludePrefixes"],
        json!(["192.168.1.0/30", "192.168.1.8/30"])
    );
    let stored = h.api.get("ipampools", None, "metallb").unwrap();
    assert_eq!(
        stored["spec"]["datacenters"]["azure-westeurope"]["allocationRange"],
        8
    );
    assert_eq!(
        stored["spec"]["datacenters"]["azure-westeurope"]["excludeRanges"],
        json!(["192.168.1.1", "192.168.1.5-192.168.1.7"])
    );

    // Known to the cache: refused before the API server is asked.
    h.wait_cached("metallb", true).await;
    let (status, body) = h.send("POST", POOLS, "admin", kkp_pool("metallb")).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(error_of(status, &body).contains("already exists"), "{body}");

    // Not yet in the cache: the API server's AlreadyExists is a 409 too.
    h.api
        .apply_yaml(&METALLB.replace("name: metallb", "name: fresh"))
        .unwrap();
    let (status, body) = h.send("POST", POOLS, "admin", kkp_pool("fresh")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test]
async fn post_runs_kipam_validate_rules_and_names_every_problem() {
    let h = Harness::start().await;
    let mut pool = kkp_pool("bad");
    pool["datacenters"]["azure-westeurope"]["allocationRange"] = json!(0);
    pool["datacenters"]["aws-eu-central-1a"]["poolCidr"] = json!("192.168.1.1/26");
    let (status, body) = h.send("POST", POOLS, "admin", pool).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let message = error_of(status, &body);
    let details = body["error"]["details"].as_array().unwrap();
    assert_eq!(details.len(), 2, "{body}");
    assert!(message.contains("allocationRange"), "{message}");
    assert!(message.contains("\"192.168.1.1/26\""), "{message}");
    assert!(h.api.get("ipampools", None, "bad").is_none());

    // Names follow the same rules.
    let (status, body) = h.send("POST", POOLS, "admin", kkp_pool("Not_A_Name")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(error_of(status, &body).contains("metadata.name"));
    let mut unnamed = kkp_pool("x");
    unnamed.as_object_mut().unwrap().remove("name");
    let (status, body) = h.send("POST", POOLS, "admin", unnamed).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_of(status, &body).contains("name: is required"));
}

#[tokio::test]
async fn bodies_that_are_not_a_pool_are_refused_cleanly() {
    let h = Harness::start().await;
    let mut unknown = kkp_pool("p");
    unknown["datacenters"]["azure-westeurope"]["allocationRnage"] = json!(8);
    let (status, body) = h.send("POST", POOLS, "admin", unknown).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        error_of(status, &body).contains("unknown field `allocationRnage`"),
        "{body}"
    );
    let mut top = kkp_pool("p");
    top["spec"] = json!({});
    let (status, body) = h.send("POST", POOLS, "admin", top).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_of(status, &body).contains("unknown field `spec`"));

    for raw in [
        "{\"name\": ",
        "not json",
        "",
        "[1, 2]",
        "{\"name\": \"p\", \"datacenters\": {\"dc\": {\"type\": \"hexagon\", \"poolCidr\": \"10.0.0.0/24\"}}}",
    ] {
        let (status, body) = h
            .call(
                "POST",
                POOLS,
                Some("admin"),
                Some(axum::body::Body::from(raw)),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{raw}: {body}");
        error_of(status, &body);
    }
    assert!(h.api.list("ipampools", None).is_empty());
}

#[tokio::test]
async fn patch_is_a_merge_patch_that_keeps_what_it_does_not_name() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    let path = format!("{POOLS}/metallb");
    // KKP's own PATCH would drop the exclusions here.
    let (status, body) = h
        .send(
            "PATCH",
            &path,
            "admin",
            json!({"datacenters": {"dc-1": {"allocationRange": 16}}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let stored = h.api.get("ipampools", None, "metallb").unwrap();
    let dc1 = &stored["spec"]["datacenters"]["dc-1"];
    assert_eq!(dc1["allocationRange"], 16);
    assert_eq!(
        dc1["excludeRanges"],
        json!(["10.0.0.1", "10.0.0.5-10.0.0.7"])
    );
    assert_eq!(
        stored["spec"]["datacenters"]["dc-2"]["excludePrefixes"],
        json!(["10.1.0.0/28"])
    );
    assert_eq!(body["datacenters"]["dc-1"]["allocationRange"], 16);

    // A whole pool read with GET can be sent back (usage included, ignored).
    h.wait_cached("metallb", true).await;
    let (_, current) = h.get(&path, "admin").await;
    let (status, body) = h.send("PATCH", &path, "admin", current).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // null removes: an exclusion list, then a datacenter without allocations.
    let (status, _) = h
        .send("PATCH", &path, "admin", json!({"datacenters": {"dc-1": {"excludeRanges": null}, "dc-2": null}, "reclaimPolicy": "Retain"}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let stored = h.api.get("ipampools", None, "metallb").unwrap();
    assert!(
        stored["spec"]["datacenters"]["dc-1"]
            .get("excludeRanges")
            .is_none()
    );
    assert!(stored["spec"]["datacenters"].get("dc-2").is_none());
    assert_eq!(stored["spec"]["reclaimPolicy"], "Retain");
}

#[tokio::test]
async fn patch_refusals_leave_the_pool_unchanged() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    let path = format!("{POOLS}/metallb");
    let before = h.api.get("ipampools", None, "metallb").unwrap();
    h.allocation(
        r#"
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMAllocation
metadata: {name: metallb, namespace: cluster-c1, resourceVersion: "1"}
spec: {type: range, dc: dc-1, addresses: ["10.0.0.8-10.0.0.15"]}
"#,
    )
    .await;
    let cases = [
        (
            json!({"datacenters": {"dc-1": {"poolCidr": "10.9.0.0/24"}}}),
            "poolCidr",
        ),
        (
            json!({"datacenters": {"dc-1": {"excludeRanges": ["10.0.0.9"]}}}),
            "10.0.0.9",
        ),
        (
            json!({"datacenters": {"dc-1": {"colour": "red"}}}),
            "unknown field `colour`",
        ),
        (json!({"name": "other"}), "cannot be changed"),
        (json!(["not", "an", "object"]), "JSON object"),
        (
            json!({"datacenters": {"dc-1": {"type": null}}}),
            "missing field `type`",
        ),
    ];
    for (patch, expected) in cases {
        let (status, body) = h.send("PATCH", &path, "admin", patch.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{patch}: {body}");
        let message = error_of(status, &body);
        assert!(message.contains(expected), "{patch}: {message}");
    }
    assert_eq!(h.api.get("ipampools", None, "metallb").unwrap(), before);

    let (status, body) = h
        .send("PATCH", &format!("{POOLS}/nothing"), "admin", json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // Write conflicts that never end (the pool's spec unchanged each time) are retried a few
    // times, then answered 409.
    h.api.inject_failures("update", "ipampools", 5, 409);
    let (status, body) = h
        .send(
            "PATCH",
            &path,
            "admin",
            json!({"datacenters": {"dc-1": {"allocationRange": 9}}}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = error_of(status, &body);
    assert!(message.contains("try again"), "{message}");
    assert_eq!(h.api.pending_failures(), 0);
    // Any other API server failure is not the client's: never a 500.
    h.api.inject_failures("update", "ipampools", 1, 500);
    let (status, body) = h
        .send(
            "PATCH",
            &path,
            "admin",
            json!({"datacenters": {"dc-1": {"allocationRange": 9}}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(h.api.get("ipampools", None, "metallb").unwrap(), before);
}

/// On a real API server kipam's own status write of a pool (usage, right after it is created)
/// bumps its resourceVersion: a PATCH whose read comes before that write and whose update after
/// it must still succeed, because what the client changed was not touched.
#[tokio::test]
async fn patch_right_after_post_survives_kipams_own_status_write() {
    let h = Harness::start().await;
    let (status, body) = h.send("POST", POOLS, "admin", kkp_pool("p")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let api = h.api.clone();
    h.api
        .after_next_get("ipampools", None, "p", move || {
            api.set_status("ipampools", None, "p", usage_status())
                .expect("status write");
        })
        .unwrap();
    let path = format!("{POOLS}/p");
    let (status, body) = h
        .send(
            "PATCH",
            &path,
            "admin",
            json!({"datacenters": {"azure-westeurope": {"allocationRange": 4}}}),
        )
        .await;
    assert_eq!(h.api.pending_get_hooks(), 0, "the status write happened");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["datacenters"]["azure-westeurope"]["allocationRange"],
        4
    );
    let stored = h.api.get("ipampools", None, "p").unwrap();
    let dc = &stored["spec"]["datacenters"]["azure-westeurope"];
    assert_eq!(dc["allocationRange"], 4);
    assert_eq!(
        dc["excludeRanges"],
        json!(["192.168.1.1", "192.168.1.5-192.168.1.7"])
    );
    // kipam's status write is kept, not overwritten.
    assert_eq!(stored["status"], usage_status());
}

/// A change of the pool's spec by someone else between the read and the write is a real
/// conflict: 409, and neither change is lost silently (theirs stays, ours is not applied).
#[tokio::test]
async fn patch_racing_another_spec_change_is_a_conflict() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    let api = h.api.clone();
    h.api
        .after_next_get("ipampools", None, "metallb", move || {
            api.apply_yaml(&METALLB.replace("allocationRange: 8", "allocationRange: 12"))
                .expect("concurrent spec change");
        })
        .unwrap();
    let (status, body) = h
        .send(
            "PATCH",
            &format!("{POOLS}/metallb"),
            "admin",
            json!({"datacenters": {"dc-1": {"allocationRange": 16}}}),
        )
        .await;
    assert_eq!(h.api.pending_get_hooks(), 0, "the spec change happened");
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = error_of(status, &body);
    assert!(message.contains("metallb"), "{message}");
    let stored = h.api.get("ipampools", None, "metallb").unwrap();
    assert_eq!(stored["spec"]["datacenters"]["dc-1"]["allocationRange"], 12);
}

#[tokio::test]
async fn delete_removes_the_pool_and_404s_after() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    let path = format!("{POOLS}/metallb");
    let (status, body) = h.call("DELETE", &path, Some("admin"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(h.api.get("ipampools", None, "metallb").is_none());
    let (status, body) = h.call("DELETE", &path, Some("admin"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    error_of(status, &body);
    h.wait_cached("metallb", false).await;
    let (status, _) = h.get(&path, "admin").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn allocations_route_lists_the_pools_allocations_by_datacenter_and_cluster() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    for (ns, spec) in [
        (
            "cluster-b",
            r#"{type: range, dc: dc-1, addresses: ["10.0.0.16-10.0.0.23"]}"#,
        ),
        (
            "cluster-a",
            r#"{type: range, dc: dc-1, addresses: ["10.0.0.8-10.0.0.15"]}"#,
        ),
        (
            "cluster-c",
            r#"{type: prefix, dc: dc-2, cidr: 10.1.0.16/28}"#,
        ),
    ] {
        h.allocation(&format!(
            "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {{name: metallb, namespace: {ns}, resourceVersion: \"5\"}}\nspec: {spec}\nstatus: {{phase: Allocated}}\n"
        ))
        .await;
    }
    h.allocation("apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {name: other, namespace: cluster-a}\nspec: {type: prefix, dc: dc-2, cidr: 10.9.0.0/28}\n").await;
    let (status, body) = h
        .get(&format!("{POOLS}/metallb/allocations"), "admin")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!([
            {"cluster": "a", "datacenter": "dc-1", "type": "range", "addresses": ["10.0.0.8-10.0.0.15"], "phase": "Allocated"},
            {"cluster": "b", "datacenter": "dc-1", "type": "range", "addresses": ["10.0.0.16-10.0.0.23"], "phase": "Allocated"},
            {"cluster": "c", "datacenter": "dc-2", "type": "prefix", "cidr": "10.1.0.16/28", "phase": "Allocated"},
        ])
    );
    let (status, _) = h.get(&format!("{POOLS}/other/allocations"), "admin").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "no pool, no allocations route"
    );
}

#[tokio::test]
async fn wrong_seed_unknown_route_and_method_get_kkp_errors() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    for (method, path) in [
        ("GET", "/api/v2/seeds/other/ipampools"),
        ("GET", "/api/v2/seeds/other/ipampools/metallb"),
        ("DELETE", "/api/v2/seeds/other/ipampools/metallb"),
        ("GET", "/api/v2/seeds/other/ipampools/metallb/allocations"),
    ] {
        let (status, body) = h.call(method, path, Some("admin"), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}");
        assert!(error_of(status, &body).contains("unknown seed \"other\""));
    }
    let (status, body) = h
        .send(
            "POST",
            "/api/v2/seeds/other/ipampools",
            "admin",
            kkp_pool("x"),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    error_of(status, &body);
    assert!(h.api.get("ipampools", None, "metallb").is_some());

    let (status, body) = h.get("/api/v2/seeds/seed-1/clusters", "admin").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    error_of(status, &body);
    let (status, body) = h
        .call("PUT", &format!("{POOLS}/metallb"), Some("admin"), None)
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    error_of(status, &body);
}

#[tokio::test]
async fn a_pool_being_deleted_shows_it_and_reads_back_as_a_body() {
    let h = Harness::start().await;
    h.pool(&METALLB.replace(
        "  name: metallb\n",
        "  name: metallb\n  finalizers: [example.com/hold]\n",
    ))
    .await;
    h.api.delete("ipampools", None, "metallb").unwrap();
    let path = format!("{POOLS}/metallb");
    let mut current = serde_json::Value::Null;
    for _ in 0..200 {
        current = h.get(&path, "admin").await.1;
        if current["deleting"] == true {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(current["deleting"], true, "{current}");
    let (status, body) = h.send("PATCH", &path, "admin", current).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The REST model takes and shows `additionalCidrs` beside KKP's fields; a widened `poolCidr`
/// and a new CIDR are accepted, a PATCH removing a CIDR that holds something is refused naming
/// the holding, and nothing changes.
#[tokio::test]
async fn a_pool_grows_through_the_api_and_a_stranding_patch_is_refused() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    let path = format!("{POOLS}/metallb");
    let (status, body) = h
        .send(
            "PATCH",
            &path,
            "admin",
            json!({"datacenters": {"dc-1": {"poolCidr": "10.0.0.0/23",
                                             "additionalCidrs": ["10.7.0.0/28"]}}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["datacenters"]["dc-1"]["poolCidr"], "10.0.0.0/23");
    assert_eq!(
        body["datacenters"]["dc-1"]["additionalCidrs"],
        json!(["10.7.0.0/28"])
    );
    // GET answers from the watch cache, which sees the write a moment later.
    let mut got = serde_json::Value::Null;
    for _ in 0..200 {
        got = h.get(&path, "reader").await.1;
        if got["datacenters"]["dc-1"]["additionalCidrs"] == json!(["10.7.0.0/28"]) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        got["datacenters"]["dc-1"]["additionalCidrs"],
        json!(["10.7.0.0/28"]),
        "{got}"
    );
    // A cluster holds addresses of the new CIDR: removing it is refused, naming the holding.
    h.allocation(
        r#"
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMAllocation
metadata: {name: metallb, namespace: cluster-c7, resourceVersion: "1"}
spec: {type: range, dc: dc-1, addresses: ["10.7.0.2-10.7.0.9"]}
"#,
    )
    .await;
    let before = h.api.get("ipampools", None, "metallb").unwrap();
    let (status, body) = h
        .send(
            "PATCH",
            &path,
            "admin",
            json!({"datacenters": {"dc-1": {"additionalCidrs": null}}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = error_of(status, &body);
    assert!(
        message.contains("additionalCidrs") && message.contains("c7 (10.7.0.2-10.7.0.9)"),
        "{message}"
    );
    assert_eq!(h.api.get("ipampools", None, "metallb").unwrap(), before);
}
