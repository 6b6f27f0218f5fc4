terraform {
  required_version = ">= 1.11" # write-only arguments (modules/data)
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.100, < 6.0"
    }
  }
}

# modules/data's ephemeral passwords: the caller passes its own aws (providers = { aws.secrets = aws }).
# A proxy block rather than configuration_aliases, which `terraform validate` of the module alone refuses.
provider "aws" {
  alias = "secrets"
}
