# Once per AWS account and region, before dev or prod (infra/README.md, Deploy): the state bucket and the image
# repositories. Its own state stays local (terraform.tfstate here): keep it, or move it into the new bucket with
# a backend "s3" block and `terraform init -migrate-state`.
#   terraform -chdir=infra/terraform/envs/bootstrap init && terraform -chdir=infra/terraform/envs/bootstrap apply

terraform {
  required_version = ">= 1.11"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}

provider "aws" {
  region = var.region
  default_tags {
    tags = { Project = "sluice", Environment = "bootstrap", ManagedBy = "terraform" }
  }
}

variable "region" {
  type    = string
  default = "us-east-1"
}

variable "state_bucket" {
  description = "The state bucket's name; empty: sluice-terraform-state-<account id>."
  type        = string
  default     = ""
}

module "bootstrap" {
  source       = "../../modules/bootstrap"
  state_bucket = var.state_bucket
}

output "backend_config" {
  description = "terraform output -raw backend_config > ../prod/backend.hcl (and ../dev/backend.hcl)"
  value       = module.bootstrap.backend_config
}

output "repository_urls" {
  value = module.bootstrap.repository_urls
}

output "repository_arns" {
  value = module.bootstrap.repository_arns
}
