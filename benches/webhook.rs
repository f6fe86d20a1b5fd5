//! Admission webhook latency: 100 reviews at once over TLS, against a seed whose pool holds
//! 1,000 allocations (objects and record), as `kipam controller` serves it.
//!
//! Every review opens its own TLS connection (the worst case: no connection reuse), so the
//! figures include the handshake. Prints median, p99 and max per round kind.
//!
//! `cargo bench --bench webhook`

use std::time::{Duration, Instant};

use kipam::resources::{IPAMAllocation, IPAMPool, IPAMPoolRecord};
use kipam::tls::TlsFiles;
use kipam::webhook::{self, StaticSource};
use serde_json::{Value, json};

const KIPAM: &str = "system:serviceaccount:kipam-system:kipam";
const CLUSTERS: u32 = 1_000;
const CONCURRENT: usize = 100;
const ROUNDS: usize = 10;

fn address(i: u32) -> String {
    let n = 0x0a00_0000u32 + i;
    format!(
        "{}.{}.{}.{}",
        n >> 24,
        (n >> 16) & 255,
        (n >> 8) & 255,
        n & 255
    )
}

fn seed() -> StaticSource {
    let pool: IPAMPool = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": "metallb"},
        "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.0.0.0/16", "allocationRange": 8}}},
    }))
    .unwrap();
    let mut allocations = Vec::new();
    let mut reservations = serde_json::Map::new();
    for c in 0..CLUSTERS {
        let piece = format!("{}-{}", address(c * 8), address(c * 8 + 7));
        let a: IPAMAllocation = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMAllocation",
            "metadata": {"name": "metallb", "namespace": format!("cluster-c{c}")},
            "spec": {"type": "range", "dc": "dc-1", "addresses": [piece]},
            "status": {"phase": "Allocated"},
        }))
        .unwrap();
        allocations.push(a);
        reservations.insert(format!("c{c}"), json!({"addresses": [piece]}));
    }
    let record: IPAMPoolRecord = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPoolRecord",
        "metadata": {"name": "metallb.dc-1"},
        "spec": {"pool": "metallb", "datacenter": "dc-1", "reservations": reservations},
    }))
    .unwrap();
    StaticSource {
        pools: vec![pool],
        allocations,
        records: vec![record],
        ..StaticSource::default()
    }
}

fn review(i: usize, kind: &str) -> Vec<u8> {
    let (resource, operation, object, old) = match kind {
        // A hand-made allocation of free addresses: checked against 1,000 objects and the record.
        "allocation" => {
            let first = CLUSTERS * 8 + i as u32 * 8;
            (
                "ipamallocations",
                "CREATE",
                json!({
                    "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMAllocation",
                    "metadata": {"name": "metallb", "namespace": format!("cluster-h{i}")},
                    "spec": {"type": "range", "dc": "dc-1", "addresses": [format!("{}-{}", address(first), address(first + 7))]},
                }),
                Value::Null,
            )
        }
        // A pool update adding an exclusion over free addresses: checked against every holding.
        _ => {
            let old = json!({
                "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
                "metadata": {"name": "metallb"},
                "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.0.0.0/16", "allocationRange": 8}}},
            });
            let mut new = old.clone();
            new["spec"]["datacenters"]["dc-1"]["excludeRanges"] =
                json!([address(60_000 + i as u32)]);
            ("ipampools", "UPDATE", new, old)
        }
    };
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("u-{i}"),
            "resource": {"group": "ipam.kipam.dev", "version": "v1alpha1", "resource": resource},
            "name": object["metadata"]["name"],
            "namespace": object["metadata"]["namespace"],
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object,
            "oldObject": old,
        }
    }))
    .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let dir = std::env::temp_dir().join(format!("kipam-bench-webhook-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf_cert = leaf
        .signed_by(&leaf_key, &rcgen::Issuer::from_params(&ca, &ca_key))
        .unwrap();
    std::fs::write(dir.join("tls.crt"), leaf_cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), leaf_key.serialize_pem()).unwrap();
    let ca_pem = ca_cert.pem().into_bytes();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}{}",
        listener.local_addr().unwrap().port(),
        webhook::PATH
    );
    let app = webhook::router(seed(), KIPAM, webhook::REVIEW_DEADLINE);
    let files = TlsFiles::new(dir.join("tls.crt"), dir.join("tls.key"));
    tokio::spawn(kipam::tls::serve(
        listener,
        files,
        app,
        std::future::pending(),
    ));

    println!(
        "webhook: {CONCURRENT} concurrent reviews x {ROUNDS} rounds, pool of {CLUSTERS} allocations (objects + record), one TLS connection per review"
    );
    for kind in ["allocation", "pool"] {
        let mut latencies = Vec::new();
        let started = Instant::now();
        for _ in 0..ROUNDS {
            let mut tasks = Vec::new();
            for i in 0..CONCURRENT {
                let body = review(i, kind);
                let url = url.clone();
                let ca = ca_pem.clone();
                tasks.push(tokio::spawn(async move {
                    let t = Instant::now();
                    let r = kube_standin::https::post(
                        &url,
                        &ca,
                        "application/json",
                        &body,
                        Duration::from_secs(30),
                    )
                    .await
                    .expect("review answered");
                    let answer: Value = serde_json::from_slice(&r.body).unwrap();
                    assert_eq!(answer["response"]["allowed"], true, "{answer}");
                    t.elapsed()
                }));
            }
            for t in tasks {
                latencies.push(t.await.unwrap());
            }
        }
        let total = started.elapsed();
        latencies.sort();
        println!(
            "  {kind:<10} median {}  p99 {}  max {}  ({} reviews in {:.2} s, {:.0}/s)",
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.99)),
            ms(*latencies.last().unwrap()),
            latencies.len(),
            total.as_secs_f64(),
            latencies.len() as f64 / total.as_secs_f64()
        );
    }
    // For scale: one review at a time over TLS, and the decision alone (no TLS, no HTTP).
    let mut alone = Vec::new();
    for i in 0..200 {
        let body = review(i, "allocation");
        let t = Instant::now();
        kube_standin::https::post(
            &url,
            &ca_pem,
            "application/json",
            &body,
            Duration::from_secs(30),
        )
        .await
        .expect("review answered");
        alone.push(t.elapsed());
    }
    alone.sort();
    println!(
        "  one review at a time over TLS: median {}  p99 {}",
        ms(percentile(&alone, 0.5)),
        ms(percentile(&alone, 0.99))
    );
    let source = seed();
    for kind in ["allocation", "pool"] {
        let mut decide = Vec::new();
        for i in 0..200 {
            let body: Value = serde_json::from_slice(&review(i, kind)).unwrap();
            let request: kipam::webhook::review::AdmissionRequest =
                serde_json::from_value(body["request"].clone()).unwrap();
            let t = Instant::now();
            let wants = kipam::webhook::rules::wants(&request);
            let view = webhook::Source::view(&source, &wants).await.unwrap();
            let verdict = kipam::webhook::rules::decide(&request, &view, KIPAM);
            decide.push(t.elapsed());
            assert!(verdict.allowed);
        }
        decide.sort();
        println!(
            "  decision alone ({kind}, view gathered from 1,000 allocations): median {}  p99 {}",
            ms(percentile(&decide, 0.5)),
            ms(percentile(&decide, 0.99))
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
