# Alternative endpoint: API Gateway HTTP API on a custom domain. It is reachable from the
# internet, and EKS cannot make the API server authenticate to a webhook, so the only thing
# between a stranger and the secrets the function can read is the path token. HTTP APIs accept
# neither resource policies nor WAF.

locals {
  routes = concat(module.webhook_config.paths, ["/healthz"])

  # "{token}" is a path parameter, not the token: the token never appears in the API's
  # configuration or in access logs ($context.routeKey). Without the token the routes are the
  # paths themselves; while the token turns on (accept_plain_paths), both.
  api_routes = merge(
    { for p in local.routes : "${p == "/healthz" ? "GET" : "POST"} ${var.path_token_enabled ? "/{token}" : ""}${p}" => p },
    { for p in local.routes : "${p == "/healthz" ? "GET" : "POST"} ${p}" => p if var.accept_plain_paths },
  )

  # Below the registered timeoutSeconds, so the API server always gets the gateway's answer (or
  # the function's) before it gives up itself, and one second past the Lambda timeout, so the
  # function's own timeout answer wins over the gateway's.
  api_integration_timeout_ms = min(30000, (var.lambda_timeout_seconds + 1) * 1000)
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
  integration_uri        = aws_lambda_alias.live.invoke_arn
  payload_format_version = "2.0"
  timeout_milliseconds   = local.api_integration_timeout_ms

  lifecycle {
    precondition {
      condition     = local.api_integration_timeout_ms < module.webhook_config.min_timeout_seconds * 1000
      error_message = "The HTTP API integration timeout (Lambda timeout + 1 s) must stay below the webhooks' timeoutSeconds."
    }
  }
}

resource "aws_apigatewayv2_route" "routes" {
  for_each = local.use_api ? local.api_routes : {}

  api_id    = aws_apigatewayv2_api.this[0].id
  route_key = each.key
  target    = "integrations/${aws_apigatewayv2_integration.function[0].id}"

  # The API server cannot present credentials; the path token is checked by the function.
  authorization_type = "NONE"

  #checkov:skip=CKV_AWS_309:EKS cannot make the API server authenticate to a webhook; the secret path token, checked by the function before it reads the body, takes the authorizer's place.
}

resource "aws_cloudwatch_log_group" "api_access" {
  count = local.use_api ? 1 : 0

  # Kept on destroy, so one per install, like the function's (function.tf).
  name_prefix       = "/aws/apigateway/${var.name}-"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.log_kms_key_arn
  skip_destroy      = var.retain_log_groups
  tags              = var.tags

  #checkov:skip=CKV_AWS_158:log_kms_key_arn selects a customer key; by default CloudWatch Logs encrypts the lines (route keys and status codes, never the token) with its own key.
}

resource "aws_apigatewayv2_stage" "default" {
  count = local.use_api ? 1 : 0

  api_id      = aws_apigatewayv2_api.this[0].id
  name        = "$default"
  auto_deploy = true
  tags        = var.tags

  # Sized for pod creation bursts (a Flyte fan-out makes up to three webhook calls per pod): a
  # 429 under failurePolicy Fail is a rejected pod. Throttling does nothing against guessing a
  # 285-bit token; the 4xx alarm watches for it.
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
  qualifier     = aws_lambda_alias.live.name
  principal     = "apigateway.amazonaws.com"
  source_arn    = "${aws_apigatewayv2_api.this[0].execution_arn}/*"
}
