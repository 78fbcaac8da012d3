//! The one error type of the web layer and its JSON body:
//! `{"error": {"status": 404, "code": "trace_not_found", "message": "…"}}`.
//!
//! Architecture invariant: no database or internal error text reaches a client; it is
//! logged, and the client gets a message saying what to do next.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Seconds to wait before retrying (`Retry-After`), for refusals that pass.
    retry_after_s: Option<u32>,
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::CONFLICT,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::FORBIDDEN,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// Not let in: 401 (`unauthenticated`, a token would do) or 403 (`forbidden`).
    pub fn refused(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: if status == StatusCode::UNAUTHORIZED {
                "unauthenticated"
            } else {
                "forbidden"
            },
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub fn misdirected(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::MISDIRECTED_REQUEST,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// 413: more than the server will answer at once; the message says what to ask instead.
    pub fn too_large(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    /// 503 with `Retry-After`: the server has no room for this now.
    pub fn busy(code: &'static str, message: impl Into<String>, retry_after_s: u32) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code,
            message: message.into(),
            retry_after_s: Some(retry_after_s),
        }
    }

    /// The HTTP status it answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What the client is told.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            code: "internal",
            message: message.into(),
            retry_after_s: None,
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Unavailable(_) | StoreError::Busy(_) | StoreError::Fault(..) => {
                tracing::warn!(%error, "store unavailable while answering a request");
                ApiError {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: "store_unavailable",
                    message: "the database is unavailable; check that it is running (GET /readyz), then retry"
                        .into(),
                    retry_after_s: None,
                }
            }
            StoreError::Corrupt(_) | StoreError::Refused(_) => {
                tracing::error!(%error, "stored data could not be read");
                ApiError {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    code: "corrupt_data",
                    message: "stored data could not be read; the server log names the record"
                        .into(),
                    retry_after_s: None,
                }
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": {"status": self.status.as_u16(), "code": self.code, "message": self.message}
        });
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

/// Refuses a query parameter outside `known`, naming those that are ("use a, b or c").
pub fn check_params(
    params: &std::collections::BTreeMap<String, String>,
    known: &[&str],
) -> Result<(), ApiError> {
    let Some(unknown) = params.keys().find(|k| !known.contains(&k.as_str())) else {
        return Ok(());
    };
    let names = match known {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    };
    Err(ApiError::bad_request(
        "invalid_parameter",
        format!("parameter {unknown}: unknown; use {names}"),
    ))
}
