# The managed parts the gateways depend on: the rate limiter's Redis (ElastiCache), the usage log's EFS, the NAT
# gateways the private subnets reach AWS APIs and images through, and PostgreSQL's connections.

locals {
  # one alarm per (name => metric). ElastiCache reports per node (`<replication group>-001` and up): every node
  # has its own, since after a failover the primary is another node than -001
  dependency_alarms = merge(
    var.cache_replication_group_id == "" ? {} : merge([for node in [for n in range(1, var.cache_nodes + 1) : format("%03d", n)] : {
      "redis_cpu_${node}" = {
        namespace = "AWS/ElastiCache", metric = "EngineCPUUtilization", statistic = "Average", comparison = "GreaterThanThreshold",
        threshold = 80, periods = 3, dimension = "CacheClusterId", dimension_value = "${var.cache_replication_group_id}-${node}"
        what      = "Redis node ${node} (the shared rate limits and fleet state) above 80% engine CPU for 15 minutes: admissions slow down for every gateway"
      }
      "redis_memory_${node}" = {
        namespace = "AWS/ElastiCache", metric = "DatabaseMemoryUsagePercentage", statistic = "Maximum", comparison = "GreaterThanThreshold",
        threshold = 85, periods = 3, dimension = "CacheClusterId", dimension_value = "${var.cache_replication_group_id}-${node}"
        what      = "Redis node ${node} memory above 85% for 15 minutes: evictions would drop rate-limit windows and fleet leases"
      }
    }]...),
    !var.efs_alarm ? {} : {
      efs_io_limit = {
        namespace = "AWS/EFS", metric = "PercentIOLimit", statistic = "Maximum", comparison = "GreaterThanThreshold",
        threshold = 95, periods = 3, dimension = "FileSystemId", dimension_value = var.efs_file_system_id
        what      = "The usage log's EFS at its I/O limit for 15 minutes: ledger writes stall and requests get 503 ledger_unavailable"
      }
    },
    { for index, id in var.nat_gateway_ids : "nat_${index}_port_allocation" => {
      namespace = "AWS/NATGateway", metric = "ErrorPortAllocation", statistic = "Sum", comparison = "GreaterThanThreshold",
      threshold = 0, periods = 1, dimension = "NatGatewayId", dimension_value = id
      what      = "NAT gateway ${index} ran out of source ports: calls to AWS APIs, ECR and S3 from the private subnets fail"
    } },
    !var.rds_alarm || var.db_instance_id == null || var.db_instance_id == "" ? {} : {
      rds_connections = {
        namespace = "AWS/RDS", metric = "DatabaseConnections", statistic = "Maximum", comparison = "GreaterThanThreshold",
        threshold = var.max_rds_connections, periods = 2, dimension = "DBInstanceIdentifier", dimension_value = var.db_instance_id
        what      = "PostgreSQL above ${var.max_rds_connections} connections for 10 minutes: new gateway pools will be refused"
      }
    },
  )
}

resource "aws_cloudwatch_metric_alarm" "dependency" {
  for_each            = local.dependency_alarms
  alarm_name          = "${var.name}-${replace(each.key, "_", "-")}"
  alarm_description   = each.value.what
  namespace           = each.value.namespace
  metric_name         = each.value.metric
  dimensions          = { (each.value.dimension) = each.value.dimension_value }
  statistic           = each.value.statistic
  period              = 300
  evaluation_periods  = each.value.periods
  comparison_operator = each.value.comparison
  threshold           = each.value.threshold
  treat_missing_data  = "notBreaching"
  alarm_actions       = [aws_sns_topic.alarms.arn]
  ok_actions          = [aws_sns_topic.alarms.arn]
}
