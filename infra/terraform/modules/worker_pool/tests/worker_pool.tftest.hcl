mock_provider "aws" {
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_data "aws_ssm_parameter" {
    defaults = { value = "ami-0123456789abcdef0" }
  }
}

variables {
  name                 = "sluice-test"
  cluster_name         = "sluice-test"
  cluster_arn          = "arn:aws:ecs:us-east-1:123456789012:cluster/sluice-test"
  private_subnet_ids   = ["subnet-a", "subnet-b"]
  security_group_ids   = { worker = "sg-worker" }
  image                = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sluice-worker:0.1.0"
  instance_profile_arn = "arn:aws:iam::123456789012:instance-profile/worker"
  execution_role_arn   = "arn:aws:iam::123456789012:role/exec"
  task_role_arn        = "arn:aws:iam::123456789012:role/task"
  log_group_name       = "/sluice/sluice-test/worker"
  worker_secret_arn    = "arn:aws:secretsmanager:us-east-1:123456789012:secret:sluice-test/gateway/worker_secret-GhIjKl"
  endpoints = {
    "HuggingFaceTB/SmolLM2-135M-Instruct" = { source = "s3://weights/smollm2" }
    "meta-llama/Llama-3.1-8B-Instruct"    = { source = "s3://weights/llama", gpus = 2, quantization = "nf4" }
  }
}

# One plan for what were 8 runs (each run starts the AWS provider again): the asserts
# of each, under its old name.
run "the_default_plan" {
  command = plan
  # gpu_ami_from_ssm_and_an_asg_that_starts_at_zero
  assert {
    condition     = data.aws_ssm_parameter.gpu_ami[0].name == "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
    error_message = "the ECS GPU-optimized AMI, read from SSM"
  }
  assert {
    condition     = aws_launch_template.gpu.image_id == "ami-0123456789abcdef0"
    error_message = "the launch template uses the SSM AMI"
  }
  assert {
    condition     = aws_autoscaling_group.gpu.min_size == 0
    error_message = "the GPU pool can shrink to zero hosts"
  }
  assert {
    condition     = aws_launch_template.gpu.metadata_options[0].http_tokens == "required" && aws_launch_template.gpu.metadata_options[0].http_put_response_hop_limit == 1
    error_message = "IMDSv2 only, unreachable from task containers"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "ECS_ENABLE_GPU_SUPPORT=true")
    error_message = "the ECS agent exposes the GPUs"
  }
  # managed_scaling_capacity_provider
  assert {
    condition     = aws_ecs_capacity_provider.gpu.auto_scaling_group_provider[0].managed_scaling[0].status == "ENABLED"
    error_message = "managed scaling adds hosts for pending worker tasks"
  }
  assert {
    condition     = aws_ecs_capacity_provider.gpu.auto_scaling_group_provider[0].managed_termination_protection == "ENABLED" && aws_autoscaling_group.gpu.protect_from_scale_in
    error_message = "a host running a worker is never terminated by a scale-in"
  }
  assert {
    condition     = contains(aws_ecs_cluster_capacity_providers.main.capacity_providers, "sluice-test-gpu")
    error_message = "the cluster has the GPU provider"
  }
  # one_service_per_endpoint_reserving_gpus_at_zero
  assert {
    condition     = length(aws_ecs_service.worker) == 2
    error_message = "a service per endpoint"
  }
  assert {
    condition     = aws_ecs_service.worker["HuggingFaceTB/SmolLM2-135M-Instruct"].name == "sluice-test-worker-huggingfacetb-smollm2-135m-instruct"
    error_message = "service names are the endpoint name, slugged, after the prefix the gateway role is scoped to"
  }
  assert {
    condition     = alltrue([for s in aws_ecs_service.worker : s.desired_count == 0])
    error_message = "created at zero; the gateway's provisioner scales them"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.worker["meta-llama/Llama-3.1-8B-Instruct"].container_definitions)[0].resourceRequirements == [{ type = "GPU", value = "2" }]
    error_message = "the task definition reserves the endpoint's GPUs"
  }
  assert {
    condition     = jsondecode(jsondecode(aws_ecs_task_definition.worker["meta-llama/Llama-3.1-8B-Instruct"].container_definitions)[0].command[10]).name == "meta-llama/Llama-3.1-8B-Instruct"
    error_message = "the worker is told its endpoint's model"
  }
  assert {
    condition     = jsondecode(aws_ecs_task_definition.worker["meta-llama/Llama-3.1-8B-Instruct"].container_definitions)[0].secrets == [{ name = "SLUICE_WORKER_SECRET", valueFrom = var.worker_secret_arn }]
    error_message = "every worker gets the gateway's worker secret (it binds 0.0.0.0 and refuses to start without one)"
  }
  assert {
    condition     = output.worker_service_names["meta-llama/Llama-3.1-8B-Instruct"] == "sluice-test-worker-meta-llama-llama-3-1-8b-instruct"
    error_message = "the output maps endpoint name to service name"
  }
  # one_type_is_the_launch_template_and_on_demand_only
  assert {
    condition     = length(aws_autoscaling_group.gpu.launch_template) == 1 && length(aws_autoscaling_group.gpu.mixed_instances_policy) == 0 && aws_launch_template.gpu.instance_type == "g5.xlarge"
    error_message = "one instance type: the launch template as is (a warm pool stays possible)"
  }
  assert {
    condition     = length(aws_autoscaling_group.gpu_spot) == 0 && length(aws_ecs_capacity_provider.gpu_spot) == 0 && aws_ecs_cluster_capacity_providers.main.capacity_providers == toset(["FARGATE", "sluice-test-gpu"])
    error_message = "no spot capacity unless asked for"
  }
  assert {
    condition     = alltrue([for svc in aws_ecs_service.worker : length(svc.capacity_provider_strategy) == 1])
    error_message = "the services place on the on-demand provider only"
  }
  # al2023_gpu_ami_gp3_throughput_and_no_warm_pool_by_default
  assert {
    condition     = data.aws_ssm_parameter.gpu_ami[0].name == "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
    error_message = "the Amazon Linux 2023 ECS GPU AMI"
  }
  assert {
    condition     = one(aws_launch_template.gpu.block_device_mappings).ebs[0].throughput == 500 && one(aws_launch_template.gpu.block_device_mappings).ebs[0].iops == 4000
    error_message = "gp3 with its throughput set above the 125 MiB/s baseline"
  }
  assert {
    condition     = length(aws_autoscaling_group.gpu.warm_pool) == 0
    error_message = "no warm pool unless asked for"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "the worker image needs 12.8; not joining") && strcontains(base64decode(aws_launch_template.gpu.user_data), "CUDA Version")
    error_message = "each host checks its driver's CUDA against the image's before joining the cluster"
  }
  # no_launch_hook_without_a_warm_pool
  assert {
    condition     = length(aws_autoscaling_group.gpu.initial_lifecycle_hook) == 0 && !strcontains(base64decode(aws_launch_template.gpu.user_data), "complete-lifecycle-action")
    error_message = "no hook to complete: a plain launch goes straight into service"
  }
  # worker_tasks_cannot_reach_the_hosts_metadata
  # issue #50: worker tasks (awsvpc) could read the GPU host's instance-role credentials from IMDS
  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "ECS_AWSVPC_BLOCK_IMDS=true")
    error_message = "the ECS agent blocks IMDS for awsvpc tasks"
  }
  # worker_rollouts_keep_their_replicas
  # issue #50: minimum healthy 0 % stopped every replica of an endpoint at each rollout
  assert {
    condition     = alltrue([for s in aws_ecs_service.worker : s.deployment_minimum_healthy_percent == 100 && s.deployment_maximum_percent == 200])
    error_message = "a rollout starts the new task before it stops the old one"
  }
  assert {
    condition     = alltrue([for s in aws_ecs_service.worker : one(s.deployment_circuit_breaker).enable && one(s.deployment_circuit_breaker).rollback])
    error_message = "a rollout whose tasks never start rolls back"
  }
}

run "ami_override_skips_ssm" {
  command = plan
  variables {
    ami_id = "ami-override"
  }
  assert {
    condition     = length(data.aws_ssm_parameter.gpu_ami) == 0 && aws_launch_template.gpu.image_id == "ami-override"
    error_message = "an explicit AMI wins"
  }
}

run "cpu_instance_type_is_refused" {
  command = plan
  variables {
    instance_types = ["g5.xlarge", "m5.large"]
  }
  expect_failures = [var.instance_types]
}

run "no_or_repeated_instance_types_are_refused" {
  command = plan
  variables {
    instance_types = ["g5.xlarge", "g5.xlarge"]
  }
  expect_failures = [var.instance_types]
}

run "an_empty_instance_type_list_is_refused" {
  command = plan
  variables {
    instance_types = []
  }
  expect_failures = [var.instance_types]
}

run "several_types_on_demand_in_the_lists_order" {
  command = plan
  variables {
    instance_types = ["g6.xlarge", "g5.xlarge", "g4dn.xlarge"]
  }
  assert {
    condition     = length(aws_autoscaling_group.gpu.launch_template) == 0 && [for o in one(one(aws_autoscaling_group.gpu.mixed_instances_policy).launch_template).override : o.instance_type] == ["g6.xlarge", "g5.xlarge", "g4dn.xlarge"]
    error_message = "every listed type is an override of the on-demand group"
  }
  assert {
    condition     = one(one(aws_autoscaling_group.gpu.mixed_instances_policy).instances_distribution).on_demand_allocation_strategy == "prioritized" && one(one(aws_autoscaling_group.gpu.mixed_instances_policy).instances_distribution).on_demand_percentage_above_base_capacity == 100
    error_message = "on-demand only, the first type with capacity first"
  }
}

run "a_warm_pool_with_several_types_is_refused" {
  command = plan
  variables {
    instance_types = ["g6.xlarge", "g5.xlarge"]
    warm_pool_size = 1
  }
  expect_failures = [aws_autoscaling_group.gpu]
}

run "spot_capacity_beside_on_demand" {
  command = plan
  variables {
    instance_types = ["g6.xlarge", "g5.xlarge"]
    spot           = { enabled = true, max_instances = 6, on_demand_base = 1, on_demand_weight = 1, spot_weight = 3 }
  }
  assert {
    condition     = one(one(aws_autoscaling_group.gpu_spot[0].mixed_instances_policy).instances_distribution).on_demand_percentage_above_base_capacity == 0 && one(one(aws_autoscaling_group.gpu_spot[0].mixed_instances_policy).instances_distribution).spot_allocation_strategy == "price-capacity-optimized" && aws_autoscaling_group.gpu_spot[0].max_size == 6 && aws_autoscaling_group.gpu_spot[0].min_size == 0
    error_message = "a spot group of the listed types, price-capacity-optimized, from zero"
  }
  assert {
    condition     = aws_autoscaling_group.gpu_spot[0].capacity_rebalance && aws_autoscaling_group.gpu_spot[0].protect_from_scale_in && aws_ecs_capacity_provider.gpu_spot[0].auto_scaling_group_provider[0].managed_termination_protection == "ENABLED"
    error_message = "replacements start on a rebalance signal; hosts with workers are never scaled in"
  }
  assert {
    condition     = contains(aws_ecs_cluster_capacity_providers.main.capacity_providers, "sluice-test-gpu-spot")
    error_message = "the cluster holds the spot provider"
  }
  assert {
    condition = alltrue([for svc in aws_ecs_service.worker : { for c in svc.capacity_provider_strategy : c.capacity_provider => c.weight } == {
      "sluice-test-gpu" = 1, "sluice-test-gpu-spot" = 3
    } && one([for c in svc.capacity_provider_strategy : c.base if c.capacity_provider == "sluice-test-gpu"]) == 1])
    error_message = "each endpoint keeps its first task on demand and splits the rest 1:3"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "ECS_ENABLE_SPOT_INSTANCE_DRAINING=true")
    error_message = "an interrupted spot host drains its tasks to other hosts"
  }
}

run "spot_weights_of_zero_are_refused" {
  command = plan
  variables {
    spot = { enabled = true, on_demand_weight = 0, spot_weight = 0 }
  }
  expect_failures = [var.spot]
}

run "a_fractional_spot_size_is_refused" {
  command = plan
  variables {
    spot = { enabled = true, max_instances = 1.5 }
  }
  expect_failures = [var.spot]
}

run "zero_gpus_is_refused" {
  command = plan
  variables {
    endpoints = { "a" = { source = "s3://w/a", gpus = 0 } }
  }
  expect_failures = [var.endpoints]
}

run "colliding_service_names_are_refused" {
  command = plan
  variables {
    endpoints = { "org/model" = { source = "s3://w/a" }, "org-model" = { source = "s3://w/b" } }
  }
  expect_failures = [var.endpoints]
}

run "unknown_quantization_is_refused" {
  command = plan
  variables {
    endpoints = { "a" = { source = "s3://w/a", quantization = "int3" } }
  }
  expect_failures = [var.endpoints]
}

run "worker_secret_must_be_an_arn" {
  command = plan
  variables {
    worker_secret_arn = "hunter2"
  }
  expect_failures = [var.worker_secret_arn]
}

# One plan for what were 2 runs (each run starts the AWS provider again): the asserts
# of each, under its old name.
run "a_warm_pool_of_two" {
  command = plan
  variables {
    warm_pool_size = 2
  }
  # a_warm_pool_of_stopped_hosts_with_the_image_pulled
  assert {
    condition     = one(aws_autoscaling_group.gpu.warm_pool).pool_state == "Stopped" && one(aws_autoscaling_group.gpu.warm_pool).min_size == 2
    error_message = "two stopped hosts wait in the pool"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "ECS_WARM_POOLS_CHECK=true") && strcontains(base64decode(aws_launch_template.gpu.user_data), "docker pull ${var.image}")
    error_message = "a warmed host pulls the worker image, and the ECS agent waits until it is in service"
  }
  # the_warm_pool_as_aws_documents_it_for_ecs
  # issue #50: ReuseOnScaleIn (which AWS refuses for ECS) and no launch hook, so a warmed host was stopped mid-pull
  assert {
    condition     = !try(one(one(aws_autoscaling_group.gpu.warm_pool).instance_reuse_policy).reuse_on_scale_in, false)
    error_message = "no ReuseOnScaleIn: ECS does not support returning hosts to the warm pool on scale-in"
  }
  assert {
    condition     = one(aws_autoscaling_group.gpu.initial_lifecycle_hook).lifecycle_transition == "autoscaling:EC2_INSTANCE_LAUNCHING" && one(aws_autoscaling_group.gpu.initial_lifecycle_hook).heartbeat_timeout == 1800
    error_message = "a launch hook holds each warmed host until its image is pulled"
  }
  assert {
    condition     = strcontains(base64decode(aws_launch_template.gpu.user_data), "complete-lifecycle-action --region us-east-1 --lifecycle-hook-name ${one(aws_autoscaling_group.gpu.initial_lifecycle_hook).name}") && strcontains(base64decode(aws_launch_template.gpu.user_data), "/var/lib/cloud/scripts/per-boot/")
    error_message = "user data completes the hook after the pull, and every later boot (into service) completes it too"
  }
  assert {
    condition     = strcontains(split("docker pull", base64decode(aws_launch_template.gpu.user_data))[1], "sluice-launch-done.sh")
    error_message = "the hook is completed after the pull, not before"
  }
}

run "an_image_needing_a_newer_cuda_than_the_driver_is_refused" {
  command = plan
  variables {
    image_cuda_version      = "12.9"
    ami_driver_cuda_version = "12.8"
  }
  expect_failures = [aws_autoscaling_group.gpu]
}

run "amazon_linux_2_is_refused" {
  command = plan
  variables {
    ami_ssm_parameter = "/aws/service/ecs/optimized-ami/amazon-linux-2/gpu/recommended/image_id"
  }
  expect_failures = [var.ami_ssm_parameter]
}
