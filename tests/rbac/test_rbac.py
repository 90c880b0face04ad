"""Install the chart with helm, run the operator as its ServiceAccount, and check RBAC both ways:
every API call the operator made is granted by the chart's rules (or is a tolerated denial), and every
granted rule was used or is justified in justified.yaml (kept next to this test)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from rbaclib import Call, Grant, Recorded, allowed, needs_no_rbac, used

pytestmark = pytest.mark.integration
JUSTIFIED = yaml.safe_load((Path(__file__).parent / "justified.yaml").read_text())


def test_every_operator_call_is_granted_by_the_chart(recorded: Recorded) -> None:
    grants, calls, urls = recorded
    tolerated = set(JUSTIFIED["tolerated_denials"])
    missing = sorted(str(c) for c in calls if not allowed(c, grants) and _key(c) not in tolerated)
    assert not missing, "the operator made calls the chart does not grant:\n" + "\n".join(missing)
    assert not sorted(u for u in urls if not needs_no_rbac(u)), urls


def test_every_granted_rule_is_used_or_justified(recorded: Recorded) -> None:
    grants, calls, _ = recorded
    unused = sorted({g.key for g in grants if not used(g, calls)} - set(JUSTIFIED["unused_grants"]))
    assert not unused, "granted but never used (drop the rule or justify it in justified.yaml):\n" + "\n".join(unused)


def test_justifications_name_real_rules() -> None:
    """Every justified entry is a rule some chart configuration grants (no stale excuses)."""
    from chart.chartlib import render
    from rbaclib import rule_keys

    granted = rule_keys(render(sets=("nodeSizingCheck.enabled=true",)))
    stale = sorted(set(JUSTIFIED["unused_grants"]) - granted)
    assert not stale, f"justified.yaml names rules the chart does not grant: {stale}"
    assert set(JUSTIFIED["tolerated_denials"]) <= granted, "a tolerated denial must be grantable by an option"


def _key(call: Call) -> str:
    return Grant(call.verb, call.group, call.resource, "").key
