output "registration" {
  description = "Everything modules/registration needs, as one object: base URL, path token (sensitive), mesh switch and label, timeoutSeconds, the image entries' selectors, and whether alb_deletion_protection guards the install."
  sensitive   = true
  value = {
    url             = "https://${var.domain_name}"
    path_token      = local.path_token
    mesh_enabled    = var.mesh_enabled
    mesh_label_key  = var.mesh_label_key
    timeout_seconds = var.timeout_seconds

    image_builder_object_selector = local.image_builder_selector
    images_enabled                = local.images_enabled
    images_pod_selector           = try(var.images_config.podSelector, null)
    images_namespace_selector     = try(var.images_config.namespaceSelector, null)

    # alb_deletion_protection reaches the registration's own guard: it is deleted before
    # anything here, so the refusal must come from there too (alb.tf, deletion_guard).
    deletion_protection = local.use_alb && var.alb_deletion_protection
  }
}

output "ecr_pull_through_cache_prefixes" {
  description = "ECR repository prefix of each pull-through cache rule the images rules rewrite to, by upstream (the nodes' pull permission must cover these repositories)."
  value       = { for k, rule in data.aws_ecr_pull_through_cache_rule.upstream : k => rule.ecr_repository_prefix }
}

output "webhook_base_url" {
  description = "https://<domain_name>, for `podmutator webhook-config --url` (with --path-token-file)."
  value       = "https://${var.domain_name}"
}

output "routes" {
  description = "Paths the function serves (after the path token)."
  value       = local.routes
}

output "path_token_enabled" {
  description = "Whether every route sits behind the path token."
  value       = var.path_token_enabled
}

output "path_token_secret_arn" {
  description = "Secrets Manager secret holding the path token (for operators and `podmutator webhook-config --path-token-file`); null without a token."
  value       = one(aws_secretsmanager_secret.path_token[*].arn)
}

output "path_token_version" {
  description = "The path_token_version applied (recorded on the token's secret; a plan with a lower one is refused); null without a token. A rotation sets this plus one."
  value       = var.path_token_enabled ? var.path_token_version : null
}

output "path_token_sha256" {
  description = "SHA-256 (hex) of the path token, as the function holds it; null without a token."
  value       = local.path_token_sha256
}

output "function_name" {
  description = "Lambda function name."
  value       = aws_lambda_function.this.function_name
}

output "function_arn" {
  description = "Lambda function ARN (unqualified)."
  value       = aws_lambda_function.this.arn
}

output "function_version" {
  description = "Version the `live` alias points at."
  value       = aws_lambda_alias.live.function_version
}

output "alias_arn" {
  description = "ARN of the `live` alias, which the endpoint invokes."
  value       = aws_lambda_alias.live.arn
}

output "function_role_arn" {
  description = "Role of the function: what it can read is what a caller of the endpoint could obtain."
  value       = aws_iam_role.function.arn
}

output "log_group_name" {
  description = "Function log group (kept on destroy unless retain_log_groups is false)."
  value       = aws_cloudwatch_log_group.function.name
}

output "dns_target_name" {
  description = "Name domain_name must alias to, for DNS managed elsewhere: the ALB's DNS name or the API domain's target domain name."
  value       = local.dns_target_name
}

output "dns_target_zone_id" {
  description = "Hosted zone ID of dns_target_name, for an alias record."
  value       = local.dns_target_zone
}

output "certificate_arn" {
  description = "Certificate the endpoint serves."
  value       = local.certificate_arn
}

output "alb_arn" {
  description = "Internal ALB (alb)."
  value       = one(aws_lb.this[*].arn)
}

output "alb_security_group_id" {
  description = "Security group of the internal ALB (alb)."
  value       = one(aws_security_group.alb[*].id)
}

output "target_group_arn" {
  description = "Target group of the function (alb); the ALB invoke permission's SourceArn."
  value       = one(aws_lb_target_group.function[*].arn)
}

output "api_id" {
  description = "HTTP API (http_api)."
  value       = one(aws_apigatewayv2_api.this[*].id)
}

output "alarm_names" {
  description = "CloudWatch alarms created (alarms_enabled)."
  value       = concat([for a in aws_cloudwatch_metric_alarm.this : a.alarm_name], aws_cloudwatch_metric_alarm.secrets_manager_throttles[*].alarm_name, aws_cloudwatch_metric_alarm.path_token_refusals[*].alarm_name)
}

output "dashboard_name" {
  description = "CloudWatch dashboard (dashboard_enabled)."
  value       = one(aws_cloudwatch_dashboard.this[*].dashboard_name)
}
