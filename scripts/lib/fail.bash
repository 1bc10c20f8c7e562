# Sourced by every script in scripts/. Turns on strict mode and makes a
# failure loud: a command that fails ends the script with one line that
# names the script, the step it was in and what to do, instead of a bare
# exit status.
#
#   step "fetching Prometheus" "check the network and the apt sources"
#
# sets the step that the line names from then on. Explicit exits (exit 3
# for "cannot here") are the script's own and print their own line.
set -Eeuo pipefail

_fail_step="starting"
_fail_hint=""

# step NAME [HINT] names what the script does from here on, and what to do
# if it fails.
step() {
	_fail_step=$1
	_fail_hint=${2:-}
}

# fail MESSAGE ends the script with one line: its name and MESSAGE.
fail() {
	echo "${0##*/}: $1" >&2
	exit 1
}

_fail_report() {
	local rc=$? line=${BASH_LINENO[0]} file=${BASH_SOURCE[1]:-$0} cmd=$BASH_COMMAND
	# Command substitutions and pipeline stages run in subshells that
	# inherit this trap; only the script itself speaks, once.
	[ "$BASH_SUBSHELL" -eq 0 ] || return "$rc"
	# The line as written names a whole pipeline, where BASH_COMMAND
	# names only its last stage.
	local src
	if src=$(sed -n "${line}p" "$file" 2>/dev/null) && [ -n "$src" ]; then
		cmd=$(echo "$src" | sed 's/^[[:space:]]*//')
	fi
	echo "${0##*/}: $_fail_step failed (exit $rc, line $line: $cmd)${_fail_hint:+; $_fail_hint}" >&2
}
trap _fail_report ERR
