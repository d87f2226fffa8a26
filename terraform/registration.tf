# Created last and, on destroy, deleted first (it depends on the endpoint and the function):
# with failurePolicy Fail, a registration pointing at a missing endpoint would block every
# opted-in pod.
resource "kubernetes_manifest" "webhook" {
  count = var.register_webhook ? 1 : 0

  manifest = module.webhook_config.manifest

  depends_on = [
    aws_lambda_function.this,
    aws_lb_listener_rule.routes,
    aws_lb_target_group_attachment.function,
    aws_lambda_permission.alb,
    aws_apigatewayv2_route.routes,
    aws_apigatewayv2_api_mapping.this,
    aws_lambda_permission.api,
    aws_secretsmanager_secret_version.path_token,
    aws_route53_record.endpoint,
  ]
}
