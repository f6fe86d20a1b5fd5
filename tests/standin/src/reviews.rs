//! `TokenReview` and `SubjectAccessReview` (plus the local and self variants): nothing is
//! stored, the answer comes from functions a test scripts.

use crate::error::ApiError;
use crate::rbac::Decision;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;

/// An authenticated user, as a `TokenReview` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// `user.username`.
    pub username: String,
    /// `user.uid` (omitted when empty).
    pub uid: String,
    /// `user.groups`.
    pub groups: Vec<String>,
    /// `user.extra` (omitted when empty).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with a name and the `system:authenticated` group.
    pub fn new(username: &str) -> Self {
        UserInfo {
            username: username.to_string(),
            groups: vec!["system:authenticated".to_string()],
            ..UserInfo::default()
        }
    }

    /// Adds groups.
    pub fn with_groups(mut self, groups: &[&str]) -> Self {
        self.groups.extend(groups.iter().map(|g| g.to_string()));
        self
    }

    fn to_json(&self) -> Value {
        let mut u = json!({ "username": self.username, "groups": self.groups });
        if !self.uid.is_empty() {
            u["uid"] = json!(self.uid);
        }
        if !self.extra.is_empty() {
            u["extra"] = json!(self.extra);
        }
        u
    }

    fn from_spec(spec: &Value) -> Self {
        let strings = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        UserInfo {
            username: spec
                .get("user")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            uid: spec
                .get("uid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            groups: strings(spec.get("groups")),
            extra: spec
                .get("extra")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), strings(Some(v))))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// `spec.resourceAttributes` of an access review.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    pub namespace: String,
    pub verb: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

/// `spec.nonResourceAttributes` of an access review.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NonResourceAttributes {
    pub path: String,
    pub verb: String,
}

/// The question a `SubjectAccessReview` asks: may this user do this?
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessRequest {
    /// Who asks: `spec.user/uid/groups/extra`, or the caller for a self review.
    pub user: UserInfo,
    /// `spec.resourceAttributes`, for a question about a resource.
    pub resource: Option<ResourceAttributes>,
    /// `spec.nonResourceAttributes`, for a question about a URL path.
    pub non_resource: Option<NonResourceAttributes>,
}

pub(crate) type TokenReviewFn = Arc<dyn Fn(&str) -> Option<UserInfo> + Send + Sync>;
pub(crate) type AccessReviewFn = Arc<dyn Fn(&AccessRequest) -> bool + Send + Sync>;

fn str_of(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

fn review_object(body: &Value, api_version: &str, kind: &str, status: Value) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!(kind));
    let mut metadata = match body.get("metadata") {
        Some(Value::Object(m)) => Value::Object(m.clone()),
        _ => json!({}),
    };
    if let Value::Object(m) = &mut metadata {
        m.insert("creationTimestamp".into(), Value::Null);
    }
    out.insert("metadata".into(), metadata);
    out.insert(
        "spec".into(),
        body.get("spec").cloned().unwrap_or(json!({})),
    );
    out.insert("status".into(), status);
    Value::Object(out)
}

/// Answers a `TokenReview` with the scripted authenticator.
pub(crate) fn token_review(
    body: &Value,
    authn: &dyn Fn(&str) -> Option<UserInfo>,
) -> Result<Value, ApiError> {
    let spec = body.get("spec").cloned().unwrap_or(Value::Null);
    let token = str_of(&spec, "token");
    if token.is_empty() {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenReview",
            "",
            &["spec.token: Required value".into()],
        ));
    }
    let mut status = match authn(&token) {
        Some(user) => json!({ "authenticated": true, "user": user.to_json() }),
        None => json!({ "authenticated": false, "user": {}, "error": "invalid bearer token" }),
    };
    if let Some(aud) = spec.get("audiences") {
        status["audiences"] = aud.clone();
    }
    Ok(review_object(
        body,
        "authentication.k8s.io/v1",
        "TokenReview",
        status,
    ))
}

fn parse_attributes(spec: &Value) -> (Option<ResourceAttributes>, Option<NonResourceAttributes>) {
    let resource = spec.get("resourceAttributes").map(|r| ResourceAttributes {
        namespace: str_of(r, "namespace"),
        verb: str_of(r, "verb"),
        group: str_of(r, "group"),
        version: str_of(r, "version"),
        resource: str_of(r, "resource"),
        subresource: str_of(r, "subresource"),
        name: str_of(r, "name"),
    });
    let non_resource = spec
        .get("nonResourceAttributes")
        .map(|r| NonResourceAttributes {
            path: str_of(r, "path"),
            verb: str_of(r, "verb"),
        });
    (resource, non_resource)
}

/// The kinds of access review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AccessReviewKind {
    Subject,
    Local,
    SelfReview,
}

/// Answers a `SubjectAccessReview`, `LocalSubjectAccessReview` (namespace from the path) or
/// `SelfSubjectAccessReview` (user from the caller's token) with the scripted authoriser.
pub(crate) fn access_review(
    body: &Value,
    kind: AccessReviewKind,
    path_namespace: Option<&str>,
    caller: Option<UserInfo>,
    authz: &dyn Fn(&AccessRequest) -> Decision,
) -> Result<Value, ApiError> {
    let spec = body.get("spec").cloned().unwrap_or(Value::Null);
    let (resource, non_resource) = parse_attributes(&spec);
    let kind_name = match kind {
        AccessReviewKind::Subject => "SubjectAccessReview",
        AccessReviewKind::Local => "LocalSubjectAccessReview",
        AccessReviewKind::SelfReview => "SelfSubjectAccessReview",
    };
    let invalid =
        |c: &str| ApiError::invalid("authorization.k8s.io", kind_name, "", &[c.to_string()]);
    if resource.is_some() == non_resource.is_some() {
        return Err(invalid(
            "spec: Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    }
    let user = match kind {
        AccessReviewKind::SelfReview => caller.unwrap_or_else(|| UserInfo::new("system:anonymous")),
        _ => {
            let u = UserInfo::from_spec(&spec);
            if u.username.is_empty() && u.groups.is_empty() {
                return Err(invalid(
                    "spec.user: Invalid value: at least one of user or group must be specified",
                ));
            }
            u
        }
    };
    if kind == AccessReviewKind::Local {
        let ns = path_namespace.unwrap_or("");
        let attr_ns = resource
            .as_ref()
            .map(|r| r.namespace.as_str())
            .unwrap_or("");
        if attr_ns != ns {
            return Err(invalid(
                "spec.resourceAttributes.namespace: Invalid value: must match metadata.namespace",
            ));
        }
    }
    let req = AccessRequest {
        user,
        resource,
        non_resource,
    };
    let decision = authz(&req);
    let mut status = json!({ "allowed": decision.allowed });
    if !decision.reason.is_empty() {
        status["reason"] = json!(decision.reason);
    }
    let mut out = review_object(body, "authorization.k8s.io/v1", kind_name, status);
    if kind == AccessReviewKind::SelfReview {
        // A self review reports no user in its spec: the caller is implied.
        if let Some(s) = out.get_mut("spec").and_then(Value::as_object_mut) {
            s.remove("user");
        }
    }
    if let (AccessReviewKind::Local, Some(ns)) = (kind, path_namespace) {
        out["metadata"]["namespace"] = json!(ns);
    }
    Ok(out)
}
