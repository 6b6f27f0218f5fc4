# Public ALB: HTTPS with a TLS 1.3 policy; HTTP answers only with a redirect to HTTPS.

resource "aws_lb" "main" {
  #checkov:skip=CKV_AWS_150:Deletion protection is var.deletion_protection: on by default and in prod, off in dev and the local env.
  #checkov:skip=CKV2_AWS_28:WAF is an account-level choice (rules, cost per request); attach a web ACL to this ALB where wanted.
  name                       = var.name
  load_balancer_type         = "application"
  internal                   = false
  subnets                    = var.public_subnet_ids
  security_groups            = [var.security_group_ids["alb"]]
  drop_invalid_header_fields = true
  enable_deletion_protection = var.deletion_protection
  # above the gateway's request_timeout_s: a non-streamed answer (or a request waiting for a cold endpoint
  # without SSE keep-alives) is never cut by the ALB before the gateway's own timeout answers it
  idle_timeout = var.request_timeout_seconds + 60
  dynamic "access_logs" {
    for_each = var.access_log_bucket == "" ? [] : [var.access_log_bucket]
    content {
      bucket  = access_logs.value
      prefix  = "alb"
      enabled = true
    }
  }
}

resource "aws_lb_target_group" "gateway" {
  name        = "${var.name}-gw"
  port        = var.port
  protocol    = "HTTP"
  target_type = "ip"
  vpc_id      = var.vpc_id
  # a deploy or scale-in waits for every request in flight, streams included, before ECS sends SIGTERM (it
  # waits for this drain to end; it ends early once the target has no request left); a stream is never longer
  # than the gateway's request timeout
  deregistration_delay = min(var.request_timeout_seconds + 10, 3600)
  health_check {
    path                = "/livez" # liveness; /health is readiness (503 during a GPU cold start)
    matcher             = "200"
    interval            = 15
    timeout             = 5
    healthy_threshold   = 2
    unhealthy_threshold = 3
  }
}

resource "aws_lb_listener" "https" {
  load_balancer_arn = aws_lb.main.arn
  port              = 443
  protocol          = "HTTPS"
  ssl_policy        = var.ssl_policy
  certificate_arn   = var.certificate_arn
  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.gateway.arn
  }
}

resource "aws_lb_listener" "http" {
  load_balancer_arn = aws_lb.main.arn
  port              = 80
  protocol          = "HTTP"
  default_action {
    type = "redirect"
    redirect {
      protocol    = "HTTPS"
      port        = "443"
      status_code = "HTTP_301"
    }
  }
}

# /metrics is for the VPC's scrapers, never the internet: the ALB answers it itself, before any target
resource "aws_lb_listener_rule" "refuse_metrics" {
  listener_arn = aws_lb_listener.https.arn
  priority     = 1
  condition {
    path_pattern {
      values = ["/metrics", "/metrics/*"]
    }
  }
  action {
    type = "fixed-response"
    fixed_response {
      content_type = "application/json"
      status_code  = "404"
      message_body = jsonencode({ error = { message = "not found", type = "invalid_request_error", code = "not_found" } })
    }
  }
}
