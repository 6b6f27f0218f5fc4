# The daily usage export (`sluice usage export`, billing/exports/s3.py): EventBridge Scheduler runs the gateway
# image as a one-off Fargate task each day, after the UTC day it exports (yesterday's) has closed. The export
# spools each team's file in $TMPDIR before upload: the root filesystem is read-only, so /tmp is the task's
# ephemeral storage. Rerunning it is safe: an object with the same SHA-256 is not uploaded again.

locals {
  export = var.export_bucket == "" ? {} : { usage = var.export_bucket }
  export_container = {
    name                   = "usage-export"
    image                  = var.image
    essential              = true
    readonlyRootFilesystem = true
    user                   = "10001:10001"
    command                = ["usage", "export", "--bucket", var.export_bucket, "--prefix", var.export_prefix]
    environment            = [{ name = "SLUICE_LOG_FORMAT", value = "json" }, { name = "TMPDIR", value = "/tmp" }]
    secrets                = [for key in sort(keys(local.secret_env)) : { name = key, valueFrom = local.secret_env[key] } if key == "SLUICE_DATABASE_URL"]
    mountPoints            = [{ sourceVolume = "spool", containerPath = "/tmp", readOnly = false }]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = var.log_group_name
        awslogs-region        = data.aws_region.current.name
        awslogs-stream-prefix = "usage-export"
      }
    }
  }
}

resource "aws_ecs_task_definition" "usage_export" {
  for_each                 = local.export
  family                   = "${var.name}-usage-export"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = 512
  memory                   = 1024
  # its own roles (modules/iam export-*): the exports bucket and the database URL, none of the gateway's grants
  execution_role_arn    = var.export_exec_role_arn
  task_role_arn         = var.export_task_role_arn
  container_definitions = jsonencode([local.export_container])
  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }
  ephemeral_storage {
    size_in_gib = 21 # Fargate's minimum: one team-day of gzipped records spools far below it
  }
  volume {
    name = "spool"
  }
}

resource "aws_scheduler_schedule" "usage_export" {
  for_each                     = local.export
  name                         = "${var.name}-usage-export"
  schedule_expression          = var.export_schedule
  schedule_expression_timezone = "UTC"
  kms_key_arn                  = var.kms_key_arn
  flexible_time_window {
    mode = "OFF"
  }
  target {
    arn      = aws_ecs_cluster.main.arn
    role_arn = var.scheduler_role_arn
    ecs_parameters {
      task_definition_arn = aws_ecs_task_definition.usage_export[each.key].arn
      launch_type         = "FARGATE"
      task_count          = 1
      network_configuration {
        subnets          = var.private_subnet_ids
        security_groups  = [var.security_group_ids["gateway"]] # reaches PostgreSQL, S3 and the AWS APIs
        assign_public_ip = false
      }
    }
    retry_policy {
      maximum_event_age_in_seconds = 3600
      maximum_retry_attempts       = 3
    }
  }
}
