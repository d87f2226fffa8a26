locals {
  create_certificate = var.certificate_arn == null
  certificate_arn    = local.create_certificate ? one(aws_acm_certificate_validation.this[*].certificate_arn) : var.certificate_arn
}

# A public certificate: the API server trusts it through its system roots, so the
# registration needs no caBundle and nothing in the cluster has to be rotated.
resource "aws_acm_certificate" "this" {
  count = local.create_certificate ? 1 : 0

  domain_name       = var.domain_name
  validation_method = "DNS"
  tags              = var.tags

  options {
    certificate_transparency_logging_preference = "ENABLED"
  }

  lifecycle {
    create_before_destroy = true
  }
}

# One name, so one validation record; count rather than for_each keeps the plan from depending on
# values ACM returns only after the certificate exists.
resource "aws_route53_record" "validation" {
  count = local.create_certificate ? 1 : 0

  zone_id         = var.route53_zone_id
  name            = one(aws_acm_certificate.this[0].domain_validation_options).resource_record_name
  type            = one(aws_acm_certificate.this[0].domain_validation_options).resource_record_type
  records         = [one(aws_acm_certificate.this[0].domain_validation_options).resource_record_value]
  ttl             = 300
  allow_overwrite = true
}

resource "aws_acm_certificate_validation" "this" {
  count = local.create_certificate ? 1 : 0

  certificate_arn         = aws_acm_certificate.this[0].arn
  validation_record_fqdns = aws_route53_record.validation[*].fqdn
}

# In a public zone even for the internal ALB: the EKS control plane resolves webhook hosts with
# public DNS only (aws/containers-roadmap#1606). The record then reveals private addresses,
# which nobody outside the VPC can reach.
resource "aws_route53_record" "endpoint" {
  count = var.route53_zone_id == null ? 0 : 1

  zone_id = var.route53_zone_id
  name    = var.domain_name
  type    = "A"

  alias {
    name = one(concat(
      aws_lb.this[*].dns_name,
      aws_apigatewayv2_domain_name.this[*].domain_name_configuration[0].target_domain_name,
    ))
    zone_id = one(concat(
      aws_lb.this[*].zone_id,
      aws_apigatewayv2_domain_name.this[*].domain_name_configuration[0].hosted_zone_id,
    ))
    evaluate_target_health = false
  }
}
