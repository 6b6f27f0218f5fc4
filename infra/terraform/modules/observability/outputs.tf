output "log_group_names" {
  value = { for key, group in aws_cloudwatch_log_group.service : key => group.name }
}

output "log_group_arns" {
  value = { for key, group in aws_cloudwatch_log_group.service : key => group.arn }
}

output "alarm_topic_arn" {
  value = aws_sns_topic.alarms.arn
}

output "activator_queue_metric_namespace" {
  description = "Where the gateways publish ActivatorQueueDepth (gateway/endpoints/queue_metric.py) for the queue alarm."
  value       = aws_cloudwatch_metric_alarm.activator_queue.namespace
}
