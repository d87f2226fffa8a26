#!/usr/bin/env bash
# Is the cluster's MutatingWebhookConfiguration still the one that was registered? Terraform
# applies the registration with kubectl (terraform/modules/registration), so a deleted or
# edited object is invisible to `terraform plan`; run this on a schedule (docs/deploy.md,
# "Registration drift").
#
# Usage: scripts/registration-drift.sh [options] [-f FILE]
#   -f FILE              the object it should be, as JSON or YAML (default: stdin):
#                          terraform output -json registration_manifest   (examples/)
#                          podmutator webhook-config --url ... --path-token-file ...   (SAM, GitOps)
#   --eks-cluster NAME   credentials as modules/registration gets them: `aws eks
#                        update-kubeconfig` into a temporary file, with the caller's AWS identity
#   --region REGION      region of --eks-cluster (default: the AWS CLI's)
#   --kubeconfig FILE    instead of --eks-cluster (default: KUBECONFIG, ~/.kube/config)
#   --context NAME       kubeconfig context
#   --field-manager NAME the registration's field manager (default: podmutator-terraform)
#   --kubectl PATH       kubectl executable (default: kubectl)
#
# It asks the API server for the object, then `kubectl diff --server-side`: a dry-run apply as
# the field manager, i.e. exactly what the next apply would change, with the server's defaults
# on both sides. Nothing is written. The path token never reaches the output: in URLs it is
# shown as the first 12 hex digits of its SHA-256 (compare `terraform output -raw
# path_token_sha256`).
#
# Exit status: 0 in sync; 1 drifted (a diff on stdout) or missing; 2 could not check (bad
# arguments, no kubectl, no cluster access). Needs get and patch (dry-run) on
# mutatingwebhookconfigurations.
set -euo pipefail

die() {
	echo "registration-drift: error: $*" >&2
	exit 2
}

file=- eks_cluster= region= kubeconfig= context= field_manager=podmutator-terraform kubectl=kubectl
while [[ $# -gt 0 ]]; do
	case $1 in
	-f | --filename) file=${2:?-f needs a file}; shift 2 ;;
	--eks-cluster) eks_cluster=${2:?--eks-cluster needs a cluster name}; shift 2 ;;
	--region) region=${2:?--region needs a region}; shift 2 ;;
	--kubeconfig) kubeconfig=${2:?--kubeconfig needs a file}; shift 2 ;;
	--context) context=${2:?--context needs a context}; shift 2 ;;
	--field-manager) field_manager=${2:?--field-manager needs a name}; shift 2 ;;
	--kubectl) kubectl=${2:?--kubectl needs a path}; shift 2 ;;
	-h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument '$1' (see --help)" ;;
	esac
done
[[ -z $eks_cluster || -z $kubeconfig ]] || die "--eks-cluster and --kubeconfig exclude each other"
command -v "$kubectl" >/dev/null 2>&1 || die "'$kubectl' not found: install kubectl 1.22 or later, or pass --kubectl"

# The object stays in memory: its URLs hold the token.
if [[ $file == - ]]; then
	manifest=$(cat)
else
	[[ -r $file ]] || die "cannot read $file"
	manifest=$(<"$file")
fi
[[ $manifest == *MutatingWebhookConfiguration* ]] ||
	die "the input is not a MutatingWebhookConfiguration (give the registration_manifest output or podmutator webhook-config's)"

# Every URL's first path segment of 32 or more token characters is shown by its hash.
redact() {
	local line token hash
	while IFS= read -r line || [[ -n $line ]]; do
		while [[ $line =~ https://[^/[:space:]\"]+/([A-Za-z0-9_-]{32,})(/|$|[[:space:]\"]) ]]; do
			token=${BASH_REMATCH[1]}
			hash=$(printf '%s' "$token" | sha256sum | cut -c1-12)
			line=${line//"$token"/"<token sha256:$hash…>"}
		done
		printf '%s\n' "$line"
	done
}

if [[ -n $eks_cluster ]]; then
	command -v aws >/dev/null 2>&1 || die "'aws' (the AWS CLI) not found: --eks-cluster needs it"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	kubeconfig=$tmp/kubeconfig
	aws eks update-kubeconfig --name "$eks_cluster" ${region:+--region "$region"} --kubeconfig "$kubeconfig" >/dev/null ||
		die "aws eks update-kubeconfig --name $eks_cluster failed (AWS credentials, eks:DescribeCluster, the region?)"
fi
[[ -z $kubeconfig ]] || export KUBECONFIG=$kubeconfig
k() { "$kubectl" ${context:+--context "$context"} "$@"; }

# A plain `terraform apply` does not see the cluster, so it would not restore anything.
restore="Restore it: terraform apply -replace=module.registration.terraform_data.registration (Terraform), or podmutator webhook-config ... | kubectl apply -f - (SAM, GitOps)"

err=$(mktemp)
trap 'rm -f "$err"; [[ -z ${tmp:-} ]] || rm -rf "$tmp"' EXIT

if ! live=$(printf '%s' "$manifest" | k get -f - --ignore-not-found -o name 2>"$err"); then
	redact <"$err" >&2
	die "kubectl get failed: no access to the cluster, or no get permission on mutatingwebhookconfigurations"
fi
if [[ -z $live ]]; then
	echo "registration-drift: the registration is missing from the cluster: pods are admitted without podmutator. $restore" >&2
	exit 1
fi

set +e
diff=$(printf '%s' "$manifest" | k diff --server-side --force-conflicts --field-manager "$field_manager" -f - 2>"$err")
rc=$?
set -e
case $rc in
0)
	echo "registration-drift: $live is as registered" >&2
	exit 0
	;;
1)
	printf '%s\n' "$diff" | redact
	echo "registration-drift: $live has drifted from the registration (above: - the cluster, + as registered). $restore; or, if the edit was meant, change the inputs to match" >&2
	exit 1
	;;
*)
	redact <"$err" >&2
	die "kubectl diff failed (status $rc): it needs patch permission on mutatingwebhookconfigurations for the dry run"
	;;
esac
