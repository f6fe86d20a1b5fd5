//! Strict reading: every field of a kipam object checked against the kind's structural schema
//! before it is turned into a Rust type.
//!
//! The Rust types stay lenient on purpose (the controller reads objects from an API server that
//! may be newer than kipam and send fields kipam does not know). Everything kipam reads from a
//! *file* — manifests, the offline state — goes through [`check_object`] first, so a mistyped
//! field is an error instead of being dropped: an unknown field (with a suggestion when a known
//! one is close), a value of the wrong type, a number that is not a whole number or does not fit,
//! a missing required field, a value outside an enum.
//!
//! The schema is the one the API server uses: the CRD's `openAPIV3Schema` generated from the
//! Rust types (`kipam crds`), plus Kubernetes' `ObjectMeta` for `metadata`; for a `Namespace`
//! (a cluster's namespace, `cluster-<name>`, may sit beside its Addons), Kubernetes' own
//! schema of the kind. There is no second list of fields to keep in sync.
//!
//! The input is a [`RawNode`] tree that keeps each scalar as it was written, so a message can
//! quote `8.5` or `18446744073709551616` exactly, and the line it came from.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use kube::CustomResourceExt;
use serde_json::Value;

use crate::resources::{Addon, Cluster, IPAMAllocation, IPAMPool};

use super::FieldError;

/// A parsed document, scalars kept as written.
#[derive(Clone, Debug, PartialEq)]
pub struct RawNode {
    pub value: RawValue,
    /// The scalar as written in the source (numbers, booleans, null), when known.
    pub written: Option<String>,
    /// 1-based line in the source, when known.
    pub line: Option<u64>,
}

/// The value of a [`RawNode`].
#[derive(Clone, Debug, PartialEq)]
pub enum RawValue {
    Null,
    Bool(bool),
    /// Any whole number the parser produced (wider than 64 bits is kept).
    Int(i128),
    Float(f64),
    String(String),
    Seq(Vec<RawNode>),
    /// Entries in source order.
    Map(Vec<(String, RawNode)>),
}

impl RawNode {
    pub fn new(value: RawValue) -> Self {
        RawNode {
            value,
            written: None,
            line: None,
        }
    }

    /// The entry `key` of a mapping.
    pub fn get(&self, key: &str) -> Option<&RawNode> {
        match &self.value {
            RawValue::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The string at `key`, when it is one.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        match &self.get(key)?.value {
            RawValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        self.value == RawValue::Null
    }

    /// The value as its author wrote it (best effort for nodes built from JSON).
    pub fn as_written(&self) -> String {
        if let Some(w) = &self.written {
            return w.clone();
        }
        match &self.value {
            RawValue::Null => "null".into(),
            RawValue::Bool(b) => b.to_string(),
            RawValue::Int(i) => i.to_string(),
            RawValue::Float(f) => f.to_string(),
            RawValue::String(s) => s.clone(),
            RawValue::Seq(_) => "a list".into(),
            RawValue::Map(_) => "a mapping".into(),
        }
    }

    /// The same document as JSON, for typed deserialisation. Call it after [`check_object`]
    /// passed: numbers that do not fit 64 bits become floats here.
    pub fn to_json(&self) -> Value {
        match &self.value {
            RawValue::Null => Value::Null,
            RawValue::Bool(b) => Value::Bool(*b),
            RawValue::Int(i) => {
                if let Ok(n) = i64::try_from(*i) {
                    Value::from(n)
                } else if let Ok(n) = u64::try_from(*i) {
                    Value::from(n)
                } else {
                    serde_json::Number::from_f64(*i as f64)
                        .map(Value::Number)
                        .unwrap_or(Value::Null)
                }
            }
            RawValue::Float(f) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            RawValue::String(s) => Value::String(s.clone()),
            RawValue::Seq(items) => Value::Array(items.iter().map(RawNode::to_json).collect()),
            RawValue::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }
}

impl From<&Value> for RawNode {
    /// A JSON document (the webhook's input) as a tree; numbers are written as JSON wrote them.
    fn from(v: &Value) -> Self {
        let value = match v {
            Value::Null => RawValue::Null,
            Value::Bool(b) => RawValue::Bool(*b),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    RawValue::Int(i.into())
                } else if let Some(u) = n.as_u64() {
                    RawValue::Int(u.into())
                } else {
                    RawValue::Float(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => RawValue::String(s.clone()),
            Value::Array(items) => RawValue::Seq(items.iter().map(RawNode::from).collect()),
            Value::Object(m) => RawValue::Map(
                m.iter()
                    .map(|(k, v)| (k.clone(), RawNode::from(v)))
                    .collect(),
            ),
        };
        let written = match v {
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        RawNode {
            value,
            written,
            line: None,
        }
    }
}

/// One problem found by [`check_object`], with the line it is on when known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub line: Option<u64>,
    pub error: FieldError,
}

/// The kinds kipam reads: its own four, and the core `Namespace` (the namespace of a cluster,
/// which a manifest directory may hold so that the cluster's Addons can be applied with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    IPAMPool,
    Cluster,
    Addon,
    IPAMAllocation,
    Namespace,
    /// Read from the offline state file only (its quarantine), never from manifests: not
    /// among [`Kind::from_name`]'s kinds.
    IPAMPoolRecord,
}

impl Kind {
    pub fn from_name(kind: &str) -> Option<Kind> {
        match kind {
            "IPAMPool" => Some(Kind::IPAMPool),
            "Cluster" => Some(Kind::Cluster),
            "Addon" => Some(Kind::Addon),
            "IPAMAllocation" => Some(Kind::IPAMAllocation),
            "Namespace" => Some(Kind::Namespace),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::IPAMPool => "IPAMPool",
            Kind::Cluster => "Cluster",
            Kind::Addon => "Addon",
            Kind::IPAMAllocation => "IPAMAllocation",
            Kind::Namespace => "Namespace",
            Kind::IPAMPoolRecord => "IPAMPoolRecord",
        }
    }

    /// The `apiVersion` a manifest of this kind must carry.
    pub fn api_version(&self) -> &'static str {
        match self {
            Kind::Namespace => "v1",
            _ => crate::resources::API_VERSION,
        }
    }
}

/// The schema of a whole object of `kind`: the CRD's schema with `apiVersion`, `kind` and
/// `metadata` (Kubernetes' `ObjectMeta`) added, as the API server sees it.
pub fn object_schema(kind: Kind) -> &'static Value {
    static SCHEMAS: OnceLock<[Value; 6]> = OnceLock::new();
    let all = SCHEMAS.get_or_init(|| {
        use k8s_openapi::api::core::v1::Namespace;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let metadata = builtin_schema::<ObjectMeta>();
        [
            with_envelope(IPAMPool::crd(), &metadata),
            with_envelope(Cluster::crd(), &metadata),
            with_envelope(Addon::crd(), &metadata),
            with_envelope(IPAMAllocation::crd(), &metadata),
            builtin_schema::<Namespace>(),
            with_envelope(crate::resources::IPAMPoolRecord::crd(), &metadata),
        ]
    });
    &all[kind as usize]
}

/// The OpenAPI schema of a Kubernetes type, every reference inlined.
fn builtin_schema<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::openapi3()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    let mut schema =
        serde_json::to_value(generator.into_root_schema_for::<T>()).unwrap_or(Value::Null);
    if let Some(map) = schema.as_object_mut() {
        map.remove("$schema");
    }
    schema
}

fn with_envelope(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    metadata: &Value,
) -> Value {
    let mut schema = crd
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_else(|| serde_json::json!({"type": "object"}));
    if let Some(props) = schema.as_object_mut().and_then(|m| {
        m.entry("properties")
            .or_insert_with(|| serde_json::json!({}))
            .as_object_mut()
    }) {
        props.insert("apiVersion".into(), serde_json::json!({"type": "string"}));
        props.insert("kind".into(), serde_json::json!({"type": "string"}));
        props.insert("metadata".into(), metadata.clone());
    }
    schema
}

/// Checks a whole object of `kind` against its schema; `object` names it in the messages
/// (`IPAMPool metallb`). Returns every problem, in document order.
pub fn check_object(kind: Kind, object: &str, node: &RawNode) -> Vec<Problem> {
    let schema = object_schema(kind);
    let mut walker = Walker {
        object,
        root: schema,
        out: Vec::new(),
    };
    walker.walk(schema, node, &mut Vec::new());
    walker.out
}

enum Segment<'a> {
    Field(&'a str),
    Key(&'a str),
    Index(usize),
}

fn path_text(path: &[Segment<'_>]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Segment::Field(name) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(name);
            }
            Segment::Key(key) => {
                let _ = write!(out, "[{key}]");
            }
            Segment::Index(i) => {
                let _ = write!(out, "[{i}]");
            }
        }
    }
    if out.is_empty() {
        out.push_str("(the document)");
    }
    out
}

struct Walker<'a> {
    object: &'a str,
    root: &'a Value,
    out: Vec<Problem>,
}

impl<'a> Walker<'a> {
    fn problem(&mut self, node: &RawNode, path: &[Segment<'_>], value: String, reason: String) {
        self.out.push(Problem {
            line: node.line,
            error: FieldError {
                object: self.object.to_string(),
                field: path_text(path),
                value,
                reason,
            },
        });
    }

    fn walk<'n>(&mut self, schema: &'n Value, node: &'n RawNode, path: &mut Vec<Segment<'n>>) {
        let type_ = schema.get("type").and_then(Value::as_str).unwrap_or("");
        let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true);
        if node.is_null() {
            if !nullable && !type_.is_empty() {
                self.problem(
                    node,
                    path,
                    String::new(),
                    format!("is empty (null); give it a value ({type_}) or remove the field"),
                );
            }
            return;
        }
        match type_ {
            "object" => self.object(schema, node, path),
            "array" => match &node.value {
                RawValue::Seq(items) => {
                    if let Some(item_schema) = schema.get("items") {
                        for (i, item) in items.iter().enumerate() {
                            path.push(Segment::Index(i));
                            self.walk(item_schema, item, path);
                            path.pop();
                        }
                    }
                }
                _ => self.wrong_type(node, path, "a list"),
            },
            "string" => match &node.value {
                RawValue::String(s) => {
                    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
                        let names: Vec<&str> = allowed.iter().filter_map(Value::as_str).collect();
                        if !names.contains(&s.as_str()) {
                            let mut reason = format!("must be one of {}", names.join(", "));
                            if let Some(close) = suggest(s, names.iter().copied()) {
                                let _ = write!(reason, " (did you mean {close}?)");
                            }
                            self.problem(node, path, s.clone(), reason);
                        }
                    }
                }
                RawValue::Bool(_) | RawValue::Int(_) | RawValue::Float(_) => {
                    let written = node.as_written();
                    self.problem(
                        node,
                        path,
                        written.clone(),
                        format!(
                            "is read as a {}, not a string: write it in quotes (\"{written}\")",
                            scalar_kind(&node.value)
                        ),
                    );
                }
                _ => self.wrong_type(node, path, "a string"),
            },
            "integer" => self.integer(schema, node, path),
            "number" if !matches!(node.value, RawValue::Int(_) | RawValue::Float(_)) => {
                self.wrong_type(node, path, "a number");
            }
            "boolean" if !matches!(node.value, RawValue::Bool(_)) => {
                self.wrong_type(node, path, "true or false");
            }
            // No type: anything goes (not produced for kipam's kinds).
            _ => {}
        }
    }

    fn wrong_type(&mut self, node: &RawNode, path: &[Segment<'_>], expected: &str) {
        let found = scalar_kind(&node.value);
        let value = match node.value {
            RawValue::Seq(_) | RawValue::Map(_) => String::new(),
            _ => node.as_written(),
        };
        self.problem(
            node,
            path,
            value,
            format!("must be {expected}, not {found}"),
        );
    }

    fn integer(&mut self, schema: &Value, node: &RawNode, path: &[Segment<'_>]) {
        let (min, max): (i128, i128) = match schema.get("format").and_then(Value::as_str) {
            Some("int32") => (i32::MIN.into(), i32::MAX.into()),
            _ => (i64::MIN.into(), i64::MAX.into()),
        };
        let written = node.as_written();
        match &node.value {
            RawValue::Int(i) if *i < min || *i > max => {
                let side = if *i > max { "large" } else { "small" };
                self.problem(
                    node,
                    path,
                    written,
                    format!("is too {side}: a whole number between {min} and {max}"),
                );
            }
            RawValue::Int(_) => {}
            RawValue::Float(f) => {
                let digits = written.trim_start_matches(['-', '+']);
                let reason = if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) {
                    let side = if written.starts_with('-') {
                        "small"
                    } else {
                        "large"
                    };
                    format!("is too {side}: a whole number between {min} and {max}")
                } else if f.fract() != 0.0 {
                    "is not a whole number".to_string()
                } else {
                    "must be written as a whole number (no decimal point or exponent)".to_string()
                };
                self.problem(node, path, written, reason);
            }
            RawValue::String(s) => {
                let reason = if s.trim().parse::<i128>().is_ok() {
                    "is a string, not a whole number: remove the quotes"
                } else {
                    "must be a whole number"
                };
                self.problem(node, path, s.clone(), reason.to_string());
            }
            _ => self.wrong_type(node, path, "a whole number"),
        }
    }

    fn object<'n>(&mut self, schema: &'n Value, node: &'n RawNode, path: &mut Vec<Segment<'n>>) {
        let RawValue::Map(entries) = &node.value else {
            self.wrong_type(node, path, "a mapping");
            return;
        };
        if schema
            .get("x-kubernetes-preserve-unknown-fields")
            .and_then(Value::as_bool)
            == Some(true)
        {
            return;
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties").filter(|a| a.is_object());
        if properties.is_none() && additional.is_none() {
            // An object without a declared shape (e.g. `managedFields[].fieldsV1`).
            return;
        }
        for (key, value) in entries {
            if let Some(sub) = properties.and_then(|p| p.get(key)) {
                path.push(Segment::Field(key));
                self.walk(sub, value, path);
                path.pop();
            } else if let Some(sub) = additional {
                path.push(Segment::Key(key));
                self.walk(sub, value, path);
                path.pop();
            } else {
                let known: Vec<&str> = properties
                    .map(|p| p.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                let reason = self.unknown_field_reason(key, &known, path);
                path.push(Segment::Field(key));
                self.problem(value, path, String::new(), reason);
                path.pop();
            }
        }
        if let Some(required) = schema.get("required").and_then(Value::as_array) {
            for name in required.iter().filter_map(Value::as_str) {
                if !entries.iter().any(|(k, _)| k == name) {
                    path.push(Segment::Field(name));
                    self.problem(node, path, String::new(), "is required".into());
                    path.pop();
                }
            }
        }
    }

    fn unknown_field_reason(&self, key: &str, known: &[&str], path: &[Segment<'_>]) -> String {
        if let Some(close) = suggest(key, known.iter().copied()) {
            return format!("unknown field, did you mean `{close}`?");
        }
        // A known field put in the wrong place: say where it belongs.
        let mut elsewhere = Vec::new();
        field_paths(self.root, &mut String::new(), &mut elsewhere);
        let here = path_text(path);
        let hit = elsewhere.iter().find(|(name, at)| {
            at != &here && (name == key || suggest(key, std::iter::once(name.as_str())).is_some())
        });
        if let Some((name, at)) = hit {
            let at = if at.is_empty() {
                name.clone()
            } else {
                format!("{at}.{name}")
            };
            return format!("unknown field here, did you mean `{at}`?");
        }
        if known.is_empty() {
            "unknown field".to_string()
        } else {
            format!("unknown field (known here: {})", known.join(", "))
        }
    }
}

/// Every `(field name, parent path)` declared by `schema`, maps written `[*]`.
fn field_paths(schema: &Value, at: &mut String, out: &mut Vec<(String, String)>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            out.push((name.clone(), at.clone()));
            let len = at.len();
            if !at.is_empty() {
                at.push('.');
            }
            at.push_str(name);
            field_paths(sub, at, out);
            at.truncate(len);
        }
    }
    for (key, suffix) in [("additionalProperties", "[*]"), ("items", "[*]")] {
        if let Some(sub) = schema.get(key).filter(|s| s.is_object()) {
            let len = at.len();
            at.push_str(suffix);
            field_paths(sub, at, out);
            at.truncate(len);
        }
    }
}

fn scalar_kind(v: &RawValue) -> &'static str {
    match v {
        RawValue::Null => "null",
        RawValue::Bool(_) => "boolean",
        RawValue::Int(_) | RawValue::Float(_) => "number",
        RawValue::String(_) => "string",
        RawValue::Seq(_) => "a list",
        RawValue::Map(_) => "a mapping",
    }
}

/// The candidate closest to `word` when it is close enough to be a likely typo (same letters
/// but for case, or a small edit distance for the word's length).
pub fn suggest<'c>(word: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let lower = word.to_lowercase();
    let allowed = match lower.chars().count() {
        0..=3 => 1,
        4..=8 => 2,
        _ => 3,
    };
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = edit_distance(&lower, &c.to_lowercase());
        if d <= allowed && best.is_none_or(|(b, _)| d < b) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Known field names per kind, for documentation and tests: `(parent path, name)`.
pub fn known_fields(kind: Kind) -> BTreeMap<String, Vec<String>> {
    let mut all = Vec::new();
    field_paths(object_schema(kind), &mut String::new(), &mut all);
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, at) in all {
        out.entry(at).or_default().push(name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: Value) -> RawNode {
        RawNode::from(&json)
    }

    #[test]
    fn suggestions_only_when_close() {
        let known = [
            "excludeRanges",
            "excludePrefixes",
            "allocationRange",
            "poolCidr",
        ];
        assert_eq!(suggest("excludeRange", known), Some("excludeRanges"));
        assert_eq!(suggest("poolCIDR", known), Some("poolCidr"));
        assert_eq!(suggest("colour", known), None);
        assert_eq!(suggest("optout", ["optOut", "cidr"]), Some("optOut"));
    }

    #[test]
    fn unknown_fields_and_numbers() {
        let pool = node(serde_json::json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "IPAMPool",
            "metadata": {"name": "p", "labelz": {}},
            "spec": {"datacenters": {"dc-1": {
                "type": "range", "poolCidr": "10.0.0.0/24",
                "allocationRange": 8.5, "excludeRange": ["10.0.0.1"]
            }}},
            "paused": true
        }));
        let found: Vec<String> = check_object(Kind::IPAMPool, "IPAMPool p", &pool)
            .into_iter()
            .map(|p| p.error.to_string())
            .collect();
        assert_eq!(
            found,
            [
                "IPAMPool p: metadata.labelz: unknown field, did you mean `labels`?",
                "IPAMPool p: paused: unknown field (known here: apiVersion, kind, metadata, spec, status)",
                "IPAMPool p: spec.datacenters[dc-1].allocationRange \"8.5\": is not a whole number",
                "IPAMPool p: spec.datacenters[dc-1].excludeRange: unknown field, did you mean `excludeRanges`?",
            ]
        );
    }

    #[test]
    fn field_in_the_wrong_place_points_to_its_place() {
        let cluster = node(serde_json::json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": "c", "pause": true},
            "spec": {"datacenter": "dc-1"}
        }));
        let found = check_object(Kind::Cluster, "Cluster c", &cluster);
        assert_eq!(
            found[0].error.to_string(),
            "Cluster c: metadata.pause: unknown field here, did you mean `spec.pause`?"
        );
    }
}
