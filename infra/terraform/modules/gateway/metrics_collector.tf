# The gateway's Prometheus /metrics, scraped inside its own task: an ADOT collector sidecar reads
# 127.0.0.1:<port>/metrics every minute with the metrics token (Secrets Manager, the gateway's `metrics_token`
# setting) and writes CloudWatch embedded-metric records to the `metrics` log group. CloudWatch turns the
# per-model series below into metrics in `<namespace>/Gateway`; every other series stays queryable in the log
# group (Logs Insights) without a metric per team. The ALB still answers /metrics 404: nothing outside the task
# scrapes it.
# Checked against ADOT v0.40.0 (collector-contrib v0.102.0; github.com/aws-observability/aws-otel-collector): the
# image reads its whole config from AOT_CONFIG_CONTENT (pkg/config/config_factory.go); the Prometheus receiver keeps
# counter names with `_total` (the NormalizeName gate is off there, docs/releases/v0.31.0.md), which the selectors
# below match; awsemf fills `{TaskId}` in a stream name from the resource attribute `aws.ecs.task.id`, which only the
# `resourcedetection` processor's `ecs` detector sets (contrib PR #29602): without it every task wrote one
# stream, `gateway/undefined`.

locals {
  collector = var.metrics_log_group_name != "" && contains(keys(var.secret_arns), "metrics_token")
  collector_config = yamlencode({
    receivers = {
      prometheus = {
        config = {
          scrape_configs = [{
            job_name        = "sluice-gateway"
            scrape_interval = "60s"
            metrics_path    = "/metrics"
            authorization   = { type = "Bearer", credentials = "$${env:SLUICE_METRICS_TOKEN}" }
            static_configs  = [{ targets = ["127.0.0.1:${var.port}"] }]
          }]
        }
      }
    }
    processors = {
      resourcedetection = { detectors = ["ecs"] } # the task's id for `{TaskId}` (ECS task metadata endpoint v4)
    }
    exporters = {
      awsemf = {
        namespace                        = "${var.metrics_namespace}/Gateway"
        log_group_name                   = var.metrics_log_group_name
        log_stream_name                  = "gateway/{TaskId}"
        region                           = data.aws_region.current.name
        resource_to_telemetry_conversion = { enabled = false }
        dimension_rollup_option          = "NoDimensionRollup"
        metric_declarations = [{
          dimensions            = [["model"]]
          metric_name_selectors = ["^sluice_requests_total$", "^sluice_generated_tokens_total$", "^sluice_prompt_tokens_total$", "^sluice_time_to_first_token_seconds", "^sluice_request_duration_seconds"]
        }]
      }
    }
    service = {
      pipelines = { metrics = { receivers = ["prometheus"], processors = ["resourcedetection"], exporters = ["awsemf"] } }
    }
  })
  collector_container = {
    name                   = "metrics-collector"
    image                  = var.metrics_collector_image
    essential              = false # a collector that dies never stops the gateway
    readonlyRootFilesystem = true
    memoryReservation      = 64
    environment            = [{ name = "AOT_CONFIG_CONTENT", value = local.collector_config }]
    secrets                = local.collector ? [{ name = "SLUICE_METRICS_TOKEN", valueFrom = var.secret_arns["metrics_token"] }] : []
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = var.log_group_name
        awslogs-region        = data.aws_region.current.name
        awslogs-stream-prefix = "metrics-collector"
      }
    }
  }
}
