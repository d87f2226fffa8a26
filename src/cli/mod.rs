//! Command line: `podmutator [serve|certs|lambda|check-config|webhook-config|secret-annotations|inject|version|completion]`.
//! Without a subcommand the binary runs the Lambda runtime when `AWS_LAMBDA_RUNTIME_API` is set
//! (it is the Lambda bootstrap) and prints its help otherwise.

use std::io::Write as _;
#[cfg(feature = "serve")]
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::app::{App, Deps};
use crate::config::{
    Config, ConfigError, ENV_CONFIG_FILE, ENV_CONFIG_INLINE, ENV_FLYTE_CONFIG_FILE, Loaded,
};
use crate::secrets::source::SecretSource;
use crate::transport::http::Front;
use crate::transport::lambda;
#[cfg(feature = "serve")]
use crate::transport::{probe, server, tls};

#[cfg(feature = "serve")]
pub mod certs;
#[cfg(feature = "tools")]
pub mod inject;

/// The environment variable the Lambda runtime sets; its presence makes `lambda` the default.
pub const ENV_LAMBDA_RUNTIME_API: &str = "AWS_LAMBDA_RUNTIME_API";

const AFTER_HELP: &str = "\
Environment (besides each option's own):
  AWS_LAMBDA_RUNTIME_API   set by Lambda: makes `lambda` the default command (without it and
                           without a command, this help is printed)
  RUST_LOG                 log filter (default: info, else AWS_LAMBDA_LOG_LEVEL); logs are JSON lines on stdout";

/// podmutator: Kubernetes pod-mutating admission webhook (AWS Lambda or HTTPS).
#[derive(Debug, Parser)]
#[command(name = "podmutator", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Which of the configuration's sources came from their variables rather than their
    /// options, so that errors name what the user set ([`Cli::from_env`]).
    #[arg(skip)]
    pub from_env: FromEnv,
}

/// Which configuration sources came from the environment ([`Cli::from_env`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FromEnv {
    pub flyte: bool,
    pub file: bool,
    pub inline: bool,
}

/// Where the configuration comes from, for the commands that read one. Accepted before the
/// command too (`podmutator --config c.yaml serve`); after it wins.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ConfigArgs {
    /// A whole Flyte (flytepropeller) configuration, as Flyte's Helm charts render it (a file, or
    /// a directory of them such as the mounted ConfigMap): its `webhook` and `secrets` sections
    /// are used, Flyte's other sections skipped
    #[arg(long, value_name = "FILE", env = ENV_FLYTE_CONFIG_FILE)]
    pub flyte_config: Option<PathBuf>,
    /// Configuration file (JSON or YAML), merged over --flyte-config
    #[arg(long, value_name = "FILE", env = ENV_CONFIG_FILE)]
    pub config: Option<PathBuf>,
    /// Inline configuration (JSON), merged over the file
    #[arg(long, value_name = "JSON", env = ENV_CONFIG_INLINE, hide_env_values = true)]
    pub config_json: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve HTTPS on webhook.listenPort (the default outside Lambda)
    #[cfg(feature = "serve")]
    Serve {
        #[command(flatten)]
        config: ConfigArgs,
        /// Namespace of the Service named in the generated certificate
        #[arg(
            long,
            value_name = "NAMESPACE",
            env = "POD_NAMESPACE",
            default_value = "default"
        )]
        pod_namespace: String,
    },
    /// In the cluster (a Job, then a CronJob): create or rotate the CA and the serving
    /// certificate Secrets through the Kubernetes API, and put the CA into every webhook's caBundle
    #[cfg(feature = "serve")]
    Certs(Box<certs::CertsArgs>),
    /// Run the AWS Lambda runtime loop (the default when AWS_LAMBDA_RUNTIME_API is set)
    Lambda {
        #[command(flatten)]
        config: ConfigArgs,
    },
    /// Run every start-up check `serve` and `lambda` run, print the effective configuration as
    /// JSON (path token redacted, warnings on stderr), and exit
    CheckConfig {
        #[command(flatten)]
        config: ConfigArgs,
        /// Print only what differs from the defaults, as one line of JSON (what to ship as the
        /// function's PODMUTATOR_CONFIG), and on stderr what was read, skipped and unused
        #[arg(long)]
        changed: bool,
    },
    /// Print the MutatingWebhookConfiguration for a deployed endpoint as YAML
    #[cfg(feature = "tools")]
    WebhookConfig(Box<crate::registration::WebhookConfigArgs>),
    /// Print the flyte.secrets/s<N> annotations for a JSON array of secrets, or decode them
    #[command(after_help = SECRET_ANNOTATIONS_HELP)]
    SecretAnnotations {
        /// Read an annotation map (JSON object) back into secrets
        #[arg(long)]
        decode: bool,
        /// A JSON array of secrets, or with --decode a JSON object of annotations
        #[arg(value_name = "JSON")]
        json: String,
    },
    /// Run the webhook offline over manifests and print what it would do to each pod
    #[cfg(feature = "tools")]
    Inject(inject::InjectArgs),
    /// Print the version, the commit and which build this is (full, or the Lambda build)
    Version,
    /// Print a shell's completion script: `source <(podmutator completion bash)`
    #[cfg(feature = "tools")]
    Completion {
        /// bash, zsh, fish, elvish or powershell
        shell: clap_complete::Shell,
    },
    /// Print the configuration's JSON Schema, for an editor's completion and checks
    #[cfg(feature = "tools")]
    ConfigSchema,
    /// In a pod (reference delivery): fetch the secrets of $PODMUTATOR_FETCH_PLAN into files
    Fetch,
    /// In a pod (reference delivery): set the variables of $PODMUTATOR_EXEC_ENV from their
    /// files, then replace this process with COMMAND
    Exec {
        /// The container's original command and arguments
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            required = true,
            value_name = "COMMAND"
        )]
        command: Vec<std::ffi::OsString>,
    },
}

const SECRET_ANNOTATIONS_HELP: &str = "\
Example:
  podmutator secret-annotations '[{\"group\": \"db\", \"key\": \"password\", \"mount_requirement\": \"FILE\"}]'
Fields: group, group_version, key, mount_requirement (ANY | ENV_VAR | FILE), env_var";

/// Why the program stopped; `main` prints it with its sources and exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("invalid configuration: {flag}: cannot read {}", path.display())]
    ReadConfig {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration: http.pathTokenSecretId: cannot read the path token {id}")]
    ReadPathToken {
        id: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("invalid configuration: http.pathTokenSecretId: secret {id} has no string value")]
    PathTokenNotText { id: String },
    #[error("failed to start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error(
        "podmutator serve will not write Embedded secret values into its replies (embedded.delivery: value, or envVarDelivery: value) to callers it cannot authenticate: any pod that reaches its port can send a review, and the path token is no secret from whoever creates pods (the API server quotes it in its errors). Set embedded.delivery: reference with envVarDelivery: exec, which serves names only; or, where the API server can present a client certificate (its admission configuration's kubeconfig: a self-managed control plane; EKS cannot), set http.clientCaFile to the CA that signs it (docs/deploy.md, \"Embedded values in the cluster\")"
    )]
    ValuesToUnauthenticated,
    #[error("lambda runtime stopped")]
    Lambda(#[source] lambda_http::Error),
    #[error(
        "cannot run the Lambda runtime here: {0} (Lambda sets these; outside Lambda, run `podmutator serve`)"
    )]
    LambdaEnv(String),
    #[cfg(feature = "serve")]
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[cfg(feature = "serve")]
    #[error(transparent)]
    Server(#[from] server::ServerError),
    #[cfg(feature = "serve")]
    #[error(transparent)]
    Certs(#[from] certs::CertsError),
    #[cfg(feature = "tools")]
    #[error(transparent)]
    WebhookConfig(#[from] crate::registration::ArgError),
    #[error(transparent)]
    SecretAnnotations(#[from] AnnotationsError),
    #[cfg(feature = "tools")]
    #[error(transparent)]
    Inject(#[from] inject::InjectError),
    #[error("cannot write the output")]
    Output(#[source] serde_json::Error),
    #[error("fetch failed")]
    Fetch(#[source] crate::pod::fetch::FetchError),
    #[error("exec failed")]
    Exec(#[source] crate::pod::exec::ExecError),
}

impl CliError {
    /// The message with every source after it, `: `-separated, as `main` prints it.
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            let s = e.to_string();
            // `transparent` variants hand their own message up; don't print it twice.
            if !out.ends_with(&s) {
                out.push_str(": ");
                out.push_str(&s);
            }
            next = e.source();
        }
        out
    }
}

impl Cli {
    /// The process's command line (`--help`, `--version` and usage errors answer and exit
    /// here), noting which configuration sources came from their variables.
    pub fn from_env() -> Self {
        use clap::{CommandFactory, FromArgMatches, parser::ValueSource};
        let matches = Self::command().get_matches();
        let mut cli = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        // The value after the command wins, as in [`Cli::command_or_default`]. Only a command
        // that has the option may be asked for it.
        let from_env = |id: &str| {
            let of = |m: &clap::ArgMatches| {
                m.ids()
                    .any(|i| i.as_str() == id)
                    .then(|| m.value_source(id))
                    .flatten()
            };
            matches
                .subcommand()
                .and_then(|(_, sub)| of(sub))
                .or_else(|| of(&matches))
                == Some(ValueSource::EnvVariable)
        };
        cli.from_env = FromEnv {
            flyte: from_env("flyte_config"),
            file: from_env("config"),
            inline: from_env("config_json"),
        };
        cli
    }

    /// The command to run (the one given, else `lambda`) and where its configuration comes from.
    /// [`run`] prints the help instead when there is no command outside Lambda.
    pub fn command_or_default(self) -> (Command, Source) {
        let command = self.command.unwrap_or(Command::Lambda {
            config: ConfigArgs::default(),
        });
        let after = match &command {
            #[cfg(feature = "serve")]
            Command::Serve { config, .. } => Some(config),
            Command::Lambda { config } | Command::CheckConfig { config, .. } => Some(config),
            #[cfg(feature = "tools")]
            Command::Inject(args) => Some(&args.config),
            #[cfg(feature = "tools")]
            Command::WebhookConfig(_) => None,
            #[cfg(feature = "serve")]
            Command::Certs(_) => None,
            #[cfg(feature = "tools")]
            Command::Completion { .. } | Command::ConfigSchema => None,
            Command::SecretAnnotations { .. }
            | Command::Fetch
            | Command::Exec { .. }
            | Command::Version => None,
        };
        let source = Source {
            flyte: after
                .and_then(|c| c.flyte_config.clone())
                .or(self.config.flyte_config),
            file: after.and_then(|c| c.config.clone()).or(self.config.config),
            inline: after
                .and_then(|c| c.config_json.clone())
                .or(self.config.config_json),
            from_env: self.from_env,
        };
        (command, source)
    }
}

/// Where the configuration comes from (`--flyte-config`, `--config`, `--config-json` or their
/// variables), merged in that order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    pub flyte: Option<PathBuf>,
    pub file: Option<PathBuf>,
    pub inline: Option<String>,
    /// Which of them came from their variables: their errors name the variable.
    pub from_env: FromEnv,
}

impl Source {
    pub fn load(&self) -> Result<Loaded, CliError> {
        let name = |env: bool, var: &'static str, flag: &'static str| if env { var } else { flag };
        let flyte = match self.flyte.as_deref() {
            Some(path) => flyte_files(
                path,
                name(self.from_env.flyte, ENV_FLYTE_CONFIG_FILE, "--flyte-config"),
            )?,
            None => Vec::new(),
        };
        let flyte: Vec<(&str, &str)> = flyte
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        let file = read_file(
            self.file.as_deref(),
            name(self.from_env.file, ENV_CONFIG_FILE, "--config"),
        )?;
        let inline = name(self.from_env.inline, ENV_CONFIG_INLINE, "--config-json");
        Ok(Config::load_with_flyte(
            &flyte,
            pair(&file),
            self.inline.as_deref().map(|t| (inline, t)),
        )?)
    }
}

/// `--flyte-config`: one file, or a directory such as Flyte's mounted ConfigMap, whose
/// `*.yaml`, `*.yml` and `*.json` files are read in name order, as Flyte reads
/// `--config /etc/flyte/config/*.yaml`.
fn flyte_files(
    path: &std::path::Path,
    flag: &'static str,
) -> Result<Vec<(String, String)>, CliError> {
    if !path.is_dir() {
        return Ok(read_file(Some(path), flag)?.into_iter().collect());
    }
    let unreadable = |source| CliError::ReadConfig {
        flag,
        path: path.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(unreadable)? {
        let p = entry.map_err(unreadable)?.path();
        let ext = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
        // A mounted ConfigMap's files are links into `..data/`; `is_file` follows them.
        if matches!(ext, "yaml" | "yml" | "json") && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        out.extend(read_file(Some(&f), flag)?);
    }
    Ok(out)
}

fn pair(f: &Option<(String, String)>) -> Option<(&str, &str)> {
    f.as_ref().map(|(p, t)| (p.as_str(), t.as_str()))
}

/// The file's path (as shown in errors) and text.
fn read_file(
    path: Option<&std::path::Path>,
    flag: &'static str,
) -> Result<Option<(String, String)>, CliError> {
    let Some(path) = path else { return Ok(None) };
    let text = crate::config::read_file(path).map_err(|source| CliError::ReadConfig {
        flag,
        path: path.to_owned(),
        source,
    })?;
    Ok(Some((path.display().to_string(), text)))
}

/// The warnings as log lines (`serve`, `lambda`: the log is where an operator looks).
fn log_warnings(loaded: &Loaded) {
    for w in &loaded.warnings {
        tracing::warn!(warning = %w, "configuration");
    }
}

/// The warnings on stderr (`check-config`, `inject`: stdout is the answer).
fn print_warnings(loaded: &Loaded) {
    for w in &loaded.warnings {
        eprintln!("podmutator: warning: configuration: {w}");
    }
}

/// JSON log lines on stdout; the filter comes from `RUST_LOG`, else `AWS_LAMBDA_LOG_LEVEL`. A
/// filter that is not valid (a misspelt level, an empty value) is named in one line on stderr
/// and `info` is used: a typo must not silence the log.
pub fn init_logging() {
    use tracing_subscriber::util::SubscriberInitExt;
    let (var, spec) = match std::env::var("RUST_LOG") {
        Ok(spec) => ("RUST_LOG", spec),
        Err(_) => match std::env::var("AWS_LAMBDA_LOG_LEVEL") {
            Ok(spec) => ("AWS_LAMBDA_LOG_LEVEL", spec),
            Err(_) => ("", "info".to_owned()),
        },
    };
    let filter = log_filter(&spec).unwrap_or_else(|e| {
        eprintln!("podmutator: {var}={spec:?} is not a valid log filter: {e}; logging at info");
        log_filter("info").expect("a level is a filter")
    });
    if let Some(hidden) = hides_the_start_line(&filter) {
        eprintln!("podmutator: {var}={spec:?} {hidden}");
    }
    let _ = json_subscriber(std::io::stdout, filter).try_init();
}

/// `serve`'s and `lambda`'s start line: an INFO line like every other (`timestamp`, `level`,
/// `message`, then `fields`), written here rather than through `tracing`, whose field values
/// are text, so that `mutators` is a JSON array. The log filter decides as for any INFO line
/// of this module.
fn start_line(message: &str, fields: serde_json::Value) {
    use tracing_subscriber::fmt::{format::Writer, time::FormatTime};
    if !tracing::enabled!(tracing::Level::INFO) {
        return;
    }
    let mut timestamp = String::new();
    let _ = tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut timestamp));
    let mut line = serde_json::Map::new();
    line.insert("timestamp".into(), timestamp.into());
    line.insert("level".into(), "INFO".into());
    line.insert("message".into(), message.into());
    if let serde_json::Value::Object(fields) = fields {
        line.extend(fields);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", serde_json::Value::Object(line));
}

/// The target of `serve`'s and `lambda`'s start lines (and every line of this module).
const START_LINE_TARGET: &str = module_path!();

/// What a valid filter that hides the start line hides, for the note `init_logging` prints on
/// stderr (the filter is still used: an operator may want warnings only).
fn hides_the_start_line(filter: &tracing_subscriber::filter::Targets) -> Option<&'static str> {
    use tracing::Level;
    if filter.would_enable(START_LINE_TARGET, &Level::INFO) {
        return None;
    }
    Some(if filter.would_enable(START_LINE_TARGET, &Level::WARN) {
        "hides podmutator's INFO lines: the start line and each admission's audit line; warnings and errors are still logged"
    } else {
        "hides every line of podmutator's own, the start line and its errors among them: add podmutator=info to see them"
    })
}

/// The log subscriber: one flat JSON object per event, written to `writer`, behind `filter`.
/// The admission bench builds its logged case with this too.
pub fn json_subscriber<W>(
    writer: W,
    filter: tracing_subscriber::filter::Targets,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::layer::SubscriberExt;
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_target(false)
        .with_writer(writer)
        // The builder's own level (INFO unless set) would hide what the filter lets through.
        .with_max_level(tracing::Level::TRACE)
        .finish()
        .with(filter)
}

/// The log filter: a level (`debug`), or `target=level` directives separated by commas
/// (`info,podmutator::secrets=trace`), as `RUST_LOG` takes them without span or field filters.
/// Lambda's own levels are accepted as they come (`DEBUG`), and its `FATAL` means `error`.
/// A `Targets` filter rather than `EnvFilter`: the latter's regex engine is a quarter of a
/// megabyte of the Lambda zip, for directives a webhook's logs never need.
///
/// Stricter than `RUST_LOG` elsewhere: a directive without `=` must be a level, because a bare
/// word is a target at TRACE there, so a misspelt level (`inof`) would turn every other line
/// off. Whatever the filter says, [`LOG_CAPS`] hold.
pub fn log_filter(spec: &str) -> Result<tracing_subscriber::filter::Targets, String> {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    let spec = spec.trim();
    let spec = if spec.eq_ignore_ascii_case("fatal") {
        "error"
    } else {
        spec
    };
    let directives: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    if directives.is_empty() {
        return Err("it is empty: give a level (error, warn, info, debug, trace, off) or target=level directives".into());
    }
    for d in &directives {
        if d.contains(['[', '{']) {
            return Err(format!(
                "{d:?}: span and field filters ([span], {{field}}) are not supported: give target=level directives, e.g. podmutator=debug"
            ));
        }
        if !d.contains('=') && d.parse::<LevelFilter>().is_err() {
            return Err(format!(
                "{d:?} is not a level (error, warn, info, debug, trace, off); a target needs one: {d}=debug"
            ));
        }
        d.parse::<Targets>().map_err(|e| format!("{d:?}: {e}"))?;
    }
    let asked: Targets = directives.join(",").parse().map_err(|e| format!("{e}"))?;
    Ok(capped(&asked))
}

/// Targets (by prefix, as the filter matches them) whose verbose lines carry whole requests
/// or events, and the most each may log whatever the filter asks:
/// - `lambda_`: `lambda_runtime` logs every raw event at TRACE, so the request path, path
///   token included; `hyper` and `h2`: the request heads and frames of `serve`. INFO.
/// - `aws_`: the SDK logs each request, response and signing input at TRACE (the bodies too
///   with `LOG_SENSITIVE_BODIES`, a path token read from Secrets Manager among them). DEBUG,
///   which keeps its retry and credential decisions.
pub const LOG_CAPS: [(&str, tracing_subscriber::filter::LevelFilter); 4] = {
    use tracing_subscriber::filter::LevelFilter;
    [
        ("lambda_", LevelFilter::INFO),
        ("hyper", LevelFilter::INFO),
        ("h2", LevelFilter::INFO),
        ("aws_", LevelFilter::DEBUG),
    ]
};

/// `asked` with [`LOG_CAPS`] applied: each directive under a capped prefix lowered to the cap,
/// and a directive for each prefix at what `asked` gives it, capped. A target under a prefix
/// then matches a capped directive whichever is most specific.
fn capped(asked: &tracing_subscriber::filter::Targets) -> tracing_subscriber::filter::Targets {
    use tracing::Level;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    let cap_of = |target: &str| {
        LOG_CAPS
            .iter()
            .filter(|(prefix, _)| target.starts_with(prefix))
            .map(|(_, cap)| *cap)
            .min()
    };
    let mut out = Targets::new();
    if let Some(level) = asked.default_level() {
        out = out.with_default(level);
    }
    for (target, level) in asked.iter() {
        let level = cap_of(target).map_or(level, |cap| level.min(cap));
        out = out.with_target(target, level);
    }
    for (prefix, cap) in LOG_CAPS {
        if asked.iter().any(|(target, _)| target == prefix) {
            continue;
        }
        let level = [
            Level::TRACE,
            Level::DEBUG,
            Level::INFO,
            Level::WARN,
            Level::ERROR,
        ]
        .into_iter()
        .find(|l| asked.would_enable(prefix, l))
        .map_or(LevelFilter::OFF, LevelFilter::from_level);
        out = out.with_target(prefix, level.min(cap));
    }
    out
}

/// Runs the parsed command line; the `Err` is printed by `main` and exits non-zero.
pub fn run(cli: Cli) -> Result<(), CliError> {
    let in_lambda = std::env::var_os(ENV_LAMBDA_RUNTIME_API).is_some();
    if cli.command.is_none() && !in_lambda {
        // Outside Lambda, no command is a person asking what this is.
        use clap::CommandFactory;
        let _ = Cli::command().print_help();
        return Ok(());
    }
    let (command, source) = cli.command_or_default();
    match command {
        Command::Version => {
            println!("{}", version_text());
            Ok(())
        }
        #[cfg(feature = "tools")]
        Command::Completion { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "podmutator", &mut script);
            // A closed pipe (`| head`) is the reader's choice, not an error worth a panic.
            let _ = std::io::stdout().lock().write_all(&script);
            Ok(())
        }
        #[cfg(feature = "tools")]
        Command::ConfigSchema => {
            let text = serde_json::to_string_pretty(&crate::config::json_schema())
                .map_err(CliError::Output)?;
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            Ok(())
        }
        // The pod side: its whole input is one environment variable each.
        Command::Fetch => {
            let summary = crate::pod::fetch::run_fetch().map_err(CliError::Fetch)?;
            eprintln!(
                "podmutator: fetched {} secrets into {} files in {} BatchGetSecretValue calls",
                summary.secrets, summary.files, summary.calls
            );
            match summary.copied {
                Some(c) if c.wrapper => eprintln!(
                    "podmutator: copied the exec wrapper ({}, {} bytes)",
                    crate::pod::fetch::EXEC_WRAPPER,
                    c.bytes
                ),
                // Works (this binary answers `exec`), at many times the wrapper's size in the
                // pod's memory: say so, so that an image built without the wrapper is noticed.
                Some(c) => eprintln!(
                    "podmutator: copied this whole executable for exec ({} bytes): the image has no {} beside it, the small wrapper the Dockerfile installs",
                    c.bytes,
                    crate::pod::fetch::EXEC_WRAPPER
                ),
                None => {}
            }
            Ok(())
        }
        Command::Exec { command } => match crate::pod::exec::run_exec(command) {
            Err(e) => Err(CliError::Exec(e)),
        },
        // These need no configuration, no runtime and print only their answer.
        #[cfg(feature = "tools")]
        Command::WebhookConfig(args) => {
            print!("{}", crate::registration::webhook_config_command(*args)?);
            Ok(())
        }
        // Talks to the Kubernetes API only; no configuration. Its lines go to stderr, as the
        // pod side's do: a Job's log.
        #[cfg(feature = "serve")]
        Command::Certs(args) => {
            let outcome = runtime(false)?.block_on(certs::run(&args))?;
            for line in &outcome.lines {
                eprintln!("podmutator certs: {line}");
            }
            eprintln!("podmutator certs: done, {} objects written", outcome.writes);
            Ok(())
        }
        Command::SecretAnnotations { decode, json } => {
            println!("{}", secret_annotations(decode, &json)?);
            Ok(())
        }
        #[cfg(feature = "tools")]
        Command::Inject(args) => {
            let loaded = source.load()?;
            print_warnings(&loaded);
            inject::run(&loaded.config, &args)?;
            Ok(())
        }
        Command::CheckConfig { changed, .. } => {
            // No log subscriber: stdout is one JSON document, and warnings go to stderr.
            let loaded = source.load()?;
            print_warnings(&loaded);
            runtime(false)?.block_on(start(&loaded.config, TokenRead::Skip, true))?;
            let minimal = changed_from_defaults(&loaded.config)?;
            let text = if changed {
                eprint!("{}", summary(&loaded));
                minimal.to_string()
            } else {
                serde_json::to_string_pretty(&effective(&loaded.config)?)
                    .map_err(CliError::Output)?
            };
            if let Some(w) = lambda_environment_warning(&minimal.to_string(), changed) {
                eprintln!("podmutator: warning: {w}");
            }
            let mut out = std::io::stdout().lock();
            // A closed pipe (`| head`) is the reader's choice, not an error worth a panic.
            let _ = writeln!(out, "{text}");
            Ok(())
        }
        Command::Lambda { .. } => {
            init_logging();
            lambda::check_runtime_env(|k| std::env::var(k).ok()).map_err(CliError::LambdaEnv)?;
            let loaded = source.load()?;
            log_warnings(&loaded);
            let config = loaded.config;
            runtime(false)?.block_on(async {
                let front = Arc::new(build_front(&config, Transport::Lambda).await?);
                start_line(
                    "lambda runtime starting",
                    serde_json::json!({
                        "version": crate::VERSION,
                        "mutators": front.app().chain().ids(),
                    }),
                );
                lambda::run(front).await.map_err(CliError::Lambda)
            })
        }
        #[cfg(feature = "serve")]
        Command::Serve { pod_namespace, .. } => {
            init_logging();
            let loaded = source.load()?;
            log_warnings(&loaded);
            serve(&loaded.config, &pod_namespace)
        }
    }
}

/// `podmutator version`: the release, the commit it was built from (`build.rs`), and which build
/// this is: the full one (`serve` and the operator's tools) or the Lambda build without them.
pub fn version_text() -> String {
    let build = if cfg!(all(feature = "serve", feature = "tools")) {
        "full (serve and the operator's tools)"
    } else if cfg!(any(feature = "serve", feature = "tools")) {
        "partial (not every default feature)"
    } else {
        "Lambda (the runtime loop, check-config and the pod side; no serve, inject or webhook-config)"
    };
    format!(
        "podmutator {}\ncommit: {}\nbuild: {build}",
        crate::VERSION,
        env!("PODMUTATOR_COMMIT")
    )
}

/// The configuration as `check-config` prints it: what the process will actually use. Unset
/// options are left out rather than printed as `null`; the managers are the ones tried (after
/// Global, which is always first), and each fetcher's image and resources are filled in with
/// their defaults. `http.pathToken` is redacted. The document loads back as the same
/// configuration.
pub fn effective(config: &Config) -> Result<serde_json::Value, CliError> {
    use crate::config::{
        AWS_SIDECAR_IMAGE, AZURE_SIDECAR_IMAGE, GCP_SIDECAR_IMAGE, SecretManagerType,
    };
    let mut c = config.clone();
    let w = &mut c.webhook;
    w.secret_manager_types = w
        .enabled_secret_managers()
        .into_iter()
        .filter(|t| *t != SecretManagerType::Global)
        .collect();
    w.secret_manager_type = None;
    for (sidecar, image) in [
        (&mut w.aws_secret_manager, AWS_SIDECAR_IMAGE),
        (&mut w.gcp_secret_manager, GCP_SIDECAR_IMAGE),
        (&mut w.azure_secret_manager, AZURE_SIDECAR_IMAGE),
    ] {
        sidecar.sidecar_image = Some(sidecar.image_or(image));
        sidecar.resources = Some(sidecar.resources_or_default());
    }
    w.local_cert = Some(w.local_cert.unwrap_or(true));
    let mut v = redacted(&c)?;
    let defaults = serde_json::to_value(Config::default()).map_err(CliError::Output)?;
    drop_unset(&mut v, Some(&defaults));
    Ok(v)
}

/// The effective configuration less every value equal to its default: what a deployment must
/// set, which loads back as the same configuration (`check-config --changed`).
pub fn changed_from_defaults(config: &Config) -> Result<serde_json::Value, CliError> {
    fn strip(v: &mut serde_json::Value, default: &serde_json::Value) -> bool {
        use serde_json::Value;
        match (v, default) {
            (Value::Object(m), Value::Object(d)) => {
                m.retain(|k, child| match d.get(k) {
                    Some(dc) => !strip(child, dc),
                    None => true,
                });
                m.is_empty()
            }
            (v, d) => v == d,
        }
    }
    let mut v = effective(config)?;
    let defaults = effective(&Config::default())?;
    if strip(&mut v, &defaults) {
        v = serde_json::Value::Object(Default::default());
    }
    Ok(v)
}

/// Lambda's limit on the environment: 4 KB for every variable's name and value together.
pub const LAMBDA_ENVIRONMENT_BYTES: usize = 4096;

/// A warning when `changed` (the configuration's changed keys, compact) would not leave room
/// in the Lambda environment as `PODMUTATOR_CONFIG`: its size, and what to do instead.
pub fn lambda_environment_warning(changed: &str, changed_mode: bool) -> Option<String> {
    // The variable as Lambda counts it, in the environment's JSON object: "NAME":"value",
    // where the value is the JSON text escaped once more.
    let escaped = serde_json::Value::String(changed.to_owned()).to_string();
    let bytes = ENV_CONFIG_INLINE.len() + 3 + escaped.len();
    // The other variables a deployment sets (RUST_LOG, the AWS_* Lambda adds are not counted).
    (bytes > LAMBDA_ENVIRONMENT_BYTES * 7 / 8).then(|| {
        let what = if changed_mode {
            "this configuration"
        } else {
            "this configuration's changed keys (check-config --changed)"
        };
        format!(
            "{what} would take {bytes} bytes of Lambda's {LAMBDA_ENVIRONMENT_BYTES}-byte environment as {ENV_CONFIG_INLINE}, which every other variable shares: ship it as a file (PODMUTATOR_CONFIG_FILE, in the zip or a layer), or shorten it (docs/deploy.md, \"The 4 KB environment\")"
        )
    })
}

/// `check-config --changed`'s report on stderr: how many keys were read, what was skipped, and
/// which of the keys read podmutator never uses.
fn summary(loaded: &crate::config::Loaded) -> String {
    let mut out = format!("podmutator: read {} keys\n", loaded.read.len());
    // Sections by the file they came from (`file: section`), then keys.
    let mut by_source: Vec<(&str, Vec<&str>)> = Vec::new();
    for s in &loaded.skipped {
        let (source, name) = s.rsplit_once(": ").unwrap_or(("keys", s));
        match by_source.iter_mut().find(|(src, _)| *src == source) {
            Some((_, names)) => names.push(name),
            None => by_source.push((source, vec![name])),
        }
    }
    for (source, names) in by_source {
        out.push_str(&format!(
            "podmutator: skipped, {source}: {}\n",
            names.join(", ")
        ));
    }
    let unused = loaded.unused();
    if !unused.is_empty() {
        out.push_str(&format!(
            "podmutator: unused (accepted so Flyte's configurations load): {}\n",
            unused.join(", ")
        ));
    }
    if loaded.config.http.path_token.is_some() {
        out.push_str("podmutator: http.pathToken is printed redacted: give the deployment the token itself, or its hash as http.pathTokenSha256\n");
    }
    out
}

/// Drops each `null` that is also the default there (an unset option); a `null` that differs
/// from its default (`mesh.gate.securityContext: null`, "none") is a setting and stays.
fn drop_unset(v: &mut serde_json::Value, default: Option<&serde_json::Value>) {
    if let serde_json::Value::Object(map) = v {
        map.retain(|k, v| {
            !v.is_null() || default.and_then(|d| d.get(k)).is_some_and(|d| !d.is_null())
        });
        for (k, v) in map.iter_mut() {
            drop_unset(v, default.and_then(|d| d.get(k)));
        }
    }
}

/// The configuration as `check-config` prints it: `http.pathToken` is a credential (whoever
/// holds it may call the webhook), so only whether it is set shows.
pub fn redacted(config: &Config) -> Result<serde_json::Value, CliError> {
    let mut v = serde_json::to_value(config).map_err(CliError::Output)?;
    if let Some(token) = v.pointer_mut("/http/pathToken")
        && !token.is_null()
    {
        *token = serde_json::Value::String("<redacted>".into());
    }
    Ok(v)
}

fn runtime(multi_thread: bool) -> Result<tokio::runtime::Runtime, CliError> {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().map_err(CliError::Runtime)
}

/// The process's AWS configuration ([`SharedAws`]), loaded on its first use, with
/// `webhook.embeddedSecretManagerConfig.awsConfig.region` where the environment names none.
pub fn shared_aws(config: &Config) -> crate::secrets::source::SharedAws {
    crate::secrets::source::SharedAws::new(
        &config
            .webhook
            .embedded_secret_manager_config
            .aws_config
            .region,
    )
}

/// The Embedded manager's source as production reads it: AWS Secrets Manager in
/// `webhook.embeddedSecretManagerConfig.awsConfig.region`, behind the configured cache. The SDK
/// client is built on the first fetch ([`BuiltOnFirstFetch`]), not here, from `aws`.
pub async fn embedded_source(
    config: &Config,
    aws: &crate::secrets::source::SharedAws,
) -> Arc<dyn SecretSource> {
    use crate::secrets::source::{AwsSource, CachePolicy, CachingSource};
    use std::time::Duration;
    let region = config
        .webhook
        .embedded_secret_manager_config
        .aws_config
        .region
        .clone();
    let budget = Duration::from_millis(config.embedded.deadline_ms);
    let embedded = config.embedded.clone();
    let aws = aws.clone();
    Arc::new(CachingSource::new(
        BuiltOnFirstFetch::new(move || {
            let region = region.clone();
            let embedded = embedded.clone();
            let aws = aws.clone();
            async move {
                let client = aws.secrets_manager(&region, budget).await;
                AwsSource::from_config(client, &embedded)
            }
        }),
        CachePolicy::from_config(&config.embedded),
    ))
}

/// Reference delivery's resolver: `DescribeSecret` (metadata only) behind the same cache
/// bounds and lifetimes as values. Like [`embedded_source`], the SDK client is built on the
/// first resolution, not here, from `aws`.
pub async fn embedded_resolver(
    config: &Config,
    aws: &crate::secrets::source::SharedAws,
) -> Arc<dyn SecretSource> {
    use crate::secrets::resolve::DescribeSource;
    use crate::secrets::source::{CachePolicy, CachingSource};
    use std::time::Duration;
    let region = config
        .webhook
        .embedded_secret_manager_config
        .aws_config
        .region
        .clone();
    let budget = Duration::from_millis(config.embedded.deadline_ms);
    let aws = aws.clone();
    Arc::new(CachingSource::new(
        BuiltOnFirstFetch::new(move || {
            let region = region.clone();
            let aws = aws.clone();
            async move {
                let client = aws.secrets_manager(&region, budget).await;
                DescribeSource::new(client)
            }
        }),
        CachePolicy::from_config(&config.embedded),
    ))
}

/// The registry client of `embedded.entrypointLookup` (when it lists registries), reading ECR
/// registries with the function's own AWS identity: `aws`, loaded on the first ECR lookup if
/// nothing loaded it before.
pub fn entrypoint_source(
    config: &Config,
    aws: &crate::secrets::source::SharedAws,
) -> Result<Option<Arc<dyn crate::registry::EntrypointSource>>, ConfigError> {
    use crate::registry::client::RegistryClient;
    use crate::registry::ecr::LoadSdkConfig;
    let lookup = &config.embedded.entrypoint_lookup;
    if !lookup.enabled() {
        return Ok(None);
    }
    let client = RegistryClient::new(lookup)
        .map_err(|e| ConfigError::new("embedded.entrypointLookup.caBundleFile", e.0))?;
    let aws = aws.clone();
    let load: LoadSdkConfig = Arc::new(move || {
        let aws = aws.clone();
        Box::pin(async move { aws.config().await.clone() })
    });
    Ok(Some(Arc::new(client.with_ecr(load))))
}

/// A source built on its first fetch. Loading the AWS configuration (root certificates, the HTTP
/// client, the credential chain's providers) costs a cold start time it need not pay when its
/// first admissions fetch nothing; built here, it is paid once, inside that fetch's deadline.
struct BuiltOnFirstFetch<S, F> {
    build: F,
    source: tokio::sync::OnceCell<S>,
}

impl<S, F> BuiltOnFirstFetch<S, F> {
    fn new(build: F) -> Self {
        Self {
            build,
            source: tokio::sync::OnceCell::new(),
        }
    }
}

impl<S, F, Fut> SecretSource for BuiltOnFirstFetch<S, F>
where
    S: SecretSource,
    F: Fn() -> Fut + Send + Sync,
    Fut: std::future::Future<Output = S> + Send,
{
    fn fetch_many<'a>(
        &'a self,
        ids: &'a [String],
    ) -> crate::secrets::source::BoxFuture<
        'a,
        Result<crate::secrets::source::Fetched, crate::secrets::source::SourceError>,
    > {
        Box::pin(async move {
            let source = self.source.get_or_init(|| (self.build)()).await;
            source.fetch_many(ids).await
        })
    }
}

/// The app behind its HTTP front, with what is fetched at start: the AWS client (Embedded
/// mode, built lazily on first use) and, only with `http.pathTokenSecretId`, the path token.
/// `serve` with a probe port (`webhook.metricsPort`) writes no EMF lines: Prometheus reads the
/// same counters there, and nothing reads EMF outside CloudWatch.
pub async fn build_front(config: &Config, transport: Transport) -> Result<Front, CliError> {
    let emf = match transport {
        Transport::Lambda => true,
        Transport::Https => config.webhook.metrics_port.is_none(),
    };
    start(config, TokenRead::Fetch, emf).await
}

/// What serves the front [`build_front`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Lambda,
    Https,
}

/// Whether start-up reads `http.pathTokenSecretId` (`serve`, `lambda`) or leaves it unread
/// (`check-config`, which makes no network call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenRead {
    Fetch,
    Skip,
}

/// The one start-up gate: every check `serve` and `lambda` make before their first request,
/// and the whole of what `check-config` runs, so the three refuse exactly the same
/// configurations with the same key and message. Only the path token's secret read is left to
/// the commands that serve.
async fn start(config: &Config, read: TokenRead, emf: bool) -> Result<Front, CliError> {
    use crate::config::SecretManagerType;
    use std::time::Duration;

    let h = &config.http;
    if h.path_token.is_none()
        && h.path_token_sha256.is_none()
        && h.path_token_secret_id.is_none()
        && !h.path_token_disabled
    {
        return Err(ConfigError::new("http", "no path token: set http.pathTokenSha256 (the SHA-256 of the token in the registration URL), http.pathToken or http.pathTokenSecretId; or set http.pathTokenDisabled: true to serve every route to anyone who reaches it").into());
    }
    let embedded = config
        .webhook
        .enabled_secret_managers()
        .contains(&SecretManagerType::Embedded);
    // One AWS configuration for the process: the token's read, Embedded's clients and ECR's.
    let aws = shared_aws(config);
    let token = match h
        .path_token_secret_id
        .as_deref()
        .filter(|_| read == TokenRead::Fetch)
    {
        // The token lives in the function's own region (Lambda sets AWS_REGION), which may not
        // be the region Embedded secrets are read from.
        Some(id) => {
            let own = std::env::var("AWS_REGION").unwrap_or_default();
            let token_region = if own.is_empty() {
                config
                    .webhook
                    .embedded_secret_manager_config
                    .aws_config
                    .region
                    .as_str()
            } else {
                &own
            };
            let budget = Duration::from_millis(config.embedded.deadline_ms);
            let client = aws.secrets_manager(token_region, budget).await;
            Some(read_path_token(&client, id).await?)
        }
        None => None,
    };
    let mut deps = Deps::process(config);
    if !emf {
        deps.metrics = None;
    }
    if embedded {
        deps = match config.embedded.delivery {
            // Values are read only for env vars served by value.
            crate::config::Delivery::Reference => {
                let deps = deps.with_resolver(embedded_resolver(config, &aws).await);
                match config.embedded.env_var_delivery {
                    crate::config::EnvVarDelivery::Value => {
                        deps.with_source(embedded_source(config, &aws).await)
                    }
                    crate::config::EnvVarDelivery::Exec => deps,
                }
            }
            crate::config::Delivery::Value => deps.with_source(embedded_source(config, &aws).await),
        };
    }
    if let Some(e) = entrypoint_source(config, &aws)? {
        deps = deps.with_entrypoints(e);
    }
    let app = App::build(config, deps)?;
    Ok(Front::new(Arc::new(app), h, token.as_deref())?)
}

async fn read_path_token(
    client: &aws_sdk_secretsmanager::Client,
    id: &str,
) -> Result<String, CliError> {
    let out = client
        .get_secret_value()
        .secret_id(id)
        .send()
        .await
        .map_err(|e| CliError::ReadPathToken {
            id: id.to_owned(),
            // The SDK's own Display is terse ("service error"); its context names the cause.
            source: aws_sdk_secretsmanager::error::DisplayErrorContext(e)
                .to_string()
                .into(),
        })?;
    let token = out
        .secret_string()
        .map(str::trim)
        .ok_or_else(|| CliError::PathTokenNotText { id: id.to_owned() })?
        .to_owned();
    Ok(token)
}

#[cfg(feature = "serve")]
fn serve(config: &Config, namespace: &str) -> Result<(), CliError> {
    let w = &config.webhook;
    let dir = std::path::PathBuf::from(w.cert_dir_expanded());
    let addr = SocketAddr::from((config.http.listen_address, w.listen_port));
    // Whoever reaches the port could otherwise be served secret values: in the cluster every
    // pod can, and the path token is no secret from whoever creates pods.
    let client_ca = config
        .http
        .client_ca_file
        .as_deref()
        .map(std::path::Path::new);
    if config.embedded_values_in_replies() && client_ca.is_none() {
        return Err(CliError::ValuesToUnauthenticated);
    }
    runtime(true)?.block_on(async move {
        // The gate first: a configuration `check-config` refuses touches no certificate.
        let front = Arc::new(build_front(config, Transport::Https).await?);
        let files = tls::ensure_certs(
            &dir,
            w.local_cert.unwrap_or(true),
            &tls::serving_names(&w.service_name, namespace),
        )?;
        let tls = match client_ca {
            Some(ca) => tls::tls_config_verifying(&files, ca)?,
            None => tls::tls_config(&files)?,
        };
        let listener = server::bind(addr).await?;
        let local = listener
            .local_addr()
            .map_err(|source| server::ServerError::Listen { addr, source })?;
        // Bound after the HTTPS port, so a ready probe port means the webhook's is listening.
        let probe = match w.metrics_port {
            Some(port) => {
                let addr = SocketAddr::from((config.http.listen_address, port));
                let listener = server::bind(addr).await?;
                let local = listener
                    .local_addr()
                    .map_err(|source| server::ServerError::Listen { addr, source })?;
                Some((listener, local))
            }
            None => None,
        };
        let mut fields = serde_json::json!({
            "version": crate::VERSION,
            "addr": local.to_string(),
            "cert_dir": dir.display().to_string(),
            "certs_generated": files.generated,
            "ca": files.ca.display().to_string(),
            "mutators": front.app().chain().ids(),
        });
        if let Some((_, a)) = &probe {
            fields["metrics_addr"] = a.to_string().into();
        }
        start_line("serving https", fields);
        // On SIGTERM the pod is leaving its Service: readiness fails at once, while the webhook
        // port keeps answering for http.drainSeconds, as long as the endpoint's removal takes to
        // reach every API server; then both listeners stop and what is in flight finishes.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let draining = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let drain = std::time::Duration::from_secs(config.http.drain_seconds);
        {
            let draining = draining.clone();
            tokio::spawn(async move {
                server::shutdown_signal().await;
                draining.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::info!(
                    drain_seconds = drain.as_secs(),
                    "draining: readiness fails, the webhook port answers until the drain ends"
                );
                tokio::time::sleep(drain).await;
                let _ = stop_tx.send(true);
            });
        }
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        if let Some((listener, _)) = probe {
            let counters = front.app().counters().clone();
            tokio::spawn(probe::serve(
                counters,
                draining,
                listener,
                stopped(stop_rx.clone()),
            ));
        }
        server::serve(
            front,
            listener,
            tls,
            server::Limits::from_config(&config.http),
            stopped(stop_rx),
        )
        .await?;
        tracing::info!("shut down");
        Ok(())
    })
}

/// A secret request as JSON, the way Flyte's `flyteidl.core.Secret` names its fields.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SecretJson {
    #[serde(skip_serializing_if = "String::is_empty")]
    group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    group_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    key: String,
    mount_requirement: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    env_var: String,
}

/// What `secret-annotations` could not read or encode.
#[derive(Debug, thiserror::Error)]
pub enum AnnotationsError {
    #[error("--decode: expected a JSON object of annotations")]
    DecodeInput(#[source] serde_json::Error),
    #[error("expected a JSON array of secrets")]
    EncodeInput(#[source] serde_json::Error),
    #[error(transparent)]
    Annotation(#[from] crate::secrets::codec::AnnotationError),
    #[error(transparent)]
    Codec(#[from] crate::secrets::codec::CodecError),
    #[error("secret {index}: mount_requirement {value:?}: use ANY, ENV_VAR or FILE")]
    MountRequirement { index: usize, value: String },
    #[error("cannot write the output")]
    Output(#[source] serde_json::Error),
    #[error("fetch failed")]
    Fetch(#[source] crate::pod::fetch::FetchError),
    #[error("exec failed")]
    Exec(#[source] crate::pod::exec::ExecError),
}

/// `secret-annotations JSON` encodes; `secret-annotations --decode JSON` decodes.
pub fn secret_annotations(decode: bool, json: &str) -> Result<String, AnnotationsError> {
    use crate::secrets::codec::{self, MountRequirement, Secret};
    if decode {
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_str(json).map_err(AnnotationsError::DecodeInput)?;
        let decoded = codec::decode_annotations(&map)?;
        let out: Vec<SecretJson> = decoded
            .into_iter()
            .map(|d| SecretJson {
                group: d.secret.group,
                group_version: d.secret.group_version,
                key: d.secret.key,
                mount_requirement: crate::secrets::mount_name(d.secret.mount_requirement),
                env_var: d.secret.env_var,
            })
            .collect();
        return serde_json::to_string_pretty(&out).map_err(AnnotationsError::Output);
    }
    let list: Vec<SecretJson> =
        serde_json::from_str(json).map_err(AnnotationsError::EncodeInput)?;
    let secrets = list
        .into_iter()
        .enumerate()
        .map(|(index, s)| {
            let mount_requirement = match s.mount_requirement.as_str() {
                "" | "ANY" => MountRequirement::Any,
                "ENV_VAR" => MountRequirement::EnvVar,
                "FILE" => MountRequirement::File,
                other => {
                    return Err(AnnotationsError::MountRequirement {
                        index,
                        value: other.to_owned(),
                    });
                }
            };
            Ok(Secret {
                group: s.group,
                group_version: s.group_version,
                key: s.key,
                mount_requirement,
                env_var: s.env_var,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let map = codec::encode_annotations(&secrets)?;
    serde_json::to_string_pretty(&map).map_err(AnnotationsError::Output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("podmutator").chain(args.iter().copied()))
    }

    #[test]
    fn the_log_filter_takes_rust_log_directives_and_lambda_levels() {
        use tracing::Level;
        let on = |spec: &str, target: &str, level: Level| {
            log_filter(spec).unwrap().would_enable(target, &level)
        };
        assert!(on("info", "podmutator::app", Level::INFO));
        assert!(!on("info", "podmutator::app", Level::DEBUG));
        // Lambda's advanced logging controls set AWS_LAMBDA_LOG_LEVEL in capitals.
        assert!(on("DEBUG", "aws_smithy_runtime", Level::DEBUG));
        assert!(!on("DEBUG", "aws_smithy_runtime", Level::TRACE));
        assert!(on("FATAL", "podmutator", Level::ERROR));
        assert!(!on("FATAL", "podmutator", Level::WARN));
        let mixed = "info,podmutator::secrets=trace";
        assert!(on(mixed, "podmutator::secrets::embedded", Level::TRACE));
        assert!(!on(mixed, "podmutator::app", Level::DEBUG));
        assert!(on(mixed, "hyper", Level::INFO));
        // Only the named target, as with RUST_LOG.
        assert!(on("podmutator=debug", "podmutator::app", Level::DEBUG));
        assert!(!on("podmutator=debug", "hyper", Level::ERROR));
        assert!(log_filter("podmutator=loud").is_err());
    }

    #[rstest::rstest]
    #[case::misspelt_level("inof", "\"inof\" is not a level")]
    #[case::bare_target("podmutator", "a target needs one: podmutator=debug")]
    #[case::empty("", "it is empty")]
    #[case::blank(" , ", "it is empty")]
    #[case::bad_level_of_a_target("info,hyper=loud", "\"hyper=loud\"")]
    #[case::span_filter("podmutator[span]=debug", "span and field filters")]
    #[case::field_filter("podmutator[{uid}]=debug", "span and field filters")]
    fn a_filter_that_would_select_nothing_is_refused_naming_the_directive(
        #[case] spec: &str,
        #[case] named: &str,
    ) {
        let e = log_filter(spec).unwrap_err();
        assert!(e.contains(named), "{spec:?}: {e}");
    }

    /// Whatever `RUST_LOG` asks, the crates whose verbose lines hold whole events and requests
    /// (`lambda_runtime`'s raw event at TRACE holds the path token) stay at their cap, and
    /// everything else gets what was asked.
    #[rstest::rstest]
    #[case::trace("trace")]
    #[case::lambda_levels("TRACE")]
    #[case::named_crates(
        "lambda_runtime=trace,lambda_http=trace,hyper=trace,h2=trace,aws_smithy_runtime=trace"
    )]
    #[case::named_modules(
        "lambda_runtime::layers::api_response=trace,hyper::proto=trace,aws_sigv4::http_request=trace"
    )]
    #[case::shorter_prefixes("lambda=trace,hyp=trace,h=trace,aws=trace")]
    fn crates_that_log_raw_events_are_capped_whatever_the_filter_says(#[case] spec: &str) {
        use tracing::Level;
        let f = log_filter(spec).unwrap();
        for target in [
            "lambda_runtime::layers::api_response",
            "lambda_runtime_api_client",
            "lambda_http::request",
            "hyper::proto::h1::role",
            "hyper_util::server",
            "h2::codec::framed_read",
        ] {
            assert!(!f.would_enable(target, &Level::DEBUG), "{spec}: {target}");
            assert!(!f.would_enable(target, &Level::TRACE), "{spec}: {target}");
        }
        for target in [
            "aws_smithy_runtime::client::orchestrator",
            "aws_sigv4::http_request::sign",
            "aws_config",
        ] {
            assert!(!f.would_enable(target, &Level::TRACE), "{spec}: {target}");
        }
        // The caps lower, they never raise nor silence what was asked.
        if spec.eq_ignore_ascii_case("trace") {
            assert!(f.would_enable("podmutator::admission", &Level::TRACE));
            assert!(f.would_enable("lambda_runtime", &Level::INFO));
            assert!(f.would_enable("aws_smithy_runtime", &Level::DEBUG));
        }
    }

    #[rstest::rstest]
    #[case::info("info", None)]
    #[case::ours_at_debug("warn,podmutator=debug", None)]
    #[case::warnings_only("warn", Some("hides podmutator's INFO lines"))]
    #[case::another_crate_only("hyper=debug", Some("hides every line of podmutator's own"))]
    #[case::off("off", Some("hides every line"))]
    fn a_filter_that_hides_the_start_line_is_named(#[case] spec: &str, #[case] note: Option<&str>) {
        let got = hides_the_start_line(&log_filter(spec).unwrap());
        match note {
            None => assert_eq!(got, None, "{spec}"),
            Some(n) => assert!(got.is_some_and(|g| g.contains(n)), "{spec}: {got:?}"),
        }
    }

    #[test]
    fn the_caps_lower_levels_and_never_raise_them() {
        use tracing::Level;
        let f = log_filter("warn,podmutator=debug").unwrap();
        assert!(f.would_enable("podmutator::app", &Level::DEBUG));
        assert!(!f.would_enable("lambda_runtime", &Level::INFO));
        assert!(f.would_enable("lambda_runtime", &Level::WARN));
        assert!(!f.would_enable("aws_smithy_runtime", &Level::INFO));
        let f = log_filter("podmutator=info").unwrap();
        assert!(!f.would_enable("hyper", &Level::ERROR));
        assert!(!f.would_enable("aws_config", &Level::ERROR));
        assert!(f.would_enable("podmutator", &Level::INFO));
        let f = log_filter("off").unwrap();
        assert!(!f.would_enable("lambda_runtime", &Level::ERROR));
    }

    #[test]
    fn the_embedded_source_is_built_on_the_first_fetch_and_once() {
        use crate::secrets::source::{Lookup, StaticSource};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let built = Arc::new(AtomicUsize::new(0));
        let counter = built.clone();
        let lazy = BuiltOnFirstFetch::new(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                StaticSource::default().with("id", "value")
            }
        });
        assert_eq!(built.load(Ordering::SeqCst), 0, "built before any fetch");
        let rt = runtime(false).unwrap();
        for _ in 0..3 {
            let got = rt.block_on(lazy.fetch_many(&["id".to_owned()])).unwrap();
            assert!(matches!(got.values.get("id"), Some(Lookup::Found(_))));
        }
        assert_eq!(built.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn no_command_is_the_lambda_loop_and_a_given_command_wins() {
        let (c, _) = parse(&[]).unwrap().command_or_default();
        assert!(matches!(c, Command::Lambda { .. }), "{c:?}");
        let (c, source) = parse(&["serve", "--config", "c.yaml"])
            .unwrap()
            .command_or_default();
        assert!(matches!(c, Command::Serve { .. }), "{c:?}");
        assert_eq!(source.file, Some(PathBuf::from("c.yaml")));
        let (c, source) = parse(&["--config=c.json", "check-config"])
            .unwrap()
            .command_or_default();
        assert!(matches!(c, Command::CheckConfig { .. }), "{c:?}");
        assert_eq!(source.file, Some(PathBuf::from("c.json")));
        let (_, source) = parse(&["--config=a.yaml", "check-config", "--config", "b.yaml"])
            .unwrap()
            .command_or_default();
        assert_eq!(source.file, Some(PathBuf::from("b.yaml")));
        let err = parse(&["--config"]).unwrap_err().to_string();
        assert!(err.contains("--config <FILE>"), "{err}");
        let err = parse(&["serve", "lambda"]).unwrap_err().to_string();
        assert!(err.contains("'lambda'"), "{err}");
    }

    #[test]
    fn check_config_hides_the_path_token_and_keeps_the_rest() {
        let token = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";
        let config = Config::from_value(serde_json::json!({"http": {"pathToken": token}}))
            .expect("loads")
            .config;
        let v = redacted(&config).unwrap();
        assert_eq!(v["http"]["pathToken"], "<redacted>");
        assert!(!v.to_string().contains(token), "{v}");
        assert_eq!(
            v["webhook"],
            serde_json::to_value(&config).unwrap()["webhook"]
        );
        let unset = redacted(&Config::default()).unwrap();
        assert!(unset["http"]["pathToken"].is_null(), "{unset}");
    }

    #[test]
    fn secret_annotations_round_trip_through_the_cli() {
        let json = r#"[{"group": "user-info", "key": "user_secret", "mount_requirement": "ENV_VAR"}, {"key": "openai_key", "env_var": "OPENAI_API_KEY"}]"#;
        let out = secret_annotations(false, json).unwrap();
        let map: serde_json::Value = serde_json::from_str(&out).unwrap();
        // The spec's vectors (flyte-webhook-spec.md §1.2).
        assert_eq!(
            map["flyte.secrets/s0"],
            "m4zg54lqhiqce4ltmvzc11lomzxsectlmv3tuibcovzwk3s6onswg3tfoqrau2lpovxhix2smvyxk1lsmvwwk2tuhiqektswl4lecuqk"
        );
        assert_eq!(
            map["flyte.secrets/s1"],
            "nnsxsoraejxxazlomfuv512fperauzloozpxmylshiqcet1qivhecsk6ifiesx1livmsecq"
        );
        let back = secret_annotations(true, &out).unwrap();
        let back: serde_json::Value = serde_json::from_str(&back).unwrap();
        assert_eq!(back[0]["group"], "user-info");
        assert_eq!(back[0]["mount_requirement"], "ENV_VAR");
        assert_eq!(back[1]["env_var"], "OPENAI_API_KEY");
        assert_eq!(back[1]["mount_requirement"], "ANY");
    }

    #[test]
    fn secret_annotations_name_what_is_wrong() {
        let err = secret_annotations(false, r#"[{"key": "k", "mount_requirement": "DISK"}]"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("secret 0: mount_requirement \"DISK\""),
            "{err}"
        );
        let err = secret_annotations(true, r#"{"flyte.secrets/s0": "9"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("flyte.secrets/s0"), "{err}");
    }

    #[test]
    fn secret_annotations_takes_decode_as_a_flag() {
        let cli = parse(&["secret-annotations", "--decode", "{}"]).unwrap();
        match cli.command {
            Some(Command::SecretAnnotations { decode, json }) => {
                assert!(decode);
                assert_eq!(json, "{}");
            }
            other => panic!("{other:?}"),
        }
    }
}
