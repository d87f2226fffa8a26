"""What a cluster's own IaC leaves behind, made in moto for tests/terraform_apply.rs's examples
runs: a VPC with a private subnet tagged kubernetes.io/role/internal-elb in each of two zones, an
EKS cluster in them (the control plane's own security group is docs/deploy.md's to add: the
test runs its commands), a public Route 53 zone for example.com and an SNS topic for the alarms. Through boto3 rather than Terraform: the
provider's waits would add half a minute, and these are inputs, not what is tested.

Usage: python moto_cluster.py CLUSTER_NAME   (AWS_ENDPOINT_URL points at moto). Prints the IDs
as one JSON object.
"""

import json
import sys
import time

import boto3

REGION = "us-east-1"
name = sys.argv[1]
ec2 = boto3.client("ec2", region_name=REGION)
vpc = ec2.create_vpc(CidrBlock="10.2.0.0/16")["Vpc"]["VpcId"]
subnets = []
for i, zone in enumerate([f"{REGION}a", f"{REGION}b"]):
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.2.{i}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
    ec2.create_tags(Resources=[subnet], Tags=[{"Key": "kubernetes.io/role/internal-elb", "Value": "1"}])
    subnets.append(subnet)
role = boto3.client("iam", region_name=REGION).create_role(
    RoleName=f"{name}-cluster",
    AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": {"Service": "eks.amazonaws.com"}}]}),
)["Role"]["Arn"]
boto3.client("eks", region_name=REGION).create_cluster(
    name=name, roleArn=role, resourcesVpcConfig={"subnetIds": subnets}
)
zone = boto3.client("route53", region_name=REGION).create_hosted_zone(Name="example.com", CallerReference=str(time.time()))["HostedZone"]["Id"].split("/")[-1]
topic = boto3.client("sns", region_name=REGION).create_topic(Name=f"{name}-alarms")["TopicArn"]
print(json.dumps({"vpc_id": vpc, "subnet_ids": subnets, "zone_id": zone, "alarm_topic_arn": topic}))
