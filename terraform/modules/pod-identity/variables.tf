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
  description = "Prefix of each namespace's role name; the role is <prefix><cluster_name>-<region>-<namespace>, cut to IAM's 64 characters with a hash of the whole at the end when longer."
  type        = string
  default     = "podmutator-pods-"
  validation {
    condition     = can(regex("^[A-Za-z0-9+=,.@_-]{0,40}$", var.role_name_prefix))
    error_message = "role_name_prefix must be at most 40 characters IAM allows in a role name (letters, digits and +=,.@_-)."
  }
}

variable "iam_role_path" {
  description = "Path of the roles."
  type        = string
  default     = "/"
  validation {
    condition     = can(regex("^/([\\x21-\\x7E]+/)?$", var.iam_role_path))
    error_message = "iam_role_path must start and end with '/'."
  }
}

variable "permissions_boundary_arn" {
  description = "Permissions boundary of the roles, where the account requires one."
  type        = string
  default     = null
}

variable "secrets_region" {
  description = "Region of the secrets the pods read (the function's secrets_region); null: the provider's region, where the cluster is."
  type        = string
  default     = null
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
