variable "region" {
  type    = string
  default = "us-east-1"
}

variable "certificate_arn" {
  description = "ACM certificate for the gateway's HTTPS listener (issued for your API domain)."
  type        = string
}

variable "gateway_image" {
  description = "<account>.dkr.ecr.<region>.amazonaws.com/sluice-gateway:<version> (or @sha256:...)."
  type        = string
}

variable "worker_image" {
  type = string
}

variable "image_repository_arns" {
  type    = list(string)
  default = []
}

variable "endpoints" {
  description = "Endpoint name => { source, quantization, max_batch_size, gpus, memory_mib } (see modules/worker_pool)."
  type = map(object({
    source         = string
    quantization   = optional(string, "auto")
    max_batch_size = optional(number, 32)
    gpus           = optional(number, 1)
    memory_mib     = optional(number, 14336)
  }))
}

variable "endpoint_settings" {
  description = "Endpoint name => gateway-side fields of its [[models]] entry (min_replicas, max_replicas, idle_seconds, ...)."
  type        = any # keeps each value's type (modules/platform validates the fields)
  default     = {}
}

variable "alarm_emails" {
  type    = list(string)
  default = []
}

variable "gpu_instance_types" {
  description = "GPU instance types, in order of preference; each must hold the largest endpoint (gpus, memory_mib)."
  type        = list(string)
  default     = ["g4dn.xlarge", "g5.xlarge"]
}

variable "gpu_spot" {
  description = "Spot GPU hosts beside on-demand: { enabled = true, max_instances = 4, on_demand_base = 1, on_demand_weight = 0, spot_weight = 1 }."
  type = object({
    enabled          = optional(bool, false)
    max_instances    = optional(number, 4)
    on_demand_base   = optional(number, 1)
    on_demand_weight = optional(number, 0)
    spot_weight      = optional(number, 1)
  })
  default = {}
}
