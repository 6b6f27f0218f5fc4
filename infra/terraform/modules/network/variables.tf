variable "name" {
  description = "Environment name, e.g. sluice-prod."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{2,23}$", var.name))
    error_message = "name: 3-24 characters, lowercase letters, digits and hyphens, starting with a letter."
  }
}

variable "cidr_block" {
  type    = string
  default = "10.40.0.0/16"
  validation {
    condition     = can(cidrhost(var.cidr_block, 0)) && try(tonumber(split("/", var.cidr_block)[1]) <= 20, false)
    error_message = "cidr_block: an IPv4 CIDR of /20 or larger (each AZ gets a public and a private /24 or larger)."
  }
}

variable "availability_zones" {
  description = "Two or more AZs: the ALB, RDS multi-AZ and the tasks spread over them."
  type        = list(string)
  validation {
    condition     = length(var.availability_zones) >= 2 && length(distinct(var.availability_zones)) == length(var.availability_zones)
    error_message = "availability_zones: at least two distinct zones."
  }
}

variable "nat_gateway" {
  description = "Outbound internet for private subnets: none (VPC endpoints only), single (one NAT, cheaper) or per_az (one per AZ, survives an AZ loss)."
  type        = string
  default     = "single"
  validation {
    condition     = contains(["none", "single", "per_az"], var.nat_gateway)
    error_message = "nat_gateway: one of none, single, per_az."
  }
}

variable "kms_key_arn" {
  description = "Key that encrypts the flow-log group."
  type        = string
}

variable "flow_log_retention_days" {
  type    = number
  default = 365
}

variable "gateway_port" {
  type    = number
  default = 8000
}

variable "worker_port" {
  type    = number
  default = 8100
  validation {
    condition     = var.worker_port >= 1024 && var.worker_port <= 65535
    error_message = "worker_port: 1024-65535 (the worker runs as a non-root user)."
  }
}
