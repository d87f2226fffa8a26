//! What the injectors add to every container: environment variables and volume mounts,
//! collected per request and applied once at the end.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{EnvVar, Pod, VolumeMount};

use super::k8s::SecretVolumes;
use super::{ENV_DEFAULT_DIR, ENV_FILE_PREFIX, ResolvedSecrets, SECRETS_DIR};
use crate::mutate::pod::{
    add_mounts, containers_mut, env_value, is_under, names_of, put_env_first_named,
};

/// Environment variables and mounts that every (init) container receives, in request order,
/// and the secret values fetched for this admission (what a fetching manager injects from).
/// By default nothing is resolved.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Edits<'a> {
    /// Values fetched before the chain ran (Embedded mode); empty otherwise.
    pub resolved: &'a ResolvedSecrets,
    env: Vec<EnvVar>,
    env_owner: Vec<String>,
    /// Position of each name in `env`: a pod's requests are checked against each other in
    /// O(n), not by scanning the list for every variable.
    env_index: HashMap<String, usize>,
    mounts: Vec<VolumeMount>,
    mount_owner: Vec<String>,
    /// Position of each planned mount by volume name and by path (each is unique in `mounts`:
    /// a second mount of either is never added), for the same reason as `env_index`.
    mount_names: HashMap<String, usize>,
    mount_paths: HashMap<String, usize>,
    /// The file each file secret is read from, for [`Edits::hidden_files`].
    files: Vec<SecretFile>,
    /// The pod's Secret volumes and their items, indexed for the K8s manager as it adds to
    /// them. It follows the pod, not the plan: a rolled-back request leaves it as it is.
    pub(super) secret_volumes: SecretVolumes,
    pub(super) conflicts: Vec<String>,
    /// Who is asking now, for conflict messages.
    pub(super) current: String,
    /// Init containers this admission has built, by name. An injector that builds one init
    /// container across several requests (the reference fetcher) merges into it only once it
    /// is here: one the pod arrived with under that name is replaced, never merged into, so a
    /// pod cannot supply its own. Added to only when the pod changes, so a rolled-back request
    /// leaves nothing to roll back.
    pub(crate) built: BTreeSet<String>,
    /// Values a dry run replaced with the placeholder.
    pub(super) withheld: u32,
}

/// Where a request's secret is read from in the containers ([`Edits::file_secret`]), and
/// which request reads it there.
#[derive(Debug, Clone, PartialEq)]
struct SecretFile {
    path: String,
    volume: String,
    source: String,
    owner: String,
}

/// A position in [`Edits`] to roll back to when an injector fails.
#[derive(Debug, Clone, Copy)]
pub struct EditsMark {
    env: usize,
    mounts: usize,
    files: usize,
    conflicts: usize,
    withheld: u32,
}

impl<'a> Edits<'a> {
    pub fn new(resolved: &'a ResolvedSecrets) -> Self {
        Self {
            resolved,
            ..Self::default()
        }
    }

    /// Adds `var` unless the same variable is already planned. Two requests that want different
    /// values under one name are a conflict, reported after all requests ran.
    pub fn env(&mut self, var: EnvVar) {
        match self.env_index.get(&var.name).copied() {
            Some(i) if self.env[i] == var => {}
            Some(i) if self.env_owner[i] == self.current => self.conflicts.push(format!(
                "{} sets environment variable {} twice, to different values: its env_var names a variable the webhook also sets for it; give it a different env_var",
                self.current, var.name
            )),
            Some(i) => self.conflicts.push(format!(
                "{} and {} both set environment variable {}; give one of them a different env_var",
                self.env_owner[i], self.current, var.name
            )),
            None => {
                self.env_index.insert(var.name.clone(), self.env.len());
                self.env.push(var);
                self.env_owner.push(self.current.clone());
            }
        }
    }

    /// The ending every file secret shares, for a request whose secret the containers read
    /// from `path`, a file of `volume` (a planned mount shows it there), holding `source` (what
    /// the manager writes or projects into it: one secret, under one name): `env_var`, if set,
    /// pointing at the file; then Flyte's two variables that say where secret files are
    /// ([`Edits::secrets_dir_env`]). The file is checked against the others once all requests
    /// ran ([`Edits::hidden_files`]).
    pub fn file_secret(
        &mut self,
        env_var: &str,
        path: impl Into<String>,
        volume: impl Into<String>,
        source: impl Into<String>,
    ) {
        let path = path.into();
        if !env_var.is_empty() {
            self.env(env_value(env_var, &path));
        }
        self.secrets_dir_env();
        let (volume, source, owner) = (volume.into(), source.into(), self.current.clone());
        self.files.push(SecretFile {
            path,
            volume,
            source,
            owner,
        });
    }

    /// Flyte's two variables that say where secret files are (no prefix, in [`SECRETS_DIR`]).
    pub fn secrets_dir_env(&mut self) {
        self.env(env_value(ENV_FILE_PREFIX, ""));
        self.env(env_value(ENV_DEFAULT_DIR, SECRETS_DIR));
    }

    /// Files no container would read as their requests expect, each a conflict: two secrets
    /// written to one path (names that differ only in case, say), a file inside another
    /// (Azure's latest value and a pinned version of it), or a file that another manager's
    /// mount hides (a K8s Secret mounted at `/etc/flyte/secrets/<group>` over a fetcher's
    /// `<group>/...`, where the fetcher would also find it read-only). The nearest mount above a
    /// file must be its own volume's.
    pub fn hidden_files(&mut self) {
        let mut found = Vec::new();
        for (i, f) in self.files.iter().enumerate() {
            let nearest = (self.mounts.iter().zip(&self.mount_owner))
                .filter(|(m, _)| is_under(&f.path, &m.mount_path))
                .max_by_key(|(m, _)| m.mount_path.len());
            if let Some((m, owner)) = nearest.filter(|(m, _)| m.name != f.volume) {
                found.push(format!(
                    "{} reads {} from volume {:?}, but {owner} mounts volume {:?} at {}, which hides it; request these secrets through one secret manager, or give them different groups",
                    f.owner, f.path, f.volume, m.name, m.mount_path
                ));
                continue;
            }
            for g in &self.files[..i] {
                if g.path == f.path && (g.volume != f.volume || g.source != f.source) {
                    found.push(format!(
                        "{} and {} both write {}, with different secrets; give one of them a different name",
                        g.owner, f.owner, f.path
                    ));
                } else if let Some((outer, inner)) = [(g, f), (f, g)]
                    .into_iter()
                    .find(|(a, b)| b.path.len() > a.path.len() && is_under(&b.path, &a.path))
                {
                    found.push(format!(
                        "{} writes the file {} and {} a file inside it, {}; a path cannot be both",
                        outer.owner, outer.path, inner.owner, inner.path
                    ));
                }
            }
        }
        self.conflicts.extend(found);
    }

    /// Adds `m` unless a mount of that volume is already planned. Two different volumes at one
    /// path (say an AWS fetcher's and an Embedded file volume, both at `/etc/flyte/secrets`) would
    /// make the API server reject the pod: that is a conflict, reported after all requests ran.
    pub fn mount(&mut self, m: VolumeMount) {
        if self.mount_names.contains_key(&m.name) {
            return;
        }
        if let Some(&i) = self.mount_paths.get(&m.mount_path) {
            self.conflicts.push(format!(
                "{} and {} both need a volume mounted at {} ({:?} and {:?}); request these secrets through one secret manager",
                self.mount_owner[i], self.current, m.mount_path, self.mounts[i].name, m.name
            ));
            return;
        }
        self.mount_names.insert(m.name.clone(), self.mounts.len());
        self.mount_paths
            .insert(m.mount_path.clone(), self.mounts.len());
        self.mounts.push(m);
        self.mount_owner.push(self.current.clone());
    }

    pub(super) fn mark(&self) -> EditsMark {
        EditsMark {
            env: self.env.len(),
            mounts: self.mounts.len(),
            files: self.files.len(),
            conflicts: self.conflicts.len(),
            withheld: self.withheld,
        }
    }

    pub(super) fn reset(&mut self, mark: EditsMark) {
        for e in &self.env[mark.env.min(self.env.len())..] {
            self.env_index.remove(&e.name);
        }
        for m in &self.mounts[mark.mounts.min(self.mounts.len())..] {
            self.mount_names.remove(&m.name);
            self.mount_paths.remove(&m.mount_path);
        }
        self.env.truncate(mark.env);
        self.env_owner.truncate(mark.env);
        self.mounts.truncate(mark.mounts);
        self.mount_owner.truncate(mark.mounts);
        self.files.truncate(mark.files);
        self.conflicts.truncate(mark.conflicts);
        self.withheld = mark.withheld;
    }

    /// Planned mounts at a path where a container of the pod already mounts another volume (the
    /// API server refuses two mounts at one path), and secret files a container's own mount
    /// hides (one below the file's volume, at or above the file): each a conflict that names
    /// the container's mount. Containers in `skip` get nothing and are not looked at.
    pub fn taken_paths(&mut self, pod: &Pod, skip: &[String]) {
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        let containers = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .filter(|c| !skip.contains(&c.name));
        for c in containers {
            for theirs in c.volume_mounts.iter().flatten() {
                let path = theirs.mount_path.trim_end_matches('/');
                let planned = (self.mounts.iter().zip(&self.mount_owner)).find(|(m, _)| {
                    m.mount_path.trim_end_matches('/') == path && m.name != theirs.name
                });
                if let Some((m, owner)) = planned {
                    self.conflicts.push(format!(
                        "{owner} mounts volume {:?} at {}, where container {:?} already mounts its volume {:?}; move or remove that mount",
                        m.name, m.mount_path, c.name, theirs.name
                    ));
                    continue;
                }
                if self.mount_names.contains_key(&theirs.name) {
                    continue;
                }
                let hidden = self.files.iter().find(|f| {
                    let ours = self.mount_names.get(&f.volume).map(|&i| &self.mounts[i]);
                    is_under(&f.path, path)
                        && ours
                            .is_some_and(|m| m.mount_path.trim_end_matches('/').len() < path.len())
                });
                if let Some(f) = hidden {
                    self.conflicts.push(format!(
                        "container {:?} mounts its volume {:?} at {}, which hides {}, where {} puts the secret; move or remove that mount",
                        c.name, theirs.name, theirs.mount_path, f.path, f.owner
                    ));
                }
            }
        }
    }

    /// Puts the planned variables first in every container (replacing same-name ones) and adds
    /// the planned mounts, skipping containers named in `skip`.
    pub fn apply(&self, pod: &mut Pod, skip: &[String]) {
        let Some(spec) = pod.spec.as_mut() else {
            return;
        };
        let ours = names_of(&self.env);
        for c in containers_mut(spec, skip) {
            put_env_first_named(&mut c.env, &self.env, &ours);
            add_mounts(&mut c.volume_mounts, &self.mounts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutate::pod::env_value;

    #[test]
    fn a_rolled_back_variable_can_be_planned_again_and_conflicts_still_show() {
        let mut edits = Edits {
            current: "s0".into(),
            ..Edits::default()
        };
        edits.env(env_value("A", "1"));
        let mark = edits.mark();
        edits.current = "s1".into();
        edits.env(env_value("B", "2"));
        edits.reset(mark);
        edits.env(env_value("B", "3"));
        edits.env(env_value("A", "1"));
        assert!(edits.conflicts.is_empty(), "{:?}", edits.conflicts);
        edits.env(env_value("A", "other"));
        assert_eq!(
            edits.conflicts,
            ["s0 and s1 both set environment variable A; give one of them a different env_var"]
        );
        let names: Vec<(&str, &str)> = edits
            .env
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap()))
            .collect();
        assert_eq!(names, [("A", "1"), ("B", "3")]);
    }

    #[test]
    fn a_request_that_sets_one_variable_twice_is_named_once() {
        let mut edits = Edits {
            current: "s0".into(),
            ..Edits::default()
        };
        edits.env(env_value(ENV_DEFAULT_DIR, "/elsewhere"));
        edits.secrets_dir_env();
        assert_eq!(
            edits.conflicts,
            [format!(
                "s0 sets environment variable {ENV_DEFAULT_DIR} twice, to different values: its env_var names a variable the webhook also sets for it; give it a different env_var"
            )]
        );
    }
}
