//! The part of JSON Schema `values.schema.json` uses (type, properties, additionalProperties,
//! items, enum, minimum, maximum, minLength, maxLength, pattern, required): enough to check the
//! values files as `helm install` would.

use std::collections::BTreeSet;

use serde_json::Value;

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "null" => v.is_null(),
        _ => false,
    }
}

fn walk(schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
    let here = if path.is_empty() { "(root)" } else { path };
    if let Some(t) = schema.get("type") {
        let ok = match t {
            Value::String(t) => type_ok(t, v),
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).any(|t| type_ok(t, v)),
            _ => true,
        };
        if !ok {
            errors.push(format!("{here}: {v} is not of type {t}"));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        errors.push(format!("{here}: {v} is not one of {allowed:?}"));
    }
    if let Some(n) = v.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
            && n < min
        {
            errors.push(format!("{here}: {n} is below the minimum {min}"));
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
            && n > max
        {
            errors.push(format!("{here}: {n} is above the maximum {max}"));
        }
    }
    if let Some(s) = v.as_str() {
        let len = s.chars().count() as u64;
        if schema
            .get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| len < m)
        {
            errors.push(format!("{here}: {s:?} is too short"));
        }
        if schema
            .get("maxLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| len > m)
        {
            errors.push(format!("{here}: {s:?} is too long"));
        }
        if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
            let re = regex::Regex::new(p).unwrap_or_else(|e| panic!("{here}: pattern {p}: {e}"));
            if !re.is_match(s) {
                errors.push(format!("{here}: {s:?} does not match {p}"));
            }
        }
    }
    if let Some(items) = schema.get("items")
        && let Some(list) = v.as_array()
    {
        for (i, x) in list.iter().enumerate() {
            walk(items, x, &format!("{path}[{i}]"), errors);
        }
    }
    if let Some(map) = v.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        for required in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(k) = required.as_str()
                && !map.contains_key(k)
            {
                errors.push(format!("{here}: {k} is required"));
            }
        }
        for (k, x) in map {
            let at = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            match props.and_then(|p| p.get(k)) {
                Some(s) => walk(s, x, &at, errors),
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        errors.push(format!("{at}: not a value of this chart"))
                    }
                    Some(s @ Value::Object(_)) => walk(s, x, &at, errors),
                    _ => {}
                },
            }
        }
    }
}

/// Every violation, one per line.
pub fn validate(schema: &Value, values: &Value) -> Result<(), String> {
    let mut errors = Vec::new();
    walk(schema, values, "", &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// The dotted paths of a values file's settings: nested maps are walked, anything else (a
/// scalar, a list, an empty map) is one setting.
pub fn leaves(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    match v.as_object() {
        Some(map) if !map.is_empty() && !free_form(path) => {
            for (k, x) in map {
                let at = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                leaves(x, &at, out);
            }
        }
        _ => {
            out.insert(path.to_string());
        }
    }
}

/// Values whose content is Kubernetes' own (passed through as they are).
fn free_form(path: &str) -> bool {
    matches!(
        path,
        "resources" | "affinity" | "nodeSelector" | "podAnnotations" | "podLabels"
    ) || path.ends_with(".labels")
}
