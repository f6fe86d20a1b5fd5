//! From rendered text to Kubernetes objects, and back to YAML.
//!
//! A template's output is parsed, never passed on as text: a template that renders broken YAML
//! or something that is not an object fails here, with the line of rendered output at fault,
//! instead of later in the user cluster. Parsing also makes the written YAML canonical (one
//! style, keys sorted), so that the same data always gives the same bytes.
//!
//! Rendered text is read by the project's YAML library (`serde-saphyr`), the same parser for
//! every addon: there is no second, hand-written reader whose idea of YAML could differ.

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

use super::RenderError;

/// The label every rendered object carries: the name of the addon that rendered it.
pub const ADDON_LABEL: &str = "ipam.kipam.dev/addon";

/// Where a piece of output came from, for messages.
pub(crate) struct Origin<'a> {
    pub addon: &'a str,
    pub file: &'a str,
}

/// Where each rendered object came from: (template file, document number in its output).
pub(crate) type Places = Vec<(String, usize)>;

/// Parses the rendered text of one template file, drops its empty documents, checks that each
/// remaining one is an object kipam can apply, labels it, and appends it to `objects`, its
/// place to `places`. An object rendered before (same API group, kind, namespace and name)
/// is refused, naming both places.
pub(crate) fn collect_objects(
    origin: &Origin<'_>,
    text: &str,
    objects: &mut Vec<Value>,
    places: &mut Places,
) -> Result<(), RenderError> {
    let documents = full_parse(origin, text)?;
    for (index, mut document) in documents.into_iter().enumerate() {
        // The parser already skips empty documents; `null` ones are dropped here.
        if document.is_null() {
            continue;
        }
        check_and_label(&mut document, origin.addon).map_err(|reason| RenderError::BadObject {
            addon: origin.addon.to_string(),
            file: origin.file.to_string(),
            document: index + 1,
            reason,
        })?;
        let key = identity(&document);
        if let Some(at) = objects.iter().position(|o| identity(o) == key) {
            let (first_file, first_document) = places[at].clone();
            return Err(RenderError::Duplicate {
                addon: origin.addon.to_string(),
                object: shown(&key),
                first_file,
                first_document,
                second_file: origin.file.to_string(),
                second_document: index + 1,
            });
        }
        objects.push(document);
        places.push((origin.file.to_string(), index + 1));
    }
    Ok(())
}

/// What names an object in a cluster: API group (not version), kind, namespace, name.
fn identity(object: &Value) -> (&str, &str, &str, &str) {
    fn text(v: Option<&Value>) -> &str {
        v.and_then(Value::as_str).unwrap_or_default()
    }
    let api_version = text(object.get("apiVersion"));
    let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    let metadata = object.get("metadata");
    (
        group,
        text(object.get("kind")),
        text(metadata.and_then(|m| m.get("namespace"))),
        text(metadata.and_then(|m| m.get("name"))),
    )
}

fn shown((group, kind, namespace, name): &(&str, &str, &str, &str)) -> String {
    let kind = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    if namespace.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {namespace}/{name}")
    }
}

/// Parses with the full YAML parser, turning its error into one that names the rendered line.
fn full_parse(origin: &Origin<'_>, text: &str) -> Result<Vec<Value>, RenderError> {
    serde_saphyr::from_multiple(text).map_err(|err| {
        let line = err
            .location()
            .and_then(|location| usize::try_from(location.line()).ok())
            .filter(|line| *line > 0);
        RenderError::BadYaml {
            addon: origin.addon.to_string(),
            file: origin.file.to_string(),
            line,
            text: line
                .and_then(|line| text.lines().nth(line - 1))
                .unwrap_or_default()
                .to_string(),
            cause: yaml_cause(&err),
        }
    })
}

/// The parser's message without its source snippet (the error already carries the line).
fn yaml_cause(err: &serde_saphyr::Error) -> String {
    let message = err.without_snippet().to_string();
    // The message ends with " at line L column C"; the line is reported separately and refers
    // to rendered output, so keep only the cause.
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message,
    }
}

/// Requires `apiVersion`, `kind` and `metadata.name`, then sets the addon label.
fn check_and_label(document: &mut Value, addon: &str) -> Result<(), String> {
    let Some(object) = document.as_object_mut() else {
        return Err(format!(
            "is a {}, not a Kubernetes object (a mapping with apiVersion, kind and metadata)",
            json_kind(document)
        ));
    };
    for field in ["apiVersion", "kind"] {
        match object.get(field) {
            Some(Value::String(text)) if !text.is_empty() => {}
            Some(other) => {
                return Err(format!(
                    "has a {} as {field}, expected a non-empty string",
                    json_kind(other)
                ));
            }
            None => return Err(format!("has no {field}")),
        }
    }
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(metadata) = metadata.as_object_mut() else {
        return Err(format!(
            "(kind {kind}) has a metadata that is not a mapping"
        ));
    };
    match metadata.get("name") {
        Some(Value::String(name)) if !name.is_empty() => {}
        Some(other) => {
            return Err(format!(
                "(kind {kind}) has a {} as metadata.name, expected a non-empty string",
                json_kind(other)
            ));
        }
        None => return Err(format!("(kind {kind}) has no metadata.name")),
    }
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if labels.is_null() {
        *labels = Value::Object(Map::new());
    }
    let Some(labels) = labels.as_object_mut() else {
        return Err(format!(
            "(kind {kind}) has metadata.labels that are not a mapping"
        ));
    };
    labels.insert(ADDON_LABEL.to_string(), Value::String(addon.to_string()));
    Ok(())
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "mapping",
    }
}

/// Multi-document YAML for a list of objects: each document starts with `---`, keys are
/// sorted at every level, so equal objects always give equal text.
pub(crate) fn objects_to_yaml(objects: &[Value]) -> String {
    let mut out = String::new();
    for object in objects {
        out.push_str("---\n");
        match serde_saphyr::to_string(&Sorted(object)) {
            Ok(yaml) => out.push_str(&yaml),
            // Cannot happen for values that came out of the YAML parser; JSON is still valid
            // YAML, so fall back to it rather than lose the object.
            Err(_) => {
                out.push_str(&serde_json::to_string(&Sorted(object)).unwrap_or_default());
                out.push('\n');
            }
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Serialises a JSON value with the keys of every mapping in sorted order, whatever order the
/// map type keeps them in.
struct Sorted<'a>(&'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                let mut out = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    out.serialize_entry(key, &Sorted(value))?;
                }
                out.end()
            }
            Value::Array(items) => {
                let mut out = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    out.serialize_element(&Sorted(item))?;
                }
                out.end()
            }
            other => other.serialize(serializer),
        }
    }
}
