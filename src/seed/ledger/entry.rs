//! One stored `IPAMAllocation`, held compactly.
//!
//! A seed with 10,000 clusters and 10 pools holds 100,000 allocations. Kept as whole objects
//! they cost about 1.8 KB each, most of it metadata every allocation repeats: the three labels
//! kipam sets (which only say again the pool, the cluster and the datacenter the object already
//! names), the phase label and the address annotation (which say again what the spec and status
//! say), the reclaim-policy annotation, and the room `ObjectMeta` keeps for fields nobody sets.
//! An [`Entry`] keeps what varies and remembers the standard parts by a flag, so it costs a few
//! hundred bytes; the namespace and the pool name are shared with the ledger's indexes.
//!
//! Nothing is lost: [`Entry::to_object`] gives back exactly the object that was stored (less its
//! `managedFields`, which the ledger never kept). Labels or annotations that are not exactly
//! kipam's standard ones, and any other metadata, are kept as they came.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::allocator::Allocation;
use crate::resources::{
    ANNOTATION_ADDRESSES, ANNOTATION_RECLAIM_POLICY, AllocationPhase, IPAMAllocation,
    IPAMAllocationSpec, IPAMAllocationStatus, LABEL_CLUSTER, LABEL_DATACENTER, LABEL_PHASE,
    LABEL_POOL, ReclaimPolicy, address_summary, cluster_of_namespace,
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
    /// The labels are exactly kipam's, with the values this object implies.
    labels: StandardLabels,
    /// With `summary`, the annotations are exactly kipam's: the reclaim-policy one with this
    /// value (when `Some`).
    policy: Option<ReclaimPolicy>,
    /// The annotations hold kipam's address annotation, with the value the spec implies (and
    /// nothing but it and the reclaim policy).
    summary: bool,
    spec: IPAMAllocationSpec,
    status: Option<Box<IPAMAllocationStatus>>,
    /// Every other piece of metadata, when there is any.
    rest: Option<Box<ObjectMeta>>,
    /// What the planner read of it, once read (an entry never changes: another version of
    /// the object is another entry).
    reading: OnceLock<Reading>,
}

/// Which labels an entry stands for, when they are exactly kipam's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StandardLabels {
    /// Not kipam's alone: kept as they came.
    Kept,
    /// Pool, cluster and datacenter (as written before kipam set the phase label).
    Three,
    /// Those and the phase label, with the phase the spec and status give.
    WithPhase,
}

/// What the planner reads of a readable allocation beyond its names and datacenter: what it
/// holds and the reclaim policy recorded on it.
pub type Reading = (Option<Allocation>, Option<ReclaimPolicy>);

fn policy_of(text: &str) -> Option<ReclaimPolicy> {
    [ReclaimPolicy::Delete, ReclaimPolicy::Retain]
        .into_iter()
        .find(|p| p.as_str() == text)
}

/// `(policy, summary)` when `annotations` are kipam's alone: the reclaim policy (a value kipam
/// writes) and the address annotation with the value `spec` implies, at least one of them.
fn standard_annotations(
    annotations: &BTreeMap<String, String>,
    spec: &IPAMAllocationSpec,
) -> Option<(Option<ReclaimPolicy>, bool)> {
    let mut policy = None;
    let mut summary = false;
    for (key, value) in annotations {
        match key.as_str() {
            ANNOTATION_RECLAIM_POLICY => policy = Some(policy_of(value)?),
            ANNOTATION_ADDRESSES if address_summary(spec).as_deref() == Some(value.as_str()) => {
                summary = true
            }
            _ => return None,
        }
    }
    (policy.is_some() || summary).then_some((policy, summary))
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
        let phase = crate::resources::allocation_phase(&spec, status.as_ref());
        let labels = match metadata.labels.as_ref() {
            Some(labels)
                if labels.get(LABEL_POOL).map(String::as_str) == Some(&*name)
                    && labels.get(LABEL_CLUSTER).map(String::as_str)
                        == cluster_of_namespace(&namespace)
                    && labels.get(LABEL_DATACENTER) == Some(&spec.dc) =>
            {
                match (labels.len(), labels.get(LABEL_PHASE)) {
                    (3, None) => StandardLabels::Three,
                    (4, Some(p)) if p == phase.as_str() => StandardLabels::WithPhase,
                    _ => StandardLabels::Kept,
                }
            }
            _ => StandardLabels::Kept,
        };
        if labels != StandardLabels::Kept {
            metadata.labels = None;
        }
        let (policy, summary) = match metadata.annotations.as_ref() {
            Some(a) => standard_annotations(a, &spec).unwrap_or((None, false)),
            None => (None, false),
        };
        if policy.is_some() || summary {
            metadata.annotations = None;
        }
        Entry {
            namespace,
            name,
            version,
            uid,
            created,
            generation,
            labels,
            policy,
            summary,
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
        if self.labels != StandardLabels::Kept {
            let mut labels = BTreeMap::from([
                (LABEL_POOL.to_string(), self.name.to_string()),
                (
                    LABEL_CLUSTER.to_string(),
                    self.cluster().unwrap_or_default().to_string(),
                ),
                (LABEL_DATACENTER.to_string(), self.spec.dc.clone()),
            ]);
            if self.labels == StandardLabels::WithPhase {
                labels.insert(LABEL_PHASE.to_string(), self.phase().as_str().to_string());
            }
            metadata.labels = Some(labels);
        }
        if self.policy.is_some() || self.summary {
            let mut annotations = BTreeMap::new();
            if let Some(policy) = self.policy {
                annotations.insert(
                    ANNOTATION_RECLAIM_POLICY.to_string(),
                    policy.as_str().to_string(),
                );
            }
            if self.summary {
                annotations.insert(
                    ANNOTATION_ADDRESSES.to_string(),
                    address_summary(&self.spec).unwrap_or_default(),
                );
            }
            metadata.annotations = Some(annotations);
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
        if self.labels != StandardLabels::Kept {
            return match key {
                LABEL_POOL => Some(self.name()),
                LABEL_CLUSTER => self.cluster(),
                LABEL_DATACENTER => Some(&self.spec.dc),
                LABEL_PHASE if self.labels == StandardLabels::WithPhase => {
                    Some(self.phase().as_str())
                }
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
    pub fn annotation(&self, key: &str) -> Option<Cow<'_, str>> {
        if self.policy.is_some() || self.summary {
            return match key {
                ANNOTATION_RECLAIM_POLICY => self.policy.map(|p| Cow::Borrowed(p.as_str())),
                ANNOTATION_ADDRESSES if self.summary => address_summary(&self.spec).map(Cow::Owned),
                _ => None,
            };
        }
        self.rest
            .as_ref()?
            .annotations
            .as_ref()?
            .get(key)
            .map(|v| Cow::Borrowed(v.as_str()))
    }

    /// The reclaim-policy annotation as written.
    fn reclaim_policy_text(&self) -> Option<&str> {
        if self.policy.is_some() || self.summary {
            return self.policy.map(|p| p.as_str());
        }
        self.rest
            .as_ref()?
            .annotations
            .as_ref()?
            .get(ANNOTATION_RECLAIM_POLICY)
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
            reclaim_policy: self.reclaim_policy_text(),
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
            && self.labels == other.labels
            && self.policy == other.policy
            && self.summary == other.summary
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
            (LABEL_PHASE.into(), "Allocated".into()),
        ]));
        o.metadata.annotations = Some(BTreeMap::from([
            (ANNOTATION_RECLAIM_POLICY.into(), "Retain".into()),
            (ANNOTATION_ADDRESSES.into(), "10.0.0.0-.7".into()),
        ]));
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
        assert_eq!(e.labels, StandardLabels::WithPhase);
        assert_eq!(e.policy, Some(ReclaimPolicy::Retain));
        assert!(e.summary);
        assert_same(&e.to_object(), &o);
        assert_eq!(e.label(LABEL_CLUSTER), Some("a"));
        assert_eq!(e.label(LABEL_PHASE), Some("Allocated"));
        assert_eq!(
            e.annotation(ANNOTATION_RECLAIM_POLICY).as_deref(),
            Some("Retain")
        );
        assert_eq!(
            e.annotation(ANNOTATION_ADDRESSES).as_deref(),
            Some("10.0.0.0-.7")
        );
        assert_eq!(e.version(), Some(42));
    }

    /// The phase label and the address annotation say what the spec and status say: held as
    /// flags, in every phase, and given back with the values they had.
    #[test]
    fn the_phase_label_and_address_annotation_are_flags() {
        let mut failed = typical();
        failed.spec.addresses.clear();
        failed.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_RECLAIM_POLICY.into(),
            "Delete".into(),
        )]));
        failed
            .metadata
            .labels
            .as_mut()
            .map(|l| l.insert(LABEL_PHASE.into(), "Failed".into()));
        failed.status = Some(IPAMAllocationStatus {
            phase: Some(AllocationPhase::Failed),
            message: Some("pool metallb/dc1 is full".into()),
            ..Default::default()
        });
        let e = entry(failed.clone());
        assert!(e.rest.is_none(), "{:?}", e.rest);
        assert_eq!(e.labels, StandardLabels::WithPhase);
        assert!(!e.summary);
        assert_same(&e.to_object(), &failed);

        // A prefix allocation, no reclaim policy recorded: the address annotation alone.
        let mut prefix = typical();
        prefix.spec.type_ = AllocationType::Prefix;
        prefix.spec.addresses.clear();
        prefix.spec.cidr = Some("10.1.0.16/28".into());
        prefix.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_ADDRESSES.into(),
            "10.1.0.16/28".into(),
        )]));
        let e = entry(prefix.clone());
        assert!(e.rest.is_none(), "{:?}", e.rest);
        assert!(e.summary && e.policy.is_none());
        assert_same(&e.to_object(), &prefix);
        assert_eq!(e.annotation(ANNOTATION_RECLAIM_POLICY), None);

        // Written before kipam set them: three labels, the policy alone.
        let mut older = typical();
        older
            .metadata
            .labels
            .as_mut()
            .map(|l| l.remove(LABEL_PHASE));
        older.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_RECLAIM_POLICY.into(),
            "Retain".into(),
        )]));
        let e = entry(older.clone());
        assert!(e.rest.is_none(), "{:?}", e.rest);
        assert_eq!(e.labels, StandardLabels::Three);
        assert_eq!(e.label(LABEL_PHASE), None);
        assert_eq!(e.annotation(ANNOTATION_ADDRESSES), None);
        assert_same(&e.to_object(), &older);
    }

    /// A phase label or address annotation that does not match the object (edited by hand,
    /// or a spec changed by hand) is kept as it came, not corrected on the way back.
    #[test]
    fn a_stale_phase_label_or_address_annotation_is_kept_as_it_came() {
        let mut stale_phase = typical();
        stale_phase.status = Some(IPAMAllocationStatus {
            phase: Some(AllocationPhase::Conflict),
            message: Some("overlaps".into()),
            ..Default::default()
        });
        let e = entry(stale_phase.clone());
        assert_eq!(e.labels, StandardLabels::Kept);
        assert_eq!(e.label(LABEL_PHASE), Some("Allocated"));
        assert_same(&e.to_object(), &stale_phase);

        let mut stale_summary = typical();
        stale_summary.spec.addresses = vec!["10.0.0.8-10.0.0.15".into()];
        let e = entry(stale_summary.clone());
        assert!(!e.summary && e.policy.is_none());
        assert_eq!(
            e.annotation(ANNOTATION_ADDRESSES).as_deref(),
            Some("10.0.0.0-.7")
        );
        assert_same(&e.to_object(), &stale_summary);
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
        assert!(e.labels == StandardLabels::Kept && e.policy.is_none() && !e.summary);
        assert_eq!(e.label(LABEL_DATACENTER), Some("dc2"));
        assert_eq!(e.annotation("note").as_deref(), Some("hand-edited"));
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
        assert_eq!(
            e.annotation(ANNOTATION_RECLAIM_POLICY).as_deref(),
            Some("Keep")
        );

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
