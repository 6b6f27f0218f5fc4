mock_provider "aws" {
  mock_resource "aws_s3_bucket" {
    defaults = { arn = "arn:aws:s3:::sluice-test-bucket" }
  }
  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }
}

# The ephemeral passwords (aws.secrets) come from a real provider: the mock cannot serve ephemeral resources.
# tests/infra runs this suite with AWS_ENDPOINT_URL_SECRETS_MANAGER pointing at a moto server.
provider "aws" {
  alias                       = "secrets"
  region                      = "us-east-1"
  access_key                  = "local"
  secret_key                  = "local"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
}

variables {
  name               = "sluice-test"
  kms_key_arn        = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
  private_subnet_ids = ["subnet-a", "subnet-b"]
  security_group_ids = { database = "sg-db", cache = "sg-cache", wal = "sg-wal" }
}

# One plan for what were 2 runs (each run starts the AWS provider again): the asserts
# of each, under its old name.
run "the_default_plan" {
  command = plan
  # postgres_is_encrypted_private_and_tls_only
  assert {
    condition     = aws_db_instance.main[0].storage_encrypted && aws_db_instance.main[0].kms_key_id == var.kms_key_arn
    error_message = "RDS storage must be encrypted with the platform key"
  }
  assert {
    condition     = aws_db_instance.main[0].publicly_accessible == false
    error_message = "RDS must not be publicly accessible"
  }
  assert {
    condition     = aws_db_instance.main[0].multi_az
    error_message = "multi-AZ by default"
  }
  assert {
    condition     = one([for p in aws_db_parameter_group.main[0].parameter : p.value if p.name == "rds.force_ssl"]) == "1"
    error_message = "PostgreSQL must refuse clients without TLS"
  }
  assert {
    condition     = aws_db_instance.main[0].vpc_security_group_ids == toset(["sg-db"])
    error_message = "RDS sits in the database security group only"
  }
  # redis_signs_the_gateway_in_with_iam_and_has_no_password
  assert {
    condition     = aws_elasticache_replication_group.main[0].transit_encryption_enabled && aws_elasticache_replication_group.main[0].at_rest_encryption_enabled
    error_message = "Redis: TLS in transit (IAM authentication needs it) and encryption at rest"
  }
  assert {
    condition     = aws_elasticache_replication_group.main[0].auth_token == null
    error_message = "no AUTH token: Redis has no password to reach the plan or the state"
  }
  assert {
    condition     = aws_elasticache_replication_group.main[0].user_group_ids == toset(["sluice-test"]) && aws_elasticache_user_group.main[0].user_group_id == "sluice-test"
    error_message = "clients sign in through the user group"
  }
  assert {
    condition     = aws_elasticache_user_group.main[0].user_ids == toset(["sluice-test-default", "sluice-test-gateway"])
    error_message = "the group holds the gateway's user and the default user ElastiCache requires"
  }
  assert {
    condition     = aws_elasticache_user.gateway[0].authentication_mode[0].type == "iam" && aws_elasticache_user.gateway[0].user_id == "sluice-test-gateway" && aws_elasticache_user.gateway[0].user_name == aws_elasticache_user.gateway[0].user_id
    error_message = "the gateway signs in with IAM tokens only, as a user whose name is its id (IAM authentication needs it)"
  }
  assert {
    condition     = aws_elasticache_user.gateway[0].passwords == null && aws_elasticache_user.default[0].passwords == null
    error_message = "no ElastiCache user has a password"
  }
  assert {
    condition     = aws_elasticache_user.gateway[0].access_string == "on ~sluice:* +@all -@dangerous"
    error_message = "the gateway's user reaches only the gateway's keys (sluice:*) and runs no admin command"
  }
  assert {
    condition     = aws_elasticache_user.default[0].user_name == "default" && aws_elasticache_user.default[0].access_string == "off -@all"
    error_message = "the default user is off and may run nothing"
  }
  assert {
    condition     = output.redis_iam == { cache_name = "sluice-test", user = "sluice-test-gateway" }
    error_message = "the gateway's [redis_iam] and its elasticache:Connect name this cache and this user"
  }
}

run "single_az_when_asked" {
  command = plan
  variables {
    db_multi_az = false
  }
  assert {
    condition     = aws_db_instance.main[0].multi_az == false
    error_message = "db_multi_az = false gives a single-AZ instance"
  }
}

run "buckets_are_private_encrypted_and_versioned" {
  command = apply
  assert {
    condition     = toset(keys(aws_s3_bucket.main)) == toset(["weights", "exports", "config", "batch-files", "access-logs", "alb-logs"])
    error_message = "weights, exports, config, batch-files, access-logs and alb-logs buckets"
  }
  assert {
    condition = alltrue([for b in aws_s3_bucket_public_access_block.main :
    b.block_public_acls && b.block_public_policy && b.ignore_public_acls && b.restrict_public_buckets])
    error_message = "every bucket blocks all public access"
  }
  assert {
    condition = alltrue([for k, e in aws_s3_bucket_server_side_encryption_configuration.main :
    one(e.rule).apply_server_side_encryption_by_default[0].sse_algorithm == (k == "alb-logs" ? "AES256" : "aws:kms")])
    error_message = "every bucket is KMS-encrypted but the ALB's logs (ELB delivers only to SSE-S3)"
  }
  assert {
    condition     = jsondecode(aws_s3_bucket_policy.main["alb-logs"].policy).Statement[1].Principal.Service == "logdelivery.elasticloadbalancing.amazonaws.com" && endswith(jsondecode(aws_s3_bucket_policy.main["alb-logs"].policy).Statement[1].Resource, "/alb/AWSLogs/123456789012/*")
    error_message = "the ALB may write its logs under alb/AWSLogs/<account>/ only"
  }
  assert {
    condition     = alltrue([for v in aws_s3_bucket_versioning.main : v.versioning_configuration[0].status == "Enabled"])
    error_message = "every bucket is versioned"
  }
  assert {
    condition     = alltrue([for p in aws_s3_bucket_policy.main : jsondecode(p.policy).Statement[0].Effect == "Deny" && jsondecode(p.policy).Statement[0].Condition.Bool["aws:SecureTransport"] == "false"])
    error_message = "every bucket refuses plain HTTP"
  }
}

run "batch_file_bodies_are_private_kms_encrypted_and_expire_with_their_files" {
  command = apply
  variables {
    batch_file_retention_days = 14
  }
  assert {
    condition     = aws_s3_bucket.main["batch-files"].bucket == "sluice-test-batch-files-123456789012" && output.batch_files.bucket == aws_s3_bucket.main["batch-files"].bucket && output.batch_files.prefix == "batch-files/"
    error_message = "the gateway's [batches] file_bucket and file_prefix come from here"
  }
  assert {
    condition     = aws_s3_bucket_public_access_block.main["batch-files"].block_public_acls && aws_s3_bucket_public_access_block.main["batch-files"].block_public_policy && aws_s3_bucket_public_access_block.main["batch-files"].ignore_public_acls && aws_s3_bucket_public_access_block.main["batch-files"].restrict_public_buckets
    error_message = "customer files are never public"
  }
  assert {
    condition     = one(aws_s3_bucket_server_side_encryption_configuration.main["batch-files"].rule).apply_server_side_encryption_by_default[0].sse_algorithm == "aws:kms" && one(aws_s3_bucket_server_side_encryption_configuration.main["batch-files"].rule).apply_server_side_encryption_by_default[0].kms_master_key_id == var.kms_key_arn && one(aws_s3_bucket_server_side_encryption_configuration.main["batch-files"].rule).bucket_key_enabled
    error_message = "encrypted with the platform key, with a bucket key (modules/iam scopes GenerateDataKey to the bucket's encryption context)"
  }
  assert {
    condition     = jsondecode(aws_s3_bucket_policy.main["batch-files"].policy).Statement[0].Condition.Bool["aws:SecureTransport"] == "false" && length(jsondecode(aws_s3_bucket_policy.main["batch-files"].policy).Statement) == 1
    error_message = "TLS only, and the bucket policy admits no one: the gateway task role's own policy is the only grant"
  }
  assert {
    condition     = one(aws_s3_bucket_lifecycle_configuration.main["batch-files"].rule).abort_incomplete_multipart_upload[0].days_after_initiation == 1
    error_message = "an upload a killed gateway left open is aborted a day later"
  }
  assert {
    condition     = one(aws_s3_bucket_lifecycle_configuration.main["batch-files"].rule).expiration[0].days == 15 && output.batch_files.retention_s == 14 * 86400
    error_message = "an object expires a day after the gateway's file_retention_s (never before its file does)"
  }
  assert {
    condition     = one(aws_s3_bucket_lifecycle_configuration.main["batch-files"].rule).noncurrent_version_expiration[0].noncurrent_days == 1
    error_message = "a deleted file's old version is gone a day later"
  }
  assert {
    condition     = aws_s3_bucket_logging.main["batch-files"].target_prefix == "batch-files/"
    error_message = "its access is logged to the access-logs bucket"
  }
}

run "batch_file_retention_beyond_the_gateways_bound_is_refused" {
  command = plan
  variables {
    batch_file_retention_days = 400
  }
  expect_failures = [var.batch_file_retention_days]
}

# One plan for what were 2 runs (each run starts the AWS provider again): the asserts
# of each, under its old name.
run "wal_and_secrets_after_the_applies" {
  command = plan
  # wal_file_system_is_encrypted_and_owned_by_the_gateway_user
  assert {
    condition     = aws_efs_file_system.wal.encrypted
    error_message = "the WAL file system is encrypted"
  }
  assert {
    condition     = aws_efs_access_point.gateway.posix_user[0].uid == 10001 && aws_efs_access_point.gateway.root_directory[0].creation_info[0].owner_uid == 10001
    error_message = "the access point maps to the image's non-root user"
  }
  assert {
    condition     = length(aws_efs_mount_target.wal) == 2
    error_message = "a mount target per private subnet"
  }
  # secrets_are_generated_and_encrypted
  assert {
    condition     = toset(keys(aws_secretsmanager_secret.gateway)) == toset(["admin_key", "key_pepper", "worker_secret", "metrics_token", "database_url", "redis_url"])
    error_message = "admin key, pepper, database and Redis URLs"
  }
  assert {
    condition     = alltrue([for s in aws_secretsmanager_secret.gateway : s.kms_key_id == var.kms_key_arn])
    error_message = "secrets are encrypted with the platform key"
  }
}

run "no_generated_secret_reaches_the_state" {
  command = apply
  assert {
    condition     = aws_db_instance.main[0].password == null && aws_db_instance.main[0].password_wo == null && aws_db_instance.main[0].password_wo_version == 1
    error_message = "the database password is set through password_wo only (never stored)"
  }
  assert {
    condition     = alltrue([for v in aws_secretsmanager_secret_version.gateway : v.secret_string == null && v.secret_string_wo == null && v.secret_string_wo_version == 1])
    error_message = "every gateway secret (the database URL with its password included) is written through secret_string_wo only"
  }
  assert {
    condition     = aws_elasticache_replication_group.main[0].auth_token == null && alltrue([for u in aws_elasticache_user.gateway : u.passwords == null])
    error_message = "Redis has no AUTH token or password in the state"
  }
}

run "without_managed_databases" {
  command = plan
  variables {
    managed_databases = false
  }
  assert {
    condition     = length(aws_db_instance.main) == 0 && length(aws_elasticache_replication_group.main) == 0 && length(aws_elasticache_user.gateway) == 0
    error_message = "no RDS and no Redis"
  }
  assert {
    condition     = output.redis_iam == null
    error_message = "no [redis_iam] without a managed Redis"
  }
  assert {
    condition     = toset(keys(aws_secretsmanager_secret.gateway)) == toset(["admin_key", "key_pepper", "worker_secret", "metrics_token"])
    error_message = "only the gateway's own secrets"
  }
}

run "short_backup_retention_is_refused" {
  command = plan
  variables {
    db_backup_retention_days = 1
  }
  expect_failures = [var.db_backup_retention_days]
}

run "one_subnet_is_refused" {
  command = plan
  variables {
    private_subnet_ids = ["subnet-a"]
  }
  expect_failures = [var.private_subnet_ids]
}

run "short_export_retention_is_refused" {
  command = plan
  variables {
    export_retention_days = 30
  }
  expect_failures = [var.export_retention_days]
}
