# Sourced by .ci/run and scripts/test: `phase NAME COMMAND...` runs a
# command as one timed phase; the table of every phase (wall seconds and
# result) is printed when the outermost script exits, also after a failure,
# so a slow or failing run shows where its time went.
#
# The phases of nested scripts go to the same table: the outermost script
# creates PICKET_PHASE_LOG and exports it; the inner ones only append.

if [ -z "${PICKET_PHASE_LOG:-}" ]; then
  PICKET_PHASE_LOG=$(mktemp)
  export PICKET_PHASE_LOG
  PICKET_PHASE_START=$(date +%s.%N)
  phase_table() {
    local rc=$?
    echo
    echo "phases (wall time):"
    awk -F'\t' -v total="$(awk -v a="$PICKET_PHASE_START" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" '
      { printf "  %-34s %8.1f s  %s\n", $1, $2, $3 }
      END { printf "  %-34s %8.1f s\n", "total", total }' "$PICKET_PHASE_LOG"
    rm -f "$PICKET_PHASE_LOG"
    return $rc
  }
  trap phase_table EXIT
fi

phase() {
  local name=$1 start rc=0
  shift
  start=$(date +%s.%N)
  "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" \
    "$([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)")" >> "$PICKET_PHASE_LOG"
  return $rc
}
