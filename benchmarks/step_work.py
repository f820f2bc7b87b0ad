"""Host-side work per decode step outside the LM forward: what makes a launch-bound GPU decode slower than plain
``generate``, counted on any machine.

On a GPU at decode sizes a step's wall time is mostly the host launching kernels, and a host sync (a read of a
device value: ``.item()``, ``bool(t)``, ``.tolist()``, ``nonzero``, a blocking host-to-device copy) makes the host
wait for the device before it can launch more. Both are counted here, outside the LM's forward (the same forward in
every run), on a tiny random Qwen2 with ``generation_gpu.py``'s schedule (N rows, each forced to "Wait" every
150–300 steps, 12-token scripted answers, EOS banned) and an MSV of the same width:

* ``ops_per_step``: aten operators dispatched outside the forward, views left out (each launches at least one
  kernel on a GPU);
* ``syncs_per_step``: operators that read a device value on the host (``_local_scalar_dense``: ``item``, ``bool``,
  ``int``; ``nonzero``, ``masked_select``) plus ``tolist`` / ``numpy`` / ``cpu`` calls;
* ``host_to_device_per_step``: ``torch.tensor(..., device=...)`` calls (a blocking copy on CUDA).

for plain ``generate``, the hooked loop without delimiters (``hook``) and the full MSV run (``msv``), each divided by
the decode steps; for the MSV run also the verifier's operators and syncs per scoring call. Machine-independent: the
counts depend neither on the LM's size nor on the device.

``forward_host``: host milliseconds of one decoding forward of a 28-layer LM at a tiny width (where the host's work
dominates, as on a GPU at decode sizes), plain, and ÷ plain with masked cache slots (a branch row hides its
left-out delimiter), with hidden states returned (a branch answers), and both. Machine-dependent, ratios in one run.

    python benchmarks/step_work.py [--quick] [--num-sequences 64] [--steps 512]

Last line: JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections import Counter

import torch

# generation_overhead.py sits beside this file (benchmarks/ is sys.path[0] when run as a script).
from _report import rounded
from generation_overhead import (
    ScriptedAnswers,
    build_tokenizer,
    forced_runs,
    lm_config,
    random_lm,
    tiny_scheduled_lm,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from hf_msv import MSVConfig, MSVVerifier
from hf_msv.generation.caches import cache_argument, output_cache

SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"}
HOST_READS = {"tolist", "numpy", "cpu"}


class StepWork(TorchDispatchMode):
    """Counts dispatched operators and host reads outside `module`'s forward (`inside=True`: within it)."""

    def __init__(self, module, inside: bool = False):
        super().__init__()
        self.ops, self.syncs, self.host_to_device = Counter(), Counter(), 0
        self.depth, self.want_inside, self.calls = 0, inside, 0
        self.handles = [
            module.register_forward_pre_hook(lambda *_: self._enter()),
            module.register_forward_hook(lambda *_: self._leave()),
        ]
        self.functions = _HostReads(self)

    @property
    def counting(self) -> bool:
        return (self.depth > 0) == self.want_inside

    def _enter(self):
        self.depth += 1
        self.calls += self.depth == 1

    def _leave(self):
        self.depth -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.counting:
            name = func._schema.name
            if name in SYNC_OPS:
                self.syncs[name] += 1
            elif not func.is_view:
                self.ops[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self.functions.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.functions.__exit__(*exc)
        for handle in self.handles:
            handle.remove()


class _HostReads(TorchFunctionMode):
    """The host reads that dispatch nothing on a CPU tensor (``tolist``) and host-to-device tensor creation."""

    def __init__(self, counter: StepWork):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.counter.counting:
            name = getattr(func, "__name__", "")
            if name in HOST_READS:
                self.counter.syncs[name] += 1
            elif name in ("tensor", "as_tensor") and kwargs.get("device") is not None:
                self.counter.host_to_device += 1
        return func(*args, **kwargs)


def count(model, run, steps: int, verifier=None) -> dict:
    """Per decode step: operators, syncs and host-to-device copies of `run()` outside the LM's forward, and the most
    frequent operators; with `verifier`, also its operators and syncs per scoring call (on a GPU each operator is a
    launch: what a scoring call costs at decode sizes)."""
    work = StepWork(model)
    scoring = StepWork(verifier, inside=True) if verifier is not None else None
    with work, scoring if scoring is not None else contextlib.nullcontext():
        run()
    report = {
        "ops_per_step": sum(work.ops.values()) / steps,
        "syncs_per_step": sum(work.syncs.values()) / steps,
        "host_to_device_per_step": work.host_to_device / steps,
        "syncs": dict(work.syncs.most_common()),
        "top_ops": dict(work.ops.most_common(12)),
    }
    if scoring is not None and scoring.calls:
        report["scoring_calls"] = scoring.calls
        report["ops_per_scoring_call"] = sum(scoring.ops.values()) / scoring.calls
        report["syncs_per_scoring_call"] = sum(scoring.syncs.values()) / scoring.calls
    return report


class ForwardClock:
    """Wall time inside `model`'s forward (pre- and post-forward hooks)."""

    def __init__(self, model):
        self.seconds, self.started = 0.0, 0.0
        self.handles = [
            model.register_forward_pre_hook(lambda *_: self._start()),
            model.register_forward_hook(lambda *_: self._stop()),
        ]

    def _start(self):
        self.started = time.perf_counter()

    def _stop(self):
        self.seconds += time.perf_counter() - self.started


def host_ms(model, run, steps: int, repeats: int) -> float:
    """Milliseconds per decode step of `run()` outside the forward: the host's own work (best of `repeats`)."""
    best = float("inf")
    for _ in range(repeats):
        clock = ForwardClock(model)
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start - clock.seconds)
        for handle in clock.handles:
            handle.remove()
    return 1000 * best / steps


def forward_variants(model, rows: int, context: int, repeats: int, calls: int) -> dict:
    """Milliseconds of one decoding forward of `model` over `rows` rows and `context` cached tokens, plain and with
    what MSV steps add: masked cache slots (a branch row hides its left-out delimiter), hidden states returned (a
    branch answers), both; each ÷ plain. On an accelerator each call is synchronised."""
    device = model.device
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        prefix = torch.randint(5, vocab, (rows, context), generator=generator).to(device)
        cache = output_cache(model(input_ids=prefix, use_cache=True))
    tokens = torch.randint(5, vocab, (rows, 1), generator=generator).to(device)
    position = torch.full((rows, 1), context, device=device)

    def forward_ms(masked: bool, hidden: bool) -> float:
        mask = torch.ones(rows, context + 1, dtype=torch.long, device=device)
        if masked:
            mask[-1, context - 1] = 0  # one branch row, its delimiter left out
        best = float("inf")
        for _ in range(repeats):
            _synchronize(device)
            start = time.perf_counter()
            for _ in range(calls):
                with torch.no_grad():
                    model(
                        input_ids=tokens,
                        attention_mask=mask,
                        position_ids=position,
                        **{cache_argument(model): cache},
                        use_cache=True,
                        logits_to_keep=1,
                        output_hidden_states=hidden,
                    )
                for layer in cache.layers:  # drop the appended token: every call sees the same cache
                    layer.keys, layer.values = layer.keys[:, :, :context], layer.values[:, :, :context]
            _synchronize(device)
            best = min(best, (time.perf_counter() - start) / calls)
        return 1000 * best

    plain = forward_ms(False, False)
    variants = {"masked_slots": (True, False), "hidden_states": (False, True), "both": (True, True)}
    return {"plain_ms": plain} | {f"{name}_ratio": forward_ms(*flags) / plain for name, flags in variants.items()}


def _synchronize(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def deep_tiny_lm():
    """A random Qwen2 with the paper LM's 28 layers at a tiny width: on a CPU its forward is mostly host work, as a
    1.5B forward is on a GPU at decode sizes."""
    tokenizer = build_tokenizer(160)
    shape = dict(
        hidden_size=16, intermediate_size=32, num_hidden_layers=28, num_attention_heads=2, num_key_value_heads=1
    )
    return random_lm(lm_config(len(tokenizer), **shape), torch.float32)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-sequences", type=int, default=64)
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="N = 8, 64 steps (CI)")
    args = parser.parse_args()
    n, steps = (8, 64) if args.quick else (args.num_sequences, args.steps)
    torch.set_num_threads(1)  # tiny matmuls: more threads only contend
    model, tokenizer = tiny_scheduled_lm()
    torch.manual_seed(0)
    verifier = MSVVerifier(MSVConfig(hidden_size=32, num_attention_heads=2, num_sequences=n, mode="streaming")).eval()
    inputs = tokenizer(["Question: find x."], return_tensors="pt")
    plain, hooked = forced_runs(model, tokenizer, inputs, n, steps)

    script = ScriptedAnswers(model, tokenizer, filler_tokens=10)
    try:
        report = {"num_sequences": n, "steps": steps}
        report["plain"] = count(model, plain, steps)
        report["hook"] = count(model, hooked(mode="terminal", checker=None), steps)
        msv = hooked(verifier=verifier, delimiters=["Wait"], checker="exact")
        report["msv"] = count(model, msv, steps, verifier)
        runs = {"plain": plain, "hook": hooked(mode="terminal", checker=None), "msv": msv}
        for name, run in runs.items():
            report[name]["host_ms_per_step"] = host_ms(model, run, steps, 1 if args.quick else 3)
    finally:
        script.handle.remove()
    report["forward_host"] = forward_variants(deep_tiny_lm(), n, 64, 1 if args.quick else 5, 20 if args.quick else 200)
    for run in ("hook", "msv"):
        report[f"{run}_over_plain_host_ms"] = report[run]["host_ms_per_step"] / report["plain"]["host_ms_per_step"]
        for figure in ("ops_per_step", "syncs_per_step", "host_to_device_per_step"):
            report[f"{run}_extra_{figure}"] = report[run][figure] - report["plain"][figure]
    for run in ("plain", "hook", "msv"):
        print(run, {k: v for k, v in report[run].items()})
    print(json.dumps(rounded(report)))


if __name__ == "__main__":
    main()
