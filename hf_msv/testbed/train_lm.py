"""Train a testbed reasoning LM from scratch (CPU by default): a plain ``LlamaForCausalLM`` + the char-level tokenizer.

    python -m hf_msv.testbed.train_lm --no-bf16 --threads 2 --output-dir hf_msv/testbed/lm-v2   # the shipped LM

:func:`train_testbed_lm` trains on :class:`TraceStream` (an endless seeded stream of ``train``-split traces, a
fraction ``elicit_frac`` of them cut where answers are elicited) and writes the model, the tokenizer and
``training_log.json`` (every setting and task knob of the run). ``--task`` picks a task of
:data:`~hf_msv.testbed.tasks.TASKS` (``python -m research.testbed_v1 train-lm`` adds the first testbed's). Recipe,
timings and how the shipped LM was made: ``docs/testbed.md``.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..answers import extract_last_boxed
from .tasks import DEFAULT_TASK, TASKS, TestbedTask, get_task
from .tokenizer import build_tokenizer


def _help(text: str, **kwargs):
    return field(metadata={"help": text}, **kwargs)


@dataclass
class LMTrainingConfig:
    """Every setting of a testbed LM's training run (`train_testbed_lm`); ``python -m hf_msv.testbed.train_lm``
    builds its flags from these fields (`transformers.HfArgumentParser`: ``--batch-size`` or ``--batch_size``).
    The defaults are the shipped LM's recipe (hf_msv/testbed/lm-v2/training_log.json records the exact run)."""

    output_dir: str = _help("where the model, the tokenizer and training_log.json go")
    task: str = field(
        default=DEFAULT_TASK,
        metadata={
            "help": "v2: the testbed (its LM in hf_msv/testbed/lm-v2, where load_lm('testbed') looks), or a "
            "registered "
            "task",
            "choices": TASKS,
        },
    )  # the mapping itself: a task registered after this import is a choice too
    steps: int = _help("optimizer steps", default=2800)
    seed: int = _help("seed of the model's initialisation and of the trace stream", default=0)
    batch_size: int = _help("examples per step", default=32)
    lr: float = _help("peak learning rate (linear warm-up, then a cosine decay to 5 %% of it)", default=2e-3)
    warmup: int = _help("warm-up steps", default=80)
    weight_decay: float = _help("AdamW weight decay (matrices only)", default=0.05)
    d_model: int = _help("hidden size", default=128)
    n_layers: int = _help("decoder layers", default=4)
    n_heads: int = _help("attention heads", default=4)
    ffn_mult: int = _help("MLP width as a multiple of d_model", default=3)
    elicit_frac: float = _help("fraction of the examples cut where an answer is elicited", default=0.25)
    knobs: dict | str | None = _help("the task's knob overrides, a JSON object (v2: TaskKnobsV2)", default=None)
    bf16: bool = _help(
        "bf16 autocast (the v2 LM ships trained without it, --no-bf16; CPUs without native bf16 are "
        "~8x slower with it)",
        default=True,
    )
    eval_every: int = _help("every so many steps, sample accuracy on 64 validation problems (0: never)", default=0)
    save_every: int = _help("also save <output-dir>/checkpoints/step-N every so many steps (0: never)", default=0)
    log_every: int = _help("steps between logged history records", default=50)
    threads: int | None = _help("torch threads (default: torch's)", default=None)
    device: str = _help(
        "cpu (the shipped LM) or e.g. cuda (the same recipe, a numerically different LM)", default="cpu"
    )

    def __post_init__(self):
        knobs = self.knobs
        if isinstance(knobs, str):  # from the command line: a JSON object
            knobs = json.loads(knobs) if knobs.strip() else {}
        self.knobs = dict(knobs or {})

    @property
    def knob_overrides(self) -> dict:
        """`knobs` as `__post_init__` left them: a dict (the command line's JSON object parsed)."""
        assert isinstance(self.knobs, dict)
        return self.knobs


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
        rope_theta=10000.0,  # pyright: ignore[reportCallIssue]  (legacy: transformers 5 moves it to rope_parameters)
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

    def __init__(
        self,
        tokenizer,
        seed: int,
        elicit_frac: float,
        knobs: dict | None = None,
        pool: int = 20000,
        task: str | TestbedTask = DEFAULT_TASK,
    ):
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
        prompt = [self.tok.bos_token_id] + self._ids(self.task.module.format_prompt(p))
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
        for r, (inputs, labels) in enumerate(exs):
            ids[r, : len(inputs)] = torch.tensor(inputs)
            lab[r, : len(labels)] = torch.tensor(labels)
            att[r, : len(inputs)] = 1
        return ids, lab, att


@torch.no_grad()
def _sample_accuracy(model, tokenizer, problems, max_new_tokens: int, format_prompt) -> float:
    model.eval()
    enc = tokenizer([format_prompt(p) for p in problems], return_tensors="pt", padding=True).to(model.device)
    with torch.autocast(model.device.type, dtype=torch.bfloat16):
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
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
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
        eps=1e-8,
    )


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


def _train_loop(model, opt, stream, tok, task: TestbedTask, config: LMTrainingConfig, log) -> tuple[list[dict], float]:
    """The step loop of :func:`train_testbed_lm`; returns ``(history, final smoothed loss)``."""
    c, knobs, device = config, config.knob_overrides, torch.device(config.device)
    # a capped task samples up to its cap, as collection does; an uncapped one writes short traces
    eval_tokens = task.sampling_cap(knobs) or 200
    history, t0, ema = [], time.time(), None
    model.train()
    for step in range(c.steps):
        rate = learning_rate(step, c.lr, c.warmup, c.steps)
        for g in opt.param_groups:
            g["lr"] = rate
        loss = _train_step(model, opt, stream.batch(c.batch_size), device, c.bf16)
        ema = loss if ema is None else 0.95 * ema + 0.05 * loss
        if (step + 1) % c.log_every == 0 or step + 1 == c.steps:
            rec = {"step": step + 1, "loss": round(ema, 4), "lr": rate, "elapsed_s": round(time.time() - t0, 1)}
            if c.eval_every and ((step + 1) % c.eval_every == 0 or step + 1 == c.steps):
                rec["val_acc_t1"] = _sample_accuracy(
                    model,
                    tok,
                    task.generate_problems("validation", 64, seed=c.seed, **knobs),
                    eval_tokens,
                    task.module.format_prompt,
                )
            history.append(rec)
            log(json.dumps(rec))
        if c.save_every and (step + 1) % c.save_every == 0 and step + 1 < c.steps:
            _save(model, tok, Path(c.output_dir) / "checkpoints" / f"step-{step + 1}")
    return history, float("nan") if ema is None else ema  # nan: no step taken


def train_testbed_lm(config: LMTrainingConfig, log=print) -> dict:
    """Train the testbed LM from scratch and save model + tokenizer (safetensors) to ``config.output_dir``.

    Args:
        config: the run (`LMTrainingConfig`): ``task`` is ``"v2"`` (the testbed; ``knobs`` are
            :class:`~hf_msv.testbed.task_v2.TaskKnobsV2` overrides) or a task registered with
            :func:`~hf_msv.testbed.registration.register_task` (its own knobs).
        log: called with each progress line.

    Returns:
        The training stats written to ``training_log.json`` (settings, task knobs, parameters, wall time, final loss,
        history).

    Raises:
        ValueError: an unknown task or an unknown or invalid knob, before anything is built.
    """
    c = config
    if c.threads:
        torch.set_num_threads(c.threads)
    torch.manual_seed(c.seed)
    random.seed(c.seed)
    task = get_task(c.task)
    task.knobs(**c.knob_overrides)  # validate
    tok = build_tokenizer()
    context = task.context(c.knob_overrides)
    model = build_model(len(tok), tok, c.d_model, c.n_layers, c.n_heads, c.ffn_mult, max_len=context)
    model.to(torch.device(c.device))  # pyright: ignore[reportArgumentType]  (transformers' wrapped `to` loses its self type)
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"testbed {task.name} LM: {n_params / 1e6:.2f}M parameters, {c.steps} steps, batch {c.batch_size}, "
        f"bf16={c.bf16}"
    )
    stream = TraceStream(tok, c.seed, c.elicit_frac, c.knob_overrides, task=task)
    t0 = time.time()
    history, ema = _train_loop(model, _adamw(model, c.lr, c.weight_decay), stream, tok, task, c, log)
    wall = time.time() - t0
    out = Path(c.output_dir)
    _save(model, tok, out)
    stats = {
        "task": task.name,
        "context": context,
        **{
            k: getattr(c, k)
            for k in (
                "steps",
                "seed",
                "batch_size",
                "lr",
                "d_model",
                "n_layers",
                "n_heads",
                "ffn_mult",
                "elicit_frac",
                "knobs",
            )
        },
        "task_knobs": asdict(
            task.knobs(**c.knob_overrides)
        ),  # every knob, defaults included: the data this LM was trained on
        "bf16": c.bf16,
        "parameters": n_params,
        "wall_time_s": round(wall, 1),
        "final_loss": round(ema, 4),
        "torch_threads": torch.get_num_threads(),
        "device": torch.device(c.device).type,
        "history": history,
    }
    (out / "training_log.json").write_text(json.dumps(stats, indent=1))
    return stats


def main(argv=None) -> dict:
    """``python -m hf_msv.testbed.train_lm``: `train_testbed_lm` with the flags of `LMTrainingConfig`; prints the
    stats (less the history) as one JSON line and returns them."""
    from transformers import HfArgumentParser
    from transformers.hf_argparser import DataClassType

    parser = HfArgumentParser(DataClassType(LMTrainingConfig), description=(__doc__ or "").split("\n\n")[0])
    (config,) = parser.parse_args_into_dataclasses(argv)
    stats = train_testbed_lm(config)
    print(json.dumps({k: v for k, v in stats.items() if k != "history"}))
    return stats


if __name__ == "__main__":
    main()
