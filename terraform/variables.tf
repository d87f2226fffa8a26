# ---------------------------------------------------------------------------------------------
# Function
# ---------------------------------------------------------------------------------------------

variable "name" {
  description = "Name of the function (unique per account and region) and prefix of the AWS resources this module creates. Resources with account-wide names (the IAM role) or that may be replaced (security group, target group) get a generated suffix."
  type        = string
  default     = "podmutator"

  validation {
    # Load balancer names allow 32 characters.
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,27}[a-z0-9]$", var.name))
    error_message = "name must be 2-29 lowercase letters, digits or '-', starting and ending with a letter or digit."
  }
}

variable "lambda_zip_path" {
  description = "Local path of the zip built by `cargo lambda build --release --arm64 --output-format zip`. Read only when the function's code is created or updated (never at plan time); null when the artefact is in S3."
  type        = string
  default     = null
}

variable "lambda_s3_bucket" {
  description = "S3 bucket of the zip (instead of lambda_zip_path)."
  type        = string
  default     = null

  validation {
    condition     = (var.lambda_s3_bucket == null) != (var.lambda_zip_path == null)
    error_message = "Set exactly one of lambda_zip_path and lambda_s3_bucket (with lambda_s3_key)."
  }
}

variable "lambda_s3_key" {
  description = "S3 key of the zip (with lambda_s3_bucket)."
  type        = string
  default     = null

  validation {
    condition     = (var.lambda_s3_bucket == null) == (var.lambda_s3_key == null)
    error_message = "lambda_s3_key goes with lambda_s3_bucket."
  }
}

variable "lambda_s3_object_version" {
  description = "S3 object version of the zip (versioned buckets)."
  type        = string
  default     = null
}

variable "lambda_zip_base64sha256" {
  description = "Base64 SHA-256 of the zip (`openssl dgst -sha256 -binary bootstrap.zip | base64`, or scripts/lambda-artefact.sh). The code is redeployed when, and only when, this changes: a rebuilt zip is not deployed by accident (e.g. by an incident apply), and plan and destroy never need the file."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9+/]{43}=$", var.lambda_zip_base64sha256))
    error_message = "lambda_zip_base64sha256 must be a base64-encoded SHA-256 (44 characters ending in '=')."
  }
}

variable "architecture" {
  description = "Instruction set of the build: arm64 (`cargo lambda build --arm64`) or x86_64."
  type        = string
  default     = "arm64"

  validation {
    condition     = contains(["arm64", "x86_64"], var.architecture)
    error_message = "architecture must be arm64 or x86_64."
  }
}

variable "memory_size" {
  description = "Lambda memory in MB; CPU share grows with it, which shortens cold starts."
  type        = number
  default     = 256

  validation {
    condition     = var.memory_size >= 128 && var.memory_size <= 10240
    error_message = "memory_size must be between 128 and 10240 MB."
  }
}


variable "lambda_timeout_seconds" {
  description = "Lambda timeout. Must exceed the Embedded deadline and stay below the webhook's timeoutSeconds, so that the API server receives the function's own answer rather than a gateway timeout."
  type        = number
  default     = 5

  validation {
    condition     = var.lambda_timeout_seconds >= 1 && var.lambda_timeout_seconds <= 29 && floor(var.lambda_timeout_seconds) == var.lambda_timeout_seconds
    error_message = "lambda_timeout_seconds must be a whole number from 1 to 29 (the webhook timeout is at most 30)."
  }
  validation {
    condition     = var.embedded_deadline_ms < var.lambda_timeout_seconds * 1000
    error_message = "lambda_timeout_seconds must be longer than embedded_deadline_ms."
  }
}


variable "reserved_concurrent_executions" {
  description = "Concurrency reserved for the function out of the account's regional limit: other functions cannot take it, and it caps the function. -1 (default) reserves nothing: the function scales in the account's unreserved pool and claims none of the limit, so no other install or application fails to deploy for it. Reserve to guarantee admissions against the account's other functions: about the peak pods per second times 0.5 s (a cold admission), at most about 300 (docs/scale.md's envelope: beyond it Secrets Manager's quota, not Lambda, is the limit), and only what the account's limit leaves after every other reservation and provisioned concurrency and the 100 Lambda keeps unreserved (alarm on ClaimedAccountConcurrency, docs/scale.md). 0 is refused."
  type        = number
  default     = -1

  validation {
    condition     = var.reserved_concurrent_executions == -1 || (var.reserved_concurrent_executions >= 1 && floor(var.reserved_concurrent_executions) == var.reserved_concurrent_executions)
    error_message = "reserved_concurrent_executions must be -1 (none, the default) or a whole number of at least 1 (0 would stop every admission)."
  }
}

variable "provisioned_concurrency" {
  description = "Provisioned concurrency on the `live` alias (0: none). Removes cold starts from admissions at a fixed hourly cost."
  type        = number
  default     = 0

  validation {
    condition     = var.provisioned_concurrency >= 0
    error_message = "provisioned_concurrency must be 0 or more."
  }
}

variable "pre_traffic_check" {
  description = "Invoke each newly published version with a canned AdmissionReview before the `live` alias moves to it (pre-traffic.tf); a wrong answer stops the apply with the previous version live. The deployer needs lambda:InvokeFunction on the function. false skips the check."
  type        = bool
  default     = true
}

variable "iam_role_path" {
  description = "Path of the function's IAM role."
  type        = string
  default     = "/"

  validation {
    condition     = can(regex("^/([\\x21-\\x7E]+/)?$", var.iam_role_path))
    error_message = "iam_role_path must start and end with '/'."
  }
}

variable "permissions_boundary_arn" {
  description = "Permissions boundary of the function's IAM role, where the account requires one."
  type        = string
  default     = null
}

variable "environment_kms_key_arn" {
  description = "Customer managed KMS key for the function's environment variables (null: the Lambda service key). They hold configuration and the path token's hash, never a secret."
  type        = string
  default     = null
}

variable "path_token_kms_key_arn" {
  description = "Customer managed KMS key of the path token's secret (null: aws/secretsmanager)."
  type        = string
  default     = null
}

variable "log_retention_days" {
  description = "Retention of the function's log group (one line per admission, never a secret value)."
  type        = number
  default     = 365

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days must be a value CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, ..., 365, ...)."
  }
}


variable "log_kms_key_arn" {
  description = "KMS key for the log groups; null uses CloudWatch Logs' own encryption. The key policy must allow logs.<region>.amazonaws.com."
  type        = string
  default     = null
}


variable "retain_log_groups" {
  description = "Keep the log groups on destroy (they are the audit trail of every admission). Their names end in a suffix generated per install, so a reinstall under the same name creates new groups beside the kept ones."
  type        = bool
  default     = true
}

variable "tags" {
  description = "Tags for every AWS resource."
  type        = map(string)
  default     = {}
}


# ---------------------------------------------------------------------------------------------
# Function configuration (PODMUTATOR_CONFIG)
# ---------------------------------------------------------------------------------------------

variable "webhook_config" {
  description = "Flyte's `webhook` section. embeddedSecretManagerConfig.type defaults to AWS and awsConfig.region is always set to secrets_region, the only region the role can read."
  type        = any
  default = {
    secretManagerTypes = ["Embedded"]
    secretEnvVarPrefix = "_UNION_"
  }
}


variable "embedded_deadline_ms" {
  description = "How long the function waits for Secrets Manager before it fails the admission."
  type        = number
  default     = 2000

  validation {
    condition = (
      floor(var.embedded_deadline_ms) == var.embedded_deadline_ms
      && var.embedded_deadline_ms >= local.config_bounds["embedded.deadlineMs"].minimum
      && var.embedded_deadline_ms <= local.config_bounds["embedded.deadlineMs"].maximum
    )
    error_message = "embedded_deadline_ms must be a whole number from ${local.config_bounds["embedded.deadlineMs"].minimum} to ${local.config_bounds["embedded.deadlineMs"].maximum} (the function's embedded.deadlineMs)."
  }
}


variable "embedded_cache_ttl_seconds" {
  description = "How long a warm function reuses a fetched secret value; 0 turns the cache off."
  type        = number
  default     = 300

  validation {
    condition = (
      floor(var.embedded_cache_ttl_seconds) == var.embedded_cache_ttl_seconds
      && var.embedded_cache_ttl_seconds >= local.config_bounds["embedded.cacheTtlSeconds"].minimum
      && var.embedded_cache_ttl_seconds <= local.config_bounds["embedded.cacheTtlSeconds"].maximum
    )
    error_message = "embedded_cache_ttl_seconds must be a whole number from ${local.config_bounds["embedded.cacheTtlSeconds"].minimum} to ${local.config_bounds["embedded.cacheTtlSeconds"].maximum} (the function's embedded.cacheTtlSeconds)."
  }
}


variable "embedded_delivery" {
  description = "How Embedded secrets reach the pod: \"value\" (Flyte's: the function reads each value and writes it into the pod spec) or \"reference\" (the function resolves names with DescribeSecret only; an init container fetches the values with the pod's own identity, see modules/pod-identity). The function's policy follows: no GetSecretValue or BatchGetSecretValue in reference delivery unless embedded_env_var_delivery is \"value\"."
  type        = string
  default     = "value"

  validation {
    condition     = contains(["value", "reference"], var.embedded_delivery)
    error_message = "embedded_delivery must be \"value\" or \"reference\"."
  }
}


variable "embedded_env_var_delivery" {
  description = "In reference delivery, how ENV_VAR requests get their variable: \"exec\" (podmutator exec sets it from the fetched file) or \"value\" (Flyte's: the value in the pod spec, so the function reads values again)."
  type        = string
  default     = "exec"

  validation {
    condition     = contains(["exec", "value"], var.embedded_env_var_delivery)
    error_message = "embedded_env_var_delivery must be \"exec\" or \"value\"."
  }
}


variable "fetcher_image" {
  description = "The podmutator image the reference init container runs (podmutator fetch), pinned by digest; required when embedded_delivery is \"reference\"."
  type        = string
  default     = null

  validation {
    condition     = var.embedded_delivery != "reference" || try(length(var.fetcher_image) > 0, false)
    error_message = "fetcher_image is required when embedded_delivery is \"reference\"."
  }
  validation {
    # As the function checks embedded.fetcherImage in reference delivery.
    condition = var.embedded_delivery != "reference" || var.fetcher_image == null || try(
      can(regex(local.image_regex, var.fetcher_image))
      && length(replace(split("@", var.fetcher_image)[0], "/:[^/:]*$/", "")) <= 255,
      false
    )
    error_message = "fetcher_image must be an image reference the kubelet can pull, e.g. 123456789012.dkr.ecr.eu-west-1.amazonaws.com/podmutator@sha256:<64 lower-case hex digits> (the digest docs/deploy.md's publish block prints), without spaces or placeholders; a digest is sha256, sha384 or sha512 in lower-case hex."
  }
}


variable "entrypoint_registries" {
  description = "Registry hosts (host[:port], as in an image reference) the function may ask for the ENTRYPOINT of a container without command, so reference delivery can wrap it for ENV_VAR secrets (embedded.entrypointLookup.registries). Empty leaves the lookup off. An ECR host also needs ecr:GetAuthorizationToken, ecr:BatchGetImage and ecr:GetDownloadUrlForLayer on the function's role (entrypoint_ecr_repository_arns)."
  type        = list(string)
  default     = []

  validation {
    # As the function reads an image's registry: host name labels that start and end with a
    # letter or digit (or a bracketed IPv6 address), with a '.' or a port unless it is localhost.
    condition = alltrue([for r in var.entrypoint_registries :
      can(regex("^${local.registry_regex}$", r)) && (can(regex("[.:A-Z]", r)) || r == "localhost") && length(r) <= 249
    ])
    error_message = "entrypoint_registries entries are registry hosts written as in an image reference, host[:port] (e.g. public.ecr.aws, docker.io, localhost:5000, 123456789012.dkr.ecr.us-east-1.amazonaws.com): dot-separated labels of letters, digits and '-' that start and end with a letter or digit, without a scheme or path."
  }
}


variable "entrypoint_ecr_repository_arns" {
  description = "ECR repositories of task images whose ENTRYPOINT the function reads (an ECR host in entrypoint_registries): the role gets ecr:GetAuthorizationToken (on *, it has no resource type) and ecr:BatchGetImage and ecr:GetDownloadUrlForLayer on these repositories only. Empty adds no ECR permission."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.entrypoint_ecr_repository_arns : can(regex("^arn:[a-z-]+:ecr:[a-z0-9-]+:[0-9]{12}:repository/.+$", a))])
    error_message = "entrypoint_ecr_repository_arns entries are ECR repository ARNs (arn:<partition>:ecr:<region>:<account>:repository/<name>)."
  }
}


variable "namespace_template" {
  description = "Namespace a pod must be in to read the secrets of its project and domain (Flyte's default layout). Placeholders {{ organization }}, {{ project }} and {{ domain }}; it must use {{ domain }} and, filled in, give a namespace name. \"\" turns the binding off."
  type        = string
  default     = "{{ project }}-{{ domain }}"

  # As the function checks embedded.namespaceTemplate: with each placeholder filled in with a
  # one-letter value, the template gives a namespace name (an unknown or unclosed placeholder
  # leaves braces, which no name has), and it uses {{ domain }}.
  validation {
    condition = var.namespace_template == "" || (
      length(replace(var.namespace_template, "/${local.template_placeholder_regex}/", "a")) <= 63
      && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", replace(var.namespace_template, "/${local.template_placeholder_regex}/", "a")))
    )
    error_message = "namespace_template must give a namespace name once filled in: lower-case letters, digits and '-' (at most 63, starting and ending with a letter or digit) around the placeholders {{ organization }}, {{ project }} and {{ domain }} (no other), e.g. \"{{ project }}-{{ domain }}\"; or \"\" to turn the binding off."
  }
  validation {
    condition     = var.namespace_template == "" || can(regex(replace(local.template_placeholder_regex, "(organization|project|domain)", "domain"), var.namespace_template))
    error_message = "namespace_template must use {{ domain }}: without it every domain of a project shares one namespace and reads the others' secrets; write e.g. \"{{ project }}-{{ domain }}\" (or \"\" to turn the binding off)."
  }
}


variable "embedded_domains" {
  description = "Flyte's domains (flyteadmin's domains), the only ones a namespace may end in under namespace_template. Empty keeps the function's default: development, staging, production."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for d in var.embedded_domains : length(d) <= 63 && can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", d))]) && length(distinct(var.embedded_domains)) == length(var.embedded_domains)
    error_message = "embedded_domains must be distinct DNS labels (at most 63 lowercase letters, digits and '-'): each ends a namespace."
  }
}

variable "allowed_usernames" {
  description = "Users (request.userInfo.username) allowed to create pods that ask for Embedded secrets, e.g. system:serviceaccount:flyte:flytepropeller. Empty leaves this check off."
  type        = list(string)
  default     = []
}


variable "max_body_bytes" {
  description = "Largest AdmissionReview the function accepts, at most Lambda's 6 MiB payload. An ALB passes at most 1 MB to Lambda whatever this says."
  type        = number
  default     = 6291456

  validation {
    # The function's http.maxBodyBytes allows more (for serve); Lambda takes at most 6 MiB.
    condition = (
      floor(var.max_body_bytes) == var.max_body_bytes
      && var.max_body_bytes >= local.config_bounds["http.maxBodyBytes"].minimum
      && var.max_body_bytes <= min(6291456, local.config_bounds["http.maxBodyBytes"].maximum)
    )
    error_message = "max_body_bytes must be a whole number from ${local.config_bounds["http.maxBodyBytes"].minimum} to 6291456 (Lambda's payload limit; the function's http.maxBodyBytes)."
  }
}


variable "secret_org" {
  description = "Organisation in the secret names (u__org__<org>__...): the role can read only secrets with this prefix, and it is embedded.organization, the only organization label a pod may carry to receive Embedded secrets."
  type        = string
  default     = "flyte"

  validation {
    # No IAM wildcard characters, and no '__', which would let one org's prefix reach another's;
    # a Kubernetes label value, since it is also embedded.organization, the only organization
    # label a pod may carry.
    condition     = length(var.secret_org) <= 63 && can(regex("^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(_[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)*$", var.secret_org))
    error_message = "secret_org must be a Kubernetes label value (at most 63 letters, digits, '.', '-' and single '_', starting and ending with a letter or digit): it is also the organization label every pod must carry (embedded.organization)."
  }
}


variable "secrets_region" {
  description = "Region of the Embedded secrets; null means the deployment's region. Only the Embedded fetches use it: the function needs nothing else from Secrets Manager."
  type        = string
  default     = null
}

variable "secrets_kms_key_arn" {
  description = "Customer managed KMS key that encrypts the secrets; null when they use aws/secretsmanager."
  type        = string
  default     = null
}


variable "mesh_enabled" {
  description = "Turn on the mesh mutators and register their two webhooks."
  type        = bool
  default     = false
}


variable "mesh_config" {
  description = "Further keys of the function's `mesh` section; `enabled` and `managedLabel` come from mesh_enabled and mesh_label_key."
  type        = any
  default     = {}
}


variable "mesh_label_key" {
  description = "Label that marks mesh-managed pods and namespaces, in the registration's selectors and the function's mesh.managedLabel alike."
  type        = string
  default     = "aether.io/managed"
}


variable "limits" {
  description = "The function's `limits` section: most flyte.secrets annotations one pod may carry (max_secret_requests_per_pod, default 64), most Secrets Manager ids one admission may fetch (max_secret_ids_per_admission, default 200: each id costs a call against the account's quota, shared by every instance), most JSON objects one review may hold (max_objects_per_review, default 100000). A field left null keeps the function's default."
  type = object({
    max_secret_requests_per_pod  = optional(number)
    max_secret_ids_per_admission = optional(number)
    max_objects_per_review       = optional(number)
  })
  default  = {}
  nullable = false

  validation {
    # Conditionals, not ||: Terraform 1.11 evaluates both sides of || (floor(null) fails). The
    # message repeats the test to name only the fields that fail it: a local holding them would
    # make a cycle with this validation, which must also refer to var.limits itself.
    condition = alltrue([for field, key in local.limits_keys : var.limits[field] == null ? true : (
      floor(var.limits[field]) == var.limits[field]
      && var.limits[field] >= local.config_bounds[key].minimum
      && var.limits[field] <= try(local.config_bounds[key].maximum, var.limits[field])
    )])
    error_message = "limits: ${join("; ", [for field, key in local.limits_keys : "${field} = ${var.limits[field]}, but the function's ${key} is a whole number of at least ${local.config_bounds[key].minimum}${can(local.config_bounds[key].maximum) ? " and at most ${try(local.config_bounds[key].maximum, "")}" : ""}" if(var.limits[field] == null ? false : !(
      floor(var.limits[field]) == var.limits[field]
      && var.limits[field] >= local.config_bounds[key].minimum
      && var.limits[field] <= try(local.config_bounds[key].maximum, var.limits[field])
    ))])}."
  }
}


variable "mutators" {
  description = "The function's `mutators` section: for each mutator id (namespace-injection, secrets, dns, init-gate, socket-check, image-builder, image-rules), whether its failure denies the pod (required = true) or admits it unchanged with a warning. Empty keeps the function's defaults (secrets, socket-check and image-builder required)."
  type = map(object({
    required = bool
  }))
  default  = {}
  nullable = false

  validation {
    condition     = alltrue([for id in keys(var.mutators) : contains(local.mutator_ids, id)])
    error_message = "mutators: ${join(", ", [for id in keys(var.mutators) : jsonencode(id) if !contains(local.mutator_ids, id)])} is not a mutator id; the ids are ${join(", ", local.mutator_ids)}."
  }
}


variable "metrics_namespace" {
  description = "CloudWatch namespace of the function's EMF metrics (its metrics.namespace), which the alarms and the dashboard read."
  type        = string
  default     = "podmutator"

  validation {
    # The function counts bytes (UTF-8), as CloudWatch does.
    condition = alltrue([
      !startswith(var.metrics_namespace, ":"),
      length(regexall("(?s).", var.metrics_namespace)) >= 1,
      (length(regexall("(?s).", var.metrics_namespace)) + length(regexall("[\\x{80}-\\x{10FFFF}]", var.metrics_namespace)) + length(regexall("[\\x{800}-\\x{10FFFF}]", var.metrics_namespace)) + length(regexall("[\\x{10000}-\\x{10FFFF}]", var.metrics_namespace))) <= 255,
    ])
    error_message = "metrics_namespace must be 1 to 255 bytes and must not start with ':' (the function's metrics.namespace), e.g. \"podmutator\"."
  }
}

# ---------------------------------------------------------------------------------------------
# Endpoint
# ---------------------------------------------------------------------------------------------

variable "endpoint" {
  description = "alb: internal ALB in the cluster VPC, reachable only from one security group of the EKS control plane (default). http_api: API Gateway HTTP API on a custom domain with a secret path token."
  type        = string
  default     = "alb"

  validation {
    condition     = contains(["alb", "http_api"], var.endpoint)
    error_message = "endpoint must be alb or http_api."
  }
  validation {
    # A value-delivery function answers a review with the secret values. The API server quotes
    # the webhook URL, path token included, in errors it returns to pod creators, so on an
    # internet-facing endpoint anyone who read one such error could read every secret of the
    # organisation. Webhook Flyte's default (no secretManagerTypes) is K8s. The function reads a
    # manager's name in any case (`embedded`), so the check does too.
    condition = !(var.endpoint == "http_api"
      && contains([for t in try(tolist(var.webhook_config.secretManagerTypes), [try(var.webhook_config.secretManagerType, "K8s")]) : lower(tostring(t))], "embedded")
    && (var.embedded_delivery == "value" || var.embedded_env_var_delivery == "value"))
    error_message = "endpoint \"http_api\" is on the internet and the path token is not secret from cluster users (the API server quotes the webhook URL in pod-creation errors), so it cannot serve Embedded value delivery: use endpoint = \"alb\" (internal), or embedded_delivery = \"reference\" with embedded_env_var_delivery = \"exec\" (and fetcher_image)."
  }
}


variable "path_token_enabled" {
  description = "Put a secret path token in front of every route, on either endpoint (default). The function holds only its SHA-256 and answers 404 without it, before reading the body. Turn it off only on purpose: anyone who reaches the endpoint could then ask for secrets."
  type        = bool
  default     = true
}

variable "path_token_version" {
  description = "Version of the path token: raising it draws a new token, stores it, and updates the function's hash and the registration's URL (rotation). It only goes up: the applied version is recorded on the token's secret (tag podmutator:path-token-version) and a plan with a lower one is refused before anything changes, so keep it in terraform.tfvars rather than passing -var."
  type        = number
  default     = 1

  validation {
    condition     = var.path_token_version >= 1 && floor(var.path_token_version) == var.path_token_version
    error_message = "path_token_version must be a whole number of at least 1."
  }
}

variable "previous_path_token_sha256" {
  description = "During a rotation only: the SHA-256 of the token being replaced (`terraform output -raw path_token_sha256` before raising path_token_version). The function then accepts both tokens (`http.pathTokenSha256` = [current, previous]) while the registration moves to the new one; set it back to null in the next apply (docs/deploy.md, \"Rotating the path token\")."
  type        = string
  default     = null

  validation {
    condition     = var.previous_path_token_sha256 == null || can(regex("^[0-9a-f]{64}$", var.previous_path_token_sha256))
    error_message = "previous_path_token_sha256 must be the previous token's SHA-256 as 64 lowercase hex digits (`terraform output -raw path_token_sha256` before the rotation), or null."
  }
  validation {
    condition     = var.previous_path_token_sha256 == null || var.path_token_enabled
    error_message = "previous_path_token_sha256 keeps a previous path token valid during a rotation; it needs path_token_enabled = true."
  }
}

variable "accept_plain_paths" {
  description = "While an install without a path token turns it on: the function answers the plain paths beside the token's (http.acceptPlainPaths), so a registration that still calls without the token is answered until it moves. Set it back to false in the next apply: while it is true the token keeps no one out (docs/deploy.md, \"Turning the token on\")."
  type        = bool
  default     = false
  nullable    = false

  validation {
    condition     = !var.accept_plain_paths || var.path_token_enabled
    error_message = "accept_plain_paths answers the plain paths beside a path token's; it needs path_token_enabled = true."
  }
}

variable "domain_name" {
  description = "DNS name of the endpoint, e.g. podmutator.internal.example.com. The webhook URL is https://<domain_name>/..."
  type        = string
}


variable "create_certificate" {
  description = "Create a public, DNS-validated ACM certificate for domain_name in route53_zone_id. false: certificate_arn is used."
  type        = bool
  default     = true
}

variable "certificate_transparency_logging_preference" {
  description = "Certificate Transparency logging of the certificate the module creates (create_certificate): ENABLED publishes domain_name in the public CT logs; DISABLED keeps it out (the API server does not require CT, browsers do)."
  type        = string
  default     = "ENABLED"

  validation {
    condition     = contains(["ENABLED", "DISABLED"], var.certificate_transparency_logging_preference)
    error_message = "certificate_transparency_logging_preference must be ENABLED or DISABLED."
  }
}

variable "create_dns_record" {
  description = "Create the alias record for domain_name in route53_zone_id. false: point domain_name at the dns_target_name / dns_target_zone_id outputs yourself."
  type        = bool
  default     = true
}

variable "route53_zone_id" {
  description = "Public Route 53 zone of domain_name, for the certificate's validation record and the endpoint's alias record (create_certificate, create_dns_record). The EKS control plane resolves webhook hosts in public DNS only. May be created in the same apply."
  type        = string
  default     = null

  validation {
    condition     = !(var.create_certificate || var.create_dns_record) || var.route53_zone_id != null
    error_message = "route53_zone_id is required when create_certificate or create_dns_record is true."
  }
}

variable "certificate_arn" {
  description = "Existing ACM certificate for domain_name (create_certificate = false), e.g. from ACM Private CA; then give the registration its CA."
  type        = string
  default     = null

  validation {
    condition     = var.create_certificate || var.certificate_arn != null
    error_message = "certificate_arn is required when create_certificate is false."
  }
}

variable "vpc_id" {
  description = "Cluster VPC (alb)."
  type        = string
  default     = null

  validation {
    condition     = var.endpoint != "alb" || var.vpc_id != null
    error_message = "vpc_id is required when endpoint is alb."
  }
}


variable "subnet_ids" {
  description = "Subnets for the internal ALB (alb): private subnets of the cluster VPC, exactly one per availability zone, at least two zones, each with 8 free addresses. modules/eks-network picks them by the kubernetes.io/role/internal-elb tag."
  type        = list(string)
  default     = []

  validation {
    condition     = var.endpoint != "alb" || length(var.subnet_ids) >= 2
    error_message = "subnet_ids needs at least two subnets (one per availability zone) when endpoint is alb."
  }
}

variable "control_plane_security_group_id" {
  description = "The only source the ALB accepts (alb): a security group that the EKS control plane's network interfaces carry and nothing else does (an additional cluster security group, vpc_config.security_group_ids). Never the cluster security group: managed node groups and Fargate pods carry it too. docs/deploy.md says how to create one; modules/eks-network finds it and refuses the cluster security group."
  type        = string
  default     = null

  validation {
    condition     = var.endpoint != "alb" || var.control_plane_security_group_id != null
    error_message = "control_plane_security_group_id is required when endpoint is alb."
  }
}

variable "alb_ssl_policy" {
  description = "TLS policy of the ALB listener (TLS 1.2 and 1.3 only by default)."
  type        = string
  default     = "ELBSecurityPolicy-TLS13-1-2-2021-06"
}


variable "alb_deletion_protection" {
  description = "Protect the ALB from deletion: with failurePolicy Fail, a missing endpoint stops opted-in pods from being created. Set false before `terraform destroy`."
  type        = bool
  default     = true
}


variable "alb_access_logs_bucket" {
  description = "S3 bucket for ALB access logs; null for none. An ALB access log line holds the request URL, and with the path token on its first segment is the token: every line of the bucket then carries it. Refused while path_token_enabled unless alb_access_logs_record_path_token acknowledges that."
  type        = string
  default     = null

  validation {
    condition     = var.alb_access_logs_bucket == null || !var.path_token_enabled || var.alb_access_logs_record_path_token
    error_message = "ALB access logs record every request's URL, whose first segment is the path token: whoever reads the bucket could call the webhook (and, in value delivery, read every secret of the organisation). Leave alb_access_logs_bucket null (the function logs every admission itself), or set alb_access_logs_record_path_token = true and guard the bucket like the token's secret (docs/deploy.md, \"What each endpoint protects against\")."
  }
}

variable "alb_access_logs_record_path_token" {
  description = "Acknowledge that ALB access logs (alb_access_logs_bucket) will record the path token in every line; without it the module refuses access logs while the token is on."
  type        = bool
  default     = false
}


variable "api_throttling_burst_limit" {
  description = "HTTP API burst limit (http_api). Sized for bursts of pod creations (a Flyte fan-out makes up to three webhook calls per pod); a 429 under failurePolicy Fail rejects a pod."
  type        = number
  default     = 5000
}

variable "api_throttling_rate_limit" {
  description = "HTTP API steady-state requests per second (http_api)."
  type        = number
  default     = 2000
}

variable "timeout_seconds" {
  description = "The webhooks' timeoutSeconds (null: registration.json's, 10). Given here too, so the Lambda and integration timeouts can be checked against it; pass the module's registration output to modules/registration."
  type        = number
  default     = null
}

# ---------------------------------------------------------------------------------------------
# Alarms and dashboard
# ---------------------------------------------------------------------------------------------

variable "alarms_enabled" {
  description = "Create the CloudWatch alarms (function errors, throttles and p99 duration; ALB health and 5xx; HTTP API 4xx, 5xx and latency; Secrets Manager throttles)."
  type        = bool
  default     = true
}

variable "alarm_topic_arns" {
  description = "SNS topics the alarms notify (alarm and OK); empty: the alarms only change state."
  type        = list(string)
  default     = []
}

variable "api_4xx_alarm_threshold" {
  description = "4xx responses per minute of the HTTP API above which the 4xx alarm fires (token guessing, throttling)."
  type        = number
  default     = 10
}

variable "dashboard_enabled" {
  description = "Create a CloudWatch dashboard of the function's EMF metrics (admissions, denials by reason, duration, secrets by manager, cache hits, throttles)."
  type        = bool
  default     = false
}

# ---------------------------------------------------------------------------------------------
# Image rewriting (docs/images.md)
# ---------------------------------------------------------------------------------------------

variable "images_config" {
  description = "The function's `images` section (podSelector, namespaceSelector, excludedContainerNames, extra rules). The ECR pull-through cache rules below come first; `enabled` follows from having any rule."
  type        = any
  default     = {}
}

variable "ecr_pull_through_cache_upstreams" {
  description = "Upstreams whose ECR pull-through cache the images rules rewrite to, in this order: any of docker-hub, quay, github, k8s, ecr-public. The rules themselves come from the pull-through cache root (modules/pull-through-cache, examples/pull-through-cache), applied first: the plan reads each and fails while one is missing. Empty rewrites to none."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for u in var.ecr_pull_through_cache_upstreams : contains(["docker-hub", "quay", "github", "k8s", "ecr-public"], u)])
    error_message = "ecr_pull_through_cache_upstreams may list only docker-hub, quay, github, k8s and ecr-public."
  }
}

variable "ecr_pull_through_cache_prefix" {
  description = "The pull-through cache root's prefix: prepended to each upstream's name to form its ECR repository prefix (e.g. \"cache/\" gives cache/docker-hub)."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^([a-z0-9][a-z0-9._-]*/)?$", var.ecr_pull_through_cache_prefix))
    error_message = "ecr_pull_through_cache_prefix must be empty or lower-case letters, digits, '.', '_' or '-' ending in '/'."
  }
}
