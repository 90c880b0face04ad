import json, os, re, sys, time, urllib.error, urllib.request
env = os.environ
base = "http://%s:%s" % (env.get("QWEN_HICACHE_POD_HOST", "127.0.0.1"), env["QWEN_HICACHE_PORT"])
started = time.time()
deadline = started + float(env["QWEN_HICACHE_DRAIN_SECONDS"])
flush = env["QWEN_HICACHE_FLUSH_SECONDS"]
record_path = env.get("QWEN_HICACHE_PRESTOP_RECORD", "")  # set only with a disk tier (on the cache volume)

def record(outcome, message):
    """The outcome, where the successor's cache-usage sidecar reads it: atomic (tmp, fsync, rename, dir fsync)."""
    if not record_path:
        return
    body = {"podName": env.get("QWEN_HICACHE_POD_NAME", ""), "podUid": env.get("QWEN_HICACHE_POD_UID", ""),
            "outcome": outcome, "message": message[:400], "time": time.time(),
            "seconds": round(time.time() - started, 1)}
    tmp = record_path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(body, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, record_path)
        fd = os.open(os.path.dirname(record_path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        print("could not record the preStop outcome:", err, flush=True)

def running():
    try:
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    except Exception:
        return None  # unknown is not idle: keep waiting (bounded by the deadline)
    found = re.findall(r"^sglang:num_running_reqs(?:[{][^}]*[}])? (\S+)$", text, re.M)
    return sum(float(v) for v in found) if found else None

def flush_cache():
    """(ok | failed | timeout, message). A refusal that came after the flush's own timeout is a timeout: the
    runtime's deferred flush waited that long for its backups and requests to finish."""
    req = urllib.request.Request(base + "/flush_cache?timeout=" + flush, method="POST",
                                 headers={"Authorization": "Bearer " + env.get("QWEN_HICACHE_ADMIN_API_KEY", "")})
    asked = time.time()
    try:
        with urllib.request.urlopen(req, timeout=float(flush) + 10) as resp:
            return "ok", "flush: %d" % resp.status  # the e2e and GPU runs read this line
    except urllib.error.HTTPError as err:
        text = err.read().decode(errors="replace").strip().splitlines()
        late = time.time() - asked >= float(flush)
        return ("timeout" if late else "failed"), "flush: %d %s" % (err.code, text[0] if text else "")
    except Exception as err:
        late = isinstance(err, TimeoutError) or "timed out" in str(err)
        return ("timeout" if late else "failed"), "flush: %s" % (err,)

# Until the flush answers, a stop cut short at the grace period reads as a timeout.
record("timeout", "the preStop was stopped before the flush answered")
n = None
while time.time() < deadline:
    n = running()
    if n == 0:
        break
    print("waiting: running requests", "unknown" if n is None else n, flush=True)
    time.sleep(1)
outcome, message = flush_cache()
if n:
    message += "; %g requests still running at the drain deadline" % n
record(outcome, message)
print(message if outcome == "ok" else "flush failed (%s): %s" % (outcome, message), flush=True)
# Non-zero only when queued writes may be lost (a disk tier): the kubelet then posts FailedPreStopHook on the pod
# and still sends SIGTERM (the runtime's own storage drain runs either way); see podlifecycle.
sys.exit(1 if outcome != "ok" and record_path else 0)
