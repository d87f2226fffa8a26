output "manifest" {
  description = "The MutatingWebhookConfiguration as applied (sensitive: its URLs hold the path token); yamlencode it for GitOps."
  value       = local.applied
  sensitive   = true
}

output "revision" {
  description = "Hash of the applied object (annotation podmutator.io/terraform-revision)."
  value       = local.revision
}

output "name" {
  description = "metadata.name of the registration."
  value       = local.manifest.metadata.name
}
