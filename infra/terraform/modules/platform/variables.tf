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
  type    = string
  default = "single"
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
  type    = list(string)
  default = []
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
  description = "Per endpoint, the gateway-side fields of its [[models]] entry (min/max replicas, idle_seconds, ...)."
  type        = map(map(any))
  default     = {}
  validation {
    condition     = alltrue([for fields in values(var.endpoint_settings) : length(setintersection(keys(fields), ["name", "provisioner", "urls"])) == 0])
    error_message = "endpoint_settings: name, provisioner and urls are set by the platform (the endpoint's ECS service)."
  }
}

variable "gpu_instance_type" {
  type    = string
  default = "g5.xlarge"
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

variable "deletion_protection" {
  type    = bool
  default = true
}
