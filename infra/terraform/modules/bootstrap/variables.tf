variable "prefix" {
  description = "Names the state bucket (<prefix>-terraform-state-<account>) when state_bucket is empty."
  type        = string
  default     = "sluice"
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,20}$", var.prefix))
    error_message = "prefix: 2-21 lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "state_bucket" {
  description = "The state bucket's name; empty: <prefix>-terraform-state-<account id> (bucket names are global)."
  type        = string
  default     = ""
  validation {
    condition     = var.state_bucket == "" || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.state_bucket))
    error_message = "state_bucket: an S3 bucket name (3-63 lowercase letters, digits, dots, hyphens)."
  }
}

variable "repositories" {
  description = "The ECR repositories: the gateway's and the worker's image (infra/docker)."
  type        = list(string)
  default     = ["sluice-gateway", "sluice-worker"]
  validation {
    condition     = length(var.repositories) > 0 && alltrue([for r in var.repositories : can(regex("^[a-z0-9][a-z0-9._/-]{1,255}$", r))])
    error_message = "repositories: ECR repository names (lowercase letters, digits, . _ / -)."
  }
}

variable "images_kept" {
  description = "Images each repository keeps (older ones expire)."
  type        = number
  default     = 50
  validation {
    condition     = var.images_kept >= 5 && var.images_kept <= 10000 && floor(var.images_kept) == var.images_kept
    error_message = "images_kept: a whole number from 5 (room for rollbacks) to 10000."
  }
}

variable "state_version_days" {
  description = "Days an overwritten state version is kept."
  type        = number
  default     = 90
  validation {
    condition     = var.state_version_days >= 7 && var.state_version_days <= 3650
    error_message = "state_version_days: 7 to 3650."
  }
}
