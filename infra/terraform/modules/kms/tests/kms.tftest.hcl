mock_provider "aws" {
  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }
}

variables {
  name = "sluice-test"
}

# One plan for what were 2 runs (each run starts the AWS provider again): the asserts
# of each, under its old name.
run "the_default_plan" {
  command = plan
  # rotated_key_for_this_account_and_its_logs
  assert {
    condition     = aws_kms_key.main.enable_key_rotation
    error_message = "key rotation must be on"
  }
  assert {
    condition     = jsondecode(aws_kms_key.main.policy).Statement[0].Principal.AWS == "arn:aws:iam::123456789012:root"
    error_message = "only this account administers the key"
  }
  assert {
    condition     = jsondecode(aws_kms_key.main.policy).Statement[1].Principal.Service == "logs.us-east-1.amazonaws.com"
    error_message = "CloudWatch Logs of this region may use the key"
  }
  # alarms_and_s3_log_delivery_may_use_the_key
  assert {
    condition = anytrue([for s in jsondecode(aws_kms_key.main.policy).Statement : try(contains(s.Principal.Service, "cloudwatch.amazonaws.com"), false)
    && try(contains(s.Action, "kms:GenerateDataKey*") && contains(s.Action, "kms:Decrypt"), false)])
    error_message = "CloudWatch alarms can publish to the SNS topic the key encrypts"
  }
  assert {
    condition = anytrue([for s in jsondecode(aws_kms_key.main.policy).Statement : try(s.Principal.Service == "logging.s3.amazonaws.com", false)
    && try(contains(s.Action, "kms:GenerateDataKey*") && s.Condition.StringEquals["aws:SourceAccount"] == "123456789012", false)])
    error_message = "S3 server access logs of this account can be written to the encrypted access-logs bucket"
  }
}

run "short_deletion_window_is_refused" {
  command = plan
  variables {
    deletion_window_in_days = 3
  }
  expect_failures = [var.deletion_window_in_days]
}

