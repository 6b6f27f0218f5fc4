# Log groups (encrypted, with retention) and the alarms an operator is paged for: the gateway's 5xx
# rate at the ALB, requests piling up in the activator (cold endpoints that do not wake), RDS CPU.

resource "aws_cloudwatch_log_group" "service" {
  for_each          = toset(["gateway", "worker"])
  name              = "/sluice/${var.name}/${each.key}"
  retention_in_days = var.log_retention_days
  kms_key_id        = var.kms_key_arn
}

resource "aws_sns_topic" "alarms" {
  name              = "${var.name}-alarms"
  kms_master_key_id = var.kms_key_arn
}

resource "aws_sns_topic_subscription" "email" {
  for_each  = toset(var.alarm_emails)
  topic_arn = aws_sns_topic.alarms.arn
  protocol  = "email"
  endpoint  = each.key
}

resource "aws_cloudwatch_metric_alarm" "gateway_5xx_rate" {
  count               = var.alb_alarms ? 1 : 0
  alarm_name          = "${var.name}-gateway-5xx-rate"
  alarm_description   = "More than ${var.max_5xx_percent}% of requests answered 5xx (gateway or ALB) for 5 minutes"
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.max_5xx_percent
  evaluation_periods  = 5
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]

  metric_query {
    id          = "rate"
    expression  = "100 * (FILL(target5xx, 0) + FILL(elb5xx, 0)) / MAX([requests, 1])"
    label       = "5xx percent"
    return_data = true
  }
  dynamic "metric_query" {
    for_each = { target5xx = "HTTPCode_Target_5XX_Count", elb5xx = "HTTPCode_ELB_5XX_Count", requests = "RequestCount" }
    content {
      id = metric_query.key
      metric {
        namespace   = "AWS/ApplicationELB"
        metric_name = metric_query.value
        dimensions  = { LoadBalancer = var.alb_arn_suffix }
        period      = 60
        stat        = "Sum"
      }
    }
  }
}

# the requests waiting in the gateways' activators, summed over endpoints: each gateway task sends the highest
# depth it saw in each minute (gateway/queue_metric.py, `[cloudwatch]` in the rendered config), no dimensions;
# `Maximum` is the fullest queue of any one task
resource "aws_cloudwatch_metric_alarm" "activator_queue" {
  alarm_name          = "${var.name}-activator-queue-depth"
  alarm_description   = "Requests waiting for endpoints to wake stay above ${var.max_activator_queue} for 3 minutes"
  namespace           = "Sluice/${var.name}"
  metric_name         = "ActivatorQueueDepth"
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 3
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.max_activator_queue
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}

resource "aws_cloudwatch_metric_alarm" "rds_cpu" {
  count               = var.rds_alarm ? 1 : 0
  alarm_name          = "${var.name}-rds-cpu"
  alarm_description   = "PostgreSQL CPU above ${var.max_rds_cpu_percent}% for 10 minutes"
  namespace           = "AWS/RDS"
  metric_name         = "CPUUtilization"
  dimensions          = { DBInstanceIdentifier = var.db_instance_id }
  statistic           = "Average"
  period              = 300
  evaluation_periods  = 2
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.max_rds_cpu_percent
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}
