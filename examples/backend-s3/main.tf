# An S3 bucket and a KMS key for the examples' Terraform state, made once per account before
# them (with local state: this module's own state holds no secret). The examples' state holds
# the path token, so it is encrypted with a customer managed key, whose policy and the bucket's
# decide who can read it: keep both as narrow as access to the secrets.
#
#   1. Here:               terraform init && terraform apply -var region=eu-west-1
#   2.                     terraform output -raw backend_hcl > ../alb/backend.hcl
#                          cp backend.tf.example ../alb/backend.tf   (the backend "s3" block)
#   3. In ../alb:          terraform init -backend-config=backend.hcl
#                          (with local state from before: add -migrate-state)
#
# Locking is S3's own (use_lockfile, Terraform 1.10+): no DynamoDB table.

terraform {
  required_version = ">= 1.11"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}

variable "region" {
  description = "Region of the bucket and the key (the cluster's, usually)."
  type        = string
}

variable "bucket_name" {
  description = "Name of the state bucket; null: podmutator-tfstate-<account>-<region>."
  type        = string
  default     = null
}

variable "state_key" {
  description = "Object key of the state in backend_hcl (one per root module: podmutator/alb.tfstate, podmutator/http-api.tfstate, ...)."
  type        = string
  default     = "podmutator/terraform.tfstate"
}

provider "aws" {
  region = var.region
}

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}

locals {
  account = data.aws_caller_identity.current.account_id
  bucket  = coalesce(var.bucket_name, "podmutator-tfstate-${local.account}-${var.region}")
}

data "aws_iam_policy_document" "key" {
  # The account's IAM policies decide who may use the key (the default key policy): grant
  # kms:Decrypt, kms:Encrypt and kms:GenerateDataKey on it to whoever runs the examples.
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${local.account}:root"]
    }
  }

  #checkov:skip=CKV_AWS_109:A key policy's "*" resource is this key alone; the statement is AWS's default key policy, delegating to the account's IAM policies.
  #checkov:skip=CKV_AWS_111:A key policy's "*" resource is this key alone; the statement is AWS's default key policy, delegating to the account's IAM policies.
  #checkov:skip=CKV_AWS_356:A key policy's "*" resource is this key alone; the statement is AWS's default key policy, delegating to the account's IAM policies.
}

resource "aws_kms_key" "state" {
  description             = "podmutator Terraform state (holds the webhook's path token)"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.key.json
}

resource "aws_kms_alias" "state" {
  name          = "alias/podmutator-tfstate"
  target_key_id = aws_kms_key.state.key_id
}

resource "aws_s3_bucket" "state" {
  bucket = local.bucket

  # Losing the bucket loses every install's state: destroy it by hand, on purpose.
  lifecycle {
    prevent_destroy = true
  }

  #checkov:skip=CKV_AWS_144:State is small and versioned; cross-region replication would put a second copy of the path token in another region, for a state that is rebuilt from the modules if the region is lost.
  #checkov:skip=CKV_AWS_18:Access logging writes every state read (each plan) to another bucket; CloudTrail data events on this bucket are the audit trail if one is wanted.
  #checkov:skip=CKV2_AWS_62:Nothing reacts to state writes; event notifications would only add a consumer that could read object metadata.
  #checkov:skip=CKV2_AWS_61:No lifecycle rule on purpose: every earlier state (a version per apply, a few KB each) is the way back from a bad apply or a corrupted state.
}

resource "aws_s3_bucket_versioning" "state" {
  bucket = aws_s3_bucket.state.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "state" {
  bucket = aws_s3_bucket.state.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.state.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_public_access_block" "state" {
  bucket                  = aws_s3_bucket.state.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "state" {
  bucket = aws_s3_bucket.state.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

data "aws_iam_policy_document" "bucket" {
  # TLS only. (The bucket's default encryption puts every object under the key.)
  statement {
    sid       = "DenyPlainHttp"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.state.arn, "${aws_s3_bucket.state.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "state" {
  bucket = aws_s3_bucket.state.id
  policy = data.aws_iam_policy_document.bucket.json

  depends_on = [aws_s3_bucket_public_access_block.state]
}

output "bucket" {
  value = aws_s3_bucket.state.id
}

output "kms_key_arn" {
  value = aws_kms_key.state.arn
}

output "backend_hcl" {
  description = "The settings for backend.tf.example's partial backend block: terraform init -backend-config=backend.hcl."
  value       = <<-EOT
    bucket       = "${aws_s3_bucket.state.id}"
    key          = "${var.state_key}"
    region       = "${var.region}"
    encrypt      = true
    kms_key_id   = "${aws_kms_key.state.arn}"
    use_lockfile = true
  EOT
}
