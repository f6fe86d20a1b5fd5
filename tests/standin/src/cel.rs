//! CEL validation rules of CRD schemas (`x-kubernetes-validations`), evaluated with the `cel`
//! crate the way the real server does:
//!
//! - a rule sees its node as `self`; on the root, `self.metadata` holds only `name` and
//!   `generateName`;
//! - a transition rule (one that mentions `oldSelf`) runs only on update, and only where the
//!   old object has a correlated value: properties correlate by name, map entries
//!   (`additionalProperties`) by key, list items never (no `x-kubernetes-list-type` support);
//! - a rule that is false fails with its `message` (or `failed rule: <rule>`), a rule that
//!   cannot be evaluated fails with the evaluation error; the cause reads
//!   `<path>: Invalid value: "<type>": <message>`, with `<nil>` as the path of the root.
//!
//! The real server also estimates every rule's cost when the CRD is written and refuses rules
//! that may cost too much; the stand-in does not (the bounds test in kipam's `tests/crds.rs`
//! keeps every input of a rule bounded instead).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cel::objects::Key;
use cel::{Context, Program, Value as Cel};
use serde_json::Value;

/// Compiled rules, by source text (compiling is far slower than evaluating).
fn program(rule: &str) -> Result<Arc<Program>, String> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Program>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(p) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(rule)
        .cloned()
    {
        return Ok(p);
    }
    let compiled = Arc::new(Program::compile(rule).map_err(|e| e.to_string())?);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(rule.to_string(), compiled.clone());
    Ok(compiled)
}

/// A JSON value as CEL sees it: integers as `int`, maps with string keys.
fn to_cel(v: &Value) -> Cel {
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Cel::Int(i),
            (None, Some(u)) => Cel::UInt(u),
            _ => Cel::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(a) => Cel::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => {
            let map: HashMap<Key, Cel> = m
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            Cel::Map(map.into())
        }
    }
}

/// The root object as rules see it: `metadata` narrowed to `name` and `generateName`.
/// Converted straight from `obj`, so the (possibly large) object is never copied as JSON.
fn root_view(obj: &Value) -> Cel {
    let Value::Object(m) = obj else {
        return to_cel(obj);
    };
    let mut map: HashMap<Key, Cel> = m
        .iter()
        .filter(|(k, _)| k.as_str() != "metadata")
        .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
        .collect();
    let meta: HashMap<Key, Cel> = m
        .get("metadata")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(|(k, _)| matches!(k.as_str(), "name" | "generateName"))
        .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
        .collect();
    map.insert(
        Key::String(Arc::new("metadata".into())),
        Cel::Map(meta.into()),
    );
    Cel::Map(map.into())
}

/// Whether `schema` or anything below it carries rules; subtrees without any are not
/// walked (a map of thousands of entries with no rules costs nothing).
fn has_rules(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .is_some_and(|r| !r.is_empty())
        || schema
            .get("properties")
            .and_then(Value::as_object)
            .is_some_and(|p| p.values().any(has_rules))
        || schema
            .get("additionalProperties")
            .is_some_and(|a| a.is_object() && has_rules(a))
        || schema.get("items").is_some_and(has_rules)
}

/// Evaluates every rule of `schema` on `new` (and `old`, for transition rules). Returns the
/// failures as `path: message` causes.
pub(crate) fn check_rules(schema: &Value, new: &Value, old: Option<&Value>) -> Vec<String> {
    let mut errors = Vec::new();
    if has_rules(schema) {
        walk(schema, new, old, None, &mut errors);
    }
    errors
}

fn child(path: Option<&str>, key: &str) -> String {
    match path {
        None => key.to_string(),
        Some(p) => format!("{p}.{key}"),
    }
}

/// `new` and `old` at one node, converted for CEL once whatever the number of rules there.
struct Node<'a> {
    new: &'a Value,
    old: Option<&'a Value>,
    root: bool,
    converted: Option<(Cel, Option<Cel>)>,
}

impl Node<'_> {
    fn values(&mut self) -> &(Cel, Option<Cel>) {
        let (new, old, root) = (self.new, self.old, self.root);
        self.converted.get_or_insert_with(|| {
            let view = if root { root_view } else { to_cel };
            (view(new), old.map(view))
        })
    }
}

fn walk(
    schema: &Value,
    new: &Value,
    old: Option<&Value>,
    path: Option<&str>,
    errors: &mut Vec<String>,
) {
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        let mut node = Node {
            new,
            old,
            root: path.is_none(),
            converted: None,
        };
        for rule in rules {
            evaluate(rule, schema, &mut node, path, errors);
        }
    }
    match new {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema
                .get("additionalProperties")
                .filter(|a| a.is_object() && has_rules(a));
            let any_prop_rules = props.is_some_and(|p| p.values().any(has_rules));
            if !any_prop_rules && additional.is_none() {
                return;
            }
            for (k, v) in m {
                if path.is_none() && k == "metadata" {
                    continue;
                }
                let old_v = old.and_then(|o| o.get(k));
                if let Some(s) = props.and_then(|p| p.get(k)) {
                    if has_rules(s) {
                        walk(s, v, old_v, Some(&child(path, k)), errors);
                    }
                } else if let Some(s) = additional {
                    let p = format!("{}[{k}]", path.unwrap_or(""));
                    walk(s, v, old_v, Some(&p), errors);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items").filter(|s| has_rules(s)) {
                for (i, v) in items.iter().enumerate() {
                    let p = format!("{}[{i}]", path.unwrap_or(""));
                    walk(s, v, None, Some(&p), errors);
                }
            }
        }
        _ => {}
    }
}

fn evaluate(
    rule: &Value,
    schema: &Value,
    node: &mut Node<'_>,
    path: Option<&str>,
    errors: &mut Vec<String>,
) {
    let shown_path = path.unwrap_or("<nil>");
    let type_ = schema
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("object");
    let Some(text) = rule.get("rule").and_then(Value::as_str) else {
        return;
    };
    let fail = |errors: &mut Vec<String>, why: String| {
        errors.push(format!("{shown_path}: Invalid value: \"{type_}\": {why}"));
    };
    let program = match program(text) {
        Ok(p) => p,
        Err(e) => return fail(errors, format!("compilation failed: {text}: {e}")),
    };
    let transition = program.references().has_variable("oldSelf");
    if transition && node.old.is_none() {
        return;
    }
    let (new, old) = node.values();
    let mut ctx = Context::default();
    ctx.add_variable_from_value("self", new.clone());
    if let Some(o) = old {
        ctx.add_variable_from_value("oldSelf", o.clone());
    }
    match program.execute(&ctx) {
        Ok(Cel::Bool(true)) => {}
        Ok(Cel::Bool(false)) => {
            let message = rule
                .get("messageExpression")
                .and_then(Value::as_str)
                .and_then(|m| program_message(m, &ctx))
                .or_else(|| {
                    rule.get("message")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                })
                .unwrap_or_else(|| format!("failed rule: {text}"));
            fail(errors, message)
        }
        Ok(other) => fail(
            errors,
            format!("rule did not evaluate to a bool: {text}: {other:?}"),
        ),
        Err(e) => fail(errors, format!("{text}: {e}")),
    }
}

fn program_message(expression: &str, ctx: &Context) -> Option<String> {
    match program(expression).ok()?.execute(ctx).ok()? {
        Cel::String(s) if !s.trim().is_empty() => Some(s.to_string()),
        _ => None,
    }
}

/// Evaluates a boolean expression over named JSON values (a webhook's `matchConditions`).
pub(crate) fn evaluate_bool(expression: &str, vars: &[(&str, &Value)]) -> Result<bool, String> {
    let program = program(expression)?;
    let mut ctx = Context::default();
    for (name, value) in vars {
        ctx.add_variable_from_value(*name, to_cel(value));
    }
    match program.execute(&ctx) {
        Ok(Cel::Bool(b)) => Ok(b),
        Ok(other) => Err(format!(
            "{expression}: did not evaluate to a bool: {other:?}"
        )),
        Err(e) => Err(format!("{expression}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "x-kubernetes-validations": [
                {"rule": "size(self.metadata.name) <= 5", "message": "name too long"}
            ],
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "dcs": {
                            "type": "object",
                            "x-kubernetes-validations": [{"rule": "self.all(k, size(k) <= 3)"}],
                            "additionalProperties": {
                                "type": "object",
                                "x-kubernetes-validations": [
                                    {"rule": "self.cidr == oldSelf.cidr", "message": "cidr is immutable"},
                                    {"rule": "has(self.p) == has(oldSelf.p) && (!has(self.p) || self.p == oldSelf.p)", "message": "p is immutable"},
                                    {"rule": "!has(self.n) || self.n >= 1", "messageExpression": "'n must be positive, is ' + string(self.n)"}
                                ],
                                "properties": {
                                    "cidr": {"type": "string"},
                                    "p": {"type": "integer"},
                                    "n": {"type": "integer"}
                                }
                            }
                        }
                    }
                }
            }
        })
    }

    fn obj(name: &str, dcs: Value) -> Value {
        json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": name, "labels": {"a": "b"}}, "spec": {"dcs": dcs}})
    }

    #[test]
    fn creation_rules_run_on_create() {
        assert!(check_rules(&schema(), &obj("a", json!({"dc": {"cidr": "x"}})), None).is_empty());
        assert_eq!(
            check_rules(
                &schema(),
                &obj("abcdef", json!({"dcdc": {"cidr": "x", "n": 0}})),
                None
            ),
            vec![
                "<nil>: Invalid value: \"object\": name too long",
                "spec.dcs: Invalid value: \"object\": failed rule: self.all(k, size(k) <= 3)",
                "spec.dcs[dcdc]: Invalid value: \"object\": n must be positive, is 0",
            ]
        );
    }

    #[test]
    fn transition_rules_run_only_with_an_old_value() {
        let old = obj("a", json!({"dc": {"cidr": "x", "p": 3}}));
        // A new key has no old value: its transition rules do not run.
        let new = obj(
            "a",
            json!({"dc": {"cidr": "x", "p": 3}, "d2": {"cidr": "y"}}),
        );
        assert!(check_rules(&schema(), &new, Some(&old)).is_empty());
        let new = obj("a", json!({"dc": {"cidr": "z"}}));
        assert_eq!(
            check_rules(&schema(), &new, Some(&old)),
            vec![
                "spec.dcs[dc]: Invalid value: \"object\": cidr is immutable",
                "spec.dcs[dc]: Invalid value: \"object\": p is immutable",
            ]
        );
        // Removing a key is not the business of the value's rules.
        let new = obj("a", json!({"d2": {"cidr": "z"}}));
        assert!(check_rules(&schema(), &new, Some(&old)).is_empty());
    }
}
