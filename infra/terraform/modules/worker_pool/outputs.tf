output "worker_service_names" {
  description = "Endpoint name => its ECS service name (what the gateway's ECS provisioner scales)."
  value       = { for name, service in aws_ecs_service.worker : name => service.name }
}

output "worker_service_prefix" {
  value = "${var.name}-worker-"
}

output "capacity_provider_name" {
  value = aws_ecs_capacity_provider.gpu.name
}

output "autoscaling_group_name" {
  value = aws_autoscaling_group.gpu.name
}

output "warm_pool_min_size" {
  description = "Stopped hosts kept in the warm pool (null: no warm pool)."
  value       = one(aws_autoscaling_group.gpu.warm_pool[*].min_size)
}
