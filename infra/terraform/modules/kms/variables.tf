variable "name" {
  description = "Environment name, e.g. sluice-prod."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,23}$", var.name))
    error_message = "name: 3-24 characters, lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "deletion_window_in_days" {
  type    = number
  default = 30
  validation {
    condition     = var.deletion_window_in_days >= 7 && var.deletion_window_in_days <= 30
    error_message = "deletion_window_in_days: AWS allows 7 to 30."
  }
}
