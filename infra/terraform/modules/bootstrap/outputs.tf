output "state_bucket" {
  value = aws_s3_bucket.state.bucket
}

output "backend_config" {
  description = "The dev/prod backend's settings: write it to backend.hcl, then `terraform init -backend-config=backend.hcl`."
  value       = "bucket = \"${aws_s3_bucket.state.bucket}\"\nregion = \"${data.aws_region.current.name}\"\n"
}

output "repository_urls" {
  description = "Where `docker push` sends each image (<account>.dkr.ecr.<region>.amazonaws.com/<name>)."
  value       = { for name, repo in aws_ecr_repository.image : name => repo.repository_url }
}

output "repository_arns" {
  value = [for repo in aws_ecr_repository.image : repo.arn]
}
