variable "name" {
  description = "Environment name, e.g. sluice-prod."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,23}$", var.name))
    error_message = "name: 3-24 characters, lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "kms_key_arn" {
  type = string
}

variable "log_retention_days" {
  type    = number
  default = 90
  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days: one of the values CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, ...)."
  }
}

variable "alb_alarms" {
  description = "Create the 5xx-rate alarm (needs alb_arn_suffix)."
  type        = bool
  default     = true
}

variable "alb_arn_suffix" {
  type    = string
  default = ""
}

variable "max_5xx_percent" {
  type    = number
  default = 2
  validation {
    condition     = var.max_5xx_percent > 0 && var.max_5xx_percent <= 100
    error_message = "max_5xx_percent: above 0, at most 100."
  }
}

variable "max_activator_queue" {
  description = "Requests waiting for cold endpoints in one gateway task (summed over its endpoints) that page someone."
  type        = number
  default     = 100
}

variable "rds_alarm" {
  type    = bool
  default = true
}

variable "db_instance_id" {
  type    = string
  default = ""
}

variable "max_rds_cpu_percent" {
  type    = number
  default = 80
}

variable "alarm_emails" {
  type    = list(string)
  default = []
}

variable "target_group_arn_suffix" {
  description = "The gateway target group (for the unhealthy-host alarm)."
  type        = string
  default     = ""
}

variable "gpu_alarms" {
  description = "Create the GPU capacity alarm and the worker start-failure events (need the names below)."
  type        = bool
  default     = true
}

variable "gpu_autoscaling_group_name" {
  type    = string
  default = ""
}

variable "gpu_max_instances" {
  type    = number
  default = 1
}

variable "cluster_arn" {
  type    = string
  default = ""
}

variable "worker_service_prefix" {
  description = "Every worker service's name starts with this (modules/worker_pool)."
  type        = string
  default     = ""
}

variable "min_rds_free_storage_gb" {
  type    = number
  default = 5
}

variable "cache_replication_group_id" {
  description = "The ElastiCache replication group of the rate limits (\"\" = no Redis alarms)."
  type        = string
  default     = ""
}

variable "cache_nodes" {
  description = "Nodes of that replication group (1 + its replicas): each has its own Redis alarms."
  type        = number
  default     = 1
  validation {
    condition     = var.cache_nodes >= 1 && var.cache_nodes <= 6 && floor(var.cache_nodes) == var.cache_nodes
    error_message = "cache_nodes: 1 to 6 (the primary and up to 5 replicas)."
  }
}

variable "efs_alarm" {
  description = "Page when the usage log's EFS file system (efs_file_system_id) is at its I/O limit."
  type        = bool
  default     = false
}

variable "efs_file_system_id" {
  type    = string
  default = ""
}

variable "nat_gateway_ids" {
  type    = list(string)
  default = []
}

variable "max_rds_connections" {
  description = "PostgreSQL connections that page someone (keep it below the instance class's max_connections)."
  type        = number
  default     = 400
}

variable "usage_export_alarm" {
  description = "Page when the daily usage export fails or does not finish within 26 hours."
  type        = bool
  default     = true
}

variable "monthly_budget_usd" {
  description = "The month's AWS spend that pages at 80% (actual) and 100% (forecast); 0 = no budget."
  type        = number
  default     = 0
  validation {
    condition     = var.monthly_budget_usd >= 0
    error_message = "monthly_budget_usd: 0 (none) or more."
  }
}
