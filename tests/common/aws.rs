//! A local AWS Secrets Manager: moto server on 127.0.0.1 (pinned by scripts/tools.sh), and a
//! counting proxy in front of it so tests can assert how many calls the webhook made.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

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
    gate: Arc<Gate>,
    task: tokio::task::JoinHandle<()>,
}

/// Holds requests until `n` of them are held at once (see [`CountingProxy::gate`]).
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    opened: tokio::sync::Notify,
}

#[derive(Default)]
struct GateState {
    /// Requests held (or passing) now, and the most there have been at once.
    held: usize,
    most: usize,
    /// Hold requests until this many are held together; `None`: let them pass.
    until: Option<usize>,
}

impl Gate {
    /// Counts one request in, and waits for the gate to open (at once if it is not armed).
    async fn pass(&self) {
        {
            let mut s = self.state.lock().unwrap();
            s.held += 1;
            s.most = s.most.max(s.held);
            if s.until.is_some_and(|n| s.held >= n) {
                s.until = None;
                self.opened.notify_waiters();
            }
        }
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            if self.state.lock().unwrap().until.is_none() {
                break;
            }
            opened.await;
        }
    }

    fn done(&self) {
        self.state.lock().unwrap().held -= 1;
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
        // Lets any request still held go (its client has given up).
        self.gate.state.lock().unwrap().until = None;
        self.gate.opened.notify_waiters();
    }
}

impl CountingProxy {
    pub async fn start(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let gate: Arc<Gate> = Arc::default();
        let (c, g) = (counts.clone(), gate.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let counts = c.clone();
                let gate = g.clone();
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
                            if after > before {
                                gate.pass().await;
                                gate.done();
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
            gate,
            task,
        }
    }

    /// Holds every request from now on until `n` of them are held at once, then lets them all
    /// go (and every later one): calls made in one round trip fill the gate, calls made one
    /// after another never do (the first waits until its caller gives up). No timer: a loaded
    /// machine cannot make concurrent calls look serial, nor the reverse.
    pub fn gate(&self, n: usize) {
        let mut s = self.gate.state.lock().unwrap();
        s.until = Some(n);
        s.most = s.held;
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

    /// Clears the counts, and lets requests pass (a [`CountingProxy::gate`] still closed
    /// opens).
    pub fn reset(&self) {
        self.counts.lock().unwrap().clear();
        let mut s = self.gate.state.lock().unwrap();
        s.most = s.held;
        s.until = None;
        self.gate.opened.notify_waiters();
    }

    /// The most requests in the proxy at the same time since the start (or the last
    /// [`CountingProxy::reset`] or [`CountingProxy::gate`]): behind a gate of `n`, `n` exactly
    /// when the calls were made in one round trip.
    pub fn most_at_once(&self) -> usize {
        self.gate.state.lock().unwrap().most
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
