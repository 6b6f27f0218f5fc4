variable "aws_endpoint" {
  description = "The local AWS (moto server) URL, e.g. http://127.0.0.1:5000."
  type        = string
  validation {
    condition     = can(regex("^http://(127\\.0\\.0\\.1|localhost):[0-9]+$", var.aws_endpoint))
    error_message = "aws_endpoint: a loopback URL (http://127.0.0.1:<port>); this env never talks to real AWS."
  }
}

variable "region" {
  type    = string
  default = "us-east-1"
}

variable "certificate_arn" {
  description = "A certificate imported into the local ACM by the test."
  type        = string
}

variable "endpoints" {
  type = map(object({
    source         = string
    quantization   = optional(string, "auto")
    max_batch_size = optional(number, 32)
    gpus           = optional(number, 1)
    memory_mib     = optional(number, 14336)
  }))
  default = {
    "HuggingFaceTB/SmolLM2-135M-Instruct" = { source = "s3://weights/smollm2", quantization = "none" }
    "tiny/random-llama"                   = { source = "s3://weights/tiny", gpus = 1 }
  }
}

variable "endpoint_settings" {
  description = "Per endpoint, the gateway-side fields of its [[models]] entry: both asleep until called."
  type        = any # keeps each value's type (modules/platform validates the fields)
  default = {
    "HuggingFaceTB/SmolLM2-135M-Instruct" = { min_replicas = 0, max_replicas = 1 }
    "tiny/random-llama"                   = { min_replicas = 0, max_replicas = 1, idle_seconds = 1 }
  }
}
