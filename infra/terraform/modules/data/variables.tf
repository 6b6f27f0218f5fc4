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

variable "private_subnet_ids" {
  type = list(string)
  validation {
    condition     = length(var.private_subnet_ids) >= 2
    error_message = "private_subnet_ids: at least two (RDS and EFS span two AZs)."
  }
}

variable "security_group_ids" {
  description = "From the network module: database, cache and wal are used here."
  type        = map(string)
}

variable "managed_databases" {
  description = "Create RDS PostgreSQL and ElastiCache Redis (false only for the local moto env, which has neither)."
  type        = bool
  default     = true
}

variable "db_instance_class" {
  type    = string
  default = "db.t4g.medium"
  validation {
    condition     = can(regex("^db\\.[a-z0-9]+\\.[a-z0-9]+$", var.db_instance_class))
    error_message = "db_instance_class: an RDS class such as db.t4g.medium."
  }
}

variable "db_allocated_storage_gb" {
  type    = number
  default = 50
  validation {
    condition     = var.db_allocated_storage_gb >= 20 && var.db_allocated_storage_gb <= 65536
    error_message = "db_allocated_storage_gb: 20 to 65536."
  }
}

variable "db_multi_az" {
  type    = bool
  default = true
}

variable "db_backup_retention_days" {
  type    = number
  default = 14
  validation {
    condition     = var.db_backup_retention_days >= 7 && var.db_backup_retention_days <= 35
    error_message = "db_backup_retention_days: 7 to 35 (usage records are billing data)."
  }
}

variable "deletion_protection" {
  type    = bool
  default = true
}

variable "cache_node_type" {
  type    = string
  default = "cache.t4g.small"
}

variable "cache_replicas" {
  description = "Read replicas beside the primary; 1 or more gives automatic failover across AZs."
  type        = number
  default     = 1
  validation {
    condition     = var.cache_replicas >= 0 && var.cache_replicas <= 5
    error_message = "cache_replicas: 0 to 5."
  }
}

variable "export_retention_days" {
  description = "Usage exports move to Glacier after 90 days and expire after this many."
  type        = number
  default     = 2557
  validation {
    condition     = var.export_retention_days >= 365
    error_message = "export_retention_days: at least 365 (billing records)."
  }
}

variable "efs_management_apis" {
  description = "AWS Backup and the TLS-only file-system policy for the WAL file system (false only for the local moto env, which lacks both APIs)."
  type        = bool
  default     = true
}

variable "batch_file_retention_days" {
  description = "Days a Files/Batches API file is kept: the gateway's [batches] file_retention_s (modules/platform writes both); the batch-files bucket expires an object a day after."
  type        = number
  default     = 30
  validation {
    condition     = var.batch_file_retention_days >= 1 && var.batch_file_retention_days <= 365 && floor(var.batch_file_retention_days) == var.batch_file_retention_days
    error_message = "batch_file_retention_days: a whole number of days, 1 to 365 (the gateway's file_retention_s allows 366 days at most)."
  }
}
