output "bucket_names" {
  value = { for key, bucket in aws_s3_bucket.main : key => bucket.bucket }
}

output "bucket_arns" {
  value = { for key, bucket in aws_s3_bucket.main : key => bucket.arn }
}

output "secret_arns" {
  description = "Gateway secrets by name: admin_key, key_pepper, worker_secret, and database_url, redis_url with managed databases."
  value       = { for key, secret in aws_secretsmanager_secret.gateway : key => secret.arn }
}

output "wal_file_system_id" {
  value = aws_efs_file_system.wal.id
}

output "wal_file_system_arn" {
  value = aws_efs_file_system.wal.arn
}

output "wal_access_point_id" {
  value = aws_efs_access_point.gateway.id
}

output "wal_access_point_arn" {
  value = aws_efs_access_point.gateway.arn
}

output "db_instance_id" {
  value = var.managed_databases ? aws_db_instance.main[0].identifier : null
}

output "redis_iam" {
  description = "The cache and the IAM-authenticated ElastiCache user the gateway signs in as ([redis_iam] of its config, modules/iam's elasticache:Connect); null without managed databases."
  value = var.managed_databases ? {
    cache_name = aws_elasticache_replication_group.main[0].replication_group_id
    user       = aws_elasticache_user.gateway[0].user_id
  } : null
}

output "batch_files" {
  description = "Where the gateway keeps Files/Batches API bodies: the [batches] table of its config (modules/platform's template) and its task role's grant (modules/iam)."
  value = {
    bucket      = aws_s3_bucket.main["batch-files"].bucket
    bucket_arn  = aws_s3_bucket.main["batch-files"].arn
    prefix      = "batch-files/" # every key the gateway writes: <prefix><file id>.jsonl
    retention_s = var.batch_file_retention_days * 86400
  }
}
