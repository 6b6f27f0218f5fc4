# weights: model files the workers read; exports: usage exports the gateway writes; config: the gateway's config
# file (each version the gateway tasks start with, modules/gateway); batch-files: the bodies of the Files/Batches
# APIs' files (gateway/batches/bodies.py, shared by every gateway task); access-logs:
# server access logs of the others; alb-logs: the ALB's access logs. All private, versioned, TLS-only;
# KMS-encrypted except alb-logs: Elastic Load Balancing delivers only to SSE-S3 (AES256) buckets.

locals {
  buckets = toset(["weights", "exports", "config", "batch-files", "access-logs", "alb-logs"])
}

data "aws_caller_identity" "current" {}
data "aws_elb_service_account" "current" {}

resource "aws_s3_bucket" "main" {
  #checkov:skip=CKV_AWS_145:alb-logs is SSE-S3 because ALB access logs cannot be delivered to an SSE-KMS bucket; the others use the platform key.
  #checkov:skip=CKV_AWS_144:Cross-region replication doubles storage of multi-GB weights that are re-uploadable; exports are also in PostgreSQL.
  #checkov:skip=CKV2_AWS_62:No consumer reacts to object events; notifications would have nowhere to go.
  for_each      = local.buckets
  bucket        = "${var.name}-${each.key}-${data.aws_caller_identity.current.account_id}"
  force_destroy = !var.deletion_protection
}

resource "aws_s3_bucket_public_access_block" "main" {
  for_each                = local.buckets
  bucket                  = aws_s3_bucket.main[each.key].id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "main" {
  for_each = local.buckets
  bucket   = aws_s3_bucket.main[each.key].id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "main" {
  for_each = local.buckets
  bucket   = aws_s3_bucket.main[each.key].id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "main" {
  for_each = local.buckets
  bucket   = aws_s3_bucket.main[each.key].id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = each.key == "alb-logs" ? "AES256" : "aws:kms"
      kms_master_key_id = each.key == "alb-logs" ? null : var.kms_key_arn
    }
    bucket_key_enabled = each.key != "alb-logs"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "main" {
  for_each = local.buckets
  bucket   = aws_s3_bucket.main[each.key].id
  rule {
    id     = "tidy"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      # a batch upload lasts at most upload_timeout_s (30 min); one a killed gateway left open is gone a day later
      days_after_initiation = each.key == "batch-files" ? 1 : 7
    }
    noncurrent_version_expiration {
      # a deleted (expired) batch file is a customer's data: kept one day for an operator's mistake, no longer
      noncurrent_days = lookup({ exports = 365, "batch-files" = 1 }, each.key, 30)
    }
    dynamic "transition" {
      for_each = each.key == "exports" ? [1] : []
      content {
        days          = 90
        storage_class = "GLACIER"
      }
    }
    dynamic "expiration" {
      for_each = contains(["weights", "config"], each.key) ? [] : [1] # never expire what a running task names
      content {
        # batch files: the gateway deletes each as it expires (file_retention_s, the same days); this is the
        # backstop, a day later, so no object outlives its row for long and none goes before it
        days = lookup({ exports = var.export_retention_days, "batch-files" = var.batch_file_retention_days + 1 }, each.key, 400)
      }
    }
  }
}

resource "aws_s3_bucket_logging" "main" {
  for_each      = toset(["weights", "exports", "config", "batch-files", "alb-logs"]) # access-logs cannot log to itself
  bucket        = aws_s3_bucket.main[each.key].id
  target_bucket = aws_s3_bucket.main["access-logs"].id
  target_prefix = "${each.key}/"
  depends_on    = [aws_s3_bucket_policy.main] # the log bucket must admit the logging service first
}

resource "aws_s3_bucket_policy" "main" {
  for_each = local.buckets
  bucket   = aws_s3_bucket.main[each.key].id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = concat(
      [{
        Sid       = "DenyInsecureTransport"
        Effect    = "Deny"
        Principal = { AWS = "*" } # moto reads Principal as a map; the same meaning as "*"
        Action    = "s3:*"
        Resource  = [aws_s3_bucket.main[each.key].arn, "${aws_s3_bucket.main[each.key].arn}/*"]
        Condition = { Bool = { "aws:SecureTransport" = "false" } }
      }],
      each.key == "access-logs" ? [{
        Sid       = "ServerAccessLogs"
        Effect    = "Allow"
        Principal = { Service = "logging.s3.amazonaws.com" }
        Action    = "s3:PutObject"
        Resource  = "${aws_s3_bucket.main[each.key].arn}/*"
        Condition = { StringEquals = { "aws:SourceAccount" = data.aws_caller_identity.current.account_id } }
      }] : [],
      each.key == "alb-logs" ? [{
        Sid    = "LoadBalancerAccessLogs"
        Effect = "Allow"
        # regions from before August 2022 deliver as the regional ELB account, newer ones as the service
        Principal = { AWS = data.aws_elb_service_account.current.arn, Service = "logdelivery.elasticloadbalancing.amazonaws.com" }
        Action    = "s3:PutObject"
        Resource  = "${aws_s3_bucket.main[each.key].arn}/alb/AWSLogs/${data.aws_caller_identity.current.account_id}/*"
      }] : [],
    )
  })
  depends_on = [aws_s3_bucket_public_access_block.main]
}
