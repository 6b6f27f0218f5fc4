# Once per AWS account and region, before envs/dev or envs/prod: the S3 bucket their state lives in (locked with
# S3's own lock files, no DynamoDB table) and the ECR repositories the images are pushed to. Applied from
# envs/bootstrap with local state; its outputs are the dev/prod backend settings and the image repositories.

data "aws_caller_identity" "current" {}
data "aws_region" "current" {}

locals {
  state_bucket = var.state_bucket != "" ? var.state_bucket : "${var.prefix}-terraform-state-${data.aws_caller_identity.current.account_id}"
}

resource "aws_s3_bucket" "state" {
  #checkov:skip=CKV_AWS_18:Access logging needs a second bucket before any state exists; CloudTrail records the account's S3 API calls.
  #checkov:skip=CKV_AWS_144:Cross-region replication of a few MB of versioned state; a lost region means a new deployment anyway.
  #checkov:skip=CKV2_AWS_62:No consumer reacts to state writes; notifications would have nowhere to go.
  bucket = local.state_bucket # no force_destroy: S3 refuses to delete it while any state is in it
}

resource "aws_s3_bucket_public_access_block" "state" {
  bucket                  = aws_s3_bucket.state.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "state" {
  bucket = aws_s3_bucket.state.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "state" {
  bucket = aws_s3_bucket.state.id
  versioning_configuration {
    status = "Enabled" # a broken apply can be undone from the previous version
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "state" {
  bucket = aws_s3_bucket.state.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "aws:kms" # the account's aws/s3 key: the platform's own key does not exist yet
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "state" {
  bucket = aws_s3_bucket.state.id
  rule {
    id     = "tidy"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
    noncurrent_version_expiration {
      noncurrent_days = var.state_version_days
    }
  }
}

resource "aws_s3_bucket_policy" "state" {
  bucket = aws_s3_bucket.state.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "DenyInsecureTransport"
      Effect    = "Deny"
      Principal = { AWS = "*" }
      Action    = "s3:*"
      Resource  = [aws_s3_bucket.state.arn, "${aws_s3_bucket.state.arn}/*"]
      Condition = { Bool = { "aws:SecureTransport" = "false" } }
    }]
  })
  depends_on = [aws_s3_bucket_public_access_block.state]
}

# the images: tags are immutable (a tag names one build; the modules refuse :latest), scanned on push
resource "aws_ecr_repository" "image" {
  for_each             = toset(var.repositories)
  name                 = each.key
  image_tag_mutability = "IMMUTABLE"
  force_delete         = false
  image_scanning_configuration {
    scan_on_push = true
  }
  encryption_configuration {
    encryption_type = "KMS"
  }
}

resource "aws_ecr_lifecycle_policy" "image" {
  for_each   = aws_ecr_repository.image
  repository = each.value.name
  policy = jsonencode({
    rules = [{
      rulePriority = 1
      description  = "keep the newest images; a rollback needs only the last few"
      selection    = { tagStatus = "any", countType = "imageCountMoreThan", countNumber = var.images_kept }
      action       = { type = "expire" }
    }]
  })
}
