//! Pool record commit benchmark: `cargo bench --bench records`.
//!
//! The record of a pool datacenter holding 10,000 clusters (about 600 KB in all) on the API
//! stand-in, kept in shards by address block (here a `range` /8: blocks of 4,096 addresses,
//! 1,024 clusters of 4 addresses each); measures `records::commit` adding one new cluster to
//! it, as the planning pass does for each pool datacenter a new cluster joins.
//! The stand-in runs on its own thread and runtime, so every figure includes its cost of
//! storing the record. Prints median, p90 and max over `KIPAM_BENCH_COMMITS` commits
//! (default 50) of: one new entry with the full desired map (what a pass passes), a commit
//! that changes nothing but checks one cluster's shard (the check before objects are
//! written), and one new entry passed as a delta (`records::commit_changes`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use kube::api::{Api, PostParams};

use kube_standin::ApiServer;
use serde_json::json;

use kipam::planning::records;
use kipam::resources::{IPAMPool, Reservation};
use kipam::seed::{Context, ledger};

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

/// CPU time of the calling thread: the client's side of a commit (kipam and the kube
/// client run on this thread's runtime, the stand-in on threads of its own).
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Wall time and client CPU time of one commit.
struct Timer(Instant, Duration);

impl Timer {
    fn start() -> Timer {
        Timer(Instant::now(), thread_cpu())
    }

    fn stop(self) -> (Duration, Duration) {
        (self.0.elapsed(), thread_cpu().saturating_sub(self.1))
    }
}

fn summary(what: &str, samples: Vec<(Duration, Duration)>) {
    let mut wall: Vec<Duration> = samples.iter().map(|s| s.0).collect();
    let mut cpu: Vec<Duration> = samples.iter().map(|s| s.1).collect();
    wall.sort();
    cpu.sort();
    let at = |v: &[Duration], p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "{what}: median {}, p90 {}, max {}; client CPU median {} ({} commits)",
        ms(at(&wall, 0.5)),
        ms(at(&wall, 0.9)),
        ms(at(&wall, 1.0)),
        ms(at(&cpu, 0.5)),
        wall.len()
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
        let ctx = Context::builder(client.clone())
            .complete_ledger(ledger::Ledger::default())
            .build();
        let key = ("bench".to_string(), "dc-1".to_string());
        // The pools the planning pass read (this one pool), as every commit carries them.
        let planned = records::PlannedOn::pools([&pool]);
        let mut desired: BTreeMap<String, Reservation> =
            (0..ENTRIES).map(|i| (format!("cluster-{i:05}"), reservation(i))).collect();
        records::commit(&ctx, &pool, &key, desired.clone(), BTreeSet::new(), &planned)
            .await
            .expect("record created");
        // The shards (not the pool datacenter's layout record).
        let stored: Vec<serde_json::Value> = api
            .list("ipampoolrecords", None)
            .into_iter()
            .filter(|r| r["spec"].get("blockLength").is_none())
            .collect();
        let bytes: Vec<usize> = stored
            .iter()
            .map(|r| serde_json::to_vec(r).expect("JSON").len())
            .collect();
        println!(
            "record: {} entries in {} shards, {} bytes in all, the largest shard {} bytes",
            ENTRIES,
            stored.len(),
            bytes.iter().sum::<usize>(),
            bytes.iter().max().copied().unwrap_or(0)
        );

        // The full desired map, as the planning pass passes it (the clone is not timed).
        let mut samples = Vec::with_capacity(commits);
        for j in 0..commits + 3 {
            desired.insert(format!("new-{j:05}"), reservation(ENTRIES + j));
            let map = desired.clone();
            let timer = Timer::start();
            records::commit(&ctx, &pool, &key, map, BTreeSet::new(), &planned)
                .await
                .expect("commit");
            if j >= 3 {
                samples.push(timer.stop());
            }
        }
        summary("commit (full desired map), one new entry", samples);

        // Nothing changes: the check that one cluster's shard is current, sent before its
        // object is written where the record stays as it is.
        let mut samples = Vec::with_capacity(commits);
        for j in 0..commits {
            let map = desired.clone();
            let check = BTreeSet::from([format!("cluster-{:05}", j * 97 % ENTRIES)]);
            let timer = Timer::start();
            records::commit(&ctx, &pool, &key, map, check, &planned)
                .await
                .expect("commit");
            samples.push(timer.stop());
        }
        summary("commit (full desired map), no change, one shard checked", samples);

        // The caller knows the delta: no comparison of the whole map.
        let mut samples = Vec::with_capacity(commits);
        for j in 0..commits {
            let name = format!("delta-{j:05}");
            let entry = reservation(2 * ENTRIES + j);
            desired.insert(name.clone(), entry.clone());
            let changes = BTreeMap::from([(name, Some(entry))]);
            let timer = Timer::start();
            records::commit_changes(&ctx, &pool, &key, changes, &planned)
                .await
                .expect("commit");
            samples.push(timer.stop());
        }
        summary("commit_changes, one new entry", samples);
        let held: usize = api
            .list("ipampoolrecords", None)
            .iter()
            .filter_map(|r| r["spec"]["reservations"].as_object().map(|m| m.len()))
            .sum();
        assert_eq!(held, desired.len(), "the record holds every entry");
    });
}
