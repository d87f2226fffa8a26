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
# Rotate: raise path_token_version and apply (docs/deploy.md, "Rotating the path token").
#
# The version only goes up. secret_string_wo_version draws and stores a new token whenever it
# changes, in either direction: an apply run without the raised version (a forgotten `-var`, an
# old tfvars) would rotate again in one step, with no previous hash, and the API server's calls
# would fail until the registration moved. So the applied version is recorded as a tag of the
# secret, and every plan reads it back from Secrets Manager, before anything changes, through
# data sources that need no resource of this module (the list is empty on a first install, or
# after the token was turned off: nothing to compare with then). A lower version is refused by
# the precondition on the secret version, at plan time. State cannot serve here: a configuration
# cannot read the prior state of its own resources, and Terraform has no monotonic value.

ephemeral "aws_secretsmanager_random_password" "path_token" {
  count = var.path_token_enabled ? 1 : 0

  # Letters and digits only: one URL path segment, as the function's token check requires.
  password_length     = 48
  exclude_punctuation = true
  include_space       = false
}

locals {
  path_token_name_prefix = "${var.name}-path-token-"
  # The tag that records the applied path_token_version on the token's secret.
  path_token_version_tag = "podmutator:path-token-version"
}

# The version recorded by the last apply: this install's token secret, if it exists (ListSecrets
# leaves out secrets scheduled for deletion, so a reinstall starts again from nothing). The
# name filter matches prefixes, so another install whose name begins with this one's is
# dropped below by the shape of the generated suffix (digits and letters, no '-').
data "aws_secretsmanager_secrets" "path_token" {
  count = var.path_token_enabled ? 1 : 0

  filter {
    name   = "name"
    values = [local.path_token_name_prefix]
  }
  filter {
    name   = "tag-key"
    values = [local.path_token_version_tag]
  }
}

data "aws_secretsmanager_secret" "path_token_recorded" {
  for_each = var.path_token_enabled ? data.aws_secretsmanager_secrets.path_token[0].arns : toset([])

  arn = each.value
}

locals {
  recorded_path_token_versions = [
    for s in data.aws_secretsmanager_secret.path_token_recorded : tonumber(s.tags[local.path_token_version_tag])
    if can(regex("^[0-9A-Za-z]+$", trimprefix(s.name, local.path_token_name_prefix))) && can(tonumber(s.tags[local.path_token_version_tag]))
  ]
  # 0 when nothing is recorded (a first install).
  recorded_path_token_version = max(0, local.recorded_path_token_versions...)
}

resource "aws_secretsmanager_secret" "path_token" {
  count = var.path_token_enabled ? 1 : 0

  name_prefix             = local.path_token_name_prefix
  description             = "podmutator: secret first path segment of the webhook URL, for operators and the registration; the function holds only its SHA-256"
  kms_key_id              = var.path_token_kms_key_arn
  recovery_window_in_days = 7
  # The applied path_token_version, which the next plan reads back (above).
  tags = merge(var.tags, { (local.path_token_version_tag) = tostring(var.path_token_version) })

  #checkov:skip=CKV2_AWS_57:The token is also in the MutatingWebhookConfiguration and its hash in the function; rotate all three together by raising path_token_version (docs/deploy.md).
  #checkov:skip=CKV_AWS_149:path_token_kms_key_arn selects a customer key; the default aws/secretsmanager key protects a routing token that only operators and Terraform read (the function has no access).
}

resource "aws_secretsmanager_secret_version" "path_token" {
  count = var.path_token_enabled ? 1 : 0

  secret_id                = aws_secretsmanager_secret.path_token[0].id
  secret_string_wo         = ephemeral.aws_secretsmanager_random_password.path_token[0].random_password
  secret_string_wo_version = var.path_token_version

  lifecycle {
    precondition {
      condition     = var.path_token_version >= local.recorded_path_token_version
      error_message = "path_token_version is ${var.path_token_version}, lower than ${local.recorded_path_token_version}, the version applied last (tag ${local.path_token_version_tag} of the token's secret). A lower version would draw a new token in one step, without the previous one's hash, and the API server's calls would fail until the registration moved: nothing was changed. Set path_token_version = ${local.recorded_path_token_version} in terraform.tfvars (where it stays between applies), or raise it above ${local.recorded_path_token_version} to rotate (docs/deploy.md, \"Rotating the path token\")."
    }
  }
}

data "aws_secretsmanager_secret_version" "path_token" {
  count = var.path_token_enabled ? 1 : 0

  secret_id  = aws_secretsmanager_secret.path_token[0].id
  version_id = aws_secretsmanager_secret_version.path_token[0].version_id
}

locals {
  path_token = var.path_token_enabled ? data.aws_secretsmanager_secret_version.path_token[0].secret_string : null
}
