"""Train a testbed reasoning LM from scratch on CPU (~45-50 min on 2 cores for v2, by the day's CPU speed).

    python -m hf_msv.testbed.train_lm --no-bf16 --threads 2 --output-dir hf_msv/testbed/lm-v2

reproduces the shipped default LM, testbed v2's (seeded; see ``DEFAULTS``: 2,800 steps; its ``training_log.json``
records the run: 50 min on 2 idle cores of an AVX2-only CPU, ~1 s per step in fp32; on such a CPU, with no native
bf16, bf16 autocast makes a step ~8x slower, so pass ``--no-bf16``; other thread counts give numerically slightly
different, equally good models; ``--device cuda`` trains the same recipe in minutes, for exploring task knobs;
``--emulate-bf16`` trains with bf16 autocast's rounding at fp32 speed, see :func:`emulate_bf16_autocast`). The model
is a plain ``LlamaForCausalLM`` with the character-level tokenizer of :mod:`hf_msv.testbed.tokenizer`; it loads with
``AutoModelForCausalLM`` / ``AutoTokenizer`` and no remote code.

Training data is an endless seeded stream of ``train``-split problems with noisy-solver traces of the task
(:mod:`hf_msv.testbed.task_v2`: ``make_training_trace``); a fraction ``elicit_frac`` of the examples are traces cut
where answers are elicited and followed by ``### Final Answer ### \\boxed{answer}`` + EOS. The loss skips the question
and the elicitation prompt itself (so the LM answers an elicitation but never emits one mid-trace on its own). The
context is 560 positions (prompt + a trace capped at 272 tokens + elicitation; :meth:`TestbedTask.context`). A trace
cut at the cap gets no EOS: sampling stops it there by ``max_new_tokens``, so the LM must learn to keep going rather
than to end cut traces itself. ``--soft-elicitation`` (v2) trains an elicited answer's tokens on the writer's whole
answer distribution rather than on the one answer drawn from it (:class:`TraceStream`); the text is the same.

``--task v1`` trains the first testbed (:mod:`hf_msv.testbed.task`, uncapped traces, context 512), whose LM ships in
``hf_msv/testbed/lm`` (``load_lm("testbed-v1")``): ``python -m hf_msv.testbed.train_lm --task v1 --threads 2
--output-dir hf_msv/testbed/lm`` (27 min on 2 idle CPU cores).
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
    """Endless seeded stream of tokenized training examples (input ids, labels, soft targets) of a testbed task.

    ``soft_elicitation`` (v2 only): an elicitation example's answer tokens are trained on the whole distribution the
    writer draws its answer from (:func:`~hf_msv.testbed.task_v2.answer_distribution`, per token: the next token's
    probability among the answers that share the tokens before it) instead of the one answer drawn: the same
    expected loss, without the draw's noise. The drawn answer is still the input, so the stream's text and random
    draws are those of the default."""

    def __init__(self, tokenizer, seed: int, elicit_frac: float, knobs: dict | None = None, pool: int = 20000,
                 task: str | TestbedTask = DEFAULT_TASK, soft_elicitation: bool = False):
        self.tok = tokenizer
        self.task = get_task(task) if isinstance(task, str) else task
        if soft_elicitation and not hasattr(self.task.module, "make_soft_elicitation_example"):
            raise ValueError(f"soft_elicitation needs a task whose writer states its answer distribution (v2), "
                             f"not {self.task.name}")
        self.knobs = dict(knobs or {})
        self.rng = random.Random(seed)
        # A large pool of distinct train problems, re-worded and re-traced every time one is drawn.
        self.problems = self.task.generate_problems("train", pool, seed=seed, **self.knobs)
        self.elicit_frac = elicit_frac
        self.soft_elicitation = soft_elicitation

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False).input_ids

    def example(self) -> tuple[list[int], list[int], list[tuple[int, dict]]]:
        """``(ids, labels, soft)``: ``soft`` lists ``(position, {token id: probability})`` for the positions whose
        label is a distribution (their hard label is -100); empty unless ``soft_elicitation``."""
        p = self.rng.choice(self.problems)
        prompt = [self.tok.bos_token_id] + self._ids(format_prompt(p))
        if self.rng.random() < self.elicit_frac:
            module, dist = self.task.module, None
            if self.soft_elicitation:
                prefix, elicit, answer, dist = module.make_soft_elicitation_example(p, self.rng, **self.knobs)
            else:
                prefix, elicit, answer = module.make_elicitation_example(p, self.rng, **self.knobs)
            a, b, c = self._ids(prefix), self._ids(elicit), self._ids(answer) + [self.tok.eos_token_id]
            ids = prompt + a + b + c
            if dist is None:
                return ids, [-100] * len(prompt) + a + [-100] * len(b) + c, []
            start = len(prompt) + len(a) + len(b)
            return ids, [-100] * len(prompt) + a + [-100] * (len(b) + len(c)), self._soft_targets(start, c, dist)
        text, finished = self.task.module.make_training_trace(p, self.rng, **self.knobs)
        # a trace cut at the length cap gets no EOS: the LM must not learn to stop where the cap cut it
        t = self._ids(text) + [self.tok.eos_token_id] * finished
        return prompt + t, [-100] * len(prompt) + t, []

    def _soft_targets(self, start: int, drawn: list[int], dist: dict[str, float]) -> list[tuple[int, dict]]:
        """Per position of the drawn answer's tokens, the next token's distribution among the answers of ``dist``
        that agree with the drawn one so far (teacher forcing: the drawn answer is what the LM reads)."""
        answers = [(self._ids(a) + [self.tok.eos_token_id], q) for a, q in dist.items() if q > 0]
        out = []
        for t in range(len(drawn)):
            nxt: dict[int, float] = {}
            for toks, q in answers:
                if len(toks) > t and toks[:t] == drawn[:t]:
                    nxt[toks[t]] = nxt.get(toks[t], 0.0) + q
            total = sum(nxt.values())
            out.append((start + t, {tok: q / total for tok, q in nxt.items()}))
        return out

    def batch(self, n: int):
        """``n`` examples, right-padded: ``(ids, labels, attention, soft)``, ``soft`` None or ``(rows, positions,
        targets)``: `(P,)`, `(P,)` and `(P, vocab)` for the P positions with a distribution as their label.
        Examples are drawn in chunks of 8 batches sorted by length (less padding)."""
        if not getattr(self, "_buf", None):
            exs = sorted((self.example() for _ in range(8 * n)), key=lambda e: len(e[0]))
            self._buf = [exs[i : i + n] for i in range(0, len(exs), n)]
            self.rng.shuffle(self._buf)
        exs = self._buf.pop()
        L = max(len(i) for i, _, _ in exs)
        ids = torch.full((n, L), self.tok.pad_token_id, dtype=torch.long)
        lab = torch.full((n, L), -100, dtype=torch.long)
        att = torch.zeros((n, L), dtype=torch.long)
        rows, cols, targets = [], [], []
        for r, (i, l, soft) in enumerate(exs):
            ids[r, : len(i)] = torch.tensor(i)
            lab[r, : len(l)] = torch.tensor(l)
            att[r, : len(i)] = 1
            for pos, dist in soft:
                target = torch.zeros(len(self.tok))
                target[list(dist)] = torch.tensor(list(dist.values()))
                rows.append(r)
                cols.append(pos)
                targets.append(target)
        soft = (torch.tensor(rows), torch.tensor(cols), torch.stack(targets)) if rows else None
        return ids, lab, att, soft


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


def _bf16_round(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to the nearest bf16 value, kept in fp32 (autograd rounds its gradient the same way)."""
    return x.to(torch.bfloat16).to(x.dtype)


def _bf16_rounded_linear(self, x: torch.Tensor) -> torch.Tensor:
    bias = None if self.bias is None else _bf16_round(self.bias)
    return _bf16_round(torch.nn.functional.linear(_bf16_round(x), _bf16_round(self.weight), bias))


_BF16_SDPA = "sdpa_bf16_rounded"


def _bf16_rounded_sdpa(module, query, key, value, attention_mask, **kwargs):
    """SDPA on bf16-rounded queries (after RoPE), keys and values, its output rounded: what autocast feeds and
    gets back from a bf16 attention kernel (the kernel's own rounding of the softmax weights is not emulated)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, weights = sdpa_attention_forward(module, _bf16_round(query), _bf16_round(key), _bf16_round(value),
                                          attention_mask, **kwargs)
    return _bf16_round(out), weights


def emulate_bf16_autocast(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model`` round to bf16 where bf16 autocast does, computing in fp32: every ``nn.Linear``'s input, weight
    and output, and the attention's inputs and output (norms, softmax statistics and the loss stay fp32, as there).

    This reproduces autocast's rounding where a CPU has no bf16 arithmetic, at fp32 speed instead of ~8x slower. Why
    it exists: the GPU-trained LMs of this recipe (bf16 autocast) rank their answers' probabilities better than the
    CPU fp32 ones (README, issue #17); this tests whether the rounding is what does it. Training only: the patch lives
    on the module instances and in ``model.config._attn_implementation``, which ``save_pretrained`` does not write, so
    the saved model is a plain Llama.
    """
    import types

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(_BF16_SDPA, _bf16_rounded_sdpa)
    AttentionMaskInterface.register(_BF16_SDPA, sdpa_mask)  # the causal mask SDPA gets
    model.config._attn_implementation = _BF16_SDPA
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.forward = types.MethodType(_bf16_rounded_linear, m)
    return model


def soft_label_loss(logits: torch.Tensor, labels: torch.Tensor, soft) -> torch.Tensor:
    """Mean next-token cross-entropy over the hard labels `(B, L)` and the soft ones (``TraceStream.batch``'s
    ``soft``: the token at ``positions`` predicted from ``positions - 1``) together; logits `(B, L, V)`."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    target = labels[:, 1:]
    known = target != -100
    hard = -logp[:, :-1][known].gather(-1, target[known][:, None]).sum()
    rows, positions, dist = soft
    soft_nll = -(dist * logp[rows, positions - 1]).sum()
    return (hard + soft_nll) / (known.sum() + len(rows))


def _train_step(model, opt, batch, device, bf16: bool) -> float:
    """One optimizer step on a `TraceStream` batch; returns the loss."""
    ids, lab, _, soft = batch
    ids, lab = ids.to(device), lab.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        # right padding + causal attention: pads never influence real positions, no mask needed (faster)
        if soft is None:
            loss = model(input_ids=ids, labels=lab).loss
        else:
            loss = soft_label_loss(model(input_ids=ids).logits, lab, tuple(x.to(device) for x in soft))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


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
    emulate_bf16: bool = False,
    soft_elicitation: bool = False,
    eval_every: int = 0,
    save_every: int = 0,
    log_every: int = 50,
    num_threads: int | None = None,
    device: str | torch.device = "cpu",
    log=print,
):
    """Train the testbed LM from scratch and save model + tokenizer (safetensors) to ``output_dir``.

    Returns a dict of training stats (wall time, parameters, final loss, ...), also written to
    ``output_dir/training_log.json``. The shipped checkpoint is trained on CPU; ``device="cuda"`` trains the same
    recipe on a GPU in ~3 min (numerically a different, equally good model), for exploring task knobs. ``task``:
    ``"v2"`` (the default testbed's; ``knobs`` are :class:`~hf_msv.testbed.task_v2.TaskKnobsV2`'s) or ``"v1"``
    (:class:`~hf_msv.testbed.task.TaskKnobs`). ``soft_elicitation`` (v2): train elicited answers on the writer's
    answer distribution instead of one draw from it (:class:`TraceStream`).
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
    if emulate_bf16:
        emulate_bf16_autocast(model)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"testbed {task.name} LM: {n_params / 1e6:.2f}M parameters, {steps} steps, batch {batch_size}, bf16={bf16}")
    stream = TraceStream(tok, seed, elicit_frac, knobs, task=task, soft_elicitation=soft_elicitation)
    opt = _adamw(model, lr, weight_decay)
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
            _save(model, tok, Path(output_dir) / "checkpoints" / f"step-{step + 1}")
    wall = time.time() - t0
    out = Path(output_dir)
    _save(model, tok, out)
    stats = {
        "task": task.name, "context": context,
        "steps": steps, "seed": seed, "batch_size": batch_size, "lr": lr, "d_model": d_model, "n_layers": n_layers,
        "n_heads": n_heads, "ffn_mult": ffn_mult, "elicit_frac": elicit_frac, "knobs": knobs,
        "task_knobs": asdict(task.knobs(**knobs)),  # every knob, defaults included: the data this LM was trained on
        "bf16": bf16, "emulate_bf16": emulate_bf16, "soft_elicitation": soft_elicitation,
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
    ap.add_argument("--emulate-bf16", action="store_true",
                    help="round to bf16 where bf16 autocast does (the linear layers' inputs, weights and outputs, "
                    "the attention's inputs and output) in fp32 arithmetic; with --no-bf16: autocast's rounding at "
                    "fp32 speed on CPUs without bf16")
    ap.add_argument("--soft-elicitation", action="store_true",
                    help="v2: train elicited answers on the writer's whole answer distribution, not one draw from it")
    ap.add_argument("--eval-every", type=int, default=0, help="sample-accuracy check on 64 validation problems")
    ap.add_argument("--save-every", type=int, default=0, help="also save <output-dir>/checkpoints/step-N")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="the shipped checkpoint is trained on cpu")
    a = ap.parse_args(argv)
    kw = {k: getattr(a, k) for k in DEFAULTS}
    stats = train_testbed_lm(
        a.output_dir, knobs=json.loads(a.knobs), task=a.task, bf16=not a.no_bf16, emulate_bf16=a.emulate_bf16,
        soft_elicitation=a.soft_elicitation, eval_every=a.eval_every, save_every=a.save_every,
        log_every=a.log_every, num_threads=a.threads, device=a.device, **kw,
    )
    print(json.dumps({k: v for k, v in stats.items() if k != "history"}))


if __name__ == "__main__":
    main()
