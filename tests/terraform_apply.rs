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

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{root, tool};

const REGION: &str = "us-east-1";
/// The reference init container's image, as a deployment pins it.
const FETCHER_IMAGE: &str = "registry.example/podmutator@sha256:0000000000000000000000000000000000000000000000000000000000000000";

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
        "terraform/modules/pod-identity",
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
            assert!(
                Instant::now() < deadline,
                "moto did not answer on {}",
                moto.url
            );
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
fn harness(endpoint: &str, zip_b64sha256: &str, zone_id: &str) -> String {
    let (cert_inputs, cert_resource) = if endpoint == "alb" {
        // A certificate made elsewhere in the same apply, and DNS managed elsewhere.
        (
            "create_certificate = false\n  certificate_arn = aws_acm_certificate.elsewhere.arn\n  create_dns_record = false",
            "resource \"aws_acm_certificate\" \"elsewhere\" {\n  domain_name = \"podmutator.example.com\"\n  validation_method = \"DNS\"\n}",
        )
    } else {
        // The module creates and validates the certificate and the alias record in the zone
        // (created beforehand through moto's API: Terraform would wait ~15 s for each change).
        ("route53_zone_id = var.zone_id", "")
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

variable "zone_id" {{
  type    = string
  default = "{zone_id}"
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
  {delivery_inputs}
}}

variable "failure_policy" {{
  type    = string
  default = null
}}

module "registration" {{
  source = "./terraform/modules/registration"

  registration   = module.podmutator.registration
  failure_policy = var.failure_policy
  kubectl        = "${{path.root}}/kubectl"
  depends_on     = [module.podmutator]
}}

output "function_name" {{ value = module.podmutator.function_name }}
output "path_token_secret_arn" {{ value = module.podmutator.path_token_secret_arn }}
output "path_token_sha256" {{ value = module.podmutator.path_token_sha256 }}
output "target_group_arn" {{ value = module.podmutator.target_group_arn }}
output "api_id" {{ value = module.podmutator.api_id }}
output "dns_target_name" {{ value = module.podmutator.dns_target_name }}
output "control_plane_security_group_id" {{ value = aws_security_group.control_plane.id }}
output "alarm_topic_arn" {{ value = aws_sns_topic.alarms.arn }}
output "zone_id" {{ value = var.zone_id }}
"#,
        short = endpoint.replace('_', "-"),
        dashboard = endpoint != "alb",
        // The module refuses value delivery on the internet-facing endpoint.
        delivery_inputs = if endpoint == "alb" {
            String::new()
        } else {
            format!("embedded_delivery = \"reference\"\n  fetcher_image = \"{FETCHER_IMAGE}\"")
        },
    )
}

/// A public hosted zone for example.com, made through moto's API.
fn create_zone(env: &[(String, String)]) -> String {
    let mut cmd = Command::new(tool("python"));
    cmd.args([
        "-c",
        "import boto3,time; print(boto3.client('route53').create_hosted_zone(Name='example.com', CallerReference=str(time.time()))['HostedZone']['Id'].split('/')[-1])",
    ]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", combined(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A zip with a `bootstrap` in it: moto stores the code without running it.
fn write_zip(path: &Path) -> String {
    let script = "import base64,hashlib,sys,zipfile\nz=zipfile.ZipFile(sys.argv[1],'w')\nz.writestr('bootstrap','#!/bin/sh\\n')\nz.close()\nprint(base64.b64encode(hashlib.sha256(open(sys.argv[1],'rb').read()).digest()).decode())";
    let out = Command::new(tool("python"))
        .args(["-c", script])
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
    let mut env = moto_env(&moto);
    env.push(("FAKE_KUBE_DIR".into(), kube.to_str().unwrap().into()));
    let zone_id = if endpoint == "alb" {
        String::new()
    } else {
        create_zone(&env)
    };
    std::fs::write(dir.join("main.tf"), harness(endpoint, &hash, &zone_id)).unwrap();
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
    check(
        "applied",
        endpoint,
        dir,
        &env,
        &[apply_log.clone(), plan_log.clone()],
    );
    assert_eq!(
        plan.status.code(),
        Some(0),
        "{endpoint}: the plan after apply is not empty (0 = no changes, 2 = changes):\n{plan_text}"
    );

    // Fail open as docs/deploy.md says: the variable, then apply, without the zip. Only the
    // registration changes (no code redeploy, nothing else touched), the cluster's object says
    // Ignore, and the replaced instance's delete leaves the newer object alone.
    let failopen_log = dir.join("failopen-plan.log");
    let failopen_plan = dir.join("failopen.tfplan");
    tf.ok(
        dir,
        &[
            "plan",
            "-input=false",
            "-no-color",
            "-var=failure_policy=Ignore",
            &format!("-out={}", failopen_plan.display()),
        ],
        Some(&failopen_log),
    );
    // In memory only: `show -json` prints sensitive values in clear.
    let show: serde_json::Value = serde_json::from_slice(
        &tf.run(dir, &["show", "-json", failopen_plan.to_str().unwrap()])
            .stdout,
    )
    .expect("terraform show -json");
    let changed: Vec<String> = show["resource_changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| {
            let actions = &c["change"]["actions"];
            actions != &serde_json::json!(["no-op"]) && actions != &serde_json::json!(["read"])
        })
        .map(|c| c["address"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        changed,
        ["module.registration.terraform_data.registration"],
        "{endpoint}: failing open must change the registration and nothing else"
    );
    let failopen_apply_log = dir.join("failopen-apply.log");
    tf.ok(
        dir,
        &[
            "apply",
            "-input=false",
            "-no-color",
            failopen_plan.to_str().unwrap(),
        ],
        Some(&failopen_apply_log),
    );
    let registered: serde_json::Value =
        serde_json::from_slice(&std::fs::read(kube.join("podmutator.json")).unwrap()).unwrap();
    let policies: Vec<&str> = registered["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["failurePolicy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["Ignore"], "{endpoint}: not failed open");

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
        &[
            apply_log,
            plan_log,
            failopen_log,
            failopen_apply_log,
            destroy_log,
        ],
    );
    eprintln!(
        "{endpoint}: apply, plan, destroy against moto in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// The three moto scenarios run side by side: they spend most of their time in the provider's
/// fixed waits (30 s before the first check that an ALB is active, 10-30 s per Route 53 change),
/// not on the CPU, and the test harness would otherwise run them one or two at a time.
#[test]
fn terraform_against_moto_alb_http_api_and_eks_network() {
    let t0 = Instant::now();
    let runs: Vec<(&str, std::thread::JoinHandle<()>)> = vec![
        ("alb", std::thread::spawn(|| apply_and_destroy("alb"))),
        (
            "http_api",
            std::thread::spawn(|| apply_and_destroy("http_api")),
        ),
        ("eks-network", std::thread::spawn(eks_network_scenario)),
    ];
    let failed: Vec<&str> = runs
        .into_iter()
        .filter_map(|(name, h)| h.join().is_err().then_some(name))
        .collect();
    assert!(
        failed.is_empty(),
        "failed against moto: {failed:?} (see above)"
    );
    eprintln!("all moto scenarios in {:.1} s", t0.elapsed().as_secs_f64());
}

fn provider_block() -> String {
    format!(
        r#"
provider "aws" {{
  region                      = "{REGION}"
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  s3_use_path_style           = true
}}
"#
    )
}

fn moto_env(moto: &Moto) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", moto.url.as_str()),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_REGION", REGION),
        ("AWS_DEFAULT_REGION", REGION),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn combined(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `modules/eks-network` against an EKS cluster in moto whose VPC has what eksctl makes: a public
/// and a private subnet in one zone, two private subnets in another. It must pick the private
/// (kubernetes.io/role/internal-elb) subnets, one per zone, and the control plane's additional
/// security group; and refuse the cluster security group, and a group the cluster does not
/// have. The AWS module must refuse two ALB subnets in one zone before CreateLoadBalancer would.
fn eks_network_scenario() {
    let moto = Moto::start();
    let scratch = Scratch::new("eks-network");
    copy_iac(&scratch.0);
    let tf = Terraform::new(moto_env(&moto));

    // 1. The cluster side, as eksctl leaves it.
    let cluster = scratch.0.join("cluster");
    std::fs::create_dir_all(&cluster).unwrap();
    std::fs::write(
        cluster.join("main.tf"),
        provider_block()
            + r#"
resource "aws_vpc" "cluster" {
  cidr_block = "10.1.0.0/16"
}

locals {
  subnets = {
    a_private  = { zone = "us-east-1a", cidr = "10.1.0.0/24", tag = "kubernetes.io/role/internal-elb" }
    a_public   = { zone = "us-east-1a", cidr = "10.1.1.0/24", tag = "kubernetes.io/role/elb" }
    b_private  = { zone = "us-east-1b", cidr = "10.1.2.0/24", tag = "kubernetes.io/role/internal-elb" }
    b_private2 = { zone = "us-east-1b", cidr = "10.1.3.0/24", tag = "kubernetes.io/role/internal-elb" }
  }
}

resource "aws_subnet" "this" {
  for_each          = local.subnets
  vpc_id            = aws_vpc.cluster.id
  cidr_block        = each.value.cidr
  availability_zone = each.value.zone
  tags              = { (each.value.tag) = "1" }
}

resource "aws_security_group" "control_plane" {
  name_prefix = "eks-control-plane-"
  description = "Carried by the EKS control plane alone"
  vpc_id      = aws_vpc.cluster.id
}

resource "aws_security_group" "unrelated" {
  name_prefix = "unrelated-"
  description = "Not the cluster's"
  vpc_id      = aws_vpc.cluster.id
}

resource "aws_iam_role" "cluster" {
  name_prefix        = "eks-"
  assume_role_policy = jsonencode({ Version = "2012-10-17", Statement = [{ Effect = "Allow", Action = "sts:AssumeRole", Principal = { Service = "eks.amazonaws.com" } }] })
}

resource "aws_eks_cluster" "this" {
  name     = "flyte"
  role_arn = aws_iam_role.cluster.arn
  vpc_config {
    subnet_ids         = [for k, s in aws_subnet.this : s.id]
    security_group_ids = [aws_security_group.control_plane.id]
  }
}

output "subnets" { value = { for k, s in aws_subnet.this : k => s.id } }
output "control_plane_sg" { value = aws_security_group.control_plane.id }
output "unrelated_sg" { value = aws_security_group.unrelated.id }
"#,
    )
    .unwrap();
    tf.init(&cluster);
    tf.ok(
        &cluster,
        &["apply", "-auto-approve", "-input=false", "-no-color"],
        None,
    );
    let facts: serde_json::Value =
        serde_json::from_slice(&tf.ok(&cluster, &["output", "-json"], None).stdout).unwrap();
    let subnet = |k: &str| facts["subnets"]["value"][k].as_str().unwrap().to_owned();
    let control_plane_sg = facts["control_plane_sg"]["value"].as_str().unwrap();
    let unrelated_sg = facts["unrelated_sg"]["value"].as_str().unwrap();

    // 2. The convenience module, as examples/alb uses it.
    let net = scratch.0.join("net");
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(
        net.join("main.tf"),
        provider_block()
            + r#"
variable "control_plane_security_group_id" {
  type    = string
  default = null
}

module "network" {
  source                          = "../terraform/modules/eks-network"
  cluster_name                    = "flyte"
  control_plane_security_group_id = var.control_plane_security_group_id
}

output "vpc_id" { value = module.network.vpc_id }
output "subnet_ids" { value = module.network.subnet_ids }
output "control_plane_security_group_id" { value = module.network.control_plane_security_group_id }
output "cluster_security_group_id" { value = module.network.cluster_security_group_id }
"#,
    )
    .unwrap();
    tf.init(&net);
    tf.ok(
        &net,
        &["apply", "-auto-approve", "-input=false", "-no-color"],
        None,
    );
    let out: serde_json::Value =
        serde_json::from_slice(&tf.ok(&net, &["output", "-json"], None).stdout).unwrap();
    let mut picked: Vec<String> = out["subnet_ids"]["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    picked.sort();
    let b = {
        let mut b = [subnet("b_private"), subnet("b_private2")];
        b.sort();
        b[0].clone()
    };
    let mut want = vec![subnet("a_private"), b];
    want.sort();
    assert_eq!(
        picked, want,
        "eks-network must pick the internal-elb subnets, the lowest ID per zone"
    );
    assert_eq!(
        out["control_plane_security_group_id"]["value"], control_plane_sg,
        "the cluster's one additional security group"
    );
    let cluster_sg = out["cluster_security_group_id"]["value"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(cluster_sg.starts_with("sg-") && cluster_sg != control_plane_sg);

    for (sg, why) in [
        (
            cluster_sg.as_str(),
            "control_plane_security_group_id is the EKS cluster security group",
        ),
        (
            unrelated_sg,
            "is not one of the cluster's additional security groups",
        ),
    ] {
        let out = tf.run(
            &net,
            &[
                "plan",
                "-input=false",
                "-no-color",
                &format!("-var=control_plane_security_group_id={sg}"),
            ],
        );
        let text = combined(&out);
        assert!(!out.status.success(), "eks-network accepted {sg}:\n{text}");
        assert!(
            text.replace('\n', " ").contains(why),
            "eks-network refused {sg} for another reason than {why:?}:\n{text}"
        );
    }

    // 3. Two ALB subnets in one zone (eksctl's public + private): refused at plan time.
    let alb = scratch.0.join("alb");
    std::fs::create_dir_all(&alb).unwrap();
    std::fs::write(
        alb.join("main.tf"),
        provider_block()
            + &format!(
                r#"
module "podmutator" {{
  source                          = "../terraform"
  lambda_zip_path                 = "bootstrap.zip"
  lambda_zip_base64sha256         = "{hash}"
  domain_name                     = "podmutator.example.com"
  create_certificate              = false
  certificate_arn                 = "arn:aws:acm:{REGION}:123456789012:certificate/00000000-0000-0000-0000-000000000000"
  create_dns_record               = false
  vpc_id                          = "{vpc}"
  subnet_ids                      = ["{a_private}", "{a_public}"]
  control_plane_security_group_id = "{control_plane_sg}"
}}
"#,
                hash = "A".repeat(43) + "=",
                vpc = out_vpc(&net, &tf),
                a_private = subnet("a_private"),
                a_public = subnet("a_public"),
            ),
    )
    .unwrap();
    tf.init(&alb);
    let out = tf.run(&alb, &["plan", "-input=false", "-no-color"]);
    let text = combined(&out);
    assert!(
        !out.status.success(),
        "two ALB subnets in one zone were accepted:\n{text}"
    );
    assert!(
        text.replace('\n', " ")
            .contains("subnet_ids must hold one subnet per availability zone"),
        "refused for another reason:\n{text}"
    );
}

fn out_vpc(dir: &Path, tf: &Terraform) -> String {
    let out: serde_json::Value =
        serde_json::from_slice(&tf.ok(dir, &["output", "-json"], None).stdout).unwrap();
    out["vpc_id"]["value"].as_str().unwrap().to_owned()
}

/// Hole 10 of issue 25: the HTTP API is on the internet and the path token is quoted to pod
/// creators in the API server's errors, so the module refuses to put a value-delivery function
/// behind it (a variable validation, at plan time, before anything is created). Reference
/// delivery with env vars by exec is what that endpoint may serve, and plans cleanly.
#[test]
fn terraform_refuses_value_delivery_behind_the_http_api() {
    let moto = Moto::start();
    let scratch = Scratch::new("public-value");
    copy_iac(&scratch.0);
    let tf = Terraform::new(moto_env(&moto));
    let plan = |name: &str, delivery: &str| -> Output {
        let dir = scratch.0.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("main.tf"),
            provider_block()
                + &format!(
                    r#"
module "podmutator" {{
  source                  = "../terraform"
  endpoint                = "http_api"
  lambda_zip_path         = "bootstrap.zip"
  lambda_zip_base64sha256 = "{hash}"
  domain_name             = "podmutator.example.com"
  create_certificate      = false
  certificate_arn         = "arn:aws:acm:{REGION}:123456789012:certificate/00000000-0000-0000-0000-000000000000"
  create_dns_record       = false
  {delivery}
}}
"#,
                    hash = "A".repeat(43) + "=",
                ),
        )
        .unwrap();
        tf.init(&dir);
        tf.run(&dir, &["plan", "-input=false", "-no-color"])
    };
    let refusal = "cannot serve Embedded value delivery";
    for (name, delivery) in [
        ("default-value", ""),
        (
            "reference-env-by-value",
            &format!(
                "embedded_delivery = \"reference\"\n  embedded_env_var_delivery = \"value\"\n  fetcher_image = \"{FETCHER_IMAGE}\""
            ) as &str,
        ),
    ] {
        let out = plan(name, delivery);
        let text = combined(&out);
        assert!(!out.status.success(), "{name}: planned:\n{text}");
        assert!(
            text.replace('\n', " ").replace("│ ", "").contains(refusal),
            "{name}: refused for another reason:\n{text}"
        );
    }
    let out = plan(
        "reference",
        &format!("embedded_delivery = \"reference\"\n  fetcher_image = \"{FETCHER_IMAGE}\""),
    );
    let text = combined(&out);
    assert!(out.status.success(), "reference delivery refused:\n{text}");
    assert!(!text.contains(refusal), "{text}");
}

/// Issue 26, items 3, 4, 16 and 18: what a plan settles before anything is created. Without a
/// token the function is told so (`http.pathTokenDisabled`), and the binary's start-up gate
/// accepts the planned environment, which it refuses without that key; an environment over
/// Lambda's 4 KB is refused with its size; ALB access logs, which record the token, are refused
/// unless acknowledged; a previous token's hash must be a hash, beside a token.
#[test]
fn terraform_plans_refuse_what_lambda_or_the_function_would_refuse() {
    let moto = Moto::start();
    let scratch = Scratch::new("plan-checks");
    copy_iac(&scratch.0);
    let tf = Terraform::new(moto_env(&moto));
    let plan = |name: &str, inputs: &str| -> (Output, PathBuf) {
        let dir = scratch.0.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("main.tf"),
            provider_block()
                + &format!(
                    r#"
module "podmutator" {{
  source                  = "../terraform"
  endpoint                = "http_api"
  lambda_zip_path         = "bootstrap.zip"
  lambda_zip_base64sha256 = "{hash}"
  domain_name             = "podmutator.example.com"
  create_certificate      = false
  certificate_arn         = "arn:aws:acm:{REGION}:123456789012:certificate/00000000-0000-0000-0000-000000000000"
  create_dns_record       = false
  embedded_delivery       = "reference"
  fetcher_image           = "{FETCHER_IMAGE}"
  {inputs}
}}
"#,
                    hash = "A".repeat(43) + "=",
                ),
        )
        .unwrap();
        tf.init(&dir);
        let out = tf.run(
            &dir,
            &["plan", "-input=false", "-no-color", "-out=plan.tfplan"],
        );
        (out, dir)
    };
    let one_line = |out: &Output| combined(out).replace('\n', " ").replace("│ ", "");
    let planned_config =
        |dir: &Path| -> serde_json::Value {
            let show: serde_json::Value =
                serde_json::from_slice(&tf.ok(dir, &["show", "-json", "plan.tfplan"], None).stdout)
                    .unwrap();
            let function = show["resource_changes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["type"] == "aws_lambda_function")
                .expect("the plan creates the function");
            let env = &function["change"]["after"]["environment"][0]["variables"];
            serde_json::from_str(env["PODMUTATOR_CONFIG"].as_str().unwrap_or_else(|| {
                panic!("PODMUTATOR_CONFIG is not known at plan time: {function}")
            }))
            .unwrap()
        };
    let check_config = |config: &serde_json::Value| -> Output {
        Command::new(env!("CARGO_BIN_EXE_podmutator"))
            .arg("check-config")
            .env_remove("PODMUTATOR_CONFIG_FILE")
            .env("PODMUTATOR_CONFIG", config.to_string())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };

    // Item 16: the token off.
    let (out, dir) = plan("token-off", "path_token_enabled = false");
    assert!(out.status.success(), "token off: {}", combined(&out));
    let config = planned_config(&dir);
    assert_eq!(
        config["http"],
        serde_json::json!({"maxBodyBytes": 6291456, "pathTokenDisabled": true}),
        "{config}"
    );
    let started = check_config(&config);
    assert!(
        started.status.success(),
        "the function refuses the planned configuration: {}",
        combined(&started)
    );
    let mut without = config.clone();
    without["http"]
        .as_object_mut()
        .unwrap()
        .remove("pathTokenDisabled");
    let refused = check_config(&without);
    assert!(
        !refused.status.success() && combined(&refused).contains("no path token"),
        "without pathTokenDisabled the function starts: {}",
        combined(&refused)
    );

    // Item 4: 40 image rules (a registry per team) make a 6 KB environment.
    let rules: Vec<String> = (0..40)
        .map(|i| format!("{{ match = \"registry{i}.example.com/team/project\", replace = \"123456789012.dkr.ecr.{REGION}.amazonaws.com/mirror/registry{i}\" }}"))
        .collect();
    let (out, _) = plan(
        "too-large",
        &format!("images_config = {{ rules = [{}] }}", rules.join(", ")),
    );
    let text = one_line(&out);
    assert!(!out.status.success(), "a 6 KB environment planned: {text}");
    assert!(
        text.contains("would be 6")
            && text.contains("bytes, and Lambda refuses more than 4096")
            && text.contains("fewer images rules"),
        "refused for another reason: {text}"
    );
    // Ten of them fit (about 2.4 KB).
    let (out, _) = plan(
        "ten-rules",
        &format!("images_config = {{ rules = [{}] }}", rules[..10].join(", ")),
    );
    assert!(out.status.success(), "ten rules: {}", combined(&out));

    // Item 18: ALB access logs record the path, token included.
    let (out, _) = plan("access-logs", "alb_access_logs_bucket = \"logs-bucket\"");
    let text = one_line(&out);
    assert!(
        !out.status.success(),
        "access logs with the token planned: {text}"
    );
    assert!(
        text.contains("ALB access logs record every request's URL"),
        "refused for another reason: {text}"
    );
    let (out, _) = plan(
        "access-logs-acknowledged",
        "alb_access_logs_bucket = \"logs-bucket\"\n  alb_access_logs_record_path_token = true",
    );
    assert!(out.status.success(), "acknowledged: {}", combined(&out));

    // Item 3: the previous token's hash.
    let previous = "ab".repeat(32);
    let (out, _) = plan(
        "previous-not-a-hash",
        "previous_path_token_sha256 = \"not-a-hash\"",
    );
    let text = one_line(&out);
    assert!(
        !out.status.success() && text.contains("64 lowercase hex digits"),
        "a previous token that is no hash: {text}"
    );
    let (out, _) = plan(
        "previous-without-token",
        &format!("path_token_enabled = false\n  previous_path_token_sha256 = \"{previous}\""),
    );
    let text = one_line(&out);
    assert!(
        !out.status.success() && text.contains("it needs path_token_enabled = true"),
        "a previous token without a token: {text}"
    );
    let (out, _) = plan(
        "previous",
        &format!("previous_path_token_sha256 = \"{previous}\""),
    );
    assert!(out.status.success(), "previous: {}", combined(&out));
}

/// Issue 26, item 3: a rotation as docs/deploy.md ("Rotating the path token") runs it. The apply
/// that raises path_token_version with previous_path_token_sha256 leaves the function accepting
/// `[new, previous]` and the registration on the new token; the next apply, without the
/// previous hash, leaves `new` alone; a plan after that is empty.
#[test]
fn terraform_rotates_the_path_token_keeping_the_previous_for_one_apply() {
    let moto = Moto::start();
    let scratch = Scratch::new("rotation");
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
    let hash = write_zip(&dir.join("bootstrap.zip"));
    std::fs::write(
        dir.join("main.tf"),
        provider_block()
            + &format!(
                r#"
variable "path_token_version" {{
  type    = number
  default = 1
}}
variable "previous_path_token_sha256" {{
  type    = string
  default = null
}}
resource "aws_acm_certificate" "elsewhere" {{
  domain_name       = "podmutator.example.com"
  validation_method = "DNS"
}}
module "podmutator" {{
  source                     = "./terraform"
  name                       = "pm-rotation"
  endpoint                   = "http_api"
  lambda_zip_path            = "${{path.root}}/bootstrap.zip"
  lambda_zip_base64sha256    = "{hash}"
  domain_name                = "podmutator.example.com"
  create_certificate         = false
  certificate_arn            = aws_acm_certificate.elsewhere.arn
  create_dns_record          = false
  embedded_delivery          = "reference"
  fetcher_image              = "{FETCHER_IMAGE}"
  alarms_enabled             = false
  path_token_version         = var.path_token_version
  previous_path_token_sha256 = var.previous_path_token_sha256
}}
module "registration" {{
  source       = "./terraform/modules/registration"
  registration = module.podmutator.registration
  kubectl      = "${{path.root}}/kubectl"
  depends_on   = [module.podmutator]
}}
output "path_token_sha256" {{ value = module.podmutator.path_token_sha256 }}
output "function_name" {{ value = module.podmutator.function_name }}
"#
            ),
    )
    .unwrap();
    let mut env = moto_env(&moto);
    env.push(("FAKE_KUBE_DIR".into(), kube.to_str().unwrap().into()));
    let tf = Terraform::new(env.clone());
    tf.init(dir);
    let apply = |vars: &[&str]| {
        let mut args = vec!["apply", "-auto-approve", "-input=false", "-no-color"];
        args.extend_from_slice(vars);
        tf.ok(dir, &args, None);
    };
    let output = |name: &str| -> String {
        let out = tf.ok(dir, &["output", "-raw", name], None);
        String::from_utf8(out.stdout).unwrap()
    };
    // What the `live` alias serves: the function's http section, read back from moto.
    let live_http = || -> serde_json::Value {
        let mut cmd = Command::new(tool("python"));
        cmd.args([
            "-c",
            "import boto3,json,sys; c=boto3.client('lambda').get_function_configuration(FunctionName=sys.argv[1], Qualifier='live'); print(json.dumps(json.loads(c['Environment']['Variables']['PODMUTATOR_CONFIG'])['http']))",
        ])
        .arg(output("function_name"))
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null");
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", combined(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // The hashes of the tokens in the registration's URLs (the tokens themselves stay in here).
    let registered_hashes = || -> std::collections::BTreeSet<String> {
        let registered: serde_json::Value =
            serde_json::from_slice(&std::fs::read(kube.join("podmutator.json")).unwrap()).unwrap();
        registered["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                let url = w["clientConfig"]["url"].as_str().unwrap();
                let token = url
                    .trim_start_matches("https://")
                    .split('/')
                    .nth(1)
                    .unwrap();
                use sha2::Digest;
                hex::encode(sha2::Sha256::digest(token.as_bytes()))
            })
            .collect()
    };

    apply(&[]);
    let first = output("path_token_sha256");
    assert_eq!(live_http()["pathTokenSha256"], first.as_str());
    assert_eq!(registered_hashes(), [first.clone()].into());

    // Steps 1 and 2: the function accepts both, then the registration moves.
    apply(&[
        "-var=path_token_version=2",
        &format!("-var=previous_path_token_sha256={first}"),
    ]);
    let second = output("path_token_sha256");
    assert_ne!(
        second, first,
        "raising path_token_version drew no new token"
    );
    assert_eq!(
        live_http()["pathTokenSha256"],
        serde_json::json!([second, first]),
        "during the rotation the function accepts the new and the previous token"
    );
    assert_eq!(registered_hashes(), [second.clone()].into());

    // Step 3: the previous token is dropped; nothing else changes.
    apply(&["-var=path_token_version=2"]);
    assert_eq!(live_http()["pathTokenSha256"], second.as_str());
    assert_eq!(registered_hashes(), [second.clone()].into());
    let plan = tf.run(
        dir,
        &[
            "plan",
            "-input=false",
            "-no-color",
            "-detailed-exitcode",
            "-var=path_token_version=2",
        ],
    );
    assert_eq!(plan.status.code(), Some(0), "{}", combined(&plan));
}
