# Registers podmutator with the cluster: renders registration.json (../webhook-config, the same
# renderer `podmutator webhook-config` agrees with) and applies it with kubectl.
#
# Why kubectl and not the kubernetes provider's kubernetes_manifest: that resource copies the
# manifest into its computed `object` attribute without the sensitive mark
# (hashicorp/terraform-provider-kubernetes#1728), so every plan would print the path token in
# the webhook URLs. Here the manifest travels only in a sensitive environment variable of a
# local-exec provisioner, whose output Terraform then suppresses; the plan shows a hash.
#
# Server-side apply with --force-conflicts: the registration's fields belong to this module's
# field manager, and an apply takes them back from whoever changed them (kubectl edit during an
# incident, for instance). docs/deploy.md, "Fail open", says how to change failurePolicy without
# fighting the next apply.

terraform {
  required_version = ">= 1.11"
}

module "webhook_config" {
  source = "../webhook-config"

  registration_json = file("${path.module}/../../registration.json")
  url               = var.registration.url
  path_token        = var.registration.path_token
  ca_bundle_pem     = var.ca_bundle_pem
  mesh_enabled      = var.registration.mesh_enabled
  mesh_label_key    = var.registration.mesh_label_key
  timeout_seconds   = var.registration.timeout_seconds
  failure_policy    = var.failure_policy

  image_builder_object_selector = var.registration.image_builder_object_selector
  images_enabled                = var.registration.images_enabled
  images_pod_selector           = var.registration.images_pod_selector
  images_namespace_selector     = var.registration.images_namespace_selector
  secrets_namespace_selector    = var.secrets_namespace_selector
  name                          = var.name
}

locals {
  manifest = module.webhook_config.manifest

  # Changes whenever anything in the object changes (the token included); a hash of a 285-bit
  # token reveals nothing, so it may be shown in plans.
  revision = substr(nonsensitive(sha256(jsonencode(local.manifest))), 0, 32)

  applied = merge(local.manifest, {
    metadata = merge(local.manifest.metadata, {
      annotations = { "podmutator.io/terraform-revision" = local.revision }
    })
  })

  # Each instance of the resource below also marks the object with its own ID, so that the
  # delete of an instance being replaced never removes its successor's object: a changed
  # object has a new revision, but `terraform apply -replace` (how a deleted registration is
  # restored, docs/deploy.md) applies the same revision again.
  instance_annotation = "podmutator.io/terraform-instance"

  kube = {
    name              = local.manifest.metadata.name
    revision          = local.revision
    kubectl           = var.kubectl
    kubeconfig        = var.kubeconfig_path == null ? "" : var.kubeconfig_path
    context           = var.kube_context == null ? "" : var.kube_context
    eks_cluster       = var.eks_cluster_name == null ? "" : var.eks_cluster_name
    eks_region        = var.eks_region == null ? "" : var.eks_region
    field_manager     = var.field_manager
    delete_on_destroy = var.delete_on_destroy
  }

  # Shared by apply and delete: pick the cluster credentials, then run kubectl.
  kubectl_prelude = <<-EOT
    set -eu
    if [ -n "$EKS_CLUSTER" ]; then
      KUBECONFIG=$(mktemp)
      trap 'rm -f "$KUBECONFIG"' EXIT
      export KUBECONFIG
      aws eks update-kubeconfig --name "$EKS_CLUSTER" $${EKS_REGION:+--region "$EKS_REGION"} --kubeconfig "$KUBECONFIG" >/dev/null
    elif [ -n "$KUBECONFIG_PATH" ]; then
      export KUBECONFIG="$KUBECONFIG_PATH"
    fi
    k() { "$KUBECTL" $${KUBE_CONTEXT:+--context "$KUBE_CONTEXT"} "$@"; }
  EOT
}

# Created last (the examples make it depend on the whole AWS module) and, on destroy, deleted
# first: with failurePolicy Fail, a registration pointing at a missing endpoint blocks every
# opted-in pod. A changed object is applied by a new instance before the old one is removed
# (create_before_destroy); the old one's delete sees another instance's mark and leaves it alone.
#
# Terraform cannot see the object in the cluster: a deleted or edited registration is not in
# any plan. scripts/registration-drift.sh compares them (docs/deploy.md, "Registration drift").
resource "terraform_data" "registration" {
  input            = local.kube
  triggers_replace = [local.revision]

  provisioner "local-exec" {
    interpreter = ["/bin/sh", "-c"]
    command     = <<-EOT
      ${local.kubectl_prelude}
      printf '%s' "$MANIFEST" | k apply --server-side --force-conflicts --field-manager "$FIELD_MANAGER" -f -
    EOT
    environment = {
      MANIFEST = jsonencode(merge(local.applied, {
        metadata = merge(local.applied.metadata, {
          annotations = merge(local.applied.metadata.annotations, { (local.instance_annotation) = self.id })
        })
      }))
      KUBECTL         = self.input.kubectl
      KUBECONFIG_PATH = self.input.kubeconfig
      KUBE_CONTEXT    = self.input.context
      EKS_CLUSTER     = self.input.eks_cluster
      EKS_REGION      = self.input.eks_region
      FIELD_MANAGER   = self.input.field_manager
    }
  }

  provisioner "local-exec" {
    when        = destroy
    interpreter = ["/bin/sh", "-c"]
    command     = <<-EOT
      ${self.input.delete_on_destroy ? "" : "exit 0"}
      set -eu
      if [ -n "$EKS_CLUSTER" ]; then
        KUBECONFIG=$(mktemp)
        trap 'rm -f "$KUBECONFIG"' EXIT
        export KUBECONFIG
        aws eks update-kubeconfig --name "$EKS_CLUSTER" $${EKS_REGION:+--region "$EKS_REGION"} --kubeconfig "$KUBECONFIG" >/dev/null
      elif [ -n "$KUBECONFIG_PATH" ]; then
        export KUBECONFIG="$KUBECONFIG_PATH"
      fi
      k() { "$KUBECTL" $${KUBE_CONTEXT:+--context "$KUBE_CONTEXT"} "$@"; }
      live=$(k get mutatingwebhookconfiguration "$NAME" --ignore-not-found -o 'jsonpath={.metadata.annotations.podmutator\.io/terraform-revision} {.metadata.annotations.podmutator\.io/terraform-instance}')
      live_revision=$${live%% *}
      live_instance=$${live#* }
      # Objects applied before the instance mark are matched by their revision.
      if [ -z "$live" ]; then
        echo "registration $NAME is already gone"
      elif [ "$live_instance" = "$INSTANCE" ] || { [ -z "$live_instance" ] && [ "$live_revision" = "$REVISION" ]; }; then
        k delete mutatingwebhookconfiguration "$NAME" --ignore-not-found
      else
        echo "registration $NAME was applied by another instance (revision '$live_revision'): a newer apply owns it; left in place"
      fi
    EOT
    environment = {
      NAME            = self.input.name
      INSTANCE        = self.id
      REVISION        = self.input.revision
      KUBECTL         = self.input.kubectl
      KUBECONFIG_PATH = self.input.kubeconfig
      KUBE_CONTEXT    = self.input.context
      EKS_CLUSTER     = self.input.eks_cluster
      EKS_REGION      = self.input.eks_region
    }
  }

  lifecycle {
    create_before_destroy = true
  }
}

# The AWS module's alb_deletion_protection, here too: the registration depends on the AWS
# module's outputs (and in the examples on the whole module), so a destroy deletes it before
# anything of that module, guard included. This guard depends on the registration and is
# therefore destroyed first of all; while the install is protected its destroy-time provisioner
# fails, and nothing is deleted (../../protection.tf says why). The setting is read from the
# state of this resource: lift it with alb_deletion_protection = false and an apply.
resource "terraform_data" "deletion_guard" {
  input = nonsensitive(var.registration.deletion_protection)

  provisioner "local-exec" {
    when        = destroy
    interpreter = ["/bin/sh", "-c"]
    command     = self.input ? "printf '%s\\n' \"$MESSAGE\" >&2; exit 1" : "exit 0"
    environment = {
      MESSAGE = "podmutator: alb_deletion_protection is true: destroy refused before anything was deleted (the registration, the function and the endpoint are all still in place). To remove this install, set alb_deletion_protection = false (terraform.tfvars), run terraform apply, then terraform destroy (docs/deploy.md, \"Removal and reinstall\")."
    }
  }

  depends_on = [terraform_data.registration]
}
