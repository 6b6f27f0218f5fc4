variable "name" {
  description = "Environment name, e.g. sluice-prod."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,23}$", var.name))
    error_message = "name: 3-24 characters, lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "cluster_name" {
  type = string
}

variable "worker_service_prefix" {
  description = "Every worker service's name starts with this; the gateway may scale only those services."
  type        = string
  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{3,}$", var.worker_service_prefix))
    error_message = "worker_service_prefix: at least 3 letters, digits, hyphens or underscores (no wildcard)."
  }
}

variable "gateway_secret_arns" {
  type = list(string)
  validation {
    condition     = length(var.gateway_secret_arns) > 0 && alltrue([for arn in var.gateway_secret_arns : !strcontains(arn, "*")])
    error_message = "gateway_secret_arns: exact ARNs, no wildcards."
  }
}

variable "worker_secret_arn" {
  description = "The one secret the workers' execution role may inject (the gateway reads it too)."
  type        = string
  validation {
    condition     = !strcontains(var.worker_secret_arn, "*")
    error_message = "worker_secret_arn: an exact ARN, no wildcards."
  }
}

variable "export_bucket_arn" {
  type = string
}

variable "export_secret_arn" {
  description = "The one secret the usage export's execution role may inject: the database URL (null: none, envs/local)."
  type        = string
  default     = null
  validation {
    condition     = var.export_secret_arn == null || !strcontains(coalesce(var.export_secret_arn, "-"), "*")
    error_message = "export_secret_arn: an exact ARN, no wildcards."
  }
}

variable "config_object_arn" {
  description = "The gateway's config object (modules/gateway: <config bucket>/gateway/config.toml), the one object it reads."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9.-]+/[^*]+$", var.config_object_arn))
    error_message = "config_object_arn: one S3 object's ARN (arn:aws:s3:::<bucket>/<key>), no wildcards."
  }
}

variable "weights_bucket_arn" {
  type = string
}

variable "kms_key_arn" {
  type = string
}

variable "wal_file_system_arn" {
  type = string
}

variable "wal_access_point_arn" {
  type = string
}

variable "gateway_log_group_arn" {
  type = string
}

variable "worker_log_group_arn" {
  type = string
}

variable "metric_namespace" {
  description = "The CloudWatch namespace the gateway publishes its activator queue depth in (the alarm's)."
  type        = string
  validation {
    condition     = can(regex("^[0-9A-Za-z.\\-_/#:]{1,255}$", var.metric_namespace)) && !startswith(var.metric_namespace, "AWS/")
    error_message = "metric_namespace: 1-255 of A-Z a-z 0-9 . - _ / # :, not starting with AWS/."
  }
}

variable "image_repository_arns" {
  description = "ECR repositories the tasks pull from (gateway and worker images)."
  type        = list(string)
  default     = []
}

variable "redis_iam" {
  description = "The replication group and the IAM-authenticated ElastiCache user the gateway signs in to Redis as (modules/data's redis_iam); null: no elasticache:Connect."
  type = object({
    cache_name = string
    user       = string
  })
  default = null
  validation {
    condition     = var.redis_iam == null || alltrue([for id in [try(var.redis_iam.cache_name, ""), try(var.redis_iam.user, "")] : can(regex("^[a-z][a-z0-9-]{0,39}$", id))])
    error_message = "redis_iam: cache_name and user are ElastiCache ids (lowercase letters, digits, hyphens; no wildcard)."
  }
}

variable "metrics_log_group_arn" {
  description = "The log group the gateway task's metrics collector writes (modules/observability `metrics`); null: no collector."
  type        = string
  default     = null
  validation {
    condition     = var.metrics_log_group_arn == null || can(regex("^arn:aws[a-z-]*:logs:[a-z0-9-]+:[0-9]{12}:log-group:[^*]+$", coalesce(var.metrics_log_group_arn, "-")))
    error_message = "metrics_log_group_arn: one log group's ARN, no wildcards."
  }
}

variable "batch_files" {
  description = "The bucket and key prefix of the Files/Batches API bodies (modules/data's batch_files): the gateway task writes, reads and deletes objects under the prefix only."
  type = object({
    bucket_arn = string
    prefix     = string
  })
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:s3:::[a-z0-9][a-z0-9.-]+$", var.batch_files.bucket_arn)) && can(regex("^[A-Za-z0-9_./-]+/$", var.batch_files.prefix))
    error_message = "batch_files: one bucket's ARN (arn:aws:s3:::<bucket>) and a prefix ending in /, no wildcards."
  }
}
