"""A sampling profiler the engine run loads into every server process: where a request's time to first token goes.

run_engine.py `--profile` puts a `sitecustomize.py` that calls `start()` on the servers' path, so the HTTP
server, the scheduler and the detokenizer each sample themselves. While the file `QHC_PROFILE_FLAG` exists and
names a window (e.g. `disk-warm`), every thread's Python stack is counted every `QHC_SAMPLE_S` seconds (default
5 ms); the counts go to `QHC_PROFILE_DIR/stacks-<pid>.txt` as collapsed stacks (`window;thread;frame;... count`,
the flame-graph format) when a window ends, every 2 s within one and at exit, so a process stopped by SIGTERM or
SIGKILL keeps what it sampled. Pure Python and in-process because the GPU machine's ptrace rules are not known: a
sample is taken when the sampler gets the GIL, so a thread stuck in a C call that holds the GIL is seen only when it
lets go.
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import threading
import time


def _stack(frame) -> str:
    names = []
    while frame is not None:
        code = frame.f_code
        names.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})")
        frame = frame.f_back
    return ";".join(reversed(names))


def _dump(counts: collections.Counter, path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        fh.writelines(f"{stack} {n}\n" for stack, n in counts.items())
    os.replace(tmp, path)


COUNTS: collections.Counter = collections.Counter()


def _loop(flag: str, path: str, interval: float) -> None:
    me, sampled, dumped, last, previous = threading.get_ident(), 0, 0, time.monotonic(), ""
    while True:
        time.sleep(interval)
        try:
            with open(flag) as fh:
                window = fh.read().strip()
        except OSError:
            window = ""
        if window:
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    COUNTS[f"{window};{names.get(ident, ident)};{_stack(frame)}"] += 1
                    sampled += 1
        # at a window's end (the run closes it before it stops the server) and every 2 s within one
        if sampled != dumped and (window != previous or time.monotonic() - last > 2):
            _dump(COUNTS, path)
            dumped, last = sampled, time.monotonic()
        previous = window


def start() -> None:
    flag, out = os.environ.get("QHC_PROFILE_FLAG"), os.environ.get("QHC_PROFILE_DIR")
    if not flag or not out:
        return
    path = os.path.join(out, f"stacks-{os.getpid()}.txt")
    interval = float(os.environ.get("QHC_SAMPLE_S", "0.005"))
    threading.Thread(target=_loop, args=(flag, path, interval), name="qhc-stack-sampler", daemon=True).start()
    atexit.register(lambda: COUNTS and _dump(COUNTS.copy(), path))


def summary(directory: str, top: int = 25) -> dict:
    """Per window and thread: samples, the leaf frames (file:line) that took the most of them, and the functions
    most often on the stack (inclusive)."""
    per: dict = {}  # window -> thread -> (leaf frames, functions on the stack)
    for name in sorted(os.listdir(directory)):
        if not (name.startswith("stacks-") and name.endswith(".txt")):
            continue
        pid = name[len("stacks-") : -len(".txt")]
        with open(os.path.join(directory, name)) as fh:
            for line in fh:
                stack, _, n = line.rstrip("\n").rpartition(" ")
                window, thread, *frames = stack.split(";")
                leaves, funcs = per.setdefault(window, {}).setdefault(
                    f"{pid}/{thread}", (collections.Counter(), collections.Counter()))
                leaves[frames[-1] if frames else "?"] += int(n)
                funcs.update(dict.fromkeys({f.rsplit(":", 1)[0] + ")" for f in frames}, int(n)))
    return {window: {thread: {"samples": sum(leaves.values()), "top": leaves.most_common(top),
                              "inclusive": funcs.most_common(top)}
                     for thread, (leaves, funcs) in threads.items()}
            for window, threads in per.items()}  # fmt: skip
