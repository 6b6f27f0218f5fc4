# EFS for the gateway's usage write-ahead log: a Fargate task's own disk dies with it, so each task
# writes its log under its own directory here; a crashed task's log is replayed by the next gateway
# (infra/README.md, "Usage durability").

resource "aws_efs_file_system" "wal" {
  creation_token  = "${var.name}-wal"
  encrypted       = true
  kms_key_id      = var.kms_key_arn
  throughput_mode = "elastic"
  lifecycle_policy {
    transition_to_ia = "AFTER_30_DAYS"
  }
  tags = { Name = "${var.name}-wal" }
}

resource "aws_efs_backup_policy" "wal" {
  count          = var.efs_management_apis ? 1 : 0
  file_system_id = aws_efs_file_system.wal.id
  backup_policy {
    status = "ENABLED"
  }
}

resource "aws_efs_mount_target" "wal" {
  count           = length(var.private_subnet_ids)
  file_system_id  = aws_efs_file_system.wal.id
  subnet_id       = var.private_subnet_ids[count.index]
  security_groups = [var.security_group_ids["wal"]]
}

# the image's non-root user (uid 10001) owns the gateway's directory
resource "aws_efs_access_point" "gateway" {
  file_system_id = aws_efs_file_system.wal.id
  posix_user {
    uid = 10001
    gid = 10001
  }
  root_directory {
    path = "/gateway"
    creation_info {
      owner_uid   = 10001
      owner_gid   = 10001
      permissions = "0750"
    }
  }
}

resource "aws_efs_file_system_policy" "wal" {
  count          = var.efs_management_apis ? 1 : 0
  file_system_id = aws_efs_file_system.wal.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "DenyInsecureTransport"
      Effect    = "Deny"
      Principal = { AWS = "*" }
      Action    = "*"
      Resource  = aws_efs_file_system.wal.arn
      Condition = { Bool = { "aws:SecureTransport" = "false" } }
    }]
  })
}
