variable "name" {
  description = "Environment name, e.g. sluice-prod."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,23}$", var.name))
    error_message = "name: 3-24 characters, lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "vpc_id" {
  type = string
}

variable "public_subnet_ids" {
  type = list(string)
  validation {
    condition     = length(var.public_subnet_ids) >= 2
    error_message = "public_subnet_ids: an ALB needs subnets in at least two AZs."
  }
}

variable "private_subnet_ids" {
  type = list(string)
}

variable "security_group_ids" {
  description = "From the network module: alb and gateway are used here."
  type        = map(string)
}

variable "certificate_arn" {
  description = "ACM certificate for the HTTPS listener."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:acm:[a-z0-9-]+:[0-9]{12}:certificate/[0-9a-f-]+$", var.certificate_arn))
    error_message = "certificate_arn: an ACM certificate ARN (arn:aws:acm:<region>:<account>:certificate/<id>)."
  }
}

variable "ssl_policy" {
  type    = string
  default = "ELBSecurityPolicy-TLS13-1-2-2021-06"
  validation {
    condition     = can(regex("^ELBSecurityPolicy-TLS13-", var.ssl_policy))
    error_message = "ssl_policy: a TLS 1.3 policy (ELBSecurityPolicy-TLS13-*); older policies allow TLS 1.0/1.1 or weak ciphers."
  }
}

variable "image" {
  description = "Gateway image, pinned by digest or version tag (built from infra/docker/gateway.Dockerfile)."
  type        = string
  validation {
    condition     = can(regex("(@sha256:[0-9a-f]{64}|:[A-Za-z0-9._-]+)$", var.image)) && !endswith(var.image, ":latest")
    error_message = "image: pin a tag or a digest; :latest is refused."
  }
}

variable "cpu" {
  type    = number
  default = 1024
  validation {
    condition     = contains([256, 512, 1024, 2048, 4096, 8192, 16384], var.cpu)
    error_message = "cpu: a Fargate size (256, 512, 1024, 2048, 4096, 8192, 16384)."
  }
}

variable "memory" {
  type    = number
  default = 2048
}

variable "min_tasks" {
  type    = number
  default = 2
  validation {
    condition     = var.min_tasks >= 1
    error_message = "min_tasks: at least 1 (the gateway is the activator; it never scales to zero)."
  }
}

variable "max_tasks" {
  type    = number
  default = 10
}

variable "target_requests_per_task" {
  description = "ALB requests per target per minute the autoscaler aims for."
  type        = number
  default     = 600
}

variable "port" {
  type    = number
  default = 8000
}

variable "stop_timeout_seconds" {
  description = "SIGTERM to SIGKILL: the gateway finishes requests, then drains its usage log to PostgreSQL."
  type        = number
  default     = 120
  validation {
    condition     = var.stop_timeout_seconds >= 30 && var.stop_timeout_seconds <= 120
    error_message = "stop_timeout_seconds: 30 to 120 (Fargate's maximum); the drain needs the time."
  }
}

variable "execution_role_arn" {
  type = string
}

variable "task_role_arn" {
  type = string
}

variable "log_group_name" {
  type = string
}

variable "secret_arns" {
  description = "From the data module: admin_key, key_pepper, database_url, redis_url (each becomes SLUICE_<NAME>)."
  type        = map(string)
}

variable "wal_file_system_id" {
  type = string
}

variable "wal_access_point_id" {
  type = string
}

variable "config_toml" {
  description = "The gateway's config file (endpoints and their ECS services): an S3 object in config_bucket, else SLUICE_CONFIG_TOML."
  type        = string
  default     = ""
}

variable "config_bucket" {
  description = "A versioned bucket the gateway's config is written to (gateway/config.toml, read at start: SLUICE_CONFIG_S3); empty: inline."
  type        = string
  default     = ""
}

variable "access_log_bucket" {
  description = "Bucket for ALB access logs (empty: off)."
  type        = string
  default     = ""
}

variable "deletion_protection" {
  type    = bool
  default = true
}

variable "autoscaling" {
  description = "Target-tracking autoscaling of the gateway tasks (false only for the local moto env)."
  type        = bool
  default     = true
}

variable "request_timeout_seconds" {
  description = "The gateway's request_timeout_s (rendered into its config); the ALB's idle timeout is 60 s more."
  type        = number
  default     = 840
  validation {
    condition     = var.request_timeout_seconds >= 30 && var.request_timeout_seconds + 10 <= 3600
    error_message = "request_timeout_seconds: 30 to 3590 (the target group's drain, 10 s more, is at most 3600)."
  }
}

variable "export_bucket" {
  description = "Bucket of the daily usage export (`sluice usage export`); empty: no scheduled export."
  type        = string
  default     = ""
}

variable "export_prefix" {
  type    = string
  default = "usage/"
}

variable "export_schedule" {
  description = "When the usage export runs (EventBridge Scheduler, UTC): after the day it exports has closed."
  type        = string
  default     = "cron(30 1 * * ? *)"
  validation {
    condition     = can(regex("^(cron|rate)\\(.+\\)$", var.export_schedule))
    error_message = "export_schedule: a cron(...) or rate(...) expression."
  }
}

variable "export_task_role_arn" {
  description = "The usage export task's role (modules/iam export-task): writes the exports, nothing of the gateway's."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:role/", var.export_task_role_arn))
    error_message = "export_task_role_arn: an IAM role ARN."
  }
}

variable "export_exec_role_arn" {
  description = "The usage export's execution role (modules/iam export-execution): injects the database URL only."
  type        = string
  validation {
    condition     = can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:role/", var.export_exec_role_arn))
    error_message = "export_exec_role_arn: an IAM role ARN."
  }
}

variable "scheduler_role_arn" {
  description = "The role EventBridge Scheduler runs the export task with (modules/iam: scheduler_role_arn)."
  type        = string
  default     = ""
}

variable "kms_key_arn" {
  description = "The platform key: it encrypts the usage-export schedule (EventBridge Scheduler)."
  type        = string
  default     = null
}

variable "metrics_log_group_name" {
  description = "Where the task's collector writes the gateway's /metrics as embedded-metric records; empty (or no metrics_token secret): no collector."
  type        = string
  default     = ""
}

variable "metrics_namespace" {
  description = "CloudWatch namespace of the scraped series (<namespace>/Gateway)."
  type        = string
  default     = "Sluice"
  validation {
    condition     = can(regex("^[0-9A-Za-z.\\-_/#:]{1,240}$", var.metrics_namespace)) && !startswith(var.metrics_namespace, "AWS/")
    error_message = "metrics_namespace: 1-240 of A-Z a-z 0-9 . - _ / # :, not starting with AWS/."
  }
}

variable "metrics_collector_image" {
  description = "The AWS Distro for OpenTelemetry collector, pinned by tag or digest."
  type        = string
  default     = "public.ecr.aws/aws-observability/aws-otel-collector:v0.40.0"
  validation {
    condition     = can(regex("(@sha256:[0-9a-f]{64}|:v[0-9][A-Za-z0-9._-]*)$", var.metrics_collector_image))
    error_message = "metrics_collector_image: pin a version tag (:vX.Y.Z) or a digest."
  }
}
