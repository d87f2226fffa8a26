# Default endpoint: an internal ALB in the cluster VPC. The EKS control plane reaches webhooks
# through its network interfaces in the cluster subnets; one security group that only those
# interfaces carry (control_plane_security_group_id, never the cluster security group, which
# nodes and pods carry too) is the only source allowed in.

# Subnets are checked before CreateLoadBalancer would refuse them: one per availability zone
# (eksctl and AWS's VPC layouts have a public and a private subnet per zone), each with the 8
# free addresses an ALB needs. count, not for_each: the IDs may be unknown until apply.
data "aws_subnet" "alb" {
  count = local.use_alb ? length(var.subnet_ids) : 0
  id    = var.subnet_ids[count.index]
}

resource "aws_security_group" "alb" {
  count = local.use_alb ? 1 : 0

  # name_prefix + create_before_destroy: a second deployment in the VPC, or a replacement, never
  # collides with the existing group's name.
  name_prefix = "${var.name}-alb-"
  description = "podmutator webhook ALB: HTTPS from the EKS control plane security group only"
  vpc_id      = var.vpc_id
  tags        = var.tags

  # No egress rules: the ALB invokes its Lambda target through the Lambda service, not
  # through the VPC.

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "alb_from_control_plane" {
  count = local.use_alb ? 1 : 0

  security_group_id            = aws_security_group.alb[0].id
  description                  = "HTTPS from the EKS control plane (its dedicated security group)"
  referenced_security_group_id = var.control_plane_security_group_id
  ip_protocol                  = "tcp"
  from_port                    = 443
  to_port                      = 443
  tags                         = var.tags
}

resource "aws_lb" "this" {
  count = local.use_alb ? 1 : 0

  name                       = var.name
  internal                   = true
  load_balancer_type         = "application"
  security_groups            = [aws_security_group.alb[0].id]
  subnets                    = var.subnet_ids
  drop_invalid_header_fields = true
  enable_deletion_protection = var.alb_deletion_protection
  tags                       = var.tags

  # Access logs record each request's URL, path token included: refused while the token is on
  # unless acknowledged (variables.tf, alb_access_logs_bucket).
  dynamic "access_logs" {
    for_each = var.alb_access_logs_bucket == null ? [] : [var.alb_access_logs_bucket]
    content {
      bucket  = access_logs.value
      prefix  = var.name
      enabled = true
    }
  }

  lifecycle {
    precondition {
      condition     = length(distinct(data.aws_subnet.alb[*].availability_zone)) == length(var.subnet_ids)
      error_message = "subnet_ids must hold one subnet per availability zone (an ALB refuses two in the same zone); use the private subnets tagged kubernetes.io/role/internal-elb, one per zone."
    }
    precondition {
      condition     = alltrue([for s in data.aws_subnet.alb : s.available_ip_address_count >= 8])
      error_message = "every subnet in subnet_ids needs at least 8 free addresses for the ALB's network interfaces."
    }
    precondition {
      condition     = alltrue([for s in data.aws_subnet.alb : s.vpc_id == var.vpc_id])
      error_message = "every subnet in subnet_ids must be in vpc_id."
    }
  }

  #checkov:skip=CKV_AWS_91:Off by default: ALB access logs record the request URL, whose first segment is the path token (alb_access_logs_bucket needs alb_access_logs_record_path_token); the function logs every admission with its uid.
  #checkov:skip=CKV2_AWS_28:An internal ALB reached by one security group; AWS WAF cannot see the path token or the review, so it adds cost without a rule that could help.
}

resource "aws_lb_target_group" "function" {
  count = local.use_alb ? 1 : 0

  # Target group names are unique per region and limited to 32 characters (6 for a prefix).
  name_prefix = "${substr(var.name, 0, 5)}-"
  target_type = "lambda"
  tags        = var.tags

  # The health check invokes the function on /healthz. It cannot carry the path token (it would
  # sit in the target group's configuration, readable with elasticloadbalancing:Describe*), so
  # with the token on the function answers 404: proof that it starts and answers, which is what
  # UnHealthyHostCount should alarm on. While it answers the plain paths too (accept_plain_paths),
  # /healthz is answered 200.
  health_check {
    enabled             = true
    path                = "/healthz"
    matcher             = var.path_token_enabled && !var.accept_plain_paths ? "404" : "200"
    interval            = 60
    timeout             = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_lambda_permission" "alb" {
  count = local.use_alb ? 1 : 0

  statement_id  = "AllowInvokeFromAlbTargetGroup"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this.function_name
  qualifier     = aws_lambda_alias.live.name
  principal     = "elasticloadbalancing.amazonaws.com"
  source_arn    = aws_lb_target_group.function[0].arn
}

resource "aws_lb_target_group_attachment" "function" {
  count = local.use_alb ? 1 : 0

  target_group_arn = aws_lb_target_group.function[0].arn
  target_id        = aws_lambda_alias.live.arn
  depends_on       = [aws_lambda_permission.alb]
}

resource "aws_lb_listener" "https" {
  count = local.use_alb ? 1 : 0

  load_balancer_arn = aws_lb.this[0].arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = var.alb_ssl_policy
  certificate_arn   = local.certificate_arn
  tags              = var.tags

  # Everything goes to the function: the first path segment is the token, which must never be
  # written into a listener rule (anyone with elasticloadbalancing:Describe* reads those). The
  # function's token check, before it reads the body, is the gate; a wrong or missing token
  # gets 404 from the function.
  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.function[0].arn
  }
}
