//! ECR registries (`<account>.dkr.ecr.<region>.amazonaws.com`): their Basic credentials come from
//! `ecr:GetAuthorizationToken`, called with the function's own AWS identity. The one JSON 1.1
//! call is signed here with `aws-sigv4` instead of through `aws-sdk-ecr`, whose code would not
//! fit the Lambda zip's size budget. A token is valid for 12 hours; it is reused for one.

use std::time::{Duration, SystemTime};

use aws_credential_types::provider::ProvideCredentials;
use hyper::body::Bytes;
use hyper::header::{self, HeaderName};
use hyper::{Method, StatusCode};
use serde::Deserialize;
use url::Url;

use super::http::{Http, authority};
use crate::secretsmanager::SharedAws;
use podmutator_core::registry::error::LookupError;

const TARGET: &str = "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken";
/// How long a token is reused (ECR's are valid for 12 hours).
const TOKEN_REUSE: Duration = Duration::from_secs(3600);

/// The account and region of an ECR registry host (an optional `:port` aside), or `None`.
pub fn ecr_host(registry: &str) -> Option<(&str, &str)> {
    let host = registry.split(':').next().unwrap_or(registry);
    let rest = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"))?;
    let (account, rest) = rest.split_once(".dkr.ecr.")?;
    let region = rest.strip_suffix(".fips").unwrap_or(rest);
    let valid_account = account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit());
    let valid_region = !region.is_empty()
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    (valid_account && valid_region).then_some((account, region))
}

/// ECR tokens, per registry, and the AWS configuration whose credentials sign the call (the
/// function's: Lambda's role, the environment, `AWS_ENDPOINT_URL` for an emulator).
pub struct Ecr {
    aws: SharedAws,
    tokens: moka::sync::Cache<String, String>,
}

impl Ecr {
    pub fn new(aws: SharedAws) -> Self {
        Self {
            aws,
            tokens: moka::sync::Cache::builder()
                .max_capacity(64)
                .time_to_live(TOKEN_REUSE)
                .build(),
        }
    }

    /// The base64 `AWS:<password>` token for `registry`, cached.
    pub(super) async fn token(
        &self,
        http: &Http,
        registry: &str,
        account: &str,
        region: &str,
    ) -> Result<String, LookupError> {
        if let Some(t) = self.tokens.get(registry) {
            return Ok(t);
        }
        let what = format!("ecr:GetAuthorizationToken for {registry}");
        let fail = |reason: String| LookupError::Unauthorized {
            what: what.clone(),
            challenge: reason,
        };
        let sdk = self.aws.config().await;
        let provider = sdk
            .credentials_provider()
            .ok_or_else(|| fail("the function has no AWS credentials".into()))?;
        let credentials = provider
            .provide_credentials()
            .await
            .map_err(|e| fail(format!("the function's AWS credentials: {e}")))?;
        let endpoint = sdk
            .endpoint_url()
            .map(|e| format!("{}/", e.trim_end_matches('/')))
            .unwrap_or_else(|| format!("https://api.ecr.{region}.amazonaws.com/"));
        // `https://`, or `http://` for an emulator that AWS_ENDPOINT_URL names.
        let url = Url::parse(&endpoint)
            .ok()
            .filter(|u| matches!(u.scheme(), "https" | "http") && u.host_str().is_some())
            .ok_or_else(|| fail(format!("the ECR endpoint {endpoint:?} is not a URL")))?;
        let body = format!(r#"{{"registryIds":["{account}"]}}"#);
        let mut headers = vec![
            (header::CONTENT_TYPE, "application/x-amz-json-1.1".into()),
            (HeaderName::from_static("x-amz-target"), TARGET.into()),
        ];
        let signed = sign(
            &endpoint,
            &authority(&url),
            &headers,
            body.as_bytes(),
            credentials,
            region,
        )
        .map_err(|e| fail(format!("cannot sign the call: {e}")))?;
        headers.extend(signed);
        let answer = http
            .send(Method::POST, &url, &headers, Bytes::from(body), &what)
            .await?;
        if answer.status != StatusCode::OK {
            // AWS's error code, `__type` of the JSON body.
            let code = serde_json::from_slice::<serde_json::Value>(&answer.body)
                .ok()
                .and_then(|e| e["__type"].as_str().map(str::to_owned))
                .unwrap_or_default();
            return Err(fail(format!(
                "HTTP {} {code} (the function's role needs ecr:GetAuthorizationToken, and ecr:BatchGetImage and ecr:GetDownloadUrlForLayer on the repository)",
                answer.status.as_u16()
            )));
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Out {
            authorization_data: Vec<Data>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Data {
            authorization_token: String,
        }
        let token = serde_json::from_slice::<Out>(&answer.body)
            .ok()
            .and_then(|o| o.authorization_data.into_iter().next())
            .map(|d| d.authorization_token)
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| fail("the answer holds no authorization token".into()))?;
        self.tokens.insert(registry.to_owned(), token.clone());
        Ok(token)
    }
}

/// The SigV4 headers (`authorization`, `x-amz-date`, and `x-amz-security-token` for session
/// credentials) for a POST of `body` to `endpoint`.
fn sign(
    endpoint: &str,
    authority: &str,
    headers: &[(HeaderName, String)],
    body: &[u8],
    credentials: aws_credential_types::Credentials,
    region: &str,
) -> Result<Vec<(HeaderName, String)>, String> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("ecr")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| e.to_string())?
        .into();
    let all = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .chain([("host", authority)]);
    let request = SignableRequest::new("POST", endpoint, all, SignableBody::Bytes(body))
        .map_err(|e| e.to_string())?;
    let (instructions, _) = sign(request, &params)
        .map_err(|e| e.to_string())?
        .into_parts();
    instructions
        .headers()
        .map(|(k, v)| {
            HeaderName::from_bytes(k.as_bytes())
                .map(|name| (name, v.to_owned()))
                .map_err(|e| e.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecr_hosts_give_their_account_and_region() {
        assert_eq!(
            ecr_host("123456789012.dkr.ecr.us-east-1.amazonaws.com"),
            Some(("123456789012", "us-east-1"))
        );
        assert_eq!(
            ecr_host("123456789012.dkr.ecr.eu-west-1.amazonaws.com:8443"),
            Some(("123456789012", "eu-west-1"))
        );
        assert_eq!(
            ecr_host("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn"),
            Some(("123456789012", "cn-north-1"))
        );
        for other in [
            "public.ecr.aws",
            "docker.io",
            "12345.dkr.ecr.us-east-1.amazonaws.com",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com.evil.example",
            "123456789012.dkr.ecr..amazonaws.com",
        ] {
            assert_eq!(ecr_host(other), None, "{other}");
        }
    }

    #[test]
    fn a_signed_call_carries_the_signature_and_date() {
        let creds =
            aws_credential_types::Credentials::new("AKIDEXAMPLE", "secret", None, None, "test");
        let headers = vec![(
            header::CONTENT_TYPE,
            "application/x-amz-json-1.1".to_owned(),
        )];
        let signed = sign(
            "https://api.ecr.us-east-1.amazonaws.com/",
            "api.ecr.us-east-1.amazonaws.com",
            &headers,
            b"{}",
            creds,
            "us-east-1",
        )
        .unwrap();
        let names: Vec<&str> = signed.iter().map(|(k, _)| k.as_str()).collect();
        assert!(names.contains(&"authorization"), "{names:?}");
        assert!(names.contains(&"x-amz-date"), "{names:?}");
        let auth = &signed.iter().find(|(k, _)| k == "authorization").unwrap().1;
        assert!(auth.contains("Credential=AKIDEXAMPLE/"), "{auth}");
        assert!(auth.contains("/us-east-1/ecr/aws4_request"), "{auth}");
        assert!(!auth.contains("secret"), "{auth}");
    }
}
