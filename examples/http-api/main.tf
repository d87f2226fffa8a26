# podmutator behind an API Gateway HTTP API with a secret path token, registered with the
# cluster. Use it only where the internal ALB cannot work: this endpoint is reachable from the
# internet, and the generated token in the URL is all that keeps strangers from the secrets the
# function can read (README, Deploy, "What each endpoint protects against").
#
#   1. In the podmutator checkout:  cargo lambda build --release --arm64 --output-format zip
#   2. Here:                        cp terraform.tfvars.example terraform.tfvars  (and edit it)
#   3.                              terraform init && terraform apply
#
# The token lives in Terraform state, in Secrets Manager and in the registration's URL: keep
# the state encrypted and access to it as narrow as access to the secrets.

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
  endpoint        = "http_api"

  webhook_config = {
    secretManagerTypes = ["Embedded"]
    secretEnvVarPrefix = "_UNION_"
  }
  allowed_usernames = ["system:serviceaccount:flyte:flytepropeller"]

  # Bounds what guessing at the token costs; raise it if pod creation bursts are throttled.
  api_throttling_burst_limit = 100
  api_throttling_rate_limit  = 50
}

output "webhook_url" {
  value     = module.podmutator.webhook_url
  sensitive = true
}

output "path_token_secret_arn" {
  value = module.podmutator.path_token_secret_arn
}

output "function_name" {
  value = module.podmutator.function_name
}
