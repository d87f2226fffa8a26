//! Terraform for real: `terraform validate` of the AWS module, its submodules and both examples,
//! and `terraform apply`, `plan` (must be empty) and `destroy` of the AWS module plus the
//! registration module against moto's server on 127.0.0.1, once per endpoint (internal ALB and
//! HTTP API), with checks of what was created (tests/iac/check_moto_deploy.py, boto3).
//!
//! Terraform is the machine's executable (`scripts/tools.sh path terraform-cli`) and the AWS
//! provider comes from the filesystem mirror (`scripts/tools.sh path terraform-plugins`, the
//! `-plugin-dir`): no network. Either missing fails the test with a message; nothing skips.
//! moto runs with tests/iac/moto_server.py, which stubs only what moto lacks (listed there).
//! The registration's kubectl is tests/iac/fake_kubectl.py, a file-backed stand-in.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{root, tool};

const REGION: &str = "us-east-1";

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("tf-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Copies terraform/ and examples/ into `dest`, keeping their relative layout (the examples use
/// ../../terraform), without any local .terraform state.
fn copy_iac(dest: &Path) {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name();
            let n = name.to_string_lossy();
            if n.starts_with(".terraform") || n.ends_with(".tfstate") || n == "terraform.tfvars" {
                continue;
            }
            let (src, dst) = (entry.path(), to.join(&name));
            if entry.file_type().unwrap().is_dir() {
                copy_dir(&src, &dst);
            } else {
                std::fs::copy(&src, &dst).unwrap();
            }
        }
    }
    copy_dir(&root().join("terraform"), &dest.join("terraform"));
    copy_dir(&root().join("examples"), &dest.join("examples"));
}

struct Terraform {
    bin: String,
    plugins: String,
    env: Vec<(String, String)>,
}

impl Terraform {
    fn new(env: Vec<(String, String)>) -> Self {
        Self {
            bin: tool("terraform-cli"),
            plugins: tool("terraform-plugins"),
            env,
        }
    }

    fn run(&self, dir: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .current_dir(dir)
            .env("TF_CLI_CONFIG_FILE", "/dev/null")
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_IN_AUTOMATION", "1")
            .env_remove("TF_PLUGIN_CACHE_DIR")
            // Never a real account: no shared config or credentials files.
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .env_remove("AWS_PROFILE")
            .stdin(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.output()
            .unwrap_or_else(|e| panic!("terraform {}: cannot start: {e}", args.join(" ")))
    }

    /// Runs and requires success; the combined output goes to `log` (if given) for the leak
    /// check, and into the panic message otherwise (never containing the token: the module
    /// keeps it sensitive, which the leak check proves).
    fn ok(&self, dir: &Path, args: &[&str], log: Option<&Path>) -> Output {
        let t0 = Instant::now();
        let out = self.run(dir, args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(log) = log {
            std::fs::write(log, &text).unwrap();
        }
        assert!(
            out.status.success(),
            "terraform {} in {} failed ({}):\n{text}",
            args.join(" "),
            dir.display(),
            out.status
        );
        eprintln!(
            "terraform {} ({}): {:.1} s",
            args.first().unwrap(),
            dir.file_name().unwrap().to_string_lossy(),
            t0.elapsed().as_secs_f64()
        );
        out
    }

    fn init(&self, dir: &Path) {
        self.ok(
            dir,
            &[
                "init",
                "-input=false",
                "-no-color",
                "-backend=false",
                &format!("-plugin-dir={}", self.plugins),
            ],
            None,
        );
    }
}

#[test]
fn terraform_validates_the_module_its_submodules_and_both_examples() {
    let scratch = Scratch::new("validate");
    copy_iac(&scratch.0);
    let tf = Terraform::new(vec![]);
    for dir in [
        "terraform",
        "terraform/modules/registration",
        "terraform/modules/eks-network",
        "terraform/modules/webhook-config",
        "examples/alb",
        "examples/http-api",
    ] {
        let d = scratch.0.join(dir);
        tf.init(&d);
        let out = tf.ok(&d, &["validate", "-no-color", "-json"], None);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["valid"], true, "{dir}: {report}");
        assert_eq!(
            report["warning_count"], 0,
            "{dir}: validate warns: {report}"
        );
    }
}

/// moto's server on a free 127.0.0.1 port, stopped when dropped.
struct Moto {
    child: Child,
    url: String,
}

impl Moto {
    fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(tool("python"))
            .arg(root().join("tests/iac/moto_server.py"))
            .arg(port.to_string())
            .env("MOTO_ACM_VALIDATION_WAIT", "0")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server.py starts");
        let mut moto = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.write_all(b"GET /moto-api/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
                let mut buf = [0u8; 12];
                if s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.") {
                    return moto;
                }
            }
            if let Ok(Some(status)) = moto.child.try_wait() {
                panic!("moto_server.py exited early ({status})");
            }
            assert!(Instant::now() < deadline, "moto did not answer on {}", moto.url);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The harness root module: what the cluster side would already have (VPC, two private subnets
/// in two zones, the control plane's dedicated security group, an SNS topic), created in the
/// same apply as the module so that the module's inputs are unknown at plan time, as they are
/// when a zone or certificate is created alongside it.
fn harness(endpoint: &str, zip_b64sha256: &str) -> String {
    let (cert_inputs, cert_resource) = if endpoint == "alb" {
        // A certificate made elsewhere in the same apply, and DNS managed elsewhere.
        (
            "create_certificate = false\n  certificate_arn = aws_acm_certificate.elsewhere.arn\n  create_dns_record = false",
            "resource \"aws_acm_certificate\" \"elsewhere\" {\n  domain_name = \"podmutator.example.com\"\n  validation_method = \"DNS\"\n}",
        )
    } else {
        // The module creates and validates the certificate and the alias record in a zone
        // created in the same apply.
        ("route53_zone_id = aws_route53_zone.public[0].zone_id", "")
    };
    format!(
        r#"
provider "aws" {{
  region                      = "{REGION}"
  # The account ID is asked of moto's STS (123456789012): the provider compares it with the
  # owners moto reports, e.g. of a referenced security group.
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  s3_use_path_style           = true
}}

resource "aws_route53_zone" "public" {{
  count = {zone_count}
  name  = "example.com"
}}

resource "aws_vpc" "cluster" {{
  cidr_block = "10.0.0.0/16"
}}

resource "aws_subnet" "private" {{
  count             = 2
  vpc_id            = aws_vpc.cluster.id
  cidr_block        = "10.0.${{count.index}}.0/24"
  availability_zone = ["{REGION}a", "{REGION}b"][count.index]
}}

resource "aws_security_group" "control_plane" {{
  name_prefix = "eks-control-plane-"
  description = "Carried by the EKS control plane alone"
  vpc_id      = aws_vpc.cluster.id
}}

resource "aws_sns_topic" "alarms" {{
  name = "podmutator-alarms"
}}

{cert_resource}

module "podmutator" {{
  source = "./terraform"

  name                    = "pm-{short}"
  endpoint                = "{endpoint}"
  lambda_zip_path         = "${{path.root}}/bootstrap.zip"
  lambda_zip_base64sha256 = "{zip_b64sha256}"
  domain_name             = "podmutator.example.com"
  {cert_inputs}

  vpc_id                          = aws_vpc.cluster.id
  subnet_ids                      = aws_subnet.private[*].id
  control_plane_security_group_id = aws_security_group.control_plane.id
  alb_deletion_protection         = false

  alarm_topic_arns  = [aws_sns_topic.alarms.arn]
  dashboard_enabled = {dashboard}
}}

module "registration" {{
  source = "./terraform/modules/registration"

  registration = module.podmutator.registration
  kubectl      = "${{path.root}}/kubectl"
  depends_on   = [module.podmutator]
}}

output "function_name" {{ value = module.podmutator.function_name }}
output "path_token_secret_arn" {{ value = module.podmutator.path_token_secret_arn }}
output "path_token_sha256" {{ value = module.podmutator.path_token_sha256 }}
output "target_group_arn" {{ value = module.podmutator.target_group_arn }}
output "api_id" {{ value = module.podmutator.api_id }}
output "dns_target_name" {{ value = module.podmutator.dns_target_name }}
output "control_plane_security_group_id" {{ value = aws_security_group.control_plane.id }}
output "alarm_topic_arn" {{ value = aws_sns_topic.alarms.arn }}
output "zone_id" {{ value = one(aws_route53_zone.public[*].zone_id) }}
"#,
        zone_count = if endpoint == "alb" { 0 } else { 1 },
        short = endpoint.replace('_', "-"),
        dashboard = endpoint != "alb",
    )
}

/// A zip with a `bootstrap` in it: moto stores the code without running it.
fn write_zip(path: &Path) -> String {
    let script = format!(
        "import base64,hashlib,sys,zipfile\nz=zipfile.ZipFile(sys.argv[1],'w')\nz.writestr('bootstrap','#!/bin/sh\\n')\nz.close()\nprint(base64.b64encode(hashlib.sha256(open(sys.argv[1],'rb').read()).digest()).decode())"
    );
    let out = Command::new(tool("python"))
        .args(["-c", &script])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn check(mode: &str, endpoint: &str, dir: &Path, env: &[(String, String)], logs: &[PathBuf]) {
    let mut cmd = Command::new(tool("python"));
    cmd.arg(root().join("tests/iac/check_moto_deploy.py"))
        .args([mode, endpoint])
        .arg(dir.join("outputs.json"))
        .arg(dir.join("kube"))
        .args(logs)
        .current_dir(root().join("tests/iac"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "check_moto_deploy.py {mode} {endpoint} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn apply_and_destroy(endpoint: &str) {
    let t0 = Instant::now();
    let moto = Moto::start();
    let scratch = Scratch::new(&format!("apply-{endpoint}"));
    let dir = &scratch.0;
    copy_iac(dir);
    let kube = dir.join("kube");
    std::fs::create_dir_all(&kube).unwrap();
    let kubectl = dir.join("kubectl");
    std::fs::write(
        &kubectl,
        format!(
            "#!/bin/sh\nexec '{}' '{}' \"$@\"\n",
            tool("python"),
            root().join("tests/iac/fake_kubectl.py").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &kubectl,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let zip = dir.join("bootstrap.zip");
    let hash = write_zip(&zip);
    std::fs::write(dir.join("main.tf"), harness(endpoint, &hash)).unwrap();

    let env: Vec<(String, String)> = [
        ("AWS_ENDPOINT_URL", moto.url.as_str()),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", REGION),
        ("AWS_DEFAULT_REGION", REGION),
        ("FAKE_KUBE_DIR", kube.to_str().unwrap()),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let tf = Terraform::new(env.clone());
    tf.init(dir);
    let apply_log = dir.join("apply.log");
    tf.ok(
        dir,
        &["apply", "-auto-approve", "-input=false", "-no-color"],
        Some(&apply_log),
    );
    let outputs = tf.ok(dir, &["output", "-json", "-no-color"], None);
    std::fs::write(dir.join("outputs.json"), &outputs.stdout).unwrap();

    // The zip is needed only to upload code: plan and destroy work without it.
    std::fs::remove_file(&zip).unwrap();

    // A second plan changes nothing: the generated token stays (the password data source draws
    // a new one every plan), and no attribute drifts.
    let plan_log = dir.join("plan.log");
    let plan = tf.run(
        dir,
        &["plan", "-input=false", "-no-color", "-detailed-exitcode"],
    );
    let plan_text = format!(
        "{}{}",
        String::from_utf8_lossy(&plan.stdout),
        String::from_utf8_lossy(&plan.stderr)
    );
    std::fs::write(&plan_log, &plan_text).unwrap();
    check("applied", endpoint, dir, &env, &[apply_log.clone(), plan_log.clone()]);
    assert_eq!(
        plan.status.code(),
        Some(0),
        "{endpoint}: the plan after apply is not empty (0 = no changes, 2 = changes):\n{plan_text}"
    );

    let destroy_log = dir.join("destroy.log");
    tf.ok(
        dir,
        &["destroy", "-auto-approve", "-input=false", "-no-color"],
        Some(&destroy_log),
    );
    check(
        "destroyed",
        endpoint,
        dir,
        &env,
        &[apply_log, plan_log, destroy_log],
    );
    eprintln!(
        "{endpoint}: apply, plan, destroy against moto in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn terraform_applies_and_destroys_the_alb_endpoint_against_moto() {
    apply_and_destroy("alb");
}

#[test]
fn terraform_applies_and_destroys_the_http_api_endpoint_against_moto() {
    apply_and_destroy("http_api");
}
