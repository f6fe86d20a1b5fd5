//! Label and field selectors, parsed from their query-string form.

use crate::error::ApiError;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum LabelOp {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq)]
struct LabelReq {
    key: String,
    op: LabelOp,
}

/// A parsed `labelSelector`: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<LabelReq>,
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced ')'".into());
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('".into());
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn valid_label_key(k: &str) -> bool {
    let name = match k.rsplit_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 {
                return false;
            }
            name
        }
        None => k,
    };
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

/// Parses a `(a,b,c)` value set.
fn parse_set(s: &str) -> Result<Vec<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, got {s:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses the `labelSelector` query syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
    /// `a notin (x,y)`, `a`, `!a`, `a>1`, `a<1`, comma-separated.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        Self::parse_inner(s).map_err(|e| {
            ApiError::bad_request(format!("unable to parse requirement: {e} in {s:?}"))
        })
    }

    fn parse_inner(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector { reqs });
        }
        for part in split_top_level(s)? {
            let part = part.trim();
            if part.is_empty() {
                return Err("empty requirement".into());
            }
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelReq {
                    key: key.trim().to_string(),
                    op: LabelOp::NotExists,
                }
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq {
                    key: k.trim().to_string(),
                    op: LabelOp::NotEq(v.trim().to_string()),
                }
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq {
                    key: k.trim().to_string(),
                    op: LabelOp::Eq(v.trim().to_string()),
                }
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq {
                    key: k.trim().to_string(),
                    op: LabelOp::Eq(v.trim().to_string()),
                }
            } else if let Some((k, v)) = part.split_once('>') {
                LabelReq {
                    key: k.trim().to_string(),
                    op: LabelOp::Gt(v.trim().parse().map_err(|_| "expected an integer")?),
                }
            } else if let Some((k, v)) = part.split_once('<') {
                LabelReq {
                    key: k.trim().to_string(),
                    op: LabelOp::Lt(v.trim().parse().map_err(|_| "expected an integer")?),
                }
            } else if let Some(pos) = part.find(" notin ").or_else(|| part.find(" notin(")) {
                LabelReq {
                    key: part[..pos].trim().to_string(),
                    op: LabelOp::NotIn(parse_set(&part[pos + 6..])?),
                }
            } else if let Some(pos) = part.find(" in ").or_else(|| part.find(" in(")) {
                LabelReq {
                    key: part[..pos].trim().to_string(),
                    op: LabelOp::In(parse_set(&part[pos + 3..])?),
                }
            } else {
                LabelReq {
                    key: part.to_string(),
                    op: LabelOp::Exists,
                }
            };
            if !valid_label_key(&req.key) {
                return Err(format!("invalid label key {:?}", req.key));
            }
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    /// Whether an object's `metadata.labels` satisfy the selector.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = crate::util::meta(obj)
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match &r.op {
            LabelOp::Eq(v) => get(&r.key) == Some(v.as_str()),
            LabelOp::NotEq(v) => get(&r.key) != Some(v.as_str()),
            LabelOp::In(vs) => get(&r.key).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelOp::NotIn(vs) => get(&r.key).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelOp::Exists => get(&r.key).is_some(),
            LabelOp::NotExists => get(&r.key).is_none(),
            LabelOp::Gt(n) => get(&r.key)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            LabelOp::Lt(n) => get(&r.key)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }

    /// Whether the selector has no requirements (matches everything).
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }
}

/// A parsed `fieldSelector`: `path=value`, `path==value`, `path!=value`, comma-separated.
/// Any dotted path is accepted (the real server allows only a few per kind); a missing field
/// compares as the empty string.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses the `fieldSelector` query syntax.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector { reqs });
        }
        for part in s.split(',') {
            let part = part.trim();
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            if k.trim().is_empty() {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; empty field name"
                )));
            }
            reqs.push((k.trim().to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    /// Whether the object's fields satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(path, eq, want)| {
            let got = match crate::util::get_dotted(obj, path) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (got == *want) == *eq
        })
    }

    /// Whether the selector has no requirements (matches everything).
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// The one name the selector asks for (`metadata.name=X`), if it does: the real server
    /// then reads that object's key alone instead of every object in the namespace (its
    /// generic store's `MatchesSingle`), and so does the stand-in.
    pub fn single_name(&self) -> Option<&str> {
        self.reqs
            .iter()
            .find(|(path, eq, _)| *eq && path == "metadata.name")
            .map(|(_, _, name)| name.as_str())
    }
}

/// Both selectors of a list or watch request.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub(crate) fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Self, ApiError> {
        Ok(Selectors {
            labels: LabelSelector::parse(labels.unwrap_or(""))?,
            fields: FieldSelector::parse(fields.unwrap_or(""))?,
        })
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "namespace": "ns", "labels": labels}, "status": {"phase": "Ready"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m(""));
        assert!(m("app=web"));
        assert!(m("app==web"));
        assert!(!m("app!=web"));
        assert!(m("app!=db"));
        assert!(m("app in (web, db)"));
        assert!(!m("app notin (web,db)"));
        assert!(m("missing notin (a)"));
        assert!(m("tier,app=web"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("app in (web),tier in (front,back)"));
        assert!(m("n>4"));
        assert!(!m("n<4"));
        assert!(m("app!=db,!missing,tier"));
    }

    #[test]
    fn label_parse_errors() {
        assert!(LabelSelector::parse("app in (a").is_err());
        assert!(LabelSelector::parse("a,,b").is_err());
        assert!(LabelSelector::parse("bad key=x").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        let m = |s: &str| FieldSelector::parse(s).unwrap().matches(&o);
        assert!(m("metadata.name=x"));
        assert!(m("metadata.namespace==ns,metadata.name!=y"));
        assert!(!m("metadata.name=y"));
        let single = |s: &str| {
            FieldSelector::parse(s)
                .unwrap()
                .single_name()
                .map(String::from)
        };
        assert_eq!(single("a=b,metadata.name=x"), Some("x".into()));
        assert_eq!(single("metadata.name!=x"), None);
        assert_eq!(single("metadata.namespace=x"), None);
        assert!(m("status.phase=Ready"));
        assert!(m("spec.missing="));
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
