//! One stored `IPAMAllocation`, held compactly.
//!
//! A seed with 10,000 clusters and 10 pools holds 100,000 allocations. Kept as whole objects
//! they cost about 1.8 KB each, most of it metadata every allocation repeats: the three labels
//! kipam sets (which only say again the pool, the cluster and the datacenter the object already
//! names), the reclaim-policy annotation, and the room `ObjectMeta` keeps for fields nobody sets.
//! An [`Entry`] keeps what varies and remembers the standard parts by a flag, so it costs a few
//! hundred bytes; the namespace and the pool name are shared with the ledger's indexes.
//!
//! Nothing is lost: [`Entry::to_object`] gives back exactly the object that was stored (less its
//! `managedFields`, which the ledger never kept). Labels or annotations that are not exactly
//! kipam's standard ones, and any other metadata, are kept as they came.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::allocator::Allocation;
use crate::resources::{
    ANNOTATION_RECLAIM_POLICY, AllocationPhase, IPAMAllocation, IPAMAllocationSpec,
    IPAMAllocationStatus, LABEL_CLUSTER, LABEL_DATACENTER, LABEL_POOL, ReclaimPolicy,
    cluster_of_namespace,
};
use crate::validation;

/// One allocation as the ledger holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    namespace: Arc<str>,
    name: Arc<str>,
    /// `metadata.resourceVersion` as a number, when it is one written the usual way (else the
    /// text is kept in `rest` and this is `None`).
    version: Option<u64>,
    uid: Option<Box<str>>,
    created: Option<Time>,
    generation: Option<i64>,
    /// The labels are exactly kipam's three, with the values this object implies.
    standard_labels: bool,
    /// The annotations are exactly kipam's reclaim-policy one, with this value.
    policy: Option<ReclaimPolicy>,
    spec: IPAMAllocationSpec,
    status: Option<Box<IPAMAllocationStatus>>,
    /// Every other piece of metadata, when there is any.
    rest: Option<Box<ObjectMeta>>,
    /// What the planner read of it, once read (an entry never changes: another version of
    /// the object is another entry).
    reading: OnceLock<Reading>,
}

/// What the planner reads of a readable allocation beyond its names and datacenter: what it
/// holds and the reclaim policy recorded on it.
pub type Reading = (Option<Allocation>, Option<ReclaimPolicy>);

fn policy_of(text: &str) -> Option<ReclaimPolicy> {
    [ReclaimPolicy::Delete, ReclaimPolicy::Retain]
        .into_iter()
        .find(|p| p.as_str() == text)
}

fn is_empty(meta: &ObjectMeta) -> bool {
    *meta == ObjectMeta::default()
}

impl Entry {
    /// Holds `obj`, sharing `namespace` and `name` (which must be the object's own, as the
    /// ledger's indexes hold them).
    pub fn new(obj: IPAMAllocation, namespace: Arc<str>, name: Arc<str>) -> Entry {
        let IPAMAllocation {
            mut metadata,
            spec,
            status,
        } = obj;
        metadata.managed_fields = None;
        if metadata.name.as_deref() == Some(&*name) {
            metadata.name = None;
        }
        if metadata.namespace.as_deref() == Some(&*namespace) {
            metadata.namespace = None;
        }
        let version = match metadata.resource_version.as_deref() {
            Some(text) => match text.parse::<u64>() {
                Ok(v) if v.to_string() == text => {
                    metadata.resource_version = None;
                    Some(v)
                }
                _ => None,
            },
            None => None,
        };
        let uid = metadata.uid.take().map(String::into_boxed_str);
        let created = metadata.creation_timestamp.take();
        let generation = metadata.generation.take();
        let standard_labels = metadata.labels.as_ref().is_some_and(|labels| {
            labels.len() == 3
                && labels.get(LABEL_POOL).map(String::as_str) == Some(&*name)
                && labels.get(LABEL_CLUSTER).map(String::as_str) == cluster_of_namespace(&namespace)
                && labels.get(LABEL_DATACENTER) == Some(&spec.dc)
        });
        if standard_labels {
            metadata.labels = None;
        }
        let policy = metadata.annotations.as_ref().and_then(|a| {
            if a.len() == 1 {
                a.get(ANNOTATION_RECLAIM_POLICY).and_then(|v| policy_of(v))
            } else {
                None
            }
        });
        if policy.is_some() {
            metadata.annotations = None;
        }
        Entry {
            namespace,
            name,
            version,
            uid,
            created,
            generation,
            standard_labels,
            policy,
            spec,
            status: status.map(Box::new),
            rest: (!is_empty(&metadata)).then(|| Box::new(metadata)),
            reading: OnceLock::new(),
        }
    }

    /// The whole object again, as it was stored.
    pub fn to_object(&self) -> IPAMAllocation {
        let mut metadata = self.rest.as_deref().cloned().unwrap_or_default();
        if metadata.name.is_none() && !self.name.is_empty() {
            metadata.name = Some(self.name.to_string());
        }
        if metadata.namespace.is_none() && !self.namespace.is_empty() {
            metadata.namespace = Some(self.namespace.to_string());
        }
        if let Some(v) = self.version {
            metadata.resource_version = Some(v.to_string());
        }
        metadata.uid = self.uid.as_deref().map(str::to_string);
        metadata.creation_timestamp = self.created.clone();
        metadata.generation = self.generation;
        if self.standard_labels {
            metadata.labels = Some(BTreeMap::from([
                (LABEL_POOL.to_string(), self.name.to_string()),
                (
                    LABEL_CLUSTER.to_string(),
                    self.cluster().unwrap_or_default().to_string(),
                ),
                (LABEL_DATACENTER.to_string(), self.spec.dc.clone()),
            ]));
        }
        if let Some(policy) = self.policy {
            metadata.annotations = Some(BTreeMap::from([(
                ANNOTATION_RECLAIM_POLICY.to_string(),
                policy.as_str().to_string(),
            )]));
        }
        IPAMAllocation {
            metadata,
            spec: self.spec.clone(),
            status: self.status.as_deref().cloned(),
        }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(super) fn namespace_shared(&self) -> &Arc<str> {
        &self.namespace
    }

    pub(super) fn name_shared(&self) -> &Arc<str> {
        &self.name
    }

    /// The object's name: the pool's.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cluster whose namespace holds it.
    pub fn cluster(&self) -> Option<&str> {
        cluster_of_namespace(&self.namespace)
    }

    /// `metadata.resourceVersion` as a number (`None` when it is not one).
    pub fn version(&self) -> Option<u64> {
        self.version.or_else(|| {
            self.rest
                .as_ref()?
                .resource_version
                .as_deref()?
                .parse()
                .ok()
        })
    }

    /// `metadata.resourceVersion`, for preconditions.
    pub fn resource_version(&self) -> Option<String> {
        match self.version {
            Some(v) => Some(v.to_string()),
            None => self.rest.as_ref()?.resource_version.clone(),
        }
    }

    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    pub fn spec(&self) -> &IPAMAllocationSpec {
        &self.spec
    }

    pub fn status(&self) -> Option<&IPAMAllocationStatus> {
        self.status.as_deref()
    }

    pub fn deleting(&self) -> bool {
        self.rest
            .as_ref()
            .is_some_and(|m| m.deletion_timestamp.is_some())
    }

    /// One label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        if self.standard_labels {
            return match key {
                LABEL_POOL => Some(self.name()),
                LABEL_CLUSTER => self.cluster(),
                LABEL_DATACENTER => Some(&self.spec.dc),
                _ => None,
            };
        }
        self.rest
            .as_ref()?
            .labels
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }

    /// One annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        if let Some(policy) = self.policy {
            return (key == ANNOTATION_RECLAIM_POLICY).then_some(policy.as_str());
        }
        self.rest
            .as_ref()?
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }

    /// See [`IPAMAllocation::phase`].
    pub fn phase(&self) -> AllocationPhase {
        crate::resources::allocation_phase(&self.spec, self.status())
    }

    /// What [`validation::stored_allocation_of`] reads of it.
    pub fn parts(&self) -> validation::AllocationParts<'_> {
        validation::AllocationParts {
            namespace: self.namespace(),
            name: self.name(),
            spec: self.spec(),
            status: self.status(),
            reclaim_policy: self.annotation(ANNOTATION_RECLAIM_POLICY),
        }
    }

    /// Its reading, made by `read` the first time (and again each time while `read` fails).
    pub fn reading<E>(&self, read: impl FnOnce() -> Result<Reading, E>) -> Result<&Reading, E> {
        if let Some(r) = self.reading.get() {
            return Ok(r);
        }
        let r = read()?;
        Ok(self.reading.get_or_init(|| r))
    }

    /// What the planner reads of it is the same in both (the version aside).
    pub fn same_content(&self, other: &Entry) -> bool {
        self.spec == other.spec
            && self.status == other.status
            && self.standard_labels == other.standard_labels
            && self.policy == other.policy
            && self.uid == other.uid
            && self.rest.as_ref().map(|m| {
                (
                    &m.labels,
                    &m.annotations,
                    &m.deletion_timestamp,
                    &m.finalizers,
                )
            }) == other.rest.as_ref().map(|m| {
                (
                    &m.labels,
                    &m.annotations,
                    &m.deletion_timestamp,
                    &m.finalizers,
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::AllocationType;

    fn typical() -> IPAMAllocation {
        let mut o = IPAMAllocation::new(
            "metallb",
            IPAMAllocationSpec {
                type_: AllocationType::Range,
                dc: "dc1".into(),
                cidr: None,
                addresses: vec!["10.0.0.0-10.0.0.7".into()],
            },
        );
        o.metadata.namespace = Some("cluster-a".into());
        o.metadata.resource_version = Some("42".into());
        o.metadata.uid = Some("0b8f1f5e-6a8c-4d6e-9d59-8e8f6c1b2a3d".into());
        o.metadata.generation = Some(1);
        o.metadata.creation_timestamp = Some(Time(Default::default()));
        o.metadata.labels = Some(BTreeMap::from([
            (LABEL_POOL.into(), "metallb".into()),
            (LABEL_CLUSTER.into(), "a".into()),
            (LABEL_DATACENTER.into(), "dc1".into()),
        ]));
        o.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_RECLAIM_POLICY.into(),
            "Retain".into(),
        )]));
        o
    }

    /// The two objects are the same in every field (the type does not implement `PartialEq`).
    fn assert_same(a: &IPAMAllocation, b: &IPAMAllocation) {
        assert_eq!(
            serde_json::to_value(a).expect("serialises"),
            serde_json::to_value(b).expect("serialises")
        );
    }

    fn entry(o: IPAMAllocation) -> Entry {
        let ns: Arc<str> = o.metadata.namespace.as_deref().unwrap_or_default().into();
        let name: Arc<str> = o.metadata.name.as_deref().unwrap_or_default().into();
        Entry::new(o, ns, name)
    }

    #[test]
    fn a_typical_allocation_keeps_no_loose_metadata_and_comes_back_whole() {
        let o = typical();
        let e = entry(o.clone());
        assert!(e.rest.is_none(), "{:?}", e.rest);
        assert!(e.standard_labels);
        assert_eq!(e.policy, Some(ReclaimPolicy::Retain));
        assert_same(&e.to_object(), &o);
        assert_eq!(e.label(LABEL_CLUSTER), Some("a"));
        assert_eq!(e.annotation(ANNOTATION_RECLAIM_POLICY), Some("Retain"));
        assert_eq!(e.version(), Some(42));
    }

    #[test]
    fn anything_unusual_is_kept_as_it_came() {
        let mut o = typical();
        // A label that disagrees with the spec, one more label, one more annotation, a
        // version that is not a plain number, a finalizer and a deletion time.
        o.metadata
            .labels
            .as_mut()
            .map(|l| l.insert(LABEL_DATACENTER.into(), "dc2".into()));
        o.metadata
            .labels
            .as_mut()
            .map(|l| l.insert("team".into(), "blue".into()));
        o.metadata
            .annotations
            .as_mut()
            .map(|a| a.insert("note".into(), "hand-edited".into()));
        o.metadata.resource_version = Some("0042".into());
        o.metadata.finalizers = Some(vec!["example.com/hold".into()]);
        o.metadata.deletion_timestamp = Some(Time(Default::default()));
        o.status = Some(IPAMAllocationStatus {
            phase: Some(AllocationPhase::Conflict),
            message: Some("overlaps".into()),
            ..Default::default()
        });
        let e = entry(o.clone());
        assert_same(&e.to_object(), &o);
        assert!(!e.standard_labels && e.policy.is_none());
        assert_eq!(e.label(LABEL_DATACENTER), Some("dc2"));
        assert_eq!(e.annotation("note"), Some("hand-edited"));
        assert_eq!(e.version(), Some(42));
        assert_eq!(e.resource_version().as_deref(), Some("0042"));
        assert!(e.deleting());
        assert_eq!(e.phase(), AllocationPhase::Conflict);

        // An unknown policy value is kept as text, not read as a policy.
        let mut odd = typical();
        odd.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_RECLAIM_POLICY.into(),
            "Keep".into(),
        )]));
        let e = entry(odd.clone());
        assert_eq!(e.policy, None);
        assert_same(&e.to_object(), &odd);
        assert_eq!(e.annotation(ANNOTATION_RECLAIM_POLICY), Some("Keep"));

        // Labels that miss one of kipam's are not completed on the way back.
        let mut partial = typical();
        partial
            .metadata
            .labels
            .as_mut()
            .map(|l| l.remove(LABEL_CLUSTER));
        assert_same(&entry(partial.clone()).to_object(), &partial);
    }

    #[test]
    fn same_content_ignores_the_version_only() {
        let a = entry(typical());
        let mut newer = typical();
        newer.metadata.resource_version = Some("43".into());
        assert!(a.same_content(&entry(newer.clone())));
        newer.spec.addresses.push("10.0.0.9-10.0.0.9".into());
        assert!(!a.same_content(&entry(newer)));
        let mut relabelled = typical();
        relabelled
            .metadata
            .labels
            .as_mut()
            .map(|l| l.insert("team".into(), "blue".into()));
        assert!(!a.same_content(&entry(relabelled)));
    }
}
