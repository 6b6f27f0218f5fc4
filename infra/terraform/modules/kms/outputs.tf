output "key_arn" {
  value = aws_kms_key.main.arn
}

output "key_policy" {
  description = "The key policy as a JSON string (for tests and audits)."
  value       = aws_kms_key.main.policy
}
