# The platform against AWS served locally (moto): the modules moto implements, applied by
# tests/infra/test_local_apply.py. Never points at real AWS: every endpoint is var.aws_endpoint.

terraform {
  required_version = ">= 1.11" # write-only arguments (modules/data)
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}

locals {
  services = ["acm", "applicationautoscaling", "autoscaling", "cloudwatch", "ec2", "ecs", "efs", "elbv2", "iam",
  "kms", "logs", "s3", "secretsmanager", "sns", "ssm", "sts"]
  name        = "sluice-local"
  worker_port = 8100
  # what the gateway tasks get as SLUICE_CONFIG_TOML: the same template as the platform's, with every AWS
  # call (ECS scaling, CloudWatch) sent to the local endpoint
  gateway_config_toml = templatefile("${path.module}/../../modules/platform/gateway.toml.tftpl", {
    cluster           = module.gateway.cluster_name
    region            = var.region
    worker_port       = local.worker_port
    services          = module.worker_pool.worker_service_names
    settings          = var.endpoint_settings
    scaling           = {}
    trusted_proxies   = ["10.40.0.0/16"] # the network module's default cidr_block
    gateway_tasks     = 1
    request_timeout_s = 840
    aws_endpoint      = var.aws_endpoint
    metric_namespace  = module.observability.activator_queue_metric_namespace
    redis_iam         = module.data.redis_iam # null: no managed Redis in moto
    batch_files       = module.data.batch_files
  })
}

provider "aws" {
  region                      = var.region
  access_key                  = "local"
  secret_key                  = "local"
  skip_credentials_validation = true
  skip_requesting_account_id  = false # moto answers GetCallerIdentity; bucket names use the account
  skip_metadata_api_check     = true
  skip_region_validation      = true
  s3_use_path_style           = true
  endpoints {
    acm                    = var.aws_endpoint
    applicationautoscaling = var.aws_endpoint
    autoscaling            = var.aws_endpoint
    cloudwatch             = var.aws_endpoint
    ec2                    = var.aws_endpoint
    ecs                    = var.aws_endpoint
    efs                    = var.aws_endpoint
    elbv2                  = var.aws_endpoint
    iam                    = var.aws_endpoint
    kms                    = var.aws_endpoint
    logs                   = var.aws_endpoint
    s3                     = var.aws_endpoint
    secretsmanager         = var.aws_endpoint
    sns                    = var.aws_endpoint
    ssm                    = var.aws_endpoint
    sts                    = var.aws_endpoint
  }
}

module "kms" {
  source                  = "../../modules/kms"
  name                    = local.name
  deletion_window_in_days = 7
}

module "network" {
  source             = "../../modules/network"
  name               = local.name
  availability_zones = ["${var.region}a", "${var.region}b"]
  nat_gateway        = "none"
  kms_key_arn        = module.kms.key_arn
}

module "data" {
  source              = "../../modules/data"
  providers           = { aws = aws, aws.secrets = aws } # aws.secrets: its ephemeral passwords
  name                = local.name
  kms_key_arn         = module.kms.key_arn
  private_subnet_ids  = module.network.private_subnet_ids
  security_group_ids  = module.network.security_group_ids
  managed_databases   = false # moto serves neither RDS PostgreSQL nor ElastiCache for real
  deletion_protection = false
  efs_management_apis = false # moto lacks PutBackupPolicy and DeleteFileSystemPolicy
}

module "observability" {
  source             = "../../modules/observability"
  name               = local.name
  kms_key_arn        = module.kms.key_arn
  log_retention_days = 7
  alb_arn_suffix     = module.gateway.alb_arn_suffix
  rds_alarm          = false
  gpu_alarms         = false
  usage_export_alarm = false # an EventBridge rule: moto's endpoint list leaves EventBridge out
}

module "iam" {
  source                = "../../modules/iam"
  name                  = local.name
  cluster_name          = local.name
  worker_service_prefix = "${local.name}-worker-"
  gateway_secret_arns   = values(module.data.secret_arns)
  worker_secret_arn     = module.data.secret_arns["worker_secret"]
  export_bucket_arn     = module.data.bucket_arns["exports"]
  config_object_arn     = "${module.data.bucket_arns["config"]}/gateway/config.toml" # unused: the config stays inline here
  weights_bucket_arn    = module.data.bucket_arns["weights"]
  kms_key_arn           = module.kms.key_arn
  wal_file_system_arn   = module.data.wal_file_system_arn
  wal_access_point_arn  = module.data.wal_access_point_arn
  gateway_log_group_arn = module.observability.log_group_arns["gateway"]
  worker_log_group_arn  = module.observability.log_group_arns["worker"]
  metric_namespace      = module.observability.activator_queue_metric_namespace
  redis_iam             = module.data.redis_iam
  batch_files           = module.data.batch_files
}

module "gateway" {
  source               = "../../modules/gateway"
  name                 = local.name
  kms_key_arn          = module.kms.key_arn
  vpc_id               = module.network.vpc_id
  public_subnet_ids    = module.network.public_subnet_ids
  private_subnet_ids   = module.network.private_subnet_ids
  security_group_ids   = module.network.security_group_ids
  certificate_arn      = var.certificate_arn
  image                = "sluice-gateway:local"
  cpu                  = 512
  memory               = 1024
  min_tasks            = 1
  max_tasks            = 2
  execution_role_arn   = module.iam.gateway_execution_role_arn
  task_role_arn        = module.iam.gateway_task_role_arn
  export_task_role_arn = module.iam.export_task_role_arn
  export_exec_role_arn = module.iam.export_execution_role_arn
  log_group_name       = module.observability.log_group_names["gateway"]
  secret_arns          = module.data.secret_arns
  wal_file_system_id   = module.data.wal_file_system_id
  wal_access_point_id  = module.data.wal_access_point_id
  deletion_protection  = false
  autoscaling          = false # the provider never sees moto's scalable target as created
  config_toml          = local.gateway_config_toml
}

module "worker_pool" {
  source               = "../../modules/worker_pool"
  name                 = local.name
  cluster_name         = module.gateway.cluster_name
  cluster_arn          = module.gateway.cluster_arn
  private_subnet_ids   = module.network.private_subnet_ids
  security_group_ids   = module.network.security_group_ids
  image                = "sluice-worker:local"
  endpoints            = var.endpoints
  instance_types       = ["g4dn.xlarge"]
  max_instances        = 2
  ami_id               = "ami-12c6146b" # moto's stock image; real envs read the GPU AMI from SSM
  instance_profile_arn = module.iam.worker_instance_profile_arn
  execution_role_arn   = module.iam.worker_execution_role_arn
  task_role_arn        = module.iam.worker_task_role_arn
  log_group_name       = module.observability.log_group_names["worker"]
  worker_secret_arn    = module.data.secret_arns["worker_secret"]
  worker_port          = local.worker_port
}
