"""Patch 0003: queued storage backups are written at graceful shutdown, bounded.

runtime_probe.shutdown_drain drives HybridCacheController's real backup thread
against a real HiCacheFile directory: four page writes (0.25 s each) are queued,
then UnifiedRadixCache.release_host_resources -- the last step of the scheduler's
graceful exit -- runs. Files present when it returns are what survives the exit.
"""

from __future__ import annotations

N_QUEUED = 4


def test_graceful_release_writes_every_queued_page_before_pools_go(probes: dict):
    out = probes["patched"]["shutdown_drain"]["graceful"]
    assert out["written_at_exit"] == N_QUEUED
    assert out["written_when_pools_released"] == [N_QUEUED]  # drained before the host pools are unregistered
    assert out["thread_alive"] is False


def test_parent_drops_queued_pages_at_shutdown(probes: dict):
    out = probes["parent"]["shutdown_drain"]["graceful"]
    assert out["written_at_exit"] < N_QUEUED and out["thread_alive"] is True, out


def test_drain_is_bounded_by_the_timeout(probes: dict):
    out = probes["patched"]["shutdown_drain"]["bounded"]  # SGLANG_HICACHE_STORAGE_DRAIN_TIMEOUT=0.3
    assert 0 < out["written_at_exit"] < N_QUEUED
    assert out["seconds"] < 0.3 + 0.25 + 0.5  # deadline + the write in progress + slack
    assert out["thread_alive"] is False


def test_stop_without_drain_is_unchanged(probes: dict):
    """reset()/detach() stop the threads with no drain deadline: same as the parent."""
    stop = "stop_without_drain"
    assert probes["patched"]["shutdown_drain"][stop] == probes["parent"]["shutdown_drain"][stop] == {"written": 1}


def test_sigkill_grace_covers_a_longer_drain_budget(probes: dict):
    """The operator passes its flush budget as the drain timeout; the tokenizer must not SIGKILL mid-drain."""
    patched, parent = probes["patched"]["exit_grace"], probes["parent"]["exit_grace"]
    assert patched["None"] == patched["8"] == patched["0"] == 15.0  # default unchanged
    assert patched["120"] == 127.0 and patched["used_for_the_kill_deadline"] is True
    assert parent["120"] == 15.0  # the parent kills a 120 s drain after 15 s


def test_flush_is_deferred_until_no_hicache_transfer_is_in_flight(probes: dict):
    """preStop's `/flush_cache?timeout=N` is right only because of this runtime check; an upgrade that drops any
    of the four conditions (or answers the deferred flush before they clear) fails here."""
    for tree in ("patched", "parent"):
        out = probes[tree]["flush_idle"]
        assert "error" not in out, out.get("error")
        assert out["idle_when_nothing_in_flight"] is True
        for name in ("ongoing_write_through", "ongoing_load_back", "ongoing_prefetch", "ongoing_backup"):
            assert out[f"idle_with_{name}"] is False, (tree, name)
        assert out["answered_at_once"] is False  # deferred, not refused, while a storage backup is in flight
        assert out["flushed_while_backup_in_flight"] == 0
        assert out["flushed_after_backup_acked"] == 1 and out["reply"] == [True]
