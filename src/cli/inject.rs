//! `podmutator inject`: the webhook run offline over manifests, the way `istioctl kube-inject`
//! and `linkerd inject` answer "what will the webhook do to my pod?" without a cluster.
//!
//! Every Pod and pod template is wrapped in the AdmissionReview the API server would send and
//! answered by the same [`App`] `serve` and the Lambda run ([`App::build`]), so what this prints
//! is what the webhook does. Nothing is read from the network unless `--embedded` is given.

use std::path::PathBuf;

use serde_json::{Value, json};

use podmutator_core::app::{App, Deps};
use podmutator_core::config::{Config, ConfigError};
use podmutator_core::mutate::Route;

/// The name the registration gives the entry that serves `route` (`terraform/registration.json`,
/// which `webhook-config`, Terraform and SAM register): what the API server puts in front of a
/// denial, `admission webhook "<name>" denied the request: ...`.
pub fn webhook_name(route: Route) -> &'static str {
    let path = crate::transport::http::ROUTES
        .into_iter()
        .find_map(|(p, r)| (r == route).then_some(p));
    crate::registration::registration()["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| path.is_some_and(|p| w["path"] == p))
        .and_then(|w| w["name"].as_str())
        .unwrap_or("podmutator")
}

/// `podmutator inject`.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Examples:\n  podmutator inject -f deployment.yaml | kubectl apply -f -\n  kubectl get deploy web -o yaml | podmutator inject -f - --diff"
)]
pub struct InjectArgs {
    #[command(flatten)]
    pub config: super::ConfigArgs,
    /// Manifest to read (YAML, `---`-separated documents, or JSON); - reads stdin
    #[arg(short = 'f', long = "filename", value_name = "FILE|-")]
    pub file: PathBuf,
    /// The webhook entry the pods arrive by: secrets, managed-pod, managed-namespace,
    /// image-builder or images
    #[arg(long, value_name = "ROUTE", default_value = "secrets", value_parser = parse_route)]
    pub route: Route,
    /// Namespace of objects that name none
    #[arg(short = 'n', long, value_name = "NAMESPACE", default_value = "default", value_parser = parse_namespace)]
    pub namespace: String,
    /// Print each pod's JSON Patch instead of the manifests
    #[arg(long, conflicts_with = "diff")]
    pub patch: bool,
    /// Print a line diff of each pod before and after instead of the manifests
    #[arg(long)]
    pub diff: bool,
    /// Allow the Embedded secret manager. A dry run, as `kubectl create --dry-run=server`: the
    /// names are resolved with this machine's AWS credentials where the delivery needs it, and
    /// every value is printed as a placeholder, never read
    #[arg(long)]
    pub embedded: bool,
}

/// What `inject` could not do. Denials are reported per object on stderr; this says how many.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not valid JSON")]
    Json {
        path: String,
        source: serde_json::Error,
    },
    #[error("{path}: not valid YAML")]
    Yaml {
        path: String,
        // Boxed: the parser's error is large, and every `Result` here would carry its size.
        source: Box<serde_saphyr::Error>,
    },
    #[error(
        "the configuration enables the Embedded secret manager, which reads AWS Secrets Manager: pass --embedded to plan it as a dry run (values are printed as placeholders, never read; reference delivery resolves names with this machine's AWS credentials), or leave Embedded out of webhook.secretManagerTypes"
    )]
    EmbeddedNotAllowed,
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Runtime(#[from] crate::startup::StartError),
    #[error("{what}: the webhook's patch does not apply")]
    Patch {
        what: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot write the output")]
    Output(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("{denied} of {pods} pods would be refused (the reasons are above)")]
    Denied { denied: usize, pods: usize },
}

fn parse_route(s: &str) -> Result<Route, UnknownRoute> {
    Route::ALL
        .into_iter()
        .find(|r| r.as_str() == s)
        .ok_or_else(|| UnknownRoute(s.to_owned()))
}

/// `-n`: a namespace name, as the API server takes one.
fn parse_namespace(s: &str) -> Result<String, String> {
    use podmutator_core::k8s_names::{DNS_LABEL_RULE, is_dns_label};
    is_dns_label(s)
        .then(|| s.to_owned())
        .ok_or_else(|| format!("{s:?} is not a namespace name: {DNS_LABEL_RULE}"))
}

#[derive(Debug, thiserror::Error)]
#[error(
    "unknown route {0:?}: use secrets, managed-pod, managed-namespace, image-builder or images"
)]
pub struct UnknownRoute(String);

/// The input's syntax; the output uses the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

/// Reads the documents of a manifest: JSON when it starts with `{` or `[`, else YAML.
pub fn parse_documents(text: &str, path: &str) -> Result<(Format, Vec<Value>), InjectError> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // `kubectl get -o json` prints one object; concatenated objects are read too.
        let docs = serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| InjectError::Json {
                path: path.to_owned(),
                source,
            })?;
        return Ok((Format::Json, docs));
    }
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(text).map_err(|source| InjectError::Yaml {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
    // An empty document (`---` at the end) is no object.
    Ok((
        Format::Yaml,
        docs.into_iter().filter(|d| !d.is_null()).collect(),
    ))
}

/// Renders documents in `format`: YAML documents separated by `---`, JSON objects one after
/// another.
pub fn render(format: Format, docs: &[Value]) -> Result<String, InjectError> {
    let texts = docs.iter().map(|doc| match format {
        Format::Yaml => serde_saphyr::to_string(doc).map_err(|e| InjectError::Output(e.into())),
        Format::Json => serde_json::to_string_pretty(doc)
            .map(|text| text + "\n")
            .map_err(|e| InjectError::Output(e.into())),
    });
    let texts = texts.collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join(if format == Format::Yaml { "---\n" } else { "" }))
}

/// Where a workload kind keeps its pod template.
fn template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "ReplicationController"
        | "Job" => Some("/spec/template"),
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// What happened to one pod or template.
#[derive(Debug, Clone, PartialEq)]
// One per pod of a manifest, moved once: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    /// Allowed; the patch may be empty.
    Allowed {
        before: Value,
        after: Value,
        patch: Value,
        /// The review's `warnings` (a skipped optional mutator, a value withheld from the dry
        /// run), which kubectl prints as `Warning: ...`.
        warnings: Vec<String>,
    },
    /// Refused, with the message the API server would show.
    Denied { message: String },
}

/// The webhook, offline.
pub struct Injector {
    app: App,
    route: Route,
    namespace: String,
}

impl Injector {
    pub fn new(app: App, route: Route, namespace: impl Into<String>) -> Self {
        Self {
            app,
            route,
            namespace: namespace.into(),
        }
    }

    /// Runs every pod and template in `doc` (a List's items too) through the webhook, writing
    /// the mutated pods back into `doc`. Other objects are left as they are. Each pod or
    /// template comes back with what the webhook did to it, named `Kind/namespace/name` (for a
    /// template, of the object that holds it: `Deployment/default/web`).
    pub async fn inject(&self, doc: &mut Value) -> Result<Vec<(String, Outcome)>, InjectError> {
        let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
        let namespace = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or(&self.namespace)
            .to_owned();
        let name = doc["metadata"]["name"].as_str().unwrap_or("").to_owned();
        if kind.ends_with("List") {
            let mut out = Vec::new();
            if let Some(items) = doc.get_mut("items").and_then(Value::as_array_mut) {
                for item in items {
                    out.extend(Box::pin(self.inject(item)).await?);
                }
            }
            return Ok(out);
        }
        let what = format!("{kind}/{namespace}/{name}");
        if kind == "Pod" {
            let outcome = self.review(&what, doc.clone(), &namespace).await?;
            if let Outcome::Allowed { after, .. } = &outcome {
                *doc = after.clone();
            }
            return Ok(vec![(what, outcome)]);
        }
        // A template that is not an object is the API server's to refuse; pass it through.
        let Some(template) = template_pointer(&kind)
            .and_then(|pointer| doc.pointer_mut(pointer))
            .filter(|t| t.is_object())
        else {
            return Ok(Vec::new());
        };
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod"});
        if let Some(metadata) = template.get("metadata") {
            pod["metadata"] = metadata.clone();
        }
        pod["spec"] = template["spec"].clone();
        let outcome = self.review(&what, pod, &namespace).await?;
        if let Outcome::Allowed { after, .. } = &outcome {
            // A template holds only metadata and spec.
            for key in ["metadata", "spec"] {
                if let Some(v) = after.get(key).filter(|v| !v.is_null()) {
                    template[key] = v.clone();
                }
            }
        }
        Ok(vec![(what, outcome)])
    }

    /// One CREATE review, as the API server sends it, answered by the app.
    async fn review(
        &self,
        what: &str,
        pod: Value,
        namespace: &str,
    ) -> Result<Outcome, InjectError> {
        let mut review = podmutator_core::admission::create_review(&pod, namespace);
        let request = &mut review["request"];
        request["uid"] = json!("00000000-0000-0000-0000-000000000000");
        request["userInfo"] = json!({"username": "podmutator-inject"});
        request["dryRun"] = json!(true);
        if let Some(name) = pod["metadata"]["name"].as_str() {
            review["request"]["name"] = json!(name);
        }
        let body = serde_json::to_vec(&review).map_err(|e| InjectError::Output(e.into()))?;
        let answer = self.app.review(self.route, &body).await;
        let (patch, warnings) = match answer.outcome {
            podmutator_core::admission::Outcome::Refused { message, .. } => {
                return Ok(Outcome::Denied {
                    message: format!(
                        "admission webhook \"{}\" denied the request: {message}",
                        webhook_name(self.route)
                    ),
                });
            }
            podmutator_core::admission::Outcome::Allowed { patch, warnings } => (patch, warnings),
        };
        let bad = |source: Box<dyn std::error::Error + Send + Sync>| InjectError::Patch {
            what: what.to_owned(),
            source,
        };
        let patch: Value = match &patch {
            None => json!([]),
            Some(p) => serde_json::from_slice(p.as_json()).map_err(|e| bad(e.into()))?,
        };
        let ops: json_patch::Patch =
            serde_json::from_value(patch.clone()).map_err(|e| bad(e.into()))?;
        let mut after = pod.clone();
        json_patch::patch(&mut after, &ops).map_err(|e| bad(e.into()))?;
        Ok(Outcome::Allowed {
            before: pod,
            after,
            patch,
            warnings,
        })
    }
}

/// How long the diff of one pod may search for the shortest edit; past it, a longer but still
/// correct diff is printed. A pod is bounded by etcd's 1.5 MiB, so this is a backstop.
const DIFF_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// `before` and `after` as `diff -u` prints them: `--- <what> (before)`, `+++ <what> (after)`,
/// then hunks of changed lines (`-` removed, `+` added) with three lines of context around
/// each. Nothing when the two are equal.
pub fn unified_diff(before: &str, after: &str, what: &str) -> String {
    similar::TextDiff::configure()
        .timeout(DIFF_TIME)
        .diff_lines(before, after)
        .unified_diff()
        .context_radius(3)
        .header(&format!("{what} (before)"), &format!("{what} (after)"))
        .to_string()
}

/// A unified diff with ANSI colours, for a terminal: removals red, additions green, hunk heads
/// cyan, file heads bold.
pub fn coloured(diff: &str) -> String {
    let mut out = String::with_capacity(diff.len() + diff.len() / 4);
    for line in diff.split_inclusive('\n') {
        let colour = if line.starts_with("---") || line.starts_with("+++") {
            "\x1b[1m"
        } else if line.starts_with("@@") {
            "\x1b[36m"
        } else if line.starts_with('-') {
            "\x1b[31m"
        } else if line.starts_with('+') {
            "\x1b[32m"
        } else {
            out.push_str(line);
            continue;
        };
        let text = line.strip_suffix('\n').unwrap_or(line);
        out.push_str(&format!("{colour}{text}\x1b[0m{}", &line[text.len()..]));
    }
    out
}

/// What `inject` prints and what it reports on stderr.
#[derive(Debug, Default)]
pub struct Output {
    pub stdout: String,
    /// One API-server-style refusal per denied pod.
    pub denials: Vec<String>,
    /// The webhook's warnings, as kubectl prints them (`Warning: ...`), each naming its object.
    pub warnings: Vec<String>,
    pub pods: usize,
    /// The pods the webhook would change (a non-empty patch).
    pub changed: usize,
}

impl Output {
    /// What to say on stderr when the webhook would change nothing: an input with no pod (a
    /// wrong file is otherwise echoed back as if it had been injected), or pods it leaves alone.
    pub fn nothing_to_mutate(&self, path: &str, route: Route) -> Option<String> {
        if self.pods == 0 {
            return Some(format!(
                "podmutator: inject: {path} holds no Pod or pod template (Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job, CronJob, or a List of them): nothing to mutate"
            ));
        }
        (self.changed == 0 && self.denials.is_empty()).then(|| {
            let hint = if route == Route::Secrets {
                " (the secrets route mutates pods labelled inject-flyte-secrets: \"true\" with flyte.secrets/s<N> annotations)"
            } else {
                ""
            };
            format!(
                "podmutator: inject: the webhook changes none of the {} pods in {path}{hint}",
                self.pods
            )
        })
    }
}

/// Runs `args` over `text` with `app`; pure but for the app.
pub async fn inject_text(
    app: App,
    args: &InjectArgs,
    text: &str,
    path: &str,
) -> Result<Output, InjectError> {
    let (format, mut docs) = parse_documents(text, path)?;
    let injector = Injector::new(app, args.route, args.namespace.clone());
    let mut out = Output::default();
    let mut sections = Vec::new();
    for doc in &mut docs {
        for (what, outcome) in injector.inject(doc).await? {
            out.pods += 1;
            match outcome {
                Outcome::Denied { message } => out.denials.push(format!("{what}: {message}")),
                Outcome::Allowed {
                    before,
                    after,
                    patch,
                    warnings,
                } => {
                    if patch.as_array().is_some_and(|ops| !ops.is_empty()) {
                        out.changed += 1;
                    }
                    for w in warnings {
                        out.warnings.push(format!("Warning: {what}: {w}"));
                    }
                    if args.patch {
                        sections.push(json!({"object": what, "patch": patch}));
                    } else if args.diff {
                        let before = render(format, std::slice::from_ref(&before))?;
                        let after = render(format, std::slice::from_ref(&after))?;
                        out.stdout.push_str(&unified_diff(&before, &after, &what));
                    }
                }
            }
        }
    }
    if args.patch {
        out.stdout = render(format, &sections)?;
    } else if !args.diff {
        out.stdout = render(format, &docs)?;
    }
    Ok(out)
}

/// `podmutator inject`: reads the manifest, prints the result, reports denials on stderr.
pub fn run(config: &Config, args: &InjectArgs) -> Result<(), InjectError> {
    let path = args.file.display().to_string();
    let text = if path == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(&args.file)
    }
    .map_err(|source| InjectError::Read {
        path: path.clone(),
        source,
    })?;
    // What would read from the cloud with the operator's credentials: asked for, not assumed.
    let reads = config.embedded_reads();
    if (reads.values || reads.names) && !args.embedded {
        return Err(InjectError::EmbeddedNotAllowed);
    }
    let mut out = crate::startup::runtime(false)?.block_on(async {
        let mut deps = Deps::offline();
        // The reader is the operator, at their own terminal: AWS's own words for a failure.
        deps.errors_in_replies = true;
        let region = podmutator_aws::wiring::region(config);
        let aws = podmutator_aws::secretsmanager::SharedAws::new(region);
        let deps = podmutator_aws::wiring::deps(config, &aws, deps)?;
        let app = App::build(config, deps);
        inject_text(app, args, &text, &path).await
    })?;
    use std::io::IsTerminal;
    let colour = args.diff
        && std::io::stdout().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    if colour {
        out.stdout = coloured(&out.stdout);
    }
    print!("{}", out.stdout);
    for w in &out.warnings {
        eprintln!("{w}");
    }
    if let Some(note) = out.nothing_to_mutate(&path, args.route) {
        eprintln!("{note}");
    }
    for d in &out.denials {
        eprintln!("{d}");
    }
    if out.denials.is_empty() {
        Ok(())
    } else {
        Err(InjectError::Denied {
            denied: out.denials.len(),
            pods: out.pods,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_is_hunks_with_three_lines_of_context() {
        let before: String = (0..20).map(|i| format!("l{i}\n")).collect();
        let after = before.replace("l10\n", "l10\nnew\n");
        let d = unified_diff(&before, &after, "Pod/ns/p");
        assert_eq!(
            d,
            "--- Pod/ns/p (before)\n+++ Pod/ns/p (after)\n@@ -9,6 +9,7 @@\n l8\n l9\n l10\n+new\n l11\n l12\n l13\n"
        );
        assert_eq!(unified_diff("a\n", "a\n", "x"), "", "no change, no hunk");
    }

    #[test]
    fn colour_marks_each_kind_of_line_and_keeps_the_text() {
        let d = "--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n z\n";
        let c = coloured(d);
        assert!(
            c.contains("\x1b[31m-x\x1b[0m\n") && c.contains("\x1b[32m+y\x1b[0m\n"),
            "{c:?}"
        );
        assert!(c.contains("\x1b[36m@@ -1 +1 @@\x1b[0m"), "{c:?}");
        assert!(c.ends_with(" z\n"));
        let plain: String = c
            .replace("\x1b[0m", "")
            .replace("\x1b[1m", "")
            .replace("\x1b[31m", "")
            .replace("\x1b[32m", "")
            .replace("\x1b[36m", "");
        assert_eq!(plain, d);
    }

    #[test]
    fn ten_thousand_changed_lines_diff_in_bounded_time() {
        let before: String = (0..10_000).map(|i| format!("a{i}\n")).collect();
        let after: String = (0..10_000).map(|i| format!("b{i}\n")).collect();
        let d = unified_diff(&before, &after, "x");
        assert_eq!(d.lines().filter(|l| l.starts_with("-a")).count(), 10_000);
        assert_eq!(d.lines().filter(|l| l.starts_with("+b")).count(), 10_000);
    }

    #[test]
    fn routes_are_named_as_on_the_command_line() {
        assert_eq!(parse_route("managed-pod").unwrap(), Route::ManagedPod);
        let err = parse_route("mesh").unwrap_err().to_string();
        assert!(
            err.contains("secrets, managed-pod, managed-namespace, image-builder or images"),
            "{err}"
        );
        assert_eq!(parse_route("image-builder").unwrap(), Route::ImageBuilder);
        assert_eq!(parse_route("images").unwrap(), Route::Images);
    }

    #[test]
    fn json_and_yaml_streams_are_split_into_documents() {
        let (f, docs) = parse_documents("{\"a\": 1}\n{\"b\": 2}", "x").unwrap();
        assert_eq!((f, docs.len()), (Format::Json, 2));
        let (f, docs) = parse_documents("a: 1\n---\nb: 2\n---\n", "x").unwrap();
        assert_eq!(
            (f, docs),
            (Format::Yaml, vec![json!({"a": 1}), json!({"b": 2})])
        );
        let err = parse_documents("{", "in.json").unwrap_err().to_string();
        assert!(err.contains("in.json"), "{err}");
        let err = parse_documents("a: [1\n", "in.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("in.yaml: not valid YAML"), "{err}");
    }

    #[tokio::test]
    async fn odd_shapes_pass_through_untouched() {
        let app = App::build(&Config::default(), Deps::offline());
        let injector = Injector::new(app, Route::Secrets, "default");
        for doc in [
            json!("a scalar"),
            json!([1, 2]),
            json!({"kind": "Deployment", "spec": {"template": "not an object"}}),
            json!({"kind": "CronJob", "spec": {}}),
            json!({"kind": "List", "items": "not a list"}),
        ] {
            let mut out = doc.clone();
            let injected = injector.inject(&mut out).await.expect("no error");
            assert!(injected.is_empty(), "{doc}: {injected:?}");
            assert_eq!(out, doc);
        }
    }
}
