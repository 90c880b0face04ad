"""The real `smg` router (the rendered flags, the rendered manifest) in front of engine stand-ins whose IPs
change at every restart, reached only through their stable DNS names (a strict hosts-file stand-in for
cluster DNS): affinity across pod and router restarts, no request to a stopping pod, failover, bounded load."""

from __future__ import annotations

import threading
import time

from harness.sim.routerlab import ENGINE_PORT, MODEL, ROUTER_PORT, RouterLab, landing_replicas

SYSTEM = ("You are the support assistant of a large online shop; answer briefly and politely. " * 12)[:900]


def _conversations(n: int) -> list[str]:
    # The 256-token (1024-character) hashed prefix covers the system prompt and the conversation's opening.
    return [f"{SYSTEM}\nuser-{c:03d}: my order {c * 7919} has not arrived, what now?" for c in range(n)]


def _cached(meta: dict) -> int:
    return sum((meta.get("cached_tokens_details") or {}).values())


def test_affinity_survives_rolling_restart_and_router_restart(lab) -> None:
    lab: RouterLab = lab(3)
    texts = _conversations(12)
    before = [lab.landing(t)[0] for t in texts]
    assert len(set(before)) == 3, before  # conversations spread over every replica
    first_ips = [p.ip for p in lab.pods]
    for i in reversed(range(3)):
        lab.restart_pod(i)
    assert all(p.ip != ip for p, ip in zip(lab.pods, first_ips, strict=True))  # new IPs, same names
    after = [lab.landing(t) for t in texts]
    assert [r for r, _ in after] == before
    # Each replica's first returning conversation found the shared prefix on its disk tier, not recomputed.
    assert all(_cached(m) >= 896 for _, m in after), [m.get("cached_tokens_details") for _, m in after]
    assert sum(m["cached_tokens_details"]["storage"] for _, m in after) > 0
    lab.restart_router()
    engines = [f"http://{p.ip}:{ENGINE_PORT}" for p in lab.pods]
    assert landing_replicas(f"http://{lab.router_ip}:{ROUTER_PORT}", MODEL, texts, engines) == before


def test_no_request_reaches_a_stopping_pod(lab) -> None:
    lab: RouterLab = lab(2, "--sim-request-seconds", "0.05")
    texts = _conversations(16)
    errors: list[str] = []
    stop = threading.Event()

    def traffic() -> None:
        i = 0
        while not stop.is_set():
            try:
                lab.generate(texts[i % len(texts)])
            except Exception as exc:  # noqa: BLE001 - every failure counts
                errors.append(repr(exc))
            i += 1

    threads = [threading.Thread(target=traffic) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)
        for ordinal in (1, 0):
            served_before = lab.received()[ordinal]
            assert served_before > 0  # it was serving its share
            lab.drain(ordinal)
            time.sleep(0.3)  # requests the router had already sent finish (the preStop hook waits for them)
            at_drain = lab.received()[ordinal]
            time.sleep(2.0)  # traffic goes on, the pod still runs, the router's health checks see it healthy
            assert lab.received()[ordinal] == at_drain, "the router sent a new request to a drained pod"
            lab.stop_pod(ordinal)
            lab.start_pod(ordinal)
            lab.undrain(ordinal)
            time.sleep(1.0)
            assert lab.received()[ordinal] > 0  # back in service
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:5]


def test_failover_when_a_pod_dies(lab) -> None:
    lab: RouterLab = lab(2)
    texts = _conversations(10)
    homes = [lab.landing(t)[0] for t in texts]
    victim = homes[0]
    lab.kill_pod(victim)  # no drain: the node is gone
    results = []
    for t in texts * 2:
        try:
            results.append(lab.landing(t)[0])
        except Exception:  # noqa: BLE001
            results.append(None)
    assert results.count(None) <= 2, results  # the router retries or marks it unhealthy at once
    assert all(r == 1 - victim for r in results[-len(texts):]), results
    lab.start_pod(victim)  # back on a new IP: the router finds it by name and its conversations return
    deadline, now = time.monotonic() + 45, []
    while time.monotonic() < deadline and now != homes:  # health checks every 5 s re-admit it
        time.sleep(1)
        now = [lab.landing(t)[0] for t in texts]
    assert now == homes


def test_a_hot_prefix_spreads_instead_of_overloading_one_replica(lab) -> None:
    lab: RouterLab = lab(2, "--sim-request-seconds", "0.4")
    hot = _conversations(1)[0]
    home = lab.landing(hot)[0]
    start = lab.received()
    threads = [threading.Thread(target=lab.generate, args=(hot,)) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got = [b - a for a, b in zip(start, lab.received(), strict=True)]
    assert sum(got) == 24
    assert 0 < got[1 - home] < 24 and got[home] < 24, got  # bounded load: the other replica took some
