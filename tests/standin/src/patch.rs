//! Patch formats: JSON merge patch (RFC 7386), a simplified strategic merge patch,
//! JSON patch (RFC 6902) and the field-path bookkeeping server-side apply needs.

use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// The patch content types the server understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    Merge,
    Strategic,
    Json,
    Apply,
}

impl PatchKind {
    /// Maps a `Content-Type` to a patch kind (parameters such as `; charset=utf-8` are ignored).
    pub(crate) fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchKind::Apply)
            }
            _ => None,
        }
    }
}

/// RFC 7386: objects merge recursively, `null` deletes, everything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// A simplified strategic merge patch. Like a merge patch, except:
/// - lists of objects merge by key — `uid` for `ownerReferences`, `type` for `conditions`,
///   otherwise `name` when every element has one (containers, volumes, env, named ports);
///   a patch element carrying `"$patch": "delete"` removes the matching element;
/// - `metadata.finalizers` merges as a set, and `$deleteFromPrimitiveList/finalizers`
///   removes entries, as the real server's `patchStrategy=merge` on that field does.
///
/// Other directives (`$retainKeys`, `$setElementOrder`, `$patch: replace`) and other merge
/// keys (`containerPort`, `port`, ...) are not understood: such lists are replaced.
pub(crate) fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    smp_at(target, patch, 0, "");
}

/// The merge key of a list field, if its elements (and the existing ones) all carry it.
fn merge_key(field: &str, patch_items: &[Value], existing: &[Value]) -> Option<&'static str> {
    let key = match field {
        "ownerReferences" => "uid",
        "conditions" => "type",
        _ => "name",
    };
    let keyed = |items: &[Value]| {
        items
            .iter()
            .all(|i| i.get(key).is_some_and(Value::is_string))
    };
    (!patch_items.is_empty() && keyed(patch_items) && keyed(existing)).then_some(key)
}

fn is_delete_directive(item: &Value) -> bool {
    item.get("$patch").and_then(Value::as_str) == Some("delete")
}

/// Strips directives from a fresh element (nothing to merge it with).
fn fresh_element(item: &Value) -> Value {
    let mut fresh = Value::Object(Map::new());
    smp_at(&mut fresh, item, usize::MAX, "");
    fresh
}

fn smp_at(target: &mut Value, patch: &Value, depth: usize, parent: &str) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    let in_metadata = depth == 1 && parent == "metadata";
    let mut deletions = Vec::new();
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            deletions.push((field.to_string(), v.clone()));
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Array(items) if in_metadata && k == "finalizers" => {
                let mut merged = t
                    .get(k)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for i in items {
                    if !merged.contains(i) {
                        merged.push(i.clone());
                    }
                }
                t.insert(k.clone(), Value::Array(merged));
            }
            Value::Array(items) => {
                let existing = t.get(k).and_then(Value::as_array).cloned();
                match existing
                    .as_deref()
                    .and_then(|e| merge_key(k, items, e).map(|key| (e, key)))
                {
                    Some((existing, key)) => {
                        let mut merged = existing.to_vec();
                        for item in items {
                            let id = item.get(key);
                            let pos = merged.iter().position(|e| e.get(key) == id);
                            match (pos, is_delete_directive(item)) {
                                (Some(i), true) => {
                                    merged.remove(i);
                                }
                                (Some(i), false) => {
                                    smp_at(&mut merged[i], item, depth.saturating_add(1), k)
                                }
                                (None, true) => {}
                                (None, false) => merged.push(fresh_element(item)),
                            }
                        }
                        t.insert(k.clone(), Value::Array(merged));
                    }
                    None => {
                        let cleaned = items
                            .iter()
                            .filter(|i| !is_delete_directive(i))
                            .map(|i| {
                                if i.is_object() {
                                    fresh_element(i)
                                } else {
                                    i.clone()
                                }
                            })
                            .collect();
                        t.insert(k.clone(), Value::Array(cleaned));
                    }
                }
            }
            Value::Object(_) => {
                smp_at(
                    t.entry(k.clone()).or_insert(Value::Null),
                    v,
                    depth.saturating_add(1),
                    k,
                );
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
    for (field, values) in deletions {
        if let (Some(Value::Array(list)), Some(drop)) = (t.get_mut(&field), values.as_array()) {
            list.retain(|x| !drop.contains(x));
        }
    }
}

/// Why a JSON patch could not be applied.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum JsonPatchError {
    /// The patch document itself is malformed (answered with 400).
    Malformed(String),
    /// An operation failed against the object, including a failed `test` (answered with 422).
    Failed(String),
}

/// Decodes one RFC 6901 pointer into its tokens.
fn pointer_tokens(ptr: &str) -> Result<Vec<String>, JsonPatchError> {
    if ptr.is_empty() {
        return Ok(Vec::new());
    }
    let rest = ptr
        .strip_prefix('/')
        .ok_or_else(|| JsonPatchError::Malformed(format!("invalid JSON pointer {ptr:?}")))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn array_index(tok: &str, len: usize, allow_end: bool) -> Result<usize, JsonPatchError> {
    if allow_end && tok == "-" {
        return Ok(len);
    }
    if tok.is_empty() || (tok.len() > 1 && tok.starts_with('0')) {
        return Err(JsonPatchError::Failed(format!(
            "invalid array index {tok:?}"
        )));
    }
    let i: usize = tok
        .parse()
        .map_err(|_| JsonPatchError::Failed(format!("invalid array index {tok:?}")))?;
    let limit = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if i > limit || (!allow_end && len == 0) {
        return Err(JsonPatchError::Failed(format!(
            "array index {i} out of bounds (length {len})"
        )));
    }
    Ok(i)
}

fn resolve<'a>(doc: &'a Value, toks: &[String]) -> Option<&'a Value> {
    toks.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

fn resolve_mut<'a>(doc: &'a mut Value, toks: &[String]) -> Option<&'a mut Value> {
    toks.iter().try_fold(doc, |cur, t| match cur {
        Value::Object(m) => m.get_mut(t),
        Value::Array(a) => t.parse::<usize>().ok().and_then(move |i| a.get_mut(i)),
        _ => None,
    })
}

fn op_add(doc: &mut Value, toks: &[String], value: Value) -> Result<(), JsonPatchError> {
    let Some((last, parent)) = toks.split_last() else {
        *doc = value;
        return Ok(());
    };
    let path = || format!("/{}", toks.join("/"));
    match resolve_mut(doc, parent) {
        Some(Value::Object(m)) => {
            m.insert(last.clone(), value);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = array_index(last, a.len(), true)?;
            a.insert(i, value);
            Ok(())
        }
        _ => Err(JsonPatchError::Failed(format!(
            "add operation does not apply: doc is missing path: {}",
            path()
        ))),
    }
}

fn op_remove(doc: &mut Value, toks: &[String]) -> Result<Value, JsonPatchError> {
    let path = || format!("/{}", toks.join("/"));
    let Some((last, parent)) = toks.split_last() else {
        return Ok(std::mem::replace(doc, Value::Null));
    };
    match resolve_mut(doc, parent) {
        Some(Value::Object(m)) => m.remove(last).ok_or_else(|| {
            JsonPatchError::Failed(format!(
                "remove operation does not apply: doc is missing path: {}",
                path()
            ))
        }),
        Some(Value::Array(a)) => {
            let i = array_index(last, a.len(), false)?;
            Ok(a.remove(i))
        }
        _ => Err(JsonPatchError::Failed(format!(
            "remove operation does not apply: doc is missing path: {}",
            path()
        ))),
    }
}

/// Applies an RFC 6902 patch to `doc` atomically: on error `doc` is left unchanged.
///
/// Like the evanphx/json-patch library the real server uses, `test` with a `null` value
/// succeeds against a missing path — kube's finalizer helper relies on this when it adds the
/// first finalizer to an object that has none.
pub(crate) fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), JsonPatchError> {
    let ops = patch
        .as_array()
        .ok_or_else(|| JsonPatchError::Malformed("a JSON patch must be an array".into()))?;
    let mut work = doc.clone();
    for op in ops {
        let kind = op
            .get("op")
            .and_then(Value::as_str)
            .ok_or_else(|| JsonPatchError::Malformed("operation without \"op\"".into()))?;
        let path = op.get("path").and_then(Value::as_str).ok_or_else(|| {
            JsonPatchError::Malformed(format!("{kind} operation without \"path\""))
        })?;
        let toks = pointer_tokens(path)?;
        let value = || {
            op.get("value").cloned().ok_or_else(|| {
                JsonPatchError::Malformed(format!("{kind} operation without \"value\""))
            })
        };
        let from = || -> Result<Vec<String>, JsonPatchError> {
            let f = op.get("from").and_then(Value::as_str).ok_or_else(|| {
                JsonPatchError::Malformed(format!("{kind} operation without \"from\""))
            })?;
            pointer_tokens(f)
        };
        match kind {
            "add" => op_add(&mut work, &toks, value()?)?,
            "remove" => {
                op_remove(&mut work, &toks)?;
            }
            "replace" => {
                let v = value()?;
                match resolve_mut(&mut work, &toks) {
                    Some(slot) => *slot = v,
                    None => {
                        return Err(JsonPatchError::Failed(format!(
                            "replace operation does not apply: doc is missing key: {path}"
                        )));
                    }
                }
            }
            "move" => {
                let f = from()?;
                if toks.len() > f.len() && toks[..f.len()] == f[..] {
                    return Err(JsonPatchError::Failed(
                        "move operation cannot move a value into itself".into(),
                    ));
                }
                let v = op_remove(&mut work, &f)?;
                op_add(&mut work, &toks, v)?;
            }
            "copy" => {
                let f = from()?;
                let v = resolve(&work, &f).cloned().ok_or_else(|| {
                    JsonPatchError::Failed(
                        "copy operation does not apply: missing from path".into(),
                    )
                })?;
                op_add(&mut work, &toks, v)?;
            }
            "test" => {
                let want = value()?;
                let ok = match resolve(&work, &toks) {
                    Some(got) => *got == want,
                    None => want.is_null(),
                };
                if !ok {
                    return Err(JsonPatchError::Failed(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => {
                return Err(JsonPatchError::Malformed(format!(
                    "unexpected operation {other:?}"
                )));
            }
        }
    }
    *doc = work;
    Ok(())
}

/// A path to a field owned through server-side apply: map keys, and for set-like lists the
/// element value rendered as `v:<json>`.
pub(crate) type FieldPath = Vec<String>;

/// Whether a list at `path` is treated as a set of scalars for field ownership
/// (`metadata.finalizers` is; other lists are atomic, as lists in CRD schemas are by default).
fn is_set_list(path: &[String]) -> bool {
    path.len() == 2 && path[0] == "metadata" && path[1] == "finalizers"
}

/// The leaf fields of an applied configuration: map keys are descended into, lists and
/// scalars (and empty maps) are leaves, except set-like lists whose elements are leaves.
pub(crate) fn leaf_paths(v: &Value) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    collect_leaves(v, &mut Vec::new(), &mut out);
    out
}

fn collect_leaves(v: &Value, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                prefix.push(k.clone());
                collect_leaves(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(items) if is_set_list(prefix) => {
            for item in items {
                let mut p = prefix.clone();
                p.push(format!("v:{item}"));
                out.insert(p);
            }
        }
        _ => {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
        }
    }
}

/// The value at a field path (set elements resolve to the element itself).
pub(crate) fn value_at<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = doc;
    for (i, seg) in path.iter().enumerate() {
        if let Some(elem) = seg.strip_prefix("v:")
            && is_set_list(&path[..i])
        {
            let want: Value = serde_json::from_str(elem).ok()?;
            return cur.as_array()?.iter().find(|x| **x == want);
        }
        cur = cur.as_object()?.get(seg)?;
    }
    Some(cur)
}

/// Removes the field at `path` and then any maps (or set lists) left empty above it.
pub(crate) fn remove_path(doc: &mut Value, path: &[String]) {
    fn go(cur: &mut Value, path: &[String], depth: usize, full: &[String]) -> bool {
        let Some((seg, rest)) = path.split_first() else {
            return false;
        };
        if let Some(elem) = seg.strip_prefix("v:")
            && is_set_list(&full[..depth])
        {
            if let (Ok(want), Value::Array(a)) = (serde_json::from_str::<Value>(elem), &mut *cur) {
                a.retain(|x| *x != want);
                return a.is_empty();
            }
            return false;
        }
        let Value::Object(m) = cur else { return false };
        if rest.is_empty() {
            m.remove(seg);
        } else if let Some(child) = m.get_mut(seg)
            && go(child, rest, depth + 1, full)
        {
            m.remove(seg);
        }
        m.is_empty()
    }
    go(doc, path, 0, path);
}

/// Merges an applied configuration into an object: maps merge key by key, set-like lists
/// take the union, everything else is replaced.
pub(crate) fn apply_merge(target: &mut Value, applied: &Value) {
    merge_at(target, applied, &mut Vec::new());
}

fn merge_at(target: &mut Value, applied: &Value, path: &mut FieldPath) {
    match applied {
        Value::Object(a) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in a {
                    path.push(k.clone());
                    merge_at(t.entry(k.clone()).or_insert(Value::Null), v, path);
                    path.pop();
                }
            }
        }
        Value::Array(items) if is_set_list(path) => {
            if let Value::Array(t) = target {
                for i in items {
                    if !t.contains(i) {
                        t.push(i.clone());
                    }
                }
            } else {
                *target = applied.clone();
            }
        }
        _ => *target = applied.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386_examples() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
        let mut t = json!({"a": [1, 2]});
        merge_patch(&mut t, &json!({"a": [3]}));
        assert_eq!(t, json!({"a": [3]}));
    }

    #[test]
    fn strategic_merges_finalizers_owner_refs_and_conditions() {
        let mut t = json!({
            "metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "name": "x"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}
        });
        strategic_merge_patch(
            &mut t,
            &json!({
                "metadata": {"finalizers": ["b"], "ownerReferences": [{"uid": "2", "name": "x"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}
            }),
        );
        assert_eq!(t["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            t["metadata"]["ownerReferences"].as_array().map(Vec::len),
            Some(2)
        );
        assert_eq!(
            t["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}])
        );
        strategic_merge_patch(
            &mut t,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(t["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn strategic_merges_named_lists() {
        let mut t =
            json!({"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]});
        strategic_merge_patch(
            &mut t,
            &json!({"containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}, {"name": "a", "$patch": "delete"}]}),
        );
        assert_eq!(
            t,
            json!({"containers": [{"name": "b", "image": "z"}, {"name": "c", "image": "w"}]})
        );
    }

    #[test]
    fn json_patch_ops() {
        let mut d = json!({"metadata": {"name": "x"}, "list": [1, 2]});
        json_patch(
            &mut d,
            &json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "g"},
                {"op": "replace", "path": "/list/0", "value": 9},
                {"op": "copy", "from": "/list/1", "path": "/copied"},
                {"op": "move", "from": "/copied", "path": "/moved"},
                {"op": "remove", "path": "/list/1"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": "g"}
            ]),
        )
        .unwrap();
        assert_eq!(
            d,
            json!({"metadata": {"name": "x", "finalizers": ["f", "g"]}, "list": [9], "moved": 2})
        );
        let before = d.clone();
        let err = json_patch(
            &mut d,
            &json!([
                {"op": "remove", "path": "/moved"},
                {"op": "test", "path": "/metadata/finalizers/0", "value": "nope"}
            ]),
        )
        .unwrap_err();
        assert!(matches!(err, JsonPatchError::Failed(_)));
        assert_eq!(d, before, "a failed patch changes nothing");
        assert!(matches!(
            json_patch(&mut d, &json!({"op": "add"})),
            Err(JsonPatchError::Malformed(_))
        ));
        assert!(matches!(
            json_patch(&mut d, &json!([{"op": "remove", "path": "/list/5"}])),
            Err(JsonPatchError::Failed(_))
        ));
    }

    #[test]
    fn apply_field_paths() {
        let applied = json!({"metadata": {"labels": {"a": "1"}, "finalizers": ["x", "y"]}, "spec": {"n": 1, "l": [1, 2], "e": {}}});
        let paths = leaf_paths(&applied);
        let s = |p: &[&str]| p.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(paths.contains(&s(&["metadata", "labels", "a"])));
        assert!(paths.contains(&s(&["metadata", "finalizers", "v:\"x\""])));
        assert!(paths.contains(&s(&["spec", "l"])));
        assert!(paths.contains(&s(&["spec", "e"])));
        let mut doc =
            json!({"metadata": {"labels": {"a": "1"}, "finalizers": ["x", "z"]}, "spec": {"n": 1}});
        assert_eq!(
            value_at(&doc, &s(&["metadata", "finalizers", "v:\"x\""])),
            Some(&json!("x"))
        );
        remove_path(&mut doc, &s(&["metadata", "labels", "a"]));
        remove_path(&mut doc, &s(&["metadata", "finalizers", "v:\"x\""]));
        remove_path(&mut doc, &s(&["spec", "n"]));
        assert_eq!(doc, json!({"metadata": {"finalizers": ["z"]}}));
        apply_merge(
            &mut doc,
            &json!({"metadata": {"finalizers": ["z", "w"]}, "spec": {"l": [3]}}),
        );
        assert_eq!(
            doc,
            json!({"metadata": {"finalizers": ["z", "w"]}, "spec": {"l": [3]}})
        );
    }
}
