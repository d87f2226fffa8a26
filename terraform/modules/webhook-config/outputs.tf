output "manifest" {
  description = "The MutatingWebhookConfiguration object, ready for kubernetes_manifest or yamlencode."
  # The URL may hold the path token.
  sensitive = true
  value = {
    apiVersion = "admissionregistration.k8s.io/v1"
    kind       = "MutatingWebhookConfiguration"
    metadata   = { name = coalesce(var.name, local.registration.name) }
    webhooks   = local.webhooks
  }
}

output "paths" {
  description = "Paths the registered webhooks call, without the path token: the routes the endpoint must serve."
  value       = local.paths
}

output "min_timeout_seconds" {
  description = "The smallest timeoutSeconds of the entries that fail closed in registration.json (the secrets entry among them); the function timeout must stay below it. The images entry fails open and may time out first."
  value       = min(local.fail_closed_timeouts...)
}
