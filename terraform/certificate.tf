locals {
  # Explicit booleans decide what exists: a zone or certificate created in the same apply has
  # an unknown ID at plan time, which count cannot depend on.
  certificate_arn = var.create_certificate ? aws_acm_certificate_validation.this[0].certificate_arn : var.certificate_arn
}

# A public certificate: the API server trusts it through its system roots, so the
# registration needs no caBundle and nothing in the cluster has to be rotated.
resource "aws_acm_certificate" "this" {
  count = var.create_certificate ? 1 : 0

  domain_name       = var.domain_name
  validation_method = "DNS"
  tags              = var.tags

  # Public CT logs list every certificate's names: the default, and what browsers expect, but
  # it announces the endpoint's name; DISABLED keeps it out of the logs (the API server does not
  # check CT).
  options {
    certificate_transparency_logging_preference = var.certificate_transparency_logging_preference
  }

  lifecycle {
    create_before_destroy = true
  }
}

# One name, so one validation record; count rather than for_each keeps the plan from depending on
# values ACM returns only after the certificate exists.
resource "aws_route53_record" "validation" {
  count = var.create_certificate ? 1 : 0

  zone_id         = var.route53_zone_id
  name            = one(aws_acm_certificate.this[0].domain_validation_options).resource_record_name
  type            = one(aws_acm_certificate.this[0].domain_validation_options).resource_record_type
  records         = [one(aws_acm_certificate.this[0].domain_validation_options).resource_record_value]
  ttl             = 300
  allow_overwrite = true
}

resource "aws_acm_certificate_validation" "this" {
  count = var.create_certificate ? 1 : 0

  certificate_arn         = aws_acm_certificate.this[0].arn
  validation_record_fqdns = aws_route53_record.validation[*].fqdn
}

locals {
  # Where domain_name must point, for DNS managed elsewhere (outputs dns_target_*).
  dns_target_name = local.use_alb ? aws_lb.this[0].dns_name : aws_apigatewayv2_domain_name.this[0].domain_name_configuration[0].target_domain_name
  dns_target_zone = local.use_alb ? aws_lb.this[0].zone_id : aws_apigatewayv2_domain_name.this[0].domain_name_configuration[0].hosted_zone_id
}

# In a public zone even for the internal ALB: the EKS control plane resolves webhook hosts with
# public DNS only (aws/containers-roadmap#1606). The record then reveals private addresses,
# which nobody outside the VPC can reach.
resource "aws_route53_record" "endpoint" {
  count = var.create_dns_record ? 1 : 0

  zone_id = var.route53_zone_id
  name    = var.domain_name
  type    = "A"

  alias {
    name                   = local.dns_target_name
    zone_id                = local.dns_target_zone
    evaluate_target_health = false
  }
}
