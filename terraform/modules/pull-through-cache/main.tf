# The ECR pull-through cache rules that podmutator's images rules rewrite to (docs/images.md), in
# a root of their own (examples/pull-through-cache). A rule belongs to the account and region's
# registry, one per repository prefix, and every install there (one per cluster) rewrites to
# the same rules: made by an install, they were deleted by that install's destroy while the
# others still sent their pods to them. Apply this before the first install that sets
# ecr_pull_through_cache_upstreams, and destroy it after the last: each install reads the rules
# it rewrites to, and its plan fails while one is missing.
#
# The nodes pull through the caches with their own role; docs/deploy.md, "Image rewriting",
# lists the permissions that needs.

terraform {
  required_version = ">= 1.11"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}

data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

locals {
  # name -> the registry pods name, and the upstream ECR pulls from: the AWS module's
  # pull_through_upstreams (../../images.tf), held equal by tests/iac/check_terraform.py.
  upstreams = {
    "docker-hub" = { match = "docker.io", upstream = "registry-1.docker.io" }
    "quay"       = { match = "quay.io", upstream = "quay.io" }
    "github"     = { match = "ghcr.io", upstream = "ghcr.io" }
    "k8s"        = { match = "registry.k8s.io", upstream = "registry.k8s.io" }
    "ecr-public" = { match = "public.ecr.aws", upstream = "public.ecr.aws" }
  }
}

resource "aws_ecr_pull_through_cache_rule" "upstream" {
  for_each = toset(var.upstreams)

  ecr_repository_prefix = "${var.prefix}${each.key}"
  upstream_registry_url = local.upstreams[each.key].upstream
  credential_arn        = lookup(var.credential_arns, each.key, null)
}
