"""Training verifiers on collected shards: the paper's recipe for MSV_N, and the Probe baseline.

    config = MSVTrainingConfig(kind="msv", num_sequences=16, mode="streaming")
    result = train_verifier("data/train", "data/val", "verifiers/msv16", config)
    result.best_metrics["bce"], result.verifier

Recipe (paper, appendix "Details on Experiments"; every value is a field of `MSVTrainingConfig`): AdamW, the
Hugging Face ``constant_with_warmup`` schedule with the HF default warmup ratio (0.0, so the learning rate is constant
from the first step), max_grad_norm 1.0, a global batch of 64 groups without gradient accumulation, learning rates
5e-5 for the MSV body, 1e-1 for the mask-mixture weights w, 1e-3 for the sequence embeddings e⁽ⁿ⁾ and 1e-3 for the
Probe, 1 epoch on terminal data and 2 on streaming data, one Multi-Mask Transformer Block with the base LM's width
and heads. Loss: mean BCE over the answers of a batch (terminal: terminal answers only). After every epoch the
validation BCE is measured and the best checkpoint is kept (``save_pretrained`` + model card).

Runs unchanged under ``accelerate launch``: `Accelerator` prepares model, optimizer and the training DataLoader
(the global batch is split over processes); validation is split by index and gathered.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, get_constant_schedule_with_warmup

from ..modeling_probe import ProbeConfig, ProbeVerifier
from ..data.shards import VERIFIER_INPUTS, ShardDataset, collate_groups
from ..utils import atomic_write_json

__all__ = ["MSVTrainingConfig", "TrainingResult", "train_verifier", "evaluate_verifier", "build_verifier", "ProbeConfig",
           "ProbeVerifier", "add_train_arguments", "train_from_args", "main"]


# ----------------------------------------------------------------------------------------------------------------
# The Probe baseline
# ----------------------------------------------------------------------------------------------------------------


def _save_probe(model: ProbeVerifier, directory: Path, metrics: dict, training_data: str) -> None:
    """``save_pretrained`` plus a short model card (the MSV card template describes MSV settings only)."""
    from huggingface_hub import ModelCard, ModelCardData

    model.save_pretrained(directory)
    config = model.config
    data = ModelCardData(library_name="transformers", base_model=config.base_model_name_or_path,
                         tags=["hf_msv", "verifier", "probe"], license="apache-2.0")
    rows = "\n".join(f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in metrics.items())
    text = (f"---\n{data.to_yaml()}\n---\n\n# Probe verifier\n\nA 2-layer MLP (hidden {config.intermediate_size}) on "
            f"the last answer token's hidden state of `{config.base_model_name_or_path}`, predicting whether each "
            f"{config.mode} answer is correct (the Probe baseline of the MSV paper). Load with "
            f"`hf_msv.training.ProbeVerifier.from_pretrained(...)`.\n\n## Training data\n\n{training_data}\n\n"
            f"## Metrics\n\n| metric | value |\n|---|---|\n{rows}\n")
    ModelCard(text).save(directory / "README.md")


# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class MSVTrainingConfig:
    """Everything that defines a training run (saved as ``training_config.json`` next to the checkpoint).

    Model:
        kind: ``"msv"`` or ``"probe"``.
        num_sequences: N, sequences per training group (paper: 1, 4, 16, 64); the Probe always uses 1.
        mode: ``"terminal"`` (terminal answers) or ``"streaming"`` (all answers, causal masks).
        masks, num_hidden_layers, num_attention_heads, intermediate_size, readout, logit_averaging,
            gamma_hidden_size, attention_backend: `MSVConfig` knobs. ``num_attention_heads=None`` takes the base
            LM's (recorded at collection); one block (paper).
        probe_hidden_size: the Probe's MLP width (paper: 1024).
    Data:
        groups_per_problem: `None` partitions each problem's sequences into ⌊S/N⌋ groups per epoch (every sequence
            once per epoch); k draws k random N-subsets per problem per epoch.
        max_train_problems: train on the first k problems of the training shards (shard order; like the HF
            examples' ``max_train_samples``); `None` uses them all. Validation is never truncated.
        checker, checker_kwargs: re-derive equivalence classes with this checker (e.g. a weak one) from the answer
            texts; `None` keeps the collection's classes. Labels are always the collection (gold) checker's.
        num_workers: DataLoader workers (reading, collate and γ run there).
    Optimisation (paper's recipe; HF TrainingArguments defaults where the paper says "default"):
        learning_rate (5e-5, MSV body), mask_learning_rate (1e-1, mask-mixture weights w), embedding_learning_rate
            (1e-3, sequence embeddings e⁽ⁿ⁾), probe_learning_rate (1e-3).
        weight_decay (0.0), adam_beta1 (0.9), adam_beta2 (0.999), adam_epsilon (1e-8): AdamW.
        warmup_ratio: fraction of steps of linear warmup of ``get_constant_schedule_with_warmup`` (HF default 0.0).
        max_grad_norm: gradient clipping (1.0).
        batch_size: global groups per optimizer step (64), split across processes; no accumulation.
        num_epochs: `None` → 1 (terminal) / 2 (streaming). max_steps: stop early (tests, benchmarks).
        seed: model init, group draws and shuffling.
        mixed_precision: accelerate's ``"no"`` / ``"bf16"`` / ``"fp16"``.
        eval_batch_size: groups per validation forward.
        log_every: steps between progress-bar loss updates. progress: show a tqdm bar on the main process.
    """

    kind: str = "msv"
    num_sequences: int = 16
    mode: str = "streaming"
    masks: list[str] | None = None
    num_hidden_layers: int = 1
    num_attention_heads: int | None = None
    intermediate_size: int | None = None
    readout: str = "last"
    logit_averaging: bool | None = None
    gamma_hidden_size: int = 64
    attention_backend: str = "chunked"
    probe_hidden_size: int = 1024
    groups_per_problem: int | None = None
    max_train_problems: int | None = None
    checker: str | None = None
    checker_kwargs: dict = field(default_factory=dict)
    num_workers: int = 0
    learning_rate: float = 5e-5
    mask_learning_rate: float = 1e-1
    embedding_learning_rate: float = 1e-3
    probe_learning_rate: float = 1e-3
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    warmup_ratio: float = 0.0
    max_grad_norm: float = 1.0
    batch_size: int = 64
    num_epochs: int | None = None
    max_steps: int | None = None
    seed: int = 0
    mixed_precision: str = "no"
    eval_batch_size: int = 64
    log_every: int = 10
    progress: bool = True

    def __post_init__(self):
        if self.kind not in ("msv", "probe"):
            raise ValueError(f"kind must be 'msv' or 'probe', got {self.kind!r}")
        if self.mode not in ("terminal", "streaming"):
            raise ValueError(f"mode must be 'terminal' or 'streaming', got {self.mode!r}")
        if self.num_sequences < 1 or self.batch_size < 1:
            raise ValueError("num_sequences and batch_size must be positive")

    @property
    def epochs(self) -> int:
        """Epochs actually run: `num_epochs`, else the paper's 1 (terminal) / 2 (streaming)."""
        return self.num_epochs if self.num_epochs is not None else (1 if self.mode == "terminal" else 2)

    @property
    def group_size(self) -> int:
        """Sequences per training group: N for MSV, 1 for the Probe (it scores answers one by one)."""
        return 1 if self.kind == "probe" else self.num_sequences


@dataclass
class TrainingResult:
    """Outcome of `train_verifier`. ``history`` has one entry per evaluation (epoch 0 = before training)."""

    output_dir: str
    best_epoch: int
    best_metrics: dict
    history: list[dict]
    verifier: PreTrainedModel | None = None


# ----------------------------------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------------------------------


def _heads_for(hidden_size: int, wanted: int | None) -> int:
    """The base LM's head count if it divides the width, else the largest divisor below it."""
    wanted = wanted or 12
    for heads in range(min(wanted, hidden_size), 0, -1):
        if hidden_size % heads == 0:
            return heads
    return 1


def build_verifier(config: MSVTrainingConfig, hidden_size: int, info: dict) -> PreTrainedModel:
    """A freshly initialised MSV or Probe for hidden states of width `hidden_size` collected with `info`."""
    streaming = config.mode == "streaming"
    provenance = dict(base_model_name_or_path=info.get("lm_name_or_path") or None,
                      delimiters=list(info.get("delimiters") or []) if streaming else None,
                      every_k_tokens=info.get("every_k_tokens") if streaming else None,
                      elicitation_prompt=info.get("elicitation_prompt", "### Final Answer ### \\boxed"),
                      max_answer_tokens=info.get("max_answer_tokens", 40))
    if config.kind == "probe":
        return ProbeVerifier(ProbeConfig(hidden_size=hidden_size, intermediate_size=config.probe_hidden_size,
                                         mode=config.mode, **provenance))
    from ..configuration_msv import MSVConfig
    from ..modeling_msv import MSVVerifier

    msv_config = MSVConfig(
        hidden_size=hidden_size,
        num_attention_heads=_heads_for(hidden_size, config.num_attention_heads or info.get("lm_num_attention_heads")),
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_hidden_layers,
        masks=list(config.masks) if config.masks else None, mode=config.mode,
        logit_averaging=config.logit_averaging, readout=config.readout, num_sequences=config.num_sequences,
        gamma_hidden_size=config.gamma_hidden_size, attention_backend=config.attention_backend, **provenance)
    return MSVVerifier(msv_config)


def _parameter_groups(model, config: MSVTrainingConfig) -> list[dict]:
    if config.kind == "probe":
        return [{"params": list(model.parameters()), "lr": config.probe_learning_rate}]
    return model.parameter_groups(config.learning_rate, config.mask_learning_rate, config.embedding_learning_rate)


def _inputs(batch: dict) -> dict:
    return {k: batch[k] for k in VERIFIER_INPUTS}


@torch.no_grad()
def evaluate_verifier(model, dataset: ShardDataset, mode: str, batch_size: int = 64, accelerator=None) -> dict:
    """Validation metrics of `model` on every group of `dataset`: ``bce`` (mean BCE over answers, the training
    loss), ``auroc``, ``brier``, ``ece``, ``nll``, ``answers``. Split by index over processes and gathered."""
    from accelerate.utils import gather_object

    from ..metrics import auroc, brier, ece

    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    was_training = model.training
    model.eval()
    logits, labels = [], []
    indices = list(range(rank, len(dataset), world))
    for i in range(0, len(indices), batch_size):
        batch = collate_groups([dataset[j] for j in indices[i:i + batch_size]], mode)
        out = model(**_inputs(batch) | {"labels": None})
        logits.append(out.logits.float().cpu())
        labels.append(batch["labels"].float())
    model.train(was_training)
    local = (torch.cat(logits).numpy() if logits else np.zeros(0), torch.cat(labels).numpy() if labels else np.zeros(0))
    parts = gather_object([local]) if world > 1 else [local]
    z = np.concatenate([p[0] for p in parts]).astype(np.float64)
    y = np.concatenate([p[1] for p in parts]).astype(np.float64)
    if not len(y):
        return {"bce": math.nan, "answers": 0}
    bce = float(np.mean(np.logaddexp(0.0, z) - y * z))  # stable BCE-with-logits
    p = 1.0 / (1.0 + np.exp(-z))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = {"bce": bce, "auroc": auroc(p, y), "brier": brier(p, y), "ece": ece(p, y)}
    metrics["answers"] = int(len(y))
    metrics["accuracy"] = float(y.mean())
    return metrics


def _describe_data(train: ShardDataset, val: ShardDataset, config: MSVTrainingConfig) -> str:
    info, s, v = train.info, train.stats(), val.stats()
    sampling = (f"{info.get('num_samples', '?')} samples per problem at temperature {info.get('temperature', '?')}, "
                f"up to {info.get('max_new_tokens', '?')} new tokens")
    elicit = (f"answers elicited with `{info.get('elicitation_prompt', '?')}` (≤ {info.get('max_answer_tokens', '?')} "
              f"tokens) at delimiters {info.get('delimiters')} and at the end")
    classes = (f"re-derived with the `{config.checker}` checker" if config.checker
               else f"from the `{info.get('checker', '?')}` checker")
    return (f"Hidden states of `{info.get('lm_name_or_path') or 'unknown LM'}` ({sampling}; {elicit}). "
            f"Training: {s['problems']} problems, {s['sequences']} sequences, {s['answers']} answers "
            f"({s['terminal_answers']} terminal, terminal accuracy {s['terminal_accuracy']:.1%}). "
            f"Validation: {v['problems']} problems, {v['answers']} answers. {config.mode.capitalize()} answers in "
            f"groups of {config.group_size} sequences; labels from the `{info.get('checker', '?')}` checker, "
            f"equivalence classes {classes}.")


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------


def train_verifier(train_dir, val_dir, output_dir, config: MSVTrainingConfig | None = None) -> TrainingResult:
    """Train an MSV_N or a Probe on the shards in `train_dir`, keep the checkpoint with the best validation BCE on
    `val_dir` in `output_dir` (weights, config, README.md model card, ``training_config.json``,
    ``training_log.json``), and return the history and the best model (loaded on every process).

    Works in one process or under ``accelerate launch`` (any number of processes; CPU or GPU).
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    from ..hub import save_verifier

    config = config or MSVTrainingConfig()
    from ..utils import cpu_processes

    accelerator = Accelerator(mixed_precision=config.mixed_precision, cpu=cpu_processes())
    set_seed(config.seed)
    output_dir = Path(output_dir)
    n = config.group_size
    data_kwargs = dict(num_sequences=n, mode=config.mode, seed=config.seed, checker=config.checker,
                       checker_kwargs=config.checker_kwargs)
    train_set = ShardDataset(train_dir, groups_per_problem=config.groups_per_problem,
                             max_problems=config.max_train_problems, **data_kwargs)
    # Validation groups: a fixed partition (epoch 0 of the validation seed), the same for every evaluation.
    val_set = ShardDataset(val_dir, **data_kwargs)
    if val_set.hidden_size != train_set.hidden_size:
        raise ValueError("training and validation shards come from LMs of different widths")
    model = build_verifier(config, train_set.hidden_size, train_set.info)
    optimizer = torch.optim.AdamW(_parameter_groups(model, config), betas=(config.adam_beta1, config.adam_beta2),
                                  eps=config.adam_epsilon, weight_decay=config.weight_decay)
    per_process = max(1, config.batch_size // accelerator.num_processes)
    loader = torch.utils.data.DataLoader(
        train_set, batch_size=per_process, shuffle=True, num_workers=config.num_workers,
        collate_fn=partial(collate_groups, mode=config.mode), generator=torch.Generator().manual_seed(config.seed))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps_per_epoch = len(loader)
    total = steps_per_epoch * config.epochs
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    # Stepped once per optimizer step by hand (not prepared): accelerate would step it once per process.
    scheduler = get_constant_schedule_with_warmup(optimizer.optimizer, math.ceil(config.warmup_ratio * total))
    training_data = _describe_data(train_set, val_set, config)
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(output_dir / "training_config.json", asdict(config))

    def evaluate(epoch: int, extra: dict) -> dict:
        metrics = evaluate_verifier(accelerator.unwrap_model(model), val_set, config.mode, config.eval_batch_size,
                                    accelerator)
        entry = {"epoch": epoch, **{f"val_{k}": v for k, v in metrics.items()}, **extra}
        history.append(entry)
        return metrics

    history: list[dict] = []
    evaluate(0, {"step": 0})
    best_bce, best_epoch, best_metrics = math.inf, 0, {}
    step = 0
    bar = tqdm(total=total, unit="step", desc=f"train {config.kind}", dynamic_ncols=True,
               disable=not (config.progress and accelerator.is_local_main_process))
    for epoch in range(1, config.epochs + 1):
        if step >= total:
            break
        train_set.set_epoch(epoch - 1)
        loader.set_epoch(epoch - 1)
        model.train()
        losses, groups, start = [], 0, time.perf_counter()
        for batch in loader:
            out = model(**_inputs(batch))
            accelerator.backward(out.loss)
            if config.max_grad_norm:
                accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(out.loss.detach().float())
            groups += len(batch["problem_id"])
            step += 1
            bar.update(1)
            if step % config.log_every == 0:
                bar.set_postfix(loss=f"{torch.stack(losses[-config.log_every:]).mean().item():.4f}", refresh=False)
            if step >= total:
                break
        seconds = time.perf_counter() - start
        train_loss = accelerator.reduce(torch.stack(losses).mean().to(accelerator.device), "mean").item()
        groups = int(accelerator.reduce(torch.tensor(groups, device=accelerator.device), "sum").item())
        metrics = evaluate(epoch, {"step": step, "train_loss": train_loss, "train_groups": groups,
                                   "train_seconds": seconds, "train_groups_per_s": groups / seconds})
        if metrics["bce"] < best_bce:
            best_bce, best_epoch, best_metrics = metrics["bce"], epoch, metrics
            if accelerator.is_main_process:
                card_metrics = {f"validation {k}": v for k, v in metrics.items()} | {"epoch": epoch}
                unwrapped = accelerator.unwrap_model(model)
                if config.kind == "probe":
                    _save_probe(unwrapped, output_dir, card_metrics, training_data)
                else:
                    save_verifier(unwrapped, output_dir, metrics=card_metrics, training_data=training_data)
        if accelerator.is_main_process:
            atomic_write_json(output_dir / "training_log.json",
                              {"best_epoch": best_epoch, "history": history, "training_data": training_data})
        accelerator.wait_for_everyone()
    bar.close()
    accelerator.wait_for_everyone()
    cls = ProbeVerifier if config.kind == "probe" else type(accelerator.unwrap_model(model))
    best = cls.from_pretrained(output_dir) if best_epoch else None
    accelerator.free_memory()
    return TrainingResult(str(output_dir), best_epoch, best_metrics, history, best)


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def add_train_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The ``hf-msv train`` options: three directories plus one flag per `MSVTrainingConfig` field."""
    parser.add_argument("--train-dir", required=True)
    parser.add_argument("--val-dir", required=True)
    parser.add_argument("--output-dir", required=True)
    defaults = MSVTrainingConfig()
    for f in fields(MSVTrainingConfig):
        flag = "--" + f.name.replace("_", "-")
        value = getattr(defaults, f.name)
        if f.name == "checker_kwargs":
            parser.add_argument(flag, type=json.loads, default={}, help="JSON dict for get_checker")
        elif f.name == "masks":
            parser.add_argument(flag, nargs="+", default=None)
        elif isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            kind = {"num_attention_heads": int, "intermediate_size": int, "num_epochs": int, "max_steps": int,
                    "groups_per_problem": int, "max_train_problems": int, "logit_averaging": _bool,
                    "checker": str}.get(f.name, type(value))
            parser.add_argument(flag, type=kind, default=value)
    return parser


def _bool(text: str) -> bool:
    return text.lower() in ("1", "true", "yes", "on")


def train_from_args(args: argparse.Namespace) -> TrainingResult:
    """Run `train_verifier` from parsed `add_train_arguments` options."""
    config = MSVTrainingConfig(**{f.name: getattr(args, f.name) for f in fields(MSVTrainingConfig)})
    return train_verifier(args.train_dir, args.val_dir, args.output_dir, config)


def main(argv=None) -> None:
    parser = add_train_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    result = train_from_args(parser.parse_args(argv))
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"output_dir": result.output_dir, "best_epoch": result.best_epoch,
                          "best_metrics": result.best_metrics}))


if __name__ == "__main__":
    main()
