# PostgreSQL (auth store and usage ledger) and Redis (shared rate limits, fleet state): private, encrypted, TLS.

resource "aws_db_subnet_group" "main" {
  count      = var.managed_databases ? 1 : 0
  name       = var.name
  subnet_ids = var.private_subnet_ids
}

resource "aws_db_parameter_group" "main" {
  count  = var.managed_databases ? 1 : 0
  name   = "${var.name}-pg16"
  family = "postgres16"
  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }
  parameter {
    name  = "log_min_duration_statement"
    value = "500"
  }
}

resource "aws_db_instance" "main" {
  #checkov:skip=CKV_AWS_157:Multi-AZ is var.db_multi_az: on by default and in prod, off in dev to halve its cost.
  #checkov:skip=CKV_AWS_293:Deletion protection is var.deletion_protection: on by default and in prod, off in dev so it can be torn down.
  #checkov:skip=CKV_AWS_118:Enhanced monitoring adds a role and per-second OS metrics we do not use; Performance Insights and the CPU alarm cover it.
  count                               = var.managed_databases ? 1 : 0
  identifier                          = var.name
  engine                              = "postgres"
  engine_version                      = "16"
  instance_class                      = var.db_instance_class
  allocated_storage                   = var.db_allocated_storage_gb
  max_allocated_storage               = var.db_allocated_storage_gb * 4
  storage_type                        = "gp3"
  storage_encrypted                   = true
  kms_key_id                          = var.kms_key_arn
  db_name                             = "sluice"
  username                            = "sluice"
  password_wo                         = ephemeral.aws_secretsmanager_random_password.database.random_password
  password_wo_version                 = 1
  db_subnet_group_name                = aws_db_subnet_group.main[0].name
  parameter_group_name                = aws_db_parameter_group.main[0].name
  vpc_security_group_ids              = [var.security_group_ids["database"]]
  publicly_accessible                 = false
  multi_az                            = var.db_multi_az
  backup_retention_period             = var.db_backup_retention_days
  copy_tags_to_snapshot               = true
  deletion_protection                 = var.deletion_protection
  skip_final_snapshot                 = !var.deletion_protection
  final_snapshot_identifier           = var.deletion_protection ? "${var.name}-final" : null
  auto_minor_version_upgrade          = true
  iam_database_authentication_enabled = true
  performance_insights_enabled        = true
  performance_insights_kms_key_id     = var.kms_key_arn
  enabled_cloudwatch_logs_exports     = ["postgresql", "upgrade"]
  lifecycle {
    # set once with the database_url secret, from the same ephemeral value; password: a state from before
    # write-only keeps its value rather than a new password the secret would not know
    ignore_changes = [password, password_wo_version]
  }
}

resource "aws_elasticache_subnet_group" "main" {
  count      = var.managed_databases ? 1 : 0
  name       = var.name
  subnet_ids = var.private_subnet_ids
}

locals {
  # the gateway's keys all start with "sluice:" (limits: sluice:rl, fleet state: sluice:fleet); no admin commands.
  # tests/gateway/test_redis_iam.py runs the limiter and the fleet as a user with exactly this access string.
  cache_access = "on ~sluice:* +@all -@dangerous"
}

# Redis signs the gateway in as an IAM-authenticated ElastiCache user: a 15-minute token the gateway signs with
# its task role for each new connection (gateway/redis_iam.py; modules/iam grants elasticache:Connect). No Redis
# password exists, so none is in the plan or the state. Every user group must hold a user named "default":
# this one is off and may run nothing, so a connection that does not sign in as the gateway can do nothing.
resource "aws_elasticache_user" "gateway" {
  count         = var.managed_databases ? 1 : 0
  user_id       = "${var.name}-gateway"
  user_name     = "${var.name}-gateway" # IAM authentication: the name is the id
  engine        = "redis"
  access_string = local.cache_access
  authentication_mode {
    type = "iam"
  }
}

resource "aws_elasticache_user" "default" {
  count         = var.managed_databases ? 1 : 0
  user_id       = "${var.name}-default"
  user_name     = "default"
  engine        = "redis"
  access_string = "off -@all"
  authentication_mode {
    type = "no-password-required" # off: it signs nobody in
  }
}

resource "aws_elasticache_user_group" "main" {
  count         = var.managed_databases ? 1 : 0
  user_group_id = var.name
  engine        = "redis"
  user_ids      = [aws_elasticache_user.default[0].user_id, aws_elasticache_user.gateway[0].user_id]
}

resource "aws_elasticache_replication_group" "main" {
  #checkov:skip=CKV2_AWS_50:Multi-AZ failover follows var.cache_replicas: on in prod; dev runs one node (rate limits only, rebuilt on failover).
  #checkov:skip=CKV_AWS_31:No AUTH token by design: clients sign in through the user group with IAM tokens (no password in state); TLS is on.
  count                      = var.managed_databases ? 1 : 0
  replication_group_id       = var.name
  description                = "${var.name}: shared rate limits"
  engine                     = "redis"
  engine_version             = "7.1"
  node_type                  = var.cache_node_type
  num_cache_clusters         = 1 + var.cache_replicas
  automatic_failover_enabled = var.cache_replicas > 0
  multi_az_enabled           = var.cache_replicas > 0
  port                       = 6379
  subnet_group_name          = aws_elasticache_subnet_group.main[0].name
  security_group_ids         = [var.security_group_ids["cache"]]
  at_rest_encryption_enabled = true
  kms_key_id                 = var.kms_key_arn
  transit_encryption_enabled = true # IAM authentication needs TLS
  user_group_ids             = [aws_elasticache_user_group.main[0].user_group_id]
  snapshot_retention_limit   = 1
}
