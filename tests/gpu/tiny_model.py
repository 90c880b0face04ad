"""A tiny checkpoint of sglang 0.5.23's ``qwen4_exp`` architecture (Qwen3.8-Flash-Next's), built offline.

    python3 tests/gpu/tiny_model.py --sglang-site SITE OUT_DIR

Writes ``config.json``, ``model.safetensors`` (bf16, random, seed 0) and a byte-level BPE tokenizer
(``tokenizer.json`` + ``tokenizer_config.json``) trained on ``tests/gpu/data/tiny_corpus.txt``. The same
inputs give the same bytes (``manifest.json`` lists the sha256 of every file).

The architecture is the real one at a small size: 8 decoder layers in Flash-Next's 3:1 pattern (GDN linear
attention x3, then a full-attention layer with the QSA compressed indexer), hyper-connections (hc_count 4),
the PLE n-gram embedding at layer 2 (its short-conv window in layer 1), a small MoE with a shared expert,
and one MTP draft layer. Weight names and shapes are not written down here: they come from the runtime's
own model classes (``Qwen4ExpForConditionalGeneration``, ``Qwen4ExpForCausalLMMTP``) instantiated on the
``meta`` device, mapped back to checkpoint names through the model's own ``stacked_params_mapping``
(q/k/v -> qkv_proj, gate/up -> gate_up_proj, in_proj_qkv/in_proj_z -> in_proj_qkvz, in_proj_b/a ->
in_proj_ba, experts -> the fused expert tensors), so ``load_weights`` consuming every tensor is the proof
(``tests/gpu/test_tiny_model.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "data" / "tiny_corpus.txt"
SEED = 0
VOCAB = 4096
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|video_pad|>",
           "<|vision_start|>", "<|vision_end|>"]  # fmt: skip
LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]


# `--scale wide`: the same 8 layers at Flash-Next's own widths (hidden 2560, 16 query heads, 16/48 GDN key/value
# heads, PLE at the hidden width; tests/data/hf/qwen4_exp/config.json), 8 experts of 1024 plus a 4096 shared
# expert: about 1.3 B parameters, so a cold 8k-token prefill costs real compute and TTFT cold vs warm measures
# the cache rather than the server's fixed per-request overheads. KV geometry (2 KV heads x 256, 2 full layers)
# is the tiny model's; the GDN state per slot is Flash-Next's per layer.
WIDE = {"hidden_size": 2560, "num_attention_heads": 16, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 4096, "intermediate_size": 4096,
        "indexer_n_heads": 16, "ple_embed_dim": 2560}  # fmt: skip
# `--scale deep`: the wide model at Flash-Next's own depth, 48 layers (36 GDN, 12 full attention with QSA): a cold
# prefill costs what the real model's does per token in attention and GDN layers (the MoE is the wide one's), and a
# restore moves what the real model's does per rank-0 token (KV and index of 12 layers, 36 GDN states).
DEEP = {**WIDE, "num_hidden_layers": 48, "layer_types": LAYER_TYPES * 12}
# `--scale deep-full-index`: the deep model with an indexer budget of 8,192 tokens (2,048 compressed blocks, the
# other top-k the runtime has, sgl_kernel's fast_topk_v2): a prompt under 8,192 tokens keeps every block, so no
# top-k decides. Above its k the radix select places its picks by atomicAdd (kernels/jit/csrc/elementwise/
# fast_topk.cuh), an order that changes the sparse attention's sums from run to run; at or below k it writes them
# in order (naive_topk). A diagnostic: Flash-Next selects 512 blocks.
DEEP_FULL_INDEX = {**DEEP, "indexer_budget": 8192}
SCALES = {"tiny": {}, "wide": WIDE, "deep": DEEP, "deep-full-index": DEEP_FULL_INDEX}
ROUTER = ".mlp.gate.weight"  # an MoE router's checkpoint name ends so (Qwen2MoeSparseMoeBlock.gate)


def text_config(scale: str = "tiny") -> dict:
    """Flash-Next's text config (tests/data/hf/qwen4_exp/config.json) with every width scaled down (`tiny`), at its
    own widths (`wide`), or at its own widths and depth (`deep`)."""
    return {**_tiny_text(), **SCALES[scale]}


def _tiny_text() -> dict:
    return {
        "model_type": "qwen4_exp_text",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 8,
        "layer_types": LAYER_TYPES * 2,
        "full_attention_interval": len(LAYER_TYPES),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 6,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "mtp_num_hidden_layers": 1,
        "indexer_n_heads": 4,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 128,
        "indexer_budget": 2048,
        "indexer_compress_ratio": 4,
        "hc_count": 4,
        "hc_lowrank": 32,
        "ple_layer_ids": [2],
        "ple_embed_dim": 256,
        "ple_conv_kernel_size": 4,
        "ngram_size": 3,
        "heads_per_ngram": 8,
        "ngram_vocab_size_base": 1024,
        "make_ngram_vocab_size_divisible_by": 128,
        "ple_offload_embedding": True,
        "ple_offload_backend": "pinned",
        "split_ngram_parts": 4,
        "vocab_size": VOCAB,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
        "rms_norm_eps": 1e-6,
        "eos_token_id": 0,
        "max_position_embeddings": 65536,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def config(scale: str = "tiny") -> dict:
    text = text_config(scale)
    return {
        "architectures": ["Qwen4ExpForConditionalGeneration"],
        "model_type": "qwen4_exp",
        "language_model_only": True,
        "tie_word_embeddings": False,
        "text_config": text,
        "vision_config": {"depth": 1, "hidden_size": 64, "out_hidden_size": text["hidden_size"]},
        "image_token_id": SPECIAL.index("<|image_pad|>"),
        "video_token_id": SPECIAL.index("<|video_pad|>"),
        "vision_start_token_id": SPECIAL.index("<|vision_start|>"),
        "vision_end_token_id": SPECIAL.index("<|vision_end|>"),
        "eos_token_id": 0,
        "dtype": "bfloat16",
    }


def build_tokenizer(out: Path) -> None:
    """Byte-level BPE trained on the shipped corpus; special tokens take ids 0..6 (eos = 0)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    text = CORPUS.read_text()
    tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "bos_token": None, "unk_token": None, "model_max_length": 65536, "chat_template": template,
        "clean_up_tokenization_spaces": False,
    }, indent=1) + "\n")  # fmt: skip


def write_config(out: Path, scale: str = "tiny") -> None:
    (out / "config.json").write_text(json.dumps(config(scale), indent=1) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 0, "do_sample": False}) + "\n")


# ---- weights: names and shapes from the runtime's own classes -------------------------------------------------
# The inverse of Qwen4ExpForConditionalGeneration.load_weights' stacked_params_mapping: a fused runtime parameter
# -> the checkpoint tensors it is assembled from, split along dim 0 by the module's own output_sizes.
STACKED = {
    "qkv_proj": ["q_proj", "k_proj", "v_proj"],
    "gate_up_proj": ["gate_proj", "up_proj"],
    "in_proj_qkvz": [("in_proj_qkv", 3), "in_proj_z"],
    "in_proj_ba": ["in_proj_b", "in_proj_a"],
}


def _split(name: str, shape: tuple, module) -> list[tuple[str, tuple]]:
    leaf_mod = name.rsplit(".", 2)[-2]
    parts = STACKED.get(leaf_mod)
    if parts is None or "mlp.experts" in name:
        return [(name, shape)]
    sizes = list(getattr(module, "output_sizes", None) or [])
    if leaf_mod == "qkv_proj" and len(sizes) != 3:
        kv = module.num_kv_heads * module.head_size * getattr(module, "tp_size", 1)
        sizes = [shape[0] - 2 * kv, kv, kv]
    out, i = [], 0
    for part in parts:
        ckpt, n = (part if isinstance(part, tuple) else (part, 1))
        rows = sum(sizes[i:i + n])
        i += n
        out.append((name.replace(f".{leaf_mod}.", f".{ckpt}."), (rows, *shape[1:])))
    if sum(r[1][0] for r in out) != shape[0]:
        raise ValueError(f"{name}: output_sizes {sizes} do not add up to {shape}")
    return out


def checkpoint_layout(model, mtp) -> dict[str, tuple[tuple, str]]:
    """Checkpoint name -> (shape, dtype) for the target and the MTP draft, from the instantiated (meta) models."""
    import torch

    text = model.config
    parts = int(getattr(text, "split_ngram_parts", 512))
    out: dict[str, tuple[tuple, str]] = {}
    for src, prefix_from, prefix_to in ((model, "model.", "model.language_model."), (mtp, "model.", "mtp.")):
        for name, param in src.named_parameters():
            if src is mtp and (name.startswith("lm_head.") or name == "model.embed_tokens.weight"):
                continue  # the draft shares the target's embedding and head
            mod = src.get_submodule(name.rsplit(".", 1)[0])
            dtype = "float32" if param.dtype == torch.float32 else "bfloat16"
            if name.endswith(".experts.w13_weight") or name.endswith(".experts.w2_weight"):
                ck = name.replace("experts.w13_weight", "experts.gate_up_proj")
                ck = ck.replace("experts.w2_weight", "experts.down_proj")
                pieces = [(ck, tuple(param.shape))]
            elif name.endswith(".ngram_embedding.weight"):
                rows, dim = param.shape
                size = (rows + parts - 1) // parts
                base = name[: -len(".weight")]
                pieces = [(f"{base}.shard_{k}.weight", (min(size, rows - k * size), dim)) for k in range(parts)
                          if k * size < rows]  # fmt: skip
            else:
                pieces = _split(name, tuple(param.shape), mod)
            for ck, shape in pieces:
                if ck.startswith(prefix_from):
                    ck = prefix_to + ck[len(prefix_from):]
                elif src is mtp:
                    ck = "mtp." + ck
                out[ck] = (shape, dtype)
    return out


def _values(name: str, shape: tuple, dtype: str, device: str = "cpu", flat_router: bool = False):
    """Seeded per tensor name (CPU: the same bytes everywhere; cuda: fast for the wide model, same on one GPU kind).

    flat_router: the MoE routers' weights are zero, so every token's top-k is the first k experts (ties go to the
    lower index) and the expert compute is unchanged; a random router is a cliff: bf16 noise between a full prefill
    and one that reuses a cached prefix flips a token's experts, and the random-weight model's output with it."""
    import torch

    if flat_router and name.endswith(ROUTER):
        return torch.zeros(shape, dtype=getattr(torch, dtype))

    seed = int(hashlib.sha256(f"{SEED}:{name}".encode()).hexdigest()[:15], 16)
    g = torch.Generator(device=device).manual_seed(seed)
    kw = {"generator": g, "device": device}
    if name.endswith("A_log"):
        t = torch.empty(shape, device=device).uniform_(1.0, 16.0, generator=g).log()
    elif name.endswith("dt_bias"):
        t = torch.zeros(shape, device=device)
    elif "norm" in name.rsplit(".", 1)[0].rsplit(".", 1)[-1] or name.endswith("norm.weight"):
        t = 1.0 + 0.02 * torch.randn(shape, **kw)
    elif name == "lm_head.weight":
        t = 0.25 * torch.randn(shape, **kw)  # peaky logits: greedy tokens are not near-ties
    else:
        t = 0.02 * torch.randn(shape, **kw)
    return t.to(getattr(torch, dtype)).contiguous().cpu()


def runtime_models(site: Path, model_dir: Path, ple_offload: bool, device: str = "meta"):
    """The runtime's target and MTP classes for this config, on the meta device (server args published at TP 1)."""
    sys.path.insert(0, str(site))
    import torch
    from sglang.srt import runtime_context as rc
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.server_args import prepare_server_args

    sa = prepare_server_args(["--model-path", str(model_dir), "--tp-size", "1", "--page-size", "64",
                              "--skip-tokenizer-init", "--speculative-algorithm", "NEXTN",
                              "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4",
                              "--speculative-eagle-topk", "1"])  # fmt: skip
    rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, gpu_id=0))
    if not ps.model_parallel_is_initialized():
        port = 29000 + os.getpid() % 1000
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        ps.init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                        local_rank=0, backend=backend)  # fmt: skip
        ps.initialize_model_parallel(backend=backend)
    mc = ModelConfig.from_server_args(sa)
    mc.hf_config.text_config.ple_offload_embedding = ple_offload
    from sglang.srt.models.qwen4_exp import Qwen4ExpForConditionalGeneration
    from sglang.srt.models.qwen4_exp_mtp import Qwen4ExpForCausalLMMTP

    default = torch.get_default_dtype()
    torch.set_default_dtype(mc.dtype)  # as the runtime's loader builds them: bf16 but what it keeps in fp32
    try:
        with torch.device(device):
            return Qwen4ExpForConditionalGeneration(mc.hf_config, None), Qwen4ExpForCausalLMMTP(mc.hf_config, None), mc
    finally:
        torch.set_default_dtype(default)


def write_weights(site: Path, out: Path, device: str = "cpu", flat_router: bool = False) -> dict:
    from safetensors.torch import save_file

    model, mtp, _ = runtime_models(site, out, ple_offload=False)
    layout = checkpoint_layout(model, mtp)
    if flat_router:
        routers = sum(n.endswith(ROUTER) for n in layout)
        if not routers:
            raise SystemExit(f"--flat-router: no '{ROUTER}' tensor in the runtime's layout")
        print(f"flat router: {routers} router weights zero")
    tensors = {name: _values(name, shape, dtype, device, flat_router)
               for name, (shape, dtype) in sorted(layout.items())}  # fmt: skip
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return layout


def check_load(site: Path, out: Path, device: str) -> dict:
    """Load the checkpoint with the runtime's own load_weights into models on `device`; every parameter must be
    written (values compared) and every checkpoint tensor consumed."""
    import torch
    from safetensors.torch import load_file

    model, mtp, _ = runtime_models(site, out, ple_offload=False, device=device)
    ckpt = load_file(str(out / "model.safetensors"))
    loaded = set(model.load_weights(iter(ckpt.items())))
    loaded_mtp = set(mtp.load_weights(iter(ckpt.items()), is_mtp=True))
    missing = sorted(n for n, _ in model.named_parameters() if n not in loaded)
    shared = ("lm_head.weight", "model.embed_tokens.weight")  # the draft shares the target's
    missing_mtp = sorted(n for n, _ in mtp.named_parameters() if n not in loaded_mtp and n not in shared)
    probe = "model.language_model.layers.0.linear_attn.in_proj_z.weight"
    same = None
    if probe in ckpt:
        mod = model.get_submodule("model.layers.0.linear_attn.in_proj_qkvz")
        same = bool(torch.equal(mod.weight[-ckpt[probe].shape[0]:].cpu(), ckpt[probe]))
    return {"tensors": len(ckpt), "target_params": sum(1 for _ in model.named_parameters()),
            "missing": missing, "missing_mtp": missing_mtp, "in_proj_z_roundtrip": same}


def manifest(out: Path) -> dict:
    files = sorted(p.name for p in out.iterdir() if p.is_file() and p.name != "manifest.json")
    m = {"seed": SEED, "files": {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in files}}
    (out / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--sglang-site", type=Path, help="the patched runtime tree (needed for the weights)")
    ap.add_argument("--no-weights", action="store_true", help="config and tokenizer only (CPU, no runtime)")
    ap.add_argument("--check", default="", help="after writing, load with load_weights on this device (cpu, cuda)")
    ap.add_argument("--check-only", default="", help="only load the checkpoint in OUT with load_weights on this device")
    ap.add_argument("--scale", choices=tuple(SCALES), default="tiny",
                    help="wide: Flash-Next's own widths (WIDE); deep: and its 48 layers (DEEP); deep-full-index: "
                         "and an indexer budget of 8,192 tokens (DEEP_FULL_INDEX)")
    ap.add_argument("--values-device", default="cpu", help="where the seeded random weights are drawn (cpu, cuda)")
    ap.add_argument("--flat-router", action="store_true", help="zero MoE router weights (see _values)")
    args = ap.parse_args()
    if args.check_only:
        res = check_load(args.sglang_site, args.out, args.check_only)
        print(json.dumps(res))
        return 1 if res["missing"] or res["missing_mtp"] else 0
    args.out.mkdir(parents=True, exist_ok=True)
    write_config(args.out, args.scale)
    build_tokenizer(args.out)
    if not args.no_weights:
        if not args.sglang_site:
            ap.error("--sglang-site is needed for the weights")
        layout = write_weights(args.sglang_site, args.out, args.values_device, args.flat_router)
        print(f"{len(layout)} checkpoint tensors, {sum(_numel(s) for s, _ in layout.values()):,} values")
    m = manifest(args.out)
    if args.check:
        res = check_load(args.sglang_site, args.out, args.check)
        print(json.dumps(res))
        if res["missing"] or res["missing_mtp"]:
            return 1
    print(json.dumps(m))
    return 0


def _numel(shape: tuple) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


if __name__ == "__main__":
    sys.exit(main())
