#!/bin/bash
# sanitize_scan.sh LOG... — judges compute-sanitizer logs (memcheck, racecheck, initcheck, synccheck) for
# sanitize_gpu.sh and libs.sh's san_line (the device recipes): each report (a hazard, an invalid access, an
# API error) is attributed to our kernels when its lines name one of the __global__ functions of src/ops/cuda/
# (read from the sources here) or one of our .cu/.cuh files, else to third-party code (cuBLAS and the like),
# listed by the kernel or function it names.
# Prints one line per log; exits 1 when any report is ours, or a log has no summary line (the tool did not
# finish) or a summary that counts reports none of whose lines could be read.
C="$(cd "$(dirname "$0")/../.." && pwd)/src/ops/cuda"
OURS=$(perl -0777 -ne 'while (/__global__\s+(?:static\s+)?(?:void\s+)?(?:__launch_bounds__\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*)?(?:void\s+)?(\w+)\s*\(/g) { print "$1\n" }' \
  "$C"/*.cu "$C"/*.cuh | sort -u | paste -sd'|')
[ -n "$OURS" ] || { echo "sanitize_scan: no __global__ functions found in src/ops/cuda"; exit 1; }
FILES=$(cd "$C" && ls *.cu *.cuh | sed 's/\./\\./g' | paste -sd'|')
bad=0
for log in "$@"; do
  out=$(awk -v ours="^($OURS)$" -v files="($FILES):[0-9]" '
    function body(s) { sub(/^=========[ \t]?/, "", s); return s }
    # the function a report names: "at NAME(...)+0x..", "at NAME+0x..", or "file.cu:12:NAME(..)" (older tools)
    function named(s,   m) {
      if (match(s, /(at|in) [^ ]+\(/)) { m = substr(s, RSTART, RLENGTH - 1); sub(/^(at|in) /, "", m); sub(/.*:/, "", m); return m }
      if (match(s, /at [A-Za-z_][A-Za-z0-9_:<>,]*\+0x/)) { m = substr(s, RSTART + 3, RLENGTH - 6); return m }
      return ""
    }
    function close_report() {
      if (!open) return
      n++
      if (mine) { o++; if (!(who in ow)) { ow[who] = 1; olist = olist (olist ? ", " : "") (who ? who : "?") } }
      else { t++; if (!(who in tw)) { tw[who] = 1; tlist = tlist (tlist ? ", " : "") (who ? who : "(unnamed)") } }
      open = 0
    }
    /^=========/ {
      s = body($0)
      if (s ~ /SUMMARY: /) { close_report(); summary = summary (summary ? "; " : "") s; if (match(s, /[0-9]+/)) counted += substr(s, RSTART, RLENGTH); next }
      if (s ~ /^(Error|ERROR|Warning|WARNING|Invalid |Race reported|Barrier error|Uninitialized|Program hit|Malloc\/Free|Leaked|Out-of-range|Misaligned|Cuda API error)/) {
        close_report(); open = 1; mine = 0; who = ""
      }
      if (!open) next
      # every word of the line that is one of our kernel names, or one of our files with a line number
      k = split(s, w, /[^A-Za-z0-9_]+/)
      for (i = 1; i <= k; i++) { x = w[i]; if (x ~ ours) { mine = 1; who = x } }
      if (s ~ files) { mine = 1; if (!who) { match(s, files); who = substr(s, RSTART, RLENGTH - 2) } }
      if (!mine && !who) who = named(s)
      next
    }
    END {
      close_report()
      printf "%d report(s): %d in our kernels%s, %d in third-party code%s; summary: %s\n", n, o, o ? " (" olist ")" : "",
        t, t ? " (" tlist ")" : "", summary ? summary : "NONE (the tool did not finish)"
      exit (o > 0 || summary == "" || (counted > 0 && n == 0)) ? 1 : 0
    }' "$log")
  rc=$?
  echo "$(basename "$log"): $out"
  [ $rc = 0 ] || bad=1
done
exit $bad
