output "cluster_name" {
  value = aws_ecs_cluster.main.name
}

output "cluster_arn" {
  value = aws_ecs_cluster.main.arn
}

output "service_name" {
  value = aws_ecs_service.gateway.name
}

output "alb_dns_name" {
  value = aws_lb.main.dns_name
}

output "alb_arn_suffix" {
  value = aws_lb.main.arn_suffix
}

output "alb_idle_timeout" {
  value = aws_lb.main.idle_timeout
}

output "alb_access_log_bucket" {
  value = one(aws_lb.main.access_logs[*].bucket)
}

output "target_group_arn_suffix" {
  value = aws_lb_target_group.gateway.arn_suffix
}

output "config_key" {
  description = "The key of the gateway's config object in config_bucket (the gateway task role may read it only)."
  value       = local.config_key
}
