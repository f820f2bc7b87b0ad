"""Loading trained verifiers for evaluation: checkpoints, named entries by mode, and ``NAME=PATH`` specs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["load_verifier", "VerifierEntry", "load_verifiers", "parse_verifier_specs"]


def load_verifier(path_or_model):
    """A saved MSV or Probe checkpoint (``model_type`` "msv" / "msv_probe") in eval mode; models pass through."""
    if isinstance(path_or_model, torch.nn.Module):
        return path_or_model.eval()
    path = Path(path_or_model)
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type == "msv_probe":
        from ..modeling_probe import ProbeVerifier

        return ProbeVerifier.from_pretrained(path).eval()
    if model_type == "msv":
        from ..modeling_msv import MSVVerifier

        return MSVVerifier.from_pretrained(path).eval()
    raise ValueError(f"{path} holds a {model_type!r} model, not an MSV or Probe verifier")


@dataclass(eq=False)
class VerifierEntry:
    """One named verifier: its checkpoints by mode and what it is (Probe, MSV₁ = single-sequence; MSV_M)."""

    name: str
    models: dict = field(default_factory=dict)  # mode -> model
    kind: str = "msv"  # "msv" | "probe"
    num_sequences: int = 1  # M (1 for the Probe)

    @property
    def single_sequence(self) -> bool:
        return self.kind == "probe" or self.num_sequences == 1

    def model_for(self, setting: str):
        """(model, mode it runs in) for a setting, or (None, None) when this verifier does not take part."""
        if setting in self.models:
            return self.models[setting], setting
        if setting == "terminal" and "streaming" in self.models:
            return self.models["streaming"], "streaming"
        return None, None


def load_verifiers(verifiers: Mapping) -> list[VerifierEntry]:
    """`VerifierEntry`s of name -> checkpoint (or model), or name -> {"terminal": ..., "streaming": ...}; each
    checkpoint's mode is read from its config and must match the declared one."""
    out = []
    for name, spec in verifiers.items():
        specs = spec if isinstance(spec, Mapping) else {None: spec}
        entry = VerifierEntry(name)
        for declared, target in specs.items():
            model = load_verifier(target)
            mode = model.config.mode
            if declared is not None and declared != mode:
                raise ValueError(f"verifier {name!r}: the {declared!r} checkpoint was trained in {mode!r} mode")
            if mode in entry.models:
                raise ValueError(f"verifier {name!r} has two {mode} checkpoints")
            kind = "probe" if model.config.model_type == "msv_probe" else "msv"
            m = 1 if kind == "probe" else int(model.config.num_sequences)
            if entry.models and (kind, m) != (entry.kind, entry.num_sequences):
                raise ValueError(f"verifier {name!r} mixes checkpoints of different kinds or sizes")
            entry.models[mode], entry.kind, entry.num_sequences = model, kind, m
        out.append(entry)
    return out


def parse_verifier_specs(specs: Sequence[str]) -> dict:
    """``NAME=PATH`` items (repeat a NAME for its terminal and streaming checkpoints) -> the `verifiers` mapping."""
    out: dict = {}
    for spec in specs:
        if "=" not in spec:
            raise ValueError(f"--verifier takes NAME=PATH, got {spec!r}")
        name, path = spec.split("=", 1)
        mode = json.loads((Path(path) / "config.json").read_text()).get("mode", "streaming")
        out.setdefault(name, {})[mode] = path
    return out
