//! Command line: `podmutator [serve|lambda|webhook-config ...]`. Without a subcommand the binary
//! runs the Lambda runtime when `AWS_LAMBDA_RUNTIME_API` is set and the HTTPS server otherwise.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::app::{App, Deps};
use crate::config::{Config, Loaded};
use crate::transport::http::Front;
use crate::transport::{lambda, server, tls};

pub const USAGE: &str = "\
podmutator — Kubernetes pod-mutating admission webhook (Lambda or HTTPS)

USAGE:
    podmutator [COMMAND] [OPTIONS]

COMMANDS:
    serve            serve HTTPS on webhook.listenPort (default outside Lambda)
    lambda           run the AWS Lambda runtime loop (default when AWS_LAMBDA_RUNTIME_API is set)
    check-config     load and validate the configuration, print it as JSON, and exit
    webhook-config   print the MutatingWebhookConfiguration for a URL as YAML
                     (`podmutator webhook-config --help` for its flags)
    secret-annotations JSON
                     print the flyte.secrets/s<N> annotations for a JSON array of secrets,
                     e.g. '[{\"group\": \"db\", \"key\": \"password\", \"mount_requirement\": \"FILE\"}]'
                     (fields: group, group_version, key, mount_requirement ANY|ENV_VAR|FILE,
                     env_var); `--decode JSON` reads an annotation map back

OPTIONS:
    --config FILE    configuration file (JSON or YAML); same as PODMUTATOR_CONFIG_FILE
    -h, --help       print this help
    -V, --version    print the version

ENVIRONMENT:
    PODMUTATOR_CONFIG_FILE   configuration file (JSON or YAML)
    PODMUTATOR_CONFIG        inline JSON, merged over the file
    RUST_LOG                 log filter (default: info); logs are JSON lines on stdout
";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Serve,
    Lambda,
    CheckConfig,
    Help,
    Version,
}

/// Parses arguments (without the program name). `--config` is applied to the environment
/// variable so that one loader reads every source.
pub fn parse_args(args: &[String], in_lambda: bool) -> Result<(Command, Option<String>), String> {
    let mut command = None;
    let mut config = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok((Command::Help, None)),
            "-V" | "--version" => return Ok((Command::Version, None)),
            "--config" => {
                config = Some(it.next().ok_or("--config needs a file path")?.clone());
            }
            s if s.starts_with("--config=") => config = Some(s["--config=".len()..].to_owned()),
            "serve" | "lambda" | "check-config" if command.is_none() => {
                command = Some(match arg.as_str() {
                    "serve" => Command::Serve,
                    "lambda" => Command::Lambda,
                    _ => Command::CheckConfig,
                });
            }
            other => return Err(format!("unexpected argument {other:?}; see --help")),
        }
    }
    let default = if in_lambda {
        Command::Lambda
    } else {
        Command::Serve
    };
    Ok((command.unwrap_or(default), config))
}

/// JSON log lines on stdout; the filter comes from `RUST_LOG`, else `AWS_LAMBDA_LOG_LEVEL`.
pub fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = std::env::var("RUST_LOG")
        .or_else(|_| std::env::var("AWS_LAMBDA_LOG_LEVEL"))
        .unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_target(false)
        .with_env_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stdout)
        .try_init();
}

fn load(config_path: Option<String>) -> Result<Loaded, String> {
    let loaded = match config_path {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("invalid configuration: --config: cannot read {path}: {e}"))?;
            let inline = std::env::var(crate::config::ENV_CONFIG_INLINE).ok();
            Config::load(Some((&path, &text)), inline.as_deref())
        }
        None => Config::load_from_env(),
    }
    .map_err(|e| e.to_string())?;
    for w in &loaded.warnings {
        tracing::warn!(warning = %w, "configuration");
    }
    Ok(loaded)
}

/// Runs the program; the `Err` is printed by `main` and exits non-zero.
pub fn run(args: &[String]) -> Result<(), String> {
    // `webhook-config` has flags of its own and needs no configuration or runtime.
    if args.first().is_some_and(|a| a == "webhook-config") {
        let yaml =
            crate::registration::webhook_config_command(&args[1..]).map_err(|e| e.to_string())?;
        print!("{yaml}");
        return Ok(());
    }
    if args.first().is_some_and(|a| a == "secret-annotations") {
        println!("{}", secret_annotations(&args[1..])?);
        return Ok(());
    }
    let in_lambda = std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some();
    let (command, config_path) = parse_args(args, in_lambda)?;
    match command {
        Command::Help => {
            print!("{USAGE}");
            return Ok(());
        }
        Command::Version => {
            println!("podmutator {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        _ => {}
    }
    init_logging();
    let Loaded { config, .. } = load(config_path)?;
    match command {
        Command::CheckConfig => {
            println!(
                "{}",
                serde_json::to_string_pretty(&config).map_err(|e| e.to_string())?
            );
            Ok(())
        }
        Command::Lambda => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("failed to start the async runtime: {e}"))?
            .block_on(async {
                let front = Arc::new(build_front(&config).await?);
                tracing::info!(mutators = ?front.app().chain().ids(), "lambda runtime starting");
                lambda::run(front)
                    .await
                    .map_err(|e| format!("lambda runtime stopped: {e}"))
            }),
        Command::Serve => serve(&config),
        Command::Help | Command::Version => Ok(()),
    }
}

/// The app behind its HTTP front, with what is fetched at start: the AWS client (Embedded
/// mode, built lazily on first use) and, only with `http.pathTokenSecretId`, the path token.
pub async fn build_front(config: &Config) -> Result<Front, String> {
    use crate::config::SecretManagerType;
    use crate::secrets::source::{CachePolicy, CachingSource};
    use std::time::Duration;

    let h = &config.http;
    if h.path_token.is_none()
        && h.path_token_sha256.is_none()
        && h.path_token_secret_id.is_none()
        && !h.path_token_disabled
    {
        return Err("invalid configuration: http: no path token: set http.pathTokenSha256 (the SHA-256 of the token in the registration URL), http.pathToken or http.pathTokenSecretId; or set http.pathTokenDisabled: true to serve every route to anyone who reaches it".into());
    }
    let embedded = config
        .webhook
        .enabled_secret_managers()
        .contains(&SecretManagerType::Embedded);
    let budget = Duration::from_millis(config.embedded.deadline_ms);
    let region = &config
        .webhook
        .embedded_secret_manager_config
        .aws_config
        .region;
    let token = match h.path_token_secret_id.as_deref() {
        // The token lives in the function's own region (Lambda sets AWS_REGION), which may not
        // be the region Embedded secrets are read from.
        Some(id) => {
            let own = std::env::var("AWS_REGION").unwrap_or_default();
            let token_region = if own.is_empty() {
                region.as_str()
            } else {
                &own
            };
            let client = crate::secrets::source::aws_client(token_region, budget).await;
            Some(read_path_token(&client, id).await?)
        }
        None => None,
    };
    let mut deps = Deps::process(config);
    if embedded {
        let e = &config.embedded;
        let source = CachingSource::new(
            LazyAws {
                region: region.clone(),
                budget,
                batch_size: e.batch_size,
                source: tokio::sync::OnceCell::new(),
            },
            CachePolicy {
                ttl: Duration::from_secs(e.cache_ttl_seconds),
                negative_ttl: Duration::from_secs(e.negative_cache_ttl_seconds),
                max_entries: e.cache_max_entries,
                max_bytes: e.cache_max_bytes,
            },
        );
        deps = deps.with_source(Arc::new(source));
    }
    let app = App::build(config, deps).map_err(|e| e.to_string())?;
    Front::new(Arc::new(app), h, token.as_deref()).map_err(|e| e.to_string())
}

/// Secrets Manager with its client built on the first fetch: loading the AWS configuration
/// (root certificates, HTTP client, credential chain) costs a cold start time it need not pay
/// when its first admissions fetch nothing, and then happens once, inside that fetch's deadline.
struct LazyAws {
    region: String,
    budget: std::time::Duration,
    batch_size: usize,
    source: tokio::sync::OnceCell<crate::secrets::source::AwsSource>,
}

impl crate::secrets::source::SecretSource for LazyAws {
    fn fetch_many<'a>(
        &'a self,
        ids: &'a [String],
    ) -> crate::secrets::source::BoxFuture<
        'a,
        Result<crate::secrets::source::Fetched, crate::secrets::source::SourceError>,
    > {
        Box::pin(async move {
            let source = self
                .source
                .get_or_init(|| async {
                    let client =
                        crate::secrets::source::aws_client(&self.region, self.budget).await;
                    crate::secrets::source::AwsSource::new(client, self.batch_size)
                })
                .await;
            source.fetch_many(ids).await
        })
    }
}

async fn read_path_token(
    client: &aws_sdk_secretsmanager::Client,
    id: &str,
) -> Result<String, String> {
    let key = "http.pathTokenSecretId";
    let out = client
        .get_secret_value()
        .secret_id(id)
        .send()
        .await
        .map_err(|e| {
            format!(
                "invalid configuration: {key}: cannot read the path token {id}: {}",
                aws_sdk_secretsmanager::error::DisplayErrorContext(e)
            )
        })?;
    let token = out
        .secret_string()
        .map(str::trim)
        .ok_or_else(|| format!("invalid configuration: {key}: secret {id} has no string value"))?
        .to_owned();
    Ok(token)
}

fn serve(config: &Config) -> Result<(), String> {
    let w = &config.webhook;
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".into());
    let dir = std::path::PathBuf::from(w.cert_dir_expanded());
    let files = tls::ensure_certs(
        &dir,
        w.local_cert.unwrap_or(true),
        &tls::serving_names(&w.service_name, &namespace),
    )
    .map_err(|e| e.to_string())?;
    let tls = tls::tls_config(&files).map_err(|e| e.to_string())?;
    let addr = SocketAddr::from((config.http.listen_address, w.listen_port));
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("failed to start the async runtime: {e}"))?
        .block_on(async move {
            let front = Arc::new(
                build_front(config)
                    .await
                    .map_err(server::ServerError::Config)?,
            );
            let listener = server::bind(addr).await?;
            let local = listener
                .local_addr()
                .map_err(|source| server::ServerError::Listen { addr, source })?;
            tracing::info!(
                addr = %local,
                cert_dir = %dir.display(),
                certs_generated = files.generated,
                ca = %files.ca.display(),
                mutators = ?front.app().chain().ids(),
                "serving https"
            );
            server::serve(
                front,
                listener,
                tls,
                server::Limits::default(),
                server::shutdown_signal(),
            )
            .await?;
            tracing::info!("shut down");
            Ok::<_, server::ServerError>(())
        })
        .map_err(|e| e.to_string())
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

/// `secret-annotations JSON` encodes; `secret-annotations --decode JSON` decodes.
pub fn secret_annotations(args: &[String]) -> Result<String, String> {
    use crate::secrets::codec::{self, MountRequirement, Secret};
    match args {
        [flag, json] if flag == "--decode" => {
            let map: std::collections::BTreeMap<String, String> = serde_json::from_str(json)
                .map_err(|e| format!("--decode: expected a JSON object of annotations: {e}"))?;
            let decoded = codec::decode_annotations(&map).map_err(|e| e.to_string())?;
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
            serde_json::to_string_pretty(&out).map_err(|e| e.to_string())
        }
        [json] => {
            let list: Vec<SecretJson> = serde_json::from_str(json)
                .map_err(|e| format!("expected a JSON array of secrets: {e}"))?;
            let secrets = list
                .into_iter()
                .enumerate()
                .map(|(i, s)| {
                    let mount_requirement = match s.mount_requirement.as_str() {
                        "" | "ANY" => MountRequirement::Any,
                        "ENV_VAR" => MountRequirement::EnvVar,
                        "FILE" => MountRequirement::File,
                        other => {
                            return Err(format!(
                                "secret {i}: mount_requirement {other:?}: use ANY, ENV_VAR or FILE"
                            ));
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
            let map = codec::encode_annotations(&secrets).map_err(|e| e.to_string())?;
            serde_json::to_string_pretty(&map).map_err(|e| e.to_string())
        }
        _ => Err("usage: podmutator secret-annotations JSON | --decode JSON".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_follows_the_lambda_environment_unless_a_command_is_given() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(parse_args(&[], true).unwrap(), (Command::Lambda, None));
        assert_eq!(parse_args(&[], false).unwrap(), (Command::Serve, None));
        assert_eq!(
            parse_args(&args(&["serve", "--config", "c.yaml"]), true).unwrap(),
            (Command::Serve, Some("c.yaml".into()))
        );
        assert_eq!(
            parse_args(&args(&["--config=c.json", "check-config"]), false).unwrap(),
            (Command::CheckConfig, Some("c.json".into()))
        );
        assert!(
            parse_args(&args(&["--config"]), false)
                .unwrap_err()
                .contains("--config needs")
        );
        assert!(
            parse_args(&args(&["serve", "lambda"]), false)
                .unwrap_err()
                .contains("\"lambda\"")
        );
    }

    #[test]
    fn secret_annotations_round_trip_through_the_cli() {
        let json = r#"[{"group": "user-info", "key": "user_secret", "mount_requirement": "ENV_VAR"}, {"key": "openai_key", "env_var": "OPENAI_API_KEY"}]"#;
        let out = secret_annotations(&[json.to_owned()]).unwrap();
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
        let back = secret_annotations(&["--decode".to_owned(), out]).unwrap();
        let back: serde_json::Value = serde_json::from_str(&back).unwrap();
        assert_eq!(back[0]["group"], "user-info");
        assert_eq!(back[0]["mount_requirement"], "ENV_VAR");
        assert_eq!(back[1]["env_var"], "OPENAI_API_KEY");
        assert_eq!(back[1]["mount_requirement"], "ANY");
    }

    #[test]
    fn secret_annotations_name_what_is_wrong() {
        let err =
            secret_annotations(&[r#"[{"key": "k", "mount_requirement": "DISK"}]"#.to_owned()])
                .unwrap_err();
        assert!(
            err.contains("secret 0: mount_requirement \"DISK\""),
            "{err}"
        );
        let err = secret_annotations(&["--decode".into(), r#"{"flyte.secrets/s0": "9"}"#.into()])
            .unwrap_err();
        assert!(err.contains("flyte.secrets/s0"), "{err}");
    }
}
