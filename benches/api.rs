//! REST API benchmark: `cargo bench --bench api`.
//!
//! 1,000 pools (two datacenters each, with exclusions and usage) in the controller's pool
//! cache, the API router over it with warm review caches (the stand-in answers the first
//! TokenReview and SubjectAccessReview). Measures the latency of listing all pools, in
//! process (router only) and over TCP (HTTP/1.1, one keep-alive connection), as median and
//! p99, then requests per second with 8 keep-alive connections. Server and load generator
//! share one 2-thread runtime (the machine has 2 cores).

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use kube::runtime::{reflector, watcher};
use kube_standin::{ApiServer, UserInfo};
use serde_json::json;
use std::io::{Read, Write};
use tower::ServiceExt;

use kipam::api::{ApiOptions, ApiState};
use kipam::resources::IPAMPool;
use kipam::seed::{Context, ledger};

const POOLS: usize = 1_000;
const LATENCY_SAMPLES: usize = 1_000;
const CONNECTIONS: usize = 8;
const LOAD_SECONDS: u64 = 5;
const PATH: &str = "/api/v2/seeds/seed/ipampools";

fn pool(i: usize) -> IPAMPool {
    let value = json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1",
        "kind": "IPAMPool",
        "metadata": {"name": format!("pool-{i:04}"), "resourceVersion": "1"},
        "spec": {"datacenters": {
            "dc-1": {"type": "range", "poolCidr": format!("10.{}.{}.0/24", i / 256, i % 256),
                     "allocationRange": 8, "excludeRanges": [format!("10.{}.{}.1", i / 256, i % 256)]},
            "dc-2": {"type": "prefix", "poolCidr": format!("2001:db8:{i:x}::/48"),
                     "allocationPrefix": 64, "excludePrefixes": [format!("2001:db8:{i:x}::/64")]}
        }},
        "status": {"datacenters": {
            "dc-1": {"total": "256", "allocated": "64", "excluded": "1", "available": "191",
                     "allocations": 8, "largestFreeBlock": "128", "fragmentationPercent": 32,
                     "utilisationPercent": 25},
            "dc-2": {"total": "1208925819614629174706176", "allocated": "147573952589676412928",
                     "excluded": "18446744073709551616", "available": "1208759800939765937782784",
                     "allocations": 8, "largestFreeBlock": "604462909807314587353088",
                     "fragmentationPercent": 49, "utilisationPercent": 0}
        }}
    });
    serde_json::from_value(value).expect("pool JSON")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// One GET on a keep-alive connection; returns the body length.
fn get(stream: &mut std::net::TcpStream, buf: &mut Vec<u8>) -> usize {
    let request =
        format!("GET {PATH} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer bench-token\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("write");
    buf.clear();
    let mut chunk = [0u8; 64 * 1024];
    let (head_end, length) = loop {
        let n = stream.read(&mut chunk).expect("read");
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("content-length");
            break (end + 4, length);
        }
    };
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).expect("read");
        assert!(n > 0, "connection closed");
        buf.extend_from_slice(&chunk[..n]);
    }
    length
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
        for i in 0..POOLS {
            writer.apply_watcher_event(&watcher::Event::InitApply(pool(i)));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let ctx = Context::builder(client)
            .pools(pools)
            // Filled as the allocation watch would, complete from the start.
            .complete_ledger(ledger::Ledger::default())
            .build();
        let options = ApiOptions {
            auth_cache_ttl: Duration::from_secs(3600),
            ..ApiOptions::default()
        };
        let router = kipam::api::router(ApiState::new(ctx, "seed".into(), options));

        // In process: the router alone.
        let request = || {
            Request::get(PATH)
                .header("authorization", "Bearer bench-token")
                .body(Body::empty())
                .expect("request")
        };
        let warm = router.clone().oneshot(request()).await.expect("answer");
        assert_eq!(warm.status(), 200);
        let body = axum::body::to_bytes(warm.into_body(), usize::MAX).await.expect("body");
        let listed: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(listed.as_array().map(Vec::len), Some(POOLS));
        let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
        for _ in 0..LATENCY_SAMPLES {
            let start = Instant::now();
            let response = router.clone().oneshot(request()).await.expect("answer");
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
            samples.push(start.elapsed());
            assert_eq!(body.len(), listed.to_string().len());
        }
        samples.sort();
        println!("pools in the cache: {POOLS}, list answer: {} bytes", body.len());
        println!(
            "list, in process:   median {}, p99 {}",
            ms(percentile(&samples, 0.5)),
            ms(percentile(&samples, 0.99))
        );

        // Over TCP.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(kipam::api::serve(listener, router));
        let samples = tokio::task::spawn_blocking(move || {
            let mut stream = std::net::TcpStream::connect(addr).expect("connect");
            let mut buf = Vec::new();
            get(&mut stream, &mut buf);
            let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
            for _ in 0..LATENCY_SAMPLES {
                let start = Instant::now();
                get(&mut stream, &mut buf);
                samples.push(start.elapsed());
            }
            samples
        })
        .await
        .expect("latency client");
        let mut samples = samples;
        samples.sort();
        println!(
            "list, HTTP/1.1:     median {}, p99 {}",
            ms(percentile(&samples, 0.5)),
            ms(percentile(&samples, 0.99))
        );

        // Throughput: client threads outside the server's runtime, same 2 cores.
        let deadline = Instant::now() + Duration::from_secs(LOAD_SECONDS);
        let start = Instant::now();
        let clients: Vec<_> = (0..CONNECTIONS)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
                    let mut buf = Vec::new();
                    let mut done = 0u64;
                    while Instant::now() < deadline {
                        get(&mut stream, &mut buf);
                        done += 1;
                    }
                    done
                })
            })
            .collect();
        let total: u64 = tokio::task::spawn_blocking(move || {
            clients.into_iter().map(|c| c.join().expect("client")).sum()
        })
        .await
        .expect("clients");
        let elapsed = start.elapsed().as_secs_f64();
        println!(
            "list of {POOLS} pools, {CONNECTIONS} connections, 2 server threads: {:.0} requests/s ({total} in {elapsed:.1} s)",
            total as f64 / elapsed
        );
    });
}
