//! One error type with three meanings, and how each becomes an HTTP status.
//!
//! | variant    | HTTP | review                                        | who decides    |
//! |------------|------|-----------------------------------------------|----------------|
//! | `Invalid`  | 400  | `allowed:false`, message                      | failurePolicy  |
//! | `Denied`   | 200  | `allowed:false`, `status.code` 400/403        | us             |
//! | `Internal` | 500  | `allowed:false`, message                      | failurePolicy  |
//!
//! `failurePolicy` only governs calls that fail (non-2xx, timeouts, unreadable bodies); an HTTP
//! 200 with `allowed:false` always denies, so only real policy decisions may use `Denied`.
//! Messages never contain a secret value.

/// A policy decision against the pod, with a message that names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Denial {
    /// `status.code` of the review response: 400 for a malformed request, 403 for a forbidden one.
    pub code: u16,
    /// Machine-readable reason, also the metric dimension (e.g. `BadSecretAnnotation`).
    pub reason: &'static str,
    pub message: String,
}

impl Denial {
    pub fn bad_request(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: 400,
            reason,
            message: message.into(),
        }
    }

    pub fn forbidden(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: 403,
            reason,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request is not something we can read (not JSON, not a review, too large).
    #[error("{0}")]
    Invalid(String),
    /// We read the request and refuse the pod.
    #[error("{0}")]
    Denied(Denial),
    /// We could not decide (secret backend down, deadline passed, a bug).
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// HTTP status of the response carrying this error.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::Invalid(_) => 400,
            Error::Denied(_) => 200,
            Error::Internal(_) => 500,
        }
    }

    /// `status.code` inside the review response.
    pub fn review_code(&self) -> u16 {
        match self {
            Error::Invalid(_) => 400,
            Error::Denied(d) => d.code,
            Error::Internal(_) => 500,
        }
    }

    /// `status.reason` inside the review response.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "BadRequest",
            Error::Denied(d) => d.reason,
            Error::Internal(_) => "InternalError",
        }
    }
}

impl From<Denial> for Error {
    fn from(d: Denial) -> Self {
        Error::Denied(d)
    }
}
