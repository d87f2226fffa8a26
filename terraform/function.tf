resource "aws_cloudwatch_log_group" "function" {
  name              = "/aws/lambda/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_kms_key_arn
  tags              = var.tags
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

resource "aws_iam_role" "function" {
  name               = "${var.name}-function"
  assume_role_policy = data.aws_iam_policy_document.assume.json
  tags               = var.tags
}

data "aws_iam_policy_document" "function" {
  # No logs:CreateLogGroup: the group above exists first, with its retention.
  statement {
    sid       = "WriteOwnLogs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.function.arn}:*"]
  }

  # The only secrets the function can read are those of the configured organisation.
  statement {
    sid       = "ReadOrgSecrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = [local.scoped_secrets_arn]
  }

  # BatchGetSecretValue has no resource type in IAM: it is granted on "*" or not at all. It
  # returns only the secrets the caller may also GetSecretValue (authorised per secret, above);
  # the rest come back as per-secret AccessDenied errors. The function names secrets by id, so
  # it needs no ListSecrets (required only for filters).
  statement {
    sid       = "BatchReadSecrets"
    actions   = ["secretsmanager:BatchGetSecretValue"]
    resources = ["*"]
  }

  dynamic "statement" {
    for_each = var.secrets_kms_key_arn == null ? [] : [var.secrets_kms_key_arn]
    content {
      sid       = "DecryptSecretsThroughSecretsManager"
      actions   = ["kms:Decrypt"]
      resources = [statement.value]
      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["secretsmanager.${local.secrets_region}.amazonaws.com"]
      }
    }
  }

  dynamic "statement" {
    for_each = aws_secretsmanager_secret.path_token[*].arn
    content {
      sid       = "ReadPathToken"
      actions   = ["secretsmanager:GetSecretValue"]
      resources = [statement.value]
    }
  }
}

resource "aws_iam_role_policy" "function" {
  name   = "podmutator"
  role   = aws_iam_role.function.id
  policy = data.aws_iam_policy_document.function.json
}

resource "aws_lambda_function" "this" {
  function_name    = var.name
  description      = "podmutator: Kubernetes pod-mutating admission webhook"
  role             = aws_iam_role.function.arn
  filename         = var.lambda_zip_path
  source_code_hash = filebase64sha256(var.lambda_zip_path)
  handler          = "bootstrap"
  runtime          = "provided.al2023"
  architectures    = ["arm64"]
  memory_size      = var.memory_size
  timeout          = var.lambda_timeout_seconds

  reserved_concurrent_executions = var.reserved_concurrent_executions

  environment {
    variables = merge(
      { PODMUTATOR_CONFIG = jsonencode(local.function_config) },
      # The function reads the path token once, at cold start. This value changes with the token,
      # so rotating it replaces the warm instances that still hold the old one.
      { for k, v in { PODMUTATOR_PATH_TOKEN_VERSION = one(aws_secretsmanager_secret_version.path_token[*].version_id) } : k => v if v != null },
    )
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
    precondition {
      condition     = var.lambda_timeout_seconds < module.webhook_config.min_timeout_seconds
      error_message = "lambda_timeout_seconds must be below the webhooks' timeoutSeconds, or the API server gives up before the function can answer."
    }
  }

  # The policy must exist before the first invocation writes logs or reads the path token.
  depends_on = [aws_iam_role_policy.function]

  #checkov:skip=CKV_AWS_116:Invoked synchronously by the ALB or API Gateway; a dead-letter queue only receives failed asynchronous invocations.
  #checkov:skip=CKV_AWS_117:The function calls only Secrets Manager over its public endpoint; a VPC attachment adds ENI and NAT or endpoint costs and a failure mode without narrowing what it can reach.
  #checkov:skip=CKV_AWS_173:The environment holds configuration only; the path token stays in Secrets Manager and is read at start.
  #checkov:skip=CKV_AWS_272:Code signing needs an AWS Signer profile the deployer owns; the artefact is built from source by the same pipeline that applies this module.
  #checkov:skip=CKV_AWS_50:One structured log line and EMF metrics per admission cover tracing needs; X-Ray would add xray:Put* on "*" to the role.
}
