output "vpc_id" {
  description = "The cluster's VPC."
  value       = local.vpc_config.vpc_id
}

output "subnet_ids" {
  description = "Subnets for the internal ALB, one per availability zone."
  value       = local.subnet_ids

  precondition {
    condition     = length(local.subnet_ids) >= 2
    error_message = "Fewer than two availability zones have a private subnet tagged kubernetes.io/role/internal-elb=1 in the cluster's VPC: tag one per zone, or pass subnet_ids."
  }
}

output "control_plane_security_group_id" {
  description = "The security group the ALB admits: carried by the control plane alone."
  value       = local.control_plane_sg

  precondition {
    condition     = local.control_plane_sg != null
    error_message = "The cluster has no single additional security group (vpc_config.security_group_ids): create one for the control plane (docs/deploy.md, \"A security group for the control plane alone\") or pass control_plane_security_group_id."
  }
  precondition {
    condition     = local.control_plane_sg != local.cluster_security_group_id
    error_message = "control_plane_security_group_id is the EKS cluster security group, which managed node groups and Fargate pods carry too: every pod could reach the webhook. Use a group that only the control plane carries (docs/deploy.md)."
  }
  precondition {
    condition     = local.control_plane_sg == null || contains(local.additional_groups, coalesce(local.control_plane_sg, "-"))
    error_message = "control_plane_security_group_id is not one of the cluster's additional security groups (vpc_config.security_group_ids), so the control plane's interfaces do not carry it and the API server could not reach the ALB."
  }
}

output "cluster_security_group_id" {
  description = "The EKS cluster security group (for reference: never admit it)."
  value       = local.cluster_security_group_id
}
