# The gateway's Prometheus /metrics, scraped inside its own task: an ADOT collector sidecar reads
# 127.0.0.1:<port>/metrics every minute with the metrics token (Secrets Manager, the gateway's `metrics_token`
# setting) and writes CloudWatch embedded-metric records to the `metrics` log group. CloudWatch turns the
# per-model series below into metrics in `<namespace>/Gateway`; every other series stays queryable in the log
# group (Logs Insights) without a metric per team. The ALB still answers /metrics 404: nothing outside the task
# scrapes it.

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
      pipelines = { metrics = { receivers = ["prometheus"], exporters = ["awsemf"] } }
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
