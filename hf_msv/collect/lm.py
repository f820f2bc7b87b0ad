"""The LM and its inputs: loading an LM and problems by name, turning a problem into a prompt, fingerprinting an LM."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from ..data.problems import Problem
from ..utils import resolve_device


def load_problems(spec: str) -> list[Problem]:
    """Problems from a spec: ``testbed:<split>:<n>[:<seed>]`` (the default testbed's; ``testbed-v1:...``: v1's),
    ``<benchmark>[:<n>]`` (a name of `hf_msv.data.BENCHMARKS`, first n problems), or a ``.jsonl`` file of
    ``{"id", "question", "gold"}``."""
    from ..data.problems import BENCHMARKS, load_benchmark
    from ..testbed.tasks import TESTBED_LM_NAMES, get_task

    parts = spec.split(":")
    if parts[0] in TESTBED_LM_NAMES:
        if len(parts) not in (3, 4):
            raise ValueError(f"{parts[0]} spec is {parts[0]}:<split>:<n>[:<seed>]")
        seed = int(parts[3]) if len(parts) == 4 else 0
        return get_task(parts[0]).generate_problems(parts[1], int(parts[2]), seed=seed)
    if parts[0] in BENCHMARKS:
        problems = load_benchmark(parts[0])
        return problems[: int(parts[1])] if len(parts) > 1 else problems
    path = Path(spec)
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [Problem(id=str(r["id"]), question=r["question"], gold=str(r["gold"]), source=r.get("source", path.stem),
                        meta=r.get("meta", {})) for r in rows]
    raise ValueError(f"unknown problem spec {spec!r}: use testbed[-v1]:<split>:<n>[:<seed>], one of "
                     f"{sorted(BENCHMARKS)}[:<n>], or a .jsonl file")


def load_lm(name: str, dtype: str = "auto", device=None, gguf_file: str | None = None):
    """``(model, tokenizer)`` in eval mode: ``"testbed"`` is the shipped default testbed LM (v2, also
    ``"testbed-v2"``), ``"testbed-v1"`` the first testbed's (where one is missing, a FileNotFoundError says how to
    train it), anything else goes to ``AutoModelForCausalLM`` / ``AutoTokenizer`` (`gguf_file`: a GGUF file inside
    that repo or directory).
    `device` (``None`` or ``"auto"``) defaults to this process's accelerate device: the GPU when there is one."""
    from ..testbed.tasks import TESTBED_LM_NAMES

    device = resolve_device(device)
    torch_dtype = None if dtype == "auto" else getattr(torch, dtype)
    if name in TESTBED_LM_NAMES:
        from ..testbed import load_testbed_lm

        return load_testbed_lm(device=device, dtype=torch_dtype, task=TESTBED_LM_NAMES[name])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype if dtype == "auto" else torch_dtype, **kwargs)
    return model.to(device).eval(), tokenizer


def prompt_builder(template, tokenizer) -> Callable[[Problem], str | list]:
    """``"auto"`` (chat template if the tokenizer has one, else the question), ``"chat"``, ``"plain"``,
    ``"testbed"`` (`hf_msv.testbed.format_prompt`), a string with ``{question}``, or a callable."""
    if callable(template):
        return template
    if template == "auto":
        template = "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    if template == "chat":
        return lambda p: [{"role": "user", "content": p.question}]
    if template == "plain":
        return lambda p: p.question
    if template == "testbed":
        from ..testbed import format_prompt

        return format_prompt
    if "{question}" not in template:
        raise ValueError(f"prompt_template must be auto/chat/plain/testbed or contain '{{question}}', got {template!r}")
    # str.replace, not str.format: templates often contain LaTeX braces such as \boxed{}.
    return lambda p: template.replace("{question}", p.question)


def template_name(template) -> str:
    """How a prompt template is recorded in a collection's settings: the string, or a callable's qualified name."""
    if isinstance(template, str):
        return template
    return f"{getattr(template, '__module__', '')}.{getattr(template, '__qualname__', '')}"


def lm_info(model, tokenizer) -> dict:
    """What identifies the LM a collection was sampled from (stored in its settings, so resuming checks it)."""
    config = model.config.get_text_config()
    return {"lm_name_or_path": getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", ""),
            "lm_model_type": getattr(model.config, "model_type", None),
            "lm_hidden_size": config.hidden_size,
            "lm_num_attention_heads": getattr(config, "num_attention_heads", None),
            "lm_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "lm_weights_fingerprint": weights_fingerprint(model),
            "tokenizer": getattr(tokenizer, "name_or_path", "")}


def weights_fingerprint(model) -> str:
    """A short hash of every parameter's name, shape and first values: a retrained checkpoint under the same path
    must not resume a collection made with the old one. Exact values, so it is the same on every device."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            digest.update(f"{name}{tuple(p.shape)}{p.flatten()[:8].float().tolist()}".encode())
    return digest.hexdigest()[:16]


__all__ = ["lm_info", "load_lm", "load_problems", "prompt_builder", "weights_fingerprint"]
