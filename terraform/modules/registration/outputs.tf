output "manifest" {
  description = "The MutatingWebhookConfiguration as applied (sensitive: its URLs hold the path token): the input of scripts/registration-drift.sh; yamlencode it for GitOps."
  value = merge(local.applied, {
    metadata = merge(local.applied.metadata, {
      annotations = merge(local.applied.metadata.annotations, { (local.instance_annotation) = terraform_data.registration.id })
    })
  })
  sensitive = true
}

output "revision" {
  description = "Hash of the applied object (annotation podmutator.io/terraform-revision)."
  value       = local.revision
}

output "name" {
  description = "metadata.name of the registration."
  value       = local.manifest.metadata.name
}
