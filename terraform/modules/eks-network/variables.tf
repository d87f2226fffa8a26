variable "cluster_name" {
  description = "Existing EKS cluster."
  type        = string
}

variable "subnet_ids" {
  description = "Subnets for the ALB, one per availability zone; empty derives them from the kubernetes.io/role/internal-elb tag."
  type        = list(string)
  default     = []
}

variable "control_plane_security_group_id" {
  description = "The control plane's dedicated security group; null takes the cluster's only additional security group (vpc_config.security_group_ids)."
  type        = string
  default     = null
}
