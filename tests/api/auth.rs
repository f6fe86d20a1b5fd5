//! Authentication (TokenReview), authorisation (SubjectAccessReview), and their cache.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use kube_standin::AccessRequest;
use serde_json::json;

use kipam::api::ApiOptions;

use super::harness::*;

#[tokio::test]
async fn no_invalid_or_anonymous_token_is_401_on_every_route() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    let pool = format!("{POOLS}/metallb");
    let routes = [
        ("GET", POOLS.to_string()),
        ("POST", POOLS.to_string()),
        ("GET", pool.clone()),
        ("PATCH", pool.clone()),
        ("DELETE", pool.clone()),
        ("GET", format!("{pool}/allocations")),
        ("GET", "/api/v2/openapi.json".to_string()),
        // The seed name is only looked at once the caller is known.
        ("GET", "/api/v2/seeds/other/ipampools".to_string()),
    ];
    for (method, path) in &routes {
        for token in [None, Some("not-a-token-s3cr3t"), Some("anonymous")] {
            let (status, body) = h.call(method, path, token, None).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} {token:?}"
            );
            let message = error_of(status, &body);
            assert!(
                !message.contains("s3cr3t"),
                "a token is never echoed: {message}"
            );
        }
    }
    // Not a bearer token at all.
    let req = axum::http::Request::builder()
        .uri(POOLS)
        .header("authorization", "Basic YWRtaW46YWRtaW4=")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = tower::ServiceExt::oneshot(h.router.clone(), req)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    assert!(h.api.get("ipampools", None, "metallb").is_some());
}

#[tokio::test]
async fn a_reader_reads_but_every_write_is_403() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    let pool = format!("{POOLS}/metallb");
    assert_eq!(h.get(POOLS, "reader").await.0, StatusCode::OK);
    assert_eq!(h.get(&pool, "reader").await.0, StatusCode::OK);
    assert_eq!(
        h.get(&format!("{pool}/allocations"), "reader").await.0,
        StatusCode::OK
    );
    let before = h.api.get("ipampools", None, "metallb").unwrap();
    let writes = [
        ("POST", POOLS.to_string(), Some(kkp_pool("new"))),
        (
            "PATCH",
            pool.clone(),
            Some(json!({"datacenters": {"dc-1": {"allocationRange": 9}}})),
        ),
        ("DELETE", pool.clone(), None),
    ];
    for (method, path, body) in writes {
        let (status, answer) = match body {
            Some(b) => h.send(method, &path, "reader", b).await,
            None => h.call(method, &path, Some("reader"), None).await,
        };
        assert_eq!(status, StatusCode::FORBIDDEN, "{method}: {answer}");
        assert!(error_of(status, &answer).contains("user \"rita\" may not"));
    }
    assert_eq!(h.api.get("ipampools", None, "metallb").unwrap(), before);
    assert!(h.api.get("ipampools", None, "new").is_none());
}

#[tokio::test]
async fn access_reviews_ask_for_the_verb_resource_and_name_of_each_route() {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    let seen: Arc<Mutex<Vec<AccessRequest>>> = Arc::default();
    let record = seen.clone();
    h.api.set_access_review(move |req| {
        record.lock().unwrap().push(req.clone());
        // This user may read pools but not allocations.
        req.resource
            .as_ref()
            .is_some_and(|r| r.resource == "ipampools")
    });
    let pool = format!("{POOLS}/metallb");
    assert_eq!(h.get(POOLS, "admin").await.0, StatusCode::OK);
    assert_eq!(h.get(&pool, "admin").await.0, StatusCode::OK);
    let (status, body) = h.get(&format!("{pool}/allocations"), "admin").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(error_of(status, &body).contains("ipamallocations"));
    h.send("PATCH", &pool, "admin", json!({})).await;
    h.call("DELETE", &pool, Some("admin"), None).await;
    h.send("POST", POOLS, "admin", kkp_pool("x")).await;
    let asked: Vec<(String, String, String, String, String)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            let a = r.resource.clone().unwrap();
            (r.user.username.clone(), a.verb, a.group, a.resource, a.name)
        })
        .collect();
    let want = |verb: &str, resource: &str, name: &str| {
        (
            "alice".to_string(),
            verb.to_string(),
            "ipam.kipam.dev".to_string(),
            resource.to_string(),
            name.to_string(),
        )
    };
    assert_eq!(
        asked,
        vec![
            want("list", "ipampools", ""),
            want("get", "ipampools", "metallb"),
            want("list", "ipamallocations", ""),
            want("patch", "ipampools", "metallb"),
            want("delete", "ipampools", "metallb"),
            want("create", "ipampools", ""),
        ]
    );
    // The groups of the token travel with the review.
    assert!(
        seen.lock().unwrap()[0]
            .user
            .groups
            .contains(&"ipam-admins".to_string())
    );
}

#[tokio::test]
async fn reviews_are_cached_for_the_ttl_only() {
    let h = Harness::with_options(ApiOptions {
        auth_cache_ttl: Duration::from_millis(300),
        ..ApiOptions::default()
    })
    .await;
    h.api.reset_stats();
    for _ in 0..5 {
        assert_eq!(h.get(POOLS, "admin").await.0, StatusCode::OK);
        assert_eq!(h.get(POOLS, "nobody").await.0, StatusCode::UNAUTHORIZED);
    }
    let stats = h.api.stats();
    assert_eq!(
        stats.count("create", "tokenreviews"),
        2,
        "{:?}",
        stats.by_request
    );
    assert_eq!(stats.count("create", "subjectaccessreviews"), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(h.get(POOLS, "admin").await.0, StatusCode::OK);
    let stats = h.api.stats();
    assert_eq!(stats.count("create", "tokenreviews"), 3);
    assert_eq!(stats.count("create", "subjectaccessreviews"), 2);

    // A revoked permission is seen once the cached decision expires.
    h.api.set_access_review(|_| false);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(h.get(POOLS, "admin").await.0, StatusCode::FORBIDDEN);

    let h = Harness::with_options(ApiOptions {
        auth_cache_ttl: Duration::ZERO,
        ..ApiOptions::default()
    })
    .await;
    h.api.reset_stats();
    for _ in 0..3 {
        assert_eq!(h.get(POOLS, "admin").await.0, StatusCode::OK);
    }
    assert_eq!(h.api.stats().count("create", "tokenreviews"), 3);
}

#[tokio::test]
async fn a_review_that_fails_never_lets_the_request_through() {
    let h = Harness::start().await;
    h.api.inject_failures("create", "tokenreviews", 1, 500);
    let (status, body) = h.get(POOLS, "admin").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    error_of(status, &body);
    h.api
        .inject_failures("create", "subjectaccessreviews", 1, 403);
    let (status, body) = h.get(POOLS, "admin").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(error_of(status, &body).contains("kipam's RBAC"));
    // Nothing failed is cached: the next request is reviewed again and passes.
    assert_eq!(h.get(POOLS, "admin").await.0, StatusCode::OK);
}
