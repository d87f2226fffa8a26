terraform {
  # 1.9: variable validations may refer to other variables.
  required_version = ">= 1.9"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.70"
    }
    # kubernetes_manifest, not kubernetes_mutating_webhook_configuration_v1: the typed resource
    # cannot express matchConditions (hashicorp/terraform-provider-kubernetes#2750).
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = ">= 2.23"
    }
    random = {
      source  = "hashicorp/random"
      version = ">= 3.5"
    }
  }
}
