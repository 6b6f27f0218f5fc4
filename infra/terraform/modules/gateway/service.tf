# The gateway on Fargate: secrets from Secrets Manager, the usage WAL on EFS, target-tracking scaling.

locals {
  secret_env = { for key, arn in var.secret_arns : "SLUICE_${upper(key)}" => arn }
  environment = merge(
    {
      SLUICE_LOG_FORMAT = "json"
      SLUICE_DATA_DIR   = "/var/lib/sluice"
      # each task's WAL in its own directory on EFS; a dead task's directory is replayed by a live one
      SLUICE_WAL_ROOT = "/var/lib/sluice/wal"
      # SIGTERM to SIGKILL: requests in flight finish, then the usage log drains (10 s) with margin
      SLUICE_SHUTDOWN_GRACE_SECONDS = tostring(var.stop_timeout_seconds - 20)
    },
    # the config as an S3 object (any number of endpoints) or, without a bucket, inline (the task definition's
    # size limit allows ~150 endpoints); the object's version rolls the gateways and pins what a rollback reads
    var.config_toml == "" ? {} : var.config_bucket == "" ? { SLUICE_CONFIG_TOML = var.config_toml } : {
      SLUICE_CONFIG_S3                                                          = "s3://${var.config_bucket}/${local.config_key}?versionId=${aws_s3_object.config[0].version_id}"
    },
  )
  container = {
    name                   = "gateway"
    image                  = var.image
    essential              = true
    readonlyRootFilesystem = true
    user                   = "10001:10001"
    stopTimeout            = var.stop_timeout_seconds
    portMappings           = [{ containerPort = var.port, protocol = "tcp" }]
    # liveness only: a gateway whose endpoints are cold or failed is still a healthy gateway
    healthCheck = {
      command     = ["CMD", "python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:${var.port}/livez', timeout=3)"]
      interval    = 15
      timeout     = 5
      retries     = 3
      startPeriod = 60
    }
    command     = ["serve", "--host", "0.0.0.0", "--port", tostring(var.port)]
    environment = [for key in sort(keys(local.environment)) : { name = key, value = local.environment[key] }]
    secrets     = [for key in sort(keys(local.secret_env)) : { name = key, valueFrom = local.secret_env[key] }]
    mountPoints = [{ sourceVolume = "wal", containerPath = "/var/lib/sluice", readOnly = false }]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = var.log_group_name
        awslogs-region        = data.aws_region.current.name
        awslogs-stream-prefix = "gateway"
      }
    }
  }
}

data "aws_region" "current" {}

locals {
  config_key = "gateway/config.toml"
}

resource "aws_s3_object" "config" {
  count        = var.config_toml != "" && var.config_bucket != "" ? 1 : 0
  bucket       = var.config_bucket
  key          = local.config_key
  content      = var.config_toml
  content_type = "application/toml"
  kms_key_id   = var.kms_key_arn
}

resource "aws_ecs_task_definition" "gateway" {
  family                   = "${var.name}-gateway"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.cpu
  memory                   = var.memory
  execution_role_arn       = var.execution_role_arn
  task_role_arn            = var.task_role_arn
  container_definitions    = jsonencode(concat([local.container], local.collector ? [local.collector_container] : []))
  runtime_platform {
    operating_system_family = "LINUX"
    cpu_architecture        = "X86_64"
  }
  volume {
    name = "wal"
    efs_volume_configuration {
      file_system_id     = var.wal_file_system_id
      transit_encryption = "ENABLED"
      authorization_config {
        access_point_id = var.wal_access_point_id
        iam             = "ENABLED"
      }
    }
  }
}

resource "aws_ecs_service" "gateway" {
  name                               = "${var.name}-gateway"
  cluster                            = aws_ecs_cluster.main.arn
  task_definition                    = aws_ecs_task_definition.gateway.arn
  desired_count                      = var.min_tasks
  launch_type                        = "FARGATE"
  platform_version                   = "LATEST"
  health_check_grace_period_seconds  = 60
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200
  propagate_tags                     = "SERVICE"
  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [var.security_group_ids["gateway"]]
    assign_public_ip = false
  }
  load_balancer {
    target_group_arn = aws_lb_target_group.gateway.arn
    container_name   = "gateway"
    container_port   = var.port
  }
  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
  lifecycle {
    ignore_changes = [desired_count] # the autoscaler below owns it after creation
  }
  depends_on = [aws_lb_listener.https]
}

resource "aws_appautoscaling_target" "gateway" {
  count              = var.autoscaling ? 1 : 0
  service_namespace  = "ecs"
  resource_id        = "service/${aws_ecs_cluster.main.name}/${aws_ecs_service.gateway.name}"
  scalable_dimension = "ecs:service:DesiredCount"
  min_capacity       = var.min_tasks
  max_capacity       = var.max_tasks
}

resource "aws_appautoscaling_policy" "requests" {
  count              = var.autoscaling ? 1 : 0
  name               = "${var.name}-gateway-requests"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.gateway[0].service_namespace
  resource_id        = aws_appautoscaling_target.gateway[0].resource_id
  scalable_dimension = aws_appautoscaling_target.gateway[0].scalable_dimension
  target_tracking_scaling_policy_configuration {
    target_value       = var.target_requests_per_task
    scale_in_cooldown  = 300
    scale_out_cooldown = 60
    predefined_metric_specification {
      predefined_metric_type = "ALBRequestCountPerTarget"
      resource_label         = "${aws_lb.main.arn_suffix}/${aws_lb_target_group.gateway.arn_suffix}"
    }
  }
}

resource "aws_appautoscaling_policy" "cpu" {
  count              = var.autoscaling ? 1 : 0
  name               = "${var.name}-gateway-cpu"
  policy_type        = "TargetTrackingScaling"
  service_namespace  = aws_appautoscaling_target.gateway[0].service_namespace
  resource_id        = aws_appautoscaling_target.gateway[0].resource_id
  scalable_dimension = aws_appautoscaling_target.gateway[0].scalable_dimension
  target_tracking_scaling_policy_configuration {
    target_value = 60
    predefined_metric_specification {
      predefined_metric_type = "ECSServiceAverageCPUUtilization"
    }
  }
}
