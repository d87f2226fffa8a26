//! Secrets planned once: the annotations are decoded, and each request's manager chosen,
//! before any value is fetched. The admission then fetches [`Plan::ids`] and the `secrets`
//! mutator applies the plan. Nothing is decided twice, so nothing can disagree.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{
    Accept, Edits, NOTHING_RESOLVED, Refusal, ResolvedSecrets, SecretRequest, SecretsMutator,
};
use crate::config::MutatorId;
use crate::error::Denial;
use crate::mutate::{Denied, Effects, PodCtx, PodMutator};
use crate::registry::ImageQuery;

/// The pod's secret requests and, for each, the managers that will try it in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// A denial found while planning (a bad annotation, a request no manager accepts, another
    /// project's secret) is kept here and returned when the `secrets` mutator runs, so the
    /// chain's `required` setting decides what it means, as for any mutator.
    outcome: Result<Vec<PlannedRequest>, Denial>,
    /// A dry run fetches nothing: its values are withheld (see [`super::embedded::DRY_RUN_PLACEHOLDER`]).
    dry_run: bool,
    /// The images to read before injecting, each once, in request order.
    images: Vec<ImageQuery>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PlannedRequest {
    req: SecretRequest,
    /// Managers (index into the injectors) that accepted, in order. Only a manager that
    /// accepted with [`Accept::Fetch`] can be followed by another: one that accepted with
    /// [`Accept::Now`] ends the list.
    candidates: Vec<(usize, Accept)>,
    /// Why each manager before or between the candidates refused.
    refusals: Vec<(usize, Refusal)>,
}

impl Plan {
    /// Every Secrets Manager id the plan may read, each once, in request order; none for a
    /// dry run, whose pod is never created and so must not carry values back to its creator.
    pub fn ids(&self) -> Vec<String> {
        self.ids_where(|a| !self.dry_run && matches!(a, Accept::Fetch(_)))
    }

    /// Every Secrets Manager id the plan needs only to resolve (name and ARN, never the value),
    /// each once, in request order. A dry run resolves too: names are not values.
    pub fn resolve_ids(&self) -> Vec<String> {
        self.ids_where(|a| matches!(a, Accept::Resolve(_)))
    }

    fn ids_where(&self, keep: impl Fn(&Accept) -> bool) -> Vec<String> {
        let mut seen = HashSet::new();
        (self.outcome.iter().flatten())
            .flat_map(|p| &p.candidates)
            .filter_map(|(_, accept)| match accept {
                Accept::Fetch(ids) | Accept::Resolve(ids) if keep(accept) => Some(ids),
                _ => None,
            })
            .flatten()
            .filter(|id| seen.insert(id.as_str()))
            .cloned()
            .collect()
    }

    /// The images whose commands the injection reads (a dry run reads them too: a command
    /// is not a secret).
    pub fn images(&self) -> &[ImageQuery] {
        self.outcome.as_ref().map_or(&[], |_| &self.images)
    }

    /// What the plan's injection adds to the reply at the least, in bytes of its base64 patch:
    /// for each request whose first manager writes into every container, an item per
    /// container (an env var or a mount, at least its names and a fixed envelope). An estimate
    /// made before anything is injected, so a review whose reply could not be sent is refused
    /// before it costs the memory of building it.
    pub fn reply_estimate(
        &self,
        injectors: &[Box<dyn super::SecretInjector>],
        containers: usize,
    ) -> u64 {
        let per_container: u64 = (self.outcome.iter().flatten())
            .filter(|p| {
                p.candidates
                    .first()
                    .and_then(|(i, _)| injectors.get(*i))
                    .is_some_and(|inj| inj.writes_every_container())
            })
            .map(|p| {
                let s = &p.req.secret;
                // The item's JSON: its fields' names and punctuation (about 40 bytes at the
                // least), the variable's name (prefix, group and key) and the reference back.
                let raw = 40 + 2 * (s.group.len() + s.key.len()) + s.env_var.len();
                (raw as u64).div_ceil(3) * 4
            })
            .sum();
        per_container.saturating_mul(containers as u64)
    }
}

impl SecretsMutator {
    /// Decodes the pod's requests once and asks the managers, in order, which takes each.
    /// Reads only the selector label and the `flyte.secrets/*` annotations, which no mutator
    /// before `secrets` writes, so planning the pod as it came in plans what the chain sees.
    pub fn plan(&self, ctx: &PodCtx<'_>, pod: &Pod) -> Plan {
        let outcome = match self.selects(&pod.metadata).then(|| Self::requests(pod)) {
            None => Ok(Vec::new()),
            Some(Err(denial)) => Err(denial),
            Some(Ok(requests)) if requests.len() > self.limits.max_secret_requests_per_pod => {
                Err(Denial::bad_request(
                    "TooManySecretRequests",
                    format!(
                        "the pod carries {} secret requests (flyte.secrets/s<N> annotations), over the cap of {} (limits.maxSecretRequestsPerPod); request fewer secrets per task, or raise the cap",
                        requests.len(),
                        self.limits.max_secret_requests_per_pod
                    ),
                ))
            }
            Some(Ok(requests)) => requests
                .into_iter()
                .map(|req| self.plan_one(req, ctx, pod))
                .collect(),
        };
        let mut images: Vec<ImageQuery> = Vec::new();
        let queries = outcome.iter().flatten().flat_map(|p| {
            (p.candidates.iter())
                .filter(|(_, accept)| matches!(accept, Accept::Resolve(_)))
                .flat_map(|(i, _)| self.injectors[*i].images(&p.req, pod))
        });
        for q in queries {
            if !images.contains(&q) {
                images.push(q);
            }
        }
        let mut plan = Plan {
            outcome,
            dry_run: ctx.dry_run,
            images,
        };
        // Counted even for a dry run, so that a dry run answers what the real create would.
        let ids = plan.ids_where(|_| true).len();
        if ids > self.limits.max_secret_ids_per_admission {
            plan.outcome = Err(Denial::bad_request(
                "TooManySecretIds",
                format!(
                    "the pod's secret requests need {ids} AWS Secrets Manager ids, over the cap of {} per admission (limits.maxSecretIdsPerAdmission); request fewer secrets per task, or raise the cap",
                    self.limits.max_secret_ids_per_admission
                ),
            ));
        }
        plan
    }

    fn plan_one(
        &self,
        req: SecretRequest,
        ctx: &PodCtx<'_>,
        pod: &Pod,
    ) -> Result<PlannedRequest, Denial> {
        let mut candidates = Vec::new();
        let mut refusals = Vec::new();
        for (i, inj) in self.injectors.iter().enumerate() {
            if let Some(denial) = inj.deny(&req, ctx, pod) {
                return Err(denial);
            }
            match inj.accepts(&req, ctx, pod) {
                Ok(Accept::Now) => {
                    candidates.push((i, Accept::Now));
                    break;
                }
                Ok(fetch) => candidates.push((i, fetch)),
                Err(reason) => refusals.push((i, reason)),
            }
        }
        if candidates.is_empty() {
            return Err(self.not_injected(&req, refusals));
        }
        Ok(PlannedRequest {
            req,
            candidates,
            refusals,
        })
    }

    fn not_injected(&self, req: &SecretRequest, mut refusals: Vec<(usize, Refusal)>) -> Denial {
        refusals.sort_by_key(|(i, _)| *i);
        let reasons: Vec<String> = refusals
            .iter()
            .map(|(i, reason)| format!("{}: {reason}", self.injectors[*i].kind()))
            .collect();
        // A container whose command cannot be wrapped has one fix whichever manager is tried.
        let entrypoint = (refusals.iter()).any(|(_, r)| matches!(r, Refusal::Entrypoint(_)));
        let reason = if entrypoint {
            "ContainerCommandRequired"
        } else {
            "SecretNotInjected"
        };
        Denial::bad_request(
            reason,
            format!(
                "none of the secret managers could inject {}: {}",
                req.describe(),
                reasons.join("; ")
            ),
        )
    }

    /// Injects every planned request with its chosen manager (a fetching manager reads the
    /// values in `resolved`), then puts the collected env vars and mounts into every
    /// container. Pure.
    pub fn apply(
        &self,
        plan: &Plan,
        resolved: &ResolvedSecrets,
        ctx: &PodCtx<'_>,
        pod: &mut Pod,
    ) -> Result<Effects, Denial> {
        let planned = plan.outcome.as_ref().map_err(Denial::clone)?;
        if planned.is_empty() {
            return Ok(Effects::default());
        }
        let mut edits = Edits::new(resolved);
        let mut effects = Effects::default();
        'requests: for p in planned {
            let mut refusals = Vec::new();
            for (i, _) in &p.candidates {
                let inj = &self.injectors[*i];
                edits.current = format!("{} ({})", p.req.annotation, inj.kind());
                let mark = edits.mark();
                match inj.inject(&p.req, ctx, pod, &mut edits) {
                    Ok(()) => {
                        effects.secrets_injected(inj.kind(), 1);
                        continue 'requests;
                    }
                    Err(reason) => {
                        edits.reset(mark);
                        refusals.push((*i, reason));
                    }
                }
            }
            refusals.extend(p.refusals.iter().cloned());
            return Err(self.not_injected(&p.req, refusals));
        }
        if edits.conflicts.is_empty() {
            edits.hidden_files();
            edits.taken_paths(pod, &self.skip_containers);
        }
        if !edits.conflicts.is_empty() {
            return Err(Denial::bad_request(
                "SecretConflict",
                edits.conflicts.join("; "),
            ));
        }
        effects.values_withheld(edits.withheld);
        edits.apply(pod, &self.skip_containers);
        Ok(effects)
    }
}

/// What the admission prepares for the `secrets` mutator before the chain runs: the plan of
/// the pod as it came in, and the values fetched for it. The mutator reads it from
/// [`PodCtx::prepared`].
pub struct Prepared {
    pub plan: Plan,
    pub resolved: ResolvedSecrets,
}

impl SecretsMutator {
    /// Plans and applies with nothing fetched: the mutator outside an admission.
    pub fn plan_and_apply(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denial> {
        self.apply(&self.plan(ctx, pod), &NOTHING_RESOLVED, ctx, pod)
    }
}

fn prepared<'a>(ctx: &PodCtx<'a>) -> Option<&'a Prepared> {
    ctx.prepared.and_then(|p| p.downcast_ref())
}

impl PodMutator for SecretsMutator {
    fn id(&self) -> &'static str {
        MutatorId::Secrets.as_str()
    }

    /// Injects with what the admission prepared; with nothing prepared, plans here and has
    /// nothing fetched ([`SecretsMutator::plan_and_apply`]).
    fn mutate(&self, ctx: &PodCtx<'_>, pod: &mut Pod) -> Result<Effects, Denied> {
        Ok(match prepared(ctx) {
            Some(p) => self.apply(&p.plan, &p.resolved, ctx, pod),
            None => self.plan_and_apply(ctx, pod),
        }?)
    }

    /// Not on a pod it does not select; once planned, not on one that asks for no secret.
    fn applies(&self, ctx: &PodCtx<'_>, meta: &ObjectMeta) -> bool {
        match prepared(ctx) {
            Some(p) => !p.plan.outcome.as_ref().is_ok_and(Vec::is_empty),
            None => self.selects(meta),
        }
    }
}
