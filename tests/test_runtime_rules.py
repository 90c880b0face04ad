"""The operator's restatements of runtime rules, checked against the runtime's own code (patched sglang 0.5.23).

- the flag table the operator ships equals the table built from the runtime's argparse parser now, and
  `runtime_flags.resolve` reads every token as that parser's `_parse_optional` does;
- the TP vs KV-heads rule is the runtime attention layer's own assertion, executed;
- the speculative rewrite is the runtime's own statement from `_handle_eagle_family`, executed.
A runtime upgrade that changes any of them fails here.
"""

from __future__ import annotations

import argparse
import ast
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from qwen_hicache import policies, runtime_flags
from qwen_hicache.geometry import resolve_geometry
from qwen_hicache.plan import parse_spec
from resources import DELETE, derived, variant

from harness.runtime_flags import TABLE, runtime_parser, table_from
from harness.sim.sglang_tree import patched_sglang_tree, tree_info


def _geometry_problems(spec: Any) -> list[policies.Problem]:
    return policies.geometry_problems(spec, resolve_geometry(spec.model))


@pytest.fixture(scope="module")
def tree() -> Path:
    return patched_sglang_tree()


@pytest.fixture(scope="module")
def parser(tree: Path) -> argparse.ArgumentParser:
    return runtime_parser(tree)


def test_shipped_flag_table_is_the_runtimes(parser: argparse.ArgumentParser, tree: Path) -> None:
    fresh = table_from(parser, tree_info(tree).get("series"))
    assert json.loads(TABLE.read_text()) == fresh, "regenerate with `python -m harness.runtime_flags`"


def _runtime_reads(parser: argparse.ArgumentParser, token: str) -> tuple[str | None, str | None]:
    """(dest, error) as the runtime's parser reads `token` as an option."""
    def fail(message: str) -> None:
        raise ValueError(message)

    parser.error = fail  # type: ignore[method-assign]
    try:
        got = parser._parse_optional(token)
    except ValueError as err:
        return None, "ambiguous" if "ambiguous" in str(err) else str(err)
    if isinstance(got, list):  # Python 3.12+: a list of candidates
        if len(got) > 1:
            return None, "ambiguous"
        got = got[0] if got else None
    if got is None:
        return None, None
    action = got[0]
    return (action.dest, None) if action is not None else (None, "unrecognized")


TOKENS = ["--tp-size", "--tensor-parallel-size", "--tp", "--tp-size=2", "--tensor-parallel-size=4", "--model",
          "--model-path", "--hicache-si", "--hicache-size=30", "--hicache-ra", "--enable-hicache", "--page",
          "--context-len", "--port", "--po", "--served", "--kv-cache", "--speculative-num-s", "--spec",
          "--config", "--no-such-flag", "--log-level", "-h", "--admin-api", "--enable-metr", "--hicache",
          "--mamba-ssm", "--max-mamba", "--dtype", "--quantization", "--revision", "value", "3"]


@pytest.mark.parametrize("token", TOKENS)
def test_tokens_resolve_as_the_runtime_parser_reads_them(parser: argparse.ArgumentParser, token: str) -> None:
    mine = runtime_flags.resolve(token)
    dest, error = _runtime_reads(parser, token)
    assert (mine.dest if mine else None, mine.error if mine else None) == (dest, error)


def test_every_alias_of_a_managed_flag_is_refused(parser: argparse.ArgumentParser) -> None:
    managed = policies._managed_dests(derived(variant()))
    aliases = [o for a in parser._actions if a.dest in managed for o in a.option_strings]
    assert "--tensor-parallel-size" in aliases and "--enable-hicache" in aliases and "--model" in aliases
    for alias in aliases:
        doc = variant(**{"spec.runtime.extraArgs": [alias, "1"]})
        reasons = [p.reason for p in policies.evaluate(derived(doc))]
        assert "ManagedFlagInExtraArgs" in reasons, alias


def _function(source: str, cls: str | None, name: str) -> ast.FunctionDef:
    mod = ast.parse(source)
    scope = next(n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == cls).body if cls else mod.body
    return next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)


def _statement(fn: ast.FunctionDef, *needles: str) -> str:
    """The one `if` statement of `fn` whose condition mentions every needle, as source."""
    found = [n for n in ast.walk(fn) if isinstance(n, ast.If) and all(x in ast.unparse(n.test) for x in needles)]
    assert len(found) == 1, f"runtime code changed: {len(found)} statements match {needles} in {fn.name}"
    return ast.unparse(found[0])


def test_tp_vs_kv_heads_is_the_runtime_attention_layers_rule(tree: Path) -> None:
    src = (tree / "sglang/srt/models/qwen3_5.py").read_text()
    stmt = _statement(_function(src, "Qwen3_5AttentionDecoderLayer", "__init__"), "total_num_kv_heads", ">=")
    code = compile("def check(self):\n" + textwrap.indent(stmt, "    "), "qwen3_5.py", "exec")
    scope: dict = {}
    exec(code, scope)  # the runtime's own statement
    for kv in range(1, 33):
        for tp in range(1, 17):
            try:
                scope["check"](SimpleNamespace(total_num_kv_heads=kv, kv_tp_size=tp))
                runtime_ok = True
            except AssertionError:
                runtime_ok = False
            assert (tp in policies._valid_tp_sizes(kv)) == runtime_ok, (kv, tp)


def test_tp_that_splits_kv_heads_unevenly_is_refused() -> None:
    spec = parse_spec(variant(**{"spec.runtime.tensorParallelSize": 3})["spec"])
    assert [p.reason for p in _geometry_problems(spec)] == ["TensorParallelSizeInvalid"]


def test_speculative_rewrite_is_the_runtimes_statement(tree: Path) -> None:
    src = (tree / "sglang/srt/arg_groups/speculative_hook.py").read_text()
    stmt = _statement(_function(src, None, "_handle_eagle_family"), "speculative_eagle_topk == 1",
                      "speculative_num_draft_tokens")
    code = compile("def rewrite(cfg, server_args, declare_resolution, logger):\n" + textwrap.indent(stmt, "    "),
                   "speculative_hook.py", "exec")
    scope: dict = {}
    exec(code, scope)
    quiet = SimpleNamespace(warning=lambda *a, **k: None)
    for steps in range(1, 17):
        for topk in range(1, 5):
            for draft in range(1, 21):
                declared: dict = {}
                cfg = SimpleNamespace(speculative_eagle_topk=topk, speculative_num_steps=steps,
                                      speculative_num_draft_tokens=draft)
                scope["rewrite"](cfg, None, lambda _sa, _src, d=declared, **kw: d.update(kw), quiet)
                rewritten = declared.get("speculative_num_draft_tokens", draft) != draft
                doc = variant(**{"spec.runtime.speculative": {"algorithm": "NEXTN", "numSteps": steps,
                                                              "eagleTopk": topk, "numDraftTokens": draft},
                                 "spec.runtime.pageSize": 64})
                spec = parse_spec(doc["spec"])
                refused = policies.speculative_rewritten(SimpleNamespace(spec=spec)) is not None  # type: ignore[arg-type]
                assert refused == rewritten, (steps, topk, draft)


def test_geometry_without_kv_layers_is_refused_not_crashed() -> None:
    doc = variant(**{"spec.model.geometry": {"fullAttentionLayers": 0}, "spec.runtime.speculative": DELETE})
    spec = parse_spec(doc["spec"])
    assert [p.reason for p in _geometry_problems(spec)] == ["NoKVLayers"]


def _module_parts(source: str, *names: str) -> dict:
    """Execute the named top-level assignments and functions of a runtime module, nothing else."""
    mod = ast.parse(source)
    keep = [n for n in mod.body if (isinstance(n, ast.FunctionDef) and n.name in names) or (
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in n.targets))]
    assert len(keep) == len(names), f"runtime code changed: found {len(keep)} of {names}"
    scope: dict = {}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "runtime", "exec"), scope)
    return scope


TEXT_CONFIGS = [
    {"max_position_embeddings": 262144},
    {"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"max_position_embeddings": 32768, "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 8192}},
    {"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
    {"seq_length": 4096, "max_position_embeddings": 131072},
    {"model_max_length": 65536},
]


def test_context_length_is_derived_as_the_runtime_does(tree: Path) -> None:
    from qwen_hicache.geometry import CONTEXT_LENGTH_KEYS, max_context_length

    src = (tree / "sglang/srt/utils/hf_transformers/common.py").read_text()
    runtime = _module_parts(src, "CONTEXT_LENGTH_KEYS", "get_context_length")
    assert tuple(runtime["CONTEXT_LENGTH_KEYS"]) == CONTEXT_LENGTH_KEYS
    for text in TEXT_CONFIGS:
        attrs = {k: None for k in (*CONTEXT_LENGTH_KEYS, "rope_scaling")} | text
        assert max_context_length(text) == runtime["get_context_length"](SimpleNamespace(**attrs)), text


def test_longer_context_override_reads_env_as_the_runtime(tree: Path) -> None:
    src = (tree / "sglang/srt/environ.py").read_text()
    parse = ast.unparse(_function(src, "EnvBool", "parse"))
    scope: dict = {}
    exec(parse, scope)
    assert f"{policies.ALLOW_LONGER_CONTEXT_ENV} = EnvBool(False)" in src
    for value in ["1", "true", "TRUE", "Yes", "y", "0", "no", "false", "on", ""]:
        try:
            runtime = scope["parse"](None, value)
        except ValueError:
            runtime = False  # the runtime cannot start with it: the refusal stands
        assert (value.lower() in policies._TRUE) == runtime, value


def test_context_longer_than_the_model_is_refused_unless_overridden() -> None:
    geometry = {"maxContextLength": 262144}
    doc = variant(**{"spec.model.geometry": geometry, "spec.runtime.contextLength": 524288})
    assert [p.reason for p in _geometry_problems(parse_spec(doc["spec"]))] == ["ContextLengthTooLong"]
    doc["spec"]["runtime"]["env"] = [{"name": policies.ALLOW_LONGER_CONTEXT_ENV, "value": "1"}]
    assert _geometry_problems(parse_spec(doc["spec"])) == []


def test_an_admin_key_that_starts_with_a_dash_reaches_the_runtime_as_the_key(parser: argparse.ArgumentParser) -> None:
    """The rendered args, `$(VAR)` expanded as the kubelet does, parsed by the runtime's own parser: a key from
    an older Secret (`token_urlsafe` starts with `-` about once in 64) is still the key, not a flag."""
    from qwen_hicache.launch import ADMIN_KEY_ENV

    from harness.sim.kubelet import expand

    key = "-Zx3_rF0q"
    args = [expand(a, {ADMIN_KEY_ENV: key}) for a in derived(variant()).args]
    parser.error = lambda message: (_ for _ in ()).throw(ValueError(message))  # type: ignore[method-assign]
    assert parser.parse_args(args).admin_api_key == key
    with pytest.raises(ValueError):  # the two-argument form it replaces: the key read as an unknown flag
        parser.parse_args([*(a for a in args if not a.startswith("--admin-api-key")), "--admin-api-key", key])
