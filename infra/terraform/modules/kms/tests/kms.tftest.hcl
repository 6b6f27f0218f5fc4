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

run "rotated_key_for_this_account_and_its_logs" {
  command = plan
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
}

run "short_deletion_window_is_refused" {
  command = plan
  variables {
    deletion_window_in_days = 3
  }
  expect_failures = [var.deletion_window_in_days]
}
