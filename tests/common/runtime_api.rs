//! Lambda's Runtime API on 127.0.0.1, as `lambda_runtime` polls it, for running the real
//! binary's Lambda loop in tests.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};

/// What the fake Runtime API saw.
#[derive(Default)]
pub struct Seen {
    pub nexts: usize,
    pub responses: Vec<String>,
    pub errors: Vec<String>,
}

/// Lambda's Runtime API on 127.0.0.1, as `lambda_runtime` polls it: the first `next` hands out
/// `event`, later ones wait (as Lambda does between invocations); responses and errors are
/// recorded.
pub async fn runtime_api(event: String, seen: Arc<Mutex<Seen>>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (event, seen) = (event.clone(), seen.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (event, seen) = (event.clone(), seen.clone());
                    async move { Ok::<_, Infallible>(answer(req, &event, &seen).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    port
}

async fn answer(req: Request<Incoming>, event: &str, seen: &Mutex<Seen>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    if path == "/2018-06-01/runtime/invocation/next" {
        let first = {
            let mut s = seen.lock().unwrap();
            s.nexts += 1;
            s.nexts == 1
        };
        if !first {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        let deadline = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            + 60_000;
        return Response::builder()
            .status(200)
            .header("lambda-runtime-aws-request-id", "req-1")
            .header("lambda-runtime-deadline-ms", deadline.to_string())
            .header(
                "lambda-runtime-invoked-function-arn",
                "arn:aws:lambda:us-east-1:123456789012:function:podmutator",
            )
            .header(
                "lambda-runtime-trace-id",
                "Root=1-5e1b4151-5ac6c58dcf6b3b4e1c0d2d9e",
            )
            .body(Full::new(Bytes::from(event.to_owned())))
            .unwrap();
    }
    let mut s = seen.lock().unwrap();
    if path.ends_with("/response") {
        s.responses.push(body);
    } else {
        s.errors.push(format!("{path}: {body}"));
    }
    Response::builder()
        .status(202)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}
