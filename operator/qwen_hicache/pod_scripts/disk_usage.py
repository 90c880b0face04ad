import http.server, json, os, re, signal, sys, threading, time
# The container's PID 1: without a handler the kernel drops SIGTERM, and the pod's deletion waits out its
# whole grace period (the drain and flush budget) for this sidecar.
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
env = os.environ
root, fp = env["QWEN_HICACHE_CACHE_ROOT"], env["QWEN_HICACHE_FINGERPRINT"]
tp, cap = int(env.get("QWEN_HICACHE_TP_SIZE") or 1), int(env.get("SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE") or 0)
interval = float(env.get("QWEN_HICACHE_USAGE_INTERVAL") or 30)
# The TP ranks whose shards live on this pod's volume: all of them, or one node's share of a multi-node group.
per_pod = int(env.get("QWEN_HICACHE_RANKS_PER_POD") or tp)
first = int(env.get("QWEN_HICACHE_NODE_RANK") or 0) * per_pod
rank_of = re.compile(r"_(\d+)_%d\.bin$" % tp)
ns = os.path.join(root, fp)
snapshot = [b""]

def du(path):
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total

def created():
    path = os.path.join(ns, ".qwen-hicache-created")
    try:
        return float(open(path).read().strip())
    except (OSError, ValueError):
        now = time.time()
        try:
            with open(path + ".tmp", "w") as f:
                f.write("%d\n" % now)
            os.replace(path + ".tmp", path)
        except OSError:
            pass
        return now

def prestop():
    """The last preStop's record on the volume (podlifecycle.PRESTOP_RECORD), or None."""
    try:
        with open(os.path.join(root, ".qwen-hicache-prestop.json")) as f:
            rec = json.load(f)
        if rec.get("outcome") not in ("ok", "failed", "timeout"):
            return None
        return {"pod": str(rec.get("podName", "")), "pod_uid": str(rec.get("podUid", "")), "outcome": rec["outcome"],
                "message": str(rec.get("message", ""))[:400], "time": float(rec.get("time") or 0),
                "seconds": float(rec.get("seconds") or 0)}
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # none yet, or not ours to read

def esc(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

def scan():
    t0 = time.time()
    ranks = range(first, first + per_pod)
    used, files = {str(r): 0 for r in ranks}, {str(r): 0 for r in ranks}
    try:
        entries = list(os.scandir(ns))
    except OSError:
        entries = []
    for e in entries:
        m = rank_of.search(e.name)
        if m and m.group(1) in used:
            try:
                used[m.group(1)] += e.stat(follow_symlinks=False).st_size
                files[m.group(1)] += 1
            except OSError:
                pass
    old = jit = 0
    for e in os.scandir(root):
        if not e.is_dir(follow_symlinks=False) or e.name == fp or e.name.startswith("lost+found"):
            continue
        if e.name == ".jit":
            jit = du(e.path)
        else:
            old += du(e.path)
    st = os.statvfs(root)
    lines, typed = [], set()
    def put(name, value, help_, kind="gauge", **labels):
        if name not in typed:
            typed.add(name)
            lines.extend(["# HELP %s %s" % (name, help_), "# TYPE %s %s" % (name, kind)])
        lab = ",".join('%s="%s"' % (k, esc(v)) for k, v in labels.items())
        lines.append("%s%s %s" % (name, "{%s}" % lab if lab else "", float(value)))
    for r in sorted(used, key=int):
        put("qwen_hicache_disk_used_bytes", used[r], "Page file bytes of the current namespace.", tp_rank=r)
    for r in sorted(files, key=int):
        put("qwen_hicache_disk_page_files", files[r], "Page files of the current namespace.", tp_rank=r)
    if cap:
        for r in sorted(used, key=int):
            put("qwen_hicache_disk_cap_bytes", cap, "The runtime's disk-tier cap per TP rank.", tp_rank=r)
    put("qwen_hicache_disk_old_namespaces_bytes", old, "Bytes of earlier cache namespaces kept on the volume.")
    put("qwen_hicache_disk_compiled_kernels_bytes", jit,
        "Bytes of the runtime's compile caches on the volume (every kept namespace's).")
    put("qwen_hicache_disk_volume_used_bytes", (st.f_blocks - st.f_bfree) * st.f_frsize, "Used bytes of the volume.")
    put("qwen_hicache_disk_volume_size_bytes", st.f_blocks * st.f_frsize, "Size of the cache volume.")
    put("qwen_hicache_cache_namespace_created_timestamp_seconds", created(), "First use of the namespace.")
    put("qwen_hicache_cache_namespace_info", 1, "The current cache namespace.", fingerprint=fp)
    rec = prestop()
    if rec:
        put("qwen_hicache_prestop_info", 1, "The last preStop on this volume: its pod and outcome.",
            pod=rec["pod"], pod_uid=rec["pod_uid"], outcome=rec["outcome"], message=rec["message"])
        put("qwen_hicache_prestop_timestamp_seconds", rec["time"], "When that preStop ended.")
        put("qwen_hicache_prestop_duration_seconds", rec["seconds"], "Seconds it took.")
    put("qwen_hicache_disk_scan_duration_seconds", time.time() - t0, "Wall time of the last scan.")
    put("qwen_hicache_disk_scan_timestamp_seconds", time.time(), "When the last scan finished.")
    snapshot[0] = ("\n".join(lines) + "\n").encode()

def loop():
    while True:
        try:
            scan()
        except Exception as exc:
            print("cache-usage scan failed: %r" % (exc,), file=sys.stderr, flush=True)
        time.sleep(interval)

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        ok = self.path.split("?")[0] == "/metrics" and snapshot[0]
        body = snapshot[0] if ok else b"not ready\n"
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

scan()
threading.Thread(target=loop, daemon=True).start()
addr = (env.get("QWEN_HICACHE_USAGE_HOST") or "0.0.0.0", int(env.get("QWEN_HICACHE_USAGE_PORT") or 9400))
http.server.ThreadingHTTPServer(addr, H).serve_forever()
