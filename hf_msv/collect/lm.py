"""The LM and its inputs: LMs and problems by name (`hf_msv.registry`), prompts, prompt tokens, LM fingerprints.

See ``docs/collection.md``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from ..data.problems import BENCHMARKS, DATA_DIR_ENV, Problem, load_benchmark
from ..errors import MissingPathError, UserError, check_checkpoint_dir
from ..registry import get_named_lm, named_lms
from ..utils import resolve_device

DEFAULT_MAX_NEW_TOKENS = 4096
"""The sampling budget of an LM that is not registered with one (the paper's)."""

PROMPT_TEMPLATES = ("auto", "chat", "plain")


def _jsonl_problems(path: Path) -> list[Problem]:
    problems = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            problems.append(
                Problem(
                    id=str(row["id"]),
                    question=row["question"],
                    gold=str(row["gold"]),
                    source=row.get("source", path.stem),
                    meta=row.get("meta", {}),
                )
            )
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise UserError(
                f'{path} line {number}: expected a JSON object with "id", "question" and "gold" '
                f"({type(e).__name__}: {e})"
            ) from None
    if not problems:
        raise UserError(f"{path} holds no problem")
    return problems


def _named_problems(spec: str, parts: list[str]) -> list[Problem]:
    lm = get_named_lm(parts[0])
    if lm.problems is None:
        raise UserError(f"the named LM {parts[0]!r} has no problem generator; use a benchmark or a .jsonl file")
    if len(parts) not in (3, 4) or not all(p.isdigit() for p in parts[2:]):
        raise UserError(f"problem spec {spec!r}: use {parts[0]}:<split>:<n>[:<seed>]")
    return lm.problems(parts[1], int(parts[2]), int(parts[3]) if len(parts) == 4 else 0)


def load_problems(spec: str) -> list[Problem]:
    """Problems from a spec.

    Args:
        spec: ``<named LM>:<split>:<n>[:<seed>]`` (an LM of `hf_msv.registry` with a problem generator, e.g.
            ``testbed:train:64``), ``<benchmark>[:<n>]`` (a name of `hf_msv.data.BENCHMARKS`, its first n
            problems, read from ``$HF_MSV_DATA_DIR``), or a ``.jsonl`` file of ``{"id", "question", "gold"}`` lines.

    Returns:
        The `Problem`s.

    Raises:
        ValueError: an unknown or malformed spec, or a malformed ``.jsonl`` line.
        FileNotFoundError: a benchmark whose file is not in the data directory.
    """
    parts = spec.split(":")
    if get_named_lm(parts[0]) is not None:
        return _named_problems(spec, parts)
    if parts[0] in BENCHMARKS:
        if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise UserError(f"problem spec {spec!r}: use {parts[0]}[:<n>]")
        try:
            problems = load_benchmark(parts[0])
        except FileNotFoundError as e:
            raise MissingPathError(
                f"{e} Or give --problems your own .jsonl file with one "
                '{"id": ..., "question": ..., "gold": ...} object per line.'
            ) from None
        return problems[: int(parts[1])] if len(parts) > 1 else problems
    path = Path(spec)
    if path.is_file():
        return _jsonl_problems(path)
    named = [n for n in named_lms()]
    raise UserError(
        f"unknown problem spec {spec!r} (no such file): use a .jsonl file of "
        '{"id", "question", "gold"} lines, one of '
        f"{sorted(BENCHMARKS)}[:<n>] (files in "
        f"${DATA_DIR_ENV}), or <named LM>:<split>:<n>[:<seed>] with a named LM of {named}"
    )


def load_lm(name: str, dtype: str = "auto", device=None, gguf_file: str | None = None):
    """An LM and its tokenizer, in eval mode.

    Args:
        name: a named LM of `hf_msv.registry` (e.g. ``"testbed"``), a local directory or a Hub id; all are loaded
            with ``AutoModelForCausalLM`` / ``AutoTokenizer``.
        dtype: ``"auto"`` or a torch dtype name (``"bfloat16"``, ``"float32"``, ...).
        device: ``None`` or ``"auto"``: this process's accelerate device (the GPU when there is one).
        gguf_file: a GGUF file inside that repository or directory.

    Returns:
        ``(model, tokenizer)``.

    Raises:
        MissingPathError: (a `FileNotFoundError`) a named LM whose directory holds no checkpoint (the message says
            how to make one), or a local path (`hf_msv.errors.looks_like_path`) that is not a directory or has no
            ``config.json``.
        NotADirectoryPathError: (a `NotADirectoryError`) a local path that is a file.
        UserError: a checkpoint transformers cannot find or read (its `OSError` or `ValueError` as the cause).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    named = get_named_lm(name)
    path = name
    if named is not None:
        if not (Path(named.path) / "config.json").is_file():
            raise MissingPathError(
                f"no checkpoint of the named LM {name!r} at {named.path}"
                + (f"; {named.missing_hint}" if named.missing_hint else "")
            )
        path = str(named.path)
    else:  # a local path that is not a checkpoint: say so, not transformers' "Repo id must be in the form ..."
        check_checkpoint_dir(name, "LM", required=None if gguf_file else "config.json")
    device = resolve_device(device)
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype if dtype == "auto" else getattr(torch, dtype), **kwargs
        )
    except (OSError, ValueError) as error:  # transformers' words for a checkpoint it cannot read or find
        if isinstance(error, UserError):
            raise
        raise UserError(f"cannot load the LM {name!r}: {error}") from error
    return model.to(device).eval(), tokenizer


def default_max_new_tokens(name: str | None) -> int:
    """The sampling budget of LM `name`: a named LM's ``max_new_tokens`` (e.g. the length cap it was trained at), else
    `DEFAULT_MAX_NEW_TOKENS`."""
    named = get_named_lm(name)
    return named.max_new_tokens if named is not None and named.max_new_tokens else DEFAULT_MAX_NEW_TOKENS


def resolve_prompt_template(template, lm_name: str | None):
    """``"auto"`` for a named LM with a prompt format is its name (so the recorded template names the format);
    anything else is returned as it is."""
    named = get_named_lm(lm_name)
    if template == "auto" and named is not None and named.prompt is not None:
        return named.name
    return template


def prompt_builder(template, tokenizer) -> Callable[[Problem], str | list]:
    """How a problem becomes a prompt.

    Args:
        template: ``"auto"`` (chat messages if the tokenizer has a chat template, else the question), ``"chat"``,
            ``"plain"``, the name of a named LM with a prompt format (e.g. ``"testbed"``), a string containing
            ``{question}``, or a callable ``Problem -> str | chat messages``.
        tokenizer: the LM's tokenizer.

    Raises:
        ValueError: a string that is none of these.
    """
    if callable(template):
        return template
    if template == "auto":
        template = "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    if template == "chat":
        return lambda p: [{"role": "user", "content": p.question}]
    if template == "plain":
        return lambda p: p.question
    named = get_named_lm(template)
    if named is not None and named.prompt is not None:
        return named.prompt
    if not isinstance(template, str) or "{question}" not in template:
        raise UserError(
            f"prompt_template must be one of {list(PROMPT_TEMPLATES)}, a named LM's name, or a string "
            f"containing '{{question}}', got {template!r}"
        )
    # str.replace, not str.format: templates often contain LaTeX braces such as \boxed{}.
    return lambda p: template.replace("{question}", p.question)


def prompt_token_ids(prompt: str | list, tokenizer, chat_template: str | None = None) -> list[int]:
    """The tokens ``MSVSession.generate`` feeds for `prompt`: chat messages rendered with the chat template
    (`chat_template`, default the tokenizer's; generation prompt added) without extra special tokens, text with the
    tokenizer's special tokens."""
    if isinstance(prompt, (list, tuple)):
        text = tokenizer.apply_chat_template(
            list(prompt), tokenize=False, add_generation_prompt=True, chat_template=chat_template
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


def template_name(template) -> str:
    """How a prompt template is recorded in a collection's settings: the string, or a callable's qualified name."""
    if isinstance(template, str):
        return template
    return f"{getattr(template, '__module__', '')}.{getattr(template, '__qualname__', '')}"


def lm_info(model, tokenizer) -> dict:
    """What identifies the LM a collection was sampled from (stored in its settings, so resuming checks it)."""
    config = model.config.get_text_config()
    return {
        "lm_name_or_path": getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", ""),
        "lm_model_type": getattr(model.config, "model_type", None),
        "lm_hidden_size": config.hidden_size,
        "lm_num_attention_heads": getattr(config, "num_attention_heads", None),
        "lm_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "lm_weights_fingerprint": weights_fingerprint(model),
        "tokenizer": getattr(tokenizer, "name_or_path", ""),
    }


def weights_fingerprint(model) -> str:
    """A short hash of every parameter's name, shape and first values: a retrained checkpoint under the same path
    must not resume a collection made with the old one. Exact values, so it is the same on every device."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            digest.update(f"{name}{tuple(p.shape)}{p.flatten()[:8].float().tolist()}".encode())
    return digest.hexdigest()[:16]


__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "default_max_new_tokens",
    "lm_info",
    "load_lm",
    "load_problems",
    "prompt_builder",
    "prompt_token_ids",
    "resolve_prompt_template",
    "template_name",
    "weights_fingerprint",
]
