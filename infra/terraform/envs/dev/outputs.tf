output "alb_dns_name" {
  description = "Point your API domain's CNAME/alias here."
  value       = module.platform.alb_dns_name
}

output "ecs_cluster_name" {
  value = module.platform.ecs_cluster_name
}

output "worker_service_names" {
  value = module.platform.worker_service_names
}

output "bucket_names" {
  value = module.platform.bucket_names
}
