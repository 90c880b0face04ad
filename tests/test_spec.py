"""The typed spec accepts the example and refuses each kind of nonsense with a specific message."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from qwen_hicache.plan import format_validation_error, parse_spec
from qwen_hicache.spec import QwenHiCacheServerSpec
from resources import BAD_SPECS, example, variant


def test_example_is_valid_and_keeps_its_values() -> None:
    spec = parse_spec(example()["spec"])
    assert spec.runtime.tensor_parallel_size == 2
    assert spec.hicache.host_memory_per_rank_gb == 30
    assert spec.hicache.disk.enabled and spec.hicache.disk.size == "600Gi"
    assert spec.model.profile == "qwen3.8-flash-next"


def test_defaults_are_the_runtime_defaults() -> None:
    minimal = {
        "model": {"weights": {"claimName": "w"}, "servedName": "m", "revision": "abcdef0"},
        "runtime": {"image": "img"},
    }
    spec = parse_spec(minimal)
    assert (spec.runtime.tensor_parallel_size, spec.runtime.page_size, spec.replicas) == (1, 64, 1)
    assert (spec.hicache.write_policy, spec.hicache.mem_layout, spec.hicache.io_backend) == (
        "write_through", "page_first", "kernel")
    assert not spec.hicache.disk.enabled
    assert (spec.nodes_per_replica, spec.nodes, spec.runtime.dist_init_port) == (None, 1, None)
    assert "nodesPerReplica" not in spec.wire()  # unset stays unset: the config hash of existing servers is kept


@pytest.mark.parametrize(("case", "changes", "fragment"), BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_is_refused_with_a_specific_message(case: str, changes: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_spec(variant(**changes)["spec"])
    assert fragment in format_validation_error(err.value)


def test_wire_form_round_trips() -> None:
    spec = parse_spec(example()["spec"])
    assert parse_spec(spec.wire()) == spec


def test_values_computed_once_follow_a_copy_with_changed_fields() -> None:
    spec = QwenHiCacheServerSpec.model_validate(variant(**{"spec.replicas": 2})["spec"])
    assert spec.router_on and spec.nodes == 1
    off = spec.model_copy(update={"router": spec.router.model_copy(update={"enabled": False}),
                                  "nodes_per_replica": 2})
    assert not off.router_on and off.nodes == 2 and spec.router_on and spec == spec.model_copy()
