# podmutator behind an internal ALB in an existing EKS cluster's VPC, registered with the cluster.
# The endpoint accepts connections only from the cluster security group, which the EKS control
# plane's network interfaces carry: the API server is the only client that can reach it.
#
#   1. In the podmutator checkout:  cargo lambda build --release --arm64 --output-format zip
#   2. Here:                        cp terraform.tfvars.example terraform.tfvars  (and edit it)
#   3.                              terraform init && terraform apply
#
# Copy this directory anywhere; point `source` at the module (a path, or a git URL with
# //terraform?ref=<tag>) and lambda_zip_path at the zip.

terraform {
  required_version = ">= 1.9"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.70"
    }
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = ">= 2.23"
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

variable "subnet_ids" {
  description = "Private subnets for the ALB (two or more AZs); empty uses the cluster's subnets."
  type        = list(string)
  default     = []
}

variable "control_plane_security_group_id" {
  description = "An additional cluster security group that only the control plane carries (vpc_config.security_group_ids at cluster creation or update). Null falls back to the cluster security group, which managed node groups carry too."
  type        = string
  default     = null
}

variable "lambda_zip_path" {
  description = "The zip from `cargo lambda build --release --arm64 --output-format zip`."
  type        = string
  default     = "../../target/lambda/podmutator/bootstrap.zip"
}

provider "aws" {
  region = var.region
}

data "aws_eks_cluster" "this" {
  name = var.cluster_name
}

# The registration is applied with the deployer's own cluster credentials.
provider "kubernetes" {
  host                   = data.aws_eks_cluster.this.endpoint
  cluster_ca_certificate = base64decode(data.aws_eks_cluster.this.certificate_authority[0].data)
  exec {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", var.cluster_name, "--region", var.region]
  }
}

module "podmutator" {
  source = "../../terraform"

  lambda_zip_path = var.lambda_zip_path
  domain_name     = var.domain_name
  route53_zone_id = var.route53_zone_id

  endpoint                  = "alb"
  vpc_id                    = data.aws_eks_cluster.this.vpc_config[0].vpc_id
  subnet_ids                = length(var.subnet_ids) > 0 ? var.subnet_ids : tolist(data.aws_eks_cluster.this.vpc_config[0].subnet_ids)
  cluster_security_group_id = coalesce(var.control_plane_security_group_id, data.aws_eks_cluster.this.vpc_config[0].cluster_security_group_id)

  # Flyte's webhook section; Embedded reads u__org__flyte__... secrets from Secrets Manager.
  webhook_config = {
    secretManagerTypes = ["Embedded"]
    secretEnvVarPrefix = "_UNION_"
  }
  # Only Flyte's propeller may create pods that receive Embedded secrets.
  allowed_usernames = ["system:serviceaccount:flyte:flytepropeller"]
}

output "webhook_url" {
  value     = module.podmutator.webhook_url
  sensitive = true
}

output "function_name" {
  value = module.podmutator.function_name
}

output "log_group_name" {
  value = module.podmutator.log_group_name
}
