# ECR pull-through caches and the images rules that send pods to them (docs/images.md). The
# nodes pull from the cache with their own role; docs/deploy.md, "Image rewriting", lists the
# permissions that needs.

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

# Pull-through cache rules belong to the registry, i.e. to the account and region, and an
# upstream's prefix can have only one: a second install in the same account and region (another
# cluster) sets create_ecr_pull_through_cache_rules = false and rewrites to the first one's.
resource "aws_ecr_pull_through_cache_rule" "upstream" {
  for_each = var.create_ecr_pull_through_cache_rules ? local.pull_through : {}

  ecr_repository_prefix = "${var.ecr_pull_through_cache_prefix}${each.key}"
  upstream_registry_url = each.value.upstream
  credential_arn        = lookup(var.ecr_pull_through_cache_credential_arns, each.key, null)
}
