"""The thin client's error handling: answers that must not crash a reconcile."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import api_exception
from qwen_hicache import kube as kube_mod


class _Nodes:
    def __init__(self, status: int) -> None:
        self.status = status

    def get(self, **_: Any) -> Any:
        raise api_exception(ApiException(status=self.status, reason="refused"))


def _client() -> kube_mod.Kube:
    """A Kube whose calls never reach a server (its node reads are patched per test)."""
    k = kube_mod.Kube.__new__(kube_mod.Kube)
    k._nodes, k.node_cache_seconds, k.node_sizing_check = {}, 30.0, True
    return k


@pytest.mark.parametrize("status", [400, 403, 404, 422])
def test_node_list_the_server_refuses_skips_the_node_check(monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    k = _client()
    monkeypatch.setattr(kube_mod.Kube, "_resource", lambda self, v, kind: _Nodes(status))
    assert k.list_nodes({"bad key": "x"}) == []


def test_other_node_list_errors_still_surface(monkeypatch: pytest.MonkeyPatch) -> None:
    k = _client()
    monkeypatch.setattr(kube_mod.Kube, "_resource", lambda self, v, kind: _Nodes(500))
    with pytest.raises(Exception):  # noqa: B017 - a server error is retried by the reconcile's error path
        k.list_nodes({})


def test_discovery_never_reads_or_writes_the_shared_tmp_file(
    kube_api: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The library's default cache is one file per API server in $TMPDIR, written in place; another process
    reading it half-written logged `load cache error` (the corpus test's zero-error rule caught it in CI)."""
    import hashlib
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"osrcp-{hashlib.md5(kube_api.configuration.host.encode()).hexdigest()}.json"
    shared.write_text("")  # what a reader sees while another process writes it
    k = kube_mod.Kube(kube_api)
    assert k.get("v1", "Namespace", None, "default") is not None
    assert not [r for r in caplog.records if "cache" in r.getMessage()]
    assert [p.name for p in tmp_path.iterdir()] == [shared.name] and shared.read_text() == ""


def test_responses_stay_the_plain_json_and_list_items_get_their_kind() -> None:
    from kubernetes.dynamic.resource import ResourceInstance

    def listing() -> dict[str, Any]:
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                "items": [{"metadata": {"name": "a"}}, {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "b"}}]}

    assert kube_mod.plain(None, listing()) == ResourceInstance(None, listing()).to_dict()
    assert kube_mod.plain(None, {"kind": "PodList", "items": None})["items"] == []


def test_a_kind_the_server_does_not_serve_is_refused_like_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A multi-node server on a cluster without the LeaderWorkerSet CRD: discovery's own error (not an API error)
    would escape the pass; the pass reports this one in status instead (reconciler catches API_ERRORS)."""
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    class _Resources:
        def get(self, **kw: Any) -> Any:
            raise ResourceNotFoundError(f"No matches found for {kw}")

    k = _client()
    k.dyn = type("Dyn", (), {"resources": _Resources()})()
    with pytest.raises(kube_mod.API_ERRORS) as err:
        k.get("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "ns", "srv")
    assert isinstance(err.value, kube_mod.NotServed)
    assert err.value.reason == "NotServed"
    assert "does not serve LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)" in err.value.body
