//! Errors in KKP's shape: `{"error": {"code": N, "message": "…", "details": […]}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answer. Everything a client can send maps to a 4xx; 5xx answers mean the API
/// server could not be reached or refused kipam's own request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Validation messages, one per problem.
    pub details: Vec<String>,
}

#[derive(Serialize, schemars::JsonSchema)]
/// The body of every error answer (KKP's `ErrorResponse`).
pub struct ErrorBody {
    pub error: ErrorDetails,
}

#[derive(Serialize, schemars::JsonSchema)]
/// What went wrong.
pub struct ErrorDetails {
    /// The HTTP status code.
    pub code: u16,
    pub message: String,
    /// One entry per validation problem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            details: Vec::new(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }

    /// A validation failure: 400 with every message (each names the object and field).
    pub fn invalid(messages: Vec<String>) -> Self {
        let message = format!("validation failed: {}", messages.join("; "));
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message,
            details: messages,
        }
    }

    /// Maps an API server answer to kipam's write or review. Only what the client caused
    /// (a name taken, a stale write, a pool gone, a refused object) keeps a 4xx.
    pub fn from_kube(e: kube::Error, what: &str) -> Self {
        match e {
            kube::Error::Api(s) => match s.code {
                404 => Self::not_found(format!("{what} not found")),
                409 => Self::conflict(format!("{what}: {}", s.message)),
                400 | 422 => Self::bad_request(format!("{what}: {}", s.message)),
                401 | 403 => Self::new(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "the API server refused kipam's own request ({what}): {} (check kipam's RBAC)",
                        s.message
                    ),
                ),
                code => Self::new(
                    StatusCode::BAD_GATEWAY,
                    format!("the API server answered {code} ({what}): {}", s.message),
                ),
            },
            other => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot reach the API server ({what}): {other}"),
            ),
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetails {
                code: self.status.as_u16(),
                message: self.message.clone(),
                details: self.details.clone(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut response = (status, axum::Json(self.body())).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}
