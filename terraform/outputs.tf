output "webhook_url" {
  description = "URL of the secrets webhook (/mutate--v1-pod). With http_api it contains the path token."
  value       = module.webhook_config.manifest.webhooks[0].clientConfig.url
  sensitive   = true
}

output "webhook_base_url" {
  description = "Base URL to give `podmutator webhook-config --url` (with --path-token-file for http_api)."
  value       = "https://${var.domain_name}"
}

output "routes" {
  description = "Paths the endpoint forwards to the function (after the path token, for http_api)."
  value       = local.routes
}

output "mutating_webhook_configuration" {
  description = "The registration as an object; yamlencode it for GitOps when register_webhook is false."
  value       = module.webhook_config.manifest
  sensitive   = true
}

output "function_name" {
  description = "Lambda function name."
  value       = aws_lambda_function.this.function_name
}

output "function_arn" {
  description = "Lambda function ARN."
  value       = aws_lambda_function.this.arn
}

output "function_role_arn" {
  description = "Role of the function: what it can read is what a caller of the endpoint could obtain."
  value       = aws_iam_role.function.arn
}

output "log_group_name" {
  description = "Function log group."
  value       = aws_cloudwatch_log_group.function.name
}

output "alb_arn" {
  description = "Internal ALB (alb)."
  value       = one(aws_lb.this[*].arn)
}

output "alb_security_group_id" {
  description = "Security group of the internal ALB (alb)."
  value       = one(aws_security_group.alb[*].id)
}

output "path_token_secret_arn" {
  description = "Secrets Manager secret holding the path token (http_api)."
  value       = one(aws_secretsmanager_secret.path_token[*].arn)
}
