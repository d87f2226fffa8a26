# The images rules that send pods to ECR pull-through caches (docs/images.md); the caches' rules
# are the pull-through cache root's (below). The nodes pull from the cache with their own role;
# docs/deploy.md, "Image rewriting", lists the permissions that needs.

locals {
  # name -> the registry pods name, and the upstream ECR pulls from.
  pull_through_upstreams = {
    "docker-hub" = { match = "docker.io", upstream = "registry-1.docker.io" }
    "quay"       = { match = "quay.io", upstream = "quay.io" }
    "github"     = { match = "ghcr.io", upstream = "ghcr.io" }
    "k8s"        = { match = "registry.k8s.io", upstream = "registry.k8s.io" }
    "ecr-public" = { match = "public.ecr.aws", upstream = "public.ecr.aws" }
  }
  pull_through = { for k, v in local.pull_through_upstreams : k => v if contains(var.ecr_pull_through_cache_upstreams, k) }

  # amazonaws.com in the commercial partition, amazonaws.com.cn in China.
  ecr_registry = "${data.aws_caller_identity.current.account_id}.dkr.ecr.${local.region}.${data.aws_partition.current.dns_suffix}"

  # In the order of the upstream list: the first rule that matches wins.
  pull_through_rules = [
    for k in var.ecr_pull_through_cache_upstreams : {
      match   = local.pull_through_upstreams[k].match
      replace = "${local.ecr_registry}/${var.ecr_pull_through_cache_prefix}${k}"
    }
  ]
  image_rules    = concat(local.pull_through_rules, try(var.images_config.rules, []))
  images_enabled = length(local.image_rules) > 0
}

# The pull-through cache rules belong to the account and region's registry, not to an install:
# every install there rewrites to the same ones, so they live in a root of their own
# (modules/pull-through-cache, examples/pull-through-cache), applied before the first install
# that rewrites to them and destroyed after the last. An install only reads the rule of each
# upstream it rewrites to: its plan fails while one is missing (its pods' pulls would fail) or
# caches another registry.
data "aws_ecr_pull_through_cache_rule" "upstream" {
  for_each = local.pull_through

  ecr_repository_prefix = "${var.ecr_pull_through_cache_prefix}${each.key}"

  lifecycle {
    postcondition {
      condition     = self.upstream_registry_url == each.value.upstream
      error_message = "The ECR pull-through cache rule ${self.ecr_repository_prefix} caches ${self.upstream_registry_url}, not ${each.value.upstream}, which ecr_pull_through_cache_upstreams rewrites ${each.value.match} to: set ecr_pull_through_cache_prefix to the prefix of the pull-through cache root's rules (docs/deploy.md, \"Image rewriting\")."
    }
  }
}

# Installs made before the rules had their own root created them here. An apply now drops them
# from this state and leaves them in the registry, for the pull-through cache root to adopt
# (its adopt_existing_rules).
removed {
  from = aws_ecr_pull_through_cache_rule.upstream

  lifecycle {
    destroy = false
  }
}
