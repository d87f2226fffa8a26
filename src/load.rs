//! The configuration, read from where the command line says (`--flyte-config`, `--config`,
//! `--config-json` or their variables), with its warnings.

use std::path::PathBuf;

use podmutator_core::config::{
    Config, ENV_CONFIG_FILE, ENV_CONFIG_INLINE, ENV_FLYTE_CONFIG_FILE, Loaded,
};

/// Why the configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Config(#[from] podmutator_core::config::ConfigError),
    #[error("invalid configuration: {flag}: cannot read {}", path.display())]
    Read {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Which configuration sources came from the environment rather than the command line
/// (`Cli::from_env`), so that errors name what the user set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FromEnv {
    pub flyte: bool,
    pub file: bool,
    pub inline: bool,
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
    pub fn load(&self) -> Result<Loaded, LoadError> {
        let name = |env: bool, var: &'static str, flag: &'static str| if env { var } else { flag };
        let flyte_flag = name(self.from_env.flyte, ENV_FLYTE_CONFIG_FILE, "--flyte-config");
        let flyte = match self.flyte.as_deref() {
            Some(path) => flyte_files(path, flyte_flag)?,
            None => Vec::new(),
        };
        let flyte: Vec<(&str, &str)> = flyte
            .iter()
            .map(|(p, t)| (p.as_str(), t.as_str()))
            .collect();
        let file_flag = name(self.from_env.file, ENV_CONFIG_FILE, "--config");
        let file = match self.file.as_deref() {
            Some(path) => Some(read_file(path, file_flag)?),
            None => None,
        };
        let inline = name(self.from_env.inline, ENV_CONFIG_INLINE, "--config-json");
        Ok(Config::load_with_flyte(
            &flyte,
            file.as_ref().map(|(p, t)| (p.as_str(), t.as_str())),
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
) -> Result<Vec<(String, String)>, LoadError> {
    if !path.is_dir() {
        return Ok(vec![read_file(path, flag)?]);
    }
    let unreadable = |source| LoadError::Read {
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
    if files.is_empty() {
        let key = format!("{flag} {}", path.display());
        let e = "the directory holds no *.yaml, *.yml or *.json file: give flytepropeller's configuration directory (its mounted ConfigMap) or one of its files";
        return Err(podmutator_core::config::ConfigError::new(key, e).into());
    }
    files.sort();
    files.iter().map(|f| read_file(f, flag)).collect()
}

/// The file's path (as shown in errors) and text.
fn read_file(path: &std::path::Path, flag: &'static str) -> Result<(String, String), LoadError> {
    let text = podmutator_core::config::read_file(path).map_err(|source| LoadError::Read {
        flag,
        path: path.to_owned(),
        source,
    })?;
    Ok((path.display().to_string(), text))
}

/// The warnings as log lines (`serve`, `lambda`: the log is where an operator looks).
pub fn log_warnings(loaded: &Loaded) {
    for w in &loaded.warnings {
        tracing::warn!(warning = %w, "configuration");
    }
}

/// The warnings on stderr (`check-config`, `inject`: stdout is the answer).
pub fn print_warnings(loaded: &Loaded) {
    for w in &loaded.warnings {
        eprintln!("podmutator: warning: configuration: {w}");
    }
}
