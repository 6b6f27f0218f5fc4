mock_provider "aws" {
  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }
  mock_resource "aws_sns_topic" {
    defaults = { arn = "arn:aws:sns:us-east-1:123456789012:sluice-test-alarms" }
  }
}

variables {
  name           = "sluice-test"
  kms_key_arn    = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
  alb_arn_suffix = "app/sluice-test/0123456789abcdef"
  db_instance_id = "sluice-test"
  # the platform's values
  target_group_arn_suffix    = "targetgroup/sluice-test-gw/0123456789abcdef"
  gpu_autoscaling_group_name = "sluice-test-gpu-1"
  gpu_max_instances          = 4
  cluster_arn                = "arn:aws:ecs:us-east-1:123456789012:cluster/sluice-test"
  worker_service_prefix      = "sluice-test-worker-"
  cache_replication_group_id = "sluice-test"
  cache_nodes                = 2
  efs_alarm                  = true
  efs_file_system_id         = "fs-12345678"
  nat_gateway_ids            = ["nat-0a", "nat-0b"]
}

# One plan for what were 3 runs (each run starts the AWS provider again): the asserts
# of each, under its old name.
run "the_default_plan" {
  command = plan
  # log_groups_have_retention_and_encryption
  assert {
    condition     = alltrue([for g in aws_cloudwatch_log_group.service : g.retention_in_days == 90 && g.kms_key_id == var.kms_key_arn])
    error_message = "log groups keep 90 days by default, encrypted"
  }
  # alarms_on_5xx_rate_activator_queue_and_rds_cpu
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
  # the_5xx_alarm_leaves_out_the_intended_503s
  assert {
    condition     = toset([for q in aws_cloudwatch_metric_alarm.gateway_5xx_rate[0].metric_query : q.id if q.id != "rate"]) == toset(["elb5xx", "gateway5xx", "requests"])
    error_message = "the ALB's own 5xx and the gateway's unintended ones; never HTTPCode_Target_5XX_Count, which counts the cold-start 503s"
  }
  assert {
    condition     = alltrue([for q in aws_cloudwatch_metric_alarm.gateway_5xx_rate[0].metric_query : try(one(q.metric).metric_name, "") != "HTTPCode_Target_5XX_Count"])
    error_message = "no target 5xx count"
  }
  assert {
    condition     = strcontains(aws_cloudwatch_log_metric_filter.unintended_5xx.pattern, "$.http_status != 503") && strcontains(aws_cloudwatch_log_metric_filter.unintended_5xx.pattern, "$.status != 503")
    error_message = "the gateway's 503s are not counted"
  }
}

run "invalid_retention_is_refused" {
  command = plan
  variables {
    log_retention_days = 42
  }
  expect_failures = [var.log_retention_days]
}

run "a_cache_without_nodes_is_refused" {
  command = plan
  variables {
    cache_nodes = 0
  }
  expect_failures = [var.cache_nodes]
}

run "alarms_for_hosts_capacity_storage_and_worker_starts" {
  command = apply
  assert {
    condition     = aws_cloudwatch_metric_alarm.unhealthy_hosts[0].metric_name == "UnHealthyHostCount" && aws_cloudwatch_metric_alarm.unhealthy_hosts[0].dimensions.TargetGroup == var.target_group_arn_suffix
    error_message = "unhealthy gateway tasks page"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.gpu_capacity[0].dimensions.AutoScalingGroupName == "sluice-test-gpu-1" && aws_cloudwatch_metric_alarm.gpu_capacity[0].threshold == 4
    error_message = "the GPU group at its maximum pages"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.rds_storage[0].metric_name == "FreeStorageSpace" && aws_cloudwatch_metric_alarm.rds_storage[0].threshold == 5 * 1024 * 1024 * 1024
    error_message = "low RDS storage pages"
  }
  assert {
    condition     = jsondecode(aws_cloudwatch_event_rule.worker_start_failures[0].event_pattern)["$or"][0].detail.group[0].prefix == "service:sluice-test-worker-" && aws_cloudwatch_event_target.worker_start_failures[0].arn == aws_sns_topic.alarms.arn
    error_message = "worker tasks that fail go to the alarm topic"
  }
  assert {
    condition     = contains(jsondecode(aws_cloudwatch_event_rule.worker_start_failures[0].event_pattern)["$or"][1].detail.eventName, "SERVICE_TASK_PLACEMENT_FAILURE")
    error_message = "a worker service that cannot place its tasks goes there too"
  }
  assert {
    condition     = contains([for s in jsondecode(aws_sns_topic_policy.alarms.policy).Statement : try(s.Principal.Service, "") if s.Action == "sns:Publish"], "events.amazonaws.com")
    error_message = "EventBridge may publish to the topic"
  }
}

# issue #50: the policy admitted EventBridge alone, so every CloudWatch alarm's publish was denied
run "cloudwatch_alarms_may_publish_to_the_topic" {
  command = apply
  assert {
    condition = length([for s in jsondecode(aws_sns_topic_policy.alarms.policy).Statement : s
      if s.Effect == "Allow" && try(s.Principal.Service, "") == "cloudwatch.amazonaws.com" && s.Action == "sns:Publish"
    && s.Resource == aws_sns_topic.alarms.arn]) == 1
    error_message = "CloudWatch alarms may publish to the alarm topic"
  }
  assert {
    condition = alltrue([for s in jsondecode(aws_sns_topic_policy.alarms.policy).Statement :
      s.Condition.ArnLike["aws:SourceArn"] == "arn:aws:cloudwatch:us-east-1:123456789012:alarm:*"
    if try(s.Principal.Service, "") == "cloudwatch.amazonaws.com"])
    error_message = "only this account's alarms in this region"
  }
}

# issue #50: a Redis outage, a failed endpoint, ECS throttling, the EFS usage log, NAT ports, RDS connections, the
# daily export and spend paged nobody
run "alarms_on_the_limiter_failed_endpoints_throttling_and_dependencies" {
  command = apply
  variables {
    monthly_budget_usd = 5000
  }
  assert {
    condition     = strcontains(aws_cloudwatch_log_metric_filter.gateway_event["limiter_outage"].pattern, "limiter_backend_down") && strcontains(aws_cloudwatch_log_metric_filter.gateway_event["limiter_outage"].pattern, "limiter_backend_still_down")
    error_message = "the limiter's outage lines (gateway/limits/outage.py) are a metric"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.gateway_event["limiter_outage"].threshold == 1 && aws_cloudwatch_metric_alarm.gateway_event["limiter_outage"].alarm_actions == toset([aws_sns_topic.alarms.arn])
    error_message = "one outage line pages"
  }
  assert {
    condition     = strcontains(aws_cloudwatch_log_metric_filter.gateway_event["endpoint_failed"].pattern, "\"endpoint_failed\"") && strcontains(aws_cloudwatch_log_metric_filter.gateway_event["ecs_throttled"].pattern, "\"ecs_throttled\"")
    error_message = "failed endpoints and ECS throttling are metrics"
  }
  assert {
    condition     = [for node in ["001", "002"] : aws_cloudwatch_metric_alarm.dependency["redis_cpu_${node}"].dimensions.CacheClusterId] == ["sluice-test-001", "sluice-test-002"] && aws_cloudwatch_metric_alarm.dependency["redis_memory_002"].namespace == "AWS/ElastiCache" && !contains(keys(aws_cloudwatch_metric_alarm.dependency), "redis_cpu_003")
    error_message = "Redis CPU and memory page on every node (the primary moves on a failover)"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.dependency["efs_io_limit"].dimensions.FileSystemId == "fs-12345678" && aws_cloudwatch_metric_alarm.dependency["rds_connections"].metric_name == "DatabaseConnections"
    error_message = "the usage log's EFS and PostgreSQL's connections page"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.dependency["nat_1_port_allocation"].dimensions.NatGatewayId == "nat-0b"
    error_message = "each NAT gateway's port exhaustion pages"
  }
  assert {
    condition     = aws_cloudwatch_metric_alarm.usage_export_missing[0].treat_missing_data == "breaching" && jsondecode(aws_cloudwatch_event_rule.usage_export_failed[0].event_pattern).detail.group == ["family:sluice-test-usage-export"]
    error_message = "an export that fails, or does not run, pages"
  }
  assert {
    condition     = one([for n in aws_budgets_budget.monthly[0].notification : n.subscriber_sns_topic_arns if n.notification_type == "FORECASTED"]) == toset([aws_sns_topic.alarms.arn])
    error_message = "spend forecast past the budget reaches the topic"
  }
  assert {
    condition     = contains([for st in jsondecode(aws_sns_topic_policy.alarms.policy).Statement : try(st.Principal.Service, "")], "budgets.amazonaws.com")
    error_message = "AWS Budgets may publish to the topic"
  }
  assert {
    condition     = length(jsondecode(aws_cloudwatch_dashboard.main.dashboard_body).widgets) >= 5
    error_message = "one dashboard shows traffic, the queue, the gateway events, the hosts and the dependencies"
  }
}

run "no_budget_without_an_amount" {
  command = plan
  assert {
    condition     = length(aws_budgets_budget.monthly) == 0
    error_message = "monthly_budget_usd 0: no budget"
  }
}

# PutMetricAlarm refuses a window CloudWatch cannot evaluate: period a multiple of 60, period x evaluation periods at
# most one day below an hour's period and seven days otherwise, datapoints at most the periods
# (https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference/API_PutMetricAlarm.html); a plan cannot see it
run "every_alarm_window_is_one_cloudwatch_accepts" {
  command = apply
  assert {
    condition = alltrue([for a in concat(values(aws_cloudwatch_metric_alarm.dependency), values(aws_cloudwatch_metric_alarm.gateway_event),
      aws_cloudwatch_metric_alarm.usage_export_missing, aws_cloudwatch_metric_alarm.unhealthy_hosts, aws_cloudwatch_metric_alarm.gpu_capacity,
      [aws_cloudwatch_metric_alarm.activator_queue], aws_cloudwatch_metric_alarm.rds_cpu, aws_cloudwatch_metric_alarm.rds_storage) :
      a.period % 60 == 0 && a.period * a.evaluation_periods <= (a.period < 3600 ? 86400 : 604800)
    && coalesce(a.datapoints_to_alarm, a.evaluation_periods) <= a.evaluation_periods])
    error_message = "an alarm's window CloudWatch would refuse"
  }
  assert {
    condition = alltrue([for q in aws_cloudwatch_metric_alarm.gateway_5xx_rate[0].metric_query :
    q.metric[0].period * aws_cloudwatch_metric_alarm.gateway_5xx_rate[0].evaluation_periods <= 86400 if length(q.metric) > 0])
    error_message = "the 5xx rate's window CloudWatch would refuse"
  }
  assert {
    condition     = length(aws_cloudwatch_metric_alarm.dependency) == 8 && length(aws_cloudwatch_metric_alarm.usage_export_missing) == 1
    error_message = "the alarms checked above exist in this run"
  }
}
