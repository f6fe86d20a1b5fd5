//! The pool record commit (`kipam::planning::records`) against the stand-in, in process: the
//! record is kept in shards by address block; an existing shard is patched with only what
//! changes, conditional on its `resourceVersion`; a stale commit is refused by the server and
//! makes kipam read the shard again; a record written before sharding is moved into shards,
//! additions first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::{Api, Patch, PatchParams, PostParams};

use kube_standin::ApiServer;
use serde_json::{Value, json};

use kipam::planning::records::{self, CommitError, RecordKey};
use kipam::reservations::shards;
use kipam::resources::{IPAMPool, IPAMPoolRecord, Reservation};
use kipam::seed::Context;

struct Setup {
    api: ApiServer,
    ctx: Arc<Context>,
    pool: IPAMPool,
    /// A client of somebody else (a newer leader, a human with admin rights).
    other: kube::Client,
}

async fn client(api: &ApiServer) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

async fn setup() -> Setup {
    let api = ApiServer::start().await.unwrap();
    for crd in kipam::resources::crds() {
        api.apply(&serde_json::to_value(&crd).unwrap()).unwrap();
    }
    let client = client(&api).await;
    let pool: IPAMPool = serde_json::from_value(json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
        "metadata": {"name": "metallb"},
        "spec": {"datacenters": {"dc-1": {"type": "range", "poolCidr": "10.0.0.0/16", "allocationRange": 4}}},
    }))
    .unwrap();
    let pool = Api::<IPAMPool>::all(client.clone())
        .create(&PostParams::default(), &pool)
        .await
        .unwrap();
    let ctx = Context::builder(client.clone())
        .complete_ledger(Default::default())
        .build();
    let other = self::client(&api).await;
    Setup {
        api,
        ctx,
        pool,
        other,
    }
}

fn key() -> RecordKey {
    ("metallb".into(), "dc-1".into())
}

fn range(first: u8) -> Reservation {
    Reservation {
        cidr: None,
        addresses: vec![format!("10.0.0.{first}-10.0.0.{}", first + 3)],
    }
}

fn subnet(third: u8) -> Reservation {
    Reservation {
        cidr: Some(format!("10.0.{third}.0/28")),
        addresses: Vec::new(),
    }
}

fn map(entries: &[(&str, Reservation)]) -> BTreeMap<String, Reservation> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// The pool is a /16 of `range` type: its record is divided into blocks of /24, so
/// `10.0.0.x` entries go into the first shard and `subnet(n)` into the shard of `10.0.n.0/24`.
const FIRST: &str = "metallb.dc-1.0a000000-24";

fn shard_of(third: u8) -> String {
    format!("metallb.dc-1.0a00{third:02x}00-24")
}

impl Setup {
    /// A shard as the server stores it.
    fn stored(&self, name: &str) -> Value {
        self.api
            .get("ipampoolrecords", None, name)
            .unwrap_or_else(|| panic!("shard {name} is stored"))
    }

    fn stored_record(&self, name: &str) -> IPAMPoolRecord {
        serde_json::from_value(self.stored(name)).unwrap()
    }

    /// The names of the shards the server stores (not the layout record).
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .api
            .list("ipampoolrecords", None)
            .iter()
            .map(|r| r["metadata"]["name"].as_str().unwrap().to_string())
            .filter(|n| *n != shards::layout_name("metallb", "dc-1"))
            .collect();
        names.sort();
        names
    }

    /// Every cluster's entry as the server stores it, its parts in all shards joined.
    fn stored_entries(&self) -> BTreeMap<String, Reservation> {
        let records: Vec<IPAMPoolRecord> = self
            .api
            .list("ipampoolrecords", None)
            .into_iter()
            .map(|r| serde_json::from_value(r).unwrap())
            .collect();
        let mut parts: BTreeMap<String, Vec<Reservation>> = BTreeMap::new();
        for r in records {
            for (cluster, entry) in r.spec.reservations {
                parts.entry(cluster).or_default().push(entry);
            }
        }
        parts
            .into_iter()
            .map(|(c, p)| (c, shards::join(&p)))
            .collect()
    }

    /// kipam's own copy of the record, its shards joined.
    async fn held(&self) -> IPAMPoolRecord {
        self.ctx.records.lock().await.snapshot()[&key()].clone()
    }

    fn count(&self, verb: &str) -> u64 {
        self.api.stats().count(verb, "ipampoolrecords")
    }

    /// Somebody else adds an entry to the first shard behind kipam's back.
    async fn written_by_somebody_else(&self) {
        Api::<IPAMPoolRecord>::all(self.other.clone())
            .patch(
                FIRST,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"reservations": {
                    "intruder": {"addresses": ["10.0.0.40-10.0.0.43"]}
                }}})),
            )
            .await
            .unwrap();
    }

    /// And once more, on another entry.
    async fn written_by_somebody_else_again(&self) {
        Api::<IPAMPoolRecord>::all(self.other.clone())
            .patch(
                FIRST,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"reservations": {
                    "intruder-2": {"addresses": ["10.0.0.44-10.0.0.47"]}
                }}})),
            )
            .await
            .unwrap();
    }
}

fn conflict(result: Result<u64, CommitError>) {
    match result {
        Err(CommitError::Api(kube::Error::Api(s))) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("expected 409 Conflict, got {other:?}"),
    }
}

/// A plan made on no pools in particular: one replica alone, no pool view to compare.
fn one_view() -> records::PlannedOn {
    records::PlannedOn::default()
}

fn none() -> BTreeSet<String> {
    BTreeSet::new()
}

fn check(clusters: &[&str]) -> BTreeSet<String> {
    clusters.iter().map(|c| c.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shard_is_patched_with_only_its_changes_and_the_record_holds_the_desired_map() {
    let s = setup().await;
    let first = map(&[("a", range(0)), ("b", subnet(1)), ("c", range(8))]);
    let sent = records::commit(&s.ctx, &s.pool, &key(), first.clone(), none(), &one_view())
        .await
        .unwrap();
    // The layout record first (the pool datacenter held nothing), then two shards created
    // empty, the raise of the layout record that confirms them, and their entries.
    assert_eq!((sent, s.count("create")), (6, 3), "{:?}", s.api.stats());
    assert_eq!(s.names(), vec![FIRST.to_string(), shard_of(1)]);
    let layout = s.stored_record(&shards::layout_name("metallb", "dc-1"));
    assert_eq!(layout.spec.block_length, Some(24));
    assert!(layout.spec.reservations.is_empty());
    assert_eq!(s.stored_entries(), first);
    assert_eq!(
        s.stored_record(&shard_of(1)).spec.block.as_deref(),
        Some("10.0.1.0/24")
    );
    s.api.reset_stats();

    // Changed in place (an address range becomes a subnet), moved to another shard, removed,
    // added.
    let desired = map(&[("a", subnet(0)), ("b", range(12)), ("d", range(16))]);
    records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        desired.clone(),
        none(),
        &one_view(),
    )
    .await
    .unwrap();
    assert_eq!(s.count("patch"), 2, "{:?}", s.api.stats());
    assert_eq!(s.count("create") + s.count("update"), 0);
    assert_eq!(s.count("get"), 0, "no re-read after a commit that landed");
    assert_eq!(s.stored_entries(), desired);
    // No field of an entry's old shape survives the merge.
    assert_eq!(
        s.stored(FIRST)["spec"]["reservations"],
        json!({
            "a": {"cidr": "10.0.0.0/28"},
            "b": {"addresses": ["10.0.0.12-10.0.0.15"]},
            "d": {"addresses": ["10.0.0.16-10.0.0.19"]},
        })
    );
    let stored = s.stored_record(FIRST);
    let owners = stored.metadata.owner_references.clone().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, s.pool.metadata.uid.clone().unwrap());
    // kipam's copy is the stored record.
    assert_eq!(s.held().await.spec.reservations, desired);

    // A caller that knows the delta: one entry added, one removed.
    s.api.reset_stats();
    let changes = BTreeMap::from([("e".to_string(), Some(subnet(3))), ("d".to_string(), None)]);
    let sent = records::commit_changes(&s.ctx, &s.pool, &key(), changes, &one_view())
        .await
        .unwrap();
    // e's new shard: created empty, the layout record raised, its entry; d's removal.
    assert_eq!((sent, s.count("patch"), s.count("create")), (4, 3, 1));
    let expected = map(&[("a", subnet(0)), ("b", range(12)), ("e", subnet(3))]);
    assert_eq!(s.stored_entries(), expected);
    assert_eq!(s.held().await.spec.reservations, expected);
    // The joined copy's version names every shard's version, and the layout record's.
    let versions: Vec<String> = s
        .names()
        .iter()
        .map(|n| s.stored_record(n).metadata.resource_version.unwrap())
        .collect();
    let layout = s.stored_record(&shards::layout_name("metallb", "dc-1"));
    assert_eq!(
        s.held().await.metadata.resource_version,
        Some(format!(
            "{};layout={}",
            versions.join(","),
            layout.metadata.resource_version.unwrap()
        ))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checked_shard_gets_a_write_that_changes_nothing_and_a_stale_one_is_refused_and_reread() {
    let s = setup().await;
    let entries = map(&[("a", range(0)), ("b", subnet(4))]);
    records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        entries.clone(),
        none(),
        &one_view(),
    )
    .await
    .unwrap();
    let version = s.stored_record(FIRST).metadata.resource_version;
    s.api.reset_stats();

    // Nothing changes and nothing is checked: nothing is sent.
    let sent = records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        entries.clone(),
        none(),
        &one_view(),
    )
    .await
    .unwrap();
    assert_eq!((sent, s.api.stats().writes()), (0, 0));
    // An object of "a" is about to be written: its shard gets one conditional write; the
    // server keeps the version.
    let sent = records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        entries.clone(),
        check(&["a"]),
        &one_view(),
    )
    .await
    .unwrap();
    assert_eq!((sent, s.count("patch")), (1, 1), "{:?}", s.api.stats());
    assert_eq!(s.stored_record(FIRST).metadata.resource_version, version);

    // Somebody else writes the shard: kipam's copy is stale. The same check is now refused,
    // and kipam reads the shard again.
    s.written_by_somebody_else().await;
    let before = s.stored(FIRST);
    s.api.reset_stats();
    conflict(
        records::commit(
            &s.ctx,
            &s.pool,
            &key(),
            entries.clone(),
            check(&["a"]),
            &one_view(),
        )
        .await,
    );
    assert_eq!(s.count("patch"), 1);
    assert_eq!(s.count("get"), 1, "the shard is read again");
    assert_eq!(s.stored(FIRST), before, "a refused commit changes nothing");
    let held = s.held().await;
    assert!(held.spec.reservations.contains_key("intruder"));
    assert_eq!(s.stored_entries(), held.spec.reservations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_commit_of_new_entries_leaves_the_record_unchanged_and_the_next_one_lands() {
    let s = setup().await;
    records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        map(&[("a", range(0))]),
        none(),
        &one_view(),
    )
    .await
    .unwrap();
    s.written_by_somebody_else().await;
    let before = s.stored(FIRST);
    s.api.reset_stats();

    // Planned on the old version, "b" would get what "intruder" now holds: refused, whether
    // the caller passes the whole map or only the delta.
    let planned = BTreeMap::from([("b".to_string(), Some(range(40)))]);
    conflict(records::commit_changes(&s.ctx, &s.pool, &key(), planned, &one_view()).await);
    assert_eq!(s.count("patch"), 1, "{:?}", s.api.stats());
    assert_eq!(s.count("get"), 1, "the shard is read again");
    assert_eq!(s.stored(FIRST), before, "a refused commit changes nothing");
    s.written_by_somebody_else_again().await;
    let before = s.stored(FIRST);
    s.api.reset_stats();
    conflict(
        records::commit(
            &s.ctx,
            &s.pool,
            &key(),
            map(&[("a", range(0)), ("b", range(40))]),
            none(),
            &one_view(),
        )
        .await,
    );
    assert_eq!(s.count("patch"), 1);
    assert_eq!(s.count("get"), 1);
    assert_eq!(s.stored(FIRST), before, "a refused commit changes nothing");

    // On the copy read again, the commit lands: the record holds exactly the desired map.
    let desired = map(&[("a", range(0)), ("b", range(48))]);
    records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        desired.clone(),
        none(),
        &one_view(),
    )
    .await
    .unwrap();
    assert_eq!(s.stored_entries(), desired);
    assert_eq!(s.held().await.spec.reservations, desired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holding_across_a_block_edge_is_written_to_both_shards_and_read_back_whole() {
    let s = setup().await;
    let across = Reservation {
        cidr: None,
        addresses: vec!["10.0.0.254-10.0.1.1".into()],
    };
    let sent = records::commit_changes(
        &s.ctx,
        &s.pool,
        &key(),
        BTreeMap::from([("a".to_string(), Some(across.clone()))]),
        &one_view(),
    )
    .await
    .unwrap();
    assert_eq!(
        sent, 6,
        "the layout record, two shards created empty, the layout record raised, two fills"
    );
    assert_eq!(
        s.stored(FIRST)["spec"]["reservations"]["a"],
        json!({"addresses": ["10.0.0.254-10.0.0.255"]})
    );
    assert_eq!(
        s.stored(&shard_of(1))["spec"]["reservations"]["a"],
        json!({"addresses": ["10.0.1.0-10.0.1.1"]})
    );
    assert_eq!(s.held().await.spec.reservations["a"], across);
    assert_eq!(s.stored_entries()["a"], across);
    // Released: gone from both.
    records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        BTreeMap::new(),
        none(),
        &one_view(),
    )
    .await
    .unwrap();
    assert!(s.stored_entries().is_empty());
    assert!(s.held().await.spec.reservations.is_empty());
}

/// A record written before sharding (`<pool>.<datacenter>`, no block) is moved into shards by
/// the next commit: the shards are written first, and the old record is deleted only once
/// they all landed, so the addresses are recorded at every moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_written_before_sharding_is_moved_into_shards_additions_first() {
    let s = setup().await;
    let legacy = map(&[("a", range(0)), ("b", subnet(1))]);
    Api::<IPAMPoolRecord>::all(s.other.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPoolRecord",
                "metadata": {"name": "metallb.dc-1"},
                "spec": {"pool": "metallb", "datacenter": "dc-1", "reservations": legacy},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let listed = Api::<IPAMPoolRecord>::all(s.other.clone())
        .list(&Default::default())
        .await
        .unwrap();
    s.ctx.records.lock().await.reset(listed.items);
    assert_eq!(s.held().await.spec.reservations, legacy);

    // The first shard cannot be written: the commit stops before removing anything.
    let desired = map(&[("a", range(0)), ("b", subnet(1)), ("c", range(4))]);
    s.api.inject_failures("create", "ipampoolrecords", 1, 500);
    assert!(
        records::commit(
            &s.ctx,
            &s.pool,
            &key(),
            desired.clone(),
            none(),
            &one_view()
        )
        .await
        .is_err()
    );
    assert_eq!(
        s.count("delete") + s.count("patch"),
        0,
        "{:?}",
        s.api.stats()
    );
    assert_eq!(
        s.stored_record("metallb.dc-1").spec.reservations,
        legacy,
        "the old record keeps every entry while a shard is missing"
    );

    // The next commit lands: two shards, the old record gone.
    records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        desired.clone(),
        none(),
        &one_view(),
    )
    .await
    .unwrap();
    assert_eq!(s.names(), vec![FIRST.to_string(), shard_of(1)]);
    assert_eq!(s.stored_entries(), desired);
    assert_eq!(s.held().await.spec.reservations, desired);
    assert_eq!(s.count("delete"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pool_uid_is_written_into_the_owner_reference() {
    let s = setup().await;
    records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        map(&[("a", range(0))]),
        none(),
        &one_view(),
    )
    .await
    .unwrap();
    let mut recreated = s.pool.clone();
    recreated.metadata.uid = Some("uid-of-the-pool-created-again".into());
    records::commit(
        &s.ctx,
        &recreated,
        &key(),
        map(&[("a", range(0))]),
        check(&["a"]),
        &one_view(),
    )
    .await
    .unwrap();
    let stored = s.stored_record(FIRST);
    let owners = stored.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, "uid-of-the-pool-created-again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_keeps_its_pool_datacenter_and_block() {
    let s = setup().await;
    records::commit(
        &s.ctx,
        &s.pool,
        &key(),
        map(&[("a", range(0))]),
        none(),
        &one_view(),
    )
    .await
    .unwrap();
    let shards = Api::<IPAMPoolRecord>::all(s.other.clone());
    for (patch, message) in [
        (
            json!({"spec": {"block": "10.0.1.0/24"}}),
            "block is immutable",
        ),
        (json!({"spec": {"block": null}}), "block is immutable"),
        (json!({"spec": {"pool": "other"}}), "pool is immutable"),
        (
            json!({"spec": {"datacenter": "dc-2"}}),
            "datacenter is immutable",
        ),
    ] {
        match shards
            .patch(FIRST, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{patch}: {e:?}");
                assert!(e.message.contains(message), "{patch}: {}", e.message);
            }
            other => panic!("{patch}: expected 422, got {other:?}"),
        }
    }
    assert_eq!(
        s.stored_record(FIRST).spec.block.as_deref(),
        Some("10.0.0.0/24")
    );
    // The layout record's block length is fixed as well: every replica divides by it.
    let layout = shards::layout_name("metallb", "dc-1");
    for patch in [
        json!({"spec": {"blockLength": 25}}),
        json!({"spec": {"blockLength": null}}),
    ] {
        match shards
            .patch(&layout, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{patch}: {e:?}");
                assert!(
                    e.message.contains("blockLength is immutable"),
                    "{}",
                    e.message
                );
            }
            other => panic!("{patch}: expected 422, got {other:?}"),
        }
    }
    assert_eq!(s.stored_record(&layout).spec.block_length, Some(24));
}
