# podmutator behind an internal ALB in an existing EKS cluster's VPC, registered with the cluster.
# The ALB admits HTTPS only from the control plane's dedicated security group (never the cluster
# security group, which nodes and pods carry), and every URL carries the secret path token.
#
#   1. In the podmutator checkout:  cargo lambda build --release --arm64 --output-format zip
#                                   scripts/lambda-artefact.sh   (prints the zip's base64 SHA-256)
#   2. Here:                        cp terraform.tfvars.example terraform.tfvars  (and edit it)
#   3.                              terraform init && terraform apply
#
# Needs only the AWS provider; the registration is applied with kubectl and the deployer's own
# credentials (modules/registration). Copy this directory anywhere and point the `source`s at
# the module (a path, or a git URL with //terraform?ref=<tag>).

terraform {
  required_version = ">= 1.11"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.100"
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
  description = "Fail (default) or Ignore: the fail-open switch (docs/deploy.md, \"Fail open\")."
  type        = string
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

  lambda_zip_path         = var.lambda_zip_path
  lambda_zip_base64sha256 = var.lambda_zip_base64sha256
  domain_name             = var.domain_name
  route53_zone_id         = var.route53_zone_id

  endpoint                        = "alb"
  vpc_id                          = module.network.vpc_id
  subnet_ids                      = module.network.subnet_ids
  control_plane_security_group_id = module.network.control_plane_security_group_id

  # Flyte's webhook section; Embedded reads u__org__flyte__... secrets from Secrets Manager.
  webhook_config = {
    secretManagerTypes = ["Embedded"]
    secretEnvVarPrefix = "_UNION_"
  }
  # Only Flyte's propeller may create pods that receive Embedded secrets.
  allowed_usernames = ["system:serviceaccount:flyte:flytepropeller"]
}

# Applied last (it depends on the whole AWS module), deleted first.
module "registration" {
  source = "../../terraform/modules/registration"

  registration     = module.podmutator.registration
  failure_policy   = var.failure_policy
  eks_cluster_name = var.cluster_name
  eks_region       = var.region

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
