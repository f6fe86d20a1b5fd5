//! The parts of a CRD's structural `openAPIV3Schema` the real server enforces on every write
//! of a custom resource: pruning of unknown fields (reported, for `fieldValidation`), dropping
//! of non-nullable nulls, defaulting, and validation of type, required, enum, bounds, lengths,
//! item and property counts, `pattern` and `format: date-time`. CEL rules
//! (`x-kubernetes-validations`) are in `cel.rs`.
//! Not covered: other formats, `allOf`/`anyOf`/`oneOf`/`not` and list-type uniqueness.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use regex::Regex;
use serde_json::{Map, Value};

/// What pruning, defaulting and validation found.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    /// Validation errors as `path: message` strings, in the real server's words.
    pub errors: Vec<String>,
    /// Paths of the unknown fields that were pruned (`spec.foo`, `spec.map[key].bar`).
    pub unknown: Vec<String>,
}

/// Prunes and defaults `obj` in place according to the root `schema`, then validates it.
/// Returns the validation errors as `path: message` strings (empty when valid).
#[cfg(test)]
pub(crate) fn prune_default_validate(schema: &Value, obj: &mut Value) -> Vec<String> {
    check(schema, obj).errors
}

/// Prunes and defaults `obj` in place according to the root `schema`, then validates it.
pub(crate) fn check(schema: &Value, obj: &mut Value) -> Checked {
    let Value::Object(root) = obj else {
        return Checked {
            errors: vec!["<root>: Invalid value: must be an object".into()],
            unknown: Vec::new(),
        };
    };
    let mut unknown = Vec::new();
    let props = schema.get("properties").and_then(Value::as_object);
    let preserve = preserves_unknown(schema);
    // apiVersion, kind and metadata are the server's business, never pruned here.
    let keys: Vec<String> = root.keys().cloned().collect();
    for k in keys {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let drop = match props.and_then(|p| p.get(&k)) {
            Some(s) => root.get(&k).is_some_and(Value::is_null) && !nullable(s),
            None => {
                if !preserve {
                    unknown.push(k.clone());
                }
                !preserve
            }
        };
        if drop {
            root.remove(&k);
        }
    }
    apply_defaults(schema, root);
    let mut errors = Vec::new();
    for (k, s) in props.into_iter().flatten() {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(v) = root.get_mut(k) {
            walk(s, v, k, &mut errors, &mut unknown);
        }
    }
    check_required(schema, root, "", &mut errors);
    Checked { errors, unknown }
}

/// A compiled `pattern`, cached (schemas are re-read on every write).
fn pattern(p: &str) -> Option<Regex> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Regex>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry(p.to_string())
        .or_insert_with(|| Regex::new(p).ok())
        .clone()
}

/// RFC 3339 `date-time`, as the server's `format` check reads it.
fn is_date_time(s: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$",
        )
        .ok()
    })
    .as_ref()
    .is_none_or(|re| re.is_match(s))
}

/// `path[key]`, the real server's path of a map entry.
fn key_path(path: &str, key: &str) -> String {
    format!("{path}[{key}]")
}

fn preserves_unknown(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

fn nullable(schema: &Value) -> bool {
    schema.get("nullable").and_then(Value::as_bool) == Some(true)
}

fn apply_defaults(schema: &Value, m: &mut Map<String, Value>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            if !m.contains_key(k)
                && let Some(d) = s.get("default")
            {
                m.insert(k.clone(), d.clone());
            }
        }
    }
}

fn check_required(schema: &Value, m: &Map<String, Value>, path: &str, errors: &mut Vec<String>) {
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let metadata_at_root = path.is_empty() && r == "metadata";
        if !m.contains_key(r) && !metadata_at_root {
            errors.push(format!("{}: Required value", join(path, r)));
        }
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Prunes, defaults and validates one value against its schema.
fn walk(
    schema: &Value,
    v: &mut Value,
    path: &str,
    errors: &mut Vec<String>,
    unknown: &mut Vec<String>,
) {
    if v.is_null() {
        if !nullable(schema) {
            errors.push(format!(
                "{path}: Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                schema
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("object")
            ));
        }
        return;
    }
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true);
    let want = schema.get("type").and_then(Value::as_str);
    let got = type_name(v);
    let type_ok = if int_or_string {
        got == "integer" || got == "string"
    } else {
        match want {
            None => true,
            Some("number") => got == "number" || got == "integer",
            Some(t) => t == got,
        }
    };
    if !type_ok {
        let expected = if int_or_string {
            "integer,string"
        } else {
            want.unwrap_or("")
        };
        errors.push(format!(
            "{path}: Invalid value: \"{got}\": {path} in body must be of type {expected}: \"{got}\""
        ));
        return;
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        let list: Vec<String> = options.iter().map(Value::to_string).collect();
        errors.push(format!(
            "{path}: Unsupported value: {v}: supported values: {}",
            list.join(", ")
        ));
    }
    check_bounds(schema, v, path, errors);
    if let Value::String(s) = &*v {
        if let Some(p) = schema.get("pattern").and_then(Value::as_str)
            && pattern(p).is_some_and(|re| !re.is_match(s))
        {
            errors.push(format!(
                "{path}: Invalid value: {v}: {path} in body should match '{p}'"
            ));
        }
        if schema.get("format").and_then(Value::as_str) == Some("date-time") && !is_date_time(s) {
            errors.push(format!(
                "{path}: Invalid value: {v}: {path} in body must be of type date-time: {v}"
            ));
        }
    }
    match v {
        Value::Object(m) => {
            if schema
                .get("x-kubernetes-embedded-resource")
                .and_then(Value::as_bool)
                == Some(true)
            {
                // An embedded object keeps its type and metadata whatever the schema says.
                for k in ["apiVersion", "kind", "metadata"] {
                    if let Some(x) = m.get(k)
                        && x.is_null()
                    {
                        m.remove(k);
                    }
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let preserve = preserves_unknown(schema)
                || schema.get("additionalProperties").and_then(Value::as_bool) == Some(true);
            let embedded = schema
                .get("x-kubernetes-embedded-resource")
                .and_then(Value::as_bool)
                == Some(true);
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let child_schema = props.and_then(|p| p.get(&k)).or(additional);
                match child_schema {
                    Some(s) => {
                        if m.get(&k).is_some_and(Value::is_null) && !nullable(s) {
                            m.remove(&k);
                        }
                    }
                    None => {
                        let keep = preserve
                            || (embedded
                                && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
                        if !keep {
                            unknown.push(join(path, &k));
                            m.remove(&k);
                        }
                    }
                }
            }
            apply_defaults(schema, m);
            for (k, child) in m.iter_mut() {
                if let Some(s) = props.and_then(|p| p.get(k)) {
                    walk(s, child, &join(path, k), errors, unknown);
                } else if let Some(s) = additional {
                    walk(s, child, &key_path(path, k), errors, unknown);
                }
            }
            check_required(schema, m, path, errors);
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(s, item, &format!("{path}[{i}]"), errors, unknown);
                }
            }
        }
        _ => {}
    }
}

fn check_bounds(schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    let flag = |k: &str| schema.get(k).and_then(Value::as_bool) == Some(true);
    if let Some(x) = v.as_f64() {
        if let Some(min) = num("minimum") {
            let bad = if flag("exclusiveMinimum") {
                x <= min
            } else {
                x < min
            };
            if bad {
                errors.push(format!(
                    "{path}: Invalid value: {v}: {path} in body should be greater than or equal to {min}"
                ));
            }
        }
        if let Some(max) = num("maximum") {
            let bad = if flag("exclusiveMaximum") {
                x >= max
            } else {
                x > max
            };
            if bad {
                errors.push(format!(
                    "{path}: Invalid value: {v}: {path} in body should be less than or equal to {max}"
                ));
            }
        }
    }
    let count = |k: &str| schema.get(k).and_then(Value::as_u64);
    // (length, unit of min/max messages, "at least" wording)
    let (len, what) = match v {
        Value::String(s) => (Some(s.chars().count() as u64), "Length"),
        Value::Array(a) => (Some(a.len() as u64), "Items"),
        Value::Object(m) => (Some(m.len() as u64), "Properties"),
        _ => (None, ""),
    };
    let Some(len) = len else { return };
    if let Some(min) = count(&format!("min{what}"))
        && len < min
    {
        errors.push(match what {
            "Length" => format!(
                "{path}: Invalid value: {v}: {path} in body should be at least {min} chars long"
            ),
            "Items" => format!(
                "{path}: Invalid value: {len}: {path} in body should have at least {min} items"
            ),
            _ => format!(
                "{path}: Invalid value: {len}: {path} in body should have at least {min} properties"
            ),
        });
    }
    if let Some(max) = count(&format!("max{what}"))
        && len > max
    {
        errors.push(match what {
            "Length" => format!("{path}: Too long: may not be more than {max} bytes"),
            _ => format!("{path}: Too many: {len}: must have at most {max} items"),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 1, "maximum": 10},
                        "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                        "port": {"x-kubernetes-int-or-string": true},
                        "opt": {"type": "string", "nullable": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}}
                    }
                },
                "status": {"type": "object", "properties": {"n": {"type": "integer"}}}
            }
        })
    }

    #[test]
    fn prunes_and_defaults() {
        let mut o = json!({
            "apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "anything": 1},
            "spec": {"size": 3, "unknown": 1, "free": {"deep": {"x": 1}}, "port": "http", "opt": null, "labels": {"a": "b"}},
            "status": {"n": 1, "junk": true},
            "extra": 5
        });
        let errs = prune_default_validate(&schema(), &mut o);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(
            o,
            json!({
                "apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "anything": 1},
                "spec": {"size": 3, "mode": "a", "free": {"deep": {"x": 1}}, "port": "http", "opt": null, "labels": {"a": "b"}},
                "status": {"n": 1}
            })
        );
    }

    #[test]
    fn reports_errors() {
        let mut o =
            json!({"spec": {"size": 11, "mode": "c", "tags": ["a", "b", "c"], "port": 1.5}});
        let errs = prune_default_validate(&schema(), &mut o);
        assert_eq!(errs.len(), 4, "{errs:?}");
        let mut o = json!({"spec": {"size": "big"}, "status": null});
        let errs = prune_default_validate(&schema(), &mut o);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(o.get("status").is_none(), "non-nullable null is dropped");
        let mut o = json!({"spec": {}});
        let errs = prune_default_validate(&schema(), &mut o);
        assert_eq!(errs, vec!["spec.size: Required value".to_string()]);
    }

    #[test]
    fn patterns_formats_and_unknown_fields() {
        let schema = json!({
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
                "at": {"type": "string", "format": "date-time"},
                "m": {"type": "object", "maxProperties": 1,
                      "additionalProperties": {"type": "object", "properties": {"x": {"type": "string"}}}}
            }}}
        });
        let mut o =
            json!({"spec": {"name": "abc", "at": "2026-01-02T03:04:05Z", "m": {"k": {"x": "1"}}}});
        let c = check(&schema, &mut o);
        assert!(c.errors.is_empty() && c.unknown.is_empty(), "{c:?}");
        let mut o = json!({"spec": {"name": "Abcdef", "at": "yesterday", "m": {"k": {"y": 1}, "l": {}}, "z": 1}});
        let c = check(&schema, &mut o);
        assert_eq!(
            c.errors,
            vec![
                "spec.at: Invalid value: \"yesterday\": spec.at in body must be of type date-time: \"yesterday\"",
                "spec.m: Too many: 2: must have at most 1 items",
                "spec.name: Too long: may not be more than 5 bytes",
                "spec.name: Invalid value: \"Abcdef\": spec.name in body should match '^[a-z]+$'",
            ]
        );
        assert_eq!(c.unknown, vec!["spec.z", "spec.m[k].y"]);
        assert_eq!(o["spec"]["m"]["k"], json!({}));
    }
}
