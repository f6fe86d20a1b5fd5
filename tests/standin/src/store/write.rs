//! Create, update, patch (merge, strategic, JSON) and server-side apply.

use super::validate::{spec_changed, validate_meta};
use super::{Owners, Shown, Store, Target, WriteOptions, WriteResult, present};
use crate::error::ApiError;
use crate::patch::{self, JsonPatchError, PatchKind};
use crate::resources::{ResourceType, types_from_crd};
use crate::util::{self, meta, meta_mut, meta_str};
use serde_json::{Value, json};
use std::sync::Arc;

/// `old` with its `status` replaced by the one in `body` (a write to `/status`).
fn with_status_from(old: &Value, body: &Value) -> Value {
    let mut new = old.clone();
    if let Value::Object(m) = &mut new {
        match body.get("status") {
            Some(s) if !s.is_null() => {
                m.insert("status".into(), s.clone());
            }
            _ => {
                m.remove("status");
            }
        }
    }
    new
}

/// The body of a write to the main resource, with everything the client may not change
/// there taken from `old`: system metadata, and `status` when it is a subresource.
fn main_update(rt: &ResourceType, old: &Value, mut new: Value) -> Value {
    if let Value::Object(m) = &mut new {
        if rt.status {
            match old.get("status") {
                Some(s) => {
                    m.insert("status".into(), s.clone());
                }
                None => {
                    m.remove("status");
                }
            }
        }
        m.insert("apiVersion".into(), json!(rt.api_version()));
        m.insert("kind".into(), json!(rt.kind));
    }
    let old_meta = meta(old).cloned().unwrap_or_default();
    let nm = meta_mut(&mut new);
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
        "namespace",
        "name",
    ] {
        match old_meta.get(f) {
            Some(v) => {
                nm.insert(f.into(), v.clone());
            }
            None => {
                nm.remove(f);
            }
        }
    }
    nm.remove("managedFields");
    nm.remove("selfLink");
    for f in ["labels", "annotations", "finalizers", "ownerReferences"] {
        if nm.get(f).is_some_and(Value::is_null) {
            nm.remove(f);
        }
    }
    new
}

/// The fields of an applied configuration that server-side apply merges and tracks.
fn applied_config(rt: &ResourceType, status: bool, applied: &Value) -> Value {
    let mut cfg = applied.as_object().cloned().unwrap_or_default();
    cfg.remove("apiVersion");
    cfg.remove("kind");
    if status {
        cfg.retain(|k, _| k == "status");
    } else {
        if rt.status {
            cfg.remove("status");
        }
        if let Some(Value::Object(m)) = cfg.get_mut("metadata") {
            m.retain(|k, _| {
                matches!(
                    k.as_str(),
                    "labels" | "annotations" | "finalizers" | "ownerReferences"
                )
            });
            if m.is_empty() {
                cfg.remove("metadata");
            }
        } else {
            cfg.remove("metadata");
        }
    }
    Value::Object(cfg)
}

/// Parses an apply body, which may be JSON or YAML.
fn parse_json_or_yaml(body: &[u8]) -> Result<Value, ApiError> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Ok(v);
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
    serde_saphyr::from_str::<Value>(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

/// A field path as the real server prints it in apply conflicts (`.spec.size`).
fn field_path_string(p: &[String]) -> String {
    p.iter()
        .map(|s| match s.strip_prefix("v:") {
            Some(v) => format!("[{v}]"),
            None => format!(".{s}"),
        })
        .collect()
}

impl Store {
    /// Runs a CRD's side effect on the registry after it was written.
    pub(super) fn register_crd(&mut self, crd: &Value) {
        if let Ok(types) = types_from_crd(crd) {
            self.registry.unregister_crd(meta_str(crd, "name"));
            for t in types {
                self.registry.register(t);
            }
        }
    }

    /// Creates an object (POST, or PUT/apply of a missing object).
    pub(crate) fn create(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        body: Value,
        opts: WriteOptions,
    ) -> Result<Shown, ApiError> {
        if !meta_str(&body, "resourceVersion").is_empty() {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        self.create_object(rt, ns, body, opts)
            .map(|o| Shown::new(rt, &o))
    }

    pub(super) fn create_object(
        &mut self,
        rt: &ResourceType,
        ns: Option<&str>,
        mut obj: Value,
        opts: WriteOptions,
    ) -> Result<Arc<Value>, ApiError> {
        Self::check_type(rt, &mut obj)?;
        Self::check_namespace(rt, ns, &mut obj)?;
        let key = rt.storage_key();
        let ns = meta_str(&obj, "namespace").to_string();
        let mut name = meta_str(&obj, "name").to_string();
        // The real server's `NamespaceLifecycle` admission runs before any validation: a
        // missing or terminating namespace is what it answers, whatever else is wrong.
        if rt.namespaced {
            match self.namespace_terminating(&ns) {
                None => return Err(ApiError::not_found("", "namespaces", &ns)),
                Some(true) => {
                    return Err(ApiError::forbidden(format!(
                        "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        crate::error::qualified(&rt.group, &rt.plural)
                    )));
                }
                Some(false) => {}
            }
        }
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    &rt.group,
                    &rt.kind,
                    "",
                    &["metadata.name: Required value: name or generateName is required".into()],
                ));
            }
            loop {
                name = format!("{prefix}{}", self.ids.name_suffix());
                if self.find(&key, &ns, &name).is_none() {
                    break;
                }
            }
        }
        let uid = self.ids.uid();
        let now = util::now_rfc3339();
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(now));
            for f in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
                "generation",
            ] {
                m.remove(f);
            }
            if rt.generation {
                m.insert("generation".into(), json!(1));
            }
            for f in ["labels", "annotations", "finalizers", "ownerReferences"] {
                if m.get(f).is_some_and(Value::is_null) {
                    m.remove(f);
                }
            }
        }
        if rt.status
            && let Value::Object(m) = &mut obj
        {
            m.remove("status");
        }
        validate_meta(rt, &obj)?;
        Self::normalize_kind(rt, &mut obj)?;
        let warnings = Self::check_schema(rt, &mut obj, None, opts.field_validation)?;
        self.warnings.extend(warnings);
        if self.find(&key, &ns, &name).is_some() {
            return Err(ApiError::already_exists(&rt.group, &rt.plural, &name));
        }
        if opts.dry_run {
            return Ok(Arc::new(obj));
        }
        let is_crd = rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions";
        let arc = self.commit_put(&key, obj, None);
        if is_crd {
            self.register_crd(&arc);
        }
        Ok(arc)
    }

    /// Validates and stores a new state computed from `old`; a state equal to `old` is a
    /// no-op (no new resource version, no event), as on the real server.
    pub(super) fn finish_update(
        &mut self,
        rt: &ResourceType,
        old: Arc<Value>,
        mut new: Value,
        opts: WriteOptions,
    ) -> Result<Shown, ApiError> {
        let key = rt.storage_key();
        validate_meta(rt, &new)?;
        Self::normalize_kind(rt, &mut new)?;
        let warnings = Self::check_schema(rt, &mut new, Some(&old), opts.field_validation)?;
        self.warnings.extend(warnings);
        if !meta_str(&old, "deletionTimestamp").is_empty() {
            let before = util::finalizers(&old);
            if let Some(f) = util::finalizers(&new).iter().find(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    &rt.group,
                    &rt.kind,
                    meta_str(&old, "name"),
                    &[format!(
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [\"{f}\"]"
                    )],
                ));
            }
        }
        if rt.generation && spec_changed(rt, &old, &new) {
            let g = meta(&old)
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        if new == *old {
            return Ok(Shown::new(rt, &old));
        }
        if opts.dry_run {
            return Ok(Shown::new(rt, &Arc::new(new)));
        }
        if self.should_remove(&key, &new) {
            let gone = self.commit_remove(&key, new, old);
            return Ok(Shown::new(rt, &gone));
        }
        let is_crd = rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions";
        let arc = self.commit_put(&key, new, Some(old));
        if is_crd {
            self.register_crd(&arc);
        }
        Ok(Shown::new(rt, &arc))
    }

    /// PUT of an object or of its `/status`.
    pub(crate) fn update(&mut self, t: &Target, body: Value, opts: WriteOptions) -> WriteResult {
        let rt = &t.rt;
        let mut obj = body;
        Self::check_type(rt, &mut obj)?;
        Self::check_identity(t, &mut obj)?;
        let Some(old) = self.find(&rt.storage_key(), t.ns(), &t.name).cloned() else {
            if rt.create_on_update && !t.status {
                if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("resourceVersion");
                }
                return self
                    .create_object(rt, t.namespace.as_deref(), obj, opts)
                    .map(|o| (Shown::new(rt, &o), true));
            }
            return Err(ApiError::not_found(&rt.group, &rt.plural, &t.name));
        };
        let rv = meta_str(&obj, "resourceVersion").to_string();
        if rv.is_empty() && !rt.unconditional_update {
            return Err(ApiError::invalid(
                &rt.group,
                &rt.kind,
                &t.name,
                &[
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
                        .into(),
                ],
            ));
        }
        Self::check_preconditions(rt, &old, &rv, meta_str(&obj, "uid"))?;
        let new = if t.status {
            with_status_from(&old, &obj)
        } else {
            main_update(rt, &old, obj)
        };
        self.finish_update(rt, old, new, opts).map(|v| (v, false))
    }

    /// PATCH of an object or of its `/status`, in any of the four patch formats.
    pub(crate) fn patch(
        &mut self,
        t: &Target,
        kind: PatchKind,
        body: &[u8],
        manager: Option<&str>,
        force: bool,
        opts: WriteOptions,
    ) -> WriteResult {
        let rt = &t.rt;
        if kind == PatchKind::Apply {
            return self.apply(t, body, manager, force, opts);
        }
        if kind == PatchKind::Strategic && !rt.strategic_merge {
            return Err(ApiError::new(
                415,
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        let patch: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
        let Some(old) = self.find(&rt.storage_key(), t.ns(), &t.name).cloned() else {
            return Err(ApiError::not_found(&rt.group, &rt.plural, &t.name));
        };
        let mut doc = present(rt, &old);
        match kind {
            PatchKind::Merge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request("a merge patch must be a JSON object"));
                }
                patch::merge_patch(&mut doc, &patch);
            }
            PatchKind::Strategic => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "a strategic merge patch must be a JSON object",
                    ));
                }
                patch::strategic_merge_patch(&mut doc, &patch);
            }
            PatchKind::Json => patch::json_patch(&mut doc, &patch).map_err(|e| match e {
                JsonPatchError::Malformed(m) => ApiError::bad_request(m),
                JsonPatchError::Failed(m) => ApiError::new(422, m),
            })?,
            PatchKind::Apply => unreachable!("handled above"),
        }
        if !doc.is_object() {
            return Err(ApiError::bad_request(
                "the patched object is not a JSON object",
            ));
        }
        Self::check_type(rt, &mut doc)?;
        Self::check_identity(t, &mut doc)?;
        Self::check_preconditions(
            rt,
            &old,
            meta_str(&doc, "resourceVersion"),
            meta_str(&doc, "uid"),
        )?;
        let new = if t.status {
            with_status_from(&old, &doc)
        } else {
            main_update(rt, &old, doc)
        };
        self.finish_update(rt, old, new, opts).map(|v| (v, false))
    }

    /// Server-side apply: merges the applied configuration, removes fields this manager
    /// applied before but no longer does, and reports conflicts with other appliers unless
    /// `force` is set.
    pub(super) fn apply(
        &mut self,
        t: &Target,
        body: &[u8],
        manager: Option<&str>,
        force: bool,
        opts: WriteOptions,
    ) -> WriteResult {
        let rt = &t.rt;
        let manager = manager.filter(|m| !m.is_empty()).ok_or_else(|| {
            ApiError::bad_request("PATCH /apply requires a fieldManager query parameter")
        })?;
        let mut applied = parse_json_or_yaml(body)?;
        if !applied.is_object() {
            return Err(ApiError::bad_request(
                "an applied configuration must be an object",
            ));
        }
        for f in ["apiVersion", "kind"] {
            if applied
                .get(f)
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                return Err(ApiError::bad_request(format!(
                    "{f} must be set in an applied configuration"
                )));
            }
        }
        Self::check_type(rt, &mut applied)?;
        Self::check_identity(t, &mut applied)?;
        let config = applied_config(rt, t.status, &applied);
        let paths = patch::leaf_paths(&config);
        let key = rt.storage_key();
        let Some(old) = self.find(&key, t.ns(), &t.name).cloned() else {
            if t.status {
                return Err(ApiError::not_found(&rt.group, &rt.plural, &t.name));
            }
            let mut obj = config.clone();
            obj["apiVersion"] = json!(rt.api_version());
            obj["kind"] = json!(rt.kind);
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(t.name));
            if let Some(ns) = &t.namespace {
                m.insert("namespace".into(), json!(ns));
            }
            let created = self.create_object(rt, t.namespace.as_deref(), obj, opts)?;
            if !opts.dry_run {
                let mut owners = Owners::new();
                owners.insert((false, manager.to_string()), paths);
                self.owners
                    .insert(meta_str(&created, "uid").to_string(), owners);
            }
            return Ok((Shown::new(rt, &created), true));
        };
        Self::check_preconditions(rt, &old, meta_str(&applied, "resourceVersion"), "")?;
        let uid = meta_str(&old, "uid").to_string();
        let mut owners = self.owners.get(&uid).cloned().unwrap_or_default();
        let sub = t.status;
        if !force {
            let mut conflicts = Vec::new();
            for ((s, m), owned) in &owners {
                if *s != sub || m == manager {
                    continue;
                }
                for p in owned.intersection(&paths) {
                    if patch::value_at(&old, p) != patch::value_at(&config, p) {
                        conflicts.push(format!("conflict with \"{m}\": {}", field_path_string(p)));
                    }
                }
            }
            if !conflicts.is_empty() {
                return Err(ApiError::conflict(
                    &rt.group,
                    &rt.plural,
                    &t.name,
                    &format!(
                        "Apply failed with {} conflict(s): {}",
                        conflicts.len(),
                        conflicts.join(", ")
                    ),
                ));
            }
        }
        let mine = (sub, manager.to_string());
        let previous = owners.get(&mine).cloned().unwrap_or_default();
        let mut doc = (*old).clone();
        for p in previous.difference(&paths) {
            let shared = owners
                .iter()
                .any(|((s, m), owned)| *s == sub && m != manager && owned.contains(p));
            if !shared {
                patch::remove_path(&mut doc, p);
            }
        }
        patch::apply_merge(&mut doc, &config);
        let new = if t.status {
            with_status_from(&old, &doc)
        } else {
            main_update(rt, &old, doc)
        };
        let result = self.finish_update(rt, old, new, opts)?;
        let still_there = self
            .find(&key, t.ns(), &t.name)
            .is_some_and(|o| meta_str(o, "uid") == uid);
        if !opts.dry_run && still_there {
            if force {
                for ((s, m), owned) in owners.iter_mut() {
                    if *s == sub && m != manager {
                        owned.retain(|p| !paths.contains(p));
                    }
                }
            }
            owners.insert(mine, paths);
            owners.retain(|_, owned| !owned.is_empty());
            self.owners.insert(uid, owners);
        }
        Ok((result, false))
    }
}
