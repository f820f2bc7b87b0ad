"""Train a testbed reasoning LM from scratch (CPU by default): a plain ``LlamaForCausalLM`` + the char-level tokenizer.

    python -m hf_msv.testbed.train_lm --no-bf16 --threads 2 --output-dir hf_msv/testbed/lm-v2   # the default LM
    python -m hf_msv.testbed.train_lm --task v1 --threads 2 --output-dir hf_msv/testbed/lm      # testbed v1's

:func:`train_testbed_lm` trains on :class:`TraceStream` (an endless seeded stream of ``train``-split traces, a
fraction ``elicit_frac`` of them cut where answers are elicited) and writes the model, the tokenizer and
``training_log.json`` (every setting and task knob of the run). Recipe, timings and how the shipped LMs were made:
``docs/testbed.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..answers import extract_last_boxed
from .task import format_prompt  # v1's and v2's prompt (task_v2 re-exports it)
from .tasks import DEFAULT_TASK, TASKS, TestbedTask, get_task
from .tokenizer import build_tokenizer

DEFAULTS = dict(  # the shipped checkpoint: hf_msv/testbed/lm/training_log.json records the exact run
    steps=2800,
    seed=0,
    batch_size=32,
    lr=2e-3,
    warmup=80,
    weight_decay=0.05,
    d_model=128,
    n_layers=4,
    n_heads=4,
    ffn_mult=3,
    elicit_frac=0.25,
)


def build_model(vocab_size: int, tokenizer, d_model: int, n_layers: int, n_heads: int, ffn_mult: int, max_len=512):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=d_model,
        intermediate_size=ffn_mult * d_model,
        num_hidden_layers=n_layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_heads,
        max_position_embeddings=max_len,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


class TraceStream:
    """Endless seeded stream of tokenized training examples (input ids and labels) of a testbed task.

    Elicitation examples (a fraction ``elicit_frac``) are a trace cut where an answer is elicited, the elicitation
    prompt and the answer + EOS; the loss skips the question and the elicitation prompt (``-100`` labels). A trace cut
    at the length cap gets no EOS, so the LM learns to keep going at the cap."""

    def __init__(self, tokenizer, seed: int, elicit_frac: float, knobs: dict | None = None, pool: int = 20000,
                 task: str | TestbedTask = DEFAULT_TASK):
        self.tok = tokenizer
        self.task = get_task(task) if isinstance(task, str) else task
        self.knobs = dict(knobs or {})
        self.rng = random.Random(seed)
        # A large pool of distinct train problems, re-worded and re-traced every time one is drawn.
        self.problems = self.task.generate_problems("train", pool, seed=seed, **self.knobs)
        self.elicit_frac = elicit_frac

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False).input_ids

    def example(self) -> tuple[list[int], list[int]]:
        """``(ids, labels)`` of one example, BOS first; labels are ``-100`` where the loss skips a position."""
        p = self.rng.choice(self.problems)
        prompt = [self.tok.bos_token_id] + self._ids(format_prompt(p))
        if self.rng.random() < self.elicit_frac:
            prefix, elicit, answer = self.task.module.make_elicitation_example(p, self.rng, **self.knobs)
            a, b, c = self._ids(prefix), self._ids(elicit), self._ids(answer) + [self.tok.eos_token_id]
            return prompt + a + b + c, [-100] * len(prompt) + a + [-100] * len(b) + c
        text, finished = self.task.module.make_training_trace(p, self.rng, **self.knobs)
        # a trace cut at the length cap gets no EOS: the LM must not learn to stop where the cap cut it
        t = self._ids(text) + [self.tok.eos_token_id] * finished
        return prompt + t, [-100] * len(prompt) + t

    def batch(self, n: int):
        """``n`` examples, right-padded: ``(ids, labels, attention)``, each `(n, L)`. Examples are drawn in chunks of
        8 batches sorted by length (less padding)."""
        if not getattr(self, "_buf", None):
            exs = sorted((self.example() for _ in range(8 * n)), key=lambda e: len(e[0]))
            self._buf = [exs[i : i + n] for i in range(0, len(exs), n)]
            self.rng.shuffle(self._buf)
        exs = self._buf.pop()
        L = max(len(i) for i, _ in exs)
        ids = torch.full((n, L), self.tok.pad_token_id, dtype=torch.long)
        lab = torch.full((n, L), -100, dtype=torch.long)
        att = torch.zeros((n, L), dtype=torch.long)
        for r, (i, l) in enumerate(exs):
            ids[r, : len(i)] = torch.tensor(i)
            lab[r, : len(l)] = torch.tensor(l)
            att[r, : len(i)] = 1
        return ids, lab, att


@torch.no_grad()
def _sample_accuracy(model, tokenizer, problems, max_new_tokens: int) -> float:
    model.eval()
    enc = tokenizer([format_prompt(p) for p in problems], return_tensors="pt", padding=True).to(model.device)
    with torch.autocast(model.device.type, dtype=torch.bfloat16):
        out = model.generate(
            **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        )
    texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    model.train()
    return sum(extract_last_boxed(t) == p.gold for t, p in zip(texts, problems)) / len(problems)


def _save(model, tok, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def learning_rate(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up over `warmup` steps, then a cosine decay to 5 % of `lr` at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def _adamw(model, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only (not on norms and biases)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98), eps=1e-8)


def _train_step(model, opt, batch, device, bf16: bool) -> float:
    """One optimizer step on a `TraceStream` batch; returns the loss."""
    ids, lab, _ = batch
    ids, lab = ids.to(device), lab.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        # right padding + causal attention: pads never influence real positions, no mask needed (faster)
        loss = model(input_ids=ids, labels=lab).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def _train_loop(model, opt, stream, tok, task, knobs, *, steps, lr, warmup, batch_size, seed, bf16, device,
                eval_every, save_every, log_every, output_dir: Path, log) -> tuple[list[dict], float]:
    """The step loop of :func:`train_testbed_lm`; returns ``(history, final smoothed loss)``."""
    # v2 samples up to its cap, as collection does; v1 traces are short (~120 tokens)
    eval_tokens = task.sampling_cap(knobs) or 200
    history, t0, ema = [], time.time(), None
    model.train()
    for step in range(steps):
        rate = learning_rate(step, lr, warmup, steps)
        for g in opt.param_groups:
            g["lr"] = rate
        loss = _train_step(model, opt, stream.batch(batch_size), device, bf16)
        ema = loss if ema is None else 0.95 * ema + 0.05 * loss
        if (step + 1) % log_every == 0 or step + 1 == steps:
            rec = {"step": step + 1, "loss": round(ema, 4), "lr": rate, "elapsed_s": round(time.time() - t0, 1)}
            if eval_every and ((step + 1) % eval_every == 0 or step + 1 == steps):
                rec["val_acc_t1"] = _sample_accuracy(
                    model, tok, task.generate_problems("validation", 64, seed=seed, **knobs), eval_tokens
                )
            history.append(rec)
            log(json.dumps(rec))
        if save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            _save(model, tok, output_dir / "checkpoints" / f"step-{step + 1}")
    return history, ema


def train_testbed_lm(
    output_dir: str | os.PathLike,
    steps: int = DEFAULTS["steps"],
    seed: int = DEFAULTS["seed"],
    batch_size: int = DEFAULTS["batch_size"],
    lr: float = DEFAULTS["lr"],
    warmup: int = DEFAULTS["warmup"],
    weight_decay: float = DEFAULTS["weight_decay"],
    d_model: int = DEFAULTS["d_model"],
    n_layers: int = DEFAULTS["n_layers"],
    n_heads: int = DEFAULTS["n_heads"],
    ffn_mult: int = DEFAULTS["ffn_mult"],
    elicit_frac: float = DEFAULTS["elicit_frac"],
    knobs: dict | None = None,
    task: str = DEFAULT_TASK,
    bf16: bool = True,
    eval_every: int = 0,
    save_every: int = 0,
    log_every: int = 50,
    num_threads: int | None = None,
    device: str | torch.device = "cpu",
    log=print,
):
    """Train the testbed LM from scratch and save model + tokenizer (safetensors) to ``output_dir``.

    Args:
        output_dir: where the model, the tokenizer and ``training_log.json`` go.
        task: ``"v2"`` (the default testbed; ``knobs`` are :class:`~hf_msv.testbed.task_v2.TaskKnobsV2` overrides)
            or ``"v1"`` (:class:`~hf_msv.testbed.task.TaskKnobs`).
        bf16: bf16 autocast (the v2 LM ships trained without it; CPUs without native bf16 are ~8x slower with it).
        eval_every: every so many steps, sample accuracy on 64 validation problems (0: never).
        save_every: also save ``output_dir/checkpoints/step-N`` every so many steps (0: never).
        device: ``"cpu"`` (the shipped LMs) or e.g. ``"cuda"`` (the same recipe, a numerically different LM).

    Returns:
        The training stats written to ``training_log.json`` (settings, task knobs, parameters, wall time, final loss,
        history).

    Raises:
        ValueError: an unknown task or an unknown or invalid knob, before anything is built.
    """
    if num_threads:
        torch.set_num_threads(num_threads)
    torch.manual_seed(seed)
    random.seed(seed)
    knobs = dict(knobs or {})
    task = get_task(task)
    task.knobs(**knobs)  # validate
    tok = build_tokenizer()
    device = torch.device(device)
    context = task.context(knobs)
    model = build_model(len(tok), tok, d_model, n_layers, n_heads, ffn_mult, max_len=context).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"testbed {task.name} LM: {n_params / 1e6:.2f}M parameters, {steps} steps, batch {batch_size}, bf16={bf16}")
    stream = TraceStream(tok, seed, elicit_frac, knobs, task=task)
    opt = _adamw(model, lr, weight_decay)
    t0 = time.time()
    history, ema = _train_loop(model, opt, stream, tok, task, knobs, steps=steps, lr=lr, warmup=warmup,
                               batch_size=batch_size, seed=seed, bf16=bf16, device=device, eval_every=eval_every,
                               save_every=save_every, log_every=log_every, output_dir=Path(output_dir), log=log)
    wall = time.time() - t0
    out = Path(output_dir)
    _save(model, tok, out)
    stats = {
        "task": task.name, "context": context,
        "steps": steps, "seed": seed, "batch_size": batch_size, "lr": lr, "d_model": d_model, "n_layers": n_layers,
        "n_heads": n_heads, "ffn_mult": ffn_mult, "elicit_frac": elicit_frac, "knobs": knobs,
        "task_knobs": asdict(task.knobs(**knobs)),  # every knob, defaults included: the data this LM was trained on
        "bf16": bf16,
        "parameters": n_params, "wall_time_s": round(wall, 1), "final_loss": round(ema, 4),
        "torch_threads": torch.get_num_threads(), "device": device.type, "history": history,
    }
    (out / "training_log.json").write_text(json.dumps(stats, indent=1))
    return stats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--task", choices=sorted(TASKS), default=DEFAULT_TASK,
                    help="v2: the default testbed (its LM in hf_msv/testbed/lm-v2, where load_lm('testbed') looks); "
                    "v1: the first testbed (hf_msv/testbed/lm, load_lm('testbed-v1'))")
    for k, v in DEFAULTS.items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    ap.add_argument("--knobs", default="{}", help="JSON dict of TaskKnobs (v1) / TaskKnobsV2 (v2) overrides")
    ap.add_argument("--no-bf16", action="store_true")
    ap.add_argument("--eval-every", type=int, default=0, help="sample-accuracy check on 64 validation problems")
    ap.add_argument("--save-every", type=int, default=0, help="also save <output-dir>/checkpoints/step-N")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="the shipped checkpoint is trained on cpu")
    a = ap.parse_args(argv)
    kw = {k: getattr(a, k) for k in DEFAULTS}
    stats = train_testbed_lm(
        a.output_dir, knobs=json.loads(a.knobs), task=a.task, bf16=not a.no_bf16, eval_every=a.eval_every,
        save_every=a.save_every, log_every=a.log_every, num_threads=a.threads, device=a.device, **kw,
    )
    print(json.dumps({k: v for k, v in stats.items() if k != "history"}))


if __name__ == "__main__":
    main()
