//! A local AWS Secrets Manager: moto server on 127.0.0.1 (pinned by scripts/tools.sh), and a
//! counting proxy in front of it so tests can assert how many calls the webhook made.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_secretsmanager::Client;
use aws_sdk_secretsmanager::config::{BehaviorVersion, Credentials, Region};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::tool;

pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// moto's server with the stubs in tests/iac/moto_server.py. It picks its own port and
    /// announces it once it listens, so the wait is on that line (no port chosen beforehand
    /// that another process could take, no deadline a loaded machine could miss).
    pub fn start() -> Self {
        let mut child = Command::new(tool("python"))
            .arg(super::root().join("tests/iac/moto_server.py"))
            .env("MOTO_ACM_VALIDATION_WAIT", "0")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server.py starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Ok(port) = line.trim().parse() else {
            let status = child.wait().unwrap();
            panic!("moto_server.py announced no port ({status}); run it by hand to see why");
        };
        Moto { child, port }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment that points the AWS CLI, boto3, the SDKs and Terraform at this server,
    /// in `region`, with dummy credentials.
    pub fn env(&self, region: &str) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.url().as_str()),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", region),
            ("AWS_DEFAULT_REGION", region),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

/// Runs `code` (Python, with boto3, hashlib, json, sys and time imported; `args` in sys.argv)
/// against moto through `env` ([`Moto::env`]), never a real account's files; its stdout, trimmed.
pub fn boto3(env: &[(String, String)], code: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(tool("python"));
    cmd.args(["-c", &format!("import boto3,hashlib,json,sys,time\n{code}")])
        .args(args)
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .envs(env.iter().map(|(k, v)| (k, v)));
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// An SDK client with dummy credentials for `endpoint`.
pub async fn client(endpoint: &str) -> Client {
    let conf = aws_sdk_secretsmanager::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .endpoint_url(endpoint)
        .http_client(podmutator_aws::secretsmanager::http_client())
        .build();
    Client::from_conf(conf)
}

pub async fn create_secret(client: &Client, name: &str, value: &str) {
    client
        .create_secret()
        .name(name)
        .secret_string(value)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e:?}"));
}

/// Counts requests by `x-amz-target` on their way to `upstream`.
pub struct CountingProxy {
    pub port: u16,
    counts: Arc<Mutex<BTreeMap<String, usize>>>,
    /// Requests held in their delay now, and the most there have been at once.
    held: Arc<Mutex<(usize, usize)>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl CountingProxy {
    pub async fn start(upstream: u16) -> Self {
        Self::start_delayed(upstream, Duration::ZERO).await
    }

    /// As [`CountingProxy::start`], but each request waits `delay` before it is forwarded: a
    /// stand-in for a round trip to AWS, so that calls made one after another take `delay`
    /// each while calls made in parallel take it once.
    pub async fn start_delayed(upstream: u16, delay: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let held: Arc<Mutex<(usize, usize)>> = Arc::default();
        let (c, h) = (counts.clone(), held.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let counts = c.clone();
                let held = h.clone();
                tokio::spawn(async move {
                    let Ok(mut server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (mut cr, mut cw) = client.split();
                    let (mut sr, mut sw) = server.split();
                    let up = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        let mut tail = String::new();
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            tail.push_str(&String::from_utf8_lossy(&buf[..n]));
                            let before: usize = counts.lock().unwrap().values().sum();
                            count_targets(&mut tail, &counts);
                            let after: usize = counts.lock().unwrap().values().sum();
                            if after > before && !delay.is_zero() {
                                {
                                    let mut h = held.lock().unwrap();
                                    h.0 += 1;
                                    h.1 = h.1.max(h.0);
                                }
                                tokio::time::sleep(delay).await;
                                held.lock().unwrap().0 -= 1;
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        let _ = sw.shutdown().await;
                    };
                    let down = async {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                        let _ = cw.shutdown().await;
                    };
                    tokio::join!(up, down);
                });
            }
        });
        CountingProxy {
            port,
            counts,
            held,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Requests seen for `operation` (e.g. `BatchGetSecretValue`).
    pub fn count(&self, operation: &str) -> usize {
        let target = format!("secretsmanager.{operation}");
        self.counts
            .lock()
            .unwrap()
            .get(&target)
            .copied()
            .unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.counts.lock().unwrap().values().sum()
    }

    pub fn reset(&self) {
        self.counts.lock().unwrap().clear();
        self.held.lock().unwrap().1 = 0;
    }

    /// The most requests held in their delay at the same time since the start (or the last
    /// [`CountingProxy::reset`]): with a delay, calls made in one round trip are all held at
    /// once, calls made one after another one at a time.
    pub fn most_at_once(&self) -> usize {
        self.held.lock().unwrap().1
    }
}

/// Consumes complete `x-amz-target:` header lines from `tail`, keeping any partial line.
fn count_targets(tail: &mut String, counts: &Mutex<BTreeMap<String, usize>>) {
    loop {
        let lower = tail.to_ascii_lowercase();
        let Some(start) = lower.find("x-amz-target:") else {
            // Keep only enough to catch a header split across reads.
            if tail.len() > 64 {
                let cut = tail.len() - 64;
                let cut = (cut..tail.len())
                    .find(|i| tail.is_char_boundary(*i))
                    .unwrap_or(tail.len());
                tail.drain(..cut);
            }
            return;
        };
        let Some(end) = tail[start..].find("\r\n") else {
            tail.drain(..start);
            return;
        };
        let value = tail[start + "x-amz-target:".len()..start + end]
            .trim()
            .to_owned();
        *counts.lock().unwrap().entry(value).or_default() += 1;
        tail.drain(..start + end);
    }
}
