mock_provider "aws" {
  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }
  mock_data "aws_region" {
    defaults = { name = "eu-west-1" }
  }
  mock_resource "aws_s3_bucket" {
    defaults = { arn = "arn:aws:s3:::sluice-terraform-state-123456789012" }
  }
}

run "a_state_bucket_named_for_the_account_private_versioned_and_tls_only" {
  command = apply
  assert {
    condition     = aws_s3_bucket.state.bucket == "sluice-terraform-state-123456789012"
    error_message = "no hard-coded bucket: the account id makes the name unique"
  }
  assert {
    condition     = aws_s3_bucket_versioning.state.versioning_configuration[0].status == "Enabled" && aws_s3_bucket_public_access_block.state.restrict_public_buckets && aws_s3_bucket_public_access_block.state.block_public_policy
    error_message = "versioned and private"
  }
  assert {
    condition     = one(one(aws_s3_bucket_server_side_encryption_configuration.state.rule).apply_server_side_encryption_by_default).sse_algorithm == "aws:kms"
    error_message = "encrypted with KMS"
  }
  assert {
    condition     = jsondecode(aws_s3_bucket_policy.state.policy).Statement[0].Condition.Bool["aws:SecureTransport"] == "false" && jsondecode(aws_s3_bucket_policy.state.policy).Statement[0].Effect == "Deny"
    error_message = "plain HTTP refused"
  }
  assert {
    condition     = output.backend_config == "bucket = \"sluice-terraform-state-123456789012\"\nregion = \"eu-west-1\"\n"
    error_message = "the backend.hcl dev and prod are initialised with"
  }
}

run "the_two_image_repositories_immutable_and_scanned" {
  command = plan
  assert {
    condition     = toset(keys(aws_ecr_repository.image)) == toset(["sluice-gateway", "sluice-worker"])
    error_message = "the repositories infra/docker's images are pushed to"
  }
  assert {
    condition     = alltrue([for r in aws_ecr_repository.image : r.image_tag_mutability == "IMMUTABLE" && r.image_scanning_configuration[0].scan_on_push && r.encryption_configuration[0].encryption_type == "KMS"])
    error_message = "immutable tags, scanned on push, KMS-encrypted"
  }
  assert {
    condition     = alltrue([for p in aws_ecr_lifecycle_policy.image : jsondecode(p.policy).rules[0].selection.countNumber == 50])
    error_message = "old images expire"
  }
}

run "an_explicit_bucket_name_wins" {
  command = plan
  variables {
    state_bucket = "acme-tf-state"
  }
  assert {
    condition     = aws_s3_bucket.state.bucket == "acme-tf-state"
    error_message = "state_bucket names the bucket"
  }
}

run "a_bad_bucket_name_is_refused" {
  command = plan
  variables {
    state_bucket = "Acme_State"
  }
  expect_failures = [var.state_bucket]
}

run "too_few_images_kept_is_refused" {
  command = plan
  variables {
    images_kept = 1
  }
  expect_failures = [var.images_kept]
}
