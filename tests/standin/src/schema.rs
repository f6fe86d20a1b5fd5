//! The parts of a CRD's structural `openAPIV3Schema` the real server enforces on every write
//! of a custom resource: pruning of unknown fields (reported, for `fieldValidation`), dropping
//! of non-nullable nulls, defaulting, and validation of type, required, enum, bounds, lengths,
//! item and property counts, `pattern` and `format: date-time`. CEL rules
//! (`x-kubernetes-validations`) are in `cel.rs`.
//! Not covered: other formats, `allOf`/`anyOf`/`oneOf`/`not` and list-type uniqueness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

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
    check_with(&Node::compile(schema), obj).errors
}

/// Prunes and defaults `obj` in place according to the root `schema`, then validates it.
/// The schema is read through its compiled form, kept while the schema lives.
pub(crate) fn check(schema: &Arc<Value>, obj: &mut Value) -> Checked {
    check_with(&compiled(schema), obj)
}

fn check_with(schema: &Node, obj: &mut Value) -> Checked {
    let Value::Object(root) = obj else {
        return Checked {
            errors: vec!["<root>: Invalid value: must be an object".into()],
            unknown: Vec::new(),
        };
    };
    let mut unknown = Vec::new();
    let preserve = schema.preserve_unknown;
    // apiVersion, kind and metadata are the server's business, never pruned here.
    root.retain(|k, v| {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            return true;
        }
        match schema.property(k) {
            Some(s) => !v.is_null() || s.nullable,
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
    for (k, s) in schema.properties.iter().flatten() {
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

/// One node of a structural schema with the keywords the walk reads, looked up once per
/// schema rather than once per value (a map of thousands of entries visits the same node
/// thousands of times).
#[derive(Debug, Default)]
struct Node {
    type_: Option<String>,
    nullable: bool,
    int_or_string: bool,
    enum_: Option<Vec<Value>>,
    minimum: Option<f64>,
    maximum: Option<f64>,
    exclusive_minimum: bool,
    exclusive_maximum: bool,
    min_length: Option<u64>,
    max_length: Option<u64>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    min_properties: Option<u64>,
    max_properties: Option<u64>,
    /// `pattern`, with its regex (`None` when it does not compile: nothing is checked then).
    pattern: Option<(String, Option<Regex>)>,
    date_time: bool,
    embedded: bool,
    /// `x-kubernetes-preserve-unknown-fields: true`.
    preserve_unknown: bool,
    /// `additionalProperties: true`.
    additional_any: bool,
    /// `properties`, in the schema's order, when it is an object.
    properties: Option<Vec<(String, Node)>>,
    /// Index into `properties` by name.
    by_name: HashMap<String, usize>,
    /// `additionalProperties`, when it is a schema.
    additional: Option<Box<Node>>,
    /// `items`, whatever it holds.
    items: Option<Box<Node>>,
    /// Defaults of the properties, in the schema's order.
    defaults: Vec<(String, Value)>,
    required: Vec<String>,
}

impl Node {
    fn compile(schema: &Value) -> Node {
        let flag = |k: &str| schema.get(k).and_then(Value::as_bool) == Some(true);
        let num = |k: &str| schema.get(k).and_then(Value::as_f64);
        let count = |k: &str| schema.get(k).and_then(Value::as_u64);
        let props = schema.get("properties").and_then(Value::as_object);
        let properties: Option<Vec<(String, Node)>> = props.map(|p| {
            p.iter()
                .map(|(k, s)| (k.clone(), Node::compile(s)))
                .collect()
        });
        let by_name = properties
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let defaults = props
            .into_iter()
            .flatten()
            .filter_map(|(k, s)| s.get("default").map(|d| (k.clone(), d.clone())))
            .collect();
        Node {
            type_: schema
                .get("type")
                .and_then(Value::as_str)
                .map(str::to_string),
            nullable: flag("nullable"),
            int_or_string: flag("x-kubernetes-int-or-string"),
            enum_: schema.get("enum").and_then(Value::as_array).cloned(),
            minimum: num("minimum"),
            maximum: num("maximum"),
            exclusive_minimum: flag("exclusiveMinimum"),
            exclusive_maximum: flag("exclusiveMaximum"),
            min_length: count("minLength"),
            max_length: count("maxLength"),
            min_items: count("minItems"),
            max_items: count("maxItems"),
            min_properties: count("minProperties"),
            max_properties: count("maxProperties"),
            pattern: schema
                .get("pattern")
                .and_then(Value::as_str)
                .map(|p| (p.to_string(), pattern(p))),
            date_time: schema.get("format").and_then(Value::as_str) == Some("date-time"),
            embedded: flag("x-kubernetes-embedded-resource"),
            preserve_unknown: flag("x-kubernetes-preserve-unknown-fields"),
            additional_any: flag("additionalProperties"),
            properties,
            by_name,
            additional: schema
                .get("additionalProperties")
                .filter(|a| a.is_object())
                .map(|a| Box::new(Node::compile(a))),
            items: schema.get("items").map(|i| Box::new(Node::compile(i))),
            defaults,
            required: schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
        }
    }

    fn property(&self, name: &str) -> Option<&Node> {
        let i = *self.by_name.get(name)?;
        self.properties.as_ref()?.get(i).map(|(_, n)| n)
    }
}

/// The compiled form of a schema, kept for as long as the schema itself lives (a CRD's
/// schema is shared by every write of its type until the CRD changes).
fn compiled(schema: &Arc<Value>) -> Arc<Node> {
    type Cache = HashMap<usize, (Weak<Value>, Arc<Node>)>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let key = Arc::as_ptr(schema) as usize;
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    // An entry's weak reference keeps the schema's allocation, so no other schema can take
    // its address while the entry exists; entries of dropped schemas go whenever another
    // schema is compiled.
    if let Some((_, node)) = cache.get(&key) {
        return node.clone();
    }
    let node = Arc::new(Node::compile(schema));
    cache.retain(|_, (source, _)| source.strong_count() > 0);
    cache.insert(key, (Arc::downgrade(schema), node.clone()));
    node
}

/// A compiled `pattern`, cached by its text (schemas are compiled again when a CRD changes).
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

fn apply_defaults(schema: &Node, m: &mut Map<String, Value>) {
    for (k, d) in &schema.defaults {
        if !m.contains_key(k) {
            m.insert(k.clone(), d.clone());
        }
    }
}

fn check_required(schema: &Node, m: &Map<String, Value>, path: &Path, errors: &mut Vec<String>) {
    for r in &schema.required {
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
    schema: &Node,
    v: &mut Value,
    path: &Path,
    errors: &mut Vec<String>,
    unknown: &mut Vec<String>,
) {
    if v.is_null() {
        if !schema.nullable {
            errors.push(format!(
                "{path}: Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                schema.type_.as_deref().unwrap_or("object")
            ));
        }
        return;
    }
    let int_or_string = schema.int_or_string;
    let want = schema.type_.as_deref();
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
    if let Some(options) = &schema.enum_
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
        if let Some((p, re)) = &schema.pattern
            && re.as_ref().is_some_and(|re| !re.is_match(s))
        {
            errors.push(format!(
                "{path}: Invalid value: {v}: {path} in body should match '{p}'"
            ));
        }
        if schema.date_time && !is_date_time(s) {
            errors.push(format!(
                "{path}: Invalid value: {v}: {path} in body must be of type date-time: {v}"
            ));
        }
    }
    match v {
        Value::Object(m) => {
            let embedded = schema.embedded;
            if embedded {
                // An embedded object keeps its type and metadata whatever the schema says.
                for k in ["apiVersion", "kind", "metadata"] {
                    if let Some(x) = m.get(k)
                        && x.is_null()
                    {
                        m.remove(k);
                    }
                }
            }
            let additional = schema.additional.as_deref();
            let preserve = schema.preserve_unknown || schema.additional_any;
            let keeps = |k: &str, v: &Value| match schema.property(k).or(additional) {
                Some(s) => !v.is_null() || s.nullable,
                None => preserve || (embedded && matches!(k, "apiVersion" | "kind" | "metadata")),
            };
            // Looking first is much cheaper than `retain`, and there is rarely anything to prune.
            if !m.iter().all(|(k, v)| keeps(k, v)) {
                m.retain(|k, v| {
                    let keep = keeps(k, v);
                    if !keep && schema.property(k).or(additional).is_none() {
                        unknown.push(Path::Field(path, k).to_string());
                    }
                    keep
                });
            }
            apply_defaults(schema, m);
            for (k, child) in m.iter_mut() {
                if let Some(s) = schema.property(k) {
                    walk(s, child, &Path::Field(path, k), errors, unknown);
                } else if let Some(s) = additional {
                    walk(s, child, &Path::Key(path, k), errors, unknown);
                }
            }
            check_required(schema, m, path, errors);
        }
        Value::Array(items) => {
            if let Some(s) = &schema.items {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(s, item, &Path::Index(path, i), errors, unknown);
                }
            }
        }
        _ => {}
    }
}

fn check_bounds(schema: &Node, v: &Value, path: &Path, errors: &mut Vec<String>) {
    if let Some(x) = v.as_f64() {
        if let Some(min) = schema.minimum {
            let bad = if schema.exclusive_minimum {
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
        if let Some(max) = schema.maximum {
            let bad = if schema.exclusive_maximum {
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
    // (length, unit of min/max messages, its bounds)
    let (len, what, min, max) = match v {
        Value::String(s) => (
            s.chars().count() as u64,
            "Length",
            schema.min_length,
            schema.max_length,
        ),
        Value::Array(a) => (a.len() as u64, "Items", schema.min_items, schema.max_items),
        Value::Object(m) => (
            m.len() as u64,
            "Properties",
            schema.min_properties,
            schema.max_properties,
        ),
        _ => return,
    };
    if let Some(min) = min
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
    if let Some(max) = max
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
    fn a_changed_schema_is_read_afresh() {
        // As when a CRD is updated: each version of the schema is a new value.
        for max in [1, 2, 3] {
            let schema = Arc::new(json!({
                "type": "object",
                "properties": {"spec": {
                    "type": "object",
                    "maxProperties": max,
                    "additionalProperties": {"type": "integer"}
                }}
            }));
            let mut o = json!({"spec": {"a": 1, "b": 2}});
            let c = check(&schema, &mut o);
            assert_eq!(c.errors.is_empty(), max >= 2, "maxProperties {max}: {c:?}");
        }
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
        let c = check_with(&Node::compile(&schema), &mut o);
        assert!(c.errors.is_empty() && c.unknown.is_empty(), "{c:?}");
        let mut o = json!({"spec": {"name": "Abcdef", "at": "yesterday", "m": {"k": {"y": 1}, "l": {}}, "z": 1}});
        let c = check_with(&Node::compile(&schema), &mut o);
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
