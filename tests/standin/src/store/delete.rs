//! Deletion: finalizers and `deletionTimestamp`, garbage collection through owner
//! references, and the cleanup of terminating namespaces and CRDs.

use super::{CRD_CLEANUP_FINALIZER, SYSTEM_NAMESPACES, Store, Target, present};
use crate::error::{ApiError, success_status};
use crate::resources::{ResourceType, StorageKey};
use crate::selectors::Selectors;
use crate::util::{self, meta_mut, meta_str};
use serde_json::{Value, json};
use std::sync::Arc;

/// `DeleteOptions` as far as the stand-in honours them.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeleteOptions {
    pub precondition_rv: Option<String>,
    pub precondition_uid: Option<String>,
    pub propagation: Propagation,
    pub dry_run: bool,
}

/// `propagationPolicy`: what happens to an object's dependents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Propagation {
    #[default]
    Background,
    Foreground,
    Orphan,
}

impl DeleteOptions {
    /// Reads a `DeleteOptions` body (empty is fine).
    pub(crate) fn from_body(body: &[u8]) -> Result<Self, ApiError> {
        let mut o = DeleteOptions::default();
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(o);
        }
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        let s = |p: &str| {
            util::get_dotted(&v, p)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        o.precondition_rv = s("preconditions.resourceVersion").filter(|x| !x.is_empty());
        o.precondition_uid = s("preconditions.uid").filter(|x| !x.is_empty());
        if let Some(p) = s("propagationPolicy") {
            o.propagation = Propagation::parse(&p)?;
        } else if v.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
            o.propagation = Propagation::Orphan;
        }
        o.dry_run = v
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|x| x == "All"));
        Ok(o)
    }
}

impl Propagation {
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        match s {
            "Background" => Ok(Propagation::Background),
            "Foreground" => Ok(Propagation::Foreground),
            "Orphan" => Ok(Propagation::Orphan),
            other => Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {other:?}"
            ))),
        }
    }
}

impl Store {
    /// Background garbage collection after the object `uid` was removed: dependents all of
    /// whose owners are gone are deleted (recursively, through their own removal).
    pub(super) fn collect_dependents(&mut self, uid: &str) {
        if uid.is_empty() {
            return;
        }
        let Some(dependents) = self.dependents.remove(uid) else {
            return;
        };
        for (key, (ns, name)) in dependents {
            let Some(obj) = self.find(&key, &ns, &name).cloned() else {
                continue;
            };
            if util::owner_uids(&obj).iter().any(|o| self.uid_exists(o)) {
                continue;
            }
            let _ = self.delete_object(&key, &ns, &name, &DeleteOptions::default());
        }
    }

    /// Whether an object marked for deletion can go now: no finalizers left, and for a
    /// namespace, nothing left inside it.
    pub(super) fn should_remove(&self, key: &StorageKey, obj: &Value) -> bool {
        if meta_str(obj, "deletionTimestamp").is_empty() || !util::finalizers(obj).is_empty() {
            return false;
        }
        if key.0.is_empty() && key.1 == "namespaces" {
            return self.namespace_is_empty(meta_str(obj, "name"));
        }
        true
    }

    /// Whether no namespaced object of any type lives in `ns`.
    pub(super) fn namespace_is_empty(&self, ns: &str) -> bool {
        self.objects
            .keys()
            .filter(|k| !(k.0.is_empty() && k.1 == "namespaces"))
            .all(|k| self.scan(k, Some(ns)).next().is_none())
    }

    /// Removes a terminating namespace once it is empty and has no finalizers.
    pub(super) fn try_finish_namespace(&mut self, ns: &str) {
        let key: StorageKey = (String::new(), "namespaces".into());
        if let Some(obj) = self.find(&key, "", ns).cloned()
            && self.should_remove(&key, &obj)
        {
            self.commit_remove(&key, (*obj).clone(), obj);
        }
    }

    /// Once a terminating CRD has no objects left, drops its cleanup finalizer and, if no
    /// other finalizer remains, removes it (which unregisters its types).
    pub(super) fn try_finish_crd(&mut self, crd: &str) {
        let key: StorageKey = (
            "apiextensions.k8s.io".into(),
            "customresourcedefinitions".into(),
        );
        let Some(obj) = self.find(&key, "", crd).cloned() else {
            return;
        };
        if meta_str(&obj, "deletionTimestamp").is_empty() {
            return;
        }
        let group = util::get_dotted(&obj, "spec.group")
            .and_then(Value::as_str)
            .unwrap_or("");
        let plural = util::get_dotted(&obj, "spec.names.plural")
            .and_then(Value::as_str)
            .unwrap_or("");
        if self
            .scan(&(group.to_string(), plural.to_string()), None)
            .next()
            .is_some()
        {
            return;
        }
        let mut new = (*obj).clone();
        let fins: Vec<String> = util::finalizers(&new)
            .into_iter()
            .filter(|f| f != CRD_CLEANUP_FINALIZER)
            .collect();
        if fins.is_empty() {
            meta_mut(&mut new).remove("finalizers");
            self.commit_remove(&key, new, obj);
        } else if fins.len() != util::finalizers(&obj).len() {
            meta_mut(&mut new).insert("finalizers".into(), json!(fins));
            self.commit_put(&key, new, Some(obj));
        }
    }

    /// `None` when the namespace does not exist, else whether it is being deleted.
    pub(super) fn namespace_terminating(&self, ns: &str) -> Option<bool> {
        self.find(&(String::new(), "namespaces".into()), "", ns)
            .map(|o| !meta_str(o, "deletionTimestamp").is_empty())
    }

    /// DELETE of one object. Returns the object when it remains (finalizers pending) or a
    /// success `Status` when it is gone.
    pub(crate) fn delete(&mut self, t: &Target, opts: &DeleteOptions) -> Result<Value, ApiError> {
        let rt = &t.rt;
        let key = rt.storage_key();
        let Some(old) = self.find(&key, t.ns(), &t.name).cloned() else {
            return Err(ApiError::not_found(&rt.group, &rt.plural, &t.name));
        };
        Self::check_preconditions(
            rt,
            &old,
            opts.precondition_rv.as_deref().unwrap_or(""),
            opts.precondition_uid.as_deref().unwrap_or(""),
        )?;
        if rt.group.is_empty()
            && rt.plural == "namespaces"
            && SYSTEM_NAMESPACES.contains(&t.name.as_str())
        {
            return Err(ApiError::forbidden(format!(
                "namespaces \"{}\" is forbidden: this namespace may not be deleted",
                t.name
            )));
        }
        if opts.dry_run {
            return Ok(present(rt, &old));
        }
        let uid = meta_str(&old, "uid").to_string();
        match self.delete_object(&key, t.ns(), &t.name, opts)? {
            Some(remaining) => Ok(present(rt, &remaining)),
            None => Ok(success_status(&rt.group, &rt.plural, &t.name, &uid)),
        }
    }

    /// Deletes every object matching the selectors; answers with the list of them.
    pub(crate) fn delete_collection(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        sel: &Selectors,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let key = rt.storage_key();
        let victims: Vec<Arc<Value>> = self
            .scan(&key, ns)
            .filter(|o| sel.matches(o))
            .cloned()
            .collect();
        let mut items = Vec::new();
        for v in victims {
            let ns = meta_str(&v, "namespace").to_string();
            let name = meta_str(&v, "name").to_string();
            if opts.dry_run {
                items.push(present(rt, &v));
                continue;
            }
            if let Ok(rest) = self.delete_object(&key, &ns, &name, opts) {
                items.push(present(rt, rest.as_deref().unwrap_or(&v)));
            }
        }
        Ok(json!({
            "apiVersion": rt.api_version(),
            "kind": rt.list_kind,
            "metadata": {"resourceVersion": self.rv.to_string()},
            "items": items,
        }))
    }

    /// The deletion itself: marks objects with finalizers, removes the others, and starts
    /// the cleanup of namespaces and CRDs. Returns the object if it still exists.
    pub(super) fn delete_object(
        &mut self,
        key: &StorageKey,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Option<Arc<Value>>, ApiError> {
        let Some(old) = self.find(key, ns, name).cloned() else {
            return Err(ApiError::not_found(&key.0, &key.1, name));
        };
        let uid = meta_str(&old, "uid").to_string();
        if opts.propagation == Propagation::Orphan {
            self.orphan_dependents(&uid);
        }
        let is_ns = key.0.is_empty() && key.1 == "namespaces";
        let is_crd = key.0 == "apiextensions.k8s.io" && key.1 == "customresourcedefinitions";
        let deleting = !meta_str(&old, "deletionTimestamp").is_empty();
        if deleting {
            return Ok(Some(old));
        }
        let crd_has_instances = is_crd && {
            let group = util::get_dotted(&old, "spec.group")
                .and_then(Value::as_str)
                .unwrap_or("");
            let plural = util::get_dotted(&old, "spec.names.plural")
                .and_then(Value::as_str)
                .unwrap_or("");
            self.scan(&(group.to_string(), plural.to_string()), None)
                .next()
                .is_some()
        };
        let needs_marking = !util::finalizers(&old).is_empty()
            || (is_ns && !self.namespace_is_empty(name))
            || crd_has_instances;
        if !needs_marking {
            if opts.propagation == Propagation::Foreground {
                self.collect_dependents_first(&uid);
            }
            let last = (*old).clone();
            self.commit_remove(key, last, old);
            return Ok(None);
        }
        let rt = self.storage_type(key);
        let mut new = (*old).clone();
        {
            let m = meta_mut(&mut new);
            m.insert("deletionTimestamp".into(), json!(util::now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            if rt.as_ref().is_some_and(|t| t.generation) {
                let g = m.get("generation").and_then(Value::as_i64).unwrap_or(0);
                m.insert("generation".into(), json!(g + 1));
            }
            if crd_has_instances {
                let mut f = util::finalizers(&old);
                f.push(CRD_CLEANUP_FINALIZER.to_string());
                m.insert("finalizers".into(), json!(f));
            }
        }
        if let Some(rt) = &rt {
            // Recomputes derived status (namespace phase, CRD Terminating condition).
            let _ = Self::normalize_kind(rt, &mut new);
        }
        let marked = self.commit_put(key, new, Some(old));
        if is_ns {
            let keys: Vec<StorageKey> = self
                .objects
                .keys()
                .filter(|k| !(k.0.is_empty() && k.1 == "namespaces"))
                .cloned()
                .collect();
            for k in keys {
                let names: Vec<String> = self
                    .scan(&k, Some(name))
                    .map(|o| meta_str(o, "name").to_string())
                    .collect();
                for n in names {
                    let _ = self.delete_object(&k, name, &n, &DeleteOptions::default());
                }
            }
            self.try_finish_namespace(name);
        }
        if crd_has_instances {
            let group = util::get_dotted(&marked, "spec.group")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let plural = util::get_dotted(&marked, "spec.names.plural")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let ik = (group, plural);
            let victims: Vec<(String, String)> = self
                .scan(&ik, None)
                .map(|o| {
                    (
                        meta_str(o, "namespace").to_string(),
                        meta_str(o, "name").to_string(),
                    )
                })
                .collect();
            for (vns, vname) in victims {
                let _ = self.delete_object(&ik, &vns, &vname, &DeleteOptions::default());
            }
            self.try_finish_crd(name);
        }
        Ok(self.find(key, ns, name).cloned())
    }

    /// Foreground propagation, simplified: dependents are deleted before their owner.
    pub(super) fn collect_dependents_first(&mut self, uid: &str) {
        for (key, (ns, name)) in self.dependents_of(uid) {
            let opts = DeleteOptions {
                propagation: Propagation::Foreground,
                ..DeleteOptions::default()
            };
            let _ = self.delete_object(&key, &ns, &name, &opts);
        }
    }

    /// Orphan propagation: dependents lose their reference to the owner and stay.
    pub(super) fn orphan_dependents(&mut self, uid: &str) {
        for (key, (ns, name)) in self.dependents_of(uid) {
            let Some(obj) = self.find(&key, &ns, &name).cloned() else {
                continue;
            };
            let mut new = (*obj).clone();
            let m = meta_mut(&mut new);
            if let Some(Value::Array(refs)) = m.get_mut("ownerReferences") {
                refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid));
                if refs.is_empty() {
                    m.remove("ownerReferences");
                }
            }
            self.commit_put(&key, new, Some(obj));
        }
    }
}
