mock_provider "aws" {
  mock_data "aws_region" {
    defaults = { name = "us-east-1" }
  }
  mock_resource "aws_cloudwatch_log_group" {
    defaults = { arn = "arn:aws:logs:us-east-1:123456789012:log-group:/sluice/sluice-test/vpc-flow" }
  }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::123456789012:role/sluice-test-vpc-flow" }
  }
}

variables {
  name               = "sluice-test"
  availability_zones = ["us-east-1a", "us-east-1b"]
  kms_key_arn        = "arn:aws:kms:us-east-1:123456789012:key/11111111-2222-3333-4444-555555555555"
}

run "two_azs_public_and_private" {
  command = plan
  assert {
    condition     = length(aws_subnet.public) == 2 && length(aws_subnet.private) == 2
    error_message = "one public and one private subnet per AZ"
  }
  assert {
    condition     = toset([for s in aws_subnet.private : s.availability_zone]) == toset(var.availability_zones)
    error_message = "private subnets must span every AZ"
  }
  assert {
    condition     = length(aws_nat_gateway.main) == 1 && length(aws_route.private_nat) == 2
    error_message = "single NAT: one gateway, a default route in each private table"
  }
  assert {
    condition     = aws_flow_log.main.traffic_type == "ALL"
    error_message = "flow logs record all traffic"
  }
}

run "only_the_alb_is_open_to_the_internet_and_only_on_80_443" {
  command = apply
  assert {
    condition     = aws_vpc_security_group_ingress_rule.alb_https.cidr_ipv4 == "0.0.0.0/0" && aws_vpc_security_group_ingress_rule.alb_https.from_port == 443 && aws_vpc_security_group_ingress_rule.alb_https.to_port == 443
    error_message = "ALB: 443 from anywhere"
  }
  assert {
    condition     = aws_vpc_security_group_ingress_rule.alb_http.from_port == 80 && aws_vpc_security_group_ingress_rule.alb_http.to_port == 80
    error_message = "ALB: 80 from anywhere (redirect only)"
  }
  assert {
    condition = alltrue([for rule in [
      aws_vpc_security_group_ingress_rule.gateway_from_alb,
      aws_vpc_security_group_ingress_rule.worker_from_gateway,
      aws_vpc_security_group_ingress_rule.database_from_gateway,
      aws_vpc_security_group_ingress_rule.cache_from_gateway,
      aws_vpc_security_group_ingress_rule.wal_from_gateway,
    ] : rule.cidr_ipv4 == null && rule.cidr_ipv6 == null])
    error_message = "every other ingress admits a security group, never a CIDR"
  }
  assert {
    condition     = length(aws_default_security_group.default.ingress) == 0 && length(aws_default_security_group.default.egress) == 0
    error_message = "the default security group allows nothing"
  }
}

run "per_az_nat" {
  command = plan
  variables {
    availability_zones = ["us-east-1a", "us-east-1b", "us-east-1c"]
    nat_gateway        = "per_az"
  }
  assert {
    condition     = length(aws_nat_gateway.main) == 3
    error_message = "per_az: one NAT per AZ"
  }
}

run "no_nat" {
  command = plan
  variables {
    nat_gateway = "none"
  }
  assert {
    condition     = length(aws_nat_gateway.main) == 0 && length(aws_route.private_nat) == 0
    error_message = "none: no NAT and no default route"
  }
}

run "one_az_is_refused" {
  command = plan
  variables {
    availability_zones = ["us-east-1a"]
  }
  expect_failures = [var.availability_zones]
}

run "unknown_nat_mode_is_refused" {
  command = plan
  variables {
    nat_gateway = "two"
  }
  expect_failures = [var.nat_gateway]
}

run "small_cidr_is_refused" {
  command = plan
  variables {
    cidr_block = "10.0.0.0/26"
  }
  expect_failures = [var.cidr_block]
}

run "bad_name_is_refused" {
  command = plan
  variables {
    name = "Sluice_Prod"
  }
  expect_failures = [var.name]
}
