"""The LM and its inputs: LMs and problems by name (`hf_msv.registry`), prompts, prompt tokens, LM fingerprints.

See ``docs/collection.md``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from ..data.problems import Problem
from ..data.sources import load_problems
from ..errors import MissingPathError, UserError, check_checkpoint_dir
from ..registry import get_named_lm
from ..utils import resolve_device
from .model_arguments import (
    DEFAULT_MAX_NEW_TOKENS,
    PROMPT_TEMPLATES,
    ModelArguments,
    default_max_new_tokens,
    resolve_prompt_template,
)

logger = logging.getLogger(__name__)


def _remote_code_error(args: ModelArguments, error: Exception) -> UserError | None:
    """transformers' refusal to run an LM's own code without ``trust_remote_code``, as one line naming the flag."""
    if args.trust_remote_code or "trust_remote_code" not in str(error):
        return None
    return UserError(
        f"the LM {args.model!r} runs its own modeling code (auto_map in its config): pass --trust-remote-code "
        "(trust_remote_code=True) if you trust it"
    )


def _checkpoint_path(args: ModelArguments) -> str:
    """Where `args.model` is loaded from: a named LM's directory, else the name itself (checked if a local path)."""
    if not args.model:
        raise UserError("no LM to load: give --model (ModelArguments.model)")
    named = get_named_lm(args.model)
    if named is None:  # a local path that is not a checkpoint: say so, not transformers' "Repo id must be in ..."
        check_checkpoint_dir(args.model, "LM", required=None if args.gguf_file else "config.json")
        return args.model
    if not (Path(named.path) / "config.json").is_file():
        raise MissingPathError(
            f"no checkpoint of the named LM {args.model!r} at {named.path}"
            + (f"; {named.missing_hint}" if named.missing_hint else "")
        )
    return str(named.path)


def load_lm(args: ModelArguments | str, device=None, *, dtype: str | None = None, gguf_file: str | None = None):
    """An LM and its tokenizer, in eval mode.

    Args:
        args: how to load it (`ModelArguments`), or just its name: a named LM of `hf_msv.registry` (e.g.
            ``"testbed"``), a local directory or a Hub id; all are loaded with ``AutoModelForCausalLM`` /
            ``AutoTokenizer``.
        device: ``None`` or ``"auto"``: this process's accelerate device (the GPU when there is one); ignored with a
            ``device_map`` (accelerate places the modules).
        dtype: with a name: ``ModelArguments.model_dtype``.
        gguf_file: with a name: ``ModelArguments.gguf_file``.

    Returns:
        ``(model, tokenizer)``.

    Raises:
        MissingPathError: (a `FileNotFoundError`) a named LM whose directory holds no checkpoint (the message says
            how to make one), or a local path (`hf_msv.errors.looks_like_path`) that is not a directory or has no
            ``config.json``.
        NotADirectoryPathError: (a `NotADirectoryError`) a local path that is a file.
        UserError: a checkpoint transformers cannot find or read (its `OSError` or `ValueError` as the cause), or
            one with its own modeling code without ``trust_remote_code``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if isinstance(args, str):
        args = ModelArguments(model=args, model_dtype=dtype or "auto", gguf_file=gguf_file)
    path = _checkpoint_path(args)
    kwargs = args.from_pretrained_kwargs(device)
    tokenizer_kwargs = {k: kwargs[k] for k in ("revision", "trust_remote_code", "gguf_file") if k in kwargs}
    logger.info("loading the LM %s from %s with %s", args.model, path, kwargs)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **tokenizer_kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as error:  # transformers' words for a checkpoint it cannot read or find
        if isinstance(error, UserError):
            raise
        raise (_remote_code_error(args, error) or UserError(f"cannot load the LM {args.model!r}: {error}")) from error
    if "device_map" not in kwargs:  # a dispatched LM stays where accelerate put each module
        model = model.to(resolve_device(device))  # pyright: ignore[reportArgumentType]  (transformers' wrapped `to` loses its self type)
    elif model.device.type == "meta":  # generation feeds its inputs to model.device: an offloaded first module
        raise UserError(
            f"--device-map {args.device_map} offloads the LM's first module (its input embedding) to the cpu or "
            "disk: keep it on a device (device_map auto does)"
        )
    return model.eval(), tokenizer


def prompt_builder(template: str | Callable[[Problem], str | list], tokenizer) -> Callable[[Problem], str | list]:
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
            digest.update(f"{name}{tuple(p.shape)}{_first_values(model, name, p)}".encode())
    return digest.hexdigest()[:16]


def _first_values(model, name: str, parameter) -> list[float]:
    """The first 8 values of parameter `name`; one that accelerate offloaded (on the meta device, its values on the
    cpu or disk) is read through its module's hook, so an offloaded LM has the fingerprint of the same LM whole."""
    if parameter.device.type != "meta":
        return parameter.flatten()[:8].float().tolist()
    from accelerate.utils import align_module_device

    owner, _, attribute = name.rpartition(".")
    module = model.get_submodule(owner)
    with align_module_device(module, torch.device("cpu")):
        return getattr(module, attribute).flatten()[:8].float().tolist()


__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "ModelArguments",
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
