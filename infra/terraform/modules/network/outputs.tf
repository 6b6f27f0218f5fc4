output "vpc_id" {
  value = aws_vpc.main.id
}

output "public_subnet_ids" {
  value = aws_subnet.public[*].id
}

output "private_subnet_ids" {
  value = aws_subnet.private[*].id
}

output "security_group_ids" {
  description = "alb, gateway, worker, database, cache, wal"
  value = {
    alb      = aws_security_group.alb.id
    gateway  = aws_security_group.gateway.id
    worker   = aws_security_group.worker.id
    database = aws_security_group.database.id
    cache    = aws_security_group.cache.id
    wal      = aws_security_group.wal.id
  }
}

output "nat_gateway_ids" {
  description = "The NAT gateways (none, one, or one per zone): their port-exhaustion alarms."
  value       = aws_nat_gateway.main[*].id
}
