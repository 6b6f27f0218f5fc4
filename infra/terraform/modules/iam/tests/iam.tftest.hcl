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
}

variables {
  name                  = "sluice-test"
  cluster_name          = "sluice-test"
  worker_service_prefix = "sluice-test-worker-"
  gateway_secret_arns   = ["arn:aws:secretsmanager:us-east-1:123456789012:secret:sluice-test/gateway/admin_key-AbCdEf"]
  worker_secret_arn     = "arn:aws:secretsmanager:us-east-1:123456789012:secret:sluice-test/gateway/worker_secret-GhIjKl"
  export_bucket_arn     = "arn:aws:s3:::sluice-test-exports-123456789012"
  export_secret_arn     = "arn:aws:secretsmanager:us-east-1:123456789012:secret:sluice-test/gateway/database_url-MnOpQr"
  config_object_arn     = "arn:aws:s3:::sluice-test-config-123456789012/gateway/config.toml"
  weights_bucket_arn    = "arn:aws:s3:::sluice-test-weights-123456789012"
  kms_key_arn           = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
  wal_file_system_arn   = "arn:aws:elasticfilesystem:us-east-1:123456789012:file-system/fs-12345678"
  wal_access_point_arn  = "arn:aws:elasticfilesystem:us-east-1:123456789012:access-point/fsap-12345678"
  gateway_log_group_arn = "arn:aws:logs:us-east-1:123456789012:log-group:/sluice/sluice-test/gateway"
  worker_log_group_arn  = "arn:aws:logs:us-east-1:123456789012:log-group:/sluice/sluice-test/worker"
  metric_namespace      = "Sluice/sluice-test"
  batch_files           = { bucket_arn = "arn:aws:s3:::sluice-test-batch-files-123456789012", prefix = "batch-files/" }
}

# One plan for what were 5 runs (each run starts the AWS provider again): the asserts
# of each, under its old name.
run "the_default_plan" {
  command = plan
  # gateway_task_role_touches_only_worker_services_and_its_config
  assert {
    condition = toset(flatten([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Action])) == toset([
      "ecs:UpdateService", "ecs:DescribeServices", "ecs:ListTasks", "ecs:DescribeTasks", "ecs:StopTask", "ecs:UpdateTaskProtection",
      "s3:GetObject", "kms:Decrypt", "elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite", "cloudwatch:PutMetricData",
      "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListBucketMultipartUploads", "kms:GenerateDataKey",
    ])
    error_message = "the gateway task role has exactly the actions the gateway's code calls (no secrets: ECS injects them; no exports: the export task writes them)"
  }
  assert {
    condition     = alltrue([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Effect == "Allow" && !contains(flatten([s.Resource]), "*") if s.Sid != "PublishQueueMetric"])
    error_message = "no statement of the gateway task role applies to every resource (but PutMetricData, which names none)"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Condition.StringEquals["cloudwatch:namespace"] if s.Sid == "PublishQueueMetric"]) == "Sluice/sluice-test"
    error_message = "the gateway publishes metrics in its own namespace only"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Resource if s.Sid == "ScaleWorkerServices"]) == "arn:aws:ecs:us-east-1:123456789012:service/sluice-test/sluice-test-worker-*"
    error_message = "UpdateService only on this cluster's worker services"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Condition.ArnEquals["ecs:cluster"] if s.Sid == "DescribeWorkerTasks"]) == "arn:aws:ecs:us-east-1:123456789012:cluster/sluice-test"
    error_message = "DescribeTasks only in this cluster"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s if s.Sid == "DescribeWorkerTasks"]).Resource == "arn:aws:ecs:us-east-1:123456789012:task/sluice-test/*" && contains(one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Action if s.Sid == "DescribeWorkerTasks"]), "ecs:UpdateTaskProtection")
    error_message = "scale-in protects the kept tasks (UpdateTaskProtection) on this cluster's tasks only"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Resource if s.Sid == "ReadConfig"]) == var.config_object_arn
    error_message = "the gateway reads its one config object"
  }
  assert {
    condition     = !strcontains(aws_iam_role_policy.task["gateway-task"].policy, "exports") && !strcontains(aws_iam_role_policy.task["gateway-task"].policy, "secretsmanager")
    error_message = "the serving gateway neither writes exports nor reads secrets itself"
  }
  assert {
    condition     = !strcontains(aws_iam_role_policy.task["gateway-task"].policy, "weights")
    error_message = "the gateway cannot read the weights bucket"
  }
  # the_gateway_keeps_batch_file_bodies_under_their_prefix_only
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Resource if s.Sid == "KeepBatchFileBodies"]) == "arn:aws:s3:::sluice-test-batch-files-123456789012/batch-files/*"
    error_message = "object actions on the batch-files bucket only under the prefix"
  }
  assert {
    condition     = toset(one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Action if s.Sid == "KeepBatchFileBodies"])) == toset(["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload"])
    error_message = "write, read, delete and abort: what gateway/batches/bodies.py calls, no more"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s if s.Sid == "FindOpenBatchUploads"]).Resource == "arn:aws:s3:::sluice-test-batch-files-123456789012" && one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Action if s.Sid == "FindOpenBatchUploads"]) == "s3:ListBucketMultipartUploads"
    error_message = "the one bucket-level action is listing open uploads, on the batch-files bucket alone"
  }
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s if contains(flatten([s.Action]), "s3:PutObject") || contains(flatten([s.Action]), "s3:DeleteObject")]) == 1
    error_message = "no other statement writes or deletes objects (the config object is read-only)"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Condition.StringEquals if s.Sid == "EncryptBatchFileBodies"]) == { "kms:ViaService" = "s3.us-east-1.amazonaws.com", "kms:EncryptionContext:aws:s3:arn" = "arn:aws:s3:::sluice-test-batch-files-123456789012" }
    error_message = "a data key only through S3 and only for the batch-files bucket"
  }
  assert {
    condition     = length([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s if contains(flatten([s.Action]), "kms:GenerateDataKey")]) == 1
    error_message = "GenerateDataKey nowhere else"
  }
  # no_redis_no_connect
  assert {
    condition     = !strcontains(aws_iam_role_policy.task["gateway-task"].policy, "elasticache")
    error_message = "without a managed Redis the gateway task role has no elasticache:Connect"
  }
  # worker_task_role_only_reads_weights
  assert {
    condition     = toset(flatten([for s in jsondecode(aws_iam_role_policy.task["worker-task"].policy).Statement : s.Action])) == toset(["s3:ListBucket", "s3:GetObject", "kms:Decrypt"])
    error_message = "workers may only read"
  }
  assert {
    condition     = toset(flatten([for s in jsondecode(aws_iam_role_policy.task["worker-task"].policy).Statement : s.Resource if startswith(s.Action, "s3:")])) == toset([var.weights_bucket_arn, "${var.weights_bucket_arn}/*"])
    error_message = "workers read only the weights bucket"
  }
  # execution_roles_read_logs_and_secrets_only_for_their_service
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-execution"].policy).Statement : s.Resource if s.Sid == "WriteLogs"]) == "${var.gateway_log_group_arn}:*"
    error_message = "gateway execution role writes only the gateway log group"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["worker-execution"].policy).Statement : s.Resource if s.Action == "secretsmanager:GetSecretValue"]) == var.worker_secret_arn
    error_message = "the workers' execution role injects the worker secret and no other"
  }
  assert {
    condition     = !strcontains(aws_iam_role_policy.task["worker-task"].policy, "secretsmanager")
    error_message = "worker code itself reads no secret"
  }
}

run "batch_files_reject_a_wildcard_prefix" {
  command = plan
  variables {
    batch_files = { bucket_arn = "arn:aws:s3:::sluice-test-batch-files-123456789012", prefix = "*" }
  }
  expect_failures = [var.batch_files]
}

run "batch_files_reject_a_wildcard_bucket" {
  command = plan
  variables {
    batch_files = { bucket_arn = "arn:aws:s3:::*", prefix = "batch-files/" }
  }
  expect_failures = [var.batch_files]
}

run "the_gateway_signs_in_to_its_redis_as_its_iam_user_only" {
  command = plan
  variables {
    redis_iam = { cache_name = "sluice-test", user = "sluice-test-gateway" }
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Action if s.Sid == "ConnectToRedis"]) == "elasticache:Connect"
    error_message = "IAM authentication to ElastiCache is elasticache:Connect"
  }
  assert {
    condition = toset(one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Resource if s.Sid == "ConnectToRedis"])) == toset([
      "arn:aws:elasticache:us-east-1:123456789012:replicationgroup:sluice-test",
      "arn:aws:elasticache:us-east-1:123456789012:user:sluice-test-gateway",
    ])
    error_message = "Connect on this replication group as this user only"
  }
  assert {
    condition     = length([for policy in aws_iam_role_policy.task : policy if strcontains(policy.policy, "elasticache:")]) == 1
    error_message = "no other role may sign in to Redis"
  }
}

run "a_wildcard_redis_user_is_refused" {
  command = plan
  variables {
    redis_iam = { cache_name = "sluice-test", user = "*" }
  }
  expect_failures = [var.redis_iam]
}

run "wildcard_service_prefix_is_refused" {
  command = plan
  variables {
    worker_service_prefix = "*"
  }
  expect_failures = [var.worker_service_prefix]
}

run "wildcard_secret_is_refused" {
  command = plan
  variables {
    gateway_secret_arns = ["arn:aws:secretsmanager:us-east-1:123456789012:secret:*"]
  }
  expect_failures = [var.gateway_secret_arns]
}

run "wildcard_worker_secret_is_refused" {
  command = plan
  variables {
    worker_secret_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:*"
  }
  expect_failures = [var.worker_secret_arn]
}

run "an_aws_or_wildcard_metric_namespace_is_refused" {
  command = plan
  variables {
    metric_namespace = "AWS/ECS"
  }
  expect_failures = [var.metric_namespace]
}

run "a_wildcard_metric_namespace_is_refused" {
  command = plan
  variables {
    metric_namespace = "Sluice/*"
  }
  expect_failures = [var.metric_namespace]
}

run "the_export_has_its_own_roles_and_the_scheduler_only_runs_it" {
  command = apply
  assert {
    condition     = contains(one([for s in jsondecode(aws_iam_role_policy.task["export-task"].policy).Statement : s.Action if s.Sid == "WriteUsageExports"]), "s3:GetObject")
    error_message = "head_object (skip an unchanged upload) needs s3:GetObject"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["export-task"].policy).Statement : s.Resource if s.Sid == "WriteUsageExports"]) == "${var.export_bucket_arn}/*"
    error_message = "the export writes only the export bucket"
  }
  assert {
    condition     = toset(flatten([for s in jsondecode(aws_iam_role_policy.task["export-task"].policy).Statement : s.Action])) == toset(["s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload", "kms:Decrypt", "kms:GenerateDataKey"])
    error_message = "the export task role only writes exports"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["export-execution"].policy).Statement : s.Resource if s.Action == "secretsmanager:GetSecretValue"]) == var.export_secret_arn
    error_message = "the export's execution role injects the database URL only, not the admin key or the pepper"
  }
  assert {
    condition     = jsondecode(aws_iam_role.scheduler.assume_role_policy).Statement[0].Principal.Service == "scheduler.amazonaws.com"
    error_message = "EventBridge Scheduler assumes the role"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.scheduler.policy).Statement : s.Resource if s.Sid == "RunUsageExport"])[1] == "arn:aws:ecs:us-east-1:123456789012:task-definition/sluice-test-usage-export:*"
    error_message = "it may run the export task definition only"
  }
  assert {
    condition     = length(one([for s in jsondecode(aws_iam_role_policy.scheduler.policy).Statement : s.Resource if s.Sid == "PassExportRoles"])) == 2
    error_message = "and pass the export's two roles, nothing else (not the gateway's)"
  }
}

run "gpu_hosts_complete_only_their_pools_launch_hook" {
  command = plan
  assert {
    condition     = endswith(aws_iam_role_policy_attachment.worker_instance.policy_arn, "/service-role/AmazonEC2ContainerServiceforEC2Role")
    error_message = "the GPU hosts hold the ECS agent's policy only (no SSM: nothing runs commands on them)"
  }
  assert {
    condition     = one([for st in jsondecode(aws_iam_role_policy.worker_instance_launch_hook.policy).Statement : st.Resource if st.Action == "autoscaling:CompleteLifecycleAction"]) == "arn:aws:autoscaling:us-east-1:123456789012:autoScalingGroup:*:autoScalingGroupName/sluice-test-gpu-*"
    error_message = "a host may complete lifecycle actions of the worker pool's groups only"
  }
}

run "the_metrics_collector_writes_its_log_group_only" {
  command = plan
  variables {
    metrics_log_group_arn = "arn:aws:logs:us-east-1:123456789012:log-group:/sluice/sluice-test/metrics"
  }
  assert {
    condition     = one([for s in jsondecode(aws_iam_role_policy.task["gateway-task"].policy).Statement : s.Resource if s.Sid == "WriteMetricRecords"]) == "arn:aws:logs:us-east-1:123456789012:log-group:/sluice/sluice-test/metrics:*"
    error_message = "the collector's records go to the metrics log group only"
  }
  assert {
    condition     = !strcontains(aws_iam_role_policy.task["gateway-task"].policy, "cloudwatch:PutMetricData\",\"logs")
    error_message = "EMF records need no PutMetricData beyond the queue metric's"
  }
}
