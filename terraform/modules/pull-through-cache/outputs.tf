output "upstreams" {
  description = "The upstreams cached: the installs' ecr_pull_through_cache_upstreams (or some of them)."
  value       = var.upstreams
}

output "prefix" {
  description = "The installs' ecr_pull_through_cache_prefix."
  value       = var.prefix
}

output "repository_prefixes" {
  description = "ECR repository prefix of each rule, by upstream (the nodes' pull permission must cover these repositories)."
  value       = { for u, r in aws_ecr_pull_through_cache_rule.upstream : u => r.ecr_repository_prefix }
}

output "registry" {
  description = "The registry the rules belong to (<account>.dkr.ecr.<region>.<DNS suffix>): the host of every rewritten image."
  value       = "${data.aws_caller_identity.current.account_id}.dkr.ecr.${data.aws_region.current.id}.${data.aws_partition.current.dns_suffix}"
}
