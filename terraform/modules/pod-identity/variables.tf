variable "cluster_name" {
  description = "The EKS cluster whose task pods fetch secrets (EKS Pod Identity Agent add-on installed)."
  type        = string
}

variable "organization" {
  description = "Flyte organisation: the <org> of the u__org__<org>__... secret names (the pods' `organization` label)."
  type        = string
  validation {
    # No '_': the names' separators are double underscores, so an org with '_' could reach
    # into another org's names through the wildcard.
    condition     = can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", var.organization))
    error_message = "organization must be lowercase letters, digits and '-' (no '_', which would let the name wildcard reach other organisations)."
  }
}

variable "namespaces" {
  description = "Task namespaces (Flyte's <project>-<domain>) with the project and domain their pods may read, and the service accounts their pods run as."
  type = map(object({
    project          = string
    domain           = string
    service_accounts = optional(list(string), ["default"])
  }))
  validation {
    condition = alltrue([for ns, v in var.namespaces :
      can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", ns)) && length(ns) <= 63
      && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", v.project))
      && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", v.domain))
      && length(v.service_accounts) > 0
    ])
    error_message = "Each namespace must be a DNS label, with a project and domain of lowercase letters, digits and '-' (no '_', which would let the name wildcard reach other projects) and at least one service account."
  }
}

variable "role_name_prefix" {
  description = "Prefix of each namespace's role name; the role is <prefix><namespace> (IAM: at most 64 characters)."
  type        = string
  default     = "podmutator-pods-"
  validation {
    condition     = alltrue([for ns, _ in var.namespaces : length("${var.role_name_prefix}${ns}") <= 64])
    error_message = "role_name_prefix plus the longest namespace must be at most 64 characters (IAM's limit for role names); shorten the prefix."
  }
}

variable "kms_key_arns" {
  description = "Customer managed KMS keys the secrets are encrypted with (kms:Decrypt through Secrets Manager only); empty for the AWS managed key."
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags for the roles."
  type        = map(string)
  default     = {}
}
