//! The pool record commit (`kipam::controller::records`) against the stand-in, in process: an
//! existing record is patched with only what changes, conditional on its `resourceVersion`,
//! and a stale commit is refused by the server and makes kipam read the record again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube_standin::ApiServer;
use serde_json::{Value, json};

use kipam::controller::records::{self, CommitError, RecordKey};
use kipam::controller::{Context, backoff, leader, ledger, metrics};
use kipam::resources::{IPAMPool, IPAMPoolRecord, Reservation};

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
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "kipam".into(),
                instance: None,
            },
        ),
        metrics: metrics::Metrics::new(),
        leader: leader::LeaderState::new(Duration::from_secs(10)),
    });
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

impl Setup {
    /// The record as the server stores it.
    fn stored(&self) -> Value {
        self.api
            .get("ipampoolrecords", None, "metallb.dc-1")
            .expect("the record is stored")
    }

    fn stored_record(&self) -> IPAMPoolRecord {
        serde_json::from_value(self.stored()).unwrap()
    }

    /// kipam's own copy of the record.
    async fn held(&self) -> IPAMPoolRecord {
        self.ctx.records.lock().await.snapshot()[&key()].clone()
    }

    fn count(&self, verb: &str) -> u64 {
        self.api.stats().count(verb, "ipampoolrecords")
    }

    /// Somebody else adds an entry to the record behind kipam's back.
    async fn written_by_somebody_else(&self) {
        Api::<IPAMPoolRecord>::all(self.other.clone())
            .patch(
                "metallb.dc-1",
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
                "metallb.dc-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"reservations": {
                    "intruder-2": {"addresses": ["10.0.0.44-10.0.0.47"]}
                }}})),
            )
            .await
            .unwrap();
    }
}

fn conflict(result: Result<(), CommitError>) {
    match result {
        Err(CommitError::Api(kube::Error::Api(s))) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("expected 409 Conflict, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_record_is_patched_with_only_its_changes_and_holds_the_desired_map() {
    let s = setup().await;
    let first = map(&[("a", range(0)), ("b", subnet(1)), ("c", range(8))]);
    records::commit(&s.ctx, &s.pool, &key(), first.clone())
        .await
        .unwrap();
    assert_eq!(s.count("create"), 1);
    assert_eq!(s.stored_record().spec.reservations, first);
    s.api.reset_stats();

    // Changed (an address range becomes a subnet and back), removed, added.
    let desired = map(&[("a", subnet(2)), ("b", range(12)), ("d", range(16))]);
    records::commit(&s.ctx, &s.pool, &key(), desired.clone())
        .await
        .unwrap();
    assert_eq!(s.count("patch"), 1, "{:?}", s.api.stats());
    assert_eq!(s.count("update"), 0);
    assert_eq!(s.count("get"), 0, "no re-read after a commit that landed");
    let stored = s.stored_record();
    assert_eq!(stored.spec.reservations, desired);
    // No field of an entry's old shape survives the merge.
    assert_eq!(
        s.stored()["spec"]["reservations"],
        json!({
            "a": {"cidr": "10.0.2.0/28"},
            "b": {"addresses": ["10.0.0.12-10.0.0.15"]},
            "d": {"addresses": ["10.0.0.16-10.0.0.19"]},
        })
    );
    let owners = stored.metadata.owner_references.clone().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, s.pool.metadata.uid.clone().unwrap());
    // kipam's copy is the stored record, version included.
    let held = s.held().await;
    assert_eq!(held.spec, stored.spec);
    assert_eq!(
        held.metadata.resource_version,
        stored.metadata.resource_version
    );

    // A caller that knows the delta: one entry added, one removed.
    s.api.reset_stats();
    let changes = BTreeMap::from([("e".to_string(), Some(subnet(3))), ("d".to_string(), None)]);
    records::commit_changes(&s.ctx, &s.pool, &key(), changes)
        .await
        .unwrap();
    assert_eq!(s.count("patch"), 1);
    let expected = map(&[("a", subnet(2)), ("b", range(12)), ("e", subnet(3))]);
    assert_eq!(s.stored_record().spec.reservations, expected);
    assert_eq!(s.held().await.spec.reservations, expected);
    assert_eq!(
        s.held().await.metadata.resource_version,
        s.stored_record().metadata.resource_version
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_changes_nothing_is_sent_and_a_stale_one_is_refused_and_reread() {
    let s = setup().await;
    let entries = map(&[("a", range(0)), ("b", range(4))]);
    records::commit(&s.ctx, &s.pool, &key(), entries.clone())
        .await
        .unwrap();
    let version = s.stored_record().metadata.resource_version;
    s.api.reset_stats();

    // Nothing changes: still one conditional write; the server keeps the version.
    records::commit(&s.ctx, &s.pool, &key(), entries.clone())
        .await
        .unwrap();
    assert_eq!(s.count("patch"), 1, "{:?}", s.api.stats());
    assert_eq!(s.count("update"), 0);
    assert_eq!(s.stored_record().metadata.resource_version, version);
    assert_eq!(s.held().await.metadata.resource_version, version);

    // Somebody else writes the record: kipam's copy is stale. The same no-op commit is now
    // refused, and kipam reads the record again.
    s.written_by_somebody_else().await;
    let before = s.stored();
    s.api.reset_stats();
    conflict(records::commit(&s.ctx, &s.pool, &key(), entries.clone()).await);
    assert_eq!(s.count("patch"), 1);
    assert_eq!(s.count("get"), 1, "the record is read again");
    assert_eq!(s.stored(), before, "a refused commit changes nothing");
    let held = s.held().await;
    let stored = s.stored_record();
    assert_eq!(held.spec, stored.spec);
    assert_eq!(
        held.metadata.resource_version,
        stored.metadata.resource_version
    );
    assert!(held.spec.reservations.contains_key("intruder"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_commit_of_new_entries_leaves_the_record_unchanged_and_the_next_one_lands() {
    let s = setup().await;
    records::commit(&s.ctx, &s.pool, &key(), map(&[("a", range(0))]))
        .await
        .unwrap();
    s.written_by_somebody_else().await;
    let before = s.stored();
    s.api.reset_stats();

    // Planned on the old version, "b" would get what "intruder" now holds: refused, whether
    // the caller passes the whole map or only the delta.
    let planned = BTreeMap::from([("b".to_string(), Some(range(40)))]);
    conflict(records::commit_changes(&s.ctx, &s.pool, &key(), planned).await);
    assert_eq!(s.count("patch"), 1, "{:?}", s.api.stats());
    assert_eq!(s.count("get"), 1, "the record is read again");
    assert_eq!(s.stored(), before, "a refused commit changes nothing");
    s.written_by_somebody_else_again().await;
    let before = s.stored();
    s.api.reset_stats();
    conflict(
        records::commit(
            &s.ctx,
            &s.pool,
            &key(),
            map(&[("a", range(0)), ("b", range(40))]),
        )
        .await,
    );
    assert_eq!(s.count("patch"), 1);
    assert_eq!(s.count("get"), 1);
    assert_eq!(s.stored(), before, "a refused commit changes nothing");

    // On the copy read again, the commit lands: the record holds exactly the desired map.
    let desired = map(&[("a", range(0)), ("b", range(48))]);
    records::commit(&s.ctx, &s.pool, &key(), desired.clone())
        .await
        .unwrap();
    assert_eq!(s.stored_record().spec.reservations, desired);
    assert_eq!(s.held().await.spec.reservations, desired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pool_uid_is_written_into_the_owner_reference() {
    let s = setup().await;
    records::commit(&s.ctx, &s.pool, &key(), map(&[("a", range(0))]))
        .await
        .unwrap();
    let mut recreated = s.pool.clone();
    recreated.metadata.uid = Some("uid-of-the-pool-created-again".into());
    records::commit(&s.ctx, &recreated, &key(), map(&[("a", range(0))]))
        .await
        .unwrap();
    let stored = s.stored_record();
    let owners = stored.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, "uid-of-the-pool-created-again");
    assert_eq!(
        s.held().await.metadata.owner_references.unwrap()[0].uid,
        "uid-of-the-pool-created-again"
    );
}
