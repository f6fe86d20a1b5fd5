//! Demand-driven growth end to end: the real controller, a user cluster stand-in with the
//! MetalLB stand-in (`metallb.rs`), LoadBalancer Services created and deleted there.

use std::time::{Duration, Instant};

use kube_standin::ApiServer;
use serde_json::{Value, json};

use super::metallb::{MetalLb, address_of, service};
use super::support::{Controller, Seed};

const WAIT: Duration = Duration::from_secs(30);
const METALLB_CRDS: &str = include_str!("../render/fixtures/metallb-crds.yaml");

const POOLS: &str = "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata:
  name: metallb
spec:
  datacenters:
    dc-1:
      type: range
      poolCidr: 10.0.0.0/28
      allocationRange: 2
      growth: {increment: 2, max: 6, shrinkAfter: 1m}
    dc-2:
      type: range
      poolCidr: 10.0.1.0/30
      allocationRange: 2
      growth: {increment: 2, max: 4, shrinkAfter: 1m}
";

async fn user_cluster() -> ApiServer {
    prepare(ApiServer::start().await.expect("user cluster starts"))
}

/// A user cluster's namespaces and MetalLB's CRDs.
fn prepare(api: ApiServer) -> ApiServer {
    for ns in ["metallb-system", "default"] {
        let _ = api.apply(&json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns}}));
    }
    api.apply_yaml(METALLB_CRDS).expect("MetalLB CRDs");
    api
}

/// The kubeconfig Secret of `user` and a Cluster naming it.
fn add_cluster(seed: &Seed, cluster: &str, dc: &str, user: &ApiServer) {
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("kc-{cluster}"), "namespace": "kipam-system"},
            "stringData": {"kubeconfig": user.kubeconfig_yaml()}}))
        .expect("secret");
    seed.cluster_with(
        cluster,
        dc,
        &format!("kubeconfig: {{secretRef: {{namespace: kipam-system, name: kc-{cluster}}}}}"),
    );
}

async fn register(seed: &Seed, cluster: &str, dc: &str, user: &ApiServer) {
    add_cluster(seed, cluster, dc, user);
    let ns = format!("cluster-{cluster}");
    seed.wait_for(&format!("namespace {ns}"), WAIT, "ctl", |s| {
        s.get("namespaces", None, &ns).is_some()
    })
    .await;
    seed.api
        .create(
            &json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Addon",
            "metadata": {"name": "metallb", "namespace": ns},
            "spec": {"name": "metallb"}}),
        )
        .expect("addon");
}

fn pool_entries(api: &ApiServer) -> Vec<String> {
    api.get(
        "ipaddresspools.metallb.io",
        Some("metallb-system"),
        "kipam-managed-pool",
    )
    .and_then(|p| {
        p["spec"]["addresses"].as_array().map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
    })
    .unwrap_or_default()
}

fn pieces(seed: &Seed, cluster: &str) -> Vec<Value> {
    seed.get(
        "ipamallocations",
        Some(&format!("cluster-{cluster}")),
        "metallb",
    )
    .and_then(|a| a["status"]["pieces"].as_array().cloned())
    .unwrap_or_default()
}

fn event_notes(seed: &Seed, reason: &str) -> Vec<String> {
    seed.api
        .list("events.events.k8s.io", None)
        .iter()
        .filter(|e| e["reason"] == reason || e["note"].as_str().is_some_and(|n| n.contains(reason)))
        .filter_map(|e| e["note"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_service_grows_the_pool_and_unused_pieces_go_back() {
    let seed = Seed::start("growth").await;
    let user = user_cluster().await;
    let metallb = MetalLb::start(user.clone());
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    register(&seed, "g1", "dc-1", &user).await;

    seed.wait_for("condition GrowthDemandReadable True", WAIT, "ctl", |s| {
        s.condition("clusters", "g1", "GrowthDemandReadable")
            .is_some_and(|c| c["status"] == "True")
    })
    .await;
    // The initial size reaches the user cluster.
    seed.wait_for("the initial pool in the user cluster", WAIT, "ctl", |_| {
        pool_entries(&user) == vec!["10.0.0.0-10.0.0.1".to_string()]
    })
    .await;

    // Two Services take the initial addresses; the third is refused by MetalLB, the
    // allocation grows by one increment, and the third gets an address.
    for s in ["s1", "s2"] {
        service(&user, s);
    }
    seed.wait_for("s1 and s2 served", WAIT, "ctl", |_| {
        address_of(&user, "s1").is_some() && address_of(&user, "s2").is_some()
    })
    .await;
    // The user cluster refuses the first four writes of its IPAddressPool: after the growth,
    // the grown addresses take a few seconds (the applier's backoff) to reach MetalLB, and all
    // that while s3 waits, refused, in front of a controller that keeps planning.
    user.inject_failures("patch", "ipaddresspools", 4, 500);
    service(&user, "s3");
    let one_growth = "10.0.0.0-10.0.0.1,10.0.0.2-10.0.0.3";
    let start = Instant::now();
    let mut grown_at: Option<Instant> = None;
    let mut waited_after_growth = Duration::ZERO;
    loop {
        let held = seed.held("g1", "metallb");
        let served = address_of(&user, "s3").is_some();
        // One waiting Service never causes two growths: at every look, at most one.
        assert!(
            held == "10.0.0.0-10.0.0.1" || held == one_growth,
            "g1 holds {held} while s3 {} ({:?} after its creation)\n{}",
            if served { "is served" } else { "waits" },
            start.elapsed(),
            seed.log("ctl")
        );
        if held == one_growth && grown_at.is_none() {
            grown_at = Some(Instant::now());
        }
        if served {
            break;
        }
        if let Some(at) = grown_at {
            waited_after_growth = at.elapsed();
        }
        assert!(
            start.elapsed() < WAIT,
            "s3 not served after {WAIT:?}, g1 holds {held}\n{}",
            seed.log("ctl")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        grown_at.is_some(),
        "s3 was served without the allocation growing"
    );
    assert!(
        waited_after_growth >= Duration::from_secs(1),
        "s3 waited only {waited_after_growth:?} after the growth: the check above covered no wait"
    );
    assert_eq!(
        user.pending_failures(),
        0,
        "the refused writes were retried"
    );
    {
        let log = metallb.log.lock().unwrap();
        let refused = log
            .refused
            .get("default/s3")
            .copied()
            .expect("s3 was refused first");
        let served = log.served["default/s3"].0;
        eprintln!(
            "refusal to address: {:?}, of which {waited_after_growth:?} after the growth",
            served - refused
        );
    }
    assert_eq!(seed.held("g1", "metallb"), one_growth);
    let p = pieces(&seed, "g1");
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(p[0]["kind"], "Initial");
    assert_eq!(p[1]["kind"], "Grown");
    assert_eq!(p[1]["addresses"], "10.0.0.2-10.0.0.3");
    assert!(p[1]["grownAt"].is_string());
    assert_eq!(
        pool_entries(&user),
        vec!["10.0.0.0-10.0.0.1", "10.0.0.2-10.0.0.3"]
    );
    let grown = event_notes(&seed, "AllocationGrown");
    assert!(
        grown.iter().any(|n| n.contains("default/s3")),
        "the growth event names the Service: {grown:?}"
    );
    assert_eq!(grown.len(), 1, "one growth event: {grown:?}");

    // Four more: growth stops at max 6 and says which Services still wait.
    for s in ["s4", "s5", "s6", "s7"] {
        service(&user, s);
    }
    seed.wait_for("GrowthMaxReached", WAIT, "ctl", |s| {
        !event_notes(s, "GrowthMaxReached").is_empty()
    })
    .await;
    seed.wait_for("held at max", WAIT, "ctl", |s| {
        s.held("g1", "metallb").split(',').count() == 3
    })
    .await;
    // Six addresses for seven Services: one waits.
    seed.wait_for("three of the four served", WAIT, "ctl", |_| {
        ["s4", "s5", "s6", "s7"]
            .iter()
            .filter(|s| address_of(&user, s).is_some())
            .count()
            == 3
    })
    .await;
    let notes = event_notes(&seed, "GrowthMaxReached");
    assert!(
        notes.iter().any(|n| n.contains("growth max of 6")),
        "{notes:?}"
    );

    // Every Service but s1 and s2 goes: after shrinkAfter without use, the grown pieces go
    // back, the initial piece stays, and the user cluster's pool shrinks with it.
    for s in ["s3", "s4", "s5", "s6", "s7"] {
        user.delete("services", Some("default"), s).expect("delete");
    }
    let deleted = Instant::now();
    seed.wait_for(
        "grown pieces given back",
        Duration::from_secs(150),
        "ctl",
        |s| s.held("g1", "metallb") == "10.0.0.0-10.0.0.1",
    )
    .await;
    // `unusedSince` is kept to the second (floored), so the 60 s of shrinkAfter may end up to
    // a second before 60 s of this test's clock.
    assert!(
        deleted.elapsed() >= Duration::from_secs(59),
        "given back after {:?}, before shrinkAfter",
        deleted.elapsed()
    );
    seed.wait_for("the user cluster's pool shrinks", WAIT, "ctl", |_| {
        pool_entries(&user) == vec!["10.0.0.0-10.0.0.1".to_string()]
    })
    .await;
    assert!(address_of(&user, "s1").is_some() && address_of(&user, "s2").is_some());
    assert!(!event_notes(&seed, "AllocationShrunk").is_empty());
    seed.wait_for("status pieces follow", WAIT, "ctl", |s| {
        let p = pieces(s, "g1");
        p.len() == 1 && p[0]["kind"] == "Initial"
    })
    .await;
    // Given back for good: the pool record's copy does not bring the pieces back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(seed.held("g1", "metallb"), "10.0.0.0-10.0.0.1");
    assert_eq!(pool_entries(&user), vec!["10.0.0.0-10.0.0.1".to_string()]);
    seed.assert_no_overlap_no_leak();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_is_said_and_nothing_is_taken_twice() {
    let seed = Seed::start("growth-full").await;
    let a = user_cluster().await;
    let b = user_cluster().await;
    let _ma = MetalLb::start(a.clone());
    let _mb = MetalLb::start(b.clone());
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    // dc-2's pool holds 4 addresses: two clusters of 2 fill it.
    register(&seed, "f1", "dc-2", &a).await;
    register(&seed, "f2", "dc-2", &b).await;
    seed.wait_for("both initial pools applied", WAIT, "ctl", |_| {
        pool_entries(&a).len() == 1 && pool_entries(&b).len() == 1
    })
    .await;
    for s in ["s1", "s2", "s3"] {
        service(&a, s);
    }
    seed.wait_for("GrowthPoolFull", WAIT, "ctl", |s| {
        event_notes(s, "GrowthPoolFull")
            .iter()
            .any(|n| n.contains("default/s3"))
    })
    .await;
    assert_eq!(seed.held("f1", "metallb").split(',').count(), 1);
    assert!(address_of(&a, "s3").is_none());
    seed.assert_no_overlap_no_leak();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_user_cluster_is_said_and_grows_nothing() {
    let seed = Seed::start("growth-down").await;
    let down = ApiServer::start().await.expect("stand-in starts");
    let kubeconfig = down.kubeconfig_yaml();
    down.shutdown();
    drop(down);
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    seed.api
        .apply(&json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "kc-d1", "namespace": "kipam-system"},
            "stringData": {"kubeconfig": kubeconfig}}))
        .expect("secret");
    seed.cluster_with(
        "d1",
        "dc-1",
        "kubeconfig: {secretRef: {namespace: kipam-system, name: kc-d1}}",
    );
    seed.wait_for("GrowthDemandUnreadable", WAIT, "ctl", |s| {
        s.api.list("events.events.k8s.io", None).iter().any(|e| {
            e["reason"] == "GrowthDemandUnreadable"
                && e["regarding"]["name"] == "d1"
                && e["note"]
                    .as_str()
                    .is_some_and(|n| n.contains("cannot be read"))
        })
    })
    .await;
    seed.wait_for("condition GrowthDemandReadable False", WAIT, "ctl", |s| {
        s.condition("clusters", "d1", "GrowthDemandReadable")
            .is_some_and(|c| c["status"] == "False" && c["reason"] == "Unreadable")
    })
    .await;
    assert_eq!(seed.held("d1", "metallb"), "10.0.0.0-10.0.0.1");
}

/// A user cluster served over TLS (ALPN offering h2 and http/1.1, as a real API server), with
/// the count of the connections it accepted.
async fn tls_user_cluster() -> (ApiServer, std::sync::Arc<kube_standin::Connections>) {
    let user = prepare(
        ApiServer::start_tls()
            .await
            .expect("user cluster starts over TLS"),
    );
    let connections = user
        .connections()
        .expect("a TLS stand-in counts connections");
    (user, connections)
}

/// Every room that talks to a user cluster — the applier's syncs and drift watches, the demand
/// reader's Service and Event watches — shares one connection to it, over HTTP/2 as a real
/// API server offers it through ALPN. (Over HTTP/1.1 every watch held a socket of its own:
/// four per user cluster, plus a new connection for every sync.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_cluster_is_served_over_one_connection() {
    let seed = Seed::start("one-connection").await;
    let (user, connections) = tls_user_cluster().await;
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    register(&seed, "g1", "dc-1", &user).await;

    seed.wait_for("condition GrowthDemandReadable True", WAIT, "ctl", |s| {
        s.condition("clusters", "g1", "GrowthDemandReadable")
            .is_some_and(|c| c["status"] == "True")
    })
    .await;
    seed.wait_for("the pool in the user cluster", WAIT, "ctl", |_| {
        pool_entries(&user) == vec!["10.0.0.0-10.0.0.1".to_string()]
    })
    .await;
    // A Service that waits (no MetalLB here): the demand reader watches refusals too.
    service(&user, "waits");
    // The drift watches open once the first sync ended.
    seed.wait_for("the drift and demand watches open", WAIT, "ctl", |_| {
        let stats = user.stats();
        stats.count("watch", "ipaddresspools") > 0
            && stats.count("watch", "services") > 0
            && stats.count("watch", "events") > 0
    })
    .await;
    // A hand edit is repaired (a sync on the same connection), and a Service read as demand.
    let api = "ipaddresspools.metallb.io";
    let mut pool = user
        .get(api, Some("metallb-system"), "kipam-managed-pool")
        .expect("kipam's IPAddressPool");
    pool["spec"]["addresses"] = json!(["10.9.9.0/30"]);
    user.apply(&pool).expect("hand edit");
    seed.wait_for("the hand edit repaired", WAIT, "ctl", |_| {
        pool_entries(&user) == vec!["10.0.0.0-10.0.0.1".to_string()]
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = user.stats();
    let watches = stats.verb("watch");
    assert_eq!(
        connections.open(),
        1,
        "kipam holds {} connections to the user cluster ({} opened in all) for {watches} \
         watches; one is enough over HTTP/2\n{}",
        connections.open(),
        connections.total(),
        seed.log("ctl")
    );
    assert!(
        watches >= 3,
        "only {watches} watches were opened: the test did not cover the drift and demand \
         watches"
    );
    // Not one connection per sync either: the repair went over the one already open.
    assert_eq!(
        connections.total(),
        1,
        "connections opened in all for two syncs and {watches} watches"
    );
}

/// Issue 39, item 4: a user cluster slow to answer its first contact (a server handshaking
/// with thousands of new clients at once) still gets one connection. The rooms that ask for its
/// client meanwhile (the applier's sync, the demand reader) wait for the one first request
/// instead of opening connections of their own, which their watches would then keep open.
/// (Before, a client was shared after 2 s whether or not its connection was up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_cluster_slow_to_handshake_still_gets_one_connection() {
    let seed = Seed::start("slow-handshake").await;
    let (user, connections) = tls_user_cluster().await;
    connections.delay_handshakes(Duration::from_secs(3));
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    register(&seed, "g1", "dc-1", &user).await;
    seed.wait_for("the pool in the user cluster", WAIT, "ctl", |_| {
        pool_entries(&user) == vec!["10.0.0.0-10.0.0.1".to_string()]
    })
    .await;
    seed.wait_for("the drift and demand watches open", WAIT, "ctl", |_| {
        let stats = user.stats();
        stats.count("watch", "ipaddresspools") > 0 && stats.count("watch", "services") > 0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        (connections.open(), connections.total()),
        (1, 1),
        "connections to the user cluster (open, opened in all)\n{}",
        seed.log("ctl")
    );
}

/// Issue 39, item 4: the demand reader starts one task per user cluster at once (here when
/// growth is turned on for 40 clusters); their reads of the kubeconfig Secrets reach the seed
/// a few at a time. (Sent together, each opened a connection to the seed that kube's client
/// kept idle for a minute and a half: at 10,000 user clusters, 10,000 sockets beside theirs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_secrets_are_read_from_the_seed_a_few_at_a_time() {
    const CLUSTERS: usize = 40;
    let pool = |growth: &str| {
        format!(
            "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {{name: metallb}}\n\
             spec:\n  datacenters:\n    dc-1: {{type: range, poolCidr: 10.0.0.0/24, \
             allocationRange: 2{growth}}}\n"
        )
    };
    let seed = Seed::start("secret-reads").await;
    seed.apply(&pool(""));
    let mut users = Vec::new();
    for i in 0..CLUSTERS {
        let user = user_cluster().await;
        add_cluster(&seed, &format!("g{i}"), "dc-1", &user);
        users.push(user);
    }
    let _ctl = seed.controller("ctl");
    seed.wait_for("every cluster allocated", WAIT, "ctl", |s| {
        s.allocations().len() == CLUSTERS
    })
    .await;
    // Every request to the seed now takes 100 ms, so reads sent together are served together.
    seed.api.set_latency(Duration::from_millis(100));
    seed.api.reset_stats();
    seed.apply(&pool(", growth: {increment: 2, max: 6, shrinkAfter: 1m}"));
    seed.wait_for("every user cluster's Services watched", WAIT, "ctl", |_| {
        users
            .iter()
            .all(|u| u.stats().count("watch", "services") > 0)
    })
    .await;
    let stats = seed.api.stats();
    assert!(
        stats.count("list", "secrets") >= CLUSTERS as u64,
        "every kubeconfig read: {stats:?}"
    );
    let together = stats.most_at_once("list", "secrets");
    assert!(
        together <= 16,
        "{together} kubeconfig Secrets were read from the seed at once"
    );
}

/// An `AllocationFailed` event as MetalLB writes it, naming the Service (and its uid when
/// given).
fn refusal(api: &ApiServer, event: &str, service: &str, uid: Option<&str>) {
    let mut involved = json!({"apiVersion": "v1", "kind": "Service", "namespace": "default",
        "name": service});
    if let Some(uid) = uid {
        involved["uid"] = json!(uid);
    }
    api.create(&json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event, "namespace": "default"},
        "involvedObject": involved,
        "reason": "AllocationFailed",
        "type": "Warning",
        "message": format!("Failed to allocate IP for \"default/{service}\": no available IPs"),
        "source": {"component": "metallb-controller"},
    }))
    .expect("event created");
}

/// A LoadBalancer Service that MetalLB served with `ip` (set by hand: no MetalLB here).
fn served(api: &ApiServer, name: &str, ip: &str) {
    if api.get("services", Some("default"), name).is_none() {
        service(api, name);
    }
    api.set_status(
        "services",
        Some("default"),
        name,
        json!({"loadBalancer": {"ingress": [{"ip": ip}]}}),
    )
    .expect("service status");
}

/// The demand reader watches `AllocationFailed` events only while a Service waits: a user
/// cluster whose Services are all served costs one watch (its Services), not two. A refusal
/// MetalLB made before that watch opened still counts (the watch's first list brings it),
/// and one naming an earlier Service of the same name (another uid) does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_watched_only_while_a_service_waits() {
    let seed = Seed::start("refusal-watch").await;
    let user = user_cluster().await;
    // The initial range (the pool's first two addresses) is in use before kipam looks.
    served(&user, "u1", "10.0.0.0");
    served(&user, "u2", "10.0.0.1");
    let _ctl = seed.controller("ctl");
    seed.apply(POOLS);
    register(&seed, "g1", "dc-1", &user).await;
    seed.wait_for("the Services watched", WAIT, "ctl", |s| {
        s.condition("clusters", "g1", "GrowthDemandReadable")
            .is_some_and(|c| c["status"] == "True")
            && user.stats().count("watch", "services") > 0
    })
    .await;
    seed.wait_for("the initial pool in the user cluster", WAIT, "ctl", |_| {
        pool_entries(&user) == vec!["10.0.0.0-10.0.0.1".to_string()]
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = user.stats();
    assert_eq!(
        (
            stats.count("list", "events"),
            stats.count("watch", "events")
        ),
        (0, 0),
        "events listed and watched while no Service waits\n{}",
        seed.log("ctl")
    );
    assert_eq!(seed.held("g1", "metallb"), "10.0.0.0-10.0.0.1");

    // MetalLB refused s1 before the demand reader saw it wait (no uid, as some versions write
    // it): it counts at once, well before an unrefused Service would (after 10 s).
    refusal(&user, "s1.1", "s1", None);
    service(&user, "s1");
    let created = Instant::now();
    let one_growth = "10.0.0.0-10.0.0.1,10.0.0.2-10.0.0.3";
    seed.wait_for("grown for the refused s1", WAIT, "ctl", |s| {
        s.held("g1", "metallb") == one_growth
    })
    .await;
    assert!(
        created.elapsed() < Duration::from_secs(7),
        "grown {:?} after s1 was made: its refusal was not counted",
        created.elapsed()
    );
    assert!(user.stats().count("watch", "events") > 0);

    // The grown addresses taken: s2's first refusal names another uid (an earlier Service of
    // that name) and does not count; its own refusal, with its uid, does.
    served(&user, "s1", "10.0.0.2");
    served(&user, "u3", "10.0.0.3");
    refusal(
        &user,
        "s2.0",
        "s2",
        Some("00000000-0000-0000-0000-00000000e1e1"),
    );
    service(&user, "s2");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        seed.held("g1", "metallb"),
        one_growth,
        "grown for s2 within 5 s: a refusal of another object counted\n{}",
        seed.log("ctl")
    );
    let uid = user
        .get("services", Some("default"), "s2")
        .and_then(|s| s["metadata"]["uid"].as_str().map(str::to_string))
        .expect("s2's uid");
    refusal(&user, "s2.1", "s2", Some(&uid));
    let refused = Instant::now();
    seed.wait_for("grown for the refused s2", WAIT, "ctl", |s| {
        s.held("g1", "metallb").split(',').count() == 3
    })
    .await;
    assert!(
        refused.elapsed() < Duration::from_secs(4),
        "grown {:?} after s2's own refusal",
        refused.elapsed()
    );
    seed.assert_no_overlap_no_leak();
}

/// Passes of one kind this controller ran (`kipam_reconcile_passes_by_kind_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growth_is_decided_on_the_kept_plan_and_new_clusters_keep_the_short_pass() {
    let seed = Seed::start("growth-kept").await;
    let user = user_cluster().await;
    let _metallb = MetalLb::start(user.clone());
    let ctl = seed.controller("ctl");
    seed.apply(POOLS);
    register(&seed, "g1", "dc-1", &user).await;
    seed.wait_for("the initial pool in the user cluster", WAIT, "ctl", |_| {
        pool_entries(&user) == vec!["10.0.0.0-10.0.0.1".to_string()]
    })
    .await;
    for s in ["s1", "s2"] {
        service(&user, s);
    }
    seed.wait_for("s1 and s2 served", WAIT, "ctl", |_| {
        address_of(&user, "s1").is_some() && address_of(&user, "s2").is_some()
    })
    .await;
    // Settled: the demand of g1 is read, and nothing waits.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The whole seed is planned by the first pass of the term, and not again before the
    // resync (300 s): not for demand, nor for a new cluster while demand is read.
    let planned_before = ctl.passes_of("whole").await;
    let growth_before = ctl.passes_of("growth").await;

    // A refused Service: the allocation grows, decided by a growth pass.
    service(&user, "s3");
    seed.wait_for("s3 served", WAIT, "ctl", |_| {
        address_of(&user, "s3").is_some()
    })
    .await;
    assert_eq!(
        seed.held("g1", "metallb"),
        "10.0.0.0-10.0.0.1,10.0.0.2-10.0.0.3"
    );
    let growth_after = ctl.passes_of("growth").await;
    assert!(
        growth_after > growth_before,
        "the growth was decided by a growth pass ({growth_before} before, {growth_after} after)"
    );
    assert_eq!(
        ctl.passes_of("whole").await,
        planned_before,
        "a refused Service planned the whole seed again\n{}",
        seed.log("ctl")
    );

    // While g1's demand is read, a new cluster still takes the short pass, from the
    // allocators the growth left: it gets the next free addresses, none of g1's.
    let new_before = ctl.passes_of("new").await;
    seed.cluster("n1", "dc-1");
    seed.wait_for("n1 allocated", WAIT, "ctl", |s| {
        !s.held("n1", "metallb").is_empty()
    })
    .await;
    assert_eq!(seed.held("n1", "metallb"), "10.0.0.4-10.0.0.5");
    assert!(
        ctl.passes_of("new").await > new_before,
        "n1 was served by a short pass\n{}",
        seed.log("ctl")
    );
    assert_eq!(
        ctl.passes_of("whole").await,
        planned_before,
        "a new cluster planned the whole seed again while demand is read\n{}",
        seed.log("ctl")
    );
    seed.assert_no_overlap_no_leak();
}

/// A user cluster that arrives after the seed was planned is served by a short pass, and its
/// demand is then read and grown by growth passes alone: the short pass's new allocations are
/// held like any other in the kept plan, so the demand reader's first word about that cluster
/// does not take a full pass, which reads the whole seed (at 10,000 clusters × 10 pools a
/// refusal then waited about 2.5 s for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_cluster_served_by_a_short_pass_grows_without_planning_the_seed() {
    let seed = Seed::start("growth-short").await;
    let ctl = seed.controller("ctl");
    seed.apply(POOLS);
    seed.cluster("g0", "dc-1");
    seed.wait_for("g0 allocated", WAIT, "ctl", |s| {
        !s.held("g0", "metallb").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let full_before = full_passes(&ctl).await;
    let new_before = ctl.passes_of("new").await;

    let user = user_cluster().await;
    let _metallb = MetalLb::start(user.clone());
    register(&seed, "g1", "dc-1", &user).await;
    seed.wait_for("the initial pool in the user cluster", WAIT, "ctl", |_| {
        pool_entries(&user) == vec!["10.0.0.2-10.0.0.3".to_string()]
    })
    .await;
    assert!(
        ctl.passes_of("new").await > new_before,
        "g1 was served by a short pass\n{}",
        seed.log("ctl")
    );
    for s in ["s1", "s2", "s3"] {
        service(&user, s);
    }
    seed.wait_for("s1, s2 and s3 served", WAIT, "ctl", |_| {
        ["s1", "s2", "s3"]
            .iter()
            .all(|s| address_of(&user, s).is_some())
    })
    .await;
    assert_eq!(
        seed.held("g1", "metallb"),
        "10.0.0.2-10.0.0.3,10.0.0.4-10.0.0.5"
    );
    assert_eq!(
        full_passes(&ctl).await,
        full_before,
        "reading or growing a cluster the short pass served took a full pass\n{}",
        seed.log("ctl")
    );
    seed.assert_no_overlap_no_leak();
}

/// Passes that read the whole seed: those that planned it all and those that planned a part.
async fn full_passes(ctl: &Controller) -> u64 {
    ctl.passes_of("whole").await + ctl.passes_of("partial").await
}
