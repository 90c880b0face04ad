for t in "$dir"/.*.tmp; do [ -e "$t" ] && rm -f "$t" && echo "removed stale $t"; done
echo "worker volume: stale partial pages swept (the runtime sweeps on TP rank 0 only)"
