# The path token: the first segment of every webhook URL, on every endpoint, on by default. The
# function checks it (against local.path_token_sha256) before it reads a body.
#
# Generated without the random provider, and never printed: the ephemeral
# aws_secretsmanager_random_password (Secrets Manager's GetRandomPassword) is written into the
# secret through the write-only secret_string_wo, so neither a plan nor the version resource
# holds it. (The data source of the same name would not do: it draws a new value on every
# plan, and Terraform prints its ID, which is the password, in the plan's log.) The stored value
# is read back by the data source below, whose value is sensitive; it is the only copy
# Terraform keeps (in state, as the registration needs it).
#
# Rotate: raise path_token_version and apply (docs/deploy.md, "Rotate the path token").

ephemeral "aws_secretsmanager_random_password" "path_token" {
  count = var.path_token_enabled ? 1 : 0

  # Letters and digits only: one URL path segment, as the function's token check requires.
  password_length     = 48
  exclude_punctuation = true
  include_space       = false
}

resource "aws_secretsmanager_secret" "path_token" {
  count = var.path_token_enabled ? 1 : 0

  name_prefix             = "${var.name}-path-token-"
  description             = "podmutator: secret first path segment of the webhook URL, for operators and the registration; the function holds only its SHA-256"
  kms_key_id              = var.path_token_kms_key_arn
  recovery_window_in_days = 7
  tags                    = var.tags

  #checkov:skip=CKV2_AWS_57:The token is also in the MutatingWebhookConfiguration and its hash in the function; rotate all three together by raising path_token_version (docs/deploy.md).
  #checkov:skip=CKV_AWS_149:path_token_kms_key_arn selects a customer key; the default aws/secretsmanager key protects a routing token that only operators and Terraform read (the function has no access).
}

resource "aws_secretsmanager_secret_version" "path_token" {
  count = var.path_token_enabled ? 1 : 0

  secret_id                = aws_secretsmanager_secret.path_token[0].id
  secret_string_wo         = ephemeral.aws_secretsmanager_random_password.path_token[0].random_password
  secret_string_wo_version = var.path_token_version
}

data "aws_secretsmanager_secret_version" "path_token" {
  count = var.path_token_enabled ? 1 : 0

  secret_id  = aws_secretsmanager_secret.path_token[0].id
  version_id = aws_secretsmanager_secret_version.path_token[0].version_id
}

locals {
  path_token = var.path_token_enabled ? data.aws_secretsmanager_secret_version.path_token[0].secret_string : null
}
