//! `/metrics` of the real `kipam controller` binary against a known seed: exact pool figures,
//! allocations by phase, leadership and REST API requests; and `--log-format json` lines.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::api::{http, script_auth};
use super::support::Seed;

const WAIT: Duration = Duration::from_secs(30);

/// `edge`: a range /28 with one address excluded (dc-1) and an empty prefix pool (dc-2);
/// `v6`: an IPv6 /48 handing out /64s.
const POOLS: &str = include_str!("metrics-pools.yaml");

/// Every sample of a scrape: `name{labels}` -> value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

async fn scrape(port: u16) -> BTreeMap<String, f64> {
    samples(&Seed::http_get(port, "/metrics").await.1)
}

fn pool(name: &str, pool: &str, dc: &str, extra: &str) -> String {
    format!("kipam_{name}{{pool=\"{pool}\",datacenter=\"{dc}\"{extra}}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_exact_pool_figures_phases_leadership_and_api_requests() {
    let seed = Seed::start("metrics").await;
    script_auth(&seed);
    let ctl = seed.controller_with("ctl", &["--log-format", "json"]);
    seed.apply(POOLS);
    for name in ["a", "b", "c", "d"] {
        seed.cluster(name, "dc-1");
    }
    seed.wait_for("a-c allocated from edge, d failed", WAIT, "ctl", |s| {
        ["a", "b", "c"]
            .iter()
            .all(|c| s.phase(c, "edge") == "Allocated" && s.phase(c, "v6") == "Allocated")
            && s.phase("d", "edge") == "Failed"
            && s.phase("d", "v6") == "Allocated"
    })
    .await;
    assert_eq!(seed.held("b", "edge"), "10.0.0.5-10.0.0.8");

    let (code, _) = http(
        ctl.api_port,
        "GET",
        "/api/v2/seeds/seed/ipampools",
        Some("admin-token"),
        None,
    )
    .await;
    assert_eq!(code, 200);
    let (code, _) = http(ctl.api_port, "GET", "/no/such/path", None, None).await;
    assert_eq!(code, 404);

    // The pass that wrote the allocations counts them and its duration as it ends.
    let started = std::time::Instant::now();
    let m = loop {
        let m = scrape(ctl.metrics_port).await;
        let done = m.get("kipam_allocations_created_total") == Some(&7.0)
            && m.get("kipam_reconcile_pass_duration_seconds_count") >= Some(&1.0);
        if done || started.elapsed() > WAIT {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let get = |key: &str| {
        m.get(key)
            .copied()
            .unwrap_or_else(|| panic!("no sample {key} in {m:#?}"))
    };
    let state = |p: &str, dc: &str, s: &str| {
        get(&pool("pool_addresses", p, dc, &format!(",state=\"{s}\"")))
    };
    assert_eq!(state("edge", "dc-1", "total"), 16.0);
    assert_eq!(state("edge", "dc-1", "allocated"), 12.0);
    assert_eq!(state("edge", "dc-1", "excluded"), 1.0);
    assert_eq!(state("edge", "dc-1", "available"), 3.0);
    assert_eq!(
        get(&pool("pool_utilization_ratio", "edge", "dc-1", "")),
        0.8
    );
    assert_eq!(
        get(&pool("pool_largest_free_block", "edge", "dc-1", "")),
        3.0
    );
    let phase =
        |p: &str, ph: &str| get(&pool("allocations", p, "dc-1", &format!(",phase=\"{ph}\"")));
    assert_eq!(phase("edge", "Allocated"), 3.0);
    assert_eq!(phase("edge", "Failed"), 1.0);
    assert_eq!(phase("edge", "Pending"), 0.0);
    assert_eq!(phase("v6", "Allocated"), 4.0);
    // The empty datacenter is reported too.
    assert_eq!(state("edge", "dc-2", "available"), 256.0);
    assert_eq!(
        get(&pool("pool_utilization_ratio", "edge", "dc-2", "")),
        0.0
    );
    // IPv6: 2^80 addresses, four /64s held.
    assert_eq!(state("v6", "dc-1", "total"), 2f64.powi(80));
    assert_eq!(state("v6", "dc-1", "allocated"), 2f64.powi(66));
    assert_eq!(
        get(&pool("pool_utilization_ratio", "v6", "dc-1", "")),
        2f64.powi(-14)
    );

    assert_eq!(get("kipam_leader"), 1.0);
    assert_eq!(get("kipam_allocations_created_total"), 7.0);
    assert!(get("kipam_allocation_duration_seconds_count") >= 1.0);
    assert!(get("kipam_reconcile_pass_duration_seconds_count") >= 1.0);
    assert_eq!(
        get(
            "kipam_api_requests_total{route=\"/api/v2/seeds/{seed_name}/ipampools\",method=\"GET\",code=\"200\"}"
        ),
        1.0
    );
    assert_eq!(
        get("kipam_api_requests_total{route=\"unmatched\",method=\"GET\",code=\"404\"}"),
        1.0
    );

    // A datacenter removed from the pool takes its series with it.
    seed.apply(&POOLS.replace(
        "    dc-2:\n      type: prefix\n      poolCidr: 10.1.0.0/24\n      allocationPrefix: 28\n",
        "",
    ));
    let started = std::time::Instant::now();
    loop {
        let m = scrape(ctl.metrics_port).await;
        if !m.keys().any(|k| k.contains("datacenter=\"dc-2\"")) {
            assert!(m.contains_key(&pool("pool_utilization_ratio", "edge", "dc-1", "")));
            break;
        }
        assert!(started.elapsed() < WAIT, "dc-2 series stayed: {m:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every log line is one JSON object; the lines about an allocation name its cluster,
    // pool and datacenter as fields.
    let log = std::fs::read_to_string(seed.log_path("ctl")).unwrap_or_default();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty());
    assert!(
        lines
            .iter()
            .all(|l| l["level"].is_string() && l["message"].is_string()),
        "{log}"
    );
    let about_b = lines
        .iter()
        .find(|l| l["cluster"] == "b" && l["pool"] == "edge")
        .unwrap_or_else(|| panic!("no line about b/edge in:\n{log}"));
    assert_eq!(about_b["datacenter"], "dc-1");
    assert_eq!(about_b["held"], "10.0.0.5-10.0.0.8");
    let about_d = lines
        .iter()
        .find(|l| l["cluster"] == "d" && l["pool"] == "edge")
        .unwrap_or_else(|| panic!("no line about d/edge in:\n{log}"));
    assert_eq!(about_d["change"], "failed");
}
