# The task pods' own AWS identity for reference delivery: `podmutator fetch` in each pod reads
# that pod's secrets with it, so who may read what is enforced by IAM, not by the webhook.
#
# One role per namespace, bound by EKS Pod Identity associations to the namespace's service
# accounts, allowed to read exactly the names its pods may resolve:
#   u__org__<org>__domain__<domain>__project__<project>__key__*   (project scope)
#   u__org__<org>__domain__<domain>__project____key__*            (domain scope)
#   u__org__<org>__domain____project____key__*                    (organisation scope)
#
# Why not one role with ABAC on Pod Identity's kubernetes-namespace session tag: IAM policy
# variables substitute a tag whole, and the names hold the project and the domain as separate
# parts (`__domain__<d>__project__<p>`) while the namespace joins them (`<p>-<d>`); no policy
# can split the tag, and a split on '-' would be ambiguous anyway. Tagging each secret with its
# namespace does not work either: domain- and organisation-scope secrets serve many namespaces
# and a tag holds one value. The session tag is still checked, as a second lock: a role
# associated with the wrong namespace by mistake reads nothing. docs/deploy.md has the details.
#
# AWS provider only, like the parent module.

terraform {
  required_version = ">= 1.11"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}

data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

locals {
  account = data.aws_caller_identity.current.account_id
  # `id` is the region's name in provider 5.x and 6.x alike.
  region         = data.aws_region.current.id
  secrets_region = coalesce(var.secrets_region, local.region)
  cluster_arn    = "arn:${data.aws_partition.current.partition}:eks:${local.region}:${local.account}:cluster/${var.cluster_name}"
  secret_arn     = "arn:${data.aws_partition.current.partition}:secretsmanager:${local.secrets_region}:${local.account}:secret"

  # IAM role names are global to the account, across regions: <prefix><cluster>-<region>-
  # <namespace>, so that two clusters with the same namespaces (staging and production, say, or
  # one cluster name in two regions) get their own roles. Past IAM's 64 characters the name is
  # cut and ends in a hash of the whole, which stays unique.
  role_full_names = {
    for ns, _ in var.namespaces : ns => "${var.role_name_prefix}${var.cluster_name}-${local.region}-${ns}"
  }
  role_names = {
    for ns, full in local.role_full_names : ns => (
      length(full) <= 64 ? full : "${substr(full, 0, 55)}-${substr(sha256(full), 0, 8)}"
    )
  }
  associations = merge([
    for ns, v in var.namespaces : {
      for sa in v.service_accounts : "${ns}/${sa}" => { namespace = ns, service_account = sa }
    }
  ]...)
}

data "aws_iam_policy_document" "trust" {
  statement {
    sid     = "EksPodIdentity"
    actions = ["sts:AssumeRole", "sts:TagSession"]
    principals {
      type        = "Service"
      identifiers = ["pods.eks.amazonaws.com"]
    }
    # Only this account's cluster may hand the role to its pods (confused deputy).
    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account]
    }
    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [local.cluster_arn]
    }
  }
}

data "aws_iam_policy_document" "read" {
  for_each = var.namespaces

  # BatchGetSecretValue has no resource-level permissions: "*" is the only resource it takes.
  # It returns nothing by itself; each secret in the batch still needs GetSecretValue below.
  statement {
    sid       = "BatchGet"
    actions   = ["secretsmanager:BatchGetSecretValue"]
    resources = ["*"]
  }

  statement {
    sid     = "ReadOwnScopes"
    actions = ["secretsmanager:GetSecretValue"]
    # Secrets Manager appends -<6 random characters> to a secret's ARN; the wildcard after
    # __key__ covers the key and that suffix.
    resources = [
      "${local.secret_arn}:u__org__${var.organization}__domain__${each.value.domain}__project__${each.value.project}__key__*",
      "${local.secret_arn}:u__org__${var.organization}__domain__${each.value.domain}__project____key__*",
      "${local.secret_arn}:u__org__${var.organization}__domain____project____key__*",
    ]
    # Pod Identity's session tags: the role works only for pods of its namespace and cluster.
    condition {
      test     = "StringEquals"
      variable = "aws:PrincipalTag/kubernetes-namespace"
      values   = [each.key]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:PrincipalTag/eks-cluster-name"
      values   = [var.cluster_name]
    }
  }

  dynamic "statement" {
    for_each = length(var.kms_key_arns) > 0 ? [1] : []
    content {
      sid       = "DecryptThroughSecretsManager"
      actions   = ["kms:Decrypt"]
      resources = var.kms_key_arns
      condition {
        test     = "StringEquals"
        variable = "kms:ViaService"
        values   = ["secretsmanager.${local.secrets_region}.${data.aws_partition.current.dns_suffix}"]
      }
    }
  }
}

resource "aws_iam_role" "pods" {
  for_each = var.namespaces

  # A renamed role (an install made before names held the region) is made before the old one
  # goes, so the associations move to it without a moment with no role.
  lifecycle {
    create_before_destroy = true
  }

  name                 = local.role_names[each.key]
  path                 = var.iam_role_path
  permissions_boundary = var.permissions_boundary_arn
  description          = "Task pods of ${each.key} in ${var.cluster_name}: read ${var.organization}/${each.value.domain}/${each.value.project} secrets (podmutator reference delivery)"
  assume_role_policy   = data.aws_iam_policy_document.trust.json
  tags                 = var.tags
}

resource "aws_iam_role_policy" "read" {
  for_each = var.namespaces

  name   = "read-flyte-secrets"
  role   = aws_iam_role.pods[each.key].id
  policy = data.aws_iam_policy_document.read[each.key].json
}

resource "aws_eks_pod_identity_association" "pods" {
  for_each = local.associations

  cluster_name    = var.cluster_name
  namespace       = each.value.namespace
  service_account = each.value.service_account
  role_arn        = aws_iam_role.pods[each.value.namespace].arn
  tags            = var.tags
}
