//! Why a secret manager does not take a request, or could not inject it. Each manager answers
//! in these terms; the plan gathers them into the pod's denial ("none of the secret managers
//! could inject ...") with each manager's reason. A refusal names fields, ids and rules, never
//! a value.

/// One manager's reason for not injecting one secret request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A field the manager needs is empty (in the manager's own wording, Flyte's where Flyte
    /// has one).
    #[error("{0}")]
    MissingField(String),
    /// A pod label the manager reads the secret's scope from is missing or empty.
    #[error(
        "[SecretRequirementsError] secret read requirements not met due to empty {0} field in the pod labels"
    )]
    MissingScopeLabel(&'static str),
    /// A mount requirement number the annotation format does not define.
    #[error("unrecognized mount requirement [{0}]")]
    UnknownMount(i32),
    /// A mount requirement this manager cannot deliver.
    #[error("{0}")]
    UnsupportedMount(String),
    /// A name the API server would refuse: an env var, a file name, an init container's.
    #[error("{0}")]
    BadName(String),
    /// A secret name (group, group_version or key) outside what this manager accepts: it would
    /// change the structure of what the manager writes it into (see [`super::names`]).
    #[error("{field} {name:?} cannot be used: it must be {rule}; rename the secret")]
    BadSecretName {
        field: &'static str,
        name: String,
        rule: &'static str,
    },
    /// The manager has no such secret.
    #[error("{0}")]
    NotFound(String),
    /// An id the plan did not fetch (a plan and its injection disagree: a bug, reported).
    #[error("secret {0} was not fetched")]
    NotFetched(String),
    /// A value over `embedded.maxValueBytes`.
    #[error("secret {id} is {bytes} bytes, over embedded.maxValueBytes ({max})")]
    TooLarge {
        id: String,
        bytes: usize,
        max: usize,
    },
    /// A value the secret manager returned empty.
    #[error("[SecretNil] secret {0} read as empty from the secret manager")]
    Empty(String),
    /// Something already in the pod (a container, a volume item) that the injection would
    /// overwrite.
    #[error("{0}")]
    Conflict(String),
    /// A Windows pod (`spec.os.name: windows`), which the manager's Linux init container
    /// cannot serve.
    #[error(
        "cannot deliver this secret to a Windows pod (spec.os.name: windows){via}: that takes the Linux init container {container}, which cannot run on a Windows node{detail}; {instead}"
    )]
    WindowsPod {
        /// How the manager would deliver it (" by reference delivery (...)"), or empty.
        via: &'static str,
        container: String,
        /// More on why, after the node (", and ..."), or empty.
        detail: &'static str,
        instead: &'static str,
    },
    /// A container without `command` whose image's ENTRYPOINT could not be read.
    #[error("{0}")]
    Entrypoint(String),
}
