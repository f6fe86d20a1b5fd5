//! `admission.k8s.io/v1` `AdmissionReview`: the parts kipam reads and the answer it sends.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The review the API server sends.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    pub api_version: String,
    pub kind: String,
    pub request: Option<AdmissionRequest>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ReviewUser {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

/// One admission request.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: String,
    #[serde(default)]
    pub user_info: ReviewUser,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

/// What kipam answers about one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// HTTP code the API server returns to the client when refused (422 invalid, 403
    /// forbidden, 503 cannot check now).
    pub code: u16,
    /// `Invalid`, `Forbidden`, `ServiceUnavailable`.
    pub reason: &'static str,
    pub message: String,
}

impl Verdict {
    pub fn allow() -> Self {
        Verdict {
            allowed: true,
            code: 200,
            reason: "",
            message: String::new(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Verdict {
            allowed: false,
            code: 422,
            reason: "Invalid",
            message: message.into(),
        }
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Verdict {
            allowed: false,
            code: 403,
            reason: "Forbidden",
            message: message.into(),
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Verdict {
            allowed: false,
            code: 503,
            reason: "ServiceUnavailable",
            message: message.into(),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseReview<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: Response<'a>,
}

#[derive(Serialize)]
struct Response<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status<'a>>,
}

#[derive(Serialize)]
struct Status<'a> {
    code: u16,
    reason: &'a str,
    message: &'a str,
}

/// The `AdmissionReview` answering `uid` with `verdict`.
pub fn response(uid: &str, verdict: &Verdict) -> Value {
    let review = ResponseReview {
        api_version: "admission.k8s.io/v1",
        kind: "AdmissionReview",
        response: Response {
            uid,
            allowed: verdict.allowed,
            status: (!verdict.allowed).then_some(Status {
                code: verdict.code,
                reason: verdict.reason,
                message: &verdict.message,
            }),
        },
    };
    serde_json::to_value(review).unwrap_or(Value::Null)
}
