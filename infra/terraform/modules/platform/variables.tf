variable "name" {
  description = "Environment name, e.g. sluice-prod."
  type        = string
}

variable "availability_zones" {
  type = list(string)
}

variable "cidr_block" {
  type    = string
  default = "10.40.0.0/16"
}

variable "nat_gateway" {
  description = "single or per_az. The tasks pull images from ECR, write CloudWatch logs and read Secrets Manager, so a platform without a NAT is refused (the network module alone still allows none)."
  type        = string
  default     = "single"
  validation {
    condition     = contains(["single", "per_az"], var.nat_gateway)
    error_message = "nat_gateway: single or per_az; \"none\" leaves the tasks without ECR, CloudWatch Logs, Secrets Manager and ECS endpoints (the platform adds no interface endpoints)."
  }
}

variable "certificate_arn" {
  type = string
}

variable "gateway_image" {
  type = string
}

variable "worker_image" {
  type = string
}

variable "image_repository_arns" {
  description = "ECR repositories the tasks may pull from beyond those of gateway_image and worker_image (those are derived)."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for arn in var.image_repository_arns : can(regex("^arn:aws[a-z-]*:ecr:[a-z0-9-]+:[0-9]{12}:repository/[a-z0-9._/-]+$", arn))])
    error_message = "image_repository_arns: ECR repository ARNs (arn:aws:ecr:<region>:<account>:repository/<name>), no wildcards."
  }
}

variable "gateway_min_tasks" {
  type    = number
  default = 2
}

variable "gateway_max_tasks" {
  type    = number
  default = 10
}

variable "gateway_cpu" {
  type    = number
  default = 1024
}

variable "gateway_memory" {
  type    = number
  default = 2048
}

variable "endpoints" {
  description = "See modules/worker_pool: endpoint name => deployment."
  type        = any
}

variable "endpoint_settings" {
  description = "Per endpoint, the gateway-side fields of its [[models]] entry (min/max replicas, idle_seconds, team_id, ...). Each value keeps its own type: numbers stay numbers beside a team_id string."
  # `any`, not map(map(any)): a map must have one element type, so a single string (team_id) would turn
  # every value of every endpoint into a string ("900") that the gateway's config loader refuses
  type    = any
  default = {}
  validation {
    condition     = alltrue([for fields in values(var.endpoint_settings) : can(keys(fields))])
    error_message = "endpoint_settings: endpoint name => { field = value, ... }."
  }
  validation {
    condition     = alltrue([for fields in values(var.endpoint_settings) : length(setsubtract(keys(fields), ["min_replicas", "max_replicas", "target_concurrency", "idle_seconds", "max_waiting", "max_queue", "max_wait_seconds", "drain_seconds", "team_id"])) == 0])
    error_message = "endpoint_settings: the fields are min_replicas, max_replicas, target_concurrency, idle_seconds, max_waiting, max_queue, max_wait_seconds, drain_seconds and team_id (name and provisioner are set by the platform: the endpoint's ECS service)."
  }
  validation {
    # jsonencode tells a number (900) from a string ("900"), which tonumber alone would accept
    condition = alltrue([for fields in values(var.endpoint_settings) : alltrue([for key, value in fields :
    key == "team_id" ? can(regex("^\"[^\"]+\"$", jsonencode(value))) : can(tonumber(jsonencode(value)))])])
    error_message = "endpoint_settings: every field is a number, except team_id, a string."
  }
}

variable "scaling" {
  description = "The gateway's [scaling] table (gateway/endpoints/scaling.py), e.g. { ecs_start_timeout_seconds = 2400 }; {} = its defaults."
  type        = map(number)
  default     = {}
}

variable "request_timeout_seconds" {
  description = "The gateway's request_timeout_s; the ALB's idle timeout is set 60 s above it."
  type        = number
  default     = 840
}

variable "gpu_instance_types" {
  description = "GPU instance types in order of preference (modules/worker_pool instance_types, validated there)."
  type        = list(string)
  default     = ["g5.xlarge"]
}

variable "gpu_spot" {
  description = "Spot GPU hosts beside the on-demand ones (modules/worker_pool spot): { enabled, max_instances, on_demand_base, on_demand_weight, spot_weight }."
  type        = any
  default     = {}
}

variable "gpu_warm_pool_size" {
  description = "Stopped GPU hosts kept with the worker image pulled (modules/worker_pool warm_pool_size; 0 = none)."
  type        = number
  default     = 0
}

variable "worker_image_cuda_version" {
  description = "The CUDA of the worker image's torch build (TORCH_INDEX in infra/docker/worker.Dockerfile)."
  type        = string
  default     = "12.8"
}

variable "gpu_max_instances" {
  type    = number
  default = 4
}

variable "db_instance_class" {
  type    = string
  default = "db.t4g.medium"
}

variable "db_multi_az" {
  type    = bool
  default = true
}

variable "cache_node_type" {
  type    = string
  default = "cache.t4g.small"
}

variable "cache_replicas" {
  type    = number
  default = 1
}

variable "log_retention_days" {
  type    = number
  default = 90
}

variable "alarm_emails" {
  type    = list(string)
  default = []
}

variable "monthly_budget_usd" {
  description = "The month's AWS spend that pages the alarm topic at 80% (actual) and 100% (forecast); 0 = no budget."
  type        = number
  default     = 0
}

variable "deletion_protection" {
  type    = bool
  default = true
}

variable "batch_file_retention_days" {
  description = "Days a Files/Batches API file is kept: the gateway's [batches] file_retention_s, and the batch-files bucket's expiry (a day later)."
  type        = number
  default     = 30
}
