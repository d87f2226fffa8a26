# The `cluster_name` convenience: derives what the AWS module's ALB needs from an EKS cluster.
#   vpc_id:      the cluster's VPC.
#   subnet_ids:  the VPC's private subnets tagged kubernetes.io/role/internal-elb, one per
#                availability zone (the lowest ID in each), unless subnet_ids is given.
#   control_plane_security_group_id: the one additional security group of the cluster
#                (vpc_config.security_group_ids), unless given; never the cluster security
#                group, which managed node groups and Fargate pods carry too.
# AWS provider only; the examples call it.

terraform {
  required_version = ">= 1.11"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}

data "aws_eks_cluster" "this" {
  name = var.cluster_name
}

locals {
  vpc_config                = data.aws_eks_cluster.this.vpc_config[0]
  cluster_security_group_id = local.vpc_config.cluster_security_group_id
  additional_groups         = tolist(local.vpc_config.security_group_ids)
  control_plane_sg          = var.control_plane_security_group_id != null ? var.control_plane_security_group_id : (length(local.additional_groups) == 1 ? local.additional_groups[0] : null)
}

data "aws_subnets" "internal_elb" {
  filter {
    name   = "vpc-id"
    values = [local.vpc_config.vpc_id]
  }
  filter {
    name   = "tag:kubernetes.io/role/internal-elb"
    values = ["1", "true"]
  }
}

data "aws_subnet" "internal_elb" {
  for_each = toset(data.aws_subnets.internal_elb.ids)
  id       = each.value
}

locals {
  by_zone            = { for s in data.aws_subnet.internal_elb : s.availability_zone => s.id... }
  derived_subnet_ids = [for zone in sort(keys(local.by_zone)) : sort(local.by_zone[zone])[0]]
  subnet_ids         = length(var.subnet_ids) > 0 ? var.subnet_ids : local.derived_subnet_ids
}
