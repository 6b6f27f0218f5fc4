# The whole platform, composed once; envs/dev and envs/prod only size it.

locals {
  worker_port = 8100
  # the pull permission follows the images: an ECR image's repository ARN, read from its URI
  image_repositories = distinct(concat(var.image_repository_arns, [
    for image in [var.gateway_image, var.worker_image] :
    format("arn:%s:ecr:%s:%s:repository/%s", data.aws_partition.current.partition, regex("^[0-9]{12}\\.dkr\\.ecr\\.([a-z0-9-]+)\\.", image)[0], split(".", image)[0], regex("^[^/]+/([^:@]+)", image)[0])
    if can(regex("^[0-9]{12}\\.dkr\\.ecr\\.[a-z0-9-]+\\.amazonaws\\.com(\\.cn)?/", image))
  ]))
  # the gateway's endpoints: each one scaled by its ECS provisioner through its own worker service
  gateway_config_toml = templatefile("${path.module}/gateway.toml.tftpl", {
    cluster           = var.name
    region            = data.aws_region.current.name
    worker_port       = local.worker_port
    services          = module.worker_pool.worker_service_names
    settings          = var.endpoint_settings
    scaling           = var.scaling
    trusted_proxies   = [var.cidr_block]
    gateway_tasks     = var.gateway_max_tasks
    request_timeout_s = var.request_timeout_seconds
    aws_endpoint      = ""
    metric_namespace  = module.observability.activator_queue_metric_namespace
    redis_iam         = module.data.redis_iam
    batch_files       = module.data.batch_files
  })
}

module "kms" {
  source = "../kms"
  name   = var.name
}

module "network" {
  source             = "../network"
  name               = var.name
  cidr_block         = var.cidr_block
  availability_zones = var.availability_zones
  nat_gateway        = var.nat_gateway
  kms_key_arn        = module.kms.key_arn
  worker_port        = local.worker_port
}

module "data" {
  source              = "../data"
  providers           = { aws = aws, aws.secrets = aws.secrets }
  name                = var.name
  kms_key_arn         = module.kms.key_arn
  private_subnet_ids  = module.network.private_subnet_ids
  security_group_ids  = module.network.security_group_ids
  db_instance_class   = var.db_instance_class
  db_multi_az         = var.db_multi_az
  cache_node_type     = var.cache_node_type
  cache_replicas      = var.cache_replicas
  deletion_protection = var.deletion_protection

  batch_file_retention_days = var.batch_file_retention_days
}

module "observability" {
  source                     = "../observability"
  name                       = var.name
  kms_key_arn                = module.kms.key_arn
  log_retention_days         = var.log_retention_days
  alb_arn_suffix             = module.gateway.alb_arn_suffix
  target_group_arn_suffix    = module.gateway.target_group_arn_suffix
  gpu_autoscaling_group_name = module.worker_pool.autoscaling_group_name
  gpu_max_instances          = var.gpu_max_instances
  cluster_arn                = module.gateway.cluster_arn
  worker_service_prefix      = "${var.name}-worker-"
  db_instance_id             = module.data.db_instance_id
  alarm_emails               = var.alarm_emails
  cache_replication_group_id = try(module.data.redis_iam.cache_name, "")
  cache_nodes                = 1 + var.cache_replicas
  efs_alarm                  = true
  efs_file_system_id         = module.data.wal_file_system_id
  nat_gateway_ids            = module.network.nat_gateway_ids
  monthly_budget_usd         = var.monthly_budget_usd
}

module "iam" {
  source                = "../iam"
  name                  = var.name
  cluster_name          = var.name
  worker_service_prefix = "${var.name}-worker-"
  gateway_secret_arns   = values(module.data.secret_arns)
  worker_secret_arn     = module.data.secret_arns["worker_secret"]
  export_bucket_arn     = module.data.bucket_arns["exports"]
  export_secret_arn     = module.data.secret_arns["database_url"]
  config_object_arn     = "${module.data.bucket_arns["config"]}/${module.gateway.config_key}"
  weights_bucket_arn    = module.data.bucket_arns["weights"]
  kms_key_arn           = module.kms.key_arn
  wal_file_system_arn   = module.data.wal_file_system_arn
  wal_access_point_arn  = module.data.wal_access_point_arn
  gateway_log_group_arn = module.observability.log_group_arns["gateway"]
  worker_log_group_arn  = module.observability.log_group_arns["worker"]
  image_repository_arns = local.image_repositories
  metric_namespace      = module.observability.activator_queue_metric_namespace
  redis_iam             = module.data.redis_iam
  metrics_log_group_arn = module.observability.log_group_arns["metrics"]
  batch_files           = module.data.batch_files
}

module "gateway" {
  source                  = "../gateway"
  name                    = var.name
  vpc_id                  = module.network.vpc_id
  public_subnet_ids       = module.network.public_subnet_ids
  private_subnet_ids      = module.network.private_subnet_ids
  security_group_ids      = module.network.security_group_ids
  certificate_arn         = var.certificate_arn
  image                   = var.gateway_image
  cpu                     = var.gateway_cpu
  memory                  = var.gateway_memory
  min_tasks               = var.gateway_min_tasks
  max_tasks               = var.gateway_max_tasks
  execution_role_arn      = module.iam.gateway_execution_role_arn
  task_role_arn           = module.iam.gateway_task_role_arn
  log_group_name          = module.observability.log_group_names["gateway"]
  secret_arns             = module.data.secret_arns
  wal_file_system_id      = module.data.wal_file_system_id
  wal_access_point_id     = module.data.wal_access_point_id
  access_log_bucket       = module.data.bucket_names["alb-logs"]
  request_timeout_seconds = var.request_timeout_seconds
  export_bucket           = module.data.bucket_names["exports"]
  export_task_role_arn    = module.iam.export_task_role_arn
  export_exec_role_arn    = module.iam.export_execution_role_arn
  scheduler_role_arn      = module.iam.scheduler_role_arn
  kms_key_arn             = module.kms.key_arn
  deletion_protection     = var.deletion_protection
  config_toml             = local.gateway_config_toml
  config_bucket           = module.data.bucket_names["config"] # any number of endpoints (SLUICE_CONFIG_S3)
  metrics_log_group_name  = module.observability.log_group_names["metrics"]
  metrics_namespace       = module.observability.activator_queue_metric_namespace
}

data "aws_region" "current" {}
data "aws_partition" "current" {}

module "worker_pool" {
  source               = "../worker_pool"
  name                 = var.name
  cluster_name         = module.gateway.cluster_name
  cluster_arn          = module.gateway.cluster_arn
  private_subnet_ids   = module.network.private_subnet_ids
  security_group_ids   = module.network.security_group_ids
  image                = var.worker_image
  endpoints            = var.endpoints
  instance_types       = var.gpu_instance_types
  spot                 = var.gpu_spot
  max_instances        = var.gpu_max_instances
  instance_profile_arn = module.iam.worker_instance_profile_arn
  execution_role_arn   = module.iam.worker_execution_role_arn
  task_role_arn        = module.iam.worker_task_role_arn
  log_group_name       = module.observability.log_group_names["worker"]
  worker_secret_arn    = module.data.secret_arns["worker_secret"]
  worker_port          = local.worker_port
  warm_pool_size       = var.gpu_warm_pool_size
  image_cuda_version   = var.worker_image_cuda_version
}
