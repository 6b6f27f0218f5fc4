# One ECS service per endpoint. The gateway's ECS provisioner owns desired_count (scale to zero and
# back); Terraform creates each service at 0 and never touches the count again.

locals {
  scratch = { data = "/var/lib/sluice", cache = "/var/cache/sluice", tmp = "/tmp" }
  slugs   = { for name in keys(var.endpoints) : name => substr(trim(replace(lower(name), "/[^a-z0-9]+/", "-"), "-"), 0, 40) }
  services = {
    for name, endpoint in var.endpoints : name => {
      family  = "${var.name}-worker-${local.slugs[name]}"
      service = "${var.name}-worker-${local.slugs[name]}"
      model = {
        name           = name
        source         = endpoint.source
        quantization   = endpoint.quantization
        max_batch_size = endpoint.max_batch_size
      }
    }
  }
}

resource "aws_ecs_task_definition" "worker" {
  for_each                 = var.endpoints
  family                   = local.services[each.key].family
  requires_compatibilities = ["EC2"]
  network_mode             = "awsvpc"
  memory                   = each.value.memory_mib
  execution_role_arn       = var.execution_role_arn
  task_role_arn            = var.task_role_arn
  container_definitions = jsonencode([{
    name                   = "worker"
    image                  = var.image
    essential              = true
    user                   = "10001:10001"
    memoryReservation      = each.value.memory_mib
    readonlyRootFilesystem = true
    # writable scratch on the host's disk: downloaded weights, compiled-kernel caches, temp files
    mountPoints = [for volume, path in local.scratch : { sourceVolume = volume, containerPath = path, readOnly = false }]
    environment = [{ name = "HOME", value = "/var/cache/sluice" }]
    # the gateway's SLUICE_WORKER_SECRET: a worker bound to 0.0.0.0 refuses to start without it
    secrets              = [{ name = "SLUICE_WORKER_SECRET", valueFrom = var.worker_secret_arn }]
    stopTimeout          = 120
    resourceRequirements = [{ type = "GPU", value = tostring(each.value.gpus) }]
    portMappings         = [{ containerPort = var.worker_port, protocol = "tcp" }]
    command = ["worker", "--host", "0.0.0.0", "--port", tostring(var.worker_port), "--data-dir", "/var/lib/sluice",
    "--worker-id", local.services[each.key].service, "--model-json", jsonencode(local.services[each.key].model)]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = var.log_group_name
        awslogs-region        = data.aws_region.current.name
        awslogs-stream-prefix = local.slugs[each.key]
      }
    }
  }])
  dynamic "volume" {
    for_each = local.scratch
    content {
      name = volume.key
    }
  }
}

resource "aws_ecs_service" "worker" {
  for_each        = var.endpoints
  name            = local.services[each.key].service
  cluster         = var.cluster_arn
  task_definition = aws_ecs_task_definition.worker[each.key].arn
  desired_count   = 0
  # a rollout starts each new task (a GPU host the capacity provider adds if none is free) before it stops the
  # old one, so an endpoint keeps its replicas; at 0 % every replica stopped at once (a cold start per rollout)
  deployment_minimum_healthy_percent = 100
  deployment_maximum_percent         = 200
  propagate_tags                     = "SERVICE"
  enable_ecs_managed_tags            = true
  tags                               = { "sluice:endpoint" = each.key }
  deployment_circuit_breaker {
    enable   = true # a task definition whose tasks never start rolls back instead of retrying forever
    rollback = true
  }
  capacity_provider_strategy {
    capacity_provider = aws_ecs_capacity_provider.gpu.name
    base              = var.spot.enabled ? var.spot.on_demand_base : 0
    weight            = var.spot.enabled ? var.spot.on_demand_weight : 1
  }
  dynamic "capacity_provider_strategy" {
    for_each = aws_ecs_capacity_provider.gpu_spot[*].name
    content {
      capacity_provider = capacity_provider_strategy.value
      weight            = var.spot.spot_weight
    }
  }
  network_configuration {
    subnets          = var.private_subnet_ids
    security_groups  = [var.security_group_ids["worker"]]
    assign_public_ip = false
  }
  lifecycle {
    ignore_changes = [desired_count]
  }
  depends_on = [aws_ecs_cluster_capacity_providers.main]
}
