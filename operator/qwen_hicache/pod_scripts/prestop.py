import os, re, time, urllib.request
env = os.environ
base = "http://%s:%s" % (env.get("QWEN_HICACHE_POD_HOST", "127.0.0.1"), env["QWEN_HICACHE_PORT"])
deadline = time.time() + float(env["QWEN_HICACHE_DRAIN_SECONDS"])
def running():
    try:
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    except Exception:
        return None  # unknown is not idle: keep waiting (bounded by the deadline)
    found = re.findall(r"^sglang:num_running_reqs(?:[{][^}]*[}])? (\S+)$", text, re.M)
    return sum(float(v) for v in found) if found else None
while time.time() < deadline:
    n = running()
    if n == 0:
        break
    print("waiting: running requests", "unknown" if n is None else n, flush=True)
    time.sleep(1)
flush = env["QWEN_HICACHE_FLUSH_SECONDS"]
req = urllib.request.Request(base + "/flush_cache?timeout=" + flush, method="POST",
                             headers={"Authorization": "Bearer " + env.get("QWEN_HICACHE_ADMIN_API_KEY", "")})
try:
    print("flush:", urllib.request.urlopen(req, timeout=float(flush) + 10).status, flush=True)
except Exception as err:
    print("flush failed:", err, flush=True)
