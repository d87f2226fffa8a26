//! Terraform for real: `terraform apply`, `plan` (must be empty) and `destroy` of the AWS module
//! plus the registration module against moto's server on 127.0.0.1, once per endpoint (internal
//! ALB and HTTP API), with checks of what was created (tests/iac/check_moto_deploy.py, boto3);
//! both examples applied, destroyed and applied again as a user would (the ALB's with its
//! state in examples/backend-s3's bucket, set up as docs/deploy.md writes it), with the
//! registration drift check (scripts/registration-drift.sh) in between, the ALB example's
//! protected destroy refused before anything is deleted and its removal as docs/deploy.md writes
//! it; the AWS module's own deletion guard; plans that must be refused; a token rotation by the
//! runbook's commands, and a lower token version refused; `terraform validate` of what no test
//! applies. Every apply's output must be free of warnings.
//!
//! Terraform is the machine's executable (`scripts/tools.sh path terraform-cli`; missing fails
//! the test with a message, nothing skips). The AWS provider comes from the filesystem mirror
//! when the machine has one (`-plugin-dir`: no network), else `terraform init` installs it from
//! the registry (`scripts/tools.sh terraform-init-args` says which).
//! moto runs with tests/iac/moto_server.py, which stubs only what moto lacks (listed there).
//! The registration's kubectl is tests/iac/fake_kubectl.py, a file-backed stand-in, and the
//! examples' `aws eks update-kubeconfig` is tests/iac/fake_aws.py, which asks moto.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use common::aws::{Moto, boto3};
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

/// A scenario's own moto server and directory, the directory holding a copy of terraform/ and
/// examples/ ([`copy_iac`]); `env` is what its commands run with: moto's, and what the scenario
/// adds.
struct Site {
    moto: Moto,
    scratch: Scratch,
    env: Vec<(String, String)>,
}

impl Site {
    fn new(name: &str) -> Self {
        let moto = Moto::start();
        let scratch = Scratch::new(name);
        copy_iac(&scratch.0);
        let env = moto.env(REGION);
        Self { moto, scratch, env }
    }

    fn dir(&self) -> &Path {
        &self.scratch.0
    }

    /// A fake cluster: `kube/`, where tests/iac/fake_kubectl.py keeps its objects
    /// (FAKE_KUBE_DIR), and that stand-in as `kubectl` in the directory, where a root module's
    /// registration finds it (`${path.root}/kubectl`). Returns `kube/`.
    fn fake_cluster(&mut self) -> PathBuf {
        let kube = self.dir().join("kube");
        std::fs::create_dir_all(&kube).unwrap();
        common::stand_in(self.dir(), "kubectl", "fake_kubectl.py");
        self.env
            .push(("FAKE_KUBE_DIR".into(), kube.to_str().unwrap().into()));
        kube
    }

    fn terraform(&self) -> Terraform {
        Terraform::new(self.env.clone())
    }
}

/// How `terraform init` gets the AWS provider, as `scripts/tools.sh terraform-init-args`
/// decides: its arguments (`-plugin-dir=<mirror>`, or none for the registry) and its note.
fn provider_init_args(env: &[(&str, &str)]) -> (Vec<String>, String) {
    let mut cmd = Command::new(root().join("scripts/tools.sh"));
    cmd.arg("terraform-init-args").stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("scripts/tools.sh runs");
    assert!(
        out.status.success(),
        "scripts/tools.sh terraform-init-args failed: {}",
        combined(&out)
    );
    let args = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    (args, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The provider's directory in a filesystem mirror, for this machine.
fn mirror_rel() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!(
        "registry.terraform.io/hashicorp/aws/5.100.0/{}_{arch}",
        std::env::consts::OS
    )
}

/// A machine without a provider mirror installs the provider from the registry instead of
/// failing; one with a mirror stays offline. The choice is checked here
/// with mirrors made for the purpose (an explicit TF_PLUGIN_MIRROR replaces the usual places,
/// so the machine's own mirror cannot hide the fallback); nothing is downloaded.
#[test]
fn terraform_init_uses_a_provider_mirror_or_falls_back_to_the_registry() {
    let scratch = Scratch::new("mirror-choice");
    let empty = scratch.0.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (args, note) = provider_init_args(&[("TF_PLUGIN_MIRROR", empty.to_str().unwrap())]);
    assert_eq!(args, Vec::<String>::new(), "{note}");
    assert!(
        note.contains("no provider mirror") && note.contains("registry.terraform.io"),
        "{note}"
    );

    // A mirror holding the provider, in terraform providers mirror's layout.
    let mirror = scratch.0.join("mirror");
    let dir = mirror.join(mirror_rel());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("terraform-provider-aws_v5.100.0_x5"), b"").unwrap();
    let (args, note) = provider_init_args(&[("TF_PLUGIN_MIRROR", mirror.to_str().unwrap())]);
    assert_eq!(
        args,
        [format!("-plugin-dir={}", mirror.display())],
        "{note}"
    );
    assert!(note.contains("offline"), "{note}");

    // Another version of the provider is no mirror for this one.
    let other = scratch.0.join("other");
    let dir = other.join(mirror_rel().replace("5.100.0", "5.99.0"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("terraform-provider-aws_v5.99.0_x5"), b"").unwrap();
    let (args, _) = provider_init_args(&[("TF_PLUGIN_MIRROR", other.to_str().unwrap())]);
    assert_eq!(args, Vec::<String>::new());

    // The tests' init follows the choice.
    assert_eq!(
        Terraform::init_args(&[format!("-plugin-dir={}", mirror.display())], &[]),
        [
            "init".to_owned(),
            "-input=false".into(),
            "-no-color".into(),
            format!("-plugin-dir={}", mirror.display())
        ]
    );
    assert_eq!(
        Terraform::init_args(&[], &["-backend=false"]),
        ["init", "-input=false", "-no-color", "-backend=false"]
    );

    // And a missing Terraform is an error with a message, never a skip: none on PATH (which
    // holds only what tools.sh itself runs), or TERRAFORM naming nothing.
    let bin = scratch.0.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let which = |name: &str| -> String {
        let out = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    std::os::unix::fs::symlink(which("dirname"), bin.join("dirname")).unwrap();
    let out = Command::new(which("bash"))
        .arg(root().join("scripts/tools.sh"))
        .args(["path", "terraform-cli"])
        .env("PATH", &bin)
        .env_remove("TERRAFORM")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        combined(&out)
            .contains("terraform not found: set TERRAFORM or put Terraform >= 1.11 on PATH"),
        "{}",
        combined(&out)
    );
    let out = Command::new(root().join("scripts/tools.sh"))
        .args(["path", "terraform-cli"])
        .env("TERRAFORM", scratch.0.join("no-terraform"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        combined(&out).contains("is not an executable"),
        "{}",
        combined(&out)
    );
}

/// The warnings in a command's output, but the provider's own bug: 5.x warns that a Lambda
/// target group's health check has a protocol, which it sets itself and the configuration
/// cannot unset (hashicorp/terraform-provider-aws#35457); and the plan's note, not a
/// diagnostic, that a value becomes sensitive (the pre-traffic event's once it holds the token).
fn unexpected_warnings(text: &str) -> Vec<String> {
    text.split("Warning:")
        .skip(1)
        .map(|w| w.split_whitespace().collect::<Vec<_>>().join(" "))
        .map(|w| w.chars().take(400).collect::<String>())
        .filter(|w| {
            !w.contains(
                "Attribute \"health_check.protocol\" cannot be specified when \"target_type\" is \"lambda\"",
            ) && !w.starts_with("this attribute value will be marked as sensitive")
        })
        .collect()
}

/// Fails when `text`, the output of `what`, holds a warning ([`unexpected_warnings`]).
fn assert_no_warnings(text: &str, what: &str) {
    let warnings = unexpected_warnings(text);
    assert!(
        warnings.is_empty(),
        "{what} warns:\n{}",
        warnings.join("\n")
    );
}

struct Terraform {
    bin: String,
    provider_args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Terraform {
    fn new(env: Vec<(String, String)>) -> Self {
        static PROVIDER_ARGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        Self {
            bin: tool("terraform-cli"),
            provider_args: PROVIDER_ARGS
                .get_or_init(|| {
                    let (args, note) = provider_init_args(&[]);
                    eprint!("{note}");
                    args
                })
                .clone(),
            env,
        }
    }

    /// `terraform init` with the provider's source and `extra` arguments.
    fn init_args(provider_args: &[String], extra: &[&str]) -> Vec<String> {
        ["init", "-input=false", "-no-color"]
            .iter()
            .map(|s| s.to_string())
            .chain(extra.iter().map(|s| s.to_string()))
            .chain(provider_args.iter().cloned())
            .collect()
    }

    fn run(&self, dir: &Path, args: &[&str]) -> Output {
        self.command(Path::new(&self.bin), dir)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("terraform {}: cannot start: {e}", args.join(" ")))
    }

    /// Runs `script` with `sh -eu` in `dir` as an operator types it (each command as written,
    /// the first that fails failing it): `terraform` on PATH is this Terraform, with this
    /// environment, and `terraform apply` / `destroy` approve themselves (TF_CLI_ARGS_*, in
    /// place of the operator's "yes"). Its combined output goes to `log`.
    fn shell(&self, dir: &Path, script: &str, log: &Path) -> Output {
        let bin = dir.join(".operator-bin");
        std::fs::create_dir_all(&bin).unwrap();
        let link = bin.join("terraform");
        if !link.exists() {
            std::os::unix::fs::symlink(&self.bin, &link).unwrap();
        }
        let approve = "-auto-approve -input=false -no-color";
        let out = self
            .command(Path::new("sh"), dir)
            .args(["-eu", "-c", script])
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.display(),
                    self.env
                        .iter()
                        .rfind(|(k, _)| k == "PATH")
                        .map(|(_, v)| v.clone())
                        .unwrap_or_else(|| std::env::var("PATH").unwrap_or_default())
                ),
            )
            .env("TF_CLI_ARGS_apply", approve)
            .env("TF_CLI_ARGS_destroy", approve)
            .env("TF_CLI_ARGS_plan", "-input=false -no-color")
            .env("TF_CLI_ARGS_output", "-no-color")
            .output()
            .expect("sh starts");
        std::fs::write(log, combined(&out)).unwrap();
        out
    }

    /// [`Terraform::shell`], which must succeed.
    fn shell_ok(&self, dir: &Path, script: &str, log: &Path) -> Output {
        let out = self.shell(dir, script, log);
        assert!(
            out.status.success(),
            "commands in {} failed:\n{script}\n{}",
            dir.display(),
            combined(&out)
        );
        out
    }

    /// A command in `dir` with the environment every Terraform command here gets.
    fn command(&self, program: &Path, dir: &Path) -> Command {
        let mut cmd = moto_command(program, &self.env);
        cmd.current_dir(dir)
            .env("TF_CLI_CONFIG_FILE", "/dev/null")
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_IN_AUTOMATION", "1")
            .env_remove("TF_PLUGIN_CACHE_DIR");
        cmd
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
            "terraform {} in {} failed ({}):\n{}\n-- the whole output:\n{text}",
            args.join(" "),
            dir.display(),
            out.status,
            error_blocks(&text)
        );
        // What `terraform validate` would report (a deprecated attribute, say) is printed by
        // every command that evaluates the configuration: none may warn. (`init` warns that a
        // -plugin-dir install records this platform's checksums only.)
        if args.first() != Some(&"init") {
            assert_no_warnings(
                &text,
                &format!("terraform {} in {}", args.join(" "), dir.display()),
            );
        }
        eprintln!(
            "terraform {} ({}): {:.1} s",
            args.first().unwrap(),
            dir.file_name().unwrap().to_string_lossy(),
            t0.elapsed().as_secs_f64()
        );
        out
    }

    fn init(&self, dir: &Path) {
        self.init_with(dir, &["-backend=false"]);
    }

    fn init_with(&self, dir: &Path, extra: &[&str]) {
        let args = Self::init_args(&self.provider_args, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ok(dir, &args, None);
    }

    /// Writes `dir`/main.tf, [`provider_block`] then `body`, and runs `terraform init` there.
    fn init_root(&self, dir: &Path, body: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("main.tf"), provider_block() + body).unwrap();
        self.init(dir);
    }

    /// `terraform apply` with `extra` arguments, which must succeed ([`Terraform::ok`]).
    fn apply(&self, dir: &Path, extra: &[&str], log: Option<&Path>) -> Output {
        self.ok(dir, &verb_args("apply", extra), log)
    }

    /// `terraform destroy` with `extra` arguments, which must succeed ([`Terraform::ok`]).
    fn destroy(&self, dir: &Path, extra: &[&str], log: Option<&Path>) -> Output {
        self.ok(dir, &verb_args("destroy", extra), log)
    }

    /// `terraform plan` with `extra` arguments, whatever its outcome.
    fn plan(&self, dir: &Path, extra: &[&str]) -> Output {
        self.run(dir, &verb_args("plan", extra))
    }

    /// A plan that changes nothing (`-detailed-exitcode`: 0 = no changes, 2 = changes).
    fn plan_is_empty(&self, dir: &Path, what: &str) {
        let out = self.plan(dir, &["-detailed-exitcode"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{what}: the plan is not empty (0 = no changes, 2 = changes):\n{}",
            combined(&out)
        );
    }

    /// `terraform <verb>` (`apply`, `destroy` or `plan`) with `extra` arguments, which must fail;
    /// its combined output.
    fn refused(&self, dir: &Path, verb: &str, extra: &[&str], what: &str) -> String {
        let out = self.run(dir, &verb_args(verb, extra));
        let text = combined(&out);
        assert!(
            !out.status.success(),
            "{what}: terraform {verb} {} succeeded:\n{text}",
            extra.join(" ")
        );
        text
    }

    /// The root module's outputs (`terraform output -json`).
    fn output_json(&self, dir: &Path) -> serde_json::Value {
        let out = self.ok(dir, &["output", "-json", "-no-color"], None);
        serde_json::from_slice(&out.stdout).expect("terraform output -json")
    }

    /// One output's value (`terraform output -raw`).
    fn output(&self, dir: &Path, name: &str) -> String {
        String::from_utf8(self.ok(dir, &["output", "-raw", name], None).stdout).unwrap()
    }

    /// A saved plan as JSON (`terraform show -json`). It holds sensitive values in clear, so it
    /// stays in memory: no log, and no failure message quotes it.
    fn show_json(&self, dir: &Path, plan: &str) -> serde_json::Value {
        let out = self.run(dir, &["show", "-json", plan]);
        assert!(
            out.status.success(),
            "terraform show -json {plan} in {} failed:\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_no_warnings(
            &combined(&out),
            &format!("terraform show -json {plan} in {}", dir.display()),
        );
        serde_json::from_slice(&out.stdout).expect("terraform show -json")
    }

    /// The function's configuration (`PODMUTATOR_CONFIG`) in the saved plan `plan.tfplan`.
    fn planned_config(&self, dir: &Path) -> serde_json::Value {
        let show = self.show_json(dir, "plan.tfplan");
        let function = show["resource_changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["type"] == "aws_lambda_function")
            .expect("the plan creates the function");
        let env = &function["change"]["after"]["environment"][0]["variables"];
        serde_json::from_str(
            env["PODMUTATOR_CONFIG"].as_str().unwrap_or_else(|| {
                panic!("PODMUTATOR_CONFIG is not known at plan time: {function}")
            }),
        )
        .unwrap()
    }
}

/// Fails unless the function starts on `config` (`what`: whose configuration it is).
fn assert_function_starts(config: &serde_json::Value, what: &str) {
    let started = check_config(config);
    assert!(
        started.status.success(),
        "{what}: the function refuses what Terraform accepts: {}",
        combined(&started)
    );
}

/// `podmutator check-config` on `config`, as the function's start-up gate reads it.
fn check_config(config: &serde_json::Value) -> Output {
    crate::common::bin()
        .arg("check-config")
        .env("PODMUTATOR_CONFIG", config.to_string())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The arguments of `terraform <verb>` (`apply`, `destroy` or `plan`) run unattended: no input,
/// no colour, and apply and destroy approve themselves; then `extra`.
fn verb_args<'a>(verb: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![verb];
    if verb != "plan" {
        args.push("-auto-approve");
    }
    args.extend(["-input=false", "-no-color"]);
    args.extend_from_slice(extra);
    args
}

/// Terraform's error boxes (from each `Error:` line to the box's closing `╵`), put first in a
/// failure's message: a CI log keeps a long message's head and tail, and the plan comes first.
fn error_blocks(text: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        inside |= line.contains("Error:");
        if inside {
            out.push_str(line);
            out.push('\n');
            inside = !line.starts_with('╵');
        }
    }
    if out.is_empty() {
        "(no Error: line)".into()
    } else {
        out
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
            certificate_elsewhere("podmutator.example.com"),
        )
    } else {
        // The module creates and validates the certificate and the alias record in the zone
        // (created beforehand through moto's API: Terraform would wait ~15 s for each change).
        ("route53_zone_id = var.zone_id", String::new())
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

{network}
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
output "log_group_name" {{ value = module.podmutator.log_group_name }}
output "code_sha256" {{ value = "{zip_b64sha256}" }}
"#,
        network = cluster_network(),
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

/// The cluster side's network, as a harness root has it: a VPC, two private subnets in two zones,
/// and the control plane's dedicated security group.
fn cluster_network() -> String {
    format!(
        r#"
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
"#
    )
}

/// A certificate for `domain` made elsewhere in the same apply (`aws_acm_certificate.elsewhere`),
/// for a module told `create_certificate = false`.
fn certificate_elsewhere(domain: &str) -> String {
    format!(
        r#"
resource "aws_acm_certificate" "elsewhere" {{
  domain_name       = "{domain}"
  validation_method = "DNS"
}}
"#
    )
}

/// A public hosted zone for example.com, made through moto's API.
fn create_zone(env: &[(String, String)]) -> String {
    boto3(
        env,
        "print(boto3.client('route53').create_hosted_zone(Name='example.com', CallerReference=str(time.time()))['HostedZone']['Id'].split('/')[-1])",
        &[],
    )
}

/// A release: a `bootstrap` that runs this build's podmutator, which moto_server.py runs as
/// Lambda runs it (the function's environment as Terraform set it, a Runtime API on 127.0.0.1).
/// So the module's pre-traffic check sends its canned review, through the path token Terraform
/// configured, to the real function, which must start on that configuration and admit it. `tag`
/// (a comment) tells releases apart.
fn release(tag: &str) -> String {
    format!(
        "#!/bin/sh\n# {tag}\nexec '{}'\n",
        env!("CARGO_BIN_EXE_podmutator")
    )
}

/// A zip holding `release("A")`; returns its base64 SHA-256.
fn write_zip(path: &Path) -> String {
    write_zip_with(path, &release("A"))
}

/// A zip whose `bootstrap` is `body` (with a fixed date, so the same body makes the same zip);
/// returns its base64 SHA-256.
fn write_zip_with(path: &Path, body: &str) -> String {
    let script = "import base64,hashlib,sys,zipfile\nz=zipfile.ZipFile(sys.argv[1],'w')\nz.writestr(zipfile.ZipInfo('bootstrap',(1980,1,1,0,0,0)),sys.argv[2])\nz.close()\nprint(base64.b64encode(hashlib.sha256(open(sys.argv[1],'rb').read()).digest()).decode())";
    let out = iac_python(&["-c", script, path.to_str().unwrap(), body], &[]);
    String::from_utf8(out).unwrap().trim().to_owned()
}

/// A command against moto through `env` ([`Moto::env`], and what a scenario adds): never a real
/// account's config, credentials or profile; no stdin.
fn moto_command(program: impl AsRef<std::ffi::OsStr>, env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env_remove("AWS_PROFILE")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null());
    cmd
}

/// Python in tests/iac (`args`: one of its scripts and the script's arguments, or `-c` and
/// code), against moto through `env`; it must succeed. Its stderr (a check's account of what it
/// checked) goes to the test's; its stdout is returned.
fn iac_python(args: &[&str], env: &[(String, String)]) -> Vec<u8> {
    let out = moto_command(tool("python"), env)
        .args(args)
        .current_dir(root().join("tests/iac"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{args:?} failed:\n{}", combined(&out));
    out.stdout
}

/// A tests/iac script's JSON answer ([`iac_python`]).
fn python_json(args: &[&str], env: &[(String, String)]) -> serde_json::Value {
    serde_json::from_slice(&iac_python(args, env)).unwrap()
}

/// [`boto3`]'s printed answer, as JSON.
fn boto3_json(env: &[(String, String)], code: &str, args: &[&str]) -> serde_json::Value {
    let text = boto3(env, code, args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The configuration (PODMUTATOR_CONFIG) of the version `function`'s `live` alias serves, as
/// moto holds it.
fn live_config(env: &[(String, String)], function: &str) -> serde_json::Value {
    boto3_json(
        env,
        "c=boto3.client('lambda').get_function_configuration(FunctionName=sys.argv[1], Qualifier='live'); print(c['Environment']['Variables']['PODMUTATOR_CONFIG'])",
        &[function],
    )
}

/// An ECR pull-through cache rule made through moto's API, as another root (or an install
/// before the rules had their own) would have made it.
fn create_cache_rule(env: &[(String, String)], prefix: &str, upstream: &str) {
    boto3(
        env,
        "boto3.client('ecr').create_pull_through_cache_rule(ecrRepositoryPrefix=sys.argv[1], upstreamRegistryUrl=sys.argv[2])",
        &[prefix, upstream],
    );
}

/// The registration as the fake cluster under `kube` holds it.
fn registered(kube: &Path) -> serde_json::Value {
    common::read_json(&kube.join("podmutator.json"))
}

/// The failurePolicy of each of the registration's webhooks.
fn failure_policies(kube: &Path) -> Vec<String> {
    registered(kube)["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["failurePolicy"].as_str().unwrap().to_owned())
        .collect()
}

/// tests/iac/check_moto_deploy.py on an install of the AWS module: `mode` (applied, destroyed)
/// for `endpoint`, from dir/outputs.json, the fake cluster and `logs`.
fn check(mode: &str, endpoint: &str, dir: &Path, env: &[(String, String)], logs: &[PathBuf]) {
    let (outputs, kube) = (dir.join("outputs.json"), dir.join("kube"));
    let mut args = vec![
        "check_moto_deploy.py",
        mode,
        endpoint,
        outputs.to_str().unwrap(),
        kube.to_str().unwrap(),
    ];
    args.extend(logs.iter().map(|l| l.to_str().unwrap()));
    iac_python(&args, env);
}

fn apply_and_destroy(endpoint: &str) {
    let t0 = Instant::now();
    let mut site = Site::new(&format!("apply-{endpoint}"));
    let kube = site.fake_cluster();
    let (dir, env, tf) = (site.dir(), &site.env, site.terraform());
    let zip = dir.join("bootstrap.zip");
    let hash = write_zip(&zip);
    let zone_id = if endpoint == "alb" {
        String::new()
    } else {
        create_zone(env)
    };
    std::fs::write(dir.join("main.tf"), harness(endpoint, &hash, &zone_id)).unwrap();
    tf.init(dir);
    let apply_log = dir.join("apply.log");
    tf.apply(dir, &[], Some(&apply_log));
    std::fs::write(dir.join("outputs.json"), tf.output_json(dir).to_string()).unwrap();

    // The zip is needed only to upload code: plan and destroy work without it.
    std::fs::remove_file(&zip).unwrap();

    // A second plan changes nothing: the generated token stays (the password data source draws
    // a new one every plan), and no attribute drifts.
    let plan_log = dir.join("plan.log");
    let plan = tf.plan(dir, &["-detailed-exitcode"]);
    let plan_text = combined(&plan);
    std::fs::write(&plan_log, &plan_text).unwrap();
    check(
        "applied",
        endpoint,
        dir,
        env,
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
        &verb_args(
            "plan",
            &[
                "-var=failure_policy=Ignore",
                &format!("-out={}", failopen_plan.display()),
            ],
        ),
        Some(&failopen_log),
    );
    let show = tf.show_json(dir, failopen_plan.to_str().unwrap());
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
    tf.apply(
        dir,
        &[failopen_plan.to_str().unwrap()],
        Some(&failopen_apply_log),
    );
    assert_eq!(
        failure_policies(&kube),
        ["Ignore"],
        "{endpoint}: not failed open"
    );

    let destroy_log = dir.join("destroy.log");
    tf.destroy(dir, &[], Some(&destroy_log));
    check(
        "destroyed",
        endpoint,
        dir,
        env,
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

/// The moto scenarios run side by side, each with its own moto server and directory: they
/// spend most of their time in the provider's fixed waits (30 s before the first check that an
/// ALB is active, 10-30 s per Route 53 change), not on the CPU, and the test harness would
/// otherwise run them one or two at a time. The longest, the ALB example's install, removal and
/// reinstall, sets the test's length.
#[test]
fn terraform_against_moto_alb_http_api_eks_network_the_examples_and_a_rotation() {
    let t0 = Instant::now();
    let scenarios: [(&str, fn()); 7] = [
        ("alb", || apply_and_destroy("alb")),
        ("http_api", || apply_and_destroy("http_api")),
        ("eks-network", eks_network_scenario),
        ("examples/alb", || example_install_remove_reinstall("alb")),
        ("examples/http-api", || {
            example_install_remove_reinstall("http-api")
        }),
        (
            "rotation",
            rotates_the_path_token_then_releases_and_rolls_back,
        ),
        (
            "protected",
            a_protected_install_refuses_destroy_before_deleting_anything,
        ),
    ];
    // MOTO_SCENARIO=rotation (say) runs only the scenarios whose name contains it, while one
    // is being worked on; CI sets nothing.
    let only = std::env::var("MOTO_SCENARIO").unwrap_or_default();
    let runs: Vec<_> = scenarios
        .into_iter()
        .filter(|(name, _)| name.contains(only.as_str()))
        .map(|(name, f)| (name, std::thread::spawn(f)))
        .collect();
    assert!(!runs.is_empty(), "MOTO_SCENARIO={only} names no scenario");
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

/// scripts/registration-drift.sh as a scheduled job runs it: the example's manifest output on
/// stdin, the cluster's credentials from `aws eks update-kubeconfig`. Returns the status and
/// the output, which must never hold the path token (checked by the caller).
fn drift_check(manifest: &str, cluster: &str, env: &[(String, String)]) -> (i32, String, String) {
    let mut child = moto_command(root().join("scripts/registration-drift.sh"), env)
        .args(["--eks-cluster", cluster, "--region", REGION])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(manifest.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// docs/deploy.md's restore of the registration: its resource replaced, which applies the object
/// again. (-refresh=false only saves reading back the AWS side, which the replacement does not
/// use.)
const REPLACE_REGISTRATION: [&str; 2] = [
    "-refresh=false",
    "-replace=module.registration.terraform_data.registration",
];

/// Item 12 of issue 38, in an example's install: a `matchConditions` entry that is always false,
/// added by another field manager, is named by the drift check; `terraform apply -replace`
/// (server-side apply, which keeps other managers' fields) leaves it, and the check still names
/// it; docs/deploy.md's `kubectl replace` (in "Registration drift") removes it, and the check
/// finds the registration as registered. The commands' output is appended to `log`, which the
/// leak check reads.
fn foreign_fields_outlive_replace(
    tf: &Terraform,
    ex: &Path,
    manifest: &str,
    cluster: &str,
    env: &[(String, String)],
    token: &str,
    log: &Path,
) {
    let path = ex.join("../../kube/podmutator.json");
    let mut live = common::read_json(&path);
    live["webhooks"][0]["matchConditions"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "paused", "expression": "false"}));
    let item = |name: &str| format!("k:{}", serde_json::json!({ "name": name }));
    live["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "manager": "policy-bot", "operation": "Apply", "apiVersion": "admissionregistration.k8s.io/v1", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:webhooks": {item("flyte-pod-webhook.flyte.org"): {"f:matchConditions": {item("paused"): {".": {}, "f:name": {}, "f:expression": {}}}}}}
        }));
    std::fs::write(&path, live.to_string()).unwrap();
    let foreign = r#"webhooks[name=flyte-pod-webhook.flyte.org].matchConditions[name=paused] = {"name":"paused","expression":"false"} (field managers: policy-bot)"#;
    let reported = |manifest: &str, when: &str| {
        let (rc, stdout, stderr) = drift_check(manifest, cluster, env);
        assert!(
            !stdout.contains(token) && !stderr.contains(token),
            "the drift check shows the path token"
        );
        assert_eq!(rc, 1, "{when}: not reported:\n{stdout}{stderr}");
        assert!(
            stdout.lines().any(|l| l.trim_start() == foreign),
            "{when}: not named:\n{stdout}"
        );
    };
    reported(manifest, "added");
    let replaced = tf.apply(ex, &REPLACE_REGISTRATION, None);
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("\"paused\""),
        "-replace removed a field another manager owns (a server-side apply keeps it)"
    );
    // The replaced instance marks the object with its own ID: the manifest as applied now.
    let manifest = String::from_utf8(
        tf.ok(ex, &["output", "-json", "registration_manifest"], None)
            .stdout,
    )
    .unwrap();
    reported(&manifest, "after -replace");
    let script = deploy_doc_block("**Foreign fields** stay through any apply").replace(
        "--name flyte --region eu-west-1",
        &format!("--name {cluster} --region {REGION}"),
    );
    let scratch_log = log.with_extension("foreign.log");
    tf.shell_ok(ex, &script, &scratch_log);
    let (rc, stdout, stderr) = drift_check(&manifest, cluster, env);
    assert_eq!(rc, 0, "not replaced: {stdout}{stderr}");
    let mut text = std::fs::read_to_string(log).unwrap();
    text += &combined(&replaced);
    text += &std::fs::read_to_string(&scratch_log).unwrap();
    std::fs::write(log, text).unwrap();
}

/// An example as a user runs it, against moto: `terraform apply`, `destroy` and `apply` again,
/// which used to fail on the kept log groups (ResourceAlreadyExists). The example's own inputs
/// are what is passed through (name, alb_deletion_protection, alarm_topic_arns,
/// secrets_namespace_selector, reserved_concurrent_executions); the ALB example's state lives in
/// the S3 bucket and KMS key examples/backend-s3 makes, set up by docs/deploy.md's commands as
/// written. The registration drift check runs against the fake cluster: in sync, edited (a
/// stale token, Ignore), and deleted. The ALB example keeps its deletion protection on (the
/// default): a plain `terraform destroy` is refused before it deletes anything (it used to
/// delete the registration, the function and the listener first), and the removal runs
/// docs/deploy.md's commands as written.
fn example_install_remove_reinstall(example: &str) {
    let t0 = Instant::now();
    let mut site = Site::new(&format!("example-{example}"));
    let kube = site.fake_cluster();
    let cluster = format!("flyte-{example}");
    let fake = common::fake_bin(site.dir());
    site.env.push(("FAKE_KUBE_CLUSTER".into(), cluster.clone()));
    site.env.push((
        "PATH".into(),
        format!(
            "{}:{}",
            fake.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    ));
    let (dir, env, tf) = (site.dir(), &site.env, site.terraform());
    let mut facts = python_json(&["moto_cluster.py", &cluster], env);
    let ex = dir.join("examples").join(example);
    // terraform.tfvars is the example's terraform.tfvars.example with this install's values:
    // the zip where its lambda_zip_path line says (the release runbook reads it there).
    let example_tfvars = std::fs::read_to_string(ex.join("terraform.tfvars.example")).unwrap();
    let zip_path = example_tfvars
        .lines()
        .find_map(|l| l.strip_prefix("lambda_zip_path = \""))
        .and_then(|r| r.strip_suffix('"'))
        .expect("terraform.tfvars.example sets lambda_zip_path");
    let zip = ex.join(zip_path);
    std::fs::create_dir_all(zip.parent().unwrap()).unwrap();
    let hash = write_zip(&zip);
    if example == "alb" {
        facts["control_plane_security_group_id"] =
            control_plane_group_as_written(&tf, dir, &cluster, &facts).into();
    }
    std::fs::write(dir.join("facts.json"), facts.to_string()).unwrap();
    let name = format!("pm-ex-{}", example.replace("http-api", "api"));

    let ours = format!(
        r#"region                  = "{REGION}"
cluster_name            = "{cluster}"
name                    = "{name}"
domain_name             = "podmutator.example.com"
route53_zone_id         = "{zone}"
lambda_zip_base64sha256 = "{hash}"
alarm_topic_arns        = ["{topic}"]
reserved_concurrent_executions = 7
"#,
        zone = facts["zone_id"].as_str().unwrap(),
        topic = facts["alarm_topic_arn"].as_str().unwrap(),
    );
    let set = [
        "region",
        "cluster_name",
        "domain_name",
        "route53_zone_id",
        "lambda_zip_base64sha256",
        "control_plane_security_group_id",
        "fetcher_image",
    ];
    let mut tfvars: String = example_tfvars
        .lines()
        .filter(|l| {
            !set.iter()
                .any(|k| l.split('=').next().unwrap().trim_end() == *k)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    tfvars += &ours;
    if example == "alb" {
        tfvars += &format!(
            "control_plane_security_group_id = \"{}\"\n",
            facts["control_plane_security_group_id"].as_str().unwrap()
        );
        backend_as_written(&tf, &site.moto, dir, &ex);
    } else {
        tfvars += &format!(
            "fetcher_image = \"{FETCHER_IMAGE}\"\nsecrets_namespace_selector = {{ matchLabels = {{ \"podmutator-pilot\" = \"true\" }} }}\n"
        );
        tf.init(&ex);
    }
    std::fs::write(ex.join("terraform.tfvars"), &tfvars).unwrap();

    let apply = |log: &str| {
        let path = dir.join(log);
        tf.apply(&ex, &[], Some(&path));
        path
    };
    // The outputs without the manifest (its URLs hold the token), which is returned apart.
    let outputs = |file: &str| -> String {
        let mut all = tf.output_json(&ex);
        let manifest = all
            .as_object_mut()
            .unwrap()
            .remove("registration_manifest")
            .expect("the example outputs registration_manifest");
        std::fs::write(dir.join(file), all.to_string()).unwrap();
        manifest["value"].to_string()
    };
    let check = |mode: &str, outputs: &str, first: &str, logs: &[&PathBuf]| {
        let (outputs, facts) = (dir.join(outputs), dir.join("facts.json"));
        let mut args = vec![
            "check_example.py",
            mode,
            example,
            outputs.to_str().unwrap(),
            kube.to_str().unwrap(),
            facts.to_str().unwrap(),
            first,
        ];
        args.extend(logs.iter().map(|l| l.to_str().unwrap()));
        iac_python(&args, env);
    };
    let registered_token = || -> String {
        registered(&kube)["webhooks"][0]["clientConfig"]["url"]
            .as_str()
            .unwrap()
            .split('/')
            .nth(3)
            .unwrap()
            .to_owned()
    };

    // Install.
    let applied = apply("apply.log");

    // Failing open and back, by docs/deploy.md's commands as written (terraform.tfvars edited,
    // so that the next routine apply keeps it): the registration's every webhook, then a
    // routine plan that changes nothing, then the default again.
    if example == "http-api" {
        let policies = || failure_policies(&kube);
        assert!(policies().iter().all(|p| p == "Fail"), "{:?}", policies());
        for (marker, log, want) in [
            ("**Fail open**", "fail-open.log", "Ignore"),
            (
                "from any machine with the state, without the zip. **Restore**",
                "restore.log",
                "Fail",
            ),
        ] {
            tf.shell_ok(&ex, &deploy_doc_block(marker), &dir.join(log));
            let now = policies();
            assert!(
                !now.is_empty() && now.iter().all(|p| p == want),
                "{marker}: {now:?}"
            );
            tf.plan_is_empty(&ex, marker);
        }

        // A release by docs/deploy.md's runbook in this root made from the example, then an
        // instant rollback by hand (`aws lambda update-alias`), then failing open as the docs
        // say after one: `live` stays on the rolled-back code, on a version Terraform checked.
        let function = tf.output_json(&ex)["function_name"]["value"]
            .as_str()
            .unwrap()
            .to_owned();
        let live = || -> (u32, String) {
            let text = boto3(
                env,
                "l=boto3.client('lambda'); v=l.get_alias(FunctionName=sys.argv[1], Name='live')['FunctionVersion']; print(v, l.get_function_configuration(FunctionName=sys.argv[1], Qualifier=v)['CodeSha256'])",
                &[&function],
            );
            let (version, code) = text.trim().split_once(' ').unwrap();
            (version.parse().unwrap(), code.to_owned())
        };
        let (v1, code) = live();
        assert_eq!(code, hash);
        let b = write_zip_with(&zip, &release("B"));
        tf.shell_ok(
            &ex,
            &deploy_doc_block("**Upgrade or roll back**"),
            &dir.join("upgrade.log"),
        );
        let (v2, code) = live();
        assert_eq!(
            code, b,
            "the runbook did not release B from the example's root"
        );
        assert!(v2 > v1);
        boto3(
            env,
            "boto3.client('lambda').update_alias(FunctionName=sys.argv[1], Name='live', FunctionVersion=sys.argv[2])",
            &[&function, &v1.to_string()],
        );
        // What the docs say an apply would do now: move the alias back to B's version.
        let out = tf.plan(&ex, &["-detailed-exitcode"]);
        assert!(
            out.status.code() == Some(2)
                && words(&combined(&out))
                    .contains("module.podmutator.aws_lambda_alias.live will be updated in-place"),
            "after a manual rollback, a plan leaves the alias: {}",
            combined(&out)
        );
        assert_eq!(write_zip(&zip), hash);
        tf.shell_ok(
            &ex,
            &deploy_doc_block("**Fail open after a manual rollback.**"),
            &dir.join("rollback-fail-open.log"),
        );
        let (v3, code) = live();
        assert_eq!(
            code, hash,
            "failing open moved live off the rolled-back code"
        );
        assert!(
            v3 > v2,
            "live is not on a version Terraform published and checked"
        );
        assert!(
            policies().iter().all(|p| p == "Ignore") && !policies().is_empty(),
            "{:?}",
            policies()
        );
        tf.plan_is_empty(&ex, "after failing open after a manual rollback");
        tf.shell_ok(
            &ex,
            &deploy_doc_block("from any machine with the state, without the zip. **Restore**"),
            &dir.join("restore-2.log"),
        );
        assert!(policies().iter().all(|p| p == "Fail"), "{:?}", policies());
        assert_eq!(live(), (v3, hash.clone()));
        tf.plan_is_empty(&ex, "after the restore");
    }

    let manifest = outputs("outputs-1.json");
    check("applied", "outputs-1.json", "-", &[&applied]);
    let token = registered_token();
    // The drift check as "Registration drift" writes it for Terraform, in the example's
    // directory (its example cluster and region are this install's): in sync.
    let line = deploy_doc_block("The check needs `kubectl`")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n")
        .replace(
            "--eks-cluster flyte --region eu-west-1",
            &format!("--eks-cluster {cluster} --region {REGION}"),
        );
    let _ = std::os::unix::fs::symlink(root().join("scripts"), dir.join("scripts"));
    let out = tf.shell(&ex, &line, &dir.join("drift-as-written.log"));
    assert!(
        !combined(&out).contains(&token),
        "the drift check as written shows the path token"
    );
    assert!(
        out.status.success() && combined(&out).contains("is as registered"),
        "{line}: {}",
        combined(&out)
    );

    // The ALB example is protected by default: a plain destroy is refused by the registration's
    // guard, destroyed first of all, before anything is deleted. Every resource is still in the
    // state, the registration in the cluster as it was, and what moto holds passes the same
    // checks as after the install.
    let refused = dir.join("destroy-refused.log");
    if example == "alb" {
        let before = managed_resources(&tf, &ex);
        assert!(
            before.contains("module.registration.terraform_data.deletion_guard")
                && before.contains("module.podmutator.terraform_data.deletion_guard[0]"),
            "no deletion guards: {before:?}"
        );
        let registration = std::fs::read(kube.join("podmutator.json")).unwrap();
        let text = assert_destroy_refused(
            &tf,
            &ex,
            &[],
            "module.registration.terraform_data.deletion_guard",
            &before,
        );
        std::fs::write(&refused, &text).unwrap();
        assert_eq!(
            std::fs::read(kube.join("podmutator.json")).unwrap(),
            registration,
            "the refused destroy changed the registration"
        );
        check("applied", "outputs-1.json", "-", &[&applied, &refused]);
        // The destroy took the outputs out of the state; docs/deploy.md's refresh-only apply,
        // as written, puts them back, the drift check's manifest among them.
        assert_eq!(
            tf.output_json(&ex),
            serde_json::json!({}),
            "a refused destroy kept the outputs: the docs say otherwise"
        );
        let restore = deploy_doc_block("**After a refused destroy, the outputs are gone");
        tf.shell_ok(&ex, &restore, &dir.join("refresh-only.log"));
        assert_eq!(
            outputs("outputs-restored.json"),
            manifest,
            "the refresh-only apply restored another manifest"
        );
        let read = |f: &str| common::read_json(&dir.join(f));
        assert_eq!(
            read("outputs-restored.json"),
            read("outputs-1.json"),
            "the refresh-only apply restored other outputs"
        );
        tf.plan_is_empty(&ex, "after the refresh-only apply");
        assert_eq!(
            std::fs::read(kube.join("podmutator.json")).unwrap(),
            registration,
            "the refresh-only apply changed the registration"
        );
    } else {
        std::fs::write(&refused, "").unwrap();
    }

    // The drift check: in sync, then a stale token and failing open (someone's `kubectl edit`),
    // shown without either token; then the object deleted.
    let no_token = |what: &str, text: &str| {
        assert!(!text.contains(&token), "{what} shows the path token");
    };
    let (rc, stdout, stderr) = drift_check(&manifest, &cluster, env);
    no_token("the drift check", &(stdout.clone() + &stderr));
    assert_eq!(rc, 0, "in sync, yet: {stdout}{stderr}");
    assert!(stderr.contains("is as registered"), "{stderr}");
    let stale = "StaleTokenStaleTokenStaleTokenStaleToken1234";
    let path = kube.join("podmutator.json");
    let mut live = registered(&kube);
    for w in live["webhooks"].as_array_mut().unwrap() {
        let url = w["clientConfig"]["url"]
            .as_str()
            .unwrap()
            .replace(&token, stale);
        w["clientConfig"]["url"] = url.into();
        w["failurePolicy"] = "Ignore".into();
    }
    std::fs::write(&path, live.to_string()).unwrap();
    let (rc, stdout, stderr) = drift_check(&manifest, &cluster, env);
    no_token("the drift check", &(stdout.clone() + &stderr));
    assert!(
        !stdout.contains(stale),
        "the drift check shows the stale token: {stdout}"
    );
    assert_eq!(rc, 1, "drifted, yet: {stdout}{stderr}");
    for (t, sign) in [(token.as_str(), '+'), (stale, '-')] {
        let shown = format!("<token sha256:{}…>", &common::hex_sha256(t)[..12]);
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(sign) && l.contains(&shown)),
            "the diff does not show {sign} {shown}: {stdout}"
        );
    }
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with('-') && l.contains("\"Ignore\""))
            && stdout
                .lines()
                .any(|l| l.starts_with('+') && l.contains("\"Fail\"")),
        "{stdout}"
    );
    assert!(stderr.contains("has drifted"), "{stderr}");
    std::fs::remove_file(&path).unwrap();
    let (rc, stdout, stderr) = drift_check(&manifest, &cluster, env);
    assert_eq!(rc, 1, "missing, yet: {stdout}{stderr}");
    assert!(stderr.contains("is missing from the cluster"), "{stderr}");
    // Whoever runs the check needs the cluster: a wrong cluster cannot be checked (2).
    let (rc, _, stderr) = drift_check(&manifest, "no-such-cluster", env);
    assert_eq!(rc, 2, "{stderr}");
    assert!(
        stderr.contains("aws eks update-kubeconfig --name no-such-cluster failed"),
        "{stderr}"
    );
    // Restored as docs/deploy.md says: the registration's resource replaced, which applies the
    // object again; the replaced instance's delete leaves its successor's object alone. The
    // scheduled check reads the outputs again and finds the registration as registered. Once
    // is enough (the HTTP API's run: the ALB's is the longer one); the ALB example's destroy
    // then meets a registration already gone.
    let restored = dir.join("restore.log");
    if example == "http-api" {
        tf.apply(&ex, &REPLACE_REGISTRATION, Some(&restored));
        assert!(path.exists(), "-replace did not restore the registration");
        let manifest = outputs("outputs-1.json");
        let (rc, stdout, stderr) = drift_check(&manifest, &cluster, env);
        assert_eq!(rc, 0, "not restored: {stdout}{stderr}");
        foreign_fields_outlive_replace(&tf, &ex, &manifest, &cluster, env, &token, &restored);
    } else {
        std::fs::write(&restored, "").unwrap();
    }

    // Remove: the HTTP API's with `terraform destroy`; the ALB's as docs/deploy.md ("Removal
    // and reinstall") writes it, the protection lifted in terraform.tfvars and applied first.
    let destroyed = dir.join("destroy.log");
    if example == "alb" {
        let script = deploy_doc_block("## Removal and reinstall");
        let text = combined(&tf.shell_ok(&ex, &script, &destroyed));
        assert_no_warnings(&text, "the removal");
        assert!(
            text.contains("Destroy complete!"),
            "the removal did not destroy:\n{text}"
        );
    } else {
        tf.destroy(&ex, &[], Some(&destroyed));
    }
    check(
        "destroyed",
        "outputs-1.json",
        "-",
        &[&applied, &refused, &restored, &destroyed],
    );
    assert!(
        managed_resources(&tf, &ex).is_empty(),
        "the destroy left resources in the state"
    );

    // Reinstall under the same name, beside the kept log groups (protected again: the
    // removal's line in terraform.tfvars goes).
    std::fs::write(ex.join("terraform.tfvars"), &tfvars).unwrap();
    let reapplied = apply("reapply.log");
    outputs("outputs-2.json");
    check(
        "reapplied",
        "outputs-2.json",
        dir.join("outputs-1.json").to_str().unwrap(),
        &[&applied, &refused, &restored, &destroyed, &reapplied],
    );
    eprintln!(
        "examples/{example}: apply, destroy, apply against moto in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
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

fn combined(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Terraform's output as one line of words: its messages are wrapped at the terminal's width.
fn words(text: &str) -> String {
    text.split_whitespace()
        .filter(|w| *w != "│")
        .collect::<Vec<_>>()
        .join(" ")
}

/// docs/deploy.md's state backend block (Path A, step 2), as written, in examples/alb: the bucket
/// and KMS key made by examples/backend-s3 (local state), its `backend_hcl`, `backend.tf.example`
/// copied, and the ALB example initialised on that backend. What an operator's machine has and
/// this one lacks is added by `TF_CLI_ARGS_init` alone: the provider's source, and where this
/// test's S3 is (moto, by path, which only a backend configuration file can say; the backend-s3
/// root has no backend and ignores it). The bucket and key go to backend.json, where
/// check_example.py reads the state object's encryption.
fn backend_as_written(tf: &Terraform, moto: &Moto, dir: &Path, ex: &Path) {
    let moto_backend = dir.join("moto.s3.tfbackend");
    std::fs::write(
        &moto_backend,
        format!(
            "endpoints = {{\n  s3  = \"{url}\"\n  sts = \"{url}\"\n}}\nuse_path_style = true\n",
            url = moto.url()
        ),
    )
    .unwrap();
    let script = format!(
        "export TF_CLI_ARGS_init='-input=false -no-color {} -backend-config={}'\n{}",
        tf.provider_args.join(" "),
        moto_backend.display(),
        deploy_doc_block("**The state holds the path token**")
    );
    let text = combined(&tf.shell_ok(ex, &script, &dir.join("backend.log")));
    // The apply's own output (between init's last line and its summary) warns of nothing.
    let apply = text
        .split("Terraform has been successfully initialized!")
        .nth(1)
        .and_then(|t| t.split("Apply complete!").next())
        .expect("the block's output holds backend-s3's init and apply");
    assert_no_warnings(apply, "examples/backend-s3's apply");
    assert!(
        std::fs::read_to_string(ex.join(".terraform/terraform.tfstate"))
            .unwrap()
            .contains("\"type\": \"s3\""),
        "examples/alb is initialised on the S3 backend"
    );
    let backend = dir.join("examples/backend-s3");
    let outs = tf.output_json(&backend);
    std::fs::write(
        dir.join("backend.json"),
        serde_json::json!({
            "bucket": outs["bucket"]["value"],
            "kms_key_arn": outs["kms_key_arn"]["value"],
        })
        .to_string(),
    )
    .unwrap();
}

/// docs/deploy.md's "A security group for the control plane alone", as written, for `cluster`
/// (`CLUSTER`), through the stand-in `aws` against moto: the group is created in the cluster's
/// VPC and added to the cluster, which keeps its subnets. Returns the group's ID.
fn control_plane_group_as_written(
    tf: &Terraform,
    dir: &Path,
    cluster: &str,
    facts: &serde_json::Value,
) -> String {
    let script = with_fake_aws(
        &dir.join("security-group"),
        &format!(
            "CLUSTER='{cluster}'\n{}",
            deploy_doc_block("## A security group for the control plane alone")
        ),
    );
    tf.shell_ok(dir, &script, &dir.join("security-group.log"));
    let vpc = boto3_json(
        &tf.env,
        "print(json.dumps(boto3.client('eks').describe_cluster(name=sys.argv[1])['cluster']['resourcesVpcConfig']))",
        &[cluster],
    );
    let groups = vpc["securityGroupIds"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{vpc}");
    assert_eq!(
        vpc["subnetIds"], facts["subnet_ids"],
        "the cluster keeps its subnets: {vpc}"
    );
    let group = groups[0].as_str().unwrap().to_owned();
    let described = boto3_json(
        &tf.env,
        "print(json.dumps(boto3.client('ec2').describe_security_groups(GroupIds=[sys.argv[1]])['SecurityGroups'][0]))",
        &[&group],
    );
    assert_eq!(
        described["GroupName"],
        format!("{cluster}-control-plane-webhooks")
    );
    assert_eq!(described["VpcId"], facts["vpc_id"]);
    group
}

/// `script` with the stand-ins of [`common::fake_bin`] (made in `dir`) first on PATH, the
/// stand-in `aws` (tests/iac/fake_aws.py) before any real CLI.
fn with_fake_aws(dir: &Path, script: &str) -> String {
    format!(
        "PATH='{}':\"$PATH\"\n{script}",
        common::fake_bin(dir).display()
    )
}

/// The first shell block of docs/deploy.md after `marker`, as an operator copies it.
fn deploy_doc_block(marker: &str) -> String {
    doc_block("docs/deploy.md", marker)
}

/// The first shell block of `doc` (a path in the repository) at or after `marker`.
fn doc_block(doc: &str, marker: &str) -> String {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("{doc} has no {marker:?}"));
    let rest = &text[at..];
    let start = rest
        .find("```sh\n")
        .unwrap_or_else(|| panic!("no sh block after {marker:?} in {doc}"))
        + "```sh\n".len();
    let end = rest[start..].find("```").unwrap();
    rest[start..start + end].to_owned()
}

/// docs/troubleshooting.md's AWS commands, as written, in the Terraform root `dir` of an install
/// whose token hash is `hash` (the stand-in `aws` answers through boto3 from moto): the log tail
/// shows an admission line put into `log_group`, and the two hashes the comparison prints are the
/// function's and the stored token's, equal.
fn troubleshooting_commands_run_as_written(
    tf: &Terraform,
    dir: &Path,
    env: &[(String, String)],
    log_group: &str,
    hash: &str,
) {
    let block = |marker: &str| doc_block("docs/troubleshooting.md", marker);
    boto3(
        env,
        "l = boto3.client('logs')\nl.create_log_stream(logGroupName=sys.argv[1], logStreamName='s')\nl.put_log_events(logGroupName=sys.argv[1], logStreamName='s', logEvents=[{'timestamp': int(time.time() * 1000), 'message': '{\"level\":\"INFO\",\"message\":\"admission\",\"decision\":\"mutated\"}'}])",
        &[log_group],
    );
    let run = |script: &str, log: &str| -> String {
        let script = with_fake_aws(&dir.join("troubleshooting"), script);
        String::from_utf8(tf.shell_ok(dir, &script, &dir.join(log)).stdout).unwrap()
    };
    let tail = run(
        &block("```sh\n# the log group: terraform output -raw log_group_name"),
        "troubleshooting-tail.log",
    );
    assert!(
        tail.contains(r#""message":"admission","decision":"mutated""#),
        "{tail}"
    );
    let compared = run(
        &block("```sh\n# in the Terraform root (SAM"),
        "troubleshooting-hashes.log",
    );
    let hashes: Vec<&str> = compared
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or_default())
        .collect();
    assert_eq!(hashes, [hash, hash], "{compared}");
}

/// docs/scale.md's alarm on the account's claimed concurrency, its commands as written, against
/// moto (moto_server.py answers GetAccountSettings with a new account's limit, 1,000): the alarm
/// the doc makes exists, at 80% of that limit, on the metric, statistic and action it names.
#[test]
fn scale_md_concurrency_alarm_commands_run_as_written() {
    let block = doc_block("docs/scale.md", "```sh\ntopic=");
    let moto = Moto::start();
    let env = moto.env(REGION);
    let fake = common::fake_bin(&common::temp_dir("scale-alarm"));
    let out = moto_command("bash", &env)
        .args(["-euo", "pipefail", "-c", &block])
        .env(
            "PATH",
            format!("{}:{}", fake.display(), std::env::var("PATH").unwrap()),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docs/scale.md's alarm commands failed:\n{block}\n{}",
        combined(&out)
    );
    let alarms = boto3_json(
        &env,
        "keys = ('AlarmName', 'Namespace', 'MetricName', 'Statistic', 'Period', 'EvaluationPeriods', 'DatapointsToAlarm', 'Threshold', 'ComparisonOperator', 'TreatMissingData', 'AlarmActions')\n\
         print(json.dumps([{k: a.get(k) for k in keys} for a in boto3.client('cloudwatch').describe_alarms()['MetricAlarms']]))",
        &[],
    );
    assert_eq!(
        alarms,
        serde_json::json!([{
            "AlarmName": "lambda-claimed-account-concurrency",
            "Namespace": "AWS/Lambda",
            "MetricName": "ClaimedAccountConcurrency",
            "Statistic": "Maximum",
            "Period": 60,
            "EvaluationPeriods": 5,
            "DatapointsToAlarm": 2,
            "Threshold": 800.0,
            "ComparisonOperator": "GreaterThanThreshold",
            "TreatMissingData": "notBreaching",
            "AlarmActions": ["arn:aws:sns:eu-west-1:123456789012:alerts"],
        }])
    );
}

/// The managed resources in a root module's state (`terraform state list`, data sources left
/// out: a plan reads them again, and a refresh may add one).
fn managed_resources(tf: &Terraform, dir: &Path) -> std::collections::BTreeSet<String> {
    let out = tf.ok(dir, &["state", "list"], None);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("data.") && !l.contains(".data."))
        .map(str::to_owned)
        .collect()
}

/// The refusal both deletion guards print (terraform/protection.tf and
/// modules/registration), and how it says to lift the protection.
const PROTECTED: &str =
    "alb_deletion_protection is true: destroy refused before anything was deleted";
const LIFT_PROTECTION: &str = "set alb_deletion_protection = false (terraform.tfvars), run terraform apply, then terraform destroy";

/// A `terraform destroy` (with `extra`) of a protected install, in the root `dir`: refused by the
/// deletion guard `guard` (destroyed first of all), which says how to lift the protection, before
/// anything is deleted: every resource of `before` is still in the state. Returns its output.
fn assert_destroy_refused(
    tf: &Terraform,
    dir: &Path,
    extra: &[&str],
    guard: &str,
    before: &std::collections::BTreeSet<String>,
) -> String {
    let text = tf.refused(dir, "destroy", extra, "a protected install was destroyed");
    let line = words(&text);
    assert!(
        line.contains(PROTECTED)
            && line.contains(LIFT_PROTECTION)
            && line.contains(&format!("with {guard}")),
        "refused for another reason ({extra:?}):\n{text}"
    );
    assert!(
        !text.contains("Destruction complete"),
        "the refused destroy ({extra:?}) deleted something:\n{text}"
    );
    let after = managed_resources(tf, dir);
    assert!(
        before.is_subset(&after),
        "the refused destroy ({extra:?}) removed {:?} from the state",
        before.difference(&after).collect::<Vec<_>>()
    );
    text
}

/// `modules/eks-network` against an EKS cluster in moto whose VPC has what eksctl makes: a public
/// and a private subnet in one zone, two private subnets in another. It must pick the private
/// (kubernetes.io/role/internal-elb) subnets, one per zone, and the control plane's additional
/// security group; and refuse the cluster security group, and a group the cluster does not
/// have. The AWS module must refuse two ALB subnets in one zone before CreateLoadBalancer would.
fn eks_network_scenario() {
    let site = Site::new("eks-network");
    let tf = site.terraform();

    // 1. The cluster side, as eksctl leaves it.
    let cluster = site.dir().join("cluster");
    tf.init_root(
        &cluster,
        r#"
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
    );
    tf.apply(&cluster, &[], None);
    let facts = tf.output_json(&cluster);
    let subnet = |k: &str| facts["subnets"]["value"][k].as_str().unwrap().to_owned();
    let control_plane_sg = facts["control_plane_sg"]["value"].as_str().unwrap();
    let unrelated_sg = facts["unrelated_sg"]["value"].as_str().unwrap();

    // 2. The convenience module, as examples/alb uses it.
    let net = site.dir().join("net");
    tf.init_root(
        &net,
        r#"
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
    );
    tf.apply(&net, &[], None);
    let out = tf.output_json(&net);
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
        let text = tf.refused(
            &net,
            "plan",
            &[&format!("-var=control_plane_security_group_id={sg}")],
            &format!("eks-network accepted {sg}"),
        );
        assert!(
            words(&text).contains(why),
            "eks-network refused {sg} for another reason than {why:?}:\n{text}"
        );
    }

    // 3. Two ALB subnets in one zone (eksctl's public + private): refused at plan time.
    let alb = site.dir().join("alb");
    tf.init_root(
        &alb,
        &unapplied_module(&format!(
            "vpc_id = \"{vpc}\"\n  subnet_ids = [\"{a_private}\", \"{a_public}\"]\n  control_plane_security_group_id = \"{control_plane_sg}\"",
            vpc = out["vpc_id"]["value"].as_str().unwrap(),
            a_private = subnet("a_private"),
            a_public = subnet("a_public"),
        )),
    );
    let text = tf.refused(
        &alb,
        "plan",
        &[],
        "two ALB subnets in one zone were accepted",
    );
    assert!(
        words(&text).contains("subnet_ids must hold one subnet per availability zone"),
        "refused for another reason:\n{text}"
    );
}

/// The AWS module in a root beside terraform/, for plans only: a made-up zip hash and
/// certificate, no DNS record, and `inputs`.
fn unapplied_module(inputs: &str) -> String {
    format!(
        r#"
module "podmutator" {{
  source                  = "../terraform"
  lambda_zip_path         = "bootstrap.zip"
  lambda_zip_base64sha256 = "{hash}"
  domain_name             = "podmutator.example.com"
  create_certificate      = false
  certificate_arn         = "arn:aws:acm:{REGION}:123456789012:certificate/00000000-0000-0000-0000-000000000000"
  create_dns_record       = false
  {inputs}
}}
"#,
        hash = "A".repeat(43) + "=",
    )
}

/// Hole 10 of issue 25: the HTTP API is on the internet and the path token is quoted to pod
/// creators in the API server's errors, so the module refuses to put a value-delivery function
/// behind it (a variable validation, at plan time, before anything is created). Reference
/// delivery with env vars by exec is what that endpoint may serve, and plans cleanly.
#[test]
fn terraform_refuses_value_delivery_behind_the_http_api() {
    let site = Site::new("public-value");
    let tf = site.terraform();
    let root = |name: &str, delivery: &str| -> PathBuf {
        let dir = site.dir().join(name);
        tf.init_root(
            &dir,
            &unapplied_module(&format!("endpoint = \"http_api\"\n  {delivery}")),
        );
        dir
    };
    let refusal = "cannot serve Embedded value delivery";
    for (name, delivery) in [
        ("default-value", ""),
        // The function reads manager names in any case.
        (
            "lower-case-embedded",
            "webhook_config = { secretManagerTypes = [\"embedded\"] }",
        ),
        (
            "reference-env-by-value",
            &format!(
                "embedded_delivery = \"reference\"\n  embedded_env_var_delivery = \"value\"\n  fetcher_image = \"{FETCHER_IMAGE}\""
            ) as &str,
        ),
    ] {
        let text = tf.refused(&root(name, delivery), "plan", &[], name);
        assert!(
            words(&text).contains(refusal),
            "{name}: refused for another reason:\n{text}"
        );
    }
    let out = tf.plan(
        &root(
            "reference",
            &format!("embedded_delivery = \"reference\"\n  fetcher_image = \"{FETCHER_IMAGE}\""),
        ),
        &[],
    );
    let text = combined(&out);
    assert!(out.status.success(), "reference delivery refused:\n{text}");
    assert!(!text.contains(refusal), "{text}");
}

/// Item 13 of issue 38: the ECR pull-through cache rules belong to the account and region's
/// registry, and the install that made them used to delete them with its destroy while other
/// installs still rewrote their pods to them. Now they are examples/pull-through-cache's, applied
/// as its header says, which also adopts a rule an install made before (`adopt_existing_rules`,
/// then a plan without it is empty). Two installs reference the rules; destroying one leaves
/// them, and the other's plan is empty. Removed in the wrong order (the root before the last
/// install), the install's plan fails on the missing rule, and `terraform destroy
/// -refresh=false` still removes it, as docs/deploy.md says.
#[test]
fn pull_through_cache_rules_outlive_the_installs_that_rewrite_to_them() {
    let t0 = Instant::now();
    let site = Site::new("pull-through-cache");
    let (dir, tf) = (site.dir(), site.terraform());
    // prefix -> upstream, as ECR holds them.
    let rules = || {
        boto3_json(
            &site.env,
            "print(json.dumps({r['ecrRepositoryPrefix']: r['upstreamRegistryUrl'] for r in boto3.client('ecr').describe_pull_through_cache_rules()['pullThroughCacheRules']}))",
            &[],
        )
    };

    // A rule an install made before the rules had their own root.
    create_cache_rule(&site.env, "cache/quay", "quay.io");
    // The cache root first: its terraform.tfvars.example, edited.
    let cache = dir.join("examples/pull-through-cache");
    let example = std::fs::read_to_string(cache.join("terraform.tfvars.example")).unwrap();
    assert!(example.contains("upstreams = [") && example.contains("# adopt_existing_rules = ["));
    let tfvars =
        format!("region = \"{REGION}\"\nupstreams = [\"quay\", \"k8s\"]\nprefix = \"cache/\"\n");
    std::fs::write(
        cache.join("terraform.tfvars"),
        format!("{tfvars}adopt_existing_rules = [\"quay\"]\n"),
    )
    .unwrap();
    tf.init(&cache);
    tf.apply(&cache, &[], None);
    let made = serde_json::json!({"cache/quay": "quay.io", "cache/k8s": "registry.k8s.io"});
    assert_eq!(rules(), made);
    std::fs::write(cache.join("terraform.tfvars"), &tfvars).unwrap();
    tf.plan_is_empty(&cache, "the cache root after adopting");

    // Two installs (two clusters of the account and region), each rewriting to both caches.
    let hash = write_zip(&dir.join("bootstrap.zip"));
    let install = |name: &str| -> PathBuf {
        let at = dir.join(format!("install-{name}"));
        tf.init_root(
            &at,
            &format!(
                r#"{certificate}
module "podmutator" {{
  source                           = "../terraform"
  name                             = "pm-cache-{name}"
  endpoint                         = "http_api"
  lambda_zip_path                  = "${{path.root}}/../bootstrap.zip"
  lambda_zip_base64sha256          = "{hash}"
  domain_name                      = "{name}.podmutator.example.com"
  create_certificate               = false
  certificate_arn                  = aws_acm_certificate.elsewhere.arn
  create_dns_record                = false
  embedded_delivery                = "reference"
  fetcher_image                    = "{FETCHER_IMAGE}"
  alarms_enabled                   = false
  ecr_pull_through_cache_upstreams = ["quay", "k8s"]
  ecr_pull_through_cache_prefix    = "cache/"
}}
output "function_name" {{ value = module.podmutator.function_name }}
"#,
                certificate = certificate_elsewhere(&format!("{name}.podmutator.example.com")),
            ),
        );
        tf.apply(&at, &[], None);
        at
    };
    let (a, b) = (install("a"), install("b"));
    let registry = format!("123456789012.dkr.ecr.{REGION}.amazonaws.com");
    for at in [&a, &b] {
        let function = tf.output(at, "function_name");
        assert_eq!(
            live_config(&site.env, &function)["images"]["rules"],
            serde_json::json!([
                {"match": "quay.io", "replace": format!("{registry}/cache/quay")},
                {"match": "registry.k8s.io", "replace": format!("{registry}/cache/k8s")}
            ]),
            "{function} does not rewrite to the caches"
        );
    }
    assert_eq!(rules(), made, "an install changed the rules");

    // Destroying one install leaves the rules to the other, whose plan stays empty.
    tf.destroy(&a, &[], None);
    assert!(managed_resources(&tf, &a).is_empty());
    assert_eq!(rules(), made, "destroying an install removed the caches");
    tf.plan_is_empty(&b, "the other install");
    tf.plan_is_empty(&cache, "the cache root");

    // The root removed before the last install: that install's plan fails on the missing rule
    // (its pods would pull from a cache that is gone); its destroy without a refresh works.
    tf.destroy(&cache, &[], None);
    assert_eq!(rules(), serde_json::json!({}));
    let text = words(&tf.refused(
        &b,
        "plan",
        &[],
        "an install plans against caches that are gone",
    ));
    assert!(
        text.contains("reading ECR Pull Through Cache Rule (cache/"),
        "an install plans against caches that are gone: {text}"
    );
    tf.destroy(&b, &["-refresh=false"], None);
    assert!(managed_resources(&tf, &b).is_empty());
    eprintln!(
        "pull-through cache root and two installs against moto in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// What a plan settles before anything is created. Without a token the function is told so
/// (`http.pathTokenDisabled`), and the binary's start-up gate accepts the planned environment,
/// which it refuses without that key; an environment over Lambda's 4 KB is refused with its
/// size; ALB access logs, which record the token, are refused unless acknowledged; a previous
/// token's hash must be a hash, beside a token.
#[test]
fn terraform_plans_refuse_what_lambda_or_the_function_would_refuse() {
    let site = Site::new("plan-checks");
    let tf = site.terraform();
    // A root of the AWS module with `inputs`, planned to plan.tfplan: its directory.
    let plan = |name: &str, inputs: &str| -> (Output, PathBuf) {
        let dir = site.dir().join(name);
        tf.init_root(
            &dir,
            &unapplied_module(&format!(
                "endpoint = \"http_api\"\n  embedded_delivery = \"reference\"\n  fetcher_image = \"{FETCHER_IMAGE}\"\n  {inputs}"
            )),
        );
        (tf.plan(&dir, &["-out=plan.tfplan"]), dir)
    };
    let planned = |name: &str, inputs: &str| -> PathBuf {
        let (out, dir) = plan(name, inputs);
        assert!(out.status.success(), "{name}: {}", combined(&out));
        dir
    };
    // A plan that must fail: its output as one line of words.
    let plan_refused = |name: &str, inputs: &str| -> String {
        let (out, _) = plan(name, inputs);
        let text = words(&combined(&out));
        assert!(!out.status.success(), "{name}: planned: {text}");
        text
    };

    // The token off.
    let dir = planned("token-off", "path_token_enabled = false");
    let config = tf.planned_config(&dir);
    assert_eq!(
        config["http"],
        serde_json::json!({"maxBodyBytes": 6291456, "pathTokenDisabled": true}),
        "{config}"
    );
    assert_function_starts(&config, "the planned configuration");
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

    // Each number the function reads, at each end Terraform accepts (config-bounds.json, the
    // function's own bounds; Lambda's 6 MiB for the body): the planned configuration starts the
    // function (a registry lookup on, whose timeout follows the deadline). One past either end
    // is refused at plan, naming the variable.
    let bounds = podmutator_core::config::bounds::to_json();
    let end = |key: &str, which: &str| bounds[key][which].as_u64().unwrap();
    let numbers = |deadline: i64, ttl: i64, body: i64| {
        format!(
            "path_token_enabled = false\n  entrypoint_registries = [\"registry.example.com\"]\n  \
             timeout_seconds = 30\n  lambda_timeout_seconds = 28\n  embedded_deadline_ms = {deadline}\n  \
             embedded_cache_ttl_seconds = {ttl}\n  max_body_bytes = {body}"
        )
    };
    let lowest = [
        end("embedded.deadlineMs", "minimum"),
        end("embedded.cacheTtlSeconds", "minimum"),
        end("http.maxBodyBytes", "minimum"),
    ];
    let highest = [
        end("embedded.deadlineMs", "maximum"),
        end("embedded.cacheTtlSeconds", "maximum"),
        6_291_456,
    ];
    for (name, [deadline, ttl, body]) in [("lowest", lowest), ("highest", highest)] {
        let dir = planned(name, &numbers(deadline as i64, ttl as i64, body as i64));
        let config = tf.planned_config(&dir);
        assert_eq!(
            (
                &config["embedded"]["deadlineMs"],
                &config["embedded"]["cacheTtlSeconds"],
                &config["http"]["maxBodyBytes"]
            ),
            (&deadline.into(), &ttl.into(), &body.into()),
            "{config}"
        );
        assert_function_starts(&config, name);
    }
    for (name, [deadline, ttl, body]) in [
        ("below", lowest.map(|n| n as i64 - 1)),
        ("above", highest.map(|n| n as i64 + 1)),
    ] {
        let text = plan_refused(name, &numbers(deadline, ttl, body));
        for variable in [
            "embedded_deadline_ms",
            "embedded_cache_ttl_seconds",
            "max_body_bytes",
        ] {
            assert!(
                text.contains(&format!("{variable} must be a whole number from")),
                "{name}: {variable} not named: {text}"
            );
        }
    }

    // The limits and mutators sections: each end of each limit (the function's bounds; a large
    // number where it has no maximum) and every mutator id the function knows reach the planned
    // configuration as the function reads them, and it starts on it. One past either end, a
    // fraction, an unknown id, and the plain paths without a token are refused at plan, naming
    // the variable. (With the token on its hash, and so the configuration, is unknown at plan:
    // acceptPlainPaths is applied in rotates_the_path_token_then_releases_and_rolls_back.)
    let limit = |key: &str, which: &str| bounds[key][which].as_u64();
    let keys = [
        (
            "max_secret_requests_per_pod",
            "limits.maxSecretRequestsPerPod",
        ),
        (
            "max_secret_ids_per_admission",
            "limits.maxSecretIdsPerAdmission",
        ),
        ("max_objects_per_review", "limits.maxObjectsPerReview"),
    ];
    let limits = |values: &[String]| {
        let fields: Vec<String> = keys
            .iter()
            .zip(values)
            .map(|((field, _), v)| format!("{field} = {v}"))
            .collect();
        format!("limits = {{ {} }}", fields.join(", "))
    };
    let ids = podmutator_core::config::MutatorId::ALL;
    let mutators: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| format!("\"{id}\" = {{ required = {} }}", i % 2 == 0))
        .collect();
    for (name, which) in [("limits-lowest", "minimum"), ("limits-highest", "maximum")] {
        let values: Vec<u64> = keys
            .iter()
            .map(|(_, key)| limit(key, which).unwrap_or(1_000_000))
            .collect();
        let dir = planned(
            name,
            &format!(
                "{}\n  mutators = {{ {} }}\n  path_token_enabled = false",
                limits(&values.iter().map(u64::to_string).collect::<Vec<_>>()),
                mutators.join(", ")
            ),
        );
        let config = tf.planned_config(&dir);
        let want_limits: serde_json::Map<String, serde_json::Value> = keys
            .iter()
            .zip(&values)
            .map(|((_, key), v)| (key.trim_start_matches("limits.").to_string(), (*v).into()))
            .collect();
        assert_eq!(
            config["limits"],
            serde_json::Value::Object(want_limits),
            "{config}"
        );
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                config["mutators"][id.as_str()],
                serde_json::json!({"required": i % 2 == 0}),
                "{config}"
            );
        }
        assert_function_starts(&config, name);
    }
    // Sections not asked for are not written: the 4 KB environment holds none of them.
    let config = tf.planned_config(&planned("limits-none", "path_token_enabled = false"));
    assert!(
        config.get("limits").is_none() && config.get("mutators").is_none(),
        "{config}"
    );
    let below: Vec<String> = keys
        .iter()
        .map(|(_, key)| (limit(key, "minimum").unwrap() - 1).to_string())
        .collect();
    let text = plan_refused(
        "limits-below",
        &format!(
            "{}\n  mutators = {{ secretz = {{ required = false }} }}",
            limits(&below)
        ),
    );
    for (field, key) in keys {
        assert!(
            text.contains(&format!(
                "{field} = {}, but the function's {key} is a whole number of at least",
                limit(key, "minimum").unwrap() - 1
            )),
            "{field} not named: {text}"
        );
    }
    assert!(
        text.contains(
            "mutators: \"secretz\" is not a mutator id; the ids are namespace-injection,"
        ),
        "the unknown id is not named: {text}"
    );
    let objects_max = limit("limits.maxObjectsPerReview", "maximum").unwrap();
    let text = plan_refused(
        "limits-above",
        &format!(
            "limits = {{ max_objects_per_review = {}, max_secret_ids_per_admission = 2.5 }}",
            objects_max + 1
        ),
    );
    assert!(
        text.contains(&format!(
            "max_objects_per_review = {}, but",
            objects_max + 1
        )) && text.contains(&format!("and at most {objects_max}"))
            && text.contains("max_secret_ids_per_admission = 2.5, but"),
        "{text}"
    );
    let text = plan_refused(
        "plain-without-token",
        "path_token_enabled = false\n  accept_plain_paths = true",
    );
    assert!(
        text.contains("accept_plain_paths answers the plain paths beside a path token's; it needs path_token_enabled = true"),
        "{text}"
    );

    // Lambda's 4 KB: 40 image rules (a registry per team) make a 6 KB environment.
    let rules: Vec<String> = (0..40)
        .map(|i| format!("{{ match = \"registry{i}.example.com/team/project\", replace = \"123456789012.dkr.ecr.{REGION}.amazonaws.com/mirror/registry{i}\" }}"))
        .collect();
    let text = plan_refused(
        "too-large",
        &format!("images_config = {{ rules = [{}] }}", rules.join(", ")),
    );
    assert!(
        text.contains("would be 6")
            && text.contains("bytes, and Lambda refuses more than 4096")
            && text.contains("fewer images rules"),
        "refused for another reason: {text}"
    );
    // Ten of them fit (about 2.4 KB).
    planned(
        "ten-rules",
        &format!("images_config = {{ rules = [{}] }}", rules[..10].join(", ")),
    );

    // ALB access logs record the path, token included.
    let text = plan_refused("access-logs", "alb_access_logs_bucket = \"logs-bucket\"");
    assert!(
        text.contains("ALB access logs record every request's URL"),
        "refused for another reason: {text}"
    );
    planned(
        "access-logs-acknowledged",
        "alb_access_logs_bucket = \"logs-bucket\"\n  alb_access_logs_record_path_token = true",
    );

    // The previous token's hash.
    let previous = "ab".repeat(32);
    let text = plan_refused(
        "previous-not-a-hash",
        "previous_path_token_sha256 = \"not-a-hash\"",
    );
    assert!(
        text.contains("64 lowercase hex digits"),
        "a previous token that is no hash: {text}"
    );
    let text = plan_refused(
        "previous-without-token",
        &format!("path_token_enabled = false\n  previous_path_token_sha256 = \"{previous}\""),
    );
    assert!(
        text.contains("it needs path_token_enabled = true"),
        "a previous token without a token: {text}"
    );
    planned(
        "previous",
        &format!("previous_path_token_sha256 = \"{previous}\""),
    );

    // The pull-through cache rules are their own root's (item 13 of issue 38): an install
    // plans none and reads the rule of each upstream it rewrites to. While that rule is
    // missing, the plan fails on it; once it exists (made here through moto's API, as
    // examples/pull-through-cache would), the images rule rewrites to the cache (the
    // partition's DNS suffix, not a hard-coded one, in its host). A rule under that prefix
    // that caches another registry is refused.
    let make_rule = |prefix: &str, upstream: &str| create_cache_rule(&site.env, prefix, upstream);
    // The token off, so that the whole configuration is known at plan time.
    let caches = |upstream: &str| {
        format!(
            "ecr_pull_through_cache_upstreams = [\"{upstream}\"]\n  ecr_pull_through_cache_prefix = \"cache/\"\n  path_token_enabled = false"
        )
    };
    let text = plan_refused("caches-missing", &caches("quay"));
    assert!(
        text.contains("reading ECR Pull Through Cache Rule (cache/quay)"),
        "an install rewrites to a cache that does not exist: {text}"
    );
    make_rule("cache/quay", "quay.io");
    let dir = planned("caches", &caches("quay"));
    let config = tf.planned_config(&dir);
    assert_eq!(
        config["images"]["rules"],
        serde_json::json!([{"match": "quay.io", "replace": format!("123456789012.dkr.ecr.{REGION}.amazonaws.com/cache/quay")}]),
        "{config}"
    );
    let show = tf.show_json(&dir, "plan.tfplan");
    assert!(
        !show["resource_changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["type"] == "aws_ecr_pull_through_cache_rule"),
        "an install plans a cache rule"
    );
    make_rule("cache/k8s", "quay.io");
    let text = plan_refused("caches-other-registry", &caches("k8s"));
    assert!(
        text.contains(
            "The ECR pull-through cache rule cache/k8s caches quay.io, not registry.k8s.io"
        ),
        "a cache of another registry was accepted: {text}"
    );

    // The task pods' roles: named per cluster (two clusters have the same namespaces), cut to
    // IAM's 64 characters with a hash when longer, with the path and boundary an account may
    // require, and reading secrets in secrets_region.
    let pods = site.dir().join("pod-identity");
    let long_ns = format!("p{}-development", "x".repeat(40));
    tf.init_root(
        &pods,
        &format!(
            r#"
module "pods" {{
  source                   = "../terraform/modules/pod-identity"
  cluster_name             = "flyte-staging"
  organization             = "flyte"
  iam_role_path            = "/podmutator/"
  permissions_boundary_arn = "arn:aws:iam::123456789012:policy/boundary"
  secrets_region           = "eu-west-1"
  kms_key_arns             = ["arn:aws:kms:eu-west-1:123456789012:key/00000000-0000-0000-0000-000000000000"]
  namespaces = {{
    "flytesnacks-development" = {{ project = "flytesnacks", domain = "development" }}
    "{long_ns}" = {{ project = "p{x}", domain = "development" }}
  }}
}}

provider "aws" {{
  alias                       = "elsewhere"
  region                      = "eu-west-1"
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  s3_use_path_style           = true
}}

module "pods_elsewhere" {{
  source       = "../terraform/modules/pod-identity"
  providers    = {{ aws = aws.elsewhere }}
  cluster_name = "flyte-staging"
  organization = "flyte"
  namespaces = {{
    "flytesnacks-development" = {{ project = "flytesnacks", domain = "development" }}
  }}
}}
"#,
            x = "x".repeat(40)
        ),
    );
    tf.ok(&pods, &verb_args("plan", &["-out=plan.tfplan"]), None);
    let show = tf.show_json(&pods, "plan.tfplan");
    let changes = show["resource_changes"].as_array().unwrap();
    let after = |address: &str| -> &serde_json::Value {
        &changes
            .iter()
            .find(|r| r["address"] == address)
            .unwrap_or_else(|| panic!("{address} is not planned"))["change"]["after"]
    };
    let short = after("module.pods.aws_iam_role.pods[\"flytesnacks-development\"]");
    assert_eq!(
        short["name"],
        format!("podmutator-pods-flyte-staging-{REGION}-flytesnacks-development")
    );
    // The same cluster name in another region of the account gets roles of its own (IAM names
    // are global: the same name would fail with EntityAlreadyExists).
    let other = after("module.pods_elsewhere.aws_iam_role.pods[\"flytesnacks-development\"]");
    assert_eq!(
        other["name"],
        "podmutator-pods-flyte-staging-eu-west-1-flytesnacks-development"
    );
    assert_eq!(short["path"], "/podmutator/");
    assert_eq!(
        short["permissions_boundary"],
        "arn:aws:iam::123456789012:policy/boundary"
    );
    let long = after(&format!("module.pods.aws_iam_role.pods[\"{long_ns}\"]"));
    let long_name = long["name"].as_str().unwrap();
    let full = format!("podmutator-pods-flyte-staging-{REGION}-{long_ns}");
    assert_eq!(
        long_name,
        format!("{}-{}", &full[..55], &common::hex_sha256(&full)[..8])
    );
    assert_eq!(long_name.len(), 64);
    let policy: serde_json::Value = serde_json::from_str(
        after("module.pods.aws_iam_role_policy.read[\"flytesnacks-development\"]")["policy"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let text = policy.to_string();
    assert!(
        text.contains("arn:aws:secretsmanager:eu-west-1:123456789012:secret:u__org__flyte__domain__development__project__flytesnacks__key__*")
            && text.contains("\"secretsmanager.eu-west-1.amazonaws.com\"")
            && !text.contains(REGION),
        "{policy}"
    );
}

/// The string variables the function checks at start (its namespace template, the fetcher
/// image, the registries it reads ENTRYPOINTs from, the metrics namespace) refuse at plan what
/// the function refuses, each with what to write instead; the binary's `check-config` refuses
/// each same value in the planned configuration, and accepts the values at the edges that both
/// accept, so the two cannot drift apart.
#[test]
fn terraform_string_variables_refuse_what_the_function_refuses() {
    let site = Site::new("plan-strings");
    let tf = site.terraform();
    // The token off: the whole configuration is known at plan time.
    let plan = |name: &str, inputs: &str| -> (Output, PathBuf) {
        let dir = site.dir().join(name);
        tf.init_root(
            &dir,
            &unapplied_module(&format!(
                "endpoint = \"http_api\"\n  path_token_enabled = false\n  embedded_delivery = \"reference\"\n  {inputs}"
            )),
        );
        (tf.plan(&dir, &["-out=plan.tfplan"]), dir)
    };
    let hcl = |v: &serde_json::Value| v.to_string();
    let inputs = |template: &str, image: &str, registry: &str, metrics: &str| {
        format!(
            "namespace_template = {}\n  fetcher_image = {}\n  entrypoint_registries = [{}]\n  metrics_namespace = {}",
            hcl(&template.into()),
            hcl(&image.into()),
            hcl(&registry.into()),
            hcl(&metrics.into())
        )
    };

    // Values at the edges that both accept: placeholders written without spaces, a registry
    // with a port, a bracketed IPv6 address, localhost, a colon after the first character.
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let accepted = [
        (
            "{{organization}}-{{ project }}-{{domain}}",
            format!("localhost:5000/podmutator:v1@{digest}"),
            "localhost",
            "team:podmutator",
        ),
        (
            "",
            format!("[::1]:5000/org/podmutator@{digest}"),
            "[::1]:5000",
            "p",
        ),
        (
            "ns-{{ project }}-{{\tdomain }}",
            "podmutator:1.2.3".into(),
            "Registry.Example.com:443",
            &"m".repeat(255),
        ),
    ];
    let mut config = serde_json::Value::Null;
    for (i, (template, image, registry, metrics)) in accepted.iter().enumerate() {
        let (out, dir) = plan(
            &format!("accepted-{i}"),
            &inputs(template, image, registry, metrics),
        );
        assert!(out.status.success(), "accepted-{i}: {}", combined(&out));
        config = tf.planned_config(&dir);
        assert_eq!(
            (
                &config["embedded"]["namespaceTemplate"],
                &config["embedded"]["fetcherImage"],
                &config["embedded"]["entrypointLookup"]["registries"][0],
                &config["metrics"]["namespace"]
            ),
            (
                &(*template).into(),
                &image.as_str().into(),
                &(*registry).into(),
                &(*metrics).into()
            ),
            "{config}"
        );
        assert_function_starts(&config, &format!("accepted-{i}"));
    }

    // Each refused value, with what the plan says and the key the function names. A plan with
    // the other three variables' values (a plan reports every refused variable), and one with
    // the fetcher image alone: its check reads embedded_delivery, and Terraform checks what
    // reads another variable only once the others pass.
    let refused = [
        [
            (
                "namespace_template",
                "{{ project }}",
                "namespace_template must use {{ domain }}",
                "embedded.namespaceTemplate",
            ),
            (
                "fetcher_image",
                " ",
                "fetcher_image must be an image reference the kubelet can pull",
                "embedded.fetcherImage",
            ),
            (
                "entrypoint_registries",
                "-bad-",
                "entrypoint_registries entries are registry hosts",
                "embedded.entrypointLookup.registries[0]",
            ),
            (
                "metrics_namespace",
                "",
                "metrics_namespace must be 1 to 255 bytes",
                "metrics.namespace",
            ),
        ],
        [
            (
                "namespace_template",
                "{{ project }}.{{ domain }}",
                "namespace_template must give a namespace name",
                "embedded.namespaceTemplate",
            ),
            (
                "fetcher_image",
                "123456789012.dkr.ecr.eu-west-1.amazonaws.com/podmutator@sha256:REPLACE_WITH_THE_DIGEST",
                "fetcher_image must be an image reference the kubelet can pull",
                "embedded.fetcherImage",
            ),
            (
                "entrypoint_registries",
                "registry.example.com/team",
                "entrypoint_registries entries are registry hosts",
                "embedded.entrypointLookup.registries[0]",
            ),
            (
                "metrics_namespace",
                ":podmutator",
                "metrics_namespace must be 1 to 255 bytes",
                "metrics.namespace",
            ),
        ],
        [
            (
                "namespace_template",
                "{{ team }}-{{ domain }}",
                "namespace_template must give a namespace name",
                "embedded.namespaceTemplate",
            ),
            (
                "fetcher_image",
                "registry.example.com/Podmutator:1",
                "fetcher_image must be an image reference the kubelet can pull",
                "embedded.fetcherImage",
            ),
            (
                "entrypoint_registries",
                "registry",
                "entrypoint_registries entries are registry hosts",
                "embedded.entrypointLookup.registries[0]",
            ),
            (
                "metrics_namespace",
                &"é".repeat(128),
                "metrics_namespace must be 1 to 255 bytes",
                "metrics.namespace",
            ),
        ],
    ];
    for (i, cases) in refused.iter().enumerate() {
        let [t, f, r, m] = cases.map(|c| c.1);
        let (good_t, _, good_r, good_m) = &accepted[0];
        let mut said = String::new();
        for (name, inputs) in [
            (format!("refused-{i}"), inputs(t, FETCHER_IMAGE, r, m)),
            (
                format!("refused-image-{i}"),
                inputs(good_t, f, good_r, good_m),
            ),
        ] {
            let (out, _) = plan(&name, &inputs);
            let text = words(&combined(&out));
            assert!(!out.status.success(), "{name}: planned: {text}");
            said += &text;
        }
        for (variable, value, says, key) in cases {
            assert!(
                said.contains(says),
                "refused-{i}: {variable} = {value:?} not refused with {says:?}: {said}"
            );
            // The same value in the configuration Terraform planned: the function refuses it,
            // naming its key.
            let mut bad = config.clone();
            match *variable {
                "namespace_template" => bad["embedded"]["namespaceTemplate"] = (*value).into(),
                "fetcher_image" => bad["embedded"]["fetcherImage"] = (*value).into(),
                "entrypoint_registries" => {
                    bad["embedded"]["entrypointLookup"]["registries"] = serde_json::json!([value])
                }
                _ => bad["metrics"]["namespace"] = (*value).into(),
            }
            let started = check_config(&bad);
            assert!(
                !started.status.success()
                    && combined(&started).contains(&format!("invalid configuration: {key}")),
                "{variable} = {value:?}: the function does not refuse it at {key}: {}",
                combined(&started)
            );
        }
    }
}

/// Item 9 of issue 38: `alb_deletion_protection` protects the install, not the ALB alone. The
/// AWS module without the registration module (its own guard, terraform/protection.tf): with
/// the protection on (the default), `terraform destroy` is refused before it deletes anything
/// (every resource still in the state, the function and the ALB in moto); `-var` on the destroy
/// alone does not lift it; an apply with it off does, and the destroy then removes everything.
/// (moto does not enforce the ALB's own deletion protection: before the guard, this destroy
/// succeeded.) A scenario of the moto test.
fn a_protected_install_refuses_destroy_before_deleting_anything() {
    let site = Site::new("protected");
    let (dir, env, tf) = (site.dir(), &site.env, site.terraform());
    let hash = write_zip(&dir.join("bootstrap.zip"));
    tf.init_root(
        dir,
        &format!(
            r#"
variable "alb_deletion_protection" {{
  type    = bool
  default = true
}}
{network}{certificate}
module "podmutator" {{
  source                          = "./terraform"
  name                            = "pm-protected"
  lambda_zip_path                 = "${{path.root}}/bootstrap.zip"
  lambda_zip_base64sha256         = "{hash}"
  domain_name                     = "podmutator.example.com"
  create_certificate              = false
  certificate_arn                 = aws_acm_certificate.elsewhere.arn
  create_dns_record               = false
  vpc_id                          = aws_vpc.cluster.id
  subnet_ids                      = aws_subnet.private[*].id
  control_plane_security_group_id = aws_security_group.control_plane.id
  alarms_enabled                  = false
  alb_deletion_protection         = var.alb_deletion_protection
}}
"#,
            network = cluster_network(),
            certificate = certificate_elsewhere("podmutator.example.com"),
        ),
    );
    tf.apply(dir, &[], None);
    // What moto holds: the function, and the ALB with its own protection on.
    let in_moto = || {
        boto3_json(
            env,
            "from botocore.exceptions import ClientError\ntry:\n    fn = boto3.client('lambda').get_function(FunctionName='pm-protected')['Configuration']['FunctionName']\nexcept ClientError:\n    fn = None\nelb = boto3.client('elbv2')\nlbs = [l['LoadBalancerArn'] for l in elb.describe_load_balancers()['LoadBalancers'] if l['LoadBalancerName'] == 'pm-protected']\nprotected = [a['Value'] for l in lbs for a in elb.describe_load_balancer_attributes(LoadBalancerArn=l)['Attributes'] if a['Key'] == 'deletion_protection.enabled']\nprint(json.dumps({'function': fn, 'alb_protection': protected}))",
            &[],
        )
    };
    assert_eq!(
        in_moto(),
        serde_json::json!({"function": "pm-protected", "alb_protection": ["true"]})
    );
    let before = managed_resources(&tf, dir);
    assert!(
        before.contains("module.podmutator.terraform_data.deletion_guard[0]")
            && before.contains("module.podmutator.aws_lambda_function.this")
            && before.contains("module.podmutator.aws_lb.this[0]"),
        "{before:?}"
    );

    // Refused, by the module's guard, before anything is deleted: also with the variable set
    // false on the destroy alone (the guard reads the state, which only an apply changes).
    for extra in [&[][..], &["-var=alb_deletion_protection=false"]] {
        assert_destroy_refused(
            &tf,
            dir,
            extra,
            "module.podmutator.terraform_data.deletion_guard[0]",
            &before,
        );
        assert_eq!(
            in_moto(),
            serde_json::json!({"function": "pm-protected", "alb_protection": ["true"]}),
            "the refused destroy ({extra:?}) deleted in AWS"
        );
    }

    // Lifted by an apply; then the destroy removes everything.
    tf.apply(dir, &["-var=alb_deletion_protection=false"], None);
    tf.destroy(dir, &["-var=alb_deletion_protection=false"], None);
    assert!(managed_resources(&tf, dir).is_empty());
    assert_eq!(
        in_moto(),
        serde_json::json!({"function": null, "alb_protection": []})
    );
}

/// A rotation as docs/deploy.md ("Rotating the path token") runs it: its commands, as written,
/// editing terraform.tfvars. The apply that raises path_token_version with
/// previous_path_token_sha256 leaves the function accepting `[new, previous]` and the
/// registration on the new token; the next apply, without the previous hash, leaves `new`
/// alone; a routine plan after that is empty. Then the version cannot go down (item 7 of issue
/// 38): an apply with version 1, or terraform.tfvars without the version, is refused at plan
/// time, and the token, the function and the registration stay as they were. A scenario of the
/// moto test.
fn rotates_the_path_token_then_releases_and_rolls_back() {
    let mut site = Site::new("rotation");
    let kube = site.fake_cluster();
    let (dir, env, tf) = (site.dir(), &site.env, site.terraform());
    let hash = write_zip(&dir.join("bootstrap.zip"));
    // The root's variables live in terraform.tfvars, which the runbook edits.
    let tfvars = dir.join("terraform.tfvars");
    std::fs::write(
        &tfvars,
        format!(
            "lambda_zip_path         = \"./bootstrap.zip\"\nlambda_zip_base64sha256 = \"{hash}\"\n"
        ),
    )
    .unwrap();
    tf.init_root(
        dir,
        &format!(
            r#"
variable "path_token_enabled" {{
  type    = bool
  default = true
}}
variable "accept_plain_paths" {{
  type    = bool
  default = false
}}
variable "path_token_version" {{
  type    = number
  default = 1
}}
variable "previous_path_token_sha256" {{
  type    = string
  default = null
}}
variable "lambda_zip_path" {{
  type    = string
  default = null
}}
variable "lambda_s3_bucket" {{
  type    = string
  default = null
}}
variable "lambda_s3_key" {{
  type    = string
  default = null
}}
variable "lambda_zip_base64sha256" {{
  type = string
}}
{certificate}
module "podmutator" {{
  source                     = "./terraform"
  name                       = "pm-rotation"
  endpoint                   = "http_api"
  lambda_zip_path            = var.lambda_zip_path
  lambda_s3_bucket           = var.lambda_s3_bucket
  lambda_s3_key              = var.lambda_s3_key
  lambda_zip_base64sha256    = var.lambda_zip_base64sha256
  domain_name                = "podmutator.example.com"
  create_certificate         = false
  certificate_arn            = aws_acm_certificate.elsewhere.arn
  create_dns_record          = false
  embedded_delivery          = "reference"
  fetcher_image              = "{FETCHER_IMAGE}"
  alarms_enabled             = false
  path_token_enabled         = var.path_token_enabled
  accept_plain_paths         = var.accept_plain_paths
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
output "path_token_version" {{ value = module.podmutator.path_token_version }}
output "path_token_secret_arn" {{ value = module.podmutator.path_token_secret_arn }}
output "function_name" {{ value = module.podmutator.function_name }}
output "log_group_name" {{ value = module.podmutator.log_group_name }}
"#,
            certificate = certificate_elsewhere("podmutator.example.com"),
        ),
    );
    let output = |name: &str| tf.output(dir, name);
    // What the `live` alias serves: the function's http section, read back from moto.
    let live_http = || live_config(env, &output("function_name"))["http"].clone();
    // The hashes of the tokens in the registration's URLs (the tokens themselves stay in here).
    let registered_hashes = || -> std::collections::BTreeSet<String> {
        registered(&kube)["webhooks"]
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
                common::hex_sha256(token)
            })
            .collect()
    };

    // The SHA-256 of the token Secrets Manager holds as current (the token stays in here).
    let stored_hash = || -> String {
        boto3(
            env,
            "print(hashlib.sha256(boto3.client('secretsmanager').get_secret_value(SecretId=sys.argv[1])['SecretString'].encode()).hexdigest())",
            &[&output("path_token_secret_arn")],
        )
    };
    // docs/deploy.md's commands, as written, with `terraform` on PATH.
    let runbook = deploy_doc_block("**Terraform** does steps 1 and 2");
    let (steps_1_2, step_3) = runbook.split_at(
        runbook
            .find("\n# verify")
            .expect("the runbook marks where verification comes")
            + 1,
    );
    let run_doc = |script: &str, log: &str| {
        assert_no_warnings(&combined(&tf.shell_ok(dir, script, &dir.join(log))), script);
    };

    // Turning the token on (docs/deploy.md): an install without one; then the token, with the
    // plain paths answered beside it while the registration moves to the token's URL; then the
    // plain paths dropped.
    tf.apply(dir, &["-var=path_token_enabled=false"], None);
    assert_eq!(live_http()["pathTokenDisabled"], true);
    let registered_paths = || -> Vec<String> {
        registered(&kube)["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["clientConfig"]["url"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(
        registered_paths()
            .iter()
            .all(|url| url.trim_start_matches("https://").split('/').count() == 2),
        "without a token the registration calls the plain paths: {:?}",
        registered_paths()
    );
    tf.apply(dir, &["-var=accept_plain_paths=true"], None);
    let first = output("path_token_sha256");
    assert_eq!(
        live_http(),
        serde_json::json!({"maxBodyBytes": 6291456, "pathTokenSha256": first, "acceptPlainPaths": true}),
        "while the token turns on the function answers both"
    );
    assert_eq!(registered_hashes(), [first.clone()].into());
    // The HTTP API routes both: a registration on the plain paths reaches the function.
    let route_keys = || -> Vec<String> {
        serde_json::from_value(boto3_json(
            env,
            "a=[x['ApiId'] for x in boto3.client('apigatewayv2').get_apis()['Items'] if x['Name']==sys.argv[1]]; print(json.dumps(sorted(r['RouteKey'] for r in boto3.client('apigatewayv2').get_routes(ApiId=a[0])['Items'])))",
            &["pm-rotation"],
        ))
        .unwrap()
    };
    let keys = route_keys();
    assert!(
        keys.contains(&"POST /{token}/mutate--v1-pod".to_string())
            && keys.contains(&"POST /mutate--v1-pod".to_string())
            && keys.contains(&"GET /healthz".to_string()),
        "{keys:?}"
    );

    tf.apply(dir, &[], None);
    assert!(
        route_keys().iter().all(|k| k.contains("/{token}/")),
        "the plain routes outlive accept_plain_paths: {:?}",
        route_keys()
    );
    assert_eq!(output("path_token_sha256"), first);
    assert_eq!(output("path_token_version"), "1");
    assert_eq!(live_http()["pathTokenSha256"], first.as_str());
    assert!(
        live_http().get("acceptPlainPaths").is_none(),
        "{}",
        live_http()
    );
    assert_eq!(registered_hashes(), [first.clone()].into());
    assert_eq!(stored_hash(), first);
    troubleshooting_commands_run_as_written(&tf, dir, env, &output("log_group_name"), &first);

    // Steps 1 and 2: the function accepts both, then the registration moves; the version and
    // the previous hash are in terraform.tfvars.
    run_doc(steps_1_2, "rotate.log");
    let written = std::fs::read_to_string(&tfvars).unwrap();
    assert!(
        written.contains("path_token_version         = 2\n")
            && written.contains(&format!("previous_path_token_sha256 = \"{first}\"\n")),
        "the runbook did not write the rotation into terraform.tfvars:\n{written}"
    );
    assert_eq!(output("path_token_version"), "2");
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

    assert_eq!(stored_hash(), second);

    // Step 3: the previous token is dropped; nothing else changes; the version stays.
    run_doc(step_3, "drop-previous.log");
    let written = std::fs::read_to_string(&tfvars).unwrap();
    assert!(
        written.contains("path_token_version         = 2\n")
            && !written.contains("previous_path_token_sha256"),
        "step 3 left terraform.tfvars as:\n{written}"
    );
    assert_eq!(live_http()["pathTokenSha256"], second.as_str());
    assert_eq!(registered_hashes(), [second.clone()].into());
    // A routine plan, without any -var, changes nothing.
    tf.plan_is_empty(dir, "after the rotation");

    // The version only goes up: an apply that would lower it (a forgotten tfvars line, an
    // old copy, a -var from an old runbook) is refused at plan time, saying what to set, and
    // nothing changes: the stored token, the function's hash, the registration.
    let refusal = "path_token_version is 1, lower than 2, the version applied last";
    let text = words(&tf.refused(
        dir,
        "apply",
        &["-var=path_token_version=1"],
        "version 1 after 2 was applied",
    ));
    assert!(
        text.contains(refusal) && text.contains("Set path_token_version = 2 in terraform.tfvars"),
        "refused for another reason: {text}"
    );
    assert!(
        !text.contains("Modifying...") && !text.contains("Creating..."),
        "the refused apply changed something: {text}"
    );
    std::fs::write(
        &tfvars,
        written.replace("path_token_version         = 2\n", ""),
    )
    .unwrap();
    let text = words(&tf.refused(
        dir,
        "plan",
        &[],
        "terraform.tfvars without the version (the default, 1)",
    ));
    assert!(
        text.contains(refusal),
        "terraform.tfvars without the version (the default, 1) was not refused: {text}"
    );
    std::fs::write(&tfvars, &written).unwrap();
    assert_eq!(output("path_token_version"), "2");
    assert_eq!(
        stored_hash(),
        second,
        "the refused apply stored a new token"
    );
    assert_eq!(live_http()["pathTokenSha256"], second.as_str());
    assert_eq!(registered_hashes(), [second.clone()].into());

    // Releases, as docs/deploy.md's "Upgrade or roll back" runs them: a new zip at the same path
    // with its hash in terraform.tfvars. What the `live` alias serves is read back from moto:
    // its version and that version's code hash.
    let live = || -> (String, String) {
        let text = boto3(
            env,
            "l=boto3.client('lambda'); v=l.get_alias(FunctionName=sys.argv[1], Name='live')['FunctionVersion']; print(v, l.get_function_configuration(FunctionName=sys.argv[1], Qualifier=v)['CodeSha256'])",
            &[&output("function_name")],
        );
        let (version, code) = text.split_once(' ').unwrap();
        (version.to_owned(), code.to_owned())
    };
    // A hash written into terraform.tfvars by hand (the runbook computes it from the zip).
    let set_hash = |hash: &str| {
        let text = std::fs::read_to_string(&tfvars).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("lambda_zip_base64sha256"))
            .unwrap();
        std::fs::write(
            &tfvars,
            text.replace(line, &format!("lambda_zip_base64sha256 = \"{hash}\"")),
        )
        .unwrap();
    };
    let release_runbook = deploy_doc_block("**Upgrade or roll back**");
    // An apply that must fail; its output as one line of words.
    let refused_apply = |what: &str| words(&tf.refused(dir, "apply", &[], what));
    let zip = dir.join("bootstrap.zip");
    let (v1, code) = live();
    assert_eq!(code, hash);

    // Upgrade: zip B at the path, then docs/deploy.md's commands. The alias moves to the
    // version holding B.
    let b = write_zip_with(&zip, &release("B"));
    assert_ne!(b, hash);
    run_doc(&release_runbook, "upgrade.log");
    let (v2, code) = live();
    assert_eq!(code, b, "the upgrade left the alias on other code");
    assert!(v2.parse::<u32>().unwrap() > v1.parse::<u32>().unwrap());

    // A rollback whose zip was not put back: A's hash, B at the path. Refused at plan, before
    // anything is uploaded; the alias stays on B's version.
    set_hash(&hash);
    let text = refused_apply("a zip that is not the hashed one was deployed");
    assert!(
        text.contains(&format!(
            "has the base64 SHA-256 {b}, not lambda_zip_base64sha256 ({hash}): it is not the artefact whose hash was given. Nothing was uploaded"
        )) && !text.contains("Modifying..."),
        "refused for another reason: {text}"
    );
    assert_eq!(
        live(),
        (v2.clone(), b.clone()),
        "the alias moved to unverified code"
    );

    // The rollback done right: zip A back at the path, then the same commands.
    assert_eq!(write_zip(&zip), hash);
    run_doc(&release_runbook, "rollback.log");
    let (v3, code) = live();
    assert_eq!(code, hash, "the rollback left the alias on other code");
    assert!(v3.parse::<u32>().unwrap() > v2.parse::<u32>().unwrap());

    // Releases that fail the pre-traffic check: one that does not start, the real function
    // on a configuration it refuses (the reason reaches the apply's error), one that answers
    // 404 (as a build expecting another path token would). Each is published, invoked once,
    // and the apply stops with the alias where it was.
    let refusing = format!(
        "#!/bin/sh\nPODMUTATOR_CONFIG='{{\"mutators\": {{\"secretz\": {{}}}}}}' exec '{}'\n",
        env!("CARGO_BIN_EXE_podmutator")
    );
    for (body, says) in [
        (
            "#!/bin/sh\nexit 1\n",
            "Runtime exited with error: exit status 1",
        ),
        (
            refusing.as_str(),
            "unknown mutator `secretz`: did you mean `secrets`?",
        ),
        (
            "#!/bin/sh\ncat >/dev/null\nprintf '%s' '{\"statusCode\":404,\"isBase64Encoded\":false,\"body\":\"{\\\"message\\\":\\\"no such path\\\"}\"}'\n",
            "it answered status 404: no such path. The `live` alias was not moved",
        ),
    ] {
        set_hash(&write_zip_with(&zip, body));
        let text = refused_apply("a failing release went live");
        assert!(text.contains(says), "refused for another reason: {text}");
        assert_eq!(
            live(),
            (v3.clone(), hash.clone()),
            "a failing release went live"
        );
    }
    set_hash(&write_zip(&zip));
    tf.apply(dir, &[], None);
    let (v4, code) = live();
    assert_eq!(code, hash);
    assert!(v4.parse::<u32>().unwrap() > v3.parse::<u32>().unwrap());
    tf.plan_is_empty(dir, "after the releases");

    // The S3 route (`lambda_s3_bucket`/`lambda_s3_key`): no file to hash at plan, so the check
    // after the upload is the only one. A release from S3 with its hash goes live; one whose
    // hash is not the object's is uploaded and published, then refused by the code hash
    // postcondition, the alias left where it was.
    let c = write_zip_with(&dir.join("c.zip"), &release("C"));
    let d = write_zip_with(&dir.join("d.zip"), &release("D"));
    boto3(
        env,
        "s3 = boto3.client('s3'); s3.create_bucket(Bucket='pm-releases')\nfor k in sys.argv[1:]: s3.upload_file(k, 'pm-releases', k.rsplit('/', 1)[-1])",
        &[
            dir.join("c.zip").to_str().unwrap(),
            dir.join("d.zip").to_str().unwrap(),
        ],
    );
    let from_s3 = |key: &str, hash: &str| {
        std::fs::write(
            &tfvars,
            format!(
                "lambda_s3_bucket        = \"pm-releases\"\nlambda_s3_key           = \"{key}\"\nlambda_zip_base64sha256 = \"{hash}\"\npath_token_version      = 2\n"
            ),
        )
        .unwrap();
    };
    from_s3("c.zip", &c);
    tf.apply(dir, &[], None);
    let (v5, code) = live();
    assert_eq!(code, c, "the release from S3 is not live");
    assert!(v5.parse::<u32>().unwrap() > v4.parse::<u32>().unwrap());
    from_s3("d.zip", &c);
    let text = refused_apply("an S3 object that is not the hashed one went live");
    assert!(
        text.contains(&format!(
            "The uploaded code's SHA-256 ({d}) is not lambda_zip_base64sha256 ({c})"
        )) && text.contains("The `live` alias was not moved"),
        "refused for another reason: {text}"
    );
    assert_eq!(live(), (v5, c), "the alias moved to unverified code");
}
