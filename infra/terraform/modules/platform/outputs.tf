output "alb_dns_name" {
  value = module.gateway.alb_dns_name
}

output "ecs_cluster_name" {
  value = module.gateway.cluster_name
}

output "worker_service_names" {
  description = "Endpoint name => ECS service name."
  value       = module.worker_pool.worker_service_names
}

output "bucket_names" {
  value = module.data.bucket_names
}

output "gateway_config_toml" {
  description = "The config the gateway tasks receive as SLUICE_CONFIG_TOML."
  value       = local.gateway_config_toml
}
