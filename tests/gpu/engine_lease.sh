#!/usr/bin/env bash
# The engine run's last device call on `nvidia-h200-x2` (issues 23 and 27 in one lease): install the runtime once
# from the pieces, then the TP 1 run (GPU 1, its own ports on 127.0.0.1) and the TP 2 run (GPUs 0 and 1, ports on
# 127.0.0.2) at the same time, each with its own work directory, report and deadline. The device budget of one
# session holds one ~10-minute call after the ~20 piece calls, not two; so the runs share GPU 1, its disk and
# host memory, and each report says so (stand_ins). Reports under $OUT/tp1 and $OUT/tp2 (tests/gpu/README.md).
#
#   cp .gpu/c20/* /root/pieces/ && bash tests/gpu/engine_lease.sh
#
# PARTS1 (default engine,router) and PARTS2 (default engine) choose each run's parts; DEADLINE (seconds from the
# call's start, default 540) ends both. With SITE already installed (a later call on the same warm machine) and
# no PIECES, the install is skipped. GROW_GIB (default 96; 0: none) is the RAM touched first. EXTRA: more
# run_engine.py arguments for both runs (the CPU check runs this script against the engine stand-in with it).
set -u
: "${OUT:?OUT: the output folder of the device tool}"
PIECES=${PIECES-/root/pieces}
SITE=${SITE:-/root/site}
WORK=${WORK:-/root}
HOST1=${HOST1:-127.0.0.1}
HOST2=${HOST2:-127.0.0.2}
DEADLINE=${DEADLINE:-540}
PARTS1=${PARTS1-engine,router}
PARTS2=${PARTS2-engine}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)
mkdir -p "$OUT/tp1" "$OUT/tp2"
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
free -g | head -2
# The machine's RAM grows as it is used (KINDS.md): touch 96 GiB once, beside the install, so that the servers'
# host-memory check (MemAvailable - 10 GiB) sees the room the pods are given.
GROW_GIB=${GROW_GIB:-96}
EXTRA=${EXTRA:-}
python3 -c "import numpy as n; a = n.ones($GROW_GIB << 30, n.uint8); print('touched', a.nbytes >> 30, 'GiB')" &
GROW=$!
SHARED="shared lease: the TP 1 and TP 2 runs ran at the same time on one nvidia-h200-x2 (TP 1 on GPU 1, TP 2 on GPUs 0-1): GPU 1, the disk, CPU and host memory were shared, so timings, disk/copy speeds and /dev/shm peaks include the other run's load"
if [ -n "$PIECES" ]; then
  PIECES1=(--pieces "$PIECES")
else
  PIECES1=()
fi
CUDA_VISIBLE_DEVICES=1 python3 tests/gpu/run_engine.py --site "$SITE" "${PIECES1[@]}" --out "$OUT/tp1" \
  --work "$WORK/w1" --tp 1 --parts "$PARTS1" --host "$HOST1" --check-weights --deadline $((DEADLINE - 5)) --note "$SHARED" $EXTRA \
  > "$WORK/tp1.out" 2>&1 &
TP1=$!
if [ -n "$PIECES" ]; then  # the TP 2 run starts once the TP 1 run's install step has ended ok
  while kill -0 $TP1 2>/dev/null; do
    st=$(python3 -c "import json; print(json.load(open('$OUT/tp1/engine-tp1.json'))['steps']['install']['status'])" 2>/dev/null)
    [ -n "$st" ] && { echo "install: $st after $(( $(date +%s) - T0 )) s"; break; }
    sleep 2
  done
fi
wait $GROW
free -g | head -2
ELAPSED=$(( $(date +%s) - T0 ))
if [ -n "$PARTS2" ] && [ -f "$SITE/sglang/__init__.py" ]; then
  # The TP 2 server's ranks see unequal free memory (the TP 1 run's servers hold part of GPU 1): sglang's
  # start-up balance check would refuse that, so it is made a warning for this shared lease only.
  SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=0 python3 tests/gpu/run_engine.py --site "$SITE" --out "$OUT/tp2" \
    --work "$WORK/w2" --tp 2 --parts "$PARTS2" --host "$HOST2" --router-net 78 \
    --deadline $((DEADLINE - ELAPSED - 10)) --note "$SHARED" $EXTRA \
    --note "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=0 (the start-up check of equal free memory on both ranks)" \
    > "$WORK/tp2.out" 2>&1 &
  TP2=$!
  wait $TP2
  echo "tp2 rc=$?"
fi
wait $TP1
echo "tp1 rc=$?"
for f in "$WORK/tp1.out" "$WORK/tp2.out"; do [ -f "$f" ] && { echo "== $f"; grep -v "^\[.*\] \(cold\|filler\|host-warm\|disk-warm\|damaged\|new-fingerprint\) conv" $f | tail -c 5000; }; done
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
ls -la "$OUT"/tp1 "$OUT"/tp2
