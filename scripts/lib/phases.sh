# Sourced by .ci/run and scripts/test: `phase NAME COMMAND...` runs a
# command as one timed phase; the table of every phase (wall seconds, CPU
# seconds of the command and everything it waited for, result) is printed
# when the outermost script exits, also after a failure, so a slow or
# failing run shows where its time went. CPU seconds show the work itself:
# on a shared or loaded machine the wall time grows, they do not.
#
# The phases of nested scripts go to the same table: the outermost script
# creates CI_PHASE_LOG and exports it; the inner ones only append.

if [ -z "${CI_PHASE_LOG:-}" ]; then
  CI_PHASE_LOG=$(mktemp)
  export CI_PHASE_LOG
  CI_PHASE_START=$(date +%s.%N)
  phase_table() {
    local rc=$?
    echo
    echo "phases:                                   wall        cpu"
    awk -F'\t' -v total="$(awk -v a="$CI_PHASE_START" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" '
      { printf "  %-36s %7.1f s %8.1f s  %s\n", $1, $2, $3, $4 }
      END { printf "  %-36s %7.1f s\n", "total", total }' "$CI_PHASE_LOG"
    rm -f "$CI_PHASE_LOG"
    return $rc
  }
  trap phase_table EXIT
fi

# CPU seconds (user + system) of the children of shell $1 that have ended
# and been waited for: fields 16 and 17 of /proc/<pid>/stat, after the
# command name (which may hold spaces, hence the split at its closing
# parenthesis).
children_cpu() {
  local stat rest
  read -r stat < "/proc/$1/stat"
  rest=${stat##*) }
  # shellcheck disable=SC2086
  set -- $rest
  awk -v u="${14}" -v s="${15}" -v hz="$(getconf CLK_TCK)" 'BEGIN { print (u + s) / hz }'
}

phase() {
  local name=$1 start cpu rc=0 me=$BASHPID
  shift
  start=$(date +%s.%N)
  cpu=$(children_cpu "$me")
  "$@" || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" \
    "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" \
    "$(awk -v a="$cpu" -v b="$(children_cpu "$me")" 'BEGIN { print b - a }')" \
    "$([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")" >> "$CI_PHASE_LOG"
  return $rc
}
