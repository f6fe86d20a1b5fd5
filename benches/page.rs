//! Pool web page benchmark: `cargo bench --bench page`.
//!
//! A seed of 1,000 pools × 10 datacenters (half IPv4 /24 range pools, half IPv6 /48 prefix
//! pools) and 10,000 clusters, each in one datacenter and holding an allocation in 10 pools
//! (100,000 allocations, 10 per pool datacenter), in the controller's pool cache and ledger.
//! The page's routes are driven through the API router in process (warm review caches; the
//! stand-in answers the first TokenReview and SubjectAccessReview), on a 2-thread runtime
//! (the machine has 2 cores). Then, the pure `kipam::page` alone: one pool datacenter with
//! 10,000 holders, and the offline report of the whole seed.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use kube::runtime::{reflector, watcher};
use kube_standin::{ApiServer, UserInfo};
use serde_json::json;
use tower::ServiceExt;

use kipam::api::{ApiOptions, ApiState};
use kipam::page::{self, Holding, view};
use kipam::resources::{IPAMAllocation, IPAMPool};
use kipam::seed::{Context, ledger};

const POOLS: usize = 1_000;
const DATACENTERS: usize = 10;
const CLUSTERS: usize = 10_000;
const POOLS_PER_CLUSTER: usize = 10;
const SAMPLES: usize = 50;

/// Pool datacenter number `k` (0..5,000) of its family.
fn v4_cidr(k: usize) -> String {
    format!("10.{}.{}.0/24", k / 256, k % 256)
}

fn v6_cidr(k: usize) -> String {
    format!("2001:db8:{k:x}::/48")
}

fn pool(i: usize) -> IPAMPool {
    let mut dcs = serde_json::Map::new();
    for j in 0..DATACENTERS {
        let k = i / 2 * DATACENTERS + j;
        let dc = if i.is_multiple_of(2) {
            json!({"type": "range", "poolCidr": v4_cidr(k), "allocationRange": 8,
                   "excludeRanges": [v4_cidr(k).replace(".0/24", ".255")]})
        } else {
            json!({"type": "prefix", "poolCidr": v6_cidr(k), "allocationPrefix": 64})
        };
        dcs.insert(format!("dc-{j}"), dc);
    }
    serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "IPAMPool",
        "metadata": {"name": format!("pool-{i:04}"), "resourceVersion": "1"},
        "spec": {"datacenters": dcs}
    }))
    .expect("pool JSON")
}

/// Cluster `c`'s allocation from its `t`-th pool: cluster `c` is in `dc-(c % 10)`; the ten
/// clusters `10n..10n+9` share pools, each pool's datacenter holding 10 of them.
fn allocation(c: usize, t: usize) -> IPAMAllocation {
    let group = (c / DATACENTERS) % (POOLS / POOLS_PER_CLUSTER);
    let i = group * POOLS_PER_CLUSTER + t;
    let j = c % DATACENTERS;
    let k = i / 2 * DATACENTERS + j;
    let n = c / (DATACENTERS * POOLS / POOLS_PER_CLUSTER);
    let spec = if i.is_multiple_of(2) {
        let base = v4_cidr(k).replace(".0/24", "");
        json!({"type": "range", "dc": format!("dc-{j}"),
               "addresses": [format!("{base}.{}-{base}.{}", 8 * n, 8 * n + 7)]})
    } else {
        json!({"type": "prefix", "dc": format!("dc-{j}"),
               "cidr": format!("2001:db8:{k:x}:{:x}::/64", n + 1)})
    };
    serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "IPAMAllocation",
        "metadata": {"name": format!("pool-{i:04}"), "namespace": format!("cluster-c{c:05}"),
                     "resourceVersion": format!("{}", 10 + c * 10 + t)},
        "spec": spec,
        "status": {"phase": "Allocated"}
    }))
    .expect("allocation JSON")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Median and p99 of `f` over [`SAMPLES`] runs (after one warm-up), and its last result.
async fn measure<F, Fut, T>(mut f: F) -> (Duration, Duration, T)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut last = f().await;
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = Instant::now();
        last = f().await;
        samples.push(start.elapsed());
    }
    samples.sort();
    (percentile(&samples, 0.5), percentile(&samples, 0.99), last)
}

fn main() {
    let api = ApiServer::start_detached().expect("stand-in starts");
    api.set_token_review(|t| (t == "bench-token").then(|| UserInfo::new("bench")));
    api.set_access_review(|_| true);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig_yaml()).expect("kubeconfig");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        let client = kube::Client::try_from(cfg).expect("client");
        let (pools, mut writer) = reflector::store::<IPAMPool>();
        writer.apply_watcher_event(&watcher::Event::Init);
        let all_pools: Vec<IPAMPool> = (0..POOLS).map(pool).collect();
        for p in &all_pools {
            writer.apply_watcher_event(&watcher::Event::InitApply(p.clone()));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let mut ledger = ledger::Ledger::default();
        let mut objects = Vec::with_capacity(CLUSTERS * POOLS_PER_CLUSTER);
        for c in 0..CLUSTERS {
            for t in 0..POOLS_PER_CLUSTER {
                objects.push(allocation(c, t));
            }
        }
        ledger.reset(objects.clone());
        let ctx = Context::builder(client)
            .pools(pools)
            .complete_ledger(ledger)
            .build();
        ctx.metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
        let options = ApiOptions {
            auth_cache_ttl: Duration::from_secs(3600),
            ..ApiOptions::default()
        };
        let router = kipam::api::router(ApiState::new(ctx, "seed".into(), options));
        let get = |path: String| {
            let router = router.clone();
            async move {
                let request = Request::get(&path)
                    .header("authorization", "Bearer bench-token")
                    .body(Body::empty())
                    .expect("request");
                let response = router.oneshot(request).await.expect("answer");
                assert_eq!(response.status(), 200, "{path}");
                axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .expect("body")
                    .len()
            }
        };
        println!(
            "seed: {POOLS} pools × {DATACENTERS} datacenters, {CLUSTERS} clusters, {} allocations",
            CLUSTERS * POOLS_PER_CLUSTER
        );
        println!("route                                   median     p99        answer");
        let mut first_page: Vec<String> = Vec::new();
        for (label, path, on_first_page) in [
            ("shell /ui/", "/ui/".to_string(), true),
            ("script /ui/app.js", "/ui/app.js".to_string(), true),
            ("style /ui/app.css", "/ui/app.css".to_string(), true),
            ("summary, first 50 pools", "/ui/api/summary".to_string(), true),
            ("summary, filtered", "/ui/api/summary?filter=pool-07".to_string(), false),
            ("version (polled every 2 s)", "/ui/api/version".to_string(), false),
            ("detail, IPv4 /24", "/ui/api/pools/pool-0500/datacenters/dc-3".to_string(), false),
            ("detail, IPv6 /48", "/ui/api/pools/pool-0501/datacenters/dc-3".to_string(), false),
            (
                "detail, IPv6 zoomed to a /56",
                "/ui/api/pools/pool-0501/datacenters/dc-3?from=2001:db8:9c7::&to=2001:db8:9c7:ff:ffff:ffff:ffff:ffff".to_string(),
                false,
            ),
            ("lookup, an IPv4 address", "/api/v2/seeds/seed/addresses/10.9.206.13".to_string(), false),
            ("lookup, an IPv6 address", "/api/v2/seeds/seed/addresses/2001:db8:9ce:2::1".to_string(), false),
            ("lookup, a CIDR over 16 pools", "/api/v2/seeds/seed/addresses/10.0.0.0/20".to_string(), false),
        ] {
            let (median, p99, bytes) = measure(|| get(path.clone())).await;
            if on_first_page {
                first_page.push(path);
            }
            println!("{label:<40}{:<11}{:<11}{bytes} bytes", ms(median), ms(p99));
        }
        // The first page as a browser loads it: the four requests one after the other, timed
        // as one sequence (not a sum of the medians above).
        let (median, p99, bytes) = measure(|| {
            let paths = first_page.clone();
            let get = &get;
            async move {
                let mut bytes = 0;
                for path in paths {
                    bytes += get(path).await;
                }
                bytes
            }
        })
        .await;
        println!(
            "first page (shell, script, style, summary, one after the other): median {}, p99 {}, {bytes} bytes",
            ms(median),
            ms(p99)
        );

        // The pure module alone.
        let big_pool: IPAMPool = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "big"},
            "spec": {"datacenters": {"dc-1": {"type": "prefix", "poolCidr": "2001:db8:ffff::/48", "allocationPrefix": 64}}}
        }))
        .expect("pool");
        let holdings: Vec<Holding> = (0..CLUSTERS)
            .map(|c| {
                let obj: IPAMAllocation = serde_json::from_value(json!({
                    "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMAllocation",
                    "metadata": {"name": "big", "namespace": format!("cluster-c{c:05}")},
                    "spec": {"type": "prefix", "dc": "dc-1", "cidr": format!("2001:db8:ffff:{:x}::/64", c * 3)}
                }))
                .expect("allocation");
                Holding::of(&format!("cluster-c{c:05}"), "big", &obj.spec, obj.status.as_ref())
            })
            .collect();
        let dcs = page::pool_dcs(&big_pool);
        let refs: Vec<&Holding> = holdings.iter().collect();
        let (median, p99, bytes) = measure(|| async {
            let (d, _) = view::detail(&dcs[0], &refs, None, Vec::new()).expect("detail");
            serde_json::to_vec(&d).expect("json").len()
        })
        .await;
        println!(
            "pure: one /48 with {CLUSTERS} holders, detail + JSON: median {}, p99 {}, {bytes} bytes",
            ms(median),
            ms(p99)
        );
        let query = page::lookup::Query::parse("2001:db8:ffff:7530::1").expect("query");
        let (median, p99, _) = measure(|| async {
            page::lookup::answer(&query, &dcs[0], &refs).expect("a match").holders.len()
        })
        .await;
        println!(
            "pure: lookup in that /48 (layout + answer): median {}, p99 {}",
            ms(median),
            ms(p99)
        );

        let all: Vec<Holding> = objects
            .iter()
            .map(|o| {
                Holding::of(
                    o.metadata.namespace.as_deref().unwrap_or(""),
                    o.metadata.name.as_deref().unwrap_or(""),
                    &o.spec,
                    o.status.as_ref(),
                )
            })
            .collect();
        let start = Instant::now();
        let report =
            page::report::report("bench", "2026-01-01T00:00:00Z", &all_pools, &all, &[]);
        let computed = start.elapsed();
        let packed = report.packed().expect("packed");
        let packed_at = start.elapsed();
        let html = page::html::offline(&packed);
        println!(
            "pure: offline report of the whole seed: {} ({} bytes; the views, each pool \
             datacenter packed as it is made, {}; the summary packed and all put together {}; \
             the page {})",
            ms(start.elapsed()),
            html.len(),
            ms(computed),
            ms(packed_at - computed),
            ms(start.elapsed() - packed_at)
        );
    });
}
