# podmutator behind an internal ALB in an existing EKS cluster's VPC, registered with the cluster.
# The ALB admits HTTPS only from the control plane's dedicated security group (never the cluster
# security group, which nodes and pods carry), and every URL carries the secret path token.
#
#   1. In the podmutator checkout:  cargo lambda build --release --arm64 --output-format zip
#                                   scripts/lambda-artefact.sh   (prints the zip's base64 SHA-256)
#   2. Here:                        cp terraform.tfvars.example terraform.tfvars  (and edit it)
#   3.                              terraform init && terraform apply
#
# Remove it with alb_deletion_protection = false in terraform.tfvars, `terraform apply`, then
# `terraform destroy` (while protected, a destroy is refused before it deletes anything); the
# log groups stay (the audit trail) and a later apply installs again beside them. For the
# state, ../backend-s3 makes an encrypted S3 backend.
#
# Needs only the AWS provider; the registration is applied with kubectl and the deployer's own
# credentials (modules/registration). Copy this directory anywhere and point the `source`s at
# the module (a path, or a git URL with //terraform?ref=<tag>).

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
  description = "Region of the cluster."
  type        = string
}

variable "cluster_name" {
  description = "Existing EKS cluster."
  type        = string
}

variable "domain_name" {
  description = "Name for the webhook endpoint, in route53_zone_id (e.g. podmutator.example.com)."
  type        = string
}

variable "route53_zone_id" {
  description = "Public Route 53 zone holding domain_name."
  type        = string
}

variable "control_plane_security_group_id" {
  description = "A security group that only the EKS control plane carries: one of the cluster's additional security groups (vpc_config.security_group_ids). Required; the cluster security group is refused (docs/deploy.md says how to create one)."
  type        = string

  validation {
    condition     = can(regex("^sg-[0-9a-f]+$", var.control_plane_security_group_id))
    error_message = "control_plane_security_group_id must be a security group ID (sg-...)."
  }
}

variable "subnet_ids" {
  description = "Private subnets for the ALB, one per availability zone; empty picks the VPC's subnets tagged kubernetes.io/role/internal-elb, one per zone."
  type        = list(string)
  default     = []
}

variable "lambda_zip_path" {
  description = "The zip from `cargo lambda build --release --arm64 --output-format zip`."
  type        = string
  default     = "../../target/lambda/podmutator/bootstrap.zip"
}

variable "lambda_zip_base64sha256" {
  description = "Its base64 SHA-256 (scripts/lambda-artefact.sh). The code is redeployed when this changes."
  type        = string
}

variable "failure_policy" {
  description = "Ignore fails every webhook open; Fail or null (the default) keeps each webhook's own (docs/deploy.md, \"Fail open\")."
  type        = string
  default     = null
}

variable "alb_deletion_protection" {
  description = "Protect the install: while true, `terraform destroy` is refused before it deletes anything (docs/deploy.md, \"Removal and reinstall\"). Set false in terraform.tfvars and apply before `terraform destroy`."
  type        = bool
  default     = true
}

variable "alb_access_logs_bucket" {
  description = "S3 bucket for ALB access logs; null for none. Every line records the path token: refused unless alb_access_logs_record_path_token is true."
  type        = string
  default     = null
}

variable "alb_access_logs_record_path_token" {
  description = "Acknowledge that ALB access logs record the path token (guard the bucket like the token's secret)."
  type        = bool
  default     = false
}

variable "name" {
  description = "Name of the function and prefix of the AWS resources; unique per account and region (one per cluster in a region)."
  type        = string
  default     = "podmutator"
}

variable "path_token_version" {
  description = "Raise to rotate the path token (docs/deploy.md, \"Rotating the path token\"); keep it in terraform.tfvars: a lower version than the one applied is refused."
  type        = number
  default     = 1
}

variable "previous_path_token_sha256" {
  description = "During a rotation only: `terraform output -raw path_token_sha256` from before raising path_token_version; null again in the next apply."
  type        = string
  default     = null
}

variable "reserved_concurrent_executions" {
  description = "Concurrency reserved for the function out of the account's regional limit; -1 (default) reserves nothing. Reserve only to guarantee admissions against the account's other functions, sized as docs/scale.md says (\"Reserved concurrency\"), and alarm on ClaimedAccountConcurrency."
  type        = number
  default     = -1
}

variable "alarm_topic_arns" {
  description = "SNS topics for the alarms."
  type        = list(string)
  default     = []
}

variable "secret_org" {
  description = "Flyte organisation in the secret names (u__org__<org>__...) and the organization label a pod must carry to receive Embedded secrets."
  type        = string
  default     = "flyte"
}

variable "embedded_domains" {
  description = "Flyte's domains (flyteadmin's), if not development, staging and production: a pod's namespace must end in one of them to receive Embedded secrets."
  type        = list(string)
  default     = []
}

variable "secrets_namespace_selector" {
  description = "Narrow the secrets webhook to some namespaces (a LabelSelector), e.g. one pilot namespace during a staged rollout (docs/migration.md); null: every namespace but kube-system."
  type        = any
  default     = null
}

provider "aws" {
  region = var.region
}

module "network" {
  source = "../../terraform/modules/eks-network"

  cluster_name                    = var.cluster_name
  subnet_ids                      = var.subnet_ids
  control_plane_security_group_id = var.control_plane_security_group_id
}

module "podmutator" {
  source = "../../terraform"

  name                    = var.name
  lambda_zip_path         = var.lambda_zip_path
  lambda_zip_base64sha256 = var.lambda_zip_base64sha256
  domain_name             = var.domain_name
  route53_zone_id         = var.route53_zone_id

  endpoint                        = "alb"
  vpc_id                          = module.network.vpc_id
  subnet_ids                      = module.network.subnet_ids
  control_plane_security_group_id = module.network.control_plane_security_group_id
  alb_deletion_protection         = var.alb_deletion_protection

  alb_access_logs_bucket            = var.alb_access_logs_bucket
  alb_access_logs_record_path_token = var.alb_access_logs_record_path_token

  path_token_version             = var.path_token_version
  previous_path_token_sha256     = var.previous_path_token_sha256
  alarm_topic_arns               = var.alarm_topic_arns
  reserved_concurrent_executions = var.reserved_concurrent_executions

  # Flyte's webhook section; Embedded reads u__org__flyte__... secrets from Secrets Manager.
  webhook_config = {
    secretManagerTypes = ["Embedded"]
    secretEnvVarPrefix = "_UNION_"
  }
  # Only Flyte's propeller may create pods that receive Embedded secrets.
  # Pods another controller creates from a Flyte task carry the task's secret annotations:
  # Spark's (the spark-operator's and the driver's service accounts), Ray's (KubeRay's),
  # Kubeflow's (the training operator's). List those users too (a trailing * matches a
  # prefix, e.g. "system:serviceaccount:flytesnacks-development:*"), or their pods are refused
  # (403 EmbeddedUserNotAllowed).
  allowed_usernames = ["system:serviceaccount:flyte:flytepropeller"]
  # The organisation and domains of your Flyte install, or every Embedded secret is refused.
  secret_org       = var.secret_org
  embedded_domains = var.embedded_domains
}

# Applied last (it depends on the whole AWS module), deleted first.
module "registration" {
  source = "../../terraform/modules/registration"

  registration               = module.podmutator.registration
  failure_policy             = var.failure_policy
  secrets_namespace_selector = var.secrets_namespace_selector
  eks_cluster_name           = var.cluster_name
  eks_region                 = var.region

  depends_on = [module.podmutator]
}

output "webhook_base_url" {
  value = module.podmutator.webhook_base_url
}

output "path_token_secret_arn" {
  value = module.podmutator.path_token_secret_arn
}

output "function_name" {
  value = module.podmutator.function_name
}

output "log_group_name" {
  value = module.podmutator.log_group_name
}

output "path_token_version" {
  description = "The path_token_version applied; a rotation sets this plus one."
  value       = module.podmutator.path_token_version
}

output "path_token_sha256" {
  description = "The token's hash: previous_path_token_sha256 of the next rotation."
  value       = module.podmutator.path_token_sha256
}

output "registration_manifest" {
  description = "The registration as applied, for the drift check (scripts/registration-drift.sh); sensitive: its URLs hold the path token."
  value       = module.registration.manifest
  sensitive   = true
}
