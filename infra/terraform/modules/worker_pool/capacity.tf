# GPU hosts: a launch template with the ECS GPU-optimized AMI, an autoscaling group that starts at
# zero, and a capacity provider whose managed scaling adds hosts when worker tasks need them.

data "aws_region" "current" {}

data "aws_ssm_parameter" "gpu_ami" {
  count = var.ami_id == "" ? 1 : 0
  name  = var.ami_ssm_parameter
}

locals {
  ami_id      = var.ami_id != "" ? var.ami_id : nonsensitive(data.aws_ssm_parameter.gpu_ami[0].value)
  launch_hook = "${var.name}-gpu-launch"
}

resource "aws_launch_template" "gpu" {
  name_prefix   = "${var.name}-gpu-"
  image_id      = local.ami_id
  instance_type = var.instance_types[0] # the groups below override it with the whole list
  user_data = base64encode(templatefile("${path.module}/user_data.sh.tftpl", {
    cluster     = var.cluster_name
    image       = var.image
    image_cuda  = var.image_cuda_version
    warm_pool   = var.warm_pool_size > 0
    launch_hook = local.launch_hook
    region      = data.aws_region.current.name
    registry    = split("/", var.image)[0]
    ecr_image   = can(regex("^[0-9]{12}\\.dkr\\.ecr\\.", var.image))
  }))
  iam_instance_profile {
    arn = var.instance_profile_arn
  }
  vpc_security_group_ids = [var.security_group_ids["worker"]]
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1 # tasks use their own task role, never the host's
  }
  monitoring {
    enabled = true
  }
  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = 200 # images with CUDA torch, and model weights
      volume_type           = "gp3"
      throughput            = var.root_volume_throughput # MiB/s: the image pull and weights are read-bound
      iops                  = var.root_volume_iops
      encrypted             = true
      delete_on_termination = true
    }
  }
}

resource "aws_autoscaling_group" "gpu" {
  name_prefix               = "${var.name}-gpu-"
  min_size                  = 0
  max_size                  = var.max_instances
  vpc_zone_identifier       = var.private_subnet_ids
  protect_from_scale_in     = true # managed termination protection: never drain a host with a worker on it
  health_check_type         = "EC2"
  health_check_grace_period = 300
  # one type: the launch template as is (a warm pool needs that: AWS refuses one on a mixed-instances group);
  # several: on-demand hosts of the first type that has capacity, in the list's order
  dynamic "launch_template" {
    for_each = length(var.instance_types) == 1 ? [1] : []
    content {
      id      = aws_launch_template.gpu.id
      version = aws_launch_template.gpu.latest_version
    }
  }
  dynamic "mixed_instances_policy" {
    for_each = length(var.instance_types) > 1 ? [1] : []
    content {
      instances_distribution {
        on_demand_allocation_strategy            = "prioritized"
        on_demand_base_capacity                  = 0
        on_demand_percentage_above_base_capacity = 100
      }
      launch_template {
        launch_template_specification {
          launch_template_id = aws_launch_template.gpu.id
          version            = aws_launch_template.gpu.latest_version
        }
        dynamic "override" {
          for_each = var.instance_types
          content {
            instance_type = override.value
          }
        }
      }
    }
  }
  tag {
    key                 = "AmazonECSManaged"
    value               = "true"
    propagate_at_launch = true
  }
  # stopped hosts with the worker image already pulled: a scale-out starts one in about a minute instead of
  # launching and pulling for several. As AWS documents for ECS: no ReuseOnScaleIn (ECS refuses it: a host that
  # scales in terminates), ECS_WARM_POOLS_CHECK in user data, and a launch hook that user data completes once the
  # pull is done (without it the host was stopped as soon as it booted, cutting the pull)
  dynamic "warm_pool" {
    for_each = var.warm_pool_size > 0 ? [var.warm_pool_size] : []
    content {
      pool_state                  = "Stopped"
      min_size                    = warm_pool.value
      max_group_prepared_capacity = warm_pool.value
    }
  }
  dynamic "initial_lifecycle_hook" {
    for_each = var.warm_pool_size > 0 ? [local.launch_hook] : []
    content {
      name                 = initial_lifecycle_hook.value
      lifecycle_transition = "autoscaling:EC2_INSTANCE_LAUNCHING"
      default_result       = "CONTINUE" # a host whose script died still goes on (its first task pulls the image)
      heartbeat_timeout    = var.warm_pull_timeout_seconds
    }
  }
  enabled_metrics = ["GroupDesiredCapacity", "GroupInServiceInstances", "GroupMaxSize", "GroupPendingInstances"]
  lifecycle {
    ignore_changes = [desired_capacity] # the capacity provider owns it
    precondition {
      condition     = var.warm_pool_size == 0 || length(var.instance_types) == 1
      error_message = "warm_pool_size > 0 needs one instance type: AWS refuses a warm pool on a mixed-instances group."
    }
    precondition {
      condition     = tonumber(split(".", var.image_cuda_version)[0]) * 100 + tonumber(split(".", var.image_cuda_version)[1]) <= tonumber(split(".", var.ami_driver_cuda_version)[0]) * 100 + tonumber(split(".", var.ami_driver_cuda_version)[1])
      error_message = "the worker image's CUDA (image_cuda_version) is newer than the AMI's NVIDIA driver serves (ami_driver_cuda_version): pick a newer AMI or an older torch CUDA build."
    }
  }
}

resource "aws_ecs_capacity_provider" "gpu" {
  name = "${var.name}-gpu"
  auto_scaling_group_provider {
    auto_scaling_group_arn         = aws_autoscaling_group.gpu.arn
    managed_termination_protection = "ENABLED"
    managed_draining               = "ENABLED"
    managed_scaling {
      status                    = "ENABLED"
      target_capacity           = var.target_capacity_percent
      minimum_scaling_step_size = 1
      maximum_scaling_step_size = var.max_instances
      instance_warmup_period    = 180
    }
  }
}

# Spot GPU hosts (optional): a second group and capacity provider, any of the listed types at the best price and
# capacity. The services keep `spot.on_demand_base` tasks on on-demand hosts and spread the rest by the weights;
# an interrupted host is drained by its ECS agent (ECS_ENABLE_SPOT_INSTANCE_DRAINING) and its tasks start elsewhere.
resource "aws_autoscaling_group" "gpu_spot" {
  count                     = var.spot.enabled ? 1 : 0
  name_prefix               = "${var.name}-gpu-spot-"
  min_size                  = 0
  max_size                  = var.spot.max_instances
  vpc_zone_identifier       = var.private_subnet_ids
  protect_from_scale_in     = true
  health_check_type         = "EC2"
  health_check_grace_period = 300
  capacity_rebalance        = true # start a replacement when AWS signals an elevated interruption risk
  mixed_instances_policy {
    instances_distribution {
      on_demand_base_capacity                  = 0
      on_demand_percentage_above_base_capacity = 0
      spot_allocation_strategy                 = "price-capacity-optimized"
    }
    launch_template {
      launch_template_specification {
        launch_template_id = aws_launch_template.gpu.id
        version            = aws_launch_template.gpu.latest_version
      }
      dynamic "override" {
        for_each = var.instance_types
        content {
          instance_type = override.value
        }
      }
    }
  }
  tag {
    key                 = "AmazonECSManaged"
    value               = "true"
    propagate_at_launch = true
  }
  enabled_metrics = ["GroupDesiredCapacity", "GroupInServiceInstances", "GroupMaxSize", "GroupPendingInstances"]
  lifecycle {
    ignore_changes = [desired_capacity]
  }
}

resource "aws_ecs_capacity_provider" "gpu_spot" {
  count = var.spot.enabled ? 1 : 0
  name  = "${var.name}-gpu-spot"
  auto_scaling_group_provider {
    auto_scaling_group_arn         = aws_autoscaling_group.gpu_spot[0].arn
    managed_termination_protection = "ENABLED"
    managed_draining               = "ENABLED"
    managed_scaling {
      status                    = "ENABLED"
      target_capacity           = var.target_capacity_percent
      minimum_scaling_step_size = 1
      maximum_scaling_step_size = var.spot.max_instances
      instance_warmup_period    = 180
    }
  }
}

# the gateway runs on Fargate, the workers on the GPU providers
resource "aws_ecs_cluster_capacity_providers" "main" {
  cluster_name       = var.cluster_name
  capacity_providers = concat(["FARGATE", aws_ecs_capacity_provider.gpu.name], aws_ecs_capacity_provider.gpu_spot[*].name)
}
