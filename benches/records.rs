//! Pool record commit benchmark: `cargo bench --bench records`.
//!
//! One `IPAMPoolRecord` holding 10,000 clusters (about 600 KB, what every pool datacenter
//! holds at 10,000 clusters) on the API stand-in; measures `records::commit` adding one new
//! cluster to it, as the planning pass does for each pool datacenter a new cluster joins.
//! The stand-in runs on its own thread and runtime, so every figure includes its cost of
//! storing the record. Prints median, p90 and max over `KIPAM_BENCH_COMMITS` commits
//! (default 50).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube_standin::ApiServer;
use serde_json::json;

use kipam::controller::{Context, backoff, leader, ledger, metrics, records};
use kipam::resources::{IPAMPool, Reservation};

const ENTRIES: usize = 10_000;

fn reservation(i: usize) -> Reservation {
    let a = format!("10.{}.{}.{}", (i >> 14) & 255, (i >> 6) & 255, (i & 63) * 4);
    let b = format!(
        "10.{}.{}.{}",
        (i >> 14) & 255,
        (i >> 6) & 255,
        (i & 63) * 4 + 3
    );
    Reservation {
        cidr: None,
        addresses: vec![format!("{a}-{b}")],
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn summary(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "{what}: median {}, p90 {}, max {} ({} commits)",
        ms(at(0.5)),
        ms(at(0.9)),
        ms(at(1.0)),
        samples.len()
    );
}

fn main() {
    let commits: usize = std::env::var("KIPAM_BENCH_COMMITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let api = ApiServer::start_detached().expect("stand-in starts");
    for crd in kipam::resources::crds() {
        api.apply(&serde_json::to_value(&crd).expect("CRD JSON"))
            .expect("CRD applies");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig_yaml()).expect("kubeconfig");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        let client = kube::Client::try_from(cfg).expect("client");
        let pool: IPAMPool = serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "bench"},
            "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.0.0.0/8", "allocationRange": 4}}},
        }))
        .expect("pool JSON");
        let pool = Api::<IPAMPool>::all(client.clone())
            .create(&PostParams::default(), &pool)
            .await
            .expect("pool created");
        let (pools, _p) = reflector::store();
        let (clusters, _c) = reflector::store();
        let (namespaces, _n) = reflector::store();
        let ctx = Arc::new(Context {
            client: client.clone(),
            writer: client.clone(),
            pools,
            clusters,
            namespaces,
            ledger: tokio::sync::Mutex::new(ledger::Ledger::default()),
            ledger_updates: tokio::sync::watch::Sender::new(true),
        records: tokio::sync::Mutex::new(records::Records::default()),
        dirty: Default::default(),
            backoff: std::sync::Mutex::new(backoff::Backoff::default()),
            pass_lock: tokio::sync::Mutex::new(()),
            recorder: Recorder::new(client, Reporter { controller: "kipam".into(), instance: None }),
            metrics: metrics::Metrics::new(),
            leader: leader::LeaderState::new(Duration::from_secs(10)),
        });
        let key = ("bench".to_string(), "dc-1".to_string());
        let mut desired: BTreeMap<String, Reservation> =
            (0..ENTRIES).map(|i| (format!("cluster-{i:05}"), reservation(i))).collect();
        records::commit(&ctx, &pool, &key, desired.clone()).await.expect("record created");
        let stored = api.get("ipampoolrecords", None, "bench.dc-1").expect("record stored");
        println!(
            "record: {} entries, {} bytes",
            ENTRIES,
            serde_json::to_vec(&stored).expect("JSON").len()
        );

        // The full desired map, as the planning pass passes it (the clone is not timed).
        let mut samples = Vec::with_capacity(commits);
        for j in 0..commits + 3 {
            desired.insert(format!("new-{j:05}"), reservation(ENTRIES + j));
            let map = desired.clone();
            let start = Instant::now();
            records::commit(&ctx, &pool, &key, map).await.expect("commit");
            if j >= 3 {
                samples.push(start.elapsed());
            }
        }
        summary("commit (full desired map), one new entry", samples);
        // KIPAM_BENCH_DELTA
        let stored = api.get("ipampoolrecords", None, "bench.dc-1").expect("record stored");
        let held = stored["spec"]["reservations"].as_object().map(|m| m.len());
        assert_eq!(held, Some(desired.len()), "the record holds every entry");
    });
}
