//! Routing shared by the Lambda adapter and the HTTPS server: paths, methods, content type,
//! body limit and the optional path token. Every answer is JSON.

use crate::admission::{App, Reply, error_reply};
use crate::error::Error;
use crate::mutate::Route;

/// Flyte's path for the core Pod kind (`/mutate-` + group + `-` + version + `-` + kind).
pub const PATH_SECRETS: &str = "/mutate--v1-pod";
pub const PATH_MANAGED_POD: &str = "/mutate/managed-pod";
pub const PATH_MANAGED_NAMESPACE: &str = "/mutate/managed-namespace";
pub const PATH_HEALTHZ: &str = "/healthz";

/// The parts of an HTTP request the webhook looks at.
#[derive(Debug, Clone, Copy)]
pub struct Incoming<'a> {
    pub method: &'a str,
    /// Path without query string (the API server appends `?timeout=10s`).
    pub path: &'a str,
    pub content_type: Option<&'a str>,
    pub body: &'a [u8],
}

/// HTTP front settings, from the `http` config section.
#[derive(Debug, Clone, Default)]
pub struct Front {
    pub max_body_bytes: usize,
    pub path_token: Option<String>,
}

fn message(status: u16, text: &str) -> Reply {
    Reply {
        status,
        body: serde_json::json!({ "message": text })
            .to_string()
            .into_bytes(),
    }
}

fn invalid(text: String) -> Reply {
    error_reply(&Error::Invalid(text), "", crate::admission::API_VERSION_V1)
}

/// The 400 for a body over `http.maxBodyBytes`.
pub fn body_too_large(limit: usize) -> Reply {
    invalid(format!(
        "body is over the {limit}-byte limit (http.maxBodyBytes); a Pod AdmissionReview is normally a few kilobytes"
    ))
}

/// Constant-time comparison, so response timing does not reveal how much of a token matched.
fn token_matches(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

impl Front {
    /// Strips the path token, if one is configured; `None` means "not found".
    fn route_path<'a>(&self, path: &'a str) -> Option<&'a str> {
        let Some(token) = &self.path_token else {
            return Some(path);
        };
        let rest = path.strip_prefix('/')?;
        let (given, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        token_matches(given.as_bytes(), token.as_bytes()).then_some(tail)
    }

    pub async fn dispatch(&self, app: &App, req: Incoming<'_>) -> Reply {
        let Some(path) = self.route_path(req.path) else {
            return message(404, "not found");
        };
        let route = match path {
            PATH_HEALTHZ => {
                return match req.method {
                    "GET" | "HEAD" => message(200, "ok"),
                    _ => message(405, "method not allowed: use GET for /healthz"),
                };
            }
            PATH_SECRETS => Route::Secrets,
            PATH_MANAGED_POD => Route::ManagedPod,
            PATH_MANAGED_NAMESPACE => Route::ManagedNamespace,
            _ => return message(404, "not found"),
        };
        if req.method != "POST" {
            return message(
                405,
                "method not allowed: the API server POSTs AdmissionReviews to this path",
            );
        }
        let is_json = req.content_type.is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"))
        });
        if !is_json {
            return invalid(format!(
                "content-type must be application/json, got {}",
                req.content_type
                    .map_or_else(|| "none".to_owned(), |c| format!("{c:?}"))
            ));
        }
        if req.body.len() > self.max_body_bytes {
            return body_too_large(self.max_body_bytes);
        }
        app.review(route, req.body).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison_requires_the_whole_token() {
        assert!(token_matches(b"abc", b"abc"));
        assert!(!token_matches(b"abd", b"abc"));
        assert!(!token_matches(b"ab", b"abc"));
        assert!(!token_matches(b"", b"abc"));
    }

    #[test]
    fn path_token_is_stripped_or_the_path_is_not_found() {
        let front = Front {
            max_body_bytes: 1024,
            path_token: Some("t0k3n".into()),
        };
        assert_eq!(
            front.route_path("/t0k3n/mutate--v1-pod"),
            Some("/mutate--v1-pod")
        );
        assert_eq!(front.route_path("/mutate--v1-pod"), None);
        assert_eq!(front.route_path("/t0k3nX/mutate--v1-pod"), None);
        assert_eq!(front.route_path("/t0k3n"), Some(""));
    }
}
