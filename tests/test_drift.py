"""No-op detection: server-added fields are ignored, our own changes (including removals) are not."""

from __future__ import annotations

from qwen_hicache.drift import HASH_ANNOTATION, is_applied, is_subset, with_hash


def _obj(**spec: object) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "n"}, "spec": spec}


def test_server_defaults_do_not_count_as_drift() -> None:
    desired = with_hash(_obj(ports=[{"port": 1}]))
    live = {**desired, "metadata": {**desired["metadata"], "uid": "u", "resourceVersion": "7"},
            "spec": {"ports": [{"port": 1, "protocol": "TCP"}], "clusterIP": "10.0.0.1"}}
    assert is_applied(desired, live)


def test_changed_value_or_missing_object_is_drift() -> None:
    desired = with_hash(_obj(ports=[{"port": 1}]))
    assert not is_applied(desired, None)
    live = {**desired, "spec": {"ports": [{"port": 2}]}}
    assert not is_applied(desired, live)


def test_a_removed_field_changes_the_hash() -> None:
    before, after = with_hash(_obj(a=1, b=2)), with_hash(_obj(a=1))
    assert before["metadata"]["annotations"][HASH_ANNOTATION] != after["metadata"]["annotations"][HASH_ANNOTATION]
    assert not is_applied(after, before)


def test_lists_compare_by_length_and_position() -> None:
    assert not is_subset([1], [1, 2])
    assert not is_subset([1, 2], [2, 1])
    assert is_subset([{"a": 1}], [{"a": 1, "b": 2}])


def test_quantities_compare_by_value_as_the_api_server_stores_them():
    from qwen_hicache.drift import is_subset

    assert is_subset({"cpu": "2000m", "memory": "1Gi"}, {"cpu": "2", "memory": "1073741824"})
    assert not is_subset({"cpu": "2500m"}, {"cpu": "2"})
    assert not is_subset({"name": "2000m"}, {"name": "a"})
