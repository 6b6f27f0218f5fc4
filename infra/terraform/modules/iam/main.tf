# Least privilege, one role per job; each grants what the code of that job calls (tests/infra/test_iam_calls.py
# reads the boto3 calls from the source and holds every role to them):
#   gateway task:      scale and describe the worker services, list/describe/protect/stop their tasks, read its config
#                      object, keep the batch file bodies under their prefix, mount its WAL directory, publish its queue
#                      metric, sign in to its Redis as its IAM user; its metrics collector writes its log group.
#   gateway execution: pull the image, write its log group, inject its secrets.
#   export task:       write (and read back) the usage exports. Nothing else.
#   export execution:  pull the image, write the gateway's log group, inject the database URL only.
#   worker task:       read the weights bucket. Nothing else.
#   worker execution:  pull the image, write its log group, inject the worker secret.
#   worker instance:   the ECS agent on the GPU hosts.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}
data "aws_partition" "current" {}

locals {
  account     = data.aws_caller_identity.current.account_id
  region      = data.aws_region.current.name
  partition   = data.aws_partition.current.partition
  ecs_arn     = "arn:${local.partition}:ecs:${local.region}:${local.account}"
  cache_arn   = "arn:${local.partition}:elasticache:${local.region}:${local.account}"
  cluster_arn = "${local.ecs_arn}:cluster/${var.cluster_name}"
  ecs_tasks   = { Version = "2012-10-17", Statement = [{ Effect = "Allow", Principal = { Service = "ecs-tasks.amazonaws.com" }, Action = "sts:AssumeRole" }] }

  pull_image = concat(
    [{ Sid = "EcrLogin", Effect = "Allow", Action = "ecr:GetAuthorizationToken", Resource = "*" }],
    length(var.image_repository_arns) > 0 ? [{
      Sid      = "PullImage"
      Effect   = "Allow"
      Action   = ["ecr:BatchCheckLayerAvailability", "ecr:GetDownloadUrlForLayer", "ecr:BatchGetImage"]
      Resource = var.image_repository_arns
    }] : [],
  )

  gateway_task_policy = {
    Version = "2012-10-17"
    Statement = concat([
      {
        Sid      = "ScaleWorkerServices"
        Effect   = "Allow"
        Action   = ["ecs:UpdateService", "ecs:DescribeServices"]
        Resource = "${local.ecs_arn}:service/${var.cluster_name}/${var.worker_service_prefix}*"
      },
      {
        Sid       = "ListWorkerTasks"
        Effect    = "Allow"
        Action    = "ecs:ListTasks"
        Resource  = "${local.ecs_arn}:container-instance/${var.cluster_name}/*"
        Condition = { ArnEquals = { "ecs:cluster" = local.cluster_arn } }
      },
      {
        Sid    = "DescribeWorkerTasks"
        Effect = "Allow"
        # scale-in protects the tasks it keeps (UpdateTaskProtection), then stops the one it drained (StopTask)
        Action    = ["ecs:DescribeTasks", "ecs:StopTask", "ecs:UpdateTaskProtection"]
        Resource  = "${local.ecs_arn}:task/${var.cluster_name}/*"
        Condition = { ArnEquals = { "ecs:cluster" = local.cluster_arn } }
      },
      {
        # the config file, S3-encrypted with the platform key (gateway/config_object.py); secrets come from the
        # execution role, injected by ECS: the gateway itself reads none
        Sid      = "ReadConfig"
        Effect   = "Allow"
        Action   = "s3:GetObject"
        Resource = var.config_object_arn
      },
      {
        Sid       = "DecryptConfig"
        Effect    = "Allow"
        Action    = "kms:Decrypt"
        Resource  = var.kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "s3.${local.region}.amazonaws.com" } }
      },
      {
        Sid       = "MountWalDirectory"
        Effect    = "Allow"
        Action    = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
        Resource  = var.wal_file_system_arn
        Condition = { StringEquals = { "elasticfilesystem:AccessPointArn" = var.wal_access_point_arn } }
      },
      {
        # PutMetricData names no resource: the namespace condition is its only bound
        Sid       = "PublishQueueMetric"
        Effect    = "Allow"
        Action    = "cloudwatch:PutMetricData"
        Resource  = "*"
        Condition = { StringEquals = { "cloudwatch:namespace" = var.metric_namespace } }
      },
      {
        # Files/Batches API bodies (gateway/batches/bodies.py): one object per file under the prefix, written whole
        # or as a multipart upload (PutObject covers its parts), read back, deleted as it expires, and an upload a
        # killed gateway left open aborted
        Sid      = "KeepBatchFileBodies"
        Effect   = "Allow"
        Action   = ["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
        Resource = "${var.batch_files.bucket_arn}/${var.batch_files.prefix}*"
      },
      {
        # finding that open upload (list_multipart_uploads): a bucket-level action with no prefix condition key,
        # bounded by the bucket holding nothing but batch bodies
        Sid      = "FindOpenBatchUploads"
        Effect   = "Allow"
        Action   = "s3:ListBucketMultipartUploads"
        Resource = var.batch_files.bucket_arn
      },
      {
        # the bucket is SSE-KMS with a bucket key: a new object (or part) needs a data key, under that bucket's
        # encryption context only
        Sid      = "EncryptBatchFileBodies"
        Effect   = "Allow"
        Action   = ["kms:GenerateDataKey", "kms:Decrypt"]
        Resource = var.kms_key_arn
        Condition = {
          StringEquals = {
            "kms:ViaService"                   = "s3.${local.region}.amazonaws.com"
            "kms:EncryptionContext:aws:s3:arn" = var.batch_files.bucket_arn
          }
        }
      },
      ], var.metrics_log_group_arn == null ? [] : [{
        # the task's metrics collector (modules/gateway metrics_collector.tf) writes embedded-metric records
        Sid      = "WriteMetricRecords"
        Effect   = "Allow"
        Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = "${var.metrics_log_group_arn}:*"
        }], var.redis_iam == null ? [] : [{
        # IAM authentication (gateway/redis_iam.py): the token names both the cache and the user
        Sid      = "ConnectToRedis"
        Effect   = "Allow"
        Action   = "elasticache:Connect"
        Resource = ["${local.cache_arn}:replicationgroup:${var.redis_iam.cache_name}", "${local.cache_arn}:user:${var.redis_iam.user}"]
    }])
  }

  gateway_execution_policy = {
    Version = "2012-10-17"
    Statement = concat(local.pull_image, [
      {
        Sid      = "WriteLogs"
        Effect   = "Allow"
        Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = "${var.gateway_log_group_arn}:*"
      },
      {
        Sid      = "InjectSecrets"
        Effect   = "Allow"
        Action   = "secretsmanager:GetSecretValue"
        Resource = var.gateway_secret_arns
      },
      {
        Sid       = "DecryptSecrets"
        Effect    = "Allow"
        Action    = "kms:Decrypt"
        Resource  = var.kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "secretsmanager.${local.region}.amazonaws.com" } }
      },
    ])
  }

  # the daily usage export (`sluice usage export`, billing/exports/s3.py): a one-off task of the gateway image
  export_task_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        # head_object reads an object's checksum to skip an unchanged upload (GetObject); upload_fileobj writes in
        # parts and aborts a failed multipart upload
        Sid      = "WriteUsageExports"
        Effect   = "Allow"
        Action   = ["s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload"]
        Resource = "${var.export_bucket_arn}/*"
      },
      {
        Sid       = "UseDataKey"
        Effect    = "Allow"
        Action    = ["kms:Decrypt", "kms:GenerateDataKey"]
        Resource  = var.kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "s3.${local.region}.amazonaws.com" } }
      },
    ]
  }

  export_execution_policy = {
    Version = "2012-10-17"
    Statement = concat(local.pull_image, [
      {
        Sid      = "WriteLogs"
        Effect   = "Allow"
        Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = "${var.gateway_log_group_arn}:*"
      },
      ], var.export_secret_arn == null ? [] : [{
        Sid      = "InjectDatabaseUrl"
        Effect   = "Allow"
        Action   = "secretsmanager:GetSecretValue"
        Resource = var.export_secret_arn
        }], var.export_secret_arn == null ? [] : [{
        Sid       = "DecryptDatabaseUrl"
        Effect    = "Allow"
        Action    = "kms:Decrypt"
        Resource  = var.kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "secretsmanager.${local.region}.amazonaws.com" } }
    }])
  }

  worker_task_policy = {
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "ListWeights"
        Effect   = "Allow"
        Action   = "s3:ListBucket"
        Resource = var.weights_bucket_arn
      },
      {
        Sid      = "ReadWeights"
        Effect   = "Allow"
        Action   = "s3:GetObject"
        Resource = "${var.weights_bucket_arn}/*"
      },
      {
        Sid       = "DecryptWeights"
        Effect    = "Allow"
        Action    = "kms:Decrypt"
        Resource  = var.kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "s3.${local.region}.amazonaws.com" } }
      },
    ]
  }

  worker_execution_policy = {
    Version = "2012-10-17"
    Statement = concat(local.pull_image, [
      {
        Sid      = "WriteLogs"
        Effect   = "Allow"
        Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
        Resource = "${var.worker_log_group_arn}:*"
      },
      {
        Sid      = "InjectWorkerSecret"
        Effect   = "Allow"
        Action   = "secretsmanager:GetSecretValue"
        Resource = var.worker_secret_arn
      },
      {
        Sid       = "DecryptWorkerSecret"
        Effect    = "Allow"
        Action    = "kms:Decrypt"
        Resource  = var.kms_key_arn
        Condition = { StringEquals = { "kms:ViaService" = "secretsmanager.${local.region}.amazonaws.com" } }
      },
    ])
  }

  roles = {
    gateway-task      = local.gateway_task_policy
    gateway-execution = local.gateway_execution_policy
    export-task       = local.export_task_policy
    export-execution  = local.export_execution_policy
    worker-task       = local.worker_task_policy
    worker-execution  = local.worker_execution_policy
  }
}

resource "aws_iam_role" "task" {
  for_each           = local.roles
  name               = "${var.name}-${each.key}"
  assume_role_policy = jsonencode(local.ecs_tasks)
}

resource "aws_iam_role_policy" "task" {
  for_each = local.roles
  name     = each.key
  role     = aws_iam_role.task[each.key].id
  policy   = jsonencode(each.value)
}

# -- GPU hosts: the ECS agent's own role (AWS's managed policy for container instances); no SSM agent policy: nothing
# of ours runs commands on the hosts (attach AmazonSSMManagedInstanceCore by hand for a debugging session)

resource "aws_iam_role" "worker_instance" {
  name = "${var.name}-worker-instance"
  assume_role_policy = jsonencode({
    Version   = "2012-10-17"
    Statement = [{ Effect = "Allow", Principal = { Service = "ec2.amazonaws.com" }, Action = "sts:AssumeRole" }]
  })
}

resource "aws_iam_role_policy_attachment" "worker_instance" {
  role       = aws_iam_role.worker_instance.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonEC2ContainerServiceforEC2Role"
}

# a GPU host launched for the warm pool completes its own launch hook once it has pulled the worker image
# (modules/worker_pool/user_data.sh.tftpl): only on the worker pool's autoscaling groups
resource "aws_iam_role_policy" "worker_instance_launch_hook" {
  name = "launch-hook"
  role = aws_iam_role.worker_instance.name
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid      = "CompleteOwnLaunchHook"
        Effect   = "Allow"
        Action   = "autoscaling:CompleteLifecycleAction"
        Resource = "arn:${local.partition}:autoscaling:${local.region}:${local.account}:autoScalingGroup:*:autoScalingGroupName/${var.name}-gpu-*"
      },
      {
        Sid      = "FindOwnGroup"
        Effect   = "Allow"
        Action   = "autoscaling:DescribeAutoScalingInstances" # no resource-level permissions
        Resource = "*"
      },
    ]
  })
}

resource "aws_iam_instance_profile" "worker" {
  name = "${var.name}-worker-instance"
  role = aws_iam_role.worker_instance.name
}

# -- EventBridge Scheduler: runs the daily usage export task (modules/gateway/usage_export.tf) and hands it the
# export's roles; nothing else

resource "aws_iam_role" "scheduler" {
  name = "${var.name}-scheduler"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "scheduler.amazonaws.com" }
      Action    = "sts:AssumeRole"
      Condition = { StringEquals = { "aws:SourceAccount" = local.account } }
    }]
  })
}

resource "aws_iam_role_policy" "scheduler" {
  name = "run-usage-export"
  role = aws_iam_role.scheduler.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Sid       = "RunUsageExport"
        Effect    = "Allow"
        Action    = "ecs:RunTask"
        Resource  = ["${local.ecs_arn}:task-definition/${var.name}-usage-export", "${local.ecs_arn}:task-definition/${var.name}-usage-export:*"]
        Condition = { ArnEquals = { "ecs:cluster" = local.cluster_arn } }
      },
      {
        Sid       = "PassExportRoles"
        Effect    = "Allow"
        Action    = "iam:PassRole"
        Resource  = [aws_iam_role.task["export-task"].arn, aws_iam_role.task["export-execution"].arn]
        Condition = { StringEquals = { "iam:PassedToService" = "ecs-tasks.amazonaws.com" } }
      },
      {
        Sid      = "ReadEncryptedSchedule" # the schedule is encrypted with the platform key
        Effect   = "Allow"
        Action   = "kms:Decrypt"
        Resource = var.kms_key_arn
      },
    ]
  })
}
