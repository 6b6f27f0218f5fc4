output "ecs_cluster_name" {
  value = module.gateway.cluster_name
}

output "worker_service_names" {
  value = module.worker_pool.worker_service_names
}

output "gateway_service_name" {
  value = module.gateway.service_name
}

output "bucket_names" {
  value = module.data.bucket_names
}

output "secret_arns" {
  value = module.data.secret_arns
}

output "region" {
  value = var.region
}

output "gateway_config_toml" {
  description = "The config the gateway tasks receive as SLUICE_CONFIG_TOML."
  value       = local.gateway_config_toml
}

output "activator_queue_metric_namespace" {
  value = module.observability.activator_queue_metric_namespace
}
