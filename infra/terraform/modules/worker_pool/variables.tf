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

variable "cluster_arn" {
  type = string
}

variable "private_subnet_ids" {
  type = list(string)
}

variable "security_group_ids" {
  description = "From the network module: worker is used here."
  type        = map(string)
}

variable "image" {
  description = "Worker image, pinned by digest or version tag (built from infra/docker/worker.Dockerfile)."
  type        = string
  validation {
    condition     = can(regex("(@sha256:[0-9a-f]{64}|:[A-Za-z0-9._-]+)$", var.image)) && !endswith(var.image, ":latest")
    error_message = "image: pin a tag or a digest; :latest is refused."
  }
}

variable "endpoints" {
  description = "Endpoint name (the served model name, may contain '/') => its deployment. One ECS service each."
  type = map(object({
    source         = string # s3://<weights bucket>/<prefix>, or a hub id baked into the image
    quantization   = optional(string, "auto")
    max_batch_size = optional(number, 32)
    gpus           = optional(number, 1)
    memory_mib     = optional(number, 14336)
  }))
  validation {
    condition     = alltrue([for name, e in var.endpoints : e.gpus >= 1 && e.gpus <= 8])
    error_message = "endpoints: gpus must be 1 to 8 (each worker reserves whole GPUs)."
  }
  validation {
    condition     = alltrue([for name, e in var.endpoints : contains(["auto", "none", "int8", "nf4", "fp4", "w8a8"], e.quantization)])
    error_message = "endpoints: quantization must be one of auto, none, int8, nf4, fp4, w8a8."
  }
  validation {
    condition     = length(distinct([for name in keys(var.endpoints) : substr(trim(replace(lower(name), "/[^a-z0-9]+/", "-"), "-"), 0, 40)])) == length(var.endpoints)
    error_message = "endpoints: two endpoint names map to the same service name; rename one."
  }
}

variable "instance_types" {
  description = "GPU instance types, in order of preference (on-demand takes the first with capacity; spot any of them). Each must hold the largest endpoint's gpus and memory_mib."
  type        = list(string)
  default     = ["g5.xlarge"]
  validation {
    condition     = length(var.instance_types) >= 1 && length(var.instance_types) <= 20 && length(distinct(var.instance_types)) == length(var.instance_types)
    error_message = "instance_types: 1 to 20 types, no repeats (an Auto Scaling group takes at most 20 overrides)."
  }
  validation {
    condition     = alltrue([for t in var.instance_types : can(regex("^(g4dn|g5|g6|g6e|p3|p4d|p5)\\.[0-9a-z]+$", t))])
    error_message = "instance_types: GPU instance types only (g4dn, g5, g6, g6e, p3, p4d, p5 families)."
  }
}

variable "spot" {
  description = "Spot GPU hosts beside the on-demand ones: a second capacity provider. on_demand_base tasks of each endpoint stay on on-demand hosts; the rest split on_demand_weight : spot_weight."
  type = object({
    enabled          = optional(bool, false)
    max_instances    = optional(number, 4)
    on_demand_base   = optional(number, 1)
    on_demand_weight = optional(number, 0)
    spot_weight      = optional(number, 1)
  })
  default  = {}
  nullable = false
  validation {
    condition     = var.spot.max_instances >= 1 && var.spot.max_instances <= 100 && floor(var.spot.max_instances) == var.spot.max_instances
    error_message = "spot.max_instances: a whole number from 1 to 100."
  }
  validation {
    condition     = alltrue([for n in [var.spot.on_demand_base, var.spot.on_demand_weight, var.spot.spot_weight] : n >= 0 && n <= 1000 && floor(n) == n]) && var.spot.on_demand_base <= 100000
    error_message = "spot: on_demand_base, on_demand_weight and spot_weight are whole numbers from 0 to 1000 (ECS's bounds)."
  }
  validation {
    condition     = var.spot.on_demand_weight + var.spot.spot_weight > 0
    error_message = "spot: on_demand_weight and spot_weight cannot both be 0 (ECS needs a weight to place tasks)."
  }
}

variable "max_instances" {
  type    = number
  default = 4
  validation {
    condition     = var.max_instances >= 1
    error_message = "max_instances: at least 1."
  }
}

variable "ami_id" {
  description = "Override the GPU AMI (default: the ECS GPU-optimized AMI, read from SSM at plan time)."
  type        = string
  default     = ""
}

variable "ami_ssm_parameter" {
  description = "The ECS GPU-optimized AMI on Amazon Linux 2023 (Amazon Linux 2 is past its end of support)."
  type        = string
  default     = "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id"
  validation {
    condition     = !strcontains(var.ami_ssm_parameter, "amazon-linux-2/")
    error_message = "ami_ssm_parameter: Amazon Linux 2 is past its end of support; use the amazon-linux-2023 GPU AMI."
  }
}

variable "image_cuda_version" {
  description = "The CUDA of the worker image's torch build (infra/docker/worker.Dockerfile: TORCH_INDEX cu128 = 12.8)."
  type        = string
  default     = "12.8"
  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+$", var.image_cuda_version))
    error_message = "image_cuda_version: major.minor, e.g. 12.8."
  }
}

variable "ami_driver_cuda_version" {
  description = "The newest CUDA the AMI's NVIDIA driver serves (nvidia-smi's \"CUDA Version\"; the AL2023 ECS GPU AMI ships a 570-series driver: 12.8). The plan refuses an image that needs more, and each host checks it again at boot (user data)."
  type        = string
  default     = "12.8"
  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+$", var.ami_driver_cuda_version))
    error_message = "ami_driver_cuda_version: major.minor, e.g. 12.8."
  }
}

variable "warm_pool_size" {
  description = "Stopped GPU hosts kept with the worker image pulled (0 = no warm pool). Stopped hosts cost only their EBS volume."
  type        = number
  default     = 0
  validation {
    condition     = var.warm_pool_size >= 0
    error_message = "warm_pool_size: 0 or more."
  }
}

variable "root_volume_throughput" {
  description = "gp3 throughput of each GPU host's volume in MiB/s (gp3's baseline is 125; a multi-GB image pull is bound by it)."
  type        = number
  default     = 500
  validation {
    condition     = var.root_volume_throughput >= 125 && var.root_volume_throughput <= 1000
    error_message = "root_volume_throughput: 125 to 1000 MiB/s (gp3)."
  }
}

variable "root_volume_iops" {
  type    = number
  default = 4000
  validation {
    condition     = var.root_volume_iops >= 3000 && var.root_volume_iops <= 16000
    error_message = "root_volume_iops: 3000 to 16000 (gp3)."
  }
}

variable "instance_profile_arn" {
  type = string
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

variable "worker_port" {
  type    = number
  default = 8100
}

variable "target_capacity_percent" {
  description = "Managed scaling keeps the GPU hosts this full; 100 = no idle host kept warm."
  type        = number
  default     = 100
  validation {
    condition     = var.target_capacity_percent > 0 && var.target_capacity_percent <= 100
    error_message = "target_capacity_percent: 1 to 100."
  }
}

variable "worker_secret_arn" {
  description = "The Secrets Manager secret the gateway also reads as SLUICE_WORKER_SECRET (data module: secret_arns[\"worker_secret\"])."
  type        = string
  validation {
    condition     = startswith(var.worker_secret_arn, "arn:") && !strcontains(var.worker_secret_arn, "*")
    error_message = "worker_secret_arn: the exact ARN of a Secrets Manager secret."
  }
}

variable "warm_pull_timeout_seconds" {
  description = "The longest a host launched for the warm pool may take to pull the worker image before it is stopped anyway."
  type        = number
  default     = 1800
  validation {
    condition     = var.warm_pull_timeout_seconds >= 30 && var.warm_pull_timeout_seconds <= 7200
    error_message = "warm_pull_timeout_seconds: 30 to 7200 (the lifecycle hook's heartbeat timeout)."
  }
}
