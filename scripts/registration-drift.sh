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
# Two checks, nothing written:
#   1. `kubectl diff --server-side`: a dry-run apply as the field manager, i.e. exactly what the
#      next apply would change (a value edited, a field or the object deleted), with the
#      server's defaults on both sides.
#   2. Foreign fields: the live object (`kubectl get -o json`) less what the API server itself
#      writes, against the input. A field present in the cluster and absent from the input was
#      added by someone else (another field manager: a `kubectl edit`, a policy engine, a second
#      controller), and an apply keeps it, `terraform apply -replace` included: server-side
#      apply removes only the fields its own manager set. Such a field can switch the webhook
#      off for every pod (a `matchConditions` entry that is always false), narrow it (a
#      `namespaceSelector.matchLabels` key) or send pods elsewhere (a second webhook entry).
#      Each is listed with its path, its value and the field managers that own it
#      (metadata.managedFields).
#   Written by the API server, so never foreign: metadata.managedFields, resourceVersion, uid,
#   generation, creationTimestamp and selfLink; the annotation
#   kubectl.kubernetes.io/last-applied-configuration (client-side `kubectl apply` writes it);
#   and, in a webhook entry the input leaves them out of, the defaults the API server fills in
#   (admissionregistration.k8s.io/v1) at their default value only: failurePolicy Fail,
#   matchPolicy Equivalent, namespaceSelector {}, objectSelector {}, reinvocationPolicy Never,
#   timeoutSeconds 10, clientConfig.service.port 443. Any other value there is foreign.
# The path token never reaches the output: in URLs, and wherever the input's token appears in a
# foreign value, it is shown as the first 12 hex digits of its SHA-256 (compare `terraform
# output -raw path_token_sha256`).
#
# Exit status: 0 in sync; 1 drifted (a diff and/or the foreign fields on stdout) or missing; 2
# could not check (bad arguments, no kubectl or jq, no cluster access). Needs get and patch
# (dry-run) on mutatingwebhookconfigurations.
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
command -v jq >/dev/null 2>&1 || die "'jq' not found: install jq 1.6 or later (it compares the live object with the input)"

# The object stays in memory: its URLs hold the token.
if [[ $file == - ]]; then
	manifest=$(cat)
else
	[[ -r $file ]] || die "cannot read $file"
	manifest=$(<"$file")
fi
[[ $manifest == *MutatingWebhookConfiguration* ]] ||
	die "the input is not a MutatingWebhookConfiguration (give the registration_manifest output or podmutator webhook-config's)"

# Every URL's first path segment of 32 or more token characters is shown by its hash, and so is
# each such segment of the input's URLs wherever else it appears (a foreign value may copy it).
url_token='https://[^/[:space:]"]+/([A-Za-z0-9_-]{32,})(/|$|[[:space:]"])'
known_tokens=()
rest=$manifest
while [[ $rest =~ $url_token ]]; do
	known_tokens+=("${BASH_REMATCH[1]}")
	rest=${rest//"${BASH_REMATCH[1]}"/}
done
shown() { printf '<token sha256:%s…>' "$(printf '%s' "$1" | sha256sum | cut -c1-12)"; }
redact() {
	local line token
	while IFS= read -r line || [[ -n $line ]]; do
		while [[ $line =~ $url_token ]]; do
			token=${BASH_REMATCH[1]}
			line=${line//"$token"/"$(shown "$token")"}
		done
		for token in ${known_tokens[@]+"${known_tokens[@]}"}; do
			line=${line//"$token"/"$(shown "$token")"}
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
# An apply keeps other managers' fields; a replace (an update of the whole object) drops them.
replace="Find what adds them (the field managers named) and stop it, then replace the object with the registration: the same input | kubectl replace -f - (docs/deploy.md, \"Registration drift\"); an apply, -replace included, keeps them"

err=$(mktemp)
trap 'rm -f "$err"; [[ -z ${tmp:-} ]] || rm -rf "$tmp"' EXIT

# The input as JSON (it may be YAML), read by kubectl itself; nothing is sent for the dry run.
if ! want=$(printf '%s' "$manifest" | k create --dry-run=client --validate=false -o json -f - 2>"$err"); then
	redact <"$err" >&2
	die "kubectl could not read the input as a Kubernetes object"
fi
if ! live_object=$(printf '%s' "$manifest" | k get -f - --ignore-not-found --show-managed-fields -o json 2>"$err"); then
	redact <"$err" >&2
	die "kubectl get failed: no access to the cluster, or no get permission on mutatingwebhookconfigurations"
fi
if [[ -z $live_object ]]; then
	echo "registration-drift: the registration is missing from the cluster: pods are admitted without podmutator. $restore" >&2
	exit 1
fi
name=$(printf '%s' "$live_object" | jq -r '.metadata.name') || die "kubectl get printed no object"
live="mutatingwebhookconfiguration.admissionregistration.k8s.io/$name"

# Foreign fields: one line each, `<path> = <value> (field managers: ...)`. Both objects go to
# jq on stdin, never as arguments (which other users of the machine can read).
# shellcheck disable=SC2016
foreign_fields='
  .[0] as $live | .[1] as $want
  | {failurePolicy: "Fail", matchPolicy: "Equivalent", namespaceSelector: {}, objectSelector: {},
     reinvocationPolicy: "Never", timeoutSeconds: 10} as $defaults
  | def generic: map(if type == "object" then "*" else . end);
    def server_set($p; $v):
      ($p | generic) as $g
      | ($g | length) == 2 and $g[0] == "metadata"
          and ($g[1] | IN("managedFields", "resourceVersion", "uid", "generation", "creationTimestamp", "selfLink"))
        or $g == ["metadata", "annotations", "kubectl.kubernetes.io/last-applied-configuration"]
        or (($g | length) == 3 and $g[0:2] == ["webhooks", "*"] and ($defaults | has($g[2])) and $defaults[$g[2]] == $v)
        or ($g == ["webhooks", "*", "clientConfig", "service", "port"] and $v == 443);
    def keyed: type == "string" and (. == "webhooks" or . == "matchConditions");
    # [path, value] of each field of $l that $w lacks; a path holds keys and {name} list items.
    def foreign($l; $w; $p):
      if ($l | type) == "object" then
        $l | to_entries[] | .key as $k | .value as $v
        | if ($w | type) == "object" and ($w | has($k)) then foreign($v; $w[$k]; $p + [$k])
          elif server_set($p + [$k]; $v) then empty
          elif ($v | type) == "object" and ($v | length) > 0 then foreign($v; {}; $p + [$k])
          elif ($v | type) == "array" and ($k | keyed) then foreign($v; []; $p + [$k])
          else [$p + [$k], $v] end
      elif ($l | type) == "array" and ($p[-1] | keyed) then
        $l[] | . as $item | ([$w[]? | select(.name == $item.name)] | .[0]) as $m
        | if $m == null then [$p + [{name: $item.name}], $item]
          else foreign($item; $m; $p + [{name: $item.name}]) end
      else empty end;
    def show: reduce .[] as $s ("";
      if ($s | type) == "object" then . + "[name=" + ($s.name | tostring) + "]"
      elif ($s | test("^[A-Za-z0-9_-]+$")) then (if . == "" then $s else . + "." + $s end)
      else . + "[" + ($s | tojson) + "]" end);
    def owners($p):
      ($p | map(if type == "object" then "k:" + ({name: .name} | tojson) else "f:" + . end)) as $keys
      | [$live.metadata.managedFields[]? | select(.fieldsV1 | getpath($keys) != null) | .manager] | unique
      | if length == 0 then "none recorded" else join(", ") end;
  foreign($live; $want; [])
  | "\(.[0] | show) = \(.[1] | tojson) (field managers: \(owners(.[0])))"
'
if ! foreign=$(printf '%s\n%s\n' "$live_object" "$want" | jq -rs "$foreign_fields" 2>"$err"); then
	redact <"$err" >&2
	die "jq could not compare the live object with the input"
fi

set +e
diff=$(printf '%s' "$manifest" | k diff --server-side --force-conflicts --field-manager "$field_manager" -f - 2>"$err")
rc=$?
set -e
case $rc in
0 | 1) ;;
*)
	redact <"$err" >&2
	die "kubectl diff failed (status $rc): it needs patch permission on mutatingwebhookconfigurations for the dry run"
	;;
esac
if [[ $rc == 0 && -z $foreign ]]; then
	echo "registration-drift: $live is as registered" >&2
	exit 0
fi
if [[ $rc == 1 ]]; then
	printf '%s\n' "$diff" | redact
	echo "registration-drift: $live has drifted from the registration (the diff: - the cluster, + as registered). $restore; or, if the edit was meant, change the inputs to match" >&2
fi
if [[ -n $foreign ]]; then
	echo "Foreign fields: in the cluster, not in the registration"
	printf '%s\n' "$foreign" | sed 's/^/  /' | redact
	echo "registration-drift: $live holds foreign fields (listed under \"Foreign fields\"). $replace" >&2
fi
exit 1
