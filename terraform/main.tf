data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

locals {
  use_alb = var.endpoint == "alb"
  use_api = var.endpoint == "http_api"

  secrets_region = coalesce(var.secrets_region, data.aws_region.current.name)

  # Secret ARNs end in a random six-character suffix; the trailing "__" keeps org "flyte" from
  # matching org "flyte2".
  scoped_secrets_arn = "arn:${data.aws_partition.current.partition}:secretsmanager:${local.secrets_region}:${data.aws_caller_identity.current.account_id}:secret:u__org__${var.secret_org}__*"

  function_config = {
    webhook = merge(var.webhook_config, {
      embeddedSecretManagerConfig = merge(
        { type = "AWS" },
        try(var.webhook_config.embeddedSecretManagerConfig, {}),
        { awsConfig = { region = local.secrets_region } },
      )
    })
    http = merge(
      { maxBodyBytes = var.max_body_bytes },
      { for k, v in { pathTokenSecretId = one(aws_secretsmanager_secret.path_token[*].arn) } : k => v if v != null },
    )
    embedded = merge(
      {
        deadlineMs        = var.embedded_deadline_ms
        cacheTtlSeconds   = var.embedded_cache_ttl_seconds
        namespaceTemplate = var.namespace_template
      },
      { for k, v in { allowedUsernames = var.allowed_usernames } : k => v if length(v) > 0 },
    )
    # The label the mutators set and read must be the one the registration selects on.
    mesh = merge(var.mesh_config, { enabled = var.mesh_enabled, managedLabel = var.mesh_label_key })
  }
}

module "webhook_config" {
  source = "./modules/webhook-config"

  registration_json = file("${path.module}/registration.json")
  url               = "https://${var.domain_name}"
  path_token        = one(random_password.path_token[*].result)
  ca_bundle_pem     = var.ca_bundle_pem
  mesh_enabled      = var.mesh_enabled
  mesh_label_key    = var.mesh_label_key
  failure_policy    = var.failure_policy
  timeout_seconds   = var.timeout_seconds
  name              = var.webhook_configuration_name
}
