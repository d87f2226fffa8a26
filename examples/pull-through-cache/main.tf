# The ECR pull-through cache rules of an account and region, in a root of their own: every
# podmutator install there (one per cluster) rewrites images to them (its
# ecr_pull_through_cache_upstreams), and none of them owns them, so destroying one install
# leaves the rules the others pull through (docs/images.md).
#
#   1. Here, before the first install that rewrites to a cache:
#                                   cp terraform.tfvars.example terraform.tfvars  (and edit it)
#                                   terraform init && terraform apply
#   2. In each install (../alb, ../http-api): the same upstreams (or some of them) and prefix
#      in its ecr_pull_through_cache_upstreams and ecr_pull_through_cache_prefix, then apply.
#
# Remove it with `terraform destroy` after the last install that rewrites to it: an install's
# plan fails while a rule it rewrites to is missing. Its state holds no secret (keep it beside
# the installs', e.g. in ../backend-s3's bucket under its own key).

terraform {
  required_version = ">= 1.11"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}

variable "region" {
  description = "Region of the registry (the clusters')."
  type        = string
}

variable "upstreams" {
  description = "Upstreams to cache: any of docker-hub, quay, github, k8s, ecr-public."
  type        = list(string)
}

variable "prefix" {
  description = "Prepended to each upstream's name to form its ECR repository prefix (e.g. \"cache/\")."
  type        = string
  default     = ""
}

variable "credential_arns" {
  description = "Secrets Manager ARNs (secret names starting with ecr-pullthroughcache/) of the upstream credentials, by upstream; docker-hub and github need one."
  type        = map(string)
  default     = {}
}

variable "adopt_existing_rules" {
  description = "Upstreams whose rule exists already, made by an install from before this root (its AWS module created them): the next apply imports them instead of failing on them. Empty once adopted."
  type        = list(string)
  default     = []
}

provider "aws" {
  region = var.region
}

module "pull_through_cache" {
  source = "../../terraform/modules/pull-through-cache"

  upstreams       = var.upstreams
  prefix          = var.prefix
  credential_arns = var.credential_arns
}

import {
  for_each = toset(var.adopt_existing_rules)
  to       = module.pull_through_cache.aws_ecr_pull_through_cache_rule.upstream[each.key]
  id       = "${var.prefix}${each.key}"
}

output "ecr_pull_through_cache_upstreams" {
  description = "For the installs' ecr_pull_through_cache_upstreams."
  value       = module.pull_through_cache.upstreams
}

output "ecr_pull_through_cache_prefix" {
  description = "For the installs' ecr_pull_through_cache_prefix."
  value       = module.pull_through_cache.prefix
}

output "repository_prefixes" {
  description = "ECR repository prefix of each rule, by upstream (the nodes' pull permission must cover these repositories)."
  value       = module.pull_through_cache.repository_prefixes
}
