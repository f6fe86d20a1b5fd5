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
    root.retain(|k, v| {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            return true;
        }
        match props.and_then(|p| p.get(k)) {
            Some(s) => !(v.is_null() && !nullable(s)),
            None => {
                if !preserve {
                    unknown.push(k.clone());
                }
                preserve
            }
        }
    });
    apply_defaults(schema, root);
    let mut errors = Vec::new();
    for (k, s) in props.into_iter().flatten() {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(v) = root.get_mut(k) {
            walk(
                s,
                v,
                &Path::Field(&Path::Root, k),
                &mut errors,
                &mut unknown,
            );
        }
    }
    check_required(schema, root, &Path::Root, &mut errors);
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

/// Where a value sits in the object, as the real server prints it: `spec.size`,
/// `spec.map[key]`, `spec.list[0]`. Kept as a chain of borrows and only turned into text
/// for an error or an unknown field, so that valid objects cost no path strings.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    /// A property (`parent.name`, or just `name` at the root).
    Field(&'a Path<'a>, &'a str),
    /// A map entry (`parent[key]`).
    Key(&'a Path<'a>, &'a str),
    /// A list item (`parent[i]`).
    Index(&'a Path<'a>, usize),
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Field(Path::Root, k) => f.write_str(k),
            Path::Field(p, k) => write!(f, "{p}.{k}"),
            Path::Key(p, k) => write!(f, "{p}[{k}]"),
            Path::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
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

fn check_required(schema: &Value, m: &Map<String, Value>, path: &Path, errors: &mut Vec<String>) {
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let metadata_at_root = matches!(path, Path::Root) && r == "metadata";
        if !m.contains_key(r) && !metadata_at_root {
            errors.push(format!("{}: Required value", Path::Field(path, r)));
        }
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
    path: &Path,
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
            m.retain(|k, v| match props.and_then(|p| p.get(k)).or(additional) {
                Some(s) => !(v.is_null() && !nullable(s)),
                None => {
                    let keep = preserve
                        || (embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
                    if !keep {
                        unknown.push(Path::Field(path, k).to_string());
                    }
                    keep
                }
            });
            apply_defaults(schema, m);
            for (k, child) in m.iter_mut() {
                if let Some(s) = props.and_then(|p| p.get(k)) {
                    walk(s, child, &Path::Field(path, k), errors, unknown);
                } else if let Some(s) = additional {
                    walk(s, child, &Path::Key(path, k), errors, unknown);
                }
            }
            check_required(schema, m, path, errors);
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(s, item, &Path::Index(path, i), errors, unknown);
                }
            }
        }
        _ => {}
    }
}

fn check_bounds(schema: &Value, v: &Value, path: &Path, errors: &mut Vec<String>) {
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
    // (length, unit of min/max messages, the keywords bounding it)
    let (len, what, min_key, max_key) = match v {
        Value::String(s) => (s.chars().count() as u64, "Length", "minLength", "maxLength"),
        Value::Array(a) => (a.len() as u64, "Items", "minItems", "maxItems"),
        Value::Object(m) => (
            m.len() as u64,
            "Properties",
            "minProperties",
            "maxProperties",
        ),
        _ => return,
    };
    if let Some(min) = count(min_key)
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
    if let Some(max) = count(max_key)
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
