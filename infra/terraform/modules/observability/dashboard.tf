# One CloudWatch dashboard: the gateway's traffic and errors, the activator's queue, the gateways' own events
# (limiter outage, failed endpoints, ECS throttling), the GPU hosts, and the dependencies' alarmed metrics.
locals {
  region        = data.aws_region.current.name
  namespace     = "Sluice/${var.name}"
  event_metrics = [for key, event in local.gateway_events : [local.namespace, event.metric]]
  dashboard_widgets = concat(
    var.alb_alarms ? [{
      type = "metric", width = 12, height = 6,
      properties = {
        title = "Requests and unintended 5xx", region = local.region, stat = "Sum", period = 60,
        metrics = [
          ["AWS/ApplicationELB", "RequestCount", "LoadBalancer", var.alb_arn_suffix],
          [".", "HTTPCode_ELB_5XX_Count", ".", "."],
          [local.namespace, "GatewayUnintended5xx"],
        ]
      }
    }] : [],
    [{
      type = "metric", width = 12, height = 6,
      properties = { title = "Requests waiting for a replica (activator)", region = local.region, stat = "Maximum", period = 60,
      metrics = [[local.namespace, "ActivatorQueueDepth"]] }
      }, {
      type = "metric", width = 12, height = 6,
      properties = { title = "Gateway events: limiter outage, failed endpoints, ECS throttling", region = local.region,
      stat = "Sum", period = 60, metrics = local.event_metrics }
    }],
    var.gpu_alarms ? [{
      type = "metric", width = 12, height = 6,
      properties = { title = "GPU hosts", region = local.region, stat = "Maximum", period = 60,
        metrics = [["AWS/AutoScaling", "GroupDesiredCapacity", "AutoScalingGroupName", var.gpu_autoscaling_group_name],
      [".", "GroupInServiceInstances", ".", "."]] }
    }] : [],
    length(local.dependency_alarms) == 0 ? [] : [{
      type = "metric", width = 24, height = 6,
      properties = { title = "Dependencies (alarmed metrics)", region = local.region, period = 300, stat = "Maximum",
      metrics = [for key, alarm in local.dependency_alarms : [alarm.namespace, alarm.metric, alarm.dimension, alarm.dimension_value]] }
    }],
    [{
      type = "alarm", width = 24, height = 4,
      properties = { title = "Every alarm", alarms = concat(
        [aws_cloudwatch_metric_alarm.activator_queue.arn],
        [for alarm in aws_cloudwatch_metric_alarm.gateway_event : alarm.arn],
        [for alarm in aws_cloudwatch_metric_alarm.dependency : alarm.arn],
      aws_cloudwatch_metric_alarm.gateway_5xx_rate[*].arn, aws_cloudwatch_metric_alarm.rds_cpu[*].arn) }
    }],
  )
}

resource "aws_cloudwatch_dashboard" "main" {
  dashboard_name = var.name
  dashboard_body = jsonencode({ widgets = local.dashboard_widgets })
}
