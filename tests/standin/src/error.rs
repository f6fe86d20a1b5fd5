//! API errors, always answered as a `meta/v1 Status` object with a matching HTTP code.

use serde_json::{Value, json};
use std::fmt;

/// An error as the API server reports it: an HTTP code, a machine-readable reason
/// (`NotFound`, `Conflict`, `Invalid`, ...) and a human message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason`.
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    /// `Status.details`, when there is something to say about the object concerned.
    pub details: Option<Value>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// The reason the real server uses for a given HTTP code.
pub(crate) fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// `plural.group` as the server names a resource in messages (`plural` for the core group).
pub(crate) fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl ApiError {
    /// An error with the usual reason for `code`.
    pub fn new(code: u16, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason_for(code).to_string(),
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, group: &str, plural: &str, name: &str) -> Self {
        let mut d = json!({ "kind": plural });
        if !name.is_empty() {
            d["name"] = json!(name);
        }
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        self.details = Some(d);
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    pub(crate) fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let mut e = Self::new(
            409,
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .with_details(group, plural, name);
        e.reason = "AlreadyExists".into();
        e
    }

    /// A stale `resourceVersion` (or failed uid precondition).
    pub(crate) fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        )
        .with_details(group, plural, name)
    }

    /// A validation failure (422), in the shape `Kind.group "name" is invalid: field: why`.
    pub(crate) fn invalid(group: &str, kind: &str, name: &str, causes: &[String]) -> Self {
        let gk = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let mut e = Self::new(
            422,
            format!("{gk} \"{name}\" is invalid: {}", causes.join(", ")),
        );
        let mut d = json!({ "kind": kind, "name": name, "causes": causes
            .iter()
            .map(|c| cause(c))
            .collect::<Vec<_>>() });
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        e.details = Some(d);
        e
    }

    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, message)
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, message)
    }

    /// A refusal of a request on `group`/`plural` (object `name`, when there is one), worded
    /// as the real server's `NewForbidden`: `plural.group "name" is forbidden: why`, or
    /// `forbidden: why` for a request outside resources.
    pub(crate) fn forbidden_on(group: &str, plural: &str, name: &str, why: &str) -> Self {
        if plural.is_empty() {
            return Self::new(403, format!("forbidden: {why}"));
        }
        let what = qualified(group, plural);
        let message = if name.is_empty() {
            format!("{what} is forbidden: {why}")
        } else {
            format!("{what} \"{name}\" is forbidden: {why}")
        };
        Self::new(403, message).with_details(group, plural, name)
    }

    pub(crate) fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {content_type:?})"
            ),
        )
    }

    /// A watch (or list) from a resource version older than the retained history.
    pub(crate) fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// The error as a `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// A `StatusCause` from `path: Kind of error: detail`, as the real server splits a field
/// error: the path in `field`, the rest in `message`, the kind of error in `reason`.
fn cause(text: &str) -> Value {
    let Some((field, message)) = text.split_once(": ") else {
        return json!({ "reason": "FieldValueInvalid", "message": text });
    };
    let reason = [
        ("Required value", "FieldValueRequired"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Forbidden", "FieldValueForbidden"),
        ("Duplicate value", "FieldValueDuplicate"),
    ]
    .iter()
    .find(|(prefix, _)| message.starts_with(prefix))
    .map_or("FieldValueInvalid", |(_, r)| r);
    json!({ "reason": reason, "message": message, "field": field })
}

/// A success `Status`, as answered to a DELETE of an object that is gone at once.
pub(crate) fn success_status(group: &str, plural: &str, name: &str, uid: &str) -> Value {
    let mut details = json!({ "name": name, "kind": plural, "uid": uid });
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}
