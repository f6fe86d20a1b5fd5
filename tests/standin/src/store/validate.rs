//! Validation and normalisation every write goes through: names, metadata, type and
//! namespace of the body, preconditions, and per-kind rules (Secret `stringData`, Namespace
//! phase, CRD status, custom resource schemas).

use super::{FieldValidation, Store, Target};
use crate::error::ApiError;
use crate::resources::{NameRule, ResourceType, types_from_crd};
use crate::util::{self, meta, meta_mut, meta_str};
use serde_json::{Map, Value, json};

/// A label value, or the name part of a label key: up to 63 alphanumerics, `-`, `_`, `.`,
/// starting and ending alphanumeric.
fn is_label_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// RFC 1123 subdomain: lowercase alphanumerics, `-` and `.`, up to 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// RFC 1123 label: a subdomain without dots, up to 63 characters.
fn is_dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && is_dns_subdomain(s)
}

/// The validation error for an object name, if it breaks its type's rule.
fn check_name(rule: NameRule, name: &str) -> Option<String> {
    let ok = match rule {
        NameRule::Subdomain => is_dns_subdomain(name),
        NameRule::Label => is_dns_label(name),
        NameRule::PathSegment => {
            !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
        }
    };
    (!ok).then(|| {
        let what = match rule {
            NameRule::Subdomain => "a lowercase RFC 1123 subdomain",
            NameRule::Label => "a lowercase RFC 1123 label",
            NameRule::PathSegment => "a valid path segment name",
        };
        format!("metadata.name: Invalid value: {name:?}: must be {what}")
    })
}

/// Checks what the real server validates in every object's metadata.
pub(super) fn validate_meta(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let name = meta_str(obj, "name");
    let mut causes = Vec::new();
    if let Some(c) = check_name(rt.name_rule, name) {
        causes.push(c);
    }
    let empty = Map::new();
    let m = meta(obj).unwrap_or(&empty);
    match m.get("labels") {
        None | Some(Value::Null) => {}
        Some(Value::Object(labels)) => {
            for (k, v) in labels {
                let key_ok = match k.rsplit_once('/') {
                    Some((prefix, n)) => is_dns_subdomain(prefix) && is_label_name(n),
                    None => is_label_name(k),
                };
                if !key_ok {
                    causes.push(format!(
                        "metadata.labels: Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
                    ));
                }
                match v.as_str() {
                    Some(s) if s.is_empty() || is_label_name(s) => {}
                    _ => causes.push(format!(
                        "metadata.labels: Invalid value: {v}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
                    )),
                }
            }
        }
        Some(_) => causes.push("metadata.labels: Invalid value: must be a map of strings".into()),
    }
    match m.get("annotations") {
        None | Some(Value::Null) => {}
        Some(Value::Object(a)) => {
            if a.values().any(|v| !v.is_string()) {
                causes.push("metadata.annotations: Invalid value: must be a map of strings".into());
            }
            let size: usize = a
                .iter()
                .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                .sum();
            if size > 256 * 1024 {
                causes
                    .push("metadata.annotations: Too long: must have at most 262144 bytes".into());
            }
        }
        Some(_) => {
            causes.push("metadata.annotations: Invalid value: must be a map of strings".into())
        }
    }
    match m.get("finalizers") {
        None | Some(Value::Null) => {}
        Some(Value::Array(f)) if f.iter().all(Value::is_string) => {}
        Some(_) => {
            causes.push("metadata.finalizers: Invalid value: must be a list of strings".into())
        }
    }
    match m.get("ownerReferences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(refs)) => {
            let mut controllers = 0;
            for (i, r) in refs.iter().enumerate() {
                for f in ["apiVersion", "kind", "name", "uid"] {
                    if r.get(f).and_then(Value::as_str).unwrap_or("").is_empty() {
                        causes.push(format!("metadata.ownerReferences[{i}].{f}: Required value"));
                    }
                }
                if r.get("controller").and_then(Value::as_bool) == Some(true) {
                    controllers += 1;
                }
            }
            if controllers > 1 {
                causes.push("metadata.ownerReferences: Invalid value: Only one reference can have Controller set to true".into());
            }
        }
        Some(_) => causes.push("metadata.ownerReferences: Invalid value: must be a list".into()),
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&rt.group, &rt.kind, name, &causes))
    }
}

/// Whether anything outside `metadata` (and `status`, for types with a status subresource)
/// differs: the rule for bumping `metadata.generation`.
pub(super) fn spec_changed(rt: &ResourceType, old: &Value, new: &Value) -> bool {
    // Compared in place: the objects may be large, and copying them costs more than the check.
    fn fields<'a>(rt: &ResourceType, v: &'a Value) -> Vec<(&'a String, &'a Value)> {
        v.as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| match k.as_str() {
                "metadata" | "apiVersion" | "kind" => false,
                "status" => !rt.status,
                _ => true,
            })
            .collect()
    }
    fields(rt, old) != fields(rt, new)
}

impl Store {
    /// Checks an incoming object's type against the addressed resource and stamps it.
    pub(super) fn check_type(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
        let Value::Object(m) = obj else {
            return Err(ApiError::bad_request(format!(
                "Object '{}' is not a JSON object",
                rt.kind
            )));
        };
        let kind = m.get("kind").and_then(Value::as_str).unwrap_or("");
        if !kind.is_empty() && kind != rt.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                rt.kind
            )));
        }
        let av = m.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        if !av.is_empty() && crate::resources::split_api_version(av).0 != rt.group {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
        if m.get("metadata")
            .is_some_and(|v| !v.is_object() && !v.is_null())
        {
            return Err(ApiError::bad_request("metadata must be an object"));
        }
        m.insert("apiVersion".into(), json!(rt.api_version()));
        m.insert("kind".into(), json!(rt.kind));
        Ok(())
    }

    /// Fills in a namespaced object's namespace from the path, or refuses a mismatch.
    pub(super) fn check_namespace(
        rt: &ResourceType,
        ns: Option<&str>,
        obj: &mut Value,
    ) -> Result<(), ApiError> {
        let body_ns = meta_str(obj, "namespace").to_string();
        if rt.namespaced {
            let ns = ns.filter(|n| !n.is_empty()).ok_or_else(|| {
                ApiError::method_not_allowed(format!(
                    "{} must be written in a namespace",
                    rt.plural
                ))
            })?;
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta_mut(obj).insert("namespace".into(), json!(ns));
        } else {
            meta_mut(obj).remove("namespace");
        }
        Ok(())
    }

    /// Per-kind normalisation the real server (or its controllers) performs on every write.
    pub(super) fn normalize_kind(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "secrets") => {
                if let Some(Value::Object(sd)) =
                    obj.as_object_mut().and_then(|m| m.remove("stringData"))
                {
                    let mut data = obj
                        .get("data")
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default();
                    for (k, v) in sd {
                        let s = v.as_str().unwrap_or_default();
                        data.insert(k, json!(util::base64_encode(s.as_bytes())));
                    }
                    obj["data"] = Value::Object(data);
                }
            }
            ("", "namespaces") => {
                let phase = if meta_str(obj, "deletionTimestamp").is_empty() {
                    "Active"
                } else {
                    "Terminating"
                };
                if !obj.get("status").is_some_and(Value::is_object) {
                    obj["status"] = json!({});
                }
                obj["status"]["phase"] = json!(phase);
            }
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                let types = types_from_crd(obj)?;
                let storage = obj
                    .pointer("/spec/versions")
                    .and_then(Value::as_array)
                    .and_then(|vs| {
                        vs.iter()
                            .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                    })
                    .and_then(|v| v.get("name"))
                    .cloned()
                    .unwrap_or(Value::Null);
                let mut stored: Vec<Value> = obj
                    .pointer("/status/storedVersions")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                if !stored.contains(&storage) {
                    stored.push(storage);
                }
                let since = json!(meta_str(obj, "creationTimestamp"));
                let mut conditions = vec![
                    json!({"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": since}),
                    json!({"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": since}),
                ];
                if !meta_str(obj, "deletionTimestamp").is_empty() {
                    conditions.push(json!({"type": "Terminating", "status": "True", "reason": "InstanceDeletionInProgress", "message": "CustomResource deletion is in progress", "lastTransitionTime": since}));
                }
                let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
                let mut accepted = names;
                if let Some(t) = types.first() {
                    accepted["singular"] = json!(t.singular);
                    accepted["listKind"] = json!(t.list_kind);
                }
                obj["status"] = json!({
                    "acceptedNames": accepted,
                    "conditions": conditions,
                    "storedVersions": stored,
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// Prunes, defaults and validates a custom resource against its version's schema and
    /// CEL rules (transition rules against `old`). Unknown fields are refused under
    /// `Strict` (400, before any validation, as the decoder refuses them) and otherwise
    /// dropped; under `Warn` their warnings are returned.
    pub(super) fn check_schema(
        rt: &ResourceType,
        obj: &mut Value,
        old: Option<&Value>,
        field_validation: FieldValidation,
    ) -> Result<Vec<String>, ApiError> {
        let Some(schema) = &rt.schema else {
            return Ok(Vec::new());
        };
        let checked = crate::schema::check(schema, obj);
        let unknown: Vec<String> = checked
            .unknown
            .iter()
            .map(|u| format!("unknown field \"{u}\""))
            .collect();
        if field_validation == FieldValidation::Strict && !unknown.is_empty() {
            return Err(ApiError::bad_request(format!(
                "strict decoding error: {}",
                unknown.join(", ")
            )));
        }
        let mut causes = checked.errors;
        // The real server skips CEL when the object does not even have the declared types.
        if !causes.iter().any(|c| c.contains("in body must be of type")) {
            causes.extend(crate::cel::check_rules(schema, obj, old));
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(
                &rt.group,
                &rt.kind,
                meta_str(obj, "name"),
                &causes,
            ));
        }
        Ok(if field_validation == FieldValidation::Warn {
            unknown
        } else {
            Vec::new()
        })
    }

    pub(super) fn check_preconditions(
        rt: &ResourceType,
        old: &Value,
        rv: &str,
        uid: &str,
    ) -> Result<(), ApiError> {
        let name = meta_str(old, "name");
        if !rv.is_empty() && rv != meta_str(old, "resourceVersion") {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        if !uid.is_empty() && uid != meta_str(old, "uid") {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(old, "uid")
                ),
            ));
        }
        Ok(())
    }

    /// The name and namespace in a body must agree with the URL.
    pub(super) fn check_identity(t: &Target, obj: &mut Value) -> Result<(), ApiError> {
        let body_name = meta_str(obj, "name").to_string();
        if body_name.is_empty() {
            meta_mut(obj).insert("name".into(), json!(t.name));
        } else if body_name != t.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                t.name
            )));
        }
        Self::check_namespace(&t.rt, t.namespace.as_deref(), obj)
    }
}
