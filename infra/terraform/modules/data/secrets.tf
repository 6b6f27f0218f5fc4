# The gateway's secrets. Values are generated once by Secrets Manager and kept (ignore_changes), so
# an apply never rotates a pepper (that would invalidate every API key hash) or a live password.

data "aws_secretsmanager_random_password" "admin_key" {
  password_length     = 48
  exclude_punctuation = true
}

data "aws_secretsmanager_random_password" "key_pepper" {
  password_length     = 64
  exclude_punctuation = true
}

data "aws_secretsmanager_random_password" "worker_secret" {
  password_length     = 48
  exclude_punctuation = true # sent in an HTTP header
}

data "aws_secretsmanager_random_password" "database" {
  password_length     = 40
  exclude_punctuation = true # it sits inside a URL
}

data "aws_secretsmanager_random_password" "cache" {
  password_length     = 64
  exclude_punctuation = true
}

locals {
  secrets = merge(
    {
      admin_key  = data.aws_secretsmanager_random_password.admin_key.random_password
      key_pepper = data.aws_secretsmanager_random_password.key_pepper.random_password
      # the gateway sends it on every call to a worker, which refuses calls without it (worker/secret.py)
      worker_secret = data.aws_secretsmanager_random_password.worker_secret.random_password
    },
    var.managed_databases ? {
      database_url = "postgresql://sluice:${data.aws_secretsmanager_random_password.database.random_password}@${aws_db_instance.main[0].address}:5432/sluice?sslmode=require"
      redis_url    = "rediss://:${data.aws_secretsmanager_random_password.cache.random_password}@${aws_elasticache_replication_group.main[0].primary_endpoint_address}:6379/0"
    } : {},
  )
}

resource "aws_secretsmanager_secret" "gateway" {
  #checkov:skip=CKV2_AWS_57:The key pepper keys every stored API-key hash and the URLs mirror live database passwords: rotation is an operator runbook step, not a timer (infra/README.md).
  for_each                = toset(concat(["admin_key", "key_pepper", "worker_secret"], var.managed_databases ? ["database_url", "redis_url"] : []))
  name                    = "${var.name}/gateway/${each.key}"
  kms_key_id              = var.kms_key_arn
  recovery_window_in_days = var.deletion_protection ? 30 : 0
}

resource "aws_secretsmanager_secret_version" "gateway" {
  for_each      = aws_secretsmanager_secret.gateway
  secret_id     = each.value.id
  secret_string = local.secrets[each.key]
  lifecycle {
    ignore_changes = [secret_string]
  }
}
