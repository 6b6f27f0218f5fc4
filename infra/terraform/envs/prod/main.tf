# The prod environment. State in the S3 bucket envs/bootstrap creates (infra/README.md, Deploy):
#   terraform -chdir=infra/terraform/envs/prod init -backend-config=backend.hcl && terraform -chdir=infra/terraform/envs/prod apply

terraform {
  required_version = ">= 1.11" # write-only arguments (modules/data)
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
  # partial: the bucket and region come from envs/bootstrap (`terraform output -raw backend_config > backend.hcl`,
  # then `terraform init -backend-config=backend.hcl`); S3's own lock file serializes applies (no DynamoDB table)
  backend "s3" {
    key          = "prod/terraform.tfstate"
    encrypt      = true
    use_lockfile = true
  }
}

provider "aws" {
  region = var.region
  default_tags {
    tags = { Project = "sluice", Environment = "prod", ManagedBy = "terraform" }
  }
}

module "platform" {
  source                = "../../modules/platform"
  providers             = { aws = aws, aws.secrets = aws } # aws.secrets: modules/data's ephemeral passwords
  name                  = "sluice-prod"
  availability_zones    = ["us-east-1a", "us-east-1b", "us-east-1c"]
  certificate_arn       = var.certificate_arn
  gateway_image         = var.gateway_image
  worker_image          = var.worker_image
  image_repository_arns = var.image_repository_arns
  endpoints             = var.endpoints
  endpoint_settings     = var.endpoint_settings
  alarm_emails          = var.alarm_emails
  nat_gateway           = "per_az"
  gateway_min_tasks     = 2
  gateway_max_tasks     = 12
  gateway_cpu           = 1024
  gateway_memory        = 2048
  gpu_instance_types    = var.gpu_instance_types
  gpu_spot              = var.gpu_spot
  gpu_max_instances     = 8
  db_instance_class     = "db.r6g.large"
  db_multi_az           = true
  cache_node_type       = "cache.r7g.large"
  cache_replicas        = 1
  log_retention_days    = 365
  deletion_protection   = true
}
