variable "registration_json" {
  description = "Text of terraform/registration.json."
  type        = string
}

variable "url" {
  description = "Base URL of the endpoint (https://host[/prefix]); each webhook's path is appended."
  type        = string

  validation {
    # The API server rejects a webhook URL with another scheme, user info, a query or a fragment.
    condition     = can(regex("^https://[^/?#@]+(/[^?#]*)?$", var.url))
    error_message = "url must be https://host[/path] without user info, query or fragment."
  }
}

variable "path_token" {
  description = "Secret first path segment (API Gateway option); null for none."
  type        = string
  default     = null
  sensitive   = true

  validation {
    # Same rule as the function's http.pathToken check: one URL segment, hard to guess.
    condition     = var.path_token == null || can(regex("^[A-Za-z0-9_-]{32,}$", var.path_token))
    error_message = "path_token must be at least 32 letters, digits, '-' or '_'."
  }
}

variable "ca_bundle_pem" {
  description = "PEM CA bundle the API server should trust for the endpoint; null to use its system roots."
  type        = string
  default     = null

  validation {
    condition     = var.ca_bundle_pem == null || strcontains(coalesce(var.ca_bundle_pem, "-"), "-----BEGIN CERTIFICATE-----")
    error_message = "ca_bundle_pem must hold at least one PEM certificate."
  }
  validation {
    # Public: anyone who may read the registration reads the caBundle.
    condition     = var.ca_bundle_pem == null || length(regexall("-----BEGIN [^-]*-----", coalesce(var.ca_bundle_pem, "-"))) == length(regexall("-----BEGIN CERTIFICATE-----", coalesce(var.ca_bundle_pem, "-")))
    error_message = "ca_bundle_pem must hold certificates only: a caBundle is readable by anyone who may read the registration, so a private key in it is published. Give the CA's certificate alone."
  }
}

variable "mesh_enabled" {
  description = "Register the two mesh webhooks."
  type        = bool
  default     = false
}

variable "mesh_label_key" {
  description = "Label that marks mesh-managed pods and namespaces."
  type        = string
  default     = "aether.io/managed"

  validation {
    # A Kubernetes qualified name; also keeps the key safe to substitute into JSON and CEL text.
    condition     = can(regex("^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$", var.mesh_label_key))
    error_message = "mesh_label_key must be a Kubernetes label key such as aether.io/managed."
  }
}

variable "failure_policy" {
  description = "Ignore fails every webhook open; Fail or null keeps registration.json's (Fail, the images webhook Ignore)."
  type        = string
  default     = null

  validation {
    condition     = var.failure_policy == null || contains(["Fail", "Ignore"], coalesce(var.failure_policy, "-"))
    error_message = "failure_policy must be Fail or Ignore."
  }
}

variable "timeout_seconds" {
  description = "Overrides every webhook's timeoutSeconds (an entry that fails open keeps its own when shorter); null keeps registration.json's."
  type        = number
  default     = null

  validation {
    condition     = var.timeout_seconds == null || (coalesce(var.timeout_seconds, 0) >= 1 && coalesce(var.timeout_seconds, 0) <= 30 && floor(coalesce(var.timeout_seconds, 0)) == coalesce(var.timeout_seconds, 0))
    error_message = "timeout_seconds must be a whole number from 1 to 30 (the Kubernetes limit)."
  }
}

variable "name" {
  description = "metadata.name of the MutatingWebhookConfiguration; null keeps registration.json's."
  type        = string
  default     = null

  validation {
    condition     = var.name == null || can(regex("^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", coalesce(var.name, "x")))
    error_message = "name must be a DNS subdomain: lowercase letters, digits, '-' and '.'."
  }
}

variable "image_builder_object_selector" {
  description = "Register the Union image-builder webhook with this objectSelector (the function's webhook.imageBuilderConfig.labelSelector); null leaves it out."
  type        = any
  default     = null
}

variable "images_enabled" {
  description = "Register the images webhook (the function's images.rules)."
  type        = bool
  default     = false
}

variable "images_pod_selector" {
  description = "The images webhook's objectSelector (images.podSelector); null sends every pod."
  type        = any
  default     = null
}

variable "images_namespace_selector" {
  description = "Combined with the kube-system exclusion into the images webhook's namespaceSelector (images.namespaceSelector); null keeps the exclusion alone."
  type        = any
  default     = null
}

variable "secrets_namespace_selector" {
  description = "Combined with the kube-system exclusion into the secrets webhook's namespaceSelector (a staged rollout: one namespace first, docs/migration.md); null keeps the exclusion alone."
  type        = any
  default     = null
}
