# Alternative endpoint: API Gateway HTTP API on a custom domain. It is reachable from the
# internet, and EKS cannot make the API server authenticate to a webhook, so the only thing
# between a stranger and the secrets the function can read is the path token. HTTP APIs accept
# neither resource policies nor WAF; throttling bounds what guessing can cost.

locals {
  routes = concat(module.webhook_config.paths, ["/healthz"])

  # "{token}" is a path parameter, not the token: the token never appears in the API's
  # configuration or in access logs ($context.routeKey), and the function compares it in
  # constant time, answering 404 when it is wrong.
  api_routes = {
    for p in local.routes : "${p == "/healthz" ? "GET" : "POST"} /{token}${p}" => p
  }
}

resource "random_password" "path_token" {
  count = local.use_api ? 1 : 0

  # Letters and digits only: one URL path segment, as the function's token check requires.
  length  = 48
  special = false
}

resource "aws_secretsmanager_secret" "path_token" {
  count = local.use_api ? 1 : 0

  name_prefix             = "${var.name}-path-token-"
  description             = "podmutator: secret first path segment of the webhook URL; read by the function at cold start"
  recovery_window_in_days = 7
  tags                    = var.tags

  #checkov:skip=CKV2_AWS_57:The token is also in the MutatingWebhookConfiguration; rotate it with `terraform apply -replace=random_password.path_token[0]`, which updates both together.
  #checkov:skip=CKV_AWS_149:The aws/secretsmanager key protects a routing token; a customer key would add key-policy management and no isolation, since the function role is the only reader.
}

resource "aws_secretsmanager_secret_version" "path_token" {
  count = local.use_api ? 1 : 0

  secret_id     = aws_secretsmanager_secret.path_token[0].id
  secret_string = random_password.path_token[0].result
}

resource "aws_apigatewayv2_api" "this" {
  count = local.use_api ? 1 : 0

  name          = var.name
  description   = "podmutator admission webhook"
  protocol_type = "HTTP"
  tags          = var.tags

  # Only the custom domain, with its TLS 1.2 policy and certificate, serves the API.
  disable_execute_api_endpoint = true
}

resource "aws_apigatewayv2_integration" "function" {
  count = local.use_api ? 1 : 0

  api_id                 = aws_apigatewayv2_api.this[0].id
  integration_type       = "AWS_PROXY"
  integration_uri        = aws_lambda_function.this.invoke_arn
  payload_format_version = "2.0"
  # One second past the Lambda timeout, so the function's own timeout answer wins.
  timeout_milliseconds = min(30000, (var.lambda_timeout_seconds + 1) * 1000)
}

resource "aws_apigatewayv2_route" "routes" {
  for_each = local.use_api ? local.api_routes : {}

  api_id    = aws_apigatewayv2_api.this[0].id
  route_key = each.key
  target    = "integrations/${aws_apigatewayv2_integration.function[0].id}"

  # The API server cannot present credentials; the path token is checked by the function.
  authorization_type = "NONE"

  #checkov:skip=CKV_AWS_309:EKS cannot make the API server authenticate to a webhook; the secret path token, checked in constant time by the function, takes the authorizer's place.
}

resource "aws_cloudwatch_log_group" "api_access" {
  count = local.use_api ? 1 : 0

  name              = "/aws/apigateway/${var.name}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_kms_key_arn
  tags              = var.tags
}

resource "aws_apigatewayv2_stage" "default" {
  count = local.use_api ? 1 : 0

  api_id      = aws_apigatewayv2_api.this[0].id
  name        = "$default"
  auto_deploy = true
  tags        = var.tags

  default_route_settings {
    throttling_burst_limit   = var.api_throttling_burst_limit
    throttling_rate_limit    = var.api_throttling_rate_limit
    detailed_metrics_enabled = true
  }

  # No $context.path: it contains the token.
  access_log_settings {
    destination_arn = aws_cloudwatch_log_group.api_access[0].arn
    format = jsonencode({
      requestId          = "$context.requestId"
      sourceIp           = "$context.identity.sourceIp"
      routeKey           = "$context.routeKey"
      status             = "$context.status"
      responseLength     = "$context.responseLength"
      integrationLatency = "$context.integrationLatency"
      integrationError   = "$context.integrationErrorMessage"
      requestTime        = "$context.requestTime"
    })
  }
}

resource "aws_apigatewayv2_domain_name" "this" {
  count = local.use_api ? 1 : 0

  domain_name = var.domain_name
  tags        = var.tags

  domain_name_configuration {
    certificate_arn = local.certificate_arn
    endpoint_type   = "REGIONAL"
    security_policy = "TLS_1_2"
  }
}

resource "aws_apigatewayv2_api_mapping" "this" {
  count = local.use_api ? 1 : 0

  api_id      = aws_apigatewayv2_api.this[0].id
  domain_name = aws_apigatewayv2_domain_name.this[0].id
  stage       = aws_apigatewayv2_stage.default[0].id
}

resource "aws_lambda_permission" "api" {
  count = local.use_api ? 1 : 0

  statement_id  = "AllowInvokeFromHttpApi"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this.function_name
  principal     = "apigateway.amazonaws.com"
  source_arn    = "${aws_apigatewayv2_api.this[0].execution_arn}/*"
}
