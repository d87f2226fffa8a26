# alb_deletion_protection guards the whole install, not the ALB alone. The ALB's own
# enable_deletion_protection is checked by AWS only when the ALB's turn comes, and a destroy
# deletes what depends on the ALB first: the registration, the listener, the target group, the
# function and its versions (whose code only the zip can restore) were gone by the time the
# ALB refused, and with failurePolicy Fail every opted-in pod was refused meanwhile.
#
# So a protected destroy is refused before it deletes anything. This resource depends on every
# resource of the module, so a destroy (or an apply that removes the module, or switches the
# endpoint away from the ALB) must destroy it first; its destroy-time provisioner fails while
# the state says the install is protected, which stops the walk with nothing deleted. Lifting
# the protection is an apply with alb_deletion_protection = false (the input is updated in
# place, the resource is not replaced), then the destroy. modules/registration holds the same
# guard for the registration, which is deleted before anything here (the `registration`
# output carries the setting to it).
#
# tests/iac/check_terraform.py holds depends_on to every resource in this module.
resource "terraform_data" "deletion_guard" {
  count = local.use_alb ? 1 : 0

  input = var.alb_deletion_protection

  provisioner "local-exec" {
    when        = destroy
    interpreter = ["/bin/sh", "-c"]
    command     = self.input ? "printf '%s\\n' \"$MESSAGE\" >&2; exit 1" : "exit 0"
    environment = {
      MESSAGE = "podmutator: alb_deletion_protection is true: destroy refused before anything was deleted (the function, the endpoint and the registration are all still in place). To remove this install, set alb_deletion_protection = false (terraform.tfvars), run terraform apply, then terraform destroy (docs/deploy.md, \"Removal and reinstall\")."
    }
  }

  depends_on = [
    # The function and what it needs.
    aws_cloudwatch_log_group.function,
    aws_iam_role.function,
    aws_iam_role_policy.function,
    aws_lambda_function.this,
    aws_lambda_alias.live,
    aws_lambda_invocation.pre_traffic,
    aws_lambda_provisioned_concurrency_config.live,
    aws_secretsmanager_secret.path_token,
    aws_secretsmanager_secret_version.path_token,
    # The endpoint.
    aws_security_group.alb,
    aws_vpc_security_group_ingress_rule.alb_from_control_plane,
    aws_lb.this,
    aws_lb_target_group.function,
    aws_lambda_permission.alb,
    aws_lb_target_group_attachment.function,
    aws_lb_listener.https,
    aws_apigatewayv2_api.this,
    aws_apigatewayv2_integration.function,
    aws_apigatewayv2_route.routes,
    aws_cloudwatch_log_group.api_access,
    aws_apigatewayv2_stage.default,
    aws_apigatewayv2_domain_name.this,
    aws_apigatewayv2_api_mapping.this,
    aws_lambda_permission.api,
    aws_acm_certificate.this,
    aws_route53_record.validation,
    aws_acm_certificate_validation.this,
    aws_route53_record.endpoint,
    # What watches and serves it.
    aws_cloudwatch_metric_alarm.this,
    aws_cloudwatch_metric_alarm.secrets_manager_throttles,
    aws_cloudwatch_metric_alarm.path_token_refusals,
    aws_cloudwatch_dashboard.this,
  ]
}
