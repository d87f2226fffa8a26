# Default endpoint: an internal ALB in the cluster VPC. The EKS control plane reaches webhooks
# through its network interfaces in the cluster subnets; one security group they carry is the
# only source allowed in. Whatever else carries that group can also ask the function for a
# pod's secrets, which is why the README (Deploy) recommends a group on the control plane alone.

resource "aws_security_group" "alb" {
  count = local.use_alb ? 1 : 0

  name        = "${var.name}-alb"
  description = "podmutator webhook ALB: HTTPS from the EKS cluster security group only"
  vpc_id      = var.vpc_id
  tags        = var.tags

  # No egress rules: the ALB invokes its Lambda target through the Lambda service, not
  # through the VPC.
}

resource "aws_vpc_security_group_ingress_rule" "alb_from_cluster" {
  count = local.use_alb ? 1 : 0

  security_group_id            = aws_security_group.alb[0].id
  description                  = "HTTPS from the EKS control plane (cluster security group)"
  referenced_security_group_id = var.cluster_security_group_id
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

  dynamic "access_logs" {
    for_each = var.alb_access_logs_bucket == null ? [] : [var.alb_access_logs_bucket]
    content {
      bucket  = access_logs.value
      prefix  = var.name
      enabled = true
    }
  }
}

resource "aws_lb_target_group" "function" {
  count = local.use_alb ? 1 : 0

  name        = "${var.name}-fn"
  target_type = "lambda"
  tags        = var.tags

  # Health checks invoke the function on /healthz; UnHealthyHostCount then alarms before pod
  # creations start failing.
  health_check {
    enabled             = true
    path                = "/healthz"
    matcher             = "200"
    interval            = 60
    timeout             = 10
    healthy_threshold   = 2
    unhealthy_threshold = 2
  }
}

resource "aws_lambda_permission" "alb" {
  count = local.use_alb ? 1 : 0

  statement_id  = "AllowInvokeFromAlbTargetGroup"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this.function_name
  principal     = "elasticloadbalancing.amazonaws.com"
  source_arn    = aws_lb_target_group.function[0].arn
}

resource "aws_lb_target_group_attachment" "function" {
  count = local.use_alb ? 1 : 0

  target_group_arn = aws_lb_target_group.function[0].arn
  target_id        = aws_lambda_function.this.arn
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

  # Only the routes the registration calls reach the function; anything else is answered here.
  default_action {
    type = "fixed-response"
    fixed_response {
      content_type = "application/json"
      message_body = "{\"message\":\"not found\"}"
      status_code  = "404"
    }
  }
}

resource "aws_lb_listener_rule" "routes" {
  count = local.use_alb ? 1 : 0

  listener_arn = aws_lb_listener.https[0].arn
  priority     = 10
  tags         = var.tags

  action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.function[0].arn
  }

  condition {
    path_pattern {
      values = local.routes
    }
  }
}
