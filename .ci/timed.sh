# Sourced by .ci/run and deploy/test.sh: `timed NAME COMMAND...` runs COMMAND and records its
# wall time and the CPU time (user + system) of every process it ran (`timed_begin` and
# `timed_end NAME` around several commands do the same); `timed_summary` prints the table.
# CPU time says what a step costs on a shared machine, where wall time depends on the
# neighbours.

TIMED_ROWS=()
TIMED_TIMES="$(mktemp)"

# TIMED_CPU: the CPU seconds of this shell's finished (waited for) children so far: the
# second line of `times`, run in this shell (a subshell would see only its own children).
timed_cpu() {
  times >"$TIMED_TIMES"
  TIMED_CPU="$(awk 'NR == 2 {
    n = 0
    for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); n += p[1] * 60 + p[2] }
    printf "%.1f", n
  }' "$TIMED_TIMES")"
}

timed_begin() {
  TIMED_T0="$(date +%s.%N)"
  timed_cpu
  TIMED_C0="$TIMED_CPU"
}

# timed_end NAME [STATUS]
timed_end() {
  timed_cpu
  TIMED_ROWS+=("$(awk -v t0="$TIMED_T0" -v t1="$(date +%s.%N)" -v c0="$TIMED_C0" \
    -v c1="$TIMED_CPU" -v name="$1" -v rc="${2:-0}" \
    'BEGIN { printf "%6.0f s %7.0f s  %s%s", t1 - t0, c1 - c0, name, (rc ? "  (failed)" : "") }')")
  echo "${TIMED_ROWS[-1]}"
}

timed() {
  local name="$1" rc=0
  shift
  timed_begin
  # In the background and waited for: COMMAND (a shell function too) keeps `set -e`, which
  # `COMMAND || ...` would switch off inside it.
  "$@" &
  wait "$!" || rc=$?
  timed_end "$name" "$rc"
  return "$rc"
}

timed_summary() {
  local row
  [ "${#TIMED_ROWS[@]}" -gt 0 ] || return 0
  echo "== times (wall, CPU = user + system, step)"
  for row in "${TIMED_ROWS[@]}"; do
    echo "$row"
  done
}
