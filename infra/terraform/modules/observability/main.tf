# Log groups (encrypted, with retention) and the alarms an operator is paged for: the gateway's 5xx
# rate at the ALB, requests piling up in the activator (cold endpoints that do not wake), RDS CPU; the
# gateways' own events (gateway_events.tf), the managed dependencies (dependencies.tf), spend (spend.tf), and
# one dashboard of them all (dashboard.tf). Every alarm publishes to one SNS topic.

resource "aws_cloudwatch_log_group" "service" {
  for_each          = toset(["gateway", "worker", "metrics"]) # metrics: the gateway's /metrics as EMF records
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

# 5xx the platform did not mean: the ALB's own (the gateway unreachable: never intended) plus the gateway's 5xx
# other than 503. A 503 is the gateway shedding on purpose (an endpoint still waking from zero, its wait or
# queue bound reached, a drain): the activator-queue and worker-start alarms page for a cold start that never
# ends, so HTTPCode_Target_5XX_Count, which counts those 503s too, is not in this rate. The gateway's 5xx come
# from its one JSON line per request (gateway/edge/access_log.py: `http_status` on generation requests, `status` on others).
resource "aws_cloudwatch_log_metric_filter" "unintended_5xx" {
  name           = "${var.name}-gateway-unintended-5xx"
  log_group_name = aws_cloudwatch_log_group.service["gateway"].name
  pattern        = "{ ($.http_status >= 500 && $.http_status != 503) || ($.status >= 500 && $.status != 503) }"
  metric_transformation {
    name          = "GatewayUnintended5xx"
    namespace     = "Sluice/${var.name}"
    value         = "1"
    default_value = "0"
  }
}

resource "aws_cloudwatch_metric_alarm" "gateway_5xx_rate" {
  count               = var.alb_alarms ? 1 : 0
  alarm_name          = "${var.name}-gateway-5xx-rate"
  alarm_description   = "More than ${var.max_5xx_percent}% of requests answered with an unintended 5xx (the ALB's own, or the gateway's other than 503) for 5 minutes"
  comparison_operator = "GreaterThanThreshold"
  threshold           = var.max_5xx_percent
  evaluation_periods  = 5
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]

  metric_query {
    id          = "rate"
    expression  = "100 * (FILL(elb5xx, 0) + FILL(gateway5xx, 0)) / MAX([requests, 1])"
    label       = "unintended 5xx percent"
    return_data = true
  }
  dynamic "metric_query" {
    for_each = { elb5xx = "HTTPCode_ELB_5XX_Count", requests = "RequestCount" }
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
  metric_query {
    id = "gateway5xx"
    metric {
      namespace   = aws_cloudwatch_log_metric_filter.unintended_5xx.metric_transformation[0].namespace
      metric_name = aws_cloudwatch_log_metric_filter.unintended_5xx.metric_transformation[0].name
      period      = 60
      stat        = "Sum"
    }
  }
}

# gateway tasks the ALB finds unhealthy on /livez (a hung process, not a cold endpoint)
resource "aws_cloudwatch_metric_alarm" "unhealthy_hosts" {
  count               = var.alb_alarms ? 1 : 0
  alarm_name          = "${var.name}-gateway-unhealthy-hosts"
  alarm_description   = "A gateway task failed the ALB's liveness check for 3 minutes"
  namespace           = "AWS/ApplicationELB"
  metric_name         = "UnHealthyHostCount"
  dimensions          = { LoadBalancer = var.alb_arn_suffix, TargetGroup = var.target_group_arn_suffix }
  statistic           = "Maximum"
  period              = 60
  evaluation_periods  = 3
  comparison_operator = "GreaterThanThreshold"
  threshold           = 0
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}

# the GPU hosts at their maximum: worker tasks beyond it wait for capacity that will not come
resource "aws_cloudwatch_metric_alarm" "gpu_capacity" {
  count               = var.gpu_alarms ? 1 : 0
  alarm_name          = "${var.name}-gpu-hosts-at-maximum"
  alarm_description   = "The GPU autoscaling group wanted its maximum (${var.gpu_max_instances}) hosts for 15 minutes"
  namespace           = "AWS/AutoScaling"
  metric_name         = "GroupDesiredCapacity"
  dimensions          = { AutoScalingGroupName = var.gpu_autoscaling_group_name }
  statistic           = "Maximum"
  period              = 300
  evaluation_periods  = 3
  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = var.gpu_max_instances
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}

# worker start failures: a worker task that stops with a non-zero exit, or a worker service that cannot place
# or start its tasks, is sent to the alarm topic as it happens (ECS events, no metric needed)
resource "aws_cloudwatch_event_rule" "worker_start_failures" {
  count       = var.gpu_alarms ? 1 : 0
  name        = "${var.name}-worker-start-failures"
  description = "Worker tasks that exit with an error, and worker services that cannot place or start tasks"
  event_pattern = jsonencode({
    source = ["aws.ecs"]
    "$or" = [
      {
        "detail-type" = ["ECS Task State Change"]
        detail = {
          clusterArn = [var.cluster_arn]
          group      = [{ prefix = "service:${var.worker_service_prefix}" }]
          lastStatus = ["STOPPED"]
          containers = { exitCode = [{ "anything-but" = 0 }] }
        }
      },
      {
        "detail-type" = ["ECS Service Action"]
        detail = {
          clusterArn = [var.cluster_arn]
          eventName  = ["SERVICE_TASK_PLACEMENT_FAILURE", "SERVICE_TASK_START_IMPAIRED"]
        }
      },
    ]
  })
}

resource "aws_cloudwatch_event_target" "worker_start_failures" {
  count = var.gpu_alarms ? 1 : 0
  rule  = aws_cloudwatch_event_rule.worker_start_failures[0].name
  arn   = aws_sns_topic.alarms.arn
}

# A topic policy replaces SNS's default one, so it names every publisher: CloudWatch alarms of this account
# (without this statement every alarm's publish is denied: the alarm history shows "Failed to execute action"
# and nobody is paged), EventBridge (the worker start failures below), and the account's own principals.
resource "aws_sns_topic_policy" "alarms" {
  arn = aws_sns_topic.alarms.arn
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "CloudWatchAlarmsPublish"
        Effect    = "Allow"
        Principal = { Service = "cloudwatch.amazonaws.com" }
        Action    = "sns:Publish"
        Resource  = aws_sns_topic.alarms.arn
        Condition = {
          ArnLike      = { "aws:SourceArn" = "arn:${data.aws_partition.current.partition}:cloudwatch:${data.aws_region.current.name}:${data.aws_caller_identity.current.account_id}:alarm:*" }
          StringEquals = { "aws:SourceAccount" = data.aws_caller_identity.current.account_id }
        }
      },
      {
        Sid       = "EcsEventsPublish"
        Effect    = "Allow"
        Principal = { Service = "events.amazonaws.com" }
        Action    = "sns:Publish"
        Resource  = aws_sns_topic.alarms.arn
        Condition = { StringEquals = { "aws:SourceAccount" = data.aws_caller_identity.current.account_id } }
      },
      {
        Sid       = "BudgetsPublish" # spend.tf
        Effect    = "Allow"
        Principal = { Service = "budgets.amazonaws.com" }
        Action    = "sns:Publish"
        Resource  = aws_sns_topic.alarms.arn
        Condition = { StringEquals = { "aws:SourceAccount" = data.aws_caller_identity.current.account_id } }
      },
      {
        Sid       = "AccountManagesAndPublishes"
        Effect    = "Allow"
        Principal = { AWS = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root" }
        Action    = ["sns:Publish", "sns:Subscribe", "sns:GetTopicAttributes", "sns:SetTopicAttributes", "sns:ListSubscriptionsByTopic"]
        Resource  = aws_sns_topic.alarms.arn
      },
    ]
  })
}

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

# the requests waiting in the gateways' activators, summed over endpoints: each gateway task sends the highest
# depth it saw in each minute (gateway/endpoints/queue_metric.py, `[cloudwatch]` in the rendered config), no dimensions;
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

resource "aws_cloudwatch_metric_alarm" "rds_storage" {
  count               = var.rds_alarm ? 1 : 0
  alarm_name          = "${var.name}-rds-free-storage"
  alarm_description   = "PostgreSQL free storage below ${var.min_rds_free_storage_gb} GB for 10 minutes (storage autoscaling at its maximum, or growing faster than it)"
  namespace           = "AWS/RDS"
  metric_name         = "FreeStorageSpace"
  dimensions          = { DBInstanceIdentifier = var.db_instance_id }
  statistic           = "Minimum"
  period              = 300
  evaluation_periods  = 2
  comparison_operator = "LessThanThreshold"
  threshold           = var.min_rds_free_storage_gb * 1024 * 1024 * 1024
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}
