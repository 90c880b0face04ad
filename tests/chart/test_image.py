"""The operator image's Dockerfile, parsed (no docker here): pinned base, hash-locked dependencies,
non-root user, nothing installed or downloaded at run time."""

from __future__ import annotations

import re
import shlex
import tomllib

from chart.chartlib import ROOT

DOCKERFILE = ROOT / "images" / "operator" / "Dockerfile"
LOCK = ROOT / "images" / "operator" / "requirements.lock"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]


def _final_stage() -> list[tuple[str, str]]:
    ins = _instructions()
    last_from = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    return ins[last_from:]


def test_every_base_image_is_pinned_by_digest() -> None:
    args = dict(a.split("=", 1) for op, a in _instructions() if op == "ARG" and "=" in a)
    bases = [a.split()[0] for op, a in _instructions() if op == "FROM"]
    assert len(bases) >= 2, "a build stage and a slim final stage"
    for base in bases:
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        assert re.fullmatch(r"[\w./:-]+@sha256:[0-9a-f]{64}", resolved), f"not pinned by digest: {resolved}"


def test_runs_as_a_numeric_non_root_user() -> None:
    users = [a for op, a in _final_stage() if op == "USER"]
    assert users, "the final stage must set USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or int(gid) > 0)


def test_dependencies_install_only_from_the_hash_lock() -> None:
    installs = [a for op, a in _instructions() if op == "RUN" and "pip install" in a]
    assert installs, "dependencies are installed with pip"
    for cmd in installs:
        assert "--require-hashes" in cmd and "requirements.lock" in cmd, cmd
    assert not any(op == "RUN" for op, _ in _final_stage()), "the final stage only copies the built tree"


def test_no_network_or_installs_at_run_time() -> None:
    final = _final_stage()
    env = " ".join(a for op, a in final if op == "ENV")
    assert "PIP_NO_INDEX=1" in env and "PYTHONDONTWRITEBYTECODE=1" in env  # read-only root filesystem
    for op, a in final:
        if op in ("ENTRYPOINT", "CMD"):
            words = " ".join(shlex.split(a.strip("[]").replace(",", " ")))
            assert not re.search(r"\b(pip|curl|wget|apt-get|uv)\b", words), a
    entrypoint = next(a for op, a in final if op == "ENTRYPOINT")
    assert "qwen_hicache.cli" in entrypoint and "run" in entrypoint


def test_lock_pins_every_dependency_with_hashes() -> None:
    text = LOCK.read_text()
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s\\]+)", text, flags=re.M)
    assert pins
    blocks = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", text.split("\n", 2)[-1])
    assert all("--hash=sha256:" in b for b in blocks if "==" in b), "every pin needs its hashes"
    locked = {name.lower().replace("_", "-") for name, _ in pins}
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    direct = {re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}
    assert direct <= locked, f"not in the lock (re-run the command in its header): {direct - locked}"
