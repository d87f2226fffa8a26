# ---------------------------------------------------------------------------------------------
# Function
# ---------------------------------------------------------------------------------------------

variable "name" {
  description = "Name of the function and prefix of every AWS resource this module creates."
  type        = string
  default     = "podmutator"

  validation {
    # Load balancer and target group names allow 32 characters; "-fn" is appended to one.
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,27}[a-z0-9]$", var.name))
    error_message = "name must be 2-29 lowercase letters, digits or '-', starting and ending with a letter or digit."
  }
}

variable "lambda_zip_path" {
  description = "Path to the zip built by `cargo lambda build --release --arm64 --output-format zip` (target/lambda/podmutator/bootstrap.zip)."
  type        = string
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
  description = "Reserved concurrency; -1 leaves the function on the account's unreserved pool. A cap turns a burst of pod creations into admission failures, so set it only with failurePolicy in mind."
  type        = number
  default     = -1
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
    condition     = var.embedded_deadline_ms >= 100
    error_message = "embedded_deadline_ms must be at least 100."
  }
}

variable "embedded_cache_ttl_seconds" {
  description = "How long a warm function reuses a fetched secret value."
  type        = number
  default     = 300
}

variable "namespace_template" {
  description = "Namespace a pod must be in to read the secrets of its project and domain (Flyte's default layout)."
  type        = string
  default     = "{{ project }}-{{ domain }}"
}

variable "allowed_usernames" {
  description = "Users (request.userInfo.username) allowed to create pods that ask for Embedded secrets, e.g. system:serviceaccount:flyte:flytepropeller. Empty leaves this check off."
  type        = list(string)
  default     = []
}

variable "max_body_bytes" {
  description = "Largest AdmissionReview the function accepts. An ALB passes at most 1 MB to Lambda whatever this says."
  type        = number
  default     = 6291456
}

variable "secret_org" {
  description = "Organisation in the secret names (u__org__<org>__...); the role can read only secrets with this prefix."
  type        = string
  default     = "flyte"

  validation {
    # No IAM wildcard characters, and no '__', which would let one org's prefix reach another's.
    condition     = can(regex("^[A-Za-z0-9+=.@-]+(_[A-Za-z0-9+=.@-]+)*$", var.secret_org))
    error_message = "secret_org must be letters, digits or +=.@-, with single underscores between them."
  }
}

variable "secrets_region" {
  description = "Region of the secrets; null means the deployment's region."
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
}

variable "domain_name" {
  description = "DNS name of the endpoint, e.g. podmutator.internal.example.com. The webhook URL is https://<domain_name>/..."
  type        = string
}

variable "route53_zone_id" {
  description = "Public Route 53 zone for domain_name: the certificate's validation records and the endpoint's alias record go there. The EKS control plane resolves webhook hosts in public DNS only. Null when certificate_arn is given and DNS is managed elsewhere."
  type        = string
  default     = null

  validation {
    condition     = var.route53_zone_id != null || var.certificate_arn != null
    error_message = "Set route53_zone_id (an ACM certificate is then created and validated), or certificate_arn."
  }
}

variable "certificate_arn" {
  description = "Existing ACM certificate for domain_name, e.g. from ACM Private CA (then set ca_bundle_pem). Null creates a public, DNS-validated certificate."
  type        = string
  default     = null
}

variable "ca_bundle_pem" {
  description = "PEM CA the API server must trust for the endpoint (a private CA); null uses the API server's system roots, which trust public ACM certificates."
  type        = string
  default     = null
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
  description = "Private subnets of the cluster VPC for the internal ALB, in at least two availability zones (alb)."
  type        = list(string)
  default     = []

  validation {
    condition     = var.endpoint != "alb" || length(var.subnet_ids) >= 2
    error_message = "subnet_ids needs at least two subnets when endpoint is alb."
  }
}

variable "cluster_security_group_id" {
  description = "Only source the ALB accepts (alb): a security group the EKS control plane's network interfaces carry. The cluster security group (vpc_config[0].cluster_security_group_id) works everywhere, but EKS also puts it on managed node groups, whose pods could then call the endpoint; an additional control-plane security group (vpc_config[0].security_group_ids) carried by nothing else closes that. See the README, Deploy."
  type        = string
  default     = null

  validation {
    condition     = var.endpoint != "alb" || var.cluster_security_group_id != null
    error_message = "cluster_security_group_id is required when endpoint is alb."
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
  description = "S3 bucket for ALB access logs; null for none."
  type        = string
  default     = null
}

variable "api_throttling_burst_limit" {
  description = "HTTP API burst limit (http_api). Bounds what guessing at the path token can cost."
  type        = number
  default     = 100
}

variable "api_throttling_rate_limit" {
  description = "HTTP API steady-state requests per second (http_api)."
  type        = number
  default     = 50
}

# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------

variable "register_webhook" {
  description = "Create the MutatingWebhookConfiguration with the kubernetes provider. Set false to apply it another way (output mutating_webhook_configuration)."
  type        = bool
  default     = true
}

variable "webhook_configuration_name" {
  description = "metadata.name of the MutatingWebhookConfiguration; null keeps registration.json's (podmutator)."
  type        = string
  default     = null
}

variable "timeout_seconds" {
  description = "Overrides the webhooks' timeoutSeconds (registration.json: 10). Must exceed lambda_timeout_seconds."
  type        = number
  default     = null
}

variable "failure_policy" {
  description = "Overrides the webhooks' failurePolicy (registration.json: Fail). Ignore admits pods unmutated when the endpoint fails."
  type        = string
  default     = null
}
