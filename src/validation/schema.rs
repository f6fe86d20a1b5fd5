//! The bounds and shapes the generated CRD schemas declare (`maxLength`, `maxItems`,
//! `maxProperties`, `minimum`/`maximum`, `pattern`, `enum`), checked on an object's `spec`
//! exactly as a real API server checks them. The schemas are generated from the constants in
//! `resources::bounds`, so this and the server can never disagree: a file `kipam validate`
//! accepts is one the server accepts.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::Regex;
use serde::Serialize;
use serde_json::Value;

use crate::resources::bounds::PATTERN_ADDRESS;
use crate::resources::bounds::{PATTERN_ADDRESS_RANGE, PATTERN_CIDR, PATTERN_DNS_LABEL};

use super::FieldError;

struct Schemas {
    /// Kind -> the schema of `spec`.
    specs: HashMap<String, Value>,
    /// Every `pattern` of every schema, compiled.
    patterns: HashMap<String, Regex>,
}

fn collect_patterns(node: &Value, out: &mut HashMap<String, Regex>) {
    match node {
        Value::Object(m) => {
            if let Some(Value::String(p)) = m.get("pattern")
                && !out.contains_key(p)
                && let Ok(re) = Regex::new(p)
            {
                out.insert(p.clone(), re);
            }
            m.values().for_each(|v| collect_patterns(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| collect_patterns(v, out)),
        _ => {}
    }
}

fn schemas() -> &'static Schemas {
    static SCHEMAS: OnceLock<Schemas> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut specs = HashMap::new();
        let mut patterns = HashMap::new();
        for crd in crate::resources::crds() {
            let Some(schema) = crd
                .spec
                .versions
                .iter()
                .find(|v| v.storage)
                .and_then(|v| v.schema.as_ref())
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .and_then(|s| serde_json::to_value(s).ok())
            else {
                continue;
            };
            collect_patterns(&schema, &mut patterns);
            if let Some(spec) = schema.pointer("/properties/spec") {
                specs.insert(crd.spec.names.kind.clone(), spec.clone());
            }
        }
        Schemas { specs, patterns }
    })
}

/// Checks `spec` of an object of `kind` against its CRD schema; every problem is a
/// [`FieldError`] (without the object) whose field path is the one a real server reports
/// (`spec.datacenters[dc-1].poolCidr`, `spec.ipam[metallb].addresses[3]`).
pub(crate) fn check_spec(kind: &str, spec: &impl Serialize) -> Vec<FieldError> {
    let schemas = schemas();
    let mut out = Vec::new();
    let (Some(schema), Ok(value)) = (schemas.specs.get(kind), serde_json::to_value(spec)) else {
        return out;
    };
    walk(schema, &value, "spec", &schemas.patterns, &mut out);
    out
}

fn error(out: &mut Vec<FieldError>, path: &str, value: &str, reason: String) {
    out.push(FieldError {
        object: String::new(),
        field: path.to_string(),
        value: value.to_string(),
        reason,
    });
}

/// What a pattern means, for the message.
fn pattern_meaning(pattern: &str) -> String {
    match pattern {
        PATTERN_DNS_LABEL => super::names::LABEL_RULE.to_string(),
        PATTERN_CIDR => "is not shaped like a CIDR (address/length)".to_string(),
        PATTERN_ADDRESS_RANGE => {
            "is not shaped like an address, a range first-last or a CIDR".to_string()
        }
        PATTERN_ADDRESS => "is not shaped like an IP address".to_string(),
        other => format!("must match '{other}'"),
    }
}

fn walk(
    schema: &Value,
    value: &Value,
    path: &str,
    patterns: &HashMap<String, Regex>,
    out: &mut Vec<FieldError>,
) {
    let count = |k: &str| schema.get(k).and_then(Value::as_u64);
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !value.is_null()
        && !options.contains(value)
    {
        let list: Vec<String> = options.iter().map(Value::to_string).collect();
        error(
            out,
            path,
            &display(value),
            format!("must be one of {}", list.join(", ")),
        );
    }
    match value {
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(max) = count("maxLength")
                && len > max
            {
                error(
                    out,
                    path,
                    s,
                    format!("must be at most {max} characters, is {len}"),
                );
            }
            if let Some(min) = count("minLength")
                && len < min
            {
                error(out, path, s, format!("must be at least {min} characters"));
            }
            if let Some(p) = schema.get("pattern").and_then(Value::as_str)
                && let Some(re) = patterns.get(p)
                && !re.is_match(s)
            {
                error(out, path, s, pattern_meaning(p));
            }
        }
        Value::Number(_) => check_number(schema, value, path, out),
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(max) = count("maxItems")
                && n > max
            {
                error(
                    out,
                    path,
                    "",
                    format!("must have at most {max} items, has {n}"),
                );
            }
            if let Some(min) = count("minItems")
                && n < min
            {
                error(out, path, "", format!("must have at least {min} items"));
            }
            if let Some(item) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    walk(item, v, &format!("{path}[{i}]"), patterns, out);
                }
            }
        }
        Value::Object(map) => {
            let n = map.len() as u64;
            if let Some(max) = count("maxProperties")
                && n > max
            {
                error(
                    out,
                    path,
                    "",
                    format!("must have at most {max} entries, has {n}"),
                );
            }
            if let Some(min) = count("minProperties")
                && n < min
            {
                error(out, path, "", format!("must have at least {min} entries"));
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in map {
                if let Some(s) = props.and_then(|p| p.get(k)) {
                    walk(s, v, &format!("{path}.{k}"), patterns, out);
                } else if let Some(s) = additional {
                    walk(s, v, &format!("{path}[{k}]"), patterns, out);
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

fn display(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `minimum`/`maximum`, compared exactly for integers (a bound of 2^53 must refuse 2^53 + 1,
/// which a comparison in floating point would let through).
fn check_number(schema: &Value, value: &Value, path: &str, out: &mut Vec<FieldError>) {
    let as_int = |b: f64| (b.fract() == 0.0 && b.abs() < 9.0e18).then_some(b as i128);
    let int = value
        .as_i64()
        .map(i128::from)
        .or(value.as_u64().map(i128::from));
    let below = |bound: f64| match (int, as_int(bound)) {
        (Some(v), Some(b)) => v < b,
        _ => value.as_f64().is_some_and(|v| v < bound),
    };
    let above = |bound: f64| match (int, as_int(bound)) {
        (Some(v), Some(b)) => v > b,
        _ => value.as_f64().is_some_and(|v| v > bound),
    };
    let show = |b: f64| as_int(b).map_or(b.to_string(), |i| i.to_string());
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
        && below(min)
    {
        error(
            out,
            path,
            &value.to_string(),
            format!("must be at least {}", show(min)),
        );
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
        && above(max)
    {
        error(
            out,
            path,
            &value.to_string(),
            format!("must be at most {}", show(max)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{IPAMPoolDatacenter, IPAMPoolSpec};
    use std::collections::BTreeMap;

    #[test]
    fn every_pattern_compiles() {
        let mut all = Vec::new();
        for crd in crate::resources::crds() {
            let v = serde_json::to_value(&crd).unwrap();
            let mut found = HashMap::new();
            collect_patterns(&v, &mut found);
            fn raw(v: &Value, out: &mut Vec<String>) {
                match v {
                    Value::Object(m) => {
                        if let Some(Value::String(p)) = m.get("pattern") {
                            out.push(p.clone());
                        }
                        m.values().for_each(|x| raw(x, out));
                    }
                    Value::Array(a) => a.iter().for_each(|x| raw(x, out)),
                    _ => {}
                }
            }
            raw(&v, &mut all);
        }
        assert!(!all.is_empty());
        for p in all {
            assert!(schemas().patterns.contains_key(&p), "{p} compiles");
        }
    }

    fn spec(dc: &str, settings: IPAMPoolDatacenter) -> IPAMPoolSpec {
        IPAMPoolSpec {
            datacenters: BTreeMap::from([(dc.to_string(), settings)]),
            ..Default::default()
        }
    }

    #[test]
    fn bounds_and_shapes_with_server_paths() {
        let ok = IPAMPoolDatacenter {
            pool_cidr: "192.168.1.0/26".into(),
            allocation_range: Some(8),
            exclude_ranges: vec!["192.168.1.1".into(), "192.168.1.5 - 192.168.1.7".into()],
            ..Default::default()
        };
        assert_eq!(check_spec("IPAMPool", &spec("dc-1", ok.clone())), vec![]);

        let long = "0000:0000:0000:0000:0000:ffff:100.10.0.0/112".to_string();
        assert_eq!(long.len(), 44);
        let bad = IPAMPoolDatacenter {
            pool_cidr: long.clone(),
            allocation_range: Some((1 << 53) + 1),
            exclude_ranges: vec!["not an address".into(); 1025],
            ..ok
        };
        let errors = check_spec("IPAMPool", &spec("dc-1", bad));
        let fields: Vec<(&str, &str)> = errors
            .iter()
            .map(|e| (e.field.as_str(), e.reason.as_str()))
            .collect();
        assert!(fields.contains(&(
            "spec.datacenters[dc-1].poolCidr",
            "must be at most 43 characters, is 44"
        )));
        assert!(fields.contains(&(
            "spec.datacenters[dc-1].allocationRange",
            "must be at most 9007199254740992"
        )));
        assert!(fields.contains(&(
            "spec.datacenters[dc-1].excludeRanges",
            "must have at most 1024 items, has 1025"
        )));
        assert!(fields.contains(&(
            "spec.datacenters[dc-1].excludeRanges[0]",
            "is not shaped like an address, a range first-last or a CIDR"
        )));
    }

    #[test]
    fn map_sizes() {
        let many: BTreeMap<String, IPAMPoolDatacenter> = (0..257)
            .map(|i| {
                (
                    format!("dc-{i}"),
                    IPAMPoolDatacenter {
                        pool_cidr: "10.0.0.0/8".into(),
                        allocation_range: Some(1),
                        ..Default::default()
                    },
                )
            })
            .collect();
        let errors = check_spec(
            "IPAMPool",
            &IPAMPoolSpec {
                datacenters: many,
                ..Default::default()
            },
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.datacenters");
        assert_eq!(errors[0].reason, "must have at most 256 entries, has 257");
    }
}
