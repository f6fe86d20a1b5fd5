//! The address lookup route and the web page's routes (`/ui/`), in process.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

use super::harness::*;

const LOOKUP: &str = "/api/v2/seeds/seed-1/addresses";

async fn with_allocations() -> Harness {
    let h = Harness::start().await;
    h.pool(METALLB).await;
    for (ns, spec, phase) in [
        (
            "cluster-a",
            r#"{type: range, dc: dc-1, addresses: ["10.0.0.8-10.0.0.15"]}"#,
            "Allocated",
        ),
        (
            "cluster-b",
            r#"{type: range, dc: dc-1, addresses: ["10.0.0.16-10.0.0.23"]}"#,
            "Allocated",
        ),
        (
            "cluster-c",
            r#"{type: prefix, dc: dc-2, cidr: 10.1.0.16/28}"#,
            "Allocated",
        ),
        ("cluster-d", r#"{type: range, dc: dc-1}"#, "Failed"),
    ] {
        h.allocation(&format!(
            "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {{name: metallb, namespace: {ns}, resourceVersion: \"5\"}}\nspec: {spec}\nstatus: {{phase: {phase}, message: \"pool metallb in dc-1 is exhausted\"}}\n"
        ))
        .await;
    }
    h
}

#[tokio::test]
async fn lookup_names_the_holder_or_says_free_or_excluded() {
    let h = with_allocations().await;
    let (status, body) = h.get(&format!("{LOOKUP}/10.0.0.9"), "reader").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["query"], "10.0.0.9");
    let m = &body["matches"][0];
    assert_eq!(
        (
            m["pool"].as_str(),
            m["datacenter"].as_str(),
            m["state"].as_str()
        ),
        (Some("metallb"), Some("dc-1"), Some("allocated"))
    );
    assert_eq!(m["holders"][0]["cluster"], "a");
    assert_eq!(m["holders"][0]["addresses"], "10.0.0.8-10.0.0.15");
    assert_eq!(
        body["message"],
        "10.0.0.9 is held by a (pool metallb in dc-1)"
    );

    let (_, body) = h.get(&format!("{LOOKUP}/10.0.0.6"), "reader").await;
    assert_eq!(body["matches"][0]["state"], "excluded");
    let (_, body) = h.get(&format!("{LOOKUP}/10.0.0.200"), "reader").await;
    assert_eq!(body["matches"][0]["state"], "free");
    let (_, body) = h.get(&format!("{LOOKUP}/192.168.7.7"), "reader").await;
    assert_eq!(body["matches"], Value::Array(vec![]));
    assert_eq!(body["message"], "no pool covers 192.168.7.7");

    // A CIDR, with its slash as is or encoded.
    for path in ["10.1.0.0/27", "10.1.0.0%2F27"] {
        let (status, body) = h.get(&format!("{LOOKUP}/{path}"), "reader").await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
        let m = &body["matches"][0];
        assert_eq!(m["datacenter"], "dc-2", "{path}");
        assert_eq!(m["holders"][0]["cluster"], "c");
        assert_eq!(
            (
                m["allocated"].as_str(),
                m["excluded"].as_str(),
                m["free"].as_str()
            ),
            (Some("16"), Some("16"), Some("0"))
        );
    }
    // A CIDR over both datacenters' pools (10.0.0.0/24 and 10.1.0.0/24).
    let (_, body) = h.get(&format!("{LOOKUP}/10.0.0.0/15"), "reader").await;
    assert_eq!(body["matches"].as_array().unwrap().len(), 2, "{body}");
}

#[tokio::test]
async fn lookup_refuses_bad_input_and_unauthorised_callers() {
    let h = with_allocations().await;
    for bad in ["10.0.0.300", "cluster-a", "10.0.0.1/24", "10.0.0.0/40"] {
        let (status, body) = h.get(&format!("{LOOKUP}/{bad}"), "reader").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        let message = error_of(status, &body);
        assert!(message.starts_with("address:"), "{bad}: {message}");
    }
    let (status, _) = h
        .call("GET", &format!("{LOOKUP}/10.0.0.9"), None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = h.get(&format!("{LOOKUP}/10.0.0.9"), "nonsense").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) = h
        .get("/api/v2/seeds/other/addresses/10.0.0.9", "reader")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// A raw GET: status, headers, body text.
async fn raw(
    h: &Harness,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut req = Request::builder().uri(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let response = h
        .router
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

#[tokio::test]
async fn the_page_is_served_with_a_strict_policy_and_no_inline_code() {
    let h = Harness::start().await;
    let (status, headers, body) = raw(&h, "/ui/", None).await;
    assert_eq!(status, StatusCode::OK);
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(body.contains("src=\"/ui/app.js\"") && body.contains("href=\"/ui/app.css\""));
    assert!(!body.contains("<script>") && !body.contains("<style") && !body.contains("style=\""));
    for (path, kind) in [
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let (status, headers, body) = raw(&h, path, None).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(
            headers["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        assert!(
            !body.contains("http://") && !body.contains("https://"),
            "{path} fetches nothing from elsewhere"
        );
    }
    assert!(
        !kipam::page::html::APP_JS.contains("innerHTML"),
        "names are set as text only"
    );
    let (status, headers, _) = raw(&h, "/ui", None).await;
    assert_eq!(status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(headers["location"], "/ui/");
}

#[tokio::test]
async fn page_data_needs_a_token_and_rbac_and_is_never_cached() {
    let h = with_allocations().await;
    for path in [
        "/ui/api/summary",
        "/ui/api/version",
        "/ui/api/pools/metallb/datacenters/dc-1",
    ] {
        let (status, headers, body) = raw(&h, path, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
        assert_eq!(headers["cache-control"], "no-store", "{path}");
        let (status, _, _) = raw(&h, path, Some("nonsense")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        let (status, headers, _) = raw(&h, path, Some("reader")).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(headers["cache-control"], "no-store", "{path}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
    }
}

#[tokio::test]
async fn summary_detail_and_zoom_show_the_pools_usage_and_holders() {
    let h = with_allocations().await;
    let (status, body) = h.get("/ui/api/summary", "reader").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["seed"], "seed-1");
    assert_eq!(body["totals"]["pools"], 1);
    assert_eq!(body["totals"]["datacenters"], 2);
    assert_eq!(body["totals"]["allocations"], 4);
    assert_eq!(body["attention"][0]["cluster"], "d");
    assert_eq!(body["attention"][0]["attention"], "Failed");
    let dc1 = &body["pools"][0]["datacenters"][0];
    assert_eq!(dc1["name"], "dc-1");
    let u = &dc1["usage"];
    assert_eq!(
        (
            u["total"].as_str(),
            u["allocated"].as_str(),
            u["excluded"].as_str(),
            u["quarantined"].as_str(),
            u["free"].as_str()
        ),
        (Some("256"), Some("16"), Some("4"), Some("0"), Some("236"))
    );
    assert_eq!(u["largestFreeBlock"], "232");
    assert_eq!(dc1["attention"], 1);

    let (_, filtered) = h.get("/ui/api/summary?filter=nothing", "reader").await;
    assert_eq!(filtered["matched"], 0);

    let (status, d) = h
        .get("/ui/api/pools/metallb/datacenters/dc-1", "reader")
        .await;
    assert_eq!(status, StatusCode::OK, "{d}");
    assert_eq!(d["holders"][0]["cluster"], "d", "Failed first");
    assert_eq!(d["holders"][1]["cluster"], "a");
    let cells = d["map"]["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 256);
    assert_eq!(d["map"]["cellSize"], "1");
    assert_eq!(cells[9]["state"], "allocated");
    assert_eq!(cells[9]["holder"], "a");
    assert_eq!(cells[6]["state"], "excluded");
    assert_eq!(cells[100]["state"], "free");

    let (status, z) = h
        .get(
            "/ui/api/pools/metallb/datacenters/dc-1?from=10.0.0.16&to=10.0.0.31",
            "reader",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{z}");
    assert_eq!(z["map"]["cells"].as_array().unwrap().len(), 16);
    assert_eq!(z["map"]["cells"][0]["holder"], "b");
    for (query, why) in [
        ("?from=10.0.0.16", "both ends"),
        ("?from=10.0.0.16&to=10.2.0.0", "not inside the pool"),
        ("?from=2001:db8::&to=2001:db8::1", "not an IPv4 address"),
    ] {
        let (status, body) = h
            .get(
                &format!("/ui/api/pools/metallb/datacenters/dc-1{query}"),
                "reader",
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert!(error_of(status, &body).contains(why), "{query}: {body}");
    }
    let (status, _) = h
        .get("/ui/api/pools/metallb/datacenters/dc-9", "reader")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = h.get("/ui/api/pools/nope/datacenters/dc-1", "reader").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_version_moves_when_an_allocation_or_a_pool_changes() {
    let h = with_allocations().await;
    async fn version(h: &Harness) -> String {
        h.get("/ui/api/version", "reader").await.1["version"]
            .as_str()
            .unwrap()
            .to_string()
    }
    let first = version(&h).await;
    assert_eq!(version(&h).await, first, "nothing changed");
    h.allocation("apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {name: metallb, namespace: cluster-e, resourceVersion: \"9\"}\nspec: {type: range, dc: dc-1, addresses: [\"10.0.0.24-10.0.0.31\"]}\n").await;
    h.ctx.ledger_updates.send_modify(|_| {});
    let second = version(&h).await;
    assert_ne!(second, first, "a new allocation moves it");
}

const SEVERAL_CIDRS: &str = r#"
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: grown
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.20.0.0/28
      additionalCidrs: ["10.30.0.0/28", "10.40.0.0/29"]
      allocationRange: 4
      reuseAfter: 1h
"#;

/// A pool datacenter of several CIDRs, with an allocation in its second CIDR.
async fn with_several_cidrs() -> Harness {
    let h = Harness::start().await;
    h.pool(SEVERAL_CIDRS).await;
    h.allocation(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {name: grown, namespace: cluster-x, resourceVersion: \"5\"}\nspec: {type: range, dc: dc-1, addresses: [\"10.20.0.0-10.20.0.15\", \"10.30.0.0-10.30.0.3\"]}\nstatus: {phase: Allocated}\n",
    )
    .await;
    h
}

#[tokio::test]
async fn several_cidrs_are_listed_summed_mapped_and_searched() {
    let h = with_several_cidrs().await;
    let (status, body) = h.get("/ui/api/summary", "reader").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let dc = &body["pools"][0]["datacenters"][0];
    assert_eq!(dc["cidr"], "10.20.0.0/28 +2");
    assert_eq!(
        dc["cidrs"],
        serde_json::json!(["10.20.0.0/28", "10.30.0.0/28", "10.40.0.0/29"])
    );
    assert_eq!(dc["usage"]["total"], "40");
    assert_eq!(dc["usage"]["allocated"], "20");
    assert_eq!(dc["usage"]["free"], "20");
    assert_eq!(dc["usage"]["largestFreeBlock"], "12");

    let (status, d) = h
        .get("/ui/api/pools/grown/datacenters/dc-1", "reader")
        .await;
    assert_eq!(status, StatusCode::OK, "{d}");
    let cidrs: Vec<&str> = d["cidrs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["cidr"].as_str().unwrap())
        .collect();
    assert_eq!(cidrs, ["10.20.0.0/28", "10.30.0.0/28", "10.40.0.0/29"]);
    assert_eq!(d["cidrs"][1]["usage"]["allocated"], "4");
    assert_eq!(d["map"]["first"], "10.20.0.0", "the first CIDR by default");
    // The map of the second CIDR, chosen by its bounds.
    let (status, second) = h
        .get(
            "/ui/api/pools/grown/datacenters/dc-1?from=10.30.0.0&to=10.30.0.15",
            "reader",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["map"]["cells"][3]["holder"], "x");
    assert_eq!(second["map"]["cells"][4]["state"], "free");

    let (_, body) = h.get(&format!("{LOOKUP}/10.30.0.2"), "reader").await;
    assert_eq!(
        body["message"],
        "10.30.0.2 is held by x (pool grown in dc-1)"
    );
    assert_eq!(body["matches"][0]["cidrs"][0], "10.30.0.0/28");
    let (_, body) = h.get(&format!("{LOOKUP}/10.40.0.1"), "reader").await;
    assert_eq!(body["message"], "10.40.0.1 is free (pool grown in dc-1)");
    let (_, body) = h.get(&format!("{LOOKUP}/10.35.0.1"), "reader").await;
    assert_eq!(body["message"], "no pool covers 10.35.0.1");
}

#[tokio::test]
async fn a_quarantine_counted_by_the_leader_is_shown_and_never_answered_free() {
    let h = with_several_cidrs().await;
    h.api
        .set_status(
            "ipampools",
            None,
            "grown",
            serde_json::json!({"datacenters": {"dc-1": {
                "total": "40", "allocated": "20", "excluded": "0", "available": "16",
                "allocations": 1, "largestFreeBlock": "8", "fragmentationPercent": 50,
                "utilisationPercent": 50, "quarantined": "4"
            }}}),
        )
        .unwrap();
    let mut usage = Value::Null;
    for _ in 0..200 {
        let (_, body) = h.get("/ui/api/summary", "reader").await;
        usage = body["pools"][0]["datacenters"][0]["usage"].clone();
        if usage["quarantined"] == "4" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(usage["quarantined"], "4", "{usage}");
    assert_eq!(usage["free"], "16", "{usage}");
    let (_, d) = h
        .get("/ui/api/pools/grown/datacenters/dc-1", "reader")
        .await;
    assert!(
        d["quarantineNote"]
            .as_str()
            .is_some_and(|n| n.contains("4 released addresses are quarantined")),
        "{d}"
    );
    // Which addresses are quarantined only the leader knows: a free-looking one is not
    // called free.
    let (_, body) = h.get(&format!("{LOOKUP}/10.40.0.1"), "reader").await;
    assert_eq!(body["matches"][0]["state"], "unheld");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("10.40.0.1 is not held by any allocation (pool grown in dc-1)"),
        "{message}"
    );
    assert!(!message.contains("is free"), "{message}");
    // A held one still names its holder.
    let (_, body) = h.get(&format!("{LOOKUP}/10.20.0.1"), "reader").await;
    assert_eq!(body["matches"][0]["state"], "allocated");
}

/// The served page and the offline report draw the same thing for the same state: the
/// report, packed as the file holds it and read back as its script reads it, is the JSON the
/// routes answer (detail, map, zoom) and, for the lookup, the answer the lookup route gives
/// for the first and the last address of each piece of the pool.
#[tokio::test]
async fn the_served_page_and_the_report_draw_the_same_maps_and_answers() {
    let h = with_allocations().await;
    // A /48 of IPv6 too, so that the report holds a zoom.
    h.pool(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: nodes}\nspec:\n  datacenters:\n    dc-1: {type: prefix, poolCidr: \"2001:db8::/48\", allocationPrefix: 64, excludePrefixes: [\"2001:db8::/64\"]}\n",
    )
    .await;
    h.allocation(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMAllocation\nmetadata: {name: nodes, namespace: cluster-a, resourceVersion: \"6\"}\nspec: {type: prefix, dc: dc-1, cidr: \"2001:db8:0:1::/64\"}\nstatus: {phase: Allocated}\n",
    )
    .await;
    let pools: Vec<kipam::resources::IPAMPool> =
        h.ctx.pools.state().iter().map(|p| (**p).clone()).collect();
    let holdings: Vec<kipam::page::Holding> = h
        .ctx
        .ledger
        .lock()
        .await
        .snapshot()
        .iter()
        .map(|e| kipam::page::Holding::of(e.namespace(), e.name(), e.spec(), e.status()))
        .collect();
    let packed =
        kipam::page::report::report("seed-1", "2026-01-01T00:00:00Z", &pools, &holdings, &[])
            .packed()
            .unwrap();
    let report = kipam::page::report::read(&serde_json::from_str(&packed).unwrap()).unwrap();
    let mut zooms = 0;
    let mut pieces = 0;
    for (key, path) in [
        ("metallb/dc-1", "metallb/datacenters/dc-1"),
        ("metallb/dc-2", "metallb/datacenters/dc-2"),
        ("nodes/dc-1", "nodes/datacenters/dc-1"),
    ] {
        let (status, served) = h.get(&format!("/ui/api/pools/{path}"), "reader").await;
        assert_eq!(status, StatusCode::OK, "{served}");
        let embedded = &report["datacenters"][key];
        assert_eq!(embedded["detail"], served, "{key}: the same detail and map");
        for (slice, map) in embedded["maps"].as_object().unwrap() {
            let (from, to) = slice.split_once('-').unwrap();
            let (status, zoomed) = h
                .get(
                    &format!("/ui/api/pools/{path}?from={from}&to={to}"),
                    "reader",
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{zoomed}");
            assert_eq!(&zoomed["map"], map, "{key} {slice}: the same zoomed map");
            zooms += 1;
        }
        let all = embedded["pieces"].as_array().unwrap();
        for (i, piece) in all.iter().enumerate() {
            // A piece's last address: before the next piece, or the end of its CIDR.
            let first = piece["first"].as_str().unwrap();
            let last = match all.get(i + 1).and_then(|n| n["first"].as_str()) {
                Some(next) if same_cidr(embedded, first, next) => before(next),
                _ => cidr_end(embedded, first),
            };
            for address in [first.to_string(), last] {
                let (status, answer) = h.get(&format!("{LOOKUP}/{address}"), "reader").await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                let m = answer["matches"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|m| {
                        format!(
                            "{}/{}",
                            m["pool"].as_str().unwrap(),
                            m["datacenter"].as_str().unwrap()
                        ) == key
                    })
                    .unwrap_or_else(|| panic!("{key}: {answer}"));
                // Every field of the route's answer but `range` (the address asked).
                let mut expected = m.as_object().unwrap().clone();
                expected.remove("range");
                let mut got = piece.as_object().unwrap().clone();
                got.remove("first");
                got.remove("message");
                assert_eq!(got, expected, "{key} {address}");
                assert_eq!(
                    answer["message"],
                    format!("{address}{}", piece["message"].as_str().unwrap()),
                    "{key} {address}"
                );
            }
            pieces += 1;
        }
    }
    assert!(
        zooms >= 1,
        "the /48's first cell holds two things: {report}"
    );
    assert!(pieces >= 10, "{pieces} pieces");
}

fn address(text: &str) -> std::net::IpAddr {
    text.parse()
        .unwrap_or_else(|_| panic!("{text:?} is an address"))
}

/// The address before `text`.
fn before(text: &str) -> String {
    match address(text) {
        std::net::IpAddr::V4(a) => std::net::Ipv4Addr::from(u32::from(a) - 1).to_string(),
        std::net::IpAddr::V6(a) => std::net::Ipv6Addr::from(u128::from(a) - 1).to_string(),
    }
}

/// The CIDR of the pool datacenter `dc` (read back) holding `text`: its first and last.
fn cidr_of(dc: &Value, text: &str) -> (std::net::IpAddr, std::net::IpAddr) {
    let a = address(text);
    dc["detail"]["cidrs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                address(c["first"].as_str().unwrap()),
                address(c["last"].as_str().unwrap()),
            )
        })
        .find(|(f, l)| *f <= a && a <= *l)
        .unwrap_or_else(|| panic!("{text} in a CIDR of {dc}"))
}

fn same_cidr(dc: &Value, a: &str, b: &str) -> bool {
    cidr_of(dc, a) == cidr_of(dc, b)
}

fn cidr_end(dc: &Value, text: &str) -> String {
    cidr_of(dc, text).1.to_string()
}
