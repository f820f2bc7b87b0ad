"""`ModelArguments` (how the LM loads: the flags ``hf-msv collect`` and ``hf-msv demo`` share) and what the
collection flags need without loading anything: dtype names, a named LM's budget and prompt format.

Imports no torch, so a command's ``--help`` is quick; `hf_msv.collect.lm` loads the LM.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..errors import MissingPathError, UserError
from ..registry import get_named_lm

DEFAULT_MAX_NEW_TOKENS = 4096
"""The sampling budget of an LM that is not registered with one (the paper's)."""

PROMPT_TEMPLATES = ("auto", "chat", "plain")

DTYPE_ALIASES = {
    "auto": "auto",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float64": "float64",
    "fp64": "float64",
    "double": "float64",
}
"""dtype names a flag takes (the usual spellings; case ignored) -> the torch name they mean."""


def dtype_name(value: str, flag: str, allowed: tuple[str, ...] | None = None) -> str:
    """The torch name of dtype `value` given to `flag` (``bf16`` -> ``bfloat16``), checked without importing torch.

    Args:
        value: a name of `DTYPE_ALIASES` (``torch.`` prefix and case ignored).
        flag: the flag, for the message (``--model-dtype``).
        allowed: the torch names this flag takes (default: all of `DTYPE_ALIASES`').

    Raises:
        UserError: a name that is no dtype, or one `flag` does not take.
    """
    allowed = allowed or tuple(dict.fromkeys(DTYPE_ALIASES.values()))
    name = DTYPE_ALIASES.get(str(value).strip().lower().removeprefix("torch."))
    if name not in allowed:
        spellings = [f"{n} ({', '.join(a for a, m in DTYPE_ALIASES.items() if m == n and a != n)})" for n in allowed]
        raise UserError(
            f"{flag} {value}: not a dtype it takes; one of " + ", ".join(s.replace(" ()", "") for s in spellings)
        )
    return name


def torch_dtype(name: str):
    """``"auto"``, or the `torch.dtype` of a `dtype_name` result."""
    if name == "auto":
        return name
    import torch

    return getattr(torch, name)


@dataclass
class ModelArguments:
    """How the LM is loaded (modelled on TRL's ``ModelConfig``; flags built from these fields by
    `transformers.HfArgumentParser`). `load_lm` takes it whole; `CollectConfig` and `DemoConfig` hold these fields.

    Args:
        model: LM directory, Hub id or a named LM (hf_msv.registry, e.g. testbed).
        revision: Branch, tag or commit of a Hub LM.
        trust_remote_code: Run the LM's own modeling code (an ``auto_map`` in its config), as transformers does.
        model_dtype: dtype to load the LM in: auto, bfloat16 (bf16), float16 (fp16), float32 (fp32), float64.
        attn_implementation: transformers' attention kernel (eager, sdpa, flash_attention_2, ...).
        device_map: accelerate's placement: auto, balanced, sequential, cpu, cuda:0, ..., or a JSON file mapping
            module names to devices ("cpu", "disk", 0, ...).
        offload_folder: Where modules placed on "disk" by ``device_map`` are written.
        load_in_4bit: Quantize to 4 bits with bitsandbytes (``transformers.BitsAndBytesConfig``).
        load_in_8bit: Quantize to 8 bits with bitsandbytes.
        gguf_file: A GGUF file inside ``model``, if it is a GGUF repository or directory.

    Raises:
        UserError: a dtype that is none of `DTYPE_ALIASES`, 4 and 8 bits at once, quantization without bitsandbytes
            installed, or a ``device_map`` file that is not a JSON object.
    """

    model: str | None = field(
        default=None,
        metadata={
            "help": "LM directory, Hub id or a named LM (hf_msv.registry, e.g. testbed). Required on the command line."
        },
    )
    revision: str | None = field(default=None, metadata={"help": "Branch, tag or commit of a Hub LM."})
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Run the LM's own modeling code (an auto_map in its config), as transformers does."},
    )
    model_dtype: str = field(
        default="auto",
        metadata={"help": "dtype to load the LM in: auto, bfloat16 (bf16), float16 (fp16), float32 (fp32), float64."},
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "transformers' attention kernel (eager, sdpa, flash_attention_2, ...)."}
    )
    device_map: str | None = field(
        default=None,
        metadata={
            "help": "accelerate's placement: auto, balanced, sequential, cpu, cuda:0, ..., or a JSON file mapping "
            'module names to devices ("cpu", "disk", 0, ...).'
        },
    )
    offload_folder: str | None = field(
        default=None, metadata={"help": 'Where modules placed on "disk" by --device-map are written.'}
    )
    load_in_4bit: bool = field(
        default=False, metadata={"help": "Quantize to 4 bits with bitsandbytes (transformers.BitsAndBytesConfig)."}
    )
    load_in_8bit: bool = field(default=False, metadata={"help": "Quantize to 8 bits with bitsandbytes."})
    gguf_file: str | None = field(
        default=None, metadata={"help": "A GGUF file inside --model, if it is a GGUF repository or directory."}
    )

    def __post_init__(self):
        # every check that needs no download runs here, when the flags are parsed, before any work
        self.model_dtype = dtype_name(self.model_dtype, "--model-dtype")
        if self.load_in_4bit and self.load_in_8bit:
            raise UserError("--load-in-4bit and --load-in-8bit: give one")
        if (self.load_in_4bit or self.load_in_8bit) and importlib.util.find_spec("bitsandbytes") is None:
            raise UserError("--load-in-4bit / --load-in-8bit quantize with bitsandbytes: pip install bitsandbytes")
        self.resolved_device_map()

    @classmethod
    def from_fields(cls, config) -> ModelArguments:
        """The `ModelArguments` of a config holding its fields (`CollectConfig`, `DemoConfig`)."""
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})

    def resolved_device_map(self) -> str | dict | None:
        """``device_map`` as ``from_pretrained`` takes it: a strategy or device name, or a JSON file's mapping.

        Raises:
            MissingPathError: a ``.json`` path that is no file.
            UserError: a file that is not a JSON object.
        """
        if self.device_map is None or not self.device_map.endswith(".json"):
            return self.device_map
        path = Path(self.device_map)
        if not path.is_file():
            raise MissingPathError(f"--device-map {path}: no such file")
        try:
            mapping = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise UserError(f"--device-map {path}: not JSON ({error})") from None
        if not isinstance(mapping, dict):
            raise UserError(f"--device-map {path}: expected a JSON object of module name -> device")
        return mapping

    def quantization_config(self):
        """The `transformers.BitsAndBytesConfig` of ``load_in_4bit`` / ``load_in_8bit``, else `None`."""
        if not (self.load_in_4bit or self.load_in_8bit):
            return None
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_4bit=self.load_in_4bit, load_in_8bit=self.load_in_8bit)

    def from_pretrained_kwargs(self, device=None) -> dict:
        """The keyword arguments of ``AutoModelForCausalLM.from_pretrained``.

        Args:
            device: where a quantized LM without ``device_map`` goes (bitsandbytes places weights while loading).
        """
        kwargs = {
            "revision": self.revision,
            "trust_remote_code": self.trust_remote_code,
            "dtype": torch_dtype(self.model_dtype),
            "attn_implementation": self.attn_implementation,
            "device_map": self.resolved_device_map(),
            "offload_folder": self.offload_folder,
            "quantization_config": self.quantization_config(),
            "gguf_file": self.gguf_file,
        }
        if kwargs["quantization_config"] is not None and kwargs["device_map"] is None:
            from ..utils import resolve_device

            kwargs["device_map"] = {"": str(resolve_device(device))}
        return {key: value for key, value in kwargs.items() if value is not None}


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


__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "DTYPE_ALIASES",
    "PROMPT_TEMPLATES",
    "ModelArguments",
    "default_max_new_tokens",
    "dtype_name",
    "resolve_prompt_template",
    "torch_dtype",
]
