output "role_arns" {
  description = "Each namespace's role ARN."
  value       = { for ns, r in aws_iam_role.pods : ns => r.arn }
}

output "associations" {
  description = "The Pod Identity associations, by \"<namespace>/<service account>\"."
  value       = { for k, a in aws_eks_pod_identity_association.pods : k => a.association_id }
}
