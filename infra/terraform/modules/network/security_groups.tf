# Every security group of the platform, in one place: only the ALB is open to the internet (80/443);
# everything else admits only the security group of the tier in front of it.

resource "aws_security_group" "alb" {
  #checkov:skip=CKV2_AWS_5:Attached outside this module (gateway, data and worker_pool take it from the security_group_ids output).
  name        = "${var.name}-alb"
  description = "Public load balancer: HTTPS, and HTTP that only redirects to HTTPS"
  vpc_id      = aws_vpc.main.id
}

resource "aws_vpc_security_group_ingress_rule" "alb_https" {
  security_group_id = aws_security_group.alb.id
  description       = "HTTPS from clients"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_ingress_rule" "alb_http" {
  #checkov:skip=CKV_AWS_260:Port 80 only answers a 301 to HTTPS (aws_lb_listener.http); no request is served in clear.
  security_group_id = aws_security_group.alb.id
  description       = "HTTP from clients, redirected to HTTPS by the listener"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 80
  to_port           = 80
}

resource "aws_vpc_security_group_egress_rule" "alb_to_gateway" {
  security_group_id            = aws_security_group.alb.id
  description                  = "To the gateway tasks"
  referenced_security_group_id = aws_security_group.gateway.id
  ip_protocol                  = "tcp"
  from_port                    = var.gateway_port
  to_port                      = var.gateway_port
}

resource "aws_security_group" "gateway" {
  #checkov:skip=CKV2_AWS_5:Attached outside this module (gateway, data and worker_pool take it from the security_group_ids output).
  name        = "${var.name}-gateway"
  description = "Gateway tasks: from the ALB only"
  vpc_id      = aws_vpc.main.id
}

resource "aws_vpc_security_group_ingress_rule" "gateway_from_alb" {
  security_group_id            = aws_security_group.gateway.id
  description                  = "From the ALB"
  referenced_security_group_id = aws_security_group.alb.id
  ip_protocol                  = "tcp"
  from_port                    = var.gateway_port
  to_port                      = var.gateway_port
}

resource "aws_vpc_security_group_egress_rule" "gateway_https" {
  security_group_id = aws_security_group.gateway.id
  description       = "AWS APIs (ECS, Secrets Manager, CloudWatch) over HTTPS"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "gateway_to_workers" {
  security_group_id            = aws_security_group.gateway.id
  description                  = "To the workers"
  referenced_security_group_id = aws_security_group.worker.id
  ip_protocol                  = "tcp"
  from_port                    = var.worker_port
  to_port                      = var.worker_port
}

resource "aws_vpc_security_group_egress_rule" "gateway_to_database" {
  security_group_id            = aws_security_group.gateway.id
  description                  = "To PostgreSQL"
  referenced_security_group_id = aws_security_group.database.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_vpc_security_group_egress_rule" "gateway_to_cache" {
  security_group_id            = aws_security_group.gateway.id
  description                  = "To Redis"
  referenced_security_group_id = aws_security_group.cache.id
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
}

resource "aws_vpc_security_group_egress_rule" "gateway_to_wal" {
  security_group_id            = aws_security_group.gateway.id
  description                  = "To the EFS that holds the usage write-ahead log"
  referenced_security_group_id = aws_security_group.wal.id
  ip_protocol                  = "tcp"
  from_port                    = 2049
  to_port                      = 2049
}

resource "aws_security_group" "worker" {
  #checkov:skip=CKV2_AWS_5:Attached outside this module (gateway, data and worker_pool take it from the security_group_ids output).
  name        = "${var.name}-worker"
  description = "Worker tasks and their GPU hosts: from the gateway only"
  vpc_id      = aws_vpc.main.id
}

resource "aws_vpc_security_group_ingress_rule" "worker_from_gateway" {
  security_group_id            = aws_security_group.worker.id
  description                  = "From the gateway"
  referenced_security_group_id = aws_security_group.gateway.id
  ip_protocol                  = "tcp"
  from_port                    = var.worker_port
  to_port                      = var.worker_port
}

resource "aws_vpc_security_group_egress_rule" "worker_https" {
  security_group_id = aws_security_group.worker.id
  description       = "ECS agent, ECR, S3 weights and CloudWatch over HTTPS"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_security_group" "database" {
  #checkov:skip=CKV2_AWS_5:Attached outside this module (gateway, data and worker_pool take it from the security_group_ids output).
  name        = "${var.name}-database"
  description = "PostgreSQL: from the gateway only"
  vpc_id      = aws_vpc.main.id
}

resource "aws_vpc_security_group_ingress_rule" "database_from_gateway" {
  security_group_id            = aws_security_group.database.id
  description                  = "From the gateway"
  referenced_security_group_id = aws_security_group.gateway.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_security_group" "cache" {
  #checkov:skip=CKV2_AWS_5:Attached outside this module (gateway, data and worker_pool take it from the security_group_ids output).
  name        = "${var.name}-cache"
  description = "Redis: from the gateway only"
  vpc_id      = aws_vpc.main.id
}

resource "aws_vpc_security_group_ingress_rule" "cache_from_gateway" {
  security_group_id            = aws_security_group.cache.id
  description                  = "From the gateway"
  referenced_security_group_id = aws_security_group.gateway.id
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
}

resource "aws_security_group" "wal" {
  #checkov:skip=CKV2_AWS_5:Attached outside this module (gateway, data and worker_pool take it from the security_group_ids output).
  name        = "${var.name}-wal"
  description = "EFS for the usage write-ahead log: NFS from the gateway only"
  vpc_id      = aws_vpc.main.id
}

resource "aws_vpc_security_group_ingress_rule" "wal_from_gateway" {
  security_group_id            = aws_security_group.wal.id
  description                  = "NFS from the gateway"
  referenced_security_group_id = aws_security_group.gateway.id
  ip_protocol                  = "tcp"
  from_port                    = 2049
  to_port                      = 2049
}
