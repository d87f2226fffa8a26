data "aws_partition" "current" {}
data "aws_region" "current" {}
data "aws_caller_identity" "current" {}

locals {
  # The range of each numeric setting the function reads, as the function checks it (generated
  # from its code; tests/iac.rs holds the file to it): the variables that set one are validated
  # against it, so that no value Terraform accepts makes the function refuse to start.
  config_bounds = jsondecode(file("${path.module}/config-bounds.json"))

  # The string settings the function checks at start, as it checks them (crates/core's
  # image_ref.rs, config/embedded.rs): the variables that set one are validated against these,
  # and tests/terraform_apply.rs holds each refusal to `podmutator check-config`'s.
  #
  # A registry: host name labels (any case) or a bracketed IPv6 address, with an optional port.
  registry_regex = "(\\[[0-9A-Fa-f:.]+\\]|[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*)(:[0-9]+)?"
  # An image reference the kubelet pulls: a name (one path component; or a registry, or a first
  # component without '.', then components), an optional tag, and an optional digest the
  # kubelet reads (sha256, sha384 or sha512 in lower-case hex). The name's own 255 characters
  # are checked beside it.
  image_component_regex = "[a-z0-9]+((\\.|_|__|-+)[a-z0-9]+)*"
  image_regex = join("", [
    "^(", local.image_component_regex,
    "|", local.registry_regex, "(/", local.image_component_regex, ")+",
    "|[a-z0-9]+((_|__|-+)[a-z0-9]+)*(/", local.image_component_regex, ")+",
    ")(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@(sha256:[0-9a-f]{64}|sha384:[0-9a-f]{96}|sha512:[0-9a-f]{128}))?$",
  ])
  # A namespace template's placeholder, its name trimmed of white space as the function trims it.
  template_placeholder_regex = "\\{\\{[\\t-\\r\\x{85}\\p{Z}]*(organization|project|domain)[\\t-\\r\\x{85}\\p{Z}]*\\}\\}"

  use_alb = var.endpoint == "alb"
  use_api = var.endpoint == "http_api"

  # The region's name: `id` in 5.x and 6.x alike (6.x deprecates `name` for `region`, which 5.x
  # does not have).
  region = data.aws_region.current.id

  # Only the Embedded secrets are read in secrets_region; nothing else the function needs (it
  # holds the path token's hash, not a reference to the token) depends on it.
  secrets_region = coalesce(var.secrets_region, local.region)

  # Secret ARNs end in a random six-character suffix; the trailing "__" keeps org "flyte" from
  # matching org "flyte2".
  scoped_secrets_arn = "arn:${data.aws_partition.current.partition}:secretsmanager:${local.secrets_region}:${data.aws_caller_identity.current.account_id}:secret:u__org__${var.secret_org}__*"

  # Whether the function reads secret values (GetSecretValue, BatchGetSecretValue) or only
  # resolves names (DescribeSecret): reference delivery reads none unless env vars are
  # delivered by value.
  reads_values  = var.embedded_delivery == "value" || var.embedded_env_var_delivery == "value"
  resolves_refs = var.embedded_delivery == "reference"

  # The function compares the first path segment's SHA-256 with this value; it never sees the
  # token itself, so a cold start makes no call and the role cannot read the token. A hash of
  # a 285-bit random token reveals nothing, which is why it may appear in plans.
  path_token_sha256 = var.path_token_enabled ? nonsensitive(sha256(local.path_token)) : null

  # The http keys for the token: one hash, [current, previous] during a rotation, or the
  # explicit pathTokenDisabled (without which the function refuses to start). merge() of three
  # exclusive parts: a conditional cannot choose between a string and a list. [0] is the
  # function's; [1] has a placeholder of the same length for the hash, which is unknown until the
  # token is stored, so that the environment's size is known at plan time (function.tf).
  path_token_http_variants = [for h in [local.path_token_sha256, local.hash_placeholder] : merge(
    var.path_token_enabled && var.previous_path_token_sha256 == null ? { pathTokenSha256 = h } : {},
    var.path_token_enabled && var.previous_path_token_sha256 != null ? { pathTokenSha256 = [h, var.previous_path_token_sha256] } : {},
    var.path_token_enabled ? {} : { pathTokenDisabled = true },
    var.accept_plain_paths ? { acceptPlainPaths = true } : {},
  )]
  hash_placeholder = join("", [for i in range(64) : "0"])

  # The sections every install sets, then the ones set only when asked for: an empty section
  # would still take bytes of Lambda's 4 KB environment.
  function_config = merge(
    local.function_sections,
    length(local.limits_config) > 0 ? { limits = local.limits_config } : {},
    length(var.mutators) > 0 ? { mutators = var.mutators } : {},
  )
  limits_config = { for field, key in local.limits_keys : trimprefix(key, "limits.") => var.limits[field] if var.limits[field] != null }
  # var.limits' fields and the function's keys, whose bounds (config-bounds.json) they take.
  limits_keys = {
    max_secret_requests_per_pod  = "limits.maxSecretRequestsPerPod"
    max_secret_ids_per_admission = "limits.maxSecretIdsPerAdmission"
    max_objects_per_review       = "limits.maxObjectsPerReview"
  }
  # The function's mutator ids (crates/core's MutatorId; tests/terraform_apply.rs holds this list
  # to it): var.mutators may name only these, as the function refuses any other at start.
  mutator_ids = ["namespace-injection", "secrets", "dns", "init-gate", "socket-check", "image-builder", "image-rules"]

  function_sections = {
    webhook = merge(var.webhook_config, {
      embeddedSecretManagerConfig = merge(
        { type = "AWS" },
        try(var.webhook_config.embeddedSecretManagerConfig, {}),
        { awsConfig = { region = local.secrets_region } },
      )
    })
    # One hash, or during a rotation [current, previous] (docs/deploy.md, "Rotating the path
    # token"). Without a token the function must be told so on purpose, or it refuses to start.
    http = merge(
      { maxBodyBytes = var.max_body_bytes },
      local.path_token_http_variants[0],
    )
    embedded = merge(
      {
        deadlineMs      = var.embedded_deadline_ms
        cacheTtlSeconds = var.embedded_cache_ttl_seconds
        # The organisation the role may read is the only one a pod's label may name.
        organization      = var.secret_org
        namespaceTemplate = var.namespace_template
        delivery          = var.embedded_delivery
        envVarDelivery    = var.embedded_env_var_delivery
      },
      { for k, v in { fetcherImage = var.fetcher_image } : k => v if v != null },
      { for k, v in { allowedUsernames = var.allowed_usernames } : k => v if length(v) > 0 },
      { for k, v in { domains = var.embedded_domains } : k => v if length(v) > 0 },
      length(var.entrypoint_registries) > 0 ? { entrypointLookup = { registries = var.entrypoint_registries } } : {},
    )
    # The label the mutators set and read must be the one the registration selects on.
    mesh    = merge(var.mesh_config, { enabled = var.mesh_enabled, managedLabel = var.mesh_label_key })
    metrics = { namespace = var.metrics_namespace }
    images  = merge(var.images_config, { enabled = local.images_enabled, rules = local.image_rules })
  }

  # The image-builder entry's objectSelector is the function's labelSelector.
  image_builder_selector = try(var.webhook_config.imageBuilderConfig.enabled, false) ? try(var.webhook_config.imageBuilderConfig.labelSelector, {}) : null
}

# The renderer without a token: the AWS side needs only the routes and the registered timeout.
# modules/registration renders the same file again, with the token, for the cluster.
module "webhook_config" {
  source = "./modules/webhook-config"

  registration_json = file("${path.module}/registration.json")
  url               = "https://${var.domain_name}"
  mesh_enabled      = var.mesh_enabled
  mesh_label_key    = var.mesh_label_key
  timeout_seconds   = var.timeout_seconds

  image_builder_object_selector = local.image_builder_selector
  images_enabled                = local.images_enabled
  images_pod_selector           = try(var.images_config.podSelector, null)
  images_namespace_selector     = try(var.images_config.namespaceSelector, null)
}
