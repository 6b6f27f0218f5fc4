mock_provider "aws" {}

variables {
  name           = "sluice-test"
  kms_key_arn    = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
  alb_arn_suffix = "app/sluice-test/0123456789abcdef"
  db_instance_id = "sluice-test"
}

run "log_groups_have_retention_and_encryption" {
  command = plan
  assert {
    condition     = alltrue([for g in aws_cloudwatch_log_group.service : g.retention_in_days == 90 && g.kms_key_id == var.kms_key_arn])
    error_message = "log groups keep 90 days by default, encrypted"
  }
}

run "alarms_on_5xx_rate_activator_queue_and_rds_cpu" {
  command = plan
  assert {
    condition     = length(aws_cloudwatch_metric_alarm.gateway_5xx_rate) == 1 && length(aws_cloudwatch_metric_alarm.rds_cpu) == 1
    error_message = "5xx and RDS CPU alarms exist"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.activator_queue.metric_name == "ActivatorQueueDepth"
    error_message = "activator queue depth alarm"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.rds_cpu[0].dimensions.DBInstanceIdentifier == "sluice-test"
    error_message = "the RDS alarm watches our instance"
  }
  assert {
    condition     = one([for q in aws_cloudwatch_metric_alarm.gateway_5xx_rate[0].metric_query : q.expression if q.id == "rate"]) != null
    error_message = "the 5xx alarm is a rate, not a count"
  }
}

run "invalid_retention_is_refused" {
  command = plan
  variables {
    log_retention_days = 42
  }
  expect_failures = [var.log_retention_days]
}
