# The seams between the modules: what the gateway is told about the worker services, and the secret
# both sides share. The modules' own suites assert on their resources.

mock_provider "aws" {
  mock_data "aws_region" {
    defaults = { name = "eu-west-1" }
  }
  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012" }
  }
  mock_data "aws_partition" {
    defaults = { partition = "aws" }
  }
  mock_data "aws_ssm_parameter" {
    defaults = { value = "ami-0123456789abcdef0" }
  }
  mock_resource "aws_secretsmanager_secret" {
    defaults = { arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:sluice-test/gateway/some-AbCdEf" }
  }
  mock_resource "aws_s3_bucket" {
    defaults = { arn = "arn:aws:s3:::sluice-test-bucket" }
  }
  mock_resource "aws_kms_key" {
    defaults = { arn = "arn:aws:kms:eu-west-1:123456789012:key/11111111-2222-3333-4444-555555555555" }
  }
  mock_resource "aws_efs_file_system" {
    defaults = { arn = "arn:aws:elasticfilesystem:eu-west-1:123456789012:file-system/fs-12345678" }
  }
  mock_resource "aws_efs_access_point" {
    defaults = { arn = "arn:aws:elasticfilesystem:eu-west-1:123456789012:access-point/fsap-12345678" }
  }
  mock_resource "aws_cloudwatch_log_group" {
    defaults = { arn = "arn:aws:logs:eu-west-1:123456789012:log-group:/sluice/sluice-test/any" }
  }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::123456789012:role/sluice-test-any" }
  }
  mock_resource "aws_iam_instance_profile" {
    defaults = { arn = "arn:aws:iam::123456789012:instance-profile/sluice-test-worker-instance" }
  }
  mock_resource "aws_ecs_cluster" {
    defaults = { arn = "arn:aws:ecs:eu-west-1:123456789012:cluster/sluice-test" }
  }
  mock_resource "aws_ecs_task_definition" {
    defaults = { arn = "arn:aws:ecs:eu-west-1:123456789012:task-definition/sluice-test:1" }
  }
  mock_resource "aws_lb" {
    defaults = { arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:loadbalancer/app/sluice-test/0123456789abcdef", arn_suffix = "app/sluice-test/0123456789abcdef" }
  }
  mock_resource "aws_lb_target_group" {
    defaults = { arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/sluice-test/0123456789abcdef", arn_suffix = "targetgroup/sluice-test/0123456789abcdef" }
  }
  mock_resource "aws_sns_topic" {
    defaults = { arn = "arn:aws:sns:eu-west-1:123456789012:sluice-test-alarms" }
  }
  mock_resource "aws_lb_listener" {
    defaults = { arn = "arn:aws:elasticloadbalancing:eu-west-1:123456789012:listener/app/sluice-test/0123456789abcdef/0123456789abcdef" }
  }
  mock_resource "aws_launch_template" {
    defaults = { id = "lt-0123456789abcdef0" }
  }
  mock_resource "aws_autoscaling_group" {
    defaults = { arn = "arn:aws:autoscaling:eu-west-1:123456789012:autoScalingGroup:0:autoScalingGroupName/sluice-test-gpu" }
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
  availability_zones = ["eu-west-1a", "eu-west-1b"]
  certificate_arn    = "arn:aws:acm:eu-west-1:123456789012:certificate/00000000-0000-0000-0000-000000000000"
  gateway_image      = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/sluice-gateway:0.1.0"
  worker_image       = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/sluice-worker:0.1.0"
  endpoints = {
    "HuggingFaceTB/SmolLM2-135M-Instruct" = { source = "s3://weights/smollm2" }
  }
  endpoint_settings = {
    "HuggingFaceTB/SmolLM2-135M-Instruct" = { min_replicas = 0, max_replicas = 2 }
  }
}

run "the_gateway_config_names_each_endpoints_ecs_service" {
  command = plan
  assert {
    condition = output.gateway_config_toml == join("\n", [
      "# Rendered by Terraform: an S3 object the gateway tasks read at start (modules/platform), or SLUICE_CONFIG_TOML (envs/local).",
      "# One endpoint per worker service: the gateway's ECS provisioner (gateway/endpoints/provisioners/ecs.py)",
      "# scales that service's desired count and routes to its tasks' private addresses on `port`.",
      "data_dir = \"/var/lib/sluice\"",
      "# the admin key comes from Secrets Manager (SLUICE_ADMIN_KEY); CloudWatch keeps the logs, so no key is printed",
      "print_bootstrap_keys = false",
      "# the ALB's X-Forwarded-For names the client (failed-auth throttle, audit log); only the VPC may say so",
      "trusted_proxies = [\"10.40.0.0/16\"]",
      "request_timeout_s = 840",
      "# Redis away: each gateway task admits within its share of every limit, the limit / the most tasks the service",
      "# runs (gateway/limits/outage.py); the limiter-outage alarm pages meanwhile",
      "limiter_on_outage = \"local\"",
      "limiter_outage_gateways = 10",
      "",
      "# the ALB keeps an idle connection to a target for its idle timeout (request_timeout_s + 60): the gateway keeps",
      "# it longer, so the ALB never sends a request on a connection the gateway has just closed (a 502)",
      "[http]",
      "keep_alive_timeout_s = 960",
      "",
      "# Redis (redis_url, from Secrets Manager) signs in as this IAM-authenticated ElastiCache user, with a token the",
      "# task role signs for each new connection: there is no Redis password (gateway/redis_iam.py)",
      "[redis_iam]",
      "user = \"sluice-test-gateway\"",
      "cache_name = \"sluice-test\"",
      "region = \"eu-west-1\"",
      "",
      "[[models]]",
      "name = \"HuggingFaceTB/SmolLM2-135M-Instruct\"",
      "max_replicas = 2",
      "min_replicas = 0",
      "",
      "[models.provisioner]",
      "kind = \"ecs\"",
      "cluster = \"sluice-test\"",
      "service = \"sluice-test-worker-huggingfacetb-smollm2-135m-instruct\"",
      "region = \"eu-west-1\"",
      "port = 8100",
      "",
      "# Files/Batches API bodies in S3, shared by every gateway task (gateway/batches/bodies.py); modules/data's",
      "# batch-files bucket expires an object a day after file_retention_s, the gateway deletes it at the time",
      "[batches]",
      "file_bucket = \"sluice-test-batch-files-123456789012\"",
      "file_prefix = \"batch-files/\"",
      "file_retention_s = 2592000",
      "",
      "# the activator's queue depth, for the alarm modules/observability sets (gateway/endpoints/queue_metric.py)",
      "[cloudwatch]",
      "namespace = \"Sluice/sluice-test\"",
      "region = \"eu-west-1\"",
      "",
    ])
    error_message = "the endpoint's [models.provisioner] table names the worker_pool service: ${output.gateway_config_toml}"
  }
  assert {
    condition     = output.ecs_cluster_name == "sluice-test" && output.worker_service_names["HuggingFaceTB/SmolLM2-135M-Instruct"] == "sluice-test-worker-huggingfacetb-smollm2-135m-instruct"
    error_message = "the outputs the gateway's ECS provisioner is configured from"
  }
}

run "platform_fields_cannot_be_overridden_per_endpoint" {
  command = plan
  variables {
    endpoint_settings = { "HuggingFaceTB/SmolLM2-135M-Instruct" = { provisioner = "local" } }
  }
  expect_failures = [var.endpoint_settings]
}

run "mixed_value_types_survive_and_scaling_is_rendered" {
  command = plan
  variables {
    endpoint_settings = {
      "HuggingFaceTB/SmolLM2-135M-Instruct" = { min_replicas = 0, idle_seconds = 900, team_id = "team-abc" }
    }
    scaling = { ecs_start_timeout_seconds = 2400 }
  }
  assert {
    condition     = strcontains(output.gateway_config_toml, "idle_seconds = 900\n") && strcontains(output.gateway_config_toml, "min_replicas = 0\n") && strcontains(output.gateway_config_toml, "team_id = \"team-abc\"\n")
    error_message = "numbers stay numbers beside a string: ${output.gateway_config_toml}"
  }
  assert {
    condition     = strcontains(output.gateway_config_toml, "\n[scaling]\necs_start_timeout_seconds = 2400\n")
    error_message = "the [scaling] table is rendered: ${output.gateway_config_toml}"
  }
}

run "a_number_given_as_text_is_refused" {
  command = plan
  variables {
    endpoint_settings = { "HuggingFaceTB/SmolLM2-135M-Instruct" = { idle_seconds = "900" } }
  }
  expect_failures = [var.endpoint_settings]
}

run "an_unknown_field_is_refused" {
  command = plan
  variables {
    endpoint_settings = { "HuggingFaceTB/SmolLM2-135M-Instruct" = { idle_secs = 900 } }
  }
  expect_failures = [var.endpoint_settings]
}

run "no_nat_is_refused_for_the_platform" {
  command = plan
  variables {
    nat_gateway = "none"
  }
  expect_failures = [var.nat_gateway]
}

run "the_alb_logs_and_outlasts_the_request_timeout" {
  command = plan
  variables {
    request_timeout_seconds = 1800
  }
  assert {
    condition     = module.gateway.alb_idle_timeout == 1860 && strcontains(output.gateway_config_toml, "request_timeout_s = 1800\n")
    error_message = "the ALB's idle timeout is above the gateway's request timeout"
  }
  assert {
    condition     = strcontains(output.gateway_config_toml, "[http]\nkeep_alive_timeout_s = 1920\n")
    error_message = "the gateway keeps idle connections longer than the ALB does (no 502 on a closed connection)"
  }
  assert {
    condition     = module.gateway.alb_access_log_bucket == module.data.bucket_names["alb-logs"]
    error_message = "ALB access logs are on, in the SSE-S3 alb-logs bucket"
  }
}

run "the_warm_pool_reaches_the_worker_pool" {
  command = plan
  variables {
    gpu_warm_pool_size = 1
  }
  assert {
    condition     = module.worker_pool.warm_pool_min_size == 1
    error_message = "one stopped GPU host waits in the warm pool"
  }
}

# the policy names ARNs the mock provider makes up at apply time only
run "the_gateway_task_role_signs_in_to_the_data_modules_redis" {
  command = apply
  assert {
    condition     = strcontains(module.iam.policies["gateway-task"], "elasticache:eu-west-1:123456789012:replicationgroup:sluice-test\"") && strcontains(module.iam.policies["gateway-task"], "elasticache:eu-west-1:123456789012:user:sluice-test-gateway\"")
    error_message = "the gateway task role may sign in to the data module's cache as the user its [redis_iam] names"
  }
}

# One plan for what were 3 runs (each run starts the AWS provider again): the asserts
# of each, under its old name.
run "the_gateways_roles_after_the_apply" {
  command = plan
  # the_gateway_reads_its_config_from_the_config_bucket
  assert {
    condition     = module.gateway.config_key == "gateway/config.toml" && module.data.bucket_names["config"] != ""
    error_message = "the rendered config goes to the data module's config bucket"
  }
  assert {
    condition     = one([for s in jsondecode(module.iam.policies["gateway-task"]).Statement : s.Resource if s.Sid == "ReadConfig"]) == "arn:aws:s3:::sluice-test-bucket/gateway/config.toml"
    error_message = "the gateway task role may read exactly that object"
  }
  assert {
    condition     = one([for s in jsondecode(module.iam.policies["export-execution"]).Statement : s.Resource if s.Sid == "InjectDatabaseUrl"]) == module.data.secret_arns["database_url"]
    error_message = "the usage export's own execution role injects the database URL only"
  }
  # the_images_repositories_may_be_pulled_without_listing_them
  assert {
    condition = toset(one([for s in jsondecode(module.iam.policies["gateway-execution"]).Statement : s.Resource if s.Sid == "PullImage"])) == toset([
      "arn:aws:ecr:eu-west-1:123456789012:repository/sluice-gateway", "arn:aws:ecr:eu-west-1:123456789012:repository/sluice-worker",
    ])
    error_message = "the pull permission names the repositories of gateway_image and worker_image (it was empty by default)"
  }
  # the_gateways_metrics_are_scraped
  assert {
    condition     = module.iam.policies["gateway-task"] != "" && one([for s in jsondecode(module.iam.policies["gateway-task"]).Statement : s.Resource if s.Sid == "WriteMetricRecords"]) == "arn:aws:logs:eu-west-1:123456789012:log-group:/sluice/sluice-test/any:*"
    error_message = "the collector may write the metrics log group"
  }
}

run "the_gateway_keeps_batch_bodies_where_its_role_may" {
  command = plan
  variables {
    batch_file_retention_days = 7
  }
  assert {
    condition     = strcontains(output.gateway_config_toml, "\n[batches]\nfile_bucket = \"${module.data.bucket_names["batch-files"]}\"\nfile_prefix = \"batch-files/\"\nfile_retention_s = 604800\n")
    error_message = "the config sends bodies to the data module's batch-files bucket and keeps files as long as the bucket: ${output.gateway_config_toml}"
  }
  assert {
    condition     = one([for s in jsondecode(module.iam.policies["gateway-task"]).Statement : s.Resource if s.Sid == "KeepBatchFileBodies"]) == "${module.data.bucket_arns["batch-files"]}/batch-files/*"
    error_message = "the gateway task role may touch objects under that config's prefix of that bucket"
  }
}

