mock_provider "aws" {
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_resource "aws_lb" {
    defaults = { arn_suffix = "app/sluice-test/0123456789abcdef" }
  }
  mock_resource "aws_lb_target_group" {
    defaults = { arn_suffix = "targetgroup/sluice-test-gw/0123456789abcdef" }
  }
}

variables {
  name                 = "sluice-test"
  vpc_id               = "vpc-1"
  public_subnet_ids    = ["subnet-pub-a", "subnet-pub-b"]
  private_subnet_ids   = ["subnet-a", "subnet-b"]
  security_group_ids   = { alb = "sg-alb", gateway = "sg-gw" }
  certificate_arn      = "arn:aws:acm:us-east-1:123456789012:certificate/00000000-0000-0000-0000-000000000000"
  image                = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sluice-gateway:0.1.0"
  execution_role_arn   = "arn:aws:iam::123456789012:role/exec"
  task_role_arn        = "arn:aws:iam::123456789012:role/task"
  export_task_role_arn = "arn:aws:iam::123456789012:role/sluice-test-export-task"
  export_exec_role_arn = "arn:aws:iam::123456789012:role/sluice-test-export-execution"
  log_group_name       = "/sluice/sluice-test/gateway"
  secret_arns          = { admin_key = "arn:aws:secretsmanager:us-east-1:123456789012:secret:a", key_pepper = "arn:aws:secretsmanager:us-east-1:123456789012:secret:p", database_url = "arn:aws:secretsmanager:us-east-1:123456789012:secret:d" }
  wal_file_system_id   = "fs-12345678"
  wal_access_point_id  = "fsap-12345678"
}

# One plan for what were 6 runs (each run starts the AWS provider again): the asserts
# of each, under its old name.
run "the_default_plan" {
  command = plan
  # https_listener_with_a_tls13_policy_and_http_redirect
  assert {
    condition     = aws_lb_listener.https.protocol == "HTTPS" && aws_lb_listener.https.port == 443
    error_message = "HTTPS on 443"
  }
  assert {
    condition     = aws_lb_listener.https.ssl_policy == "ELBSecurityPolicy-TLS13-1-2-2021-06" && aws_lb_listener.https.certificate_arn == var.certificate_arn
    error_message = "a modern TLS policy and the given certificate"
  }
  assert {
    condition     = aws_lb_listener.http.port == 80 && aws_lb_listener.http.default_action[0].type == "redirect"
    error_message = "HTTP only redirects"
  }
  assert {
    condition     = aws_lb_listener.http.default_action[0].redirect[0].protocol == "HTTPS" && aws_lb_listener.http.default_action[0].redirect[0].status_code == "HTTP_301"
    error_message = "the redirect goes to HTTPS, permanently"
  }
  assert {
    condition     = aws_lb.main.drop_invalid_header_fields
    error_message = "the ALB drops invalid headers"
  }
  # health_check_and_fargate_service_in_private_subnets
  assert {
    condition     = aws_lb_target_group.gateway.health_check[0].path == "/livez"
    error_message = "the target group checks liveness (/livez), not readiness (/health)"
  }
  assert {
    condition     = strcontains(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].healthCheck.command[3], "/livez")
    error_message = "the ECS container health check is liveness too"
  }
  assert {
    condition     = aws_ecs_service.gateway.launch_type == "FARGATE" && aws_ecs_service.gateway.network_configuration[0].assign_public_ip == false
    error_message = "Fargate tasks without public IPs"
  }
  assert {
    condition     = toset(aws_ecs_service.gateway.network_configuration[0].subnets) == toset(var.private_subnet_ids)
    error_message = "tasks run in the private subnets"
  }
  # secrets_come_from_secrets_manager_and_the_wal_from_efs
  assert {
    condition     = { for s in jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].secrets : s.name => s.valueFrom } == { SLUICE_ADMIN_KEY = var.secret_arns.admin_key, SLUICE_KEY_PEPPER = var.secret_arns.key_pepper, SLUICE_DATABASE_URL = var.secret_arns.database_url }
    error_message = "admin key, pepper and database URL are injected from Secrets Manager"
  }
  assert {
    condition     = alltrue([for e in jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].environment : length(regexall("KEY|PEPPER|PASSWORD|DATABASE_URL", e.name)) == 0])
    error_message = "no secret in plain environment variables"
  }
  assert {
    condition     = one(aws_ecs_task_definition.gateway.volume).efs_volume_configuration[0].transit_encryption == "ENABLED"
    error_message = "the WAL volume is EFS with TLS"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].stopTimeout == 120
    error_message = "the task gets Fargate's full stop timeout to drain its usage log"
  }
  assert {
    condition     = one([for e in jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].environment : e.value if e.name == "SLUICE_SHUTDOWN_GRACE_SECONDS"]) == "100"
    error_message = "requests in flight get the stop timeout less the usage log's 10 s drain and a margin"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].user == "10001:10001"
    error_message = "non-root"
  }
  # target_tracking_autoscaling
  assert {
    condition     = aws_appautoscaling_target.gateway[0].min_capacity == 2 && aws_appautoscaling_target.gateway[0].max_capacity == 10
    error_message = "2 to 10 tasks by default"
  }
  assert {
    condition     = aws_appautoscaling_policy.requests[0].policy_type == "TargetTrackingScaling"
    error_message = "target tracking"
  }
  # metrics_are_refused_at_the_alb
  assert {
    condition     = aws_lb_listener_rule.refuse_metrics.priority == 1 && aws_lb_listener_rule.refuse_metrics.action[0].type == "fixed-response"
    error_message = "the first rule of the HTTPS listener answers by itself"
  }
  assert {
    condition     = aws_lb_listener_rule.refuse_metrics.action[0].fixed_response[0].status_code == "404"
    error_message = "/metrics is a 404 from outside"
  }
  assert {
    condition     = toset(one(aws_lb_listener_rule.refuse_metrics.condition).path_pattern[0].values) == toset(["/metrics", "/metrics/*"])
    error_message = "every /metrics path"
  }
  # no_export_schedule_without_a_bucket
  assert {
    condition     = length(aws_scheduler_schedule.usage_export) == 0 && length(aws_ecs_task_definition.usage_export) == 0
    error_message = "the export is scheduled only where there is a bucket"
  }
}

run "weak_tls_policy_is_refused" {
  command = plan
  variables {
    ssl_policy = "ELBSecurityPolicy-2016-08"
  }
  expect_failures = [var.ssl_policy]
}

run "non_acm_certificate_is_refused" {
  command = plan
  variables {
    certificate_arn = "not-a-certificate"
  }
  expect_failures = [var.certificate_arn]
}

run "latest_image_is_refused" {
  command = plan
  variables {
    image = "sluice-gateway:latest"
  }
  expect_failures = [var.image]
}

run "scale_to_zero_gateway_is_refused" {
  command = plan
  variables {
    min_tasks = 0
  }
  expect_failures = [var.min_tasks]
}

run "stop_timeout_beyond_fargate_is_refused" {
  command = plan
  variables {
    stop_timeout_seconds = 300
  }
  expect_failures = [var.stop_timeout_seconds]
}

run "idle_timeout_outlasts_the_request_timeout_and_access_logs_are_on" {
  command = plan
  variables {
    request_timeout_seconds = 1200
    access_log_bucket       = "sluice-test-alb-logs-123456789012"
  }
  assert {
    condition     = aws_lb.main.idle_timeout == 1260
    error_message = "the ALB idle timeout is the gateway's request timeout plus a margin"
  }
  assert {
    condition     = aws_lb.main.access_logs[0].enabled && aws_lb.main.access_logs[0].bucket == "sluice-test-alb-logs-123456789012"
    error_message = "access logs go to the given bucket"
  }
}

run "a_request_timeout_beyond_the_drain_maximum_is_refused" {
  command = plan
  variables {
    request_timeout_seconds = 3595
  }
  expect_failures = [var.request_timeout_seconds]
}

run "a_deploy_lets_every_stream_finish_before_sigterm" {
  command = plan
  variables {
    request_timeout_seconds = 1200
  }
  assert {
    condition     = aws_lb_target_group.gateway.deregistration_delay == "1210"
    error_message = "the target group drains for the longest request (a stream) the gateway allows, not 30 s: ${aws_lb_target_group.gateway.deregistration_delay}"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].stopTimeout == 120 && contains(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].environment, { name = "SLUICE_SHUTDOWN_GRACE_SECONDS", value = "100" })
    error_message = "after the drain, SIGTERM: the gateway's own grace ends 20 s before ECS's stop timeout (the usage log's drain)"
  }
}

run "the_config_is_an_s3_object_named_by_version" {
  command = plan
  override_resource {
    target          = aws_s3_object.config
    override_during = plan # the version S3 gives the object, known at apply only
    values          = { version_id = "3HL4kqtJlcpXroDTDmJ.rmSpXd3dIbrHY" }
  }
  variables {
    config_toml   = "[[models]]\nname = \"m\"\n"
    config_bucket = "sluice-test-config-123456789012"
    kms_key_arn   = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
  }
  assert {
    condition     = aws_s3_object.config[0].bucket == var.config_bucket && aws_s3_object.config[0].key == "gateway/config.toml" && aws_s3_object.config[0].content == var.config_toml && aws_s3_object.config[0].kms_key_id == var.kms_key_arn
    error_message = "the rendered config is written, encrypted with the platform key, to the config bucket"
  }
  assert {
    condition     = contains(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].environment, { name = "SLUICE_CONFIG_S3", value = "s3://sluice-test-config-123456789012/gateway/config.toml?versionId=${aws_s3_object.config[0].version_id}" })
    error_message = "the task definition names the object's version (gateway/config_object.py reads it)"
  }
  assert {
    condition     = length([for e in jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].environment : e if e.name == "SLUICE_CONFIG_TOML"]) == 0
    error_message = "the config is no longer inline: the task definition's size no longer caps the endpoint count"
  }
}

run "without_a_bucket_the_config_stays_inline" {
  command = plan
  variables {
    config_toml = "[[models]]\nname = \"m\"\n"
  }
  assert {
    condition     = length(aws_s3_object.config) == 0 && contains(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].environment, { name = "SLUICE_CONFIG_TOML", value = var.config_toml })
    error_message = "envs/local (moto) keeps the config in the task definition"
  }
}

run "the_usage_export_runs_daily_on_fargate_with_a_writable_spool" {
  command = plan
  variables {
    export_bucket      = "sluice-test-exports-123456789012"
    scheduler_role_arn = "arn:aws:iam::123456789012:role/sluice-test-scheduler"
    kms_key_arn        = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
    secret_arns        = { admin_key = "arn:aws:secretsmanager:us-east-1:123456789012:secret:a", key_pepper = "arn:aws:secretsmanager:us-east-1:123456789012:secret:p", database_url = "arn:aws:secretsmanager:us-east-1:123456789012:secret:d" }
  }
  assert {
    condition     = aws_scheduler_schedule.usage_export["usage"].schedule_expression == "cron(30 1 * * ? *)" && aws_scheduler_schedule.usage_export["usage"].target[0].ecs_parameters[0].launch_type == "FARGATE"
    error_message = "daily, after the UTC day closed, as a Fargate task"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.usage_export["usage"].container_definitions)[0].command == ["usage", "export", "--bucket", "sluice-test-exports-123456789012", "--prefix", "usage/"]
    error_message = "the task runs `sluice usage export` into the exports bucket"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.usage_export["usage"].container_definitions)[0].readonlyRootFilesystem && jsondecode(aws_ecs_task_definition.usage_export["usage"].container_definitions)[0].mountPoints[0].containerPath == "/tmp"
    error_message = "a read-only root with a writable /tmp for the spool"
  }
  assert {
    condition     = [for s in jsondecode(aws_ecs_task_definition.usage_export["usage"].container_definitions)[0].secrets : s.name] == ["SLUICE_DATABASE_URL"]
    error_message = "the export gets the database URL and no other secret"
  }
  assert {
    condition     = aws_scheduler_schedule.usage_export["usage"].target[0].role_arn == var.scheduler_role_arn && aws_scheduler_schedule.usage_export["usage"].target[0].ecs_parameters[0].network_configuration[0].assign_public_ip == false
    error_message = "run by the scheduler's role, in the private subnets"
  }
  assert {
    condition     = aws_scheduler_schedule.usage_export["usage"].kms_key_arn == var.kms_key_arn
    error_message = "the schedule is encrypted with the platform key"
  }
  assert {
    condition     = aws_ecs_task_definition.usage_export["usage"].task_role_arn == var.export_task_role_arn && aws_ecs_task_definition.usage_export["usage"].execution_role_arn == var.export_exec_role_arn
    error_message = "the export runs with its own roles, not the serving gateway's (one role per job)"
  }
}

run "an_export_role_that_is_not_a_role_is_refused" {
  command = plan
  variables {
    export_task_role_arn = "sluice-test-export-task"
  }
  expect_failures = [var.export_task_role_arn]
}

run "metrics_are_scraped_inside_the_task_with_the_metrics_token" {
  command = plan
  variables {
    metrics_log_group_name = "/sluice/sluice-test/metrics"
    metrics_namespace      = "Sluice/sluice-test"
    secret_arns            = { admin_key = "arn:aws:secretsmanager:us-east-1:123456789012:secret:a", key_pepper = "arn:aws:secretsmanager:us-east-1:123456789012:secret:p", metrics_token = "arn:aws:secretsmanager:us-east-1:123456789012:secret:m" }
  }
  assert {
    condition     = [for c in jsondecode(aws_ecs_task_definition.gateway.container_definitions) : c.name] == ["gateway", "metrics-collector"] && !jsondecode(aws_ecs_task_definition.gateway.container_definitions)[1].essential
    error_message = "a non-essential collector beside the gateway"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.gateway.container_definitions)[1].secrets == [{ name = "SLUICE_METRICS_TOKEN", valueFrom = var.secret_arns.metrics_token }] && contains(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[0].secrets, { name = "SLUICE_METRICS_TOKEN", valueFrom = var.secret_arns.metrics_token })
    error_message = "the gateway and its collector share the metrics token (the gateway's metrics_token setting)"
  }
  assert {
    condition     = yamldecode(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[1].environment[0].value).receivers.prometheus.config.scrape_configs[0].static_configs[0].targets == ["127.0.0.1:8000"] && yamldecode(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[1].environment[0].value).receivers.prometheus.config.scrape_configs[0].authorization.credentials == "$${env:SLUICE_METRICS_TOKEN}"
    error_message = "the collector scrapes the gateway's own /metrics with the bearer token"
  }
  assert {
    condition     = yamldecode(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[1].environment[0].value).exporters.awsemf.log_group_name == "/sluice/sluice-test/metrics" && yamldecode(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[1].environment[0].value).exporters.awsemf.namespace == "Sluice/sluice-test/Gateway"
    error_message = "embedded-metric records to the metrics log group, per-model metrics in the environment's namespace"
  }
  # awsemf's {TaskId} is the resource attribute aws.ecs.task.id, set only by resourcedetection's ecs detector:
  # without it every task wrote the stream "gateway/undefined"
  assert {
    condition     = yamldecode(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[1].environment[0].value).exporters.awsemf.log_stream_name == "gateway/{TaskId}" && yamldecode(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[1].environment[0].value).service.pipelines.metrics.processors == ["resourcedetection"] && contains(yamldecode(jsondecode(aws_ecs_task_definition.gateway.container_definitions)[1].environment[0].value).processors.resourcedetection.detectors, "ecs")
    error_message = "each task's own stream: the ecs detector gives awsemf the task id"
  }
}

run "no_collector_without_a_metrics_token" {
  command = plan
  variables {
    metrics_log_group_name = "/sluice/sluice-test/metrics"
  }
  assert {
    condition     = length(jsondecode(aws_ecs_task_definition.gateway.container_definitions)) == 1
    error_message = "nothing to scrape with: the gateway alone"
  }
}

run "an_unpinned_collector_image_is_refused" {
  command = plan
  variables {
    metrics_collector_image = "public.ecr.aws/aws-observability/aws-otel-collector:latest"
  }
  expect_failures = [var.metrics_collector_image]
}
