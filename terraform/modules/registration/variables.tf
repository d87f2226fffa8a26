variable "registration" {
  description = "The AWS module's `registration` output: url, path_token, mesh_enabled, mesh_label_key, timeout_seconds, image_builder_object_selector, images_enabled, images_pod_selector, images_namespace_selector, deletion_protection (true: a destroy of the registration is refused, as the AWS module's alb_deletion_protection refuses its own)."
  type = object({
    url             = string
    path_token      = optional(string)
    mesh_enabled    = bool
    mesh_label_key  = string
    timeout_seconds = optional(number)

    image_builder_object_selector = optional(any)
    images_enabled                = optional(bool, false)
    images_pod_selector           = optional(any)
    images_namespace_selector     = optional(any)

    deletion_protection = optional(bool, false)
  })
  sensitive = true
}

variable "failure_policy" {
  description = "failurePolicy of every webhook (Fail or Ignore); null keeps registration.json's (Fail). The fail-open switch: docs/deploy.md, \"Fail open\"."
  type        = string
  default     = null
}

variable "secrets_namespace_selector" {
  description = "A LabelSelector (matchLabels, matchExpressions) narrowing the secrets webhook to some namespaces, combined with its kube-system exclusion: a staged rollout, one namespace first (docs/migration.md, \"Staged rollout\"). null: every namespace but kube-system."
  type        = any
  default     = null

  validation {
    condition     = var.secrets_namespace_selector == null || try(length(setsubtract(keys(var.secrets_namespace_selector), ["matchLabels", "matchExpressions"])) == 0 && length(keys(var.secrets_namespace_selector)) > 0, false)
    error_message = "secrets_namespace_selector must be a LabelSelector: an object with matchLabels and/or matchExpressions, e.g. { matchLabels = { \"kubernetes.io/metadata.name\" = \"flytesnacks-development\" } }."
  }
}

variable "ca_bundle_pem" {
  description = "PEM CA the API server must trust for the endpoint (private CA); null uses its system roots."
  type        = string
  default     = null
}

variable "name" {
  description = "metadata.name of the MutatingWebhookConfiguration; null keeps registration.json's (podmutator)."
  type        = string
  default     = null
}

variable "kubectl" {
  description = "kubectl executable (1.22 or later, for server-side apply)."
  type        = string
  default     = "kubectl"
}

variable "eks_cluster_name" {
  description = "EKS cluster to register with, using the deployer's AWS credentials (`aws eks update-kubeconfig` into a temporary file). Null: use kubeconfig_path / KUBECONFIG."
  type        = string
  default     = null
}

variable "eks_region" {
  description = "Region of eks_cluster_name (null: the AWS CLI's default)."
  type        = string
  default     = null
}

variable "kubeconfig_path" {
  description = "kubeconfig to use when eks_cluster_name is null (null: kubectl's default)."
  type        = string
  default     = null
}

variable "kube_context" {
  description = "kubeconfig context (null: the current one)."
  type        = string
  default     = null
}

variable "field_manager" {
  description = "Server-side apply field manager that owns the registration's fields."
  type        = string
  default     = "podmutator-terraform"
}

variable "delete_on_destroy" {
  description = "Delete the registration on destroy (and when it is replaced by a differently named one)."
  type        = bool
  default     = true
}
