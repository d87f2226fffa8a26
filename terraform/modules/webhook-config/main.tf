# Renders the MutatingWebhookConfiguration from registration.json. It has no providers, so the
# tests can evaluate it offline with `terraform apply` and compare the result with what
# `podmutator webhook-config` prints for the same inputs.

terraform {
  required_version = ">= 1.9"
}

locals {
  # The label key is substituted in the text, before decoding, so that it can appear in keys
  # (matchLabels) as well as in values; the variable's validation keeps it JSON-safe.
  registration = jsondecode(replace(var.registration_json, "@MESH_LABEL_KEY@", var.mesh_label_key))

  url_prefix = var.path_token == null ? trimsuffix(var.url, "/") : "${trimsuffix(var.url, "/")}/${var.path_token}"

  # Absent rather than empty when there is no bundle: the API server then uses its system roots.
  client_config_extra = { for k, v in { caBundle = var.ca_bundle_pem } : k => base64encode(v) if v != null }

  # Entries of optional features: registered only when switched on (see registration.json).
  wanted = [
    for w in local.registration.webhooks : w
    if(!w.mesh || var.mesh_enabled)
    && (try(w.feature, "") != "imageBuilder" || var.image_builder_object_selector != null)
    && (try(w.feature, "") != "images" || var.images_enabled)
  ]

  # Selectors are passed through jsonencode/jsondecode: the two arms of a conditional must
  # have one type, and a user's selector and the file's rarely do.
  object_selector = [
    for w in local.wanted : jsondecode(
      try(w.feature, "") == "imageBuilder" ? jsonencode(var.image_builder_object_selector) :
      try(w.feature, "") == "images" && var.images_pod_selector != null ? jsonencode(var.images_pod_selector) :
      jsonencode(w.objectSelector)
    )
  ]
  # A given selector is combined with the entry's own matchExpressions (the kube-system
  # exclusion): it narrows the entry, never widens it.
  given_namespace_selector = {
    secrets = var.secrets_namespace_selector
    images  = var.images_namespace_selector
  }
  namespace_selector = [
    for w in local.wanted : jsondecode(
      lookup(local.given_namespace_selector, try(w.feature, ""), null) != null ? jsonencode(merge(local.given_namespace_selector[w.feature], {
        matchExpressions = concat(try(local.given_namespace_selector[w.feature].matchExpressions, []), w.namespaceSelector.matchExpressions)
      })) : jsonencode(w.namespaceSelector)
    )
  ]

  # failure_policy = "Ignore" fails every entry open; "Fail" is each entry's own, so an entry
  # that fails open in the file (images: at worst a pod pulls its source image) stays open.
  # An override replaces each entry's timeout, but an entry that fails open (Ignore in the
  # file) keeps its own when shorter: waiting longer on it only delays pods.
  timeouts = [
    for w in local.wanted : w.failurePolicy == "Ignore" ? min(coalesce(var.timeout_seconds, w.timeoutSeconds), w.timeoutSeconds) : coalesce(var.timeout_seconds, w.timeoutSeconds)
  ]

  webhooks = [
    for i, w in local.wanted : {
      name                    = w.name
      admissionReviewVersions = w.admissionReviewVersions
      clientConfig            = merge({ url = "${local.url_prefix}${w.path}" }, local.client_config_extra)
      failurePolicy           = w.failurePolicy == "Ignore" ? "Ignore" : coalesce(var.failure_policy, w.failurePolicy)
      matchConditions         = w.matchConditions
      namespaceSelector       = local.namespace_selector[i]
      objectSelector          = local.object_selector[i]
      reinvocationPolicy      = w.reinvocationPolicy
      rules                   = w.rules
      sideEffects             = w.sideEffects
      timeoutSeconds          = local.timeouts[i]
    }
  ]

  paths = [for w in local.wanted : w.path]

  # The entries that fail closed in the file: the function's own answer must reach the API
  # server before their timeout (the secrets entry is always one of them).
  fail_closed_timeouts = [for i, w in local.wanted : local.timeouts[i] if w.failurePolicy == "Fail"]
}
