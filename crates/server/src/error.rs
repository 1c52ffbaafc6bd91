//! One error type for the HTTP API, answered as `application/problem+json`.
//!
//! The detail sent to clients says what is wrong with their request; internal causes (store
//! failures) are logged and summarised, never sent verbatim.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use overseer_core::wire::Problem;
use overseer_core::{Rejection, SpecError};

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// A short, stable name for the kind of problem, answered as `code`.
    pub kind: &'static str,
    pub detail: String,
    pub field: Option<String>,
}

pub type Result<T, E = ApiError> = std::result::Result<T, E>;

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            detail: detail.into(),
            field: None,
        }
    }

    pub fn bad_request(field: impl Into<String>, detail: impl Into<String>) -> Self {
        ApiError {
            field: Some(field.into()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid-request", detail)
        }
    }

    /// 429 with `Retry-After: 1`.
    pub fn too_many(detail: impl Into<String>) -> Self {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too-many-requests", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not-found", detail)
    }

    pub fn too_large(field: impl Into<String>, detail: impl Into<String>) -> Self {
        ApiError {
            field: Some(field.into()),
            ..ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too-large", detail)
        }
    }

    pub fn conflict(kind: &'static str, detail: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, kind, detail)
    }
}

impl From<SpecError> for ApiError {
    fn from(e: SpecError) -> Self {
        let status = if e.unprocessable {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::BAD_REQUEST
        };
        let field = if e.field.is_empty() {
            None
        } else {
            Some(e.field.clone())
        };
        let detail = match &field {
            Some(f) => format!("{f}: {}", e.message),
            None => e.message.clone(),
        };
        ApiError {
            status,
            kind: if e.unprocessable {
                "unsupported"
            } else {
                "invalid-request"
            },
            detail,
            field,
        }
    }
}

impl From<overseer_store::Error> for ApiError {
    fn from(e: overseer_store::Error) -> Self {
        use overseer_store::Error as E;
        match e {
            E::JobNotFound(id) => ApiError::not_found(format!("job {id} not found")),
            E::LeaseNotFound(id) => ApiError::not_found(format!("lease {id} not found")),
            E::IdempotencyConflict { .. } => ApiError {
                field: Some("idempotency_key".into()),
                ..ApiError::conflict("idempotency-conflict", e.to_string())
            },
            E::Rejected(r) => r.into(),
            E::ScheduleNotFound(name) => {
                ApiError::not_found(format!("schedule `{name}` not found"))
            }
            E::ScheduleConflict(_) => ApiError::conflict("schedule-exists", e.to_string()),
            E::TokenExists(_) => ApiError {
                field: Some("name".into()),
                ..ApiError::conflict("token-exists", e.to_string())
            },
            E::Fenced { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not-leader",
                "this node is no longer the leader; retry",
            ),
            E::Unavailable(cause) | E::InUse(cause) => {
                tracing::warn!(%cause, "store unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store-unavailable",
                    "the store cannot commit right now; nothing was changed, retry later",
                )
            }
            E::Corrupt(cause) => {
                tracing::error!(%cause, "corrupt record in store");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error reading the store",
                )
            }
        }
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        match r {
            Rejection::LeaseLost { .. } => ApiError::conflict("lease-lost", r.to_string()),
            Rejection::JobTerminal { state } => {
                ApiError::conflict("job-terminal", format!("the job is already {state}"))
            }
            Rejection::UnknownStep => ApiError::not_found("no such step"),
            Rejection::NotAllowed { reason } => ApiError::conflict("not-allowed", reason),
            Rejection::AlreadyRerun { .. } => ApiError::conflict("already-rerun", r.to_string()),
            Rejection::NotClaimable | Rejection::NotExpired | Rejection::NotDue => {
                ApiError::conflict("conflict", r.to_string())
            }
        }
    }
}

impl ApiError {
    /// The problem document this error answers with.
    pub fn problem(self) -> Problem {
        let title = self
            .status
            .canonical_reason()
            .unwrap_or("Error")
            .to_string();
        Problem {
            kind: "about:blank".into(),
            code: self.kind.to_string(),
            title,
            status: self.status.as_u16(),
            detail: self.detail,
            field: self.field,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let problem = self.problem();
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut res = (status, body).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        res
    }
}
