//! The parts of a CRD's structural `openAPIV3Schema` the real server enforces on every write
//! of a custom resource: pruning of unknown fields, dropping of non-nullable nulls,
//! defaulting, and validation of type, required, enum, bounds, lengths and item counts.
//! Not covered: `pattern`, `format`, `allOf`/`anyOf`/`oneOf`/`not`, CEL
//! (`x-kubernetes-validations`) and list-type uniqueness.

use serde_json::{Map, Value};

/// Prunes and defaults `obj` in place according to the root `schema`, then validates it.
/// Returns the validation errors as `path: message` strings (empty when valid).
pub(crate) fn prune_default_validate(schema: &Value, obj: &mut Value) -> Vec<String> {
    let Value::Object(root) = obj else {
        return vec!["<root>: Invalid value: must be an object".into()];
    };
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
            None => !preserve,
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
            walk(s, v, k, &mut errors);
        }
    }
    check_required(schema, root, "", &mut errors);
    errors
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
fn walk(schema: &Value, v: &mut Value, path: &str, errors: &mut Vec<String>) {
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
                            m.remove(&k);
                        }
                    }
                }
            }
            apply_defaults(schema, m);
            for (k, child) in m.iter_mut() {
                if let Some(s) = props.and_then(|p| p.get(k)).or(additional) {
                    walk(s, child, &join(path, k), errors);
                }
            }
            check_required(schema, m, path, errors);
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(s, item, &format!("{path}[{i}]"), errors);
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
    let (len, what) = match v {
        Value::String(s) => (Some(s.chars().count() as u64), "Length"),
        Value::Array(a) => (Some(a.len() as u64), "Items"),
        Value::Object(m) => (Some(m.len() as u64), "Properties"),
        _ => (None, ""),
    };
    if let Some(len) = len {
        if let Some(min) = count(&format!("min{what}"))
            && len < min
        {
            errors.push(format!(
                "{path}: Invalid value: {len}: {path} in body should have at least {min} {}",
                what.to_lowercase()
            ));
        }
        if let Some(max) = count(&format!("max{what}"))
            && len > max
        {
            errors.push(format!(
                "{path}: Too long: may not be more than {max} {}",
                what.to_lowercase()
            ));
        }
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
}
