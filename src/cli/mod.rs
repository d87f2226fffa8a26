//! Command line: `podmutator [serve|certs|lambda|check-config|webhook-config|secret-annotations|inject|version|completion]`.
//! Without a subcommand the binary runs the Lambda runtime when `AWS_LAMBDA_RUNTIME_API` is set
//! (it is the Lambda bootstrap) and prints its help otherwise.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{CommandFactory, Parser, Subcommand};
use podmutator_core::config::{ENV_CONFIG_FILE, ENV_CONFIG_INLINE, ENV_FLYTE_CONFIG_FILE};
use podmutator_core::metrics::VERSION;
use podmutator_core::pod::plan::EXEC_WRAPPER;

use crate::check_config;
use crate::load::{FromEnv, LoadError, Source, log_warnings, print_warnings};
use crate::logging::{init_logging, start_line};
use crate::startup::{self, StartError, Starter, runtime};
use crate::transport::lambda;

pub mod annotations;
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
    WebhookConfig(Box<crate::registration::RegistrationOptions>),
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
/// Why the program stopped; `main` prints it with its sources ([`CliError::chain`]) and exits
/// non-zero.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[cfg(feature = "serve")]
    #[error(transparent)]
    Serve(#[from] crate::serve::ServeError),
    #[error("lambda runtime stopped")]
    Lambda(#[source] lambda_http::Error),
    #[error(
        "cannot run the Lambda runtime here: {0} (Lambda sets these; outside Lambda, run `podmutator serve`)"
    )]
    LambdaEnv(String),
    #[cfg(feature = "serve")]
    #[error(transparent)]
    Certs(#[from] certs::CertsError),
    #[cfg(feature = "tools")]
    #[error(transparent)]
    WebhookConfig(#[from] crate::registration::ArgError),
    #[error(transparent)]
    SecretAnnotations(#[from] annotations::AnnotationsError),
    #[cfg(feature = "tools")]
    #[error(transparent)]
    Inject(#[from] inject::InjectError),
    #[error("cannot write the output")]
    Output(#[source] serde_json::Error),
    #[error("fetch failed")]
    Fetch(#[source] podmutator_core::pod::plan::FetchError),
    #[error("exec failed")]
    Exec(#[source] podmutator_core::pod::exec::ExecError),
}

impl CliError {
    /// The message with every source after it, `: `-separated, as `main` prints it.
    pub fn chain(&self) -> String {
        let mut out = self.to_string();
        for e in std::iter::successors(std::error::Error::source(self), |e| e.source()) {
            let s = e.to_string();
            // `transparent` variants hand their own message up; don't print it twice.
            if !out.ends_with(&s) {
                out.push_str(": ");
                out.push_str(&s);
            }
        }
        out
    }
}

impl Cli {
    /// The process's command line (`--help`, `--version` and usage errors answer and exit
    /// here), noting which configuration sources came from their variables.
    pub fn from_env() -> Self {
        use clap::{FromArgMatches, parser::ValueSource};
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
            // The commands that read no configuration.
            _ => None,
        };
        let after = after.cloned().unwrap_or_default();
        let source = Source {
            flyte: after.flyte_config.or(self.config.flyte_config),
            file: after.config.or(self.config.config),
            inline: after.config_json.or(self.config.config_json),
            from_env: self.from_env,
        };
        (command, source)
    }
}

/// Runs the parsed command line; the `Err` is printed by `main` and exits non-zero.
pub fn run(cli: Cli) -> Result<(), CliError> {
    let in_lambda = std::env::var_os(ENV_LAMBDA_RUNTIME_API).is_some();
    if cli.command.is_none() && !in_lambda {
        // Outside Lambda, no command is a person asking what this is.
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
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "podmutator", &mut script);
            // A closed pipe (`| head`) is the reader's choice, not an error worth a panic.
            let _ = std::io::stdout().lock().write_all(&script);
            Ok(())
        }
        #[cfg(feature = "tools")]
        Command::ConfigSchema => {
            let text = serde_json::to_string_pretty(&podmutator_core::config::json_schema())
                .map_err(CliError::Output)?;
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            Ok(())
        }
        // The pod side: its whole input is one environment variable each.
        Command::Fetch => {
            let summary = crate::pod::fetch::run_fetch().map_err(CliError::Fetch)?;
            eprintln!(
                "podmutator: fetched {} secrets into {} files in {} Secrets Manager calls",
                summary.secrets, summary.files, summary.calls
            );
            match summary.copied {
                Some(c) if c.wrapper => eprintln!(
                    "podmutator: copied the exec wrapper ({EXEC_WRAPPER}, {} bytes)",
                    c.bytes
                ),
                // Works (this binary answers `exec`), at many times the wrapper's size in the
                // pod's memory: say so, so that an image built without the wrapper is noticed.
                Some(c) => eprintln!(
                    "podmutator: copied this whole executable for exec ({} bytes): the image has no {EXEC_WRAPPER} beside it, the small wrapper the Dockerfile installs",
                    c.bytes
                ),
                None => {}
            }
            Ok(())
        }
        Command::Exec { command } => match podmutator_core::pod::exec::run_exec(command) {
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
            // What was done is said even when a later step fails: a Job's log shows both.
            let mut outcome = certs::Outcome::default();
            let result = runtime(false)?.block_on(certs::run(&args, &mut outcome));
            for line in &outcome.lines {
                eprintln!("podmutator certs: {line}");
            }
            result?;
            eprintln!("podmutator certs: done, {} objects written", outcome.writes);
            Ok(())
        }
        Command::SecretAnnotations { decode, json } => {
            println!("{}", annotations::secret_annotations(decode, &json)?);
            Ok(())
        }
        #[cfg(feature = "tools")]
        Command::Inject(args) => {
            let loaded = source.load()?;
            print_warnings(&loaded);
            Ok(inject::run(&loaded.config, &args)?)
        }
        Command::CheckConfig { changed, .. } => {
            // No log subscriber: stdout is one JSON document, and warnings go to stderr.
            let loaded = source.load()?;
            print_warnings(&loaded);
            runtime(false)?.block_on(startup::front(&loaded.config, Starter::CheckConfig))?;
            if let Some(refusal) = startup::serve_refusal(&loaded.config) {
                eprintln!("podmutator: warning: `lambda` serves this configuration; {refusal}");
            }
            let minimal =
                check_config::changed_from_defaults(&loaded.config).map_err(CliError::Output)?;
            let text = if changed {
                eprint!("{}", check_config::summary(&loaded));
                minimal.to_string()
            } else {
                check_config::effective(&loaded.config)
                    .and_then(|v| serde_json::to_string_pretty(&v))
                    .map_err(CliError::Output)?
            };
            if let Some(w) = check_config::lambda_environment_warning(&minimal.to_string(), changed)
            {
                eprintln!("podmutator: warning: {w}");
            }
            // A closed pipe (`| head`) is the reader's choice, not an error worth a panic.
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            Ok(())
        }
        Command::Lambda { .. } => {
            init_logging();
            lambda::check_runtime_env(|k| std::env::var(k).ok()).map_err(CliError::LambdaEnv)?;
            runtime(false)?.block_on(async {
                let started = async {
                    let loaded = source.load()?;
                    log_warnings(&loaded);
                    Ok::<_, CliError>(startup::front(&loaded.config, Starter::Lambda).await?)
                };
                let front = match started.await {
                    Ok(front) => Arc::new(front),
                    Err(e) => {
                        lambda::report_init_error(&e.chain()).await;
                        return Err(e);
                    }
                };
                start_line(
                    "lambda runtime starting",
                    serde_json::json!({
                        "version": VERSION,
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
            Ok(crate::serve::run(&loaded.config, &pod_namespace)?)
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
        "podmutator {VERSION}\ncommit: {}\nbuild: {build}",
        env!("PODMUTATOR_COMMIT")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("podmutator").chain(args.iter().copied()))
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
