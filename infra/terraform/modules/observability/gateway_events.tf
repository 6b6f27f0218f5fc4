# Alarms on what the gateways log (one JSON object a line, `event` naming it): the rate limiter's Redis away,
# an endpoint that failed, ECS throttling its scaling calls, and the daily usage export. Each log line is a
# metric through a filter, so no gateway code sends these to CloudWatch.

locals {
  gateway_events = {
    # gateway/limits/outage.py: the first failure, then one line a minute per gateway while Redis is away
    limiter_outage = {
      metric    = "LimiterBackendDown"
      pattern   = "{ ($.event = \"limiter_backend_down\") || ($.event = \"limiter_backend_still_down\") }"
      threshold = 1
      periods   = 1
      what      = "A gateway's rate limiter cannot reach Redis: each gateway admits within its share of every limit (limiter_on_outage) and no ECS endpoint scales until Redis answers"
    }
    # gateway/endpoints/controller.py: a crash loop or weights that do not load; requests to it get 503 at once
    endpoint_failed = {
      metric    = "EndpointFailed"
      pattern   = "{ $.event = \"endpoint_failed\" }"
      threshold = 1
      periods   = 1
      what      = "An endpoint is `failed` (crash loop or weights that do not load): it refuses every request until PATCHed"
    }
    # gateway/endpoints/provisioners/ecs.py: AWS refusing the fleet's ECS calls; scaling waits while it lasts
    ecs_throttled = {
      metric    = "EcsThrottled"
      pattern   = "{ $.event = \"ecs_throttled\" }"
      threshold = 10
      periods   = 3
      what      = "ECS throttled the gateways' scaling calls at least 10 times a minute for 3 minutes (ecs_api_calls_per_second above the account's rate?)"
    }
  }
}

resource "aws_cloudwatch_log_metric_filter" "gateway_event" {
  for_each       = local.gateway_events
  name           = "${var.name}-${replace(each.key, "_", "-")}"
  log_group_name = aws_cloudwatch_log_group.service["gateway"].name
  pattern        = each.value.pattern
  metric_transformation {
    name          = each.value.metric
    namespace     = "Sluice/${var.name}"
    value         = "1"
    default_value = "0"
  }
}

resource "aws_cloudwatch_metric_alarm" "gateway_event" {
  for_each            = local.gateway_events
  alarm_name          = "${var.name}-${replace(each.key, "_", "-")}"
  alarm_description   = each.value.what
  namespace           = aws_cloudwatch_log_metric_filter.gateway_event[each.key].metric_transformation[0].namespace
  metric_name         = aws_cloudwatch_log_metric_filter.gateway_event[each.key].metric_transformation[0].name
  statistic           = "Sum"
  period              = 60
  evaluation_periods  = each.value.periods
  comparison_operator = "GreaterThanOrEqualToThreshold"
  threshold           = each.value.threshold
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}

# The daily usage export (modules/gateway/usage_export.tf) prints "<n> team(s) exported for <day>" when it is
# done, into the gateway's log group. No such line in a day (the schedule did not fire, the task could not start,
# or it failed) pages; a failed run also reaches the topic at once through the task-stopped event below.
resource "aws_cloudwatch_log_metric_filter" "usage_export_done" {
  count          = var.usage_export_alarm ? 1 : 0
  name           = "${var.name}-usage-export-done"
  log_group_name = aws_cloudwatch_log_group.service["gateway"].name
  pattern        = "\"team(s) exported for\""
  metric_transformation {
    name      = "UsageExportDone"
    namespace = "Sluice/${var.name}"
    value     = "1"
  }
}

resource "aws_cloudwatch_metric_alarm" "usage_export_missing" {
  count               = var.usage_export_alarm ? 1 : 0
  alarm_name          = "${var.name}-usage-export-missing"
  alarm_description   = "No daily usage export finished in the last 26 hours (billing files missing for a day)"
  namespace           = aws_cloudwatch_log_metric_filter.usage_export_done[0].metric_transformation[0].namespace
  metric_name         = aws_cloudwatch_log_metric_filter.usage_export_done[0].metric_transformation[0].name
  statistic           = "Sum"
  period              = 3600
  evaluation_periods  = 26
  datapoints_to_alarm = 26
  comparison_operator = "LessThanThreshold"
  threshold           = 1
  treat_missing_data  = "breaching" # no line at all is the failure this alarm is for
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}

resource "aws_cloudwatch_event_rule" "usage_export_failed" {
  count       = var.usage_export_alarm ? 1 : 0
  name        = "${var.name}-usage-export-failed"
  description = "The daily usage export task stopped with an error"
  event_pattern = jsonencode({
    source        = ["aws.ecs"]
    "detail-type" = ["ECS Task State Change"]
    detail = {
      clusterArn = [var.cluster_arn]
      group      = ["family:${var.name}-usage-export"]
      lastStatus = ["STOPPED"]
      containers = { exitCode = [{ "anything-but" = 0 }] }
    }
  })
}

resource "aws_cloudwatch_event_target" "usage_export_failed" {
  count = var.usage_export_alarm ? 1 : 0
  rule  = aws_cloudwatch_event_rule.usage_export_failed[0].name
  arn   = aws_sns_topic.alarms.arn
}
