"""Builders of the LM-loading tests (tests/test_lm_loading.py): the testbed LM saved as a checkpoint with its own
modeling code (``auto_map``), device maps of the testbed LM, and a tiny collection run through ``hf-msv collect``."""

from __future__ import annotations

import json
from pathlib import Path

from hf_msv.collect.lm import load_lm

CONFIGURATION = """from transformers import LlamaConfig


class TinyRemoteConfig(LlamaConfig):
    model_type = "tiny_remote"
"""

MODELING = """from transformers import LlamaForCausalLM

from .configuration_tiny_remote import TinyRemoteConfig


class TinyRemoteForCausalLM(LlamaForCausalLM):
    config_class = TinyRemoteConfig
"""

# What `collect_args` collects: the testbed LM on 2 testbed problems, 2 samples each, 64 tokens at most.
COLLECTION = {
    "problems": "testbed:train:2",
    "num_samples": "2",
    "max_new_tokens": "64",
    "checker": "exact",
    "prompt_template": "testbed",
}


def save_remote_code_lm(directory: Path) -> Path:
    """The testbed LM saved in `directory` as a ``tiny_remote`` model whose classes live in the checkpoint's own
    ``configuration_tiny_remote.py`` / ``modeling_tiny_remote.py`` (loadable only with ``trust_remote_code``)."""
    model, tokenizer = load_lm("testbed", device="cpu")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "configuration_tiny_remote.py").write_text(CONFIGURATION)
    (directory / "modeling_tiny_remote.py").write_text(MODELING)
    config = json.loads((directory / "config.json").read_text())
    config.update(
        model_type="tiny_remote",
        architectures=["TinyRemoteForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
            "AutoModelForCausalLM": "modeling_tiny_remote.TinyRemoteForCausalLM",
        },
    )
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def lm_module_names() -> list[str]:
    """The top-level modules of the testbed LM, one per decoder layer (what a per-layer ``device_map`` names)."""
    model, _ = load_lm("testbed", device="cpu")
    layers = [f"model.layers.{i}" for i in range(model.config.num_hidden_layers)]
    return ["model.embed_tokens", *layers, "model.norm", "model.rotary_emb", "lm_head"]


def write_device_map(path: Path, offloaded: tuple[str, ...] = (), to: str = "disk") -> Path:
    """A JSON ``device_map`` of the testbed LM: every module on the cpu, `offloaded` ones on `to`."""
    path.write_text(json.dumps({name: to if name in offloaded else "cpu" for name in lm_module_names()}))
    return path


def collect_args(output_dir: Path, *extra: str, **changes: str) -> list[str]:
    """``hf-msv collect`` arguments of the testbed LM's tiny collection (`COLLECTION`, with `changes`) into
    `output_dir`, then `extra`."""
    options = {"model": "testbed", **COLLECTION, **changes}
    args = ["collect", "--output-dir", str(output_dir), "--no-progress"]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", value]
    return [*args, *extra]
