# Alarms on what breaks admissions, each notifying alarm_topic_arns (none by default: the alarms
# still show in the console and can be wired later). An optional dashboard shows the EMF metrics
# the function writes (namespace metrics_namespace).

locals {
  alarm_actions = var.alarm_topic_arns

  lambda_dimensions = { FunctionName = aws_lambda_function.this.function_name }

  alarms = merge(
    {
      lambda-errors = {
        description = "The function failed (an unhandled error or a timeout): the API server got no usable answer, and under failurePolicy Fail the pod was rejected."
        namespace   = "AWS/Lambda", metric = "Errors", statistic = "Sum", extended = null
        dimensions  = local.lambda_dimensions, threshold = 0
      }
      lambda-throttles = {
        description = "Lambda throttled the function: admissions were refused (429), and under failurePolicy Fail the pods were rejected. Unreserved (reserved_concurrent_executions = -1, the default): the account's unreserved pool ran out, taken by other functions of the account and region, or the burst outran Lambda's scaling rate; reserve concurrency for the function or raise the account's limit. Reserved: the reservation is too small; raise it within the account's limit (docs/scale.md, ClaimedAccountConcurrency)."
        namespace   = "AWS/Lambda", metric = "Throttles", statistic = "Sum", extended = null
        dimensions  = local.lambda_dimensions, threshold = 0
      }
      lambda-duration-p99 = {
        description = "p99 duration is above 80% of the Lambda timeout: slow Secrets Manager calls are about to turn into timeouts."
        namespace   = "AWS/Lambda", metric = "Duration", statistic = null, extended = "p99"
        dimensions  = local.lambda_dimensions, threshold = var.lambda_timeout_seconds * 1000 * 0.8
      }
    },
    local.use_alb ? {
      alb-unhealthy = {
        description = "The ALB's health check of the function fails: the function does not start or does not answer."
        namespace   = "AWS/ApplicationELB", metric = "UnHealthyHostCount", statistic = "Maximum", extended = null
        dimensions  = { LoadBalancer = aws_lb.this[0].arn_suffix, TargetGroup = aws_lb_target_group.function[0].arn_suffix }, threshold = 0
      }
      alb-target-5xx = {
        description = "The function answered 5xx through the ALB (AWS errors, deadline exceeded)."
        namespace   = "AWS/ApplicationELB", metric = "HTTPCode_Target_5XX_Count", statistic = "Sum", extended = null
        dimensions  = { LoadBalancer = aws_lb.this[0].arn_suffix, TargetGroup = aws_lb_target_group.function[0].arn_suffix }, threshold = 0
      }
      alb-elb-5xx = {
        description = "The ALB itself answered 5xx (the function could not be invoked)."
        namespace   = "AWS/ApplicationELB", metric = "HTTPCode_ELB_5XX_Count", statistic = "Sum", extended = null
        dimensions  = { LoadBalancer = aws_lb.this[0].arn_suffix }, threshold = 0
      }
    } : {},
    local.use_api ? {
      api-4xx = {
        description = "Requests refused by the HTTP API or the function's token check (404s) or throttled (429s): someone guessing at the token, or throttling that rejects pods."
        namespace   = "AWS/ApiGateway", metric = "4xx", statistic = "Sum", extended = null
        dimensions  = { ApiId = aws_apigatewayv2_api.this[0].id, Stage = "$default" }, threshold = var.api_4xx_alarm_threshold
      }
      api-5xx = {
        description = "The HTTP API answered 5xx: the function failed or could not be invoked."
        namespace   = "AWS/ApiGateway", metric = "5xx", statistic = "Sum", extended = null
        dimensions  = { ApiId = aws_apigatewayv2_api.this[0].id, Stage = "$default" }, threshold = 0
      }
      api-integration-latency-p99 = {
        description = "p99 integration latency is above 80% of the integration timeout."
        namespace   = "AWS/ApiGateway", metric = "IntegrationLatency", statistic = null, extended = "p99"
        dimensions  = { ApiId = aws_apigatewayv2_api.this[0].id, Stage = "$default" }, threshold = local.api_integration_timeout_ms * 0.8
      }
    } : {},
  )
}

resource "aws_cloudwatch_metric_alarm" "this" {
  for_each = var.alarms_enabled ? local.alarms : {}

  alarm_name          = "${var.name}-${each.key}"
  alarm_description   = each.value.description
  namespace           = each.value.namespace
  metric_name         = each.value.metric
  statistic           = each.value.statistic
  extended_statistic  = each.value.extended
  dimensions          = each.value.dimensions
  period              = 60
  evaluation_periods  = 5
  datapoints_to_alarm = 2
  threshold           = each.value.threshold
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = var.tags
}

# The function's own EMF metric: Secrets Manager answered ThrottlingException (the account's
# BatchGetSecretValue quota is 100/s and cannot be raised). A Metrics Insights query sums it
# over whatever dimensions the function adds (metrics.dimensions).
resource "aws_cloudwatch_metric_alarm" "secrets_manager_throttles" {
  count = var.alarms_enabled ? 1 : 0

  alarm_name          = "${var.name}-secretsmanager-throttles"
  alarm_description   = "Secrets Manager throttled the function's calls: admissions that need a value wait on retries or fail. The quota is shared by the whole account and region."
  evaluation_periods  = 5
  datapoints_to_alarm = 2
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = var.tags

  metric_query {
    id          = "throttles"
    return_data = true
    period      = 60
    expression  = "SELECT SUM(SecretsManagerThrottles) FROM \"${var.metrics_namespace}\""
  }
}

# The function's own EMF metric: requests refused for a missing or unknown path token. Right
# after a rotation it means the API server still calls with the old token (its pods are being
# rejected under failurePolicy Fail); otherwise someone is guessing at the token.
resource "aws_cloudwatch_metric_alarm" "path_token_refusals" {
  count = var.alarms_enabled ? 1 : 0

  alarm_name          = "${var.name}-path-token-refusals"
  alarm_description   = "Requests refused for a missing or unknown path token: after a rotation, the API server still calls with the old token (see docs/deploy.md, Rotating the path token); otherwise someone is guessing at the token."
  evaluation_periods  = 5
  datapoints_to_alarm = 2
  threshold           = 0
  comparison_operator = "GreaterThanThreshold"
  treat_missing_data  = "notBreaching"
  alarm_actions       = local.alarm_actions
  ok_actions          = local.alarm_actions
  tags                = var.tags

  metric_query {
    id          = "refusals"
    return_data = true
    period      = 60
    expression  = "SELECT SUM(Refusals) FROM \"${var.metrics_namespace}\" WHERE Refusal = 'PathToken'"
  }
}

resource "aws_cloudwatch_dashboard" "this" {
  count = var.dashboard_enabled ? 1 : 0

  dashboard_name = var.name
  dashboard_body = jsonencode({
    widgets = [
      for i, w in [
        { title = "Admissions by decision", expr = "SEARCH('{${var.metrics_namespace},Decision} MetricName=\"Admissions\"', 'Sum', 60)" },
        { title = "Denials by reason", expr = "SEARCH('{${var.metrics_namespace},Reason} MetricName=\"Denials\"', 'Sum', 60)" },
        { title = "Admission duration (µs, p99)", expr = "SEARCH('{${var.metrics_namespace},Decision} MetricName=\"Duration\"', 'p99', 60)" },
        { title = "Secrets injected by manager", expr = "SEARCH('{${var.metrics_namespace},Decision} MetricName=SecretsInjected', 'Sum', 60)" },
        { title = "Embedded cache hits and misses", expr = "SEARCH('{${var.metrics_namespace},Decision} (MetricName=\"CacheHits\" OR MetricName=\"CacheMisses\")', 'Sum', 60)" },
        { title = "Secrets Manager throttles", expr = "SEARCH('{${var.metrics_namespace}} MetricName=\"SecretsManagerThrottles\"', 'Sum', 60)" },
        { title = "Requests refused before the admission", expr = "SEARCH('{${var.metrics_namespace},Refusal} MetricName=\"Refusals\"', 'Sum', 60)" },
        { title = "Lambda errors and throttles", expr = "SEARCH('{AWS/Lambda,FunctionName} FunctionName=\"${var.name}\" (MetricName=\"Errors\" OR MetricName=\"Throttles\")', 'Sum', 60)" },
        ] : {
        type   = "metric"
        x      = (i % 2) * 12
        y      = floor(i / 2) * 6
        width  = 12
        height = 6
        properties = {
          title   = w.title
          region  = local.region
          view    = "timeSeries"
          metrics = [[{ expression = w.expr, id = "e${i}", label = "" }]]
        }
      }
    ]
  })
}
