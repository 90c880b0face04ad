"""Group-by-group rollout of a multi-node server (group_rollout over rollout's state machine), against a model
of what LeaderWorkerSet does with the partition: groups at or above it are recreated at the new template."""

from __future__ import annotations

import itertools

from qwen_hicache import group_rollout, rollout
from qwen_hicache.constants import CONFIG_HASH_ANNOTATION, RESTART_ANNOTATION
from qwen_hicache.render_lws import GROUP_INDEX_LABEL, WORKER_INDEX_LABEL
from qwen_hicache.status_model import Restart

NAME, SIZE = "srv", 2
POLICY = rollout.Policy(max_unavailable=1, timeout_seconds=600, require_warm=True, fingerprint="fp")
_uids = itertools.count(1)


def pod(group: int, worker: int, target: str, ready: bool = True, created: str = "2026-01-01T00:00:00Z",
        ready_since: str = "2026-01-01T00:00:10Z") -> dict:
    config, restart = target.split("/")
    name = f"{NAME}-{group}" + (f"-{worker}" if worker else "")
    return {
        "metadata": {"name": name, "uid": f"u{next(_uids)}", "creationTimestamp": created,
                     "labels": {GROUP_INDEX_LABEL: str(group), WORKER_INDEX_LABEL: str(worker)},
                     "annotations": {CONFIG_HASH_ANNOTATION: config, RESTART_ANNOTATION: restart,
                                     "qwenhicache.io/fingerprint": "fp"}},
        "status": {"podIP": f"10.0.{group}.{worker}",
                   "conditions": [{"type": "Ready", "status": str(ready), "lastTransitionTime": ready_since}]},
    }  # fmt: skip


class Lws:
    """What LWS does with the partition (enough of it for the rollout): a released group is recreated whole."""

    def __init__(self, replicas: int, target: str) -> None:
        self.replicas, self.partition, self.target = replicas, 0, target
        self.pods = {(g, w): pod(g, w, target) for g in range(replicas) for w in range(SIZE)}
        self.recreated: list[int] = []

    def apply(self, target: str, partition: int) -> None:
        self.target = target
        self.set_partition(partition)

    def set_partition(self, partition: int) -> None:
        assert partition <= self.partition or self.partition == 0, "raised the partition mid-rollout"
        for g in range(partition, self.replicas):
            if self.pods[(g, 0)]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] != self.target.split("/")[0] \
                    or self.pods[(g, 0)]["metadata"]["annotations"][RESTART_ANNOTATION] != self.target.split("/")[1]:
                self.recreated.append(g)
                for w in range(SIZE):
                    self.pods[(g, w)] = pod(g, w, self.target, ready=False)
        self.partition = partition

    def become_ready(self) -> None:
        for key, p in self.pods.items():
            self.pods[key] = {**p, "status": {**p["status"], "conditions": [{"type": "Ready", "status": "True"}]}}

    def views(self) -> list[rollout.PodView]:
        return group_rollout.group_views(NAME, list(self.pods.values()), SIZE)


def step(lws: Lws, rs: Restart | None, target: str, now: str, storage: int = 640) -> tuple[Restart, list[str]]:
    """One reconcile pass: apply the template with the held partition, plan, perform the actions."""
    if rs is None or rs.id != target:
        planned, _ = rollout.plan_rollout(rs, lws.views(), target, lws.replicas, POLICY, now)
        lws.apply(target, group_rollout.partition_of(planned, lws.replicas))
    rs, actions = rollout.plan_rollout(rs, lws.views(), target, lws.replicas, POLICY, now)
    done = []
    for act in actions:
        done.append(f"{act.kind}:{act.pod}")
        if act.kind == "canary":
            rs = rollout.canary_sent(rs, act.pod, 900, None)
        elif act.kind == "delete":
            assert rollout.may_take_down(lws.views(), act.pod, act.uid, lws.replicas, POLICY)
            rs = group_rollout.released(rs, act.pod, lws.replicas)
            lws.set_partition(group_rollout.partition_of(rs, lws.replicas))
            rs = rollout.deleted(rs, act.pod, now)
        elif act.kind == "baseline":
            rs = rollout.baseline_read(rs, act.pod, act.uid, {rollout.STORAGE_COUNTER: 0})
        elif act.kind == "verify":
            rs = rollout.verified(rs, act.pod, storage, None, POLICY, now, {rollout.STORAGE_COUNTER: storage})
    return rs, done


def test_a_group_is_available_only_whole_at_one_target() -> None:
    pods = [pod(0, 0, "a/"), pod(0, 1, "a/"), pod(1, 0, "b/"), pod(1, 1, "a/"), pod(2, 0, "a/")]
    views = {v.ordinal: v for v in group_rollout.group_views(NAME, pods, SIZE)}
    assert views[0].available and views[0].target == "a/" and views[0].ip == "10.0.0.0"
    assert views[0].uid == f"{pods[0]['metadata']['uid']}|{pods[1]['metadata']['uid']}"
    assert not views[1].available and views[1].target == group_rollout.MIXED  # half old, half new
    assert not views[2].available and views[2].uid.endswith("|-")  # a worker is missing


def test_groups_roll_from_the_highest_index_down_one_at_a_time_and_come_back_warm() -> None:
    lws, rs = Lws(replicas=3, target="a/"), None
    seen, partitions = [], []
    for i in range(40):
        rs, done = step(lws, rs, "a/r1", f"2026-01-01T00:{i:02d}:00Z")
        seen += done
        partitions.append(lws.partition)
        lws.become_ready()
        down = sum(not v.available for v in lws.views())
        assert down <= 1, "more than maxUnavailable groups down"
        if rs.phase == "Complete":
            break
    assert rs.phase == "Complete" and [r.pod for r in rs.results] == ["srv-2", "srv-1", "srv-0"]
    assert all(r.warm for r in rs.results)
    assert lws.recreated == [2, 1, 0]  # each group restarted exactly once
    assert [a for a in seen if a.startswith("delete")] == ["delete:srv-2", "delete:srv-1", "delete:srv-0"]
    assert partitions[0] == 3 and all(a >= b for a, b in itertools.pairwise(partitions))  # only ever down
    assert partitions[-1] == 0
    assert group_rollout.partition_of(rs, 3) == 0
    canary_before_release = seen.index("canary:srv-1") < seen.index("delete:srv-1")
    assert canary_before_release


def test_the_new_template_is_applied_with_nothing_released() -> None:
    lws = Lws(replicas=2, target="a/")
    rs, done = step(lws, None, "a/r1", "2026-01-01T00:00:00Z")
    assert done == ["canary:srv-1"] and lws.recreated == []
    assert lws.partition == 2 and lws.target == "a/r1"  # new template, partition = replicas: nothing restarts


def test_a_cold_group_pauses_the_rollout_where_it_is() -> None:
    lws, rs = Lws(replicas=2, target="a/"), None
    for i in range(10):
        rs, _ = step(lws, rs, "a/r1", f"2026-01-01T00:{i:02d}:00Z", storage=0)
        lws.become_ready()
        if rs.phase == "Paused":
            break
    assert rs.phase == "Paused" and rs.reason == "ColdStart"
    assert lws.recreated == [1] and group_rollout.partition_of(rs, 2) == 1  # group 0 untouched
    rs, done = step(lws, rs, "a/r1", "2026-01-01T00:30:00Z")
    assert done == [] and lws.recreated == [1]


def test_a_pass_replayed_after_an_operator_crash_releases_nothing_twice() -> None:
    lws, rs = Lws(replicas=2, target="a/"), None
    rs, _ = step(lws, rs, "a/r1", "2026-01-01T00:00:00Z")  # canary sent, status written
    saved = rs
    rs, done = step(lws, rs, "a/r1", "2026-01-01T00:01:00Z")  # released; the operator dies before its status write
    assert done == ["delete:srv-1"] and lws.recreated == [1]
    rs, done = step(lws, saved, "a/r1", "2026-01-01T00:02:00Z")  # the next operator replays from the old status
    assert "delete:srv-1" not in done and lws.recreated == [1]  # group 1's members changed: it is already going
    lws.become_ready()
    for i in range(3, 20):
        rs, _ = step(lws, rs, "a/r1", f"2026-01-01T00:{i:02d}:00Z")
        lws.become_ready()
    assert rs.phase == "Complete" and lws.recreated == [1, 0]


def test_a_worker_recreated_without_its_group_is_found() -> None:
    pods = [pod(0, 0, "a/"), pod(0, 1, "a/", created="2026-01-01T00:00:01Z"),
            pod(1, 0, "a/", ready_since="2026-01-01T00:00:10Z"),
            pod(1, 1, "a/", ready=False, created="2026-01-01T00:05:00Z")]  # fmt: skip
    lone = group_rollout.lone_workers(pods)
    assert [(w.group, w.leader, w.worker) for w in lone] == [(1, "srv-1", "srv-1-1")]
    assert lone[0].leader_uid == pods[2]["metadata"]["uid"]


def test_a_worker_recreated_in_the_second_its_leader_turned_ready_is_found_unless_it_is_ready() -> None:
    """Whole-second timestamps (CI, 2026-12-05: the lone worker fell in its leader's Ready second and was missed)."""
    second = "2026-01-01T00:00:10Z"
    lone = [pod(0, 0, "a/", ready_since=second), pod(0, 1, "a/", ready=False, created=second)]
    assert [(w.group, w.worker) for w in group_rollout.lone_workers(lone)] == [(0, "srv-0-1")]
    joined = [pod(0, 0, "a/", ready_since=second), pod(0, 1, "a/", created=second, ready_since=second)]
    assert group_rollout.lone_workers(joined) == []
    before = [pod(0, 0, "a/", ready_since=second), pod(0, 1, "a/", ready=False, created="2026-01-01T00:00:09Z")]
    assert group_rollout.lone_workers(before) == []


def test_status_names_every_group_its_ready_nodes_their_disks_and_the_last_warm_check() -> None:
    from qwen_hicache import group_status
    from qwen_hicache import status_model as sm
    from qwen_hicache.diskusage import DiskUsage

    pods = [pod(0, 0, "a/"), pod(0, 1, "a/"), pod(1, 0, "a/"), pod(1, 1, "a/", ready=False)]
    usage = {"srv-0": DiskUsage(10, 3, cap_bytes=100, used_ratio=0.1, fingerprint="x"),
             "srv-0-1": DiskUsage(20, 5, cap_bytes=100, used_ratio=0.2), "srv-1-1": None}
    result = sm.RestartResult(pod="srv-0", warm=True, storage_tokens=4096)
    restart = sm.Restart(id="t", phase="Complete", results=[result])
    entries = [e.wire() for e in group_status.group_entries(NAME, pods, SIZE, 3, usage, restart)]
    assert [(e["group"], e["readyNodes"]) for e in entries] == [(0, 2), (1, 1), (2, 0)]
    assert entries[0]["nodes"][1] == {"node": 1, "pod": "srv-0-1", "ready": True, "diskUsedBytes": 20,
                                      "diskCapBytes": 100, "diskUsedRatio": 0.2, "diskPageFiles": 5}  # fmt: skip
    assert entries[0]["lastRestart"] == {"warm": True, "storageTokens": 4096}
    assert entries[2]["nodes"][0] == {"node": 0, "pod": "srv-2", "ready": False}
    typed = group_status.group_entries(NAME, pods, SIZE, 3, usage, restart)
    assert group_status.groups_summary(typed, SIZE) == "1/3 groups of 2 nodes ready"


def test_a_group_missing_when_the_target_changes_is_planned_in_its_turn_and_never_released_behind() -> None:
    """LWS is recreating group 1 (old revision, partition held) when the restart begins: it is planned like the
    others, nothing is taken down while it is missing, and the partition never drops below an unplanned group."""
    lws, rs = Lws(replicas=3, target="a/"), None
    rs, _ = step(lws, rs, "a/", "2026-01-01T00:00:00Z")  # the running server's record: Complete
    away = {k: lws.pods.pop(k) for k in [(1, 0), (1, 1)]}
    views = group_rollout.group_views(NAME, list(lws.pods.values()), SIZE, replicas=3)
    planned, actions = rollout.plan_rollout(rs, views, "a/r1", 3, POLICY, "2026-01-01T00:01:00Z")
    assert [e.pod for e in planned.in_flight] + planned.pending == ["srv-2", "srv-1", "srv-0"]
    assert actions == []  # one group is down already (maxUnavailable 1): nothing more goes down
    assert group_rollout.group_views(NAME, list(lws.pods.values()), SIZE) != views  # without replicas: no placeholder
    lws.pods.update(away)  # back, on the old revision: the rollout goes on from srv-2 down, each group once
    lws.become_ready()
    lws.apply("a/r1", group_rollout.partition_of(planned, 3))  # the new template, every group held
    for i in range(2, 40):
        planned, _ = step(lws, planned, "a/r1", f"2026-01-01T00:{i:02d}:00Z")
        lws.become_ready()
        if planned.phase == "Complete":
            break
    assert [r.pod for r in planned.results] == ["srv-2", "srv-1", "srv-0"] and lws.recreated == [2, 1, 0]


def test_a_group_carried_from_a_retargeted_rollout_is_requeued_behind_the_higher_groups() -> None:
    """A rollout is retargeted while group 0 is in flight (released, LWS recreating it) and group 1 is done. The
    new template is applied with every group held, so group 0 comes back on the old revision and is requeued.
    It must go behind group 1, which is now pending: if it went first, its release would lower the partition
    past group 1 and LWS would restart that group beside it, with no canary (the LWS SIGKILL e2e test's
    'results [0], done [0, 1]')."""
    carried = rollout.RestartEntry(pod="srv-0", step="WaitingReady", uid="old-0", since="2026-01-01T00:00:00Z",
                                   deleted_at="2026-01-01T00:00:00Z")  # fmt: skip
    prev = Restart(id="a/r0", phase="Rolling", pending=[], done=["srv-1"], in_flight=[carried], results=[],
                   started="2026-01-01T00:00:00Z", partition=0)  # fmt: skip
    pods = [pod(1, w, "a/r0") for w in range(SIZE)] + [pod(0, w, "a/") for w in range(SIZE)]  # 0: old revision
    rs, actions = rollout.plan_rollout(prev, group_rollout.group_views(NAME, pods, SIZE, replicas=2), "a/r1", 2,
                                       POLICY, "2026-01-01T00:01:00Z")  # fmt: skip
    assert rs.pending == ["srv-0"] and [e.pod for e in rs.in_flight] == ["srv-1"]
    assert [(a.kind, a.pod) for a in actions] == [("canary", "srv-1")]


def test_a_group_still_at_its_canary_when_the_rollout_is_retargeted_waits_for_the_higher_groups() -> None:
    """Retargeted while group 0 is at its canary (up, not yet released) and group 1 is done: group 0 is not
    carried ahead of group 1, whose release must come first."""
    pods = [pod(1, w, "a/r0") for w in range(SIZE)] + [pod(0, w, "a/") for w in range(SIZE)]
    views = group_rollout.group_views(NAME, pods, SIZE, replicas=2)
    canary = rollout.RestartEntry(pod="srv-0", step="Canary", uid=views[0].uid, since="2026-01-01T00:00:00Z")
    prev = Restart(id="a/r0", phase="Rolling", pending=[], done=["srv-1"], in_flight=[canary], results=[],
                   started="2026-01-01T00:00:00Z", partition=1)  # fmt: skip
    rs, actions = rollout.plan_rollout(prev, views, "a/r1", 2, POLICY, "2026-01-01T00:01:00Z")
    assert rs.pending == ["srv-0"] and [(a.kind, a.pod) for a in actions] == [("canary", "srv-1")]


def test_on_a_first_pass_a_group_still_forming_at_the_target_is_no_view_but_one_at_another_is() -> None:
    """No rollout record yet: a leader LWS made from the current template, its worker not yet made, is a group
    forming (left out, so no rollout starts at creation); a partial group made from another template, or a
    complete one, stays a view (a server re-created over older groups still rolls them)."""
    new, old = "c2/", "c1/"
    target = rollout.PodView.from_pod(pod(0, 0, new)).target
    pods = [pod(0, 0, new, ready=False), pod(1, 0, old), pod(2, 0, new), pod(2, 1, new)]
    views = group_rollout.group_views(NAME, pods, SIZE, forming_at=target)
    assert [(v.name, v.target) for v in views] == [(f"{NAME}-1", group_rollout.MIXED), (f"{NAME}-2", target)]
    assert [v.name for v in group_rollout.group_views(NAME, pods, SIZE)] == [f"{NAME}-{g}" for g in range(3)]
