terraform {
  required_version = ">= 1.11" # write-only arguments
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.100, < 6.0" # password_wo, secret_string_wo
    }
  }
}

# the ephemeral passwords' provider (secrets.tf): the caller passes its own aws (providers = { aws.secrets = aws }).
# A proxy block rather than configuration_aliases, which `terraform validate` of the module alone refuses.
provider "aws" {
  alias = "secrets"
}
