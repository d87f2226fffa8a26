variable "upstreams" {
  description = "Upstreams to create an ECR pull-through cache rule for: any of docker-hub, quay, github, k8s, ecr-public. The installs' ecr_pull_through_cache_upstreams may name these (any of them, in any order)."
  type        = list(string)

  validation {
    condition     = alltrue([for u in var.upstreams : contains(["docker-hub", "quay", "github", "k8s", "ecr-public"], u)])
    error_message = "upstreams may list only docker-hub, quay, github, k8s and ecr-public."
  }
}

variable "prefix" {
  description = "Prepended to each upstream's name to form its ECR repository prefix (e.g. \"cache/\" gives cache/docker-hub); the installs' ecr_pull_through_cache_prefix."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^([a-z0-9][a-z0-9._-]*/)?$", var.prefix))
    error_message = "prefix must be empty or lower-case letters, digits, '.', '_' or '-' ending in '/'."
  }
}

variable "credential_arns" {
  description = "Secrets Manager ARNs (secret names starting with ecr-pullthroughcache/) holding upstream credentials, by upstream; docker-hub and github need one."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for u in ["docker-hub", "github"] : !contains(var.upstreams, u) || can(regex(":secret:ecr-pullthroughcache/", lookup(var.credential_arns, u, "")))])
    error_message = "docker-hub and github pull-through caches need a credential: set credential_arns[\"docker-hub\"] / [\"github\"] to a secret named ecr-pullthroughcache/..."
  }
}
