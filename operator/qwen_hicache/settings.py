"""The operator process's settings: every `QWEN_HICACHE_*` knob in one frozen object, read once at start-up
(crate-operator's `Config.load()`), documented here and passed to whatever needs it. Nothing else reads the
environment for the operator's own behaviour, and importing a module never does.

(The pods' variables, `QWEN_HICACHE_PORT`, `..._FINGERPRINT` and the like, are the runtime's interface, set in the
pod template; they are not settings of the operator.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PREFIX = "QWEN_HICACHE_"


class SettingsError(ValueError):
    """A setting the environment spells wrong; the message names the variable."""


class Settings(BaseModel):
    """How the operator runs (timings, thread pools, optional permissions). `QWEN_HICACHE_<NAME>` sets a field."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    resync_seconds: float = Field(60.0, gt=0)
    """Period of the level-based resync of every resource (repairs drift nobody reported; a no-op writes nothing)."""
    rollout_poll_seconds: float = Field(2.0, gt=0)
    """How often a running rollout looks at its pods (they restart on their own schedule)."""
    rollout_full_step_seconds: float = Field(10.0, gt=0)
    """A rollout whose resource and pods are unchanged still takes a full step this often (timeouts)."""
    rollout_workers: int = Field(8, ge=1)
    """Threads for rollout steps and child events, apart from Kopf's handler threads."""
    create_workers: int = Field(2, ge=1)
    """Threads for the first reconcile of new resources only (never queued behind updates of others)."""
    workers: int = Field(8, ge=1)
    """Kopf's handler threads (create, update, resume, resync)."""
    node_cache_seconds: float = Field(30.0, ge=0)
    """How long a listing of nodes (for the memory fit) is reused; nodes change rarely."""
    node_sizing_check: bool = True
    """List nodes to check that a sized pod fits the smallest one; the chart turns this off unless it grants
    `list nodes` (then the operator does not even ask)."""

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> Settings:
        """From the environment (`QWEN_HICACHE_RESYNC_SECONDS=30`, ...); unset variables keep the defaults."""
        env = os.environ if env is None else env
        given = {name: env[PREFIX + name.upper()] for name in cls.model_fields if PREFIX + name.upper() in env}
        try:
            return cls.model_validate(given)
        except ValidationError as err:
            raise SettingsError("; ".join(f"{PREFIX}{str(e['loc'][0]).upper()}: {e['msg']}"
                                          for e in err.errors())) from None

    def env(self) -> dict[str, str]:
        """The variables that reproduce these settings in another process (an operator started as a command)."""
        return {PREFIX + name.upper(): str(value).lower() if isinstance(value, bool) else str(value)
                for name, value in self.model_dump().items()}
