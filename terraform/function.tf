# Log groups outlive `terraform destroy` (skip_destroy): they are the audit trail of every
# admission. Each install therefore gets its own group, /aws/lambda/<name>-<generated suffix>
# (output log_group_name), and a reinstall under the same name starts a new one beside the kept
# ones instead of failing on ResourceAlreadyExists (docs/deploy.md, "Removal and reinstall").
resource "aws_cloudwatch_log_group" "function" {
  name_prefix       = "/aws/lambda/${var.name}-"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_kms_key_arn
  skip_destroy      = var.retain_log_groups
  tags              = var.tags

  #checkov:skip=CKV_AWS_158:log_kms_key_arn selects a customer key; by default CloudWatch Logs encrypts the lines (admission decisions, never secret values) with its own key.
}

data "aws_iam_policy_document" "assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["lambda.amazonaws.com"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [data.aws_caller_identity.current.account_id]
    }
  }
}

# name_prefix: IAM names are global to the account, and a second deployment (another region or
# cluster) must not collide with the first.
resource "aws_iam_role" "function" {
  name_prefix          = substr("${var.name}-fn-", 0, 38)
  path                 = var.iam_role_path
  permissions_boundary = var.permissions_boundary_arn
  assume_role_policy   = data.aws_iam_policy_document.assume.json
  tags                 = var.tags

  lifecycle {
    create_before_destroy = true
  }
}

data "aws_iam_policy_document" "function" {
  # No logs:CreateLogGroup: the group above exists first, with its retention.
  statement {
    sid       = "WriteOwnLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.function.arn}:*"]
  }

  # The only secrets the function can read are those of the configured organisation, and only
  # when it delivers values (local.reads_values): in reference delivery it has no value-reading
  # action at all.
  dynamic "statement" {
    for_each = local.reads_values ? [1] : []
    content {
      sid       = "ReadOrgSecrets"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = [local.scoped_secrets_arn]
    }
  }

  # BatchGetSecretValue has no resource type in IAM: it is granted on "*" or not at all. It
  # returns only the secrets the caller may also GetSecretValue (authorised per secret, above);
  # the rest come back as per-secret AccessDenied errors. The function names secrets by id, so
  # it needs no ListSecrets (required only for filters).
  dynamic "statement" {
    for_each = local.reads_values ? [1] : []
    content {
      sid       = "BatchReadSecrets"
      actions   = ["secretsmanager:BatchGetSecretValue"]
      resources = ["*"]
    }
  }

  # Reference delivery resolves which scope name exists with DescribeSecret: metadata (name,
  # ARN, dates), never a value, on the organisation's names only. ListSecrets would need "*"
  # and would list every secret name in the account.
  dynamic "statement" {
    for_each = local.resolves_refs ? [1] : []
    content {
      sid       = "DescribeOrgSecrets"
      actions   = ["secretsmanager:DescribeSecret"]
      resources = [local.scoped_secrets_arn]
    }
  }

  # The ENTRYPOINT lookup reads task images on ECR with the function's role: a registry token
  # (GetAuthorizationToken has no resource type in IAM: "*" or nothing; the token reads only
  # what the next statement allows), then manifests and config blobs of the listed
  # repositories only.
  dynamic "statement" {
    for_each = length(var.entrypoint_ecr_repository_arns) > 0 ? [1] : []
    content {
      sid       = "EcrAuthorizationToken"
      actions   = ["ecr:GetAuthorizationToken"]
      resources = ["*"]
    }
  }

  dynamic "statement" {
    for_each = length(var.entrypoint_ecr_repository_arns) > 0 ? [1] : []
    content {
      sid       = "EcrReadTaskImages"
      actions   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
      resources = var.entrypoint_ecr_repository_arns
    }
  }

  # Decrypting is reading: only with values (DescribeSecret needs no key).
  dynamic "statement" {
    for_each = var.secrets_kms_key_arn == null || !local.reads_values ? [] : [var.secrets_kms_key_arn]
    content {
      sid       = "DecryptSecretsThroughSecretsManager"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]
      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["secretsmanager.${local.secrets_region}.${data.aws_partition.current.dns_suffix}"]
      }
    }
  }

  # No statement for the path token: the function holds its hash and never reads the secret.
}

resource "aws_iam_role_policy" "function" {
  name   = "podmutator"
  role   = aws_iam_role.function.id
  policy = data.aws_iam_policy_document.function.json
}

locals {
  use_s3_artefact = var.lambda_s3_bucket != null

  function_environment = { PODMUTATOR_CONFIG = jsonencode(local.function_config) }

  # Lambda refuses an environment over 4 KB (its variables as one JSON object) at CreateFunction
  # or UpdateFunctionConfiguration, i.e. in the middle of an apply. The size is measured at plan
  # time instead, on the same environment with the token's hash (unknown until the token is
  # stored, always 64 hex digits) replaced by a placeholder of the same length.
  environment_probe = jsonencode(merge(local.function_environment, {
    PODMUTATOR_CONFIG = jsonencode(merge(local.function_config, {
      http = merge({ maxBodyBytes = var.max_body_bytes }, local.path_token_http_variants[1])
    }))
  }))
  # Bytes, not characters (length() counts characters): from the length of the base64 form.
  environment_probe_b64 = base64encode(local.environment_probe)
  environment_bytes     = length(local.environment_probe_b64) / 4 * 3 - (length(local.environment_probe_b64) - length(trimsuffix(trimsuffix(local.environment_probe_b64, "="), "=")))
}

resource "aws_lambda_function" "this" {
  function_name = var.name
  description   = "podmutator: Kubernetes pod-mutating admission webhook"
  role          = aws_iam_role.function.arn

  # The artefact is named, and its hash given, by variables: nothing is read at plan time, so
  # `terraform destroy` and an incident apply work on a machine without the zip, and a rebuilt
  # zip is deployed only when its hash is passed on purpose.
  filename          = local.use_s3_artefact ? null : var.lambda_zip_path
  s3_bucket         = var.lambda_s3_bucket
  s3_key            = var.lambda_s3_key
  s3_object_version = var.lambda_s3_object_version
  source_code_hash  = var.lambda_zip_base64sha256

  handler       = "bootstrap"
  runtime       = "provided.al2023"
  architectures = [var.architecture]
  memory_size   = var.memory_size
  timeout       = var.lambda_timeout_seconds
  kms_key_arn   = var.environment_kms_key_arn

  # Versions are published; the endpoint invokes the `live` alias (alias.tf), so a rollback is
  # an alias move and provisioned concurrency can be attached to it.
  publish = true

  # -1 by default: nothing reserved, so the install claims none of the account's regional
  # limit and cannot make another install's apply fail. A reservation guarantees admissions
  # against the account's other functions; docs/scale.md says how to size it.
  reserved_concurrent_executions = var.reserved_concurrent_executions

  environment {
    variables = local.function_environment
  }

  logging_config {
    # The function already writes JSON lines with a "level"; JSON format lets Lambda filter them
    # and keeps the platform's REPORT lines (init duration, memory) machine-readable.
    log_format            = "JSON"
    log_group             = aws_cloudwatch_log_group.function.name
    application_log_level = "INFO"
    system_log_level      = "INFO"
  }

  tags = var.tags

  lifecycle {
    # What Lambda stored is what the hash variable names: a zip that is not the one hashed (a
    # rebuild, a wrong path or S3 object) fails the apply here, before the `live` alias moves
    # to the version holding it. A plan that changes the code keeps the old code_sha256 (the
    # AWS provider marks only `version` and what follows from it unknown), so the check waits
    # for the version Lambda publishes: unknown while planned, the condition is checked once
    # applied, against the code Lambda stored.
    postcondition {
      condition     = self.code_sha256 == var.lambda_zip_base64sha256 || self.version == null
      error_message = "The uploaded code's SHA-256 (${self.code_sha256}) is not lambda_zip_base64sha256 (${var.lambda_zip_base64sha256}): the zip at lambda_zip_path (or lambda_s3_bucket/lambda_s3_key) is not the artefact whose hash was given. The `live` alias was not moved. Pass the hash of the zip you mean to deploy (scripts/lambda-artefact.sh), or the zip the hash belongs to, and apply again."
    }
    # The same check before anything is uploaded, where the zip is on this machine: a zip that
    # is not the hashed one is refused at plan. (Once uploaded, Lambda's $LATEST would hold code
    # whose hash the state records as the one given, and no later plan would upload again.)
    # Without a file at the path (a machine that has only the state) nothing is read.
    precondition {
      condition     = try(filebase64sha256(var.lambda_zip_path), var.lambda_zip_base64sha256) == var.lambda_zip_base64sha256
      error_message = "The zip at lambda_zip_path (${coalesce(var.lambda_zip_path, "-")}) has the base64 SHA-256 ${try(filebase64sha256(var.lambda_zip_path), "-")}, not lambda_zip_base64sha256 (${var.lambda_zip_base64sha256}): it is not the artefact whose hash was given. Nothing was uploaded and the `live` alias was not moved. Put the artefact the hash names at the path (a rollback: the previous release's zip), or pass this zip's hash to deploy it (scripts/lambda-artefact.sh); to apply without redeploying code, point lambda_zip_path at a path with no file."
    }
    precondition {
      condition     = var.lambda_timeout_seconds < module.webhook_config.min_timeout_seconds
      error_message = "lambda_timeout_seconds must be below the webhooks' timeoutSeconds, or the API server gives up before the function can answer."
    }
    precondition {
      condition     = local.environment_bytes <= 4096
      error_message = "The function's environment (PODMUTATOR_CONFIG, the whole configuration as JSON) would be ${local.environment_bytes} bytes, and Lambda refuses more than 4096 (4 KB) for all variables together. Shorten the configuration: fewer images rules (one per registry or prefix, not per image; the pull-through caches add one each), fewer allowed_usernames, shorter selectors, or remove keys of webhook_config, mesh_config and images_config that restate defaults (docs/deploy.md, \"The 4 KB environment\")."
    }
    precondition {
      condition     = var.previous_path_token_sha256 == null || var.previous_path_token_sha256 != local.path_token_sha256
      error_message = "previous_path_token_sha256 is the current token's hash: raise path_token_version in the same apply to rotate, or set previous_path_token_sha256 = null once the registration uses the new token (docs/deploy.md, \"Rotating the path token\")."
    }
  }

  # The policy must exist before the first invocation writes logs.
  depends_on = [aws_iam_role_policy.function]

  #checkov:skip=CKV_AWS_116:Invoked synchronously by the ALB or API Gateway; a dead-letter queue only receives failed asynchronous invocations.
  #checkov:skip=CKV_AWS_117:The function calls only Secrets Manager over its public endpoint; a VPC attachment adds ENI and NAT or endpoint costs and a failure mode without narrowing what it can reach.
  #checkov:skip=CKV_AWS_173:environment_kms_key_arn selects a customer key; the environment holds configuration and the path token's SHA-256, never the token or a secret.
  #checkov:skip=CKV_AWS_272:Code signing needs an AWS Signer profile the deployer owns; the artefact is built from source by the same pipeline that applies this module.
  #checkov:skip=CKV_AWS_50:One structured log line and EMF metrics per admission cover tracing needs; X-Ray would add xray:Put* on "*" to the role.
}

# The endpoint invokes this alias; it moves to a new version only after that version answered
# pre-traffic.tf's canned review. Rolling back is `aws lambda update-alias --function-version`
# (or an apply of the previous artefact); provisioned concurrency attaches here.
resource "aws_lambda_alias" "live" {
  name             = "live"
  description      = "What the endpoint invokes"
  function_name    = aws_lambda_function.this.function_name
  function_version = aws_lambda_function.this.version

  # Only once the new version has answered the canned review (pre-traffic.tf).
  depends_on = [aws_lambda_invocation.pre_traffic]
}

resource "aws_lambda_provisioned_concurrency_config" "live" {
  count = var.provisioned_concurrency > 0 ? 1 : 0

  function_name                     = aws_lambda_alias.live.function_name
  qualifier                         = aws_lambda_alias.live.name
  provisioned_concurrent_executions = var.provisioned_concurrency
}
