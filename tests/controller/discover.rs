//! The discovery reader (`kipam::discover`) in process, over the seed stand-in's real watches
//! and an elected Lease, reading user cluster stand-ins served over TLS: what it finds, that
//! it follows changes by watch, that it reads only clusters that adopt, and a user cluster
//! without MetalLB.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_standin::ApiServer;
use serde_json::json;
use tokio::sync::Notify;

use kipam::planner::adopt::{Discovered, HandMadePool, ServedService};
use kipam::seed::discovered::Discovery;
use kipam::seed::leader::{Elector, LeaderState, LeaseTiming};
use kipam::seed::metrics::Metrics;
use kipam::seed::{Context, Dirty, watches};

use super::support::Seed;

const WAIT: Duration = Duration::from_secs(30);
const METALLB_CRDS: &str = include_str!("../render/fixtures/metallb-crds.yaml");

/// The reader on its own, leading, with the seed's caches; stopped when dropped.
struct Reader {
    ctx: Arc<Context>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn client(api: &ApiServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

impl Reader {
    async fn start(seed: &Seed) -> Reader {
        let client = client(&seed.api).await;
        let metrics = Metrics::new();
        let wake = Arc::new(Notify::new());
        let dirty = Arc::new(Dirty::default());
        dirty.set_wake(wake.clone());
        let caches = watches::caches(&client, &metrics, &wake, &dirty);
        let leader = LeaderState::new(LeaseTiming::default().renew_deadline);
        let ctx = Context::builder(client.clone())
            .caches(
                caches.pools,
                caches.clusters,
                caches.namespaces,
                caches.capi,
            )
            .record_view(caches.records)
            .dirty(dirty)
            .metrics(metrics)
            .leader(leader.clone())
            .build();
        let elector = Elector::new(
            Api::<Lease>::namespaced(client, "kipam-system"),
            "kipam-discover-test",
            "reader",
            LeaseTiming::default(),
            leader,
        );
        let tasks = vec![
            tokio::spawn(watches::drive(vec![caches.events])),
            tokio::spawn(elector.run()),
            tokio::spawn(kipam::discover::run(ctx.clone())),
        ];
        Reader { ctx, tasks }
    }
}

/// Waits until what the reader holds for `cluster` satisfies `check`.
async fn wait_for(
    reader: &Reader,
    what: &str,
    cluster: &str,
    mut check: impl FnMut(Option<Discovery>) -> bool,
) {
    {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < WAIT {
            last = reader.ctx.discovered.get(cluster);
            if check(last.clone()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "timed out waiting for {what}; the cache holds {last:?} (leading: {}, clusters cached: {})",
            reader.ctx.leader.holds(),
            reader.ctx.clusters.state().len()
        );
    }
}

/// A user cluster over TLS with its namespaces, and MetalLB's CRDs when `metallb`.
async fn user_cluster(metallb: bool) -> ApiServer {
    let api = ApiServer::start_tls().await.expect("user cluster starts");
    for ns in ["metallb-system", "shop"] {
        let _ = api.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns}}));
    }
    if metallb {
        api.apply_yaml(METALLB_CRDS).expect("MetalLB CRDs");
    }
    api
}

fn register(seed: &Seed, cluster: &str, user: &ApiServer, adopt: Option<&str>) {
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("kc-{cluster}"), "namespace": "kipam-system"},
            "stringData": {"kubeconfig": user.kubeconfig_yaml()}}))
        .expect("secret");
    let mut spec = json!({"datacenter": "dc-1",
        "kubeconfig": {"secretRef": {"namespace": "kipam-system", "name": format!("kc-{cluster}")}}});
    if let Some(a) = adopt {
        spec["adopt"] = a.into();
    }
    seed.api
        .apply(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": cluster}, "spec": spec}),
        )
        .expect("cluster");
}

fn pool(user: &ApiServer, name: &str, addresses: &[&str], kipams: bool) {
    let labels = if kipams {
        json!({"ipam.kipam.dev/addon": "metallb"})
    } else {
        json!({})
    };
    user.apply(
        &json!({"apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
        "metadata": {"name": name, "namespace": "metallb-system", "labels": labels},
        "spec": {"addresses": addresses}}),
    )
    .expect("pool");
}

fn service(user: &ApiServer, name: &str, type_: &str, ip: Option<&str>, pool: Option<&str>) {
    let annotations = match pool {
        Some(p) => json!({"metallb.universe.tf/address-pool": p}),
        None => json!({}),
    };
    user.create(&json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "shop", "annotations": annotations},
        "spec": {"type": type_, "ports": [{"port": 80}]}}))
        .expect("service");
    if let Some(ip) = ip {
        user.set_status(
            "services",
            Some("shop"),
            name,
            json!({"loadBalancer": {"ingress": [{"ip": ip}]}}),
        )
        .expect("status");
    }
}

fn served(name: &str, ip: &str, pool: Option<&str>) -> ServedService {
    ServedService {
        name: format!("shop/{name}"),
        addresses: vec![ip.to_string()],
        pool: pool.map(str::to_string),
    }
}

fn complete(d: &Option<Discovery>) -> Option<&Discovered> {
    d.as_ref().and_then(Discovery::complete)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_cluster_shows_its_hand_made_pools_and_served_services_and_follows_them() {
    let seed = Seed::start("discover-found").await;
    let user = user_cluster(true).await;
    pool(
        &user,
        "legacy",
        &["10.0.0.0/28", "10.0.1.5-10.0.1.9"],
        false,
    );
    pool(&user, "kipam-managed-pool", &["10.0.2.0/30"], true);
    service(
        &user,
        "web",
        "LoadBalancer",
        Some("10.0.0.3"),
        Some("legacy"),
    );
    service(&user, "api", "LoadBalancer", Some("10.0.1.6"), None);
    service(&user, "pending", "LoadBalancer", None, None);
    service(&user, "internal", "ClusterIP", None, None);
    let reader = Reader::start(&seed).await;
    register(&seed, "c1", &user, Some("DryRun"));

    let expected = Discovered {
        pools: vec![HandMadePool {
            namespace: "metallb-system".into(),
            name: "legacy".into(),
            addresses: vec!["10.0.0.0/28".into(), "10.0.1.5-10.0.1.9".into()],
        }],
        services: vec![
            served("api", "10.0.1.6", None),
            served("web", "10.0.0.3", Some("legacy")),
        ],
    };
    wait_for(&reader, "c1 read completely", "c1", |d| {
        complete(&d) == Some(&expected)
    })
    .await;
    assert_eq!(reader.ctx.discovered.snapshot().len(), 1);

    // A change shows by watch: no list is sent for it.
    let lists = user.stats().count("list", "services");
    let generation = reader.ctx.discovered.generation();
    user.set_status(
        "services",
        Some("shop"),
        "pending",
        json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.4"}]}}),
    )
    .unwrap();
    user.delete("services", Some("shop"), "api").unwrap();
    wait_for(
        &reader,
        "the new address and the deleted Service",
        "c1",
        |d| {
            complete(&d).is_some_and(|f| {
                f.services
                    == vec![
                        served("pending", "10.0.0.4", None),
                        served("web", "10.0.0.3", Some("legacy")),
                    ]
            })
        },
    )
    .await;
    assert!(reader.ctx.discovered.generation() > generation);
    assert_eq!(
        user.stats().count("list", "services"),
        lists,
        "changes come by watch, nothing is listed again"
    );
    // A pool edited by hand shows too; kipam's own stays out whatever it holds.
    pool(&user, "legacy", &["10.0.0.0/28"], false);
    pool(&user, "kipam-managed-pool", &["10.0.3.0/30"], true);
    wait_for(&reader, "the edited pool", "c1", |d| {
        complete(&d).is_some_and(|f| {
            f.pools
                == vec![HandMadePool {
                    namespace: "metallb-system".into(),
                    name: "legacy".into(),
                    addresses: vec!["10.0.0.0/28".into()],
                }]
        })
    })
    .await;
    let metrics = reader.ctx.metrics.encode();
    assert!(metrics.contains("discovery_user_clusters 1"), "{metrics}");
    assert!(
        metrics.contains("discovery_unreachable_user_clusters 0"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_clusters_that_adopt_are_read_and_one_that_stops_is_dropped() {
    let seed = Seed::start("discover-only").await;
    let adopting = user_cluster(true).await;
    let plain = user_cluster(true).await;
    service(&plain, "web", "LoadBalancer", Some("10.0.0.3"), None);
    let reader = Reader::start(&seed).await;
    register(&seed, "plain", &plain, None);
    register(&seed, "off", &plain, Some("Disabled"));
    register(&seed, "adopting", &adopting, Some("DryRun"));
    wait_for(&reader, "the adopting cluster read", "adopting", |d| {
        complete(&d).is_some()
    })
    .await;
    // Past a recheck of the clusters to read.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        plain.stats().total,
        0,
        "no request reaches a user cluster that does not adopt: {:?}",
        plain.stats().by_request
    );
    assert_eq!(
        reader.ctx.discovered.snapshot().keys().collect::<Vec<_>>(),
        vec!["adopting"]
    );

    // Its pool datacenter's `adopt` reaches a cluster without its own value, not one with
    // `Off`.
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/24
      allocationRange: 4
      adopt: Adopt
",
    );
    wait_for(
        &reader,
        "the plain cluster read through its datacenter",
        "plain",
        |d| complete(&d).is_some_and(|f| f.services == vec![served("web", "10.0.0.3", None)]),
    )
    .await;
    assert_eq!(reader.ctx.discovered.get("off"), None);

    // A cluster that stops adopting is dropped from the cache.
    register(&seed, "adopting", &adopting, Some("Disabled"));
    wait_for(
        &reader,
        "the cluster that stopped adopting dropped",
        "adopting",
        |d| d.is_none(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_cluster_without_metallb_has_no_hand_made_pools_and_its_services_are_read() {
    let seed = Seed::start("discover-bare").await;
    let user = user_cluster(false).await;
    service(&user, "web", "LoadBalancer", Some("192.0.2.7"), None);
    let reader = Reader::start(&seed).await;
    register(&seed, "bare", &user, Some("DryRun"));
    wait_for(
        &reader,
        "the services of a cluster without MetalLB",
        "bare",
        |d| {
            complete(&d).is_some_and(|f| {
                f.pools.is_empty() && f.services == vec![served("web", "192.0.2.7", None)]
            })
        },
    )
    .await;
    assert!(reader.ctx.discovered.problems().is_empty());
    // MetalLB installed later: its pools are found (looked for again with backoff).
    user.apply_yaml(METALLB_CRDS).expect("MetalLB CRDs");
    pool(&user, "legacy", &["192.0.2.0/28"], false);
    wait_for(
        &reader,
        "the pool of MetalLB installed later",
        "bare",
        |d| complete(&d).is_some_and(|f| f.pools.len() == 1),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_user_cluster_is_marked_with_why() {
    let seed = Seed::start("discover-gone").await;
    let user = user_cluster(true).await;
    let reader = Reader::start(&seed).await;
    register(&seed, "gone", &user, Some("DryRun"));
    wait_for(&reader, "the cluster read", "gone", |d| {
        complete(&d).is_some()
    })
    .await;
    user.shutdown();
    wait_for(&reader, "the cluster marked unreadable", "gone", |d| {
        matches!(d, Some(Discovery::Unreadable { .. }))
    })
    .await;
    assert_eq!(reader.ctx.discovered.problems().len(), 1);
}
