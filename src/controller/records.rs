//! The leader's copy of the `IPAMPoolRecord`s and the compare-and-swap that commits them.
//!
//! Loaded from a fresh (quorum) LIST at every gain of leadership, then kept from this
//! replica's own write responses. Every commit carries the `resourceVersion` it was planned
//! from, so the API server refuses it (409) when anybody wrote the record since — in
//! particular a newer leader. Even a commit that changes nothing is sent before new objects
//! are written: an update with a stale `resourceVersion` fails before the server compares
//! contents, so it doubles as a check that this replica still writes on the latest record.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Resource, ResourceExt};

use super::Context;
use crate::resources::{
    IPAMPool, IPAMPoolRecord, IPAMPoolRecordSpec, MAX_RECORD_BYTES, Reservation, record_name,
};

/// (pool, datacenter).
pub type RecordKey = (String, String);

#[derive(Debug, Default)]
pub struct Records {
    map: BTreeMap<RecordKey, IPAMPoolRecord>,
}

impl Records {
    pub fn reset(&mut self, items: Vec<IPAMPoolRecord>) {
        self.map = items
            .into_iter()
            .map(|r| ((r.spec.pool.clone(), r.spec.datacenter.clone()), r))
            .collect();
    }

    pub fn snapshot(&self) -> BTreeMap<RecordKey, IPAMPoolRecord> {
        self.map.clone()
    }

    /// Whether any record holds an entry for `cluster`.
    pub fn holds(&self, cluster: &str) -> bool {
        self.map
            .values()
            .any(|r| r.spec.reservations.contains_key(cluster))
    }

    fn put(&mut self, r: IPAMPoolRecord) {
        self.map
            .insert((r.spec.pool.clone(), r.spec.datacenter.clone()), r);
    }

    fn forget(&mut self, key: &RecordKey) {
        self.map.remove(key);
    }
}

/// Why a commit did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("record {0} would exceed {MAX_RECORD_BYTES} bytes: no new allocation fits in it")]
    TooLarge(String),
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Writes the record of `key` so that it holds exactly `reservations`, conditional on the
/// version this replica last saw. On a conflict the record is re-read for the next pass.
pub async fn commit(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    reservations: BTreeMap<String, Reservation>,
) -> Result<(), CommitError> {
    // RBAC: src/rbac.rs (ipampoolrecords).
    let api: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    let name = record_name(&key.0, &key.1);
    let current = ctx.records.lock().await.map.get(key).cloned();
    let mut record = current.clone().unwrap_or_else(|| IPAMPoolRecord {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: IPAMPoolRecordSpec {
            pool: key.0.clone(),
            datacenter: key.1.clone(),
            reservations: BTreeMap::new(),
        },
    });
    record.spec.reservations = reservations;
    // Owned by the pool: deleting the pool removes its records (allocations a `Retain` pool
    // leaves behind are still reserved by their objects, and the records are rebuilt from them).
    record.metadata.owner_references = Some(vec![OwnerReference {
        api_version: IPAMPool::api_version(&()).into_owned(),
        kind: IPAMPool::kind(&()).into_owned(),
        name: pool.name_any(),
        uid: pool.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let size = serde_json::to_vec(&record).map(|v| v.len()).unwrap_or(0);
    if size > MAX_RECORD_BYTES {
        return Err(CommitError::TooLarge(name));
    }
    let pp = PostParams {
        field_manager: Some("kipam".into()),
        ..Default::default()
    };
    let result = match &current {
        None => {
            ctx.metrics.wrote("create", "ipampoolrecords");
            api.create(&pp, &record).await
        }
        Some(_) => {
            ctx.metrics.wrote("update", "ipampoolrecords");
            api.replace(&name, &pp, &record).await
        }
    };
    match result {
        Ok(written) => {
            ctx.records.lock().await.put(written);
            Ok(())
        }
        Err(e) => {
            if matches!(&e, kube::Error::Api(s) if s.code == 409 || s.code == 404) {
                refresh(ctx, key).await;
            }
            Err(CommitError::Api(e))
        }
    }
}

/// Commits `changes` (cluster -> its new entry, or `None` to drop it) on top of the record
/// as this replica last saw it; see [`commit`].
pub async fn commit_changes(
    ctx: &Context,
    pool: &IPAMPool,
    key: &RecordKey,
    changes: BTreeMap<String, Option<Reservation>>,
) -> Result<(), CommitError> {
    let mut reservations = ctx
        .records
        .lock()
        .await
        .map
        .get(key)
        .map(|r| r.spec.reservations.clone())
        .unwrap_or_default();
    for (cluster, entry) in changes {
        match entry {
            Some(e) => reservations.insert(cluster, e),
            None => reservations.remove(&cluster),
        };
    }
    commit(ctx, pool, key, reservations).await
}

/// Deletes the record of a datacenter the pool no longer has, once no object is left there.
pub async fn remove(ctx: &Context, key: &RecordKey) -> Result<(), kube::Error> {
    let Some(current) = ctx.records.lock().await.map.get(key).cloned() else {
        return Ok(());
    };
    let api: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: current.resource_version(),
            uid: current.uid(),
        }),
        ..Default::default()
    };
    ctx.metrics.wrote("delete", "ipampoolrecords");
    match api.delete(&current.name_any(), &dp).await {
        Ok(_) => {
            ctx.records.lock().await.forget(key);
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            ctx.records.lock().await.forget(key);
            Ok(())
        }
        Err(e) => {
            refresh(ctx, key).await;
            Err(e)
        }
    }
}

/// Re-reads one record (after a conflict).
async fn refresh(ctx: &Context, key: &RecordKey) {
    let api: Api<IPAMPoolRecord> = Api::all(ctx.writer.clone());
    match api.get_opt(&record_name(&key.0, &key.1)).await {
        Ok(Some(r)) => ctx.records.lock().await.put(r),
        Ok(None) => ctx.records.lock().await.forget(key),
        Err(e) => {
            tracing::warn!(error = %e, pool = %key.0, datacenter = %key.1, "cannot re-read the pool record")
        }
    }
}
