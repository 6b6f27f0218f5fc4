output "gateway_task_role_arn" {
  value = aws_iam_role.task["gateway-task"].arn
}

output "gateway_execution_role_arn" {
  value = aws_iam_role.task["gateway-execution"].arn
}

output "export_task_role_arn" {
  value = aws_iam_role.task["export-task"].arn
}

output "export_execution_role_arn" {
  value = aws_iam_role.task["export-execution"].arn
}

output "worker_task_role_arn" {
  value = aws_iam_role.task["worker-task"].arn
}

output "worker_execution_role_arn" {
  value = aws_iam_role.task["worker-execution"].arn
}

output "worker_instance_profile_arn" {
  value = aws_iam_instance_profile.worker.arn
}

output "policies" {
  description = "Each role's inline policy, as JSON (for tests and audits)."
  value       = { for key, policy in aws_iam_role_policy.task : key => policy.policy }
}

output "scheduler_role_arn" {
  value = aws_iam_role.scheduler.arn
}
