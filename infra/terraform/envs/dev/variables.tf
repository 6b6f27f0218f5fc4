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
