"""What MSV generation costs on top of chain-of-thought (CoT) decoding.

All models have random weights (costs do not depend on the weights' values).

Machine-independent figures (what decides wall time on a GPU, where a decode step is latency-bound):

A. ``forwards_per_cot_step``: LM forward calls (counted at the input embedding) per CoT decode step on a
   paper-shaped schedule: N = 64, 2,048 decode steps, each row's "Wait" forced every 150–300 steps at independent
   offsets, answers scripted to 12 tokens (a tiny random Qwen2: the count does not depend on the LM's size).
   Branches ride in the decoding batch, so only the terminal answers' short tail adds forwards. Goal ≤ 1.05.
   ``forwards_per_cot_step_serial`` is the count the previous design (each firing step's rows elicited
   synchronously: one prompt forward + L answer forwards while the batch waits) needs on the same schedule,
   computed from the recorded firing steps.
B. ``rows_steps_fraction_two_of_four_stopped``: rows × steps computed (Σ over forwards of the batch size, counted
   at the input embedding) by a 4-prompt call in which two prompts stop at 25 % of the budget, divided by the same
   call without early stopping. Stopped prompts leave the batch. Goal ≤ 0.65.

CPU wall-time ratios:

1. ``hook_overhead_ratio``: a hooked ``generate`` in which no delimiter fires, CoT time only (the N terminal answers
   it still elicits at the end are elicitation work, reported apart), divided by a plain ``generate`` that samples
   the same tokens (same seed; checked). Best of R alternating runs. Small Qwen2 LM (4 layers, width 256), N = 16.
2. ``elicitation_time_ratio`` / ``elicitation_token_ratio``: elicitation ÷ CoT, in wall time and in tokens the LM
   processed (elicitation prompt tokens fed + answer tokens; ``elicitation_answer_token_ratio`` counts answer
   tokens only). Goal: time ratio ≤ 1.2 × token ratio, i.e. an elicited token costs about what a CoT token does.
3. ``verifier_time_ratio_n16`` / ``_n64``: online MSV scoring time ÷ CoT decoding time, on a base LM of the paper's
   shape (DeepSeek-R1-Distill-Qwen-1.5B: Qwen2, 28 layers, width 1536, 12 heads, 2 KV heads, MLP 8960; vocabulary
   1000) and an MSV_N of the same width, answers elicited every 64 tokens, bf16 (the fast CPU path here). Goal:
   ≤ 2 % at N = 64. Measurements 2 and 3 come from the same runs.

A random LM never closes its box, so every answer would run to the 40-token cap. The paper-shape runs therefore
script the answers with a forward hook (``{`` then 10 filler tokens then ``}``: L = 12, a conservative length for
boxed math answers). The verifier's cost at the 40-token cap is measured too, by replaying the same answer schedule
(same N, steps, τ, order of arrival at the online cache) with 40-token answers through the verifier alone, divided by
the CoT time
of the matching run (``verifier_time_ratio_n64_cap40``).

Usage::

    python benchmarks/generation_overhead.py            # 192 decode steps, ~15 min on 2 CPU cores
    python benchmarks/generation_overhead.py --quick    # 128 decode steps
    python benchmarks/generation_overhead.py --counts-only   # A and B only (~1 min)

Prints figures; the last line is JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import time

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.initialization import no_init_weights

from hf_msv import MSVCache, MSVConfig, MSVVerifier
from hf_msv.generation import MSVEarlyStop, prepare_generation


def build_tokenizer(vocab_size: int, extra_words: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """Characters (so any text encodes, including the elicitation prompt) plus filler words up to `vocab_size`."""
    specials = ["<pad>", "<bos>", "<eos>", "<unk>"]
    # Whole-word tokens make the elicitation prompt 7 tokens long, as with a real BPE vocabulary.
    words = ["###", " Final", " Answer", "\\boxed", *extra_words]
    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    fillers = [f"<w{i}>" for i in range(max(0, vocab_size - len(specials) - len(words) - len(chars)))]
    vocab = {t: i for i, t in enumerate(specials + words + chars + fillers)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    pattern = "|".join(re.escape(w) for w in words) + r"|<w\d+>|[\s\S]"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )


def random_lm(config: Qwen2Config, dtype: torch.dtype, seed: int = 0) -> Qwen2ForCausalLM:
    """A random Qwen2 LM, initialised directly (N(0, 0.02) weights, unit norms): transformers' own init of a
    1.5B model takes minutes on this CPU."""
    with no_init_weights():
        model = Qwen2ForCausalLM(config)
    model = model.to(dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=generator)
    return model.eval()


def lm_config(vocab_size: int, **shape) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **shape,
    )


class ScriptedAnswers:
    """Forward hook: after ``\\boxed`` the LM writes ``{``, ``<w1>`` … ``<w{k}>``, ``}`` (an answer of k + 2
    tokens) by raising those logits; everything else is the random LM's own prediction."""

    def __init__(self, model, tokenizer, filler_tokens: int = 10):
        ids = tokenizer.convert_tokens_to_ids
        chain = ["\\boxed", "{"] + [f"<w{i}>" for i in range(1, filler_tokens + 1)] + ["}"]
        self.next = torch.full((len(tokenizer),), -1, dtype=torch.long)
        for a, b in itertools.pairwise(chain):
            self.next[ids(a)] = ids(b)
        self.handle = model.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs, output):
        logits = output.logits[:, -1]
        if self.next.device != logits.device:  # built on the CPU; the LM may run on an accelerator
            self.next = self.next.to(logits.device)
        target = self.next[kwargs["input_ids"][:, -1]]
        rows = (target >= 0).nonzero().squeeze(1)
        logits[rows, target[rows]] += 1000.0
        return output


def replay_verifier(verifier, n: int, steps: int, every: int, length: int) -> float:
    """Seconds the verifier spends on the answer schedule of one prompt's run (N sequences, an answer every
    `every` tokens and a terminal answer, all of `length` tokens), with answers handed to the online cache when
    generation hands them over: at step τ + L if that is within the run, else in the final flush."""
    fire = list(range(every - 1, steps, every))
    if not fire or fire[-1] != steps - 1:
        fire.append(steps - 1)  # terminal answers (token budget)
    arrivals: dict[int, list[tuple[int, int]]] = {}
    for k, tau in enumerate(fire):
        arrivals.setdefault(tau + length if tau + length <= steps - 1 else steps, []).append((k, tau))
    generator = torch.Generator().manual_seed(0)
    cache, seconds = MSVCache(), 0.0

    def column(values):
        return torch.tensor(values, dtype=torch.long)

    with torch.no_grad():
        for key in sorted(arrivals):
            batch = [(k, tau, s) for k, tau in arrivals[key] for s in range(n)]
            states = torch.randn(len(batch) * length, verifier.config.hidden_size, generator=generator)
            states = states.to(verifier.dtype)
            start = time.perf_counter()
            verifier(
                hidden_states=states,
                token_answer=torch.arange(len(batch)).repeat_interleave(length),
                answer_group=torch.zeros(len(batch), dtype=torch.long),
                answer_sequence=column([s for _, _, s in batch]),
                answer_step=column([k for k, _, _ in batch]),
                answer_end=column([tau + length for _, tau, _ in batch]),
                answer_class=torch.arange(len(batch)),
                past_key_values=cache,
                use_cache=True,
            )
            seconds += time.perf_counter() - start
    return seconds


class ForceDelimiters(LogitsProcessor):
    """The sampled chain of thought with a forced delimiter schedule: token `delimiter` is banned except at
    `schedule[row]` steps, where it is forced."""

    def __init__(self, prompt_length: int, delimiter: int, schedule: dict[int, set[int]]):
        self.prompt_length, self.delimiter, self.schedule = prompt_length, delimiter, schedule

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_length
        scores[:, self.delimiter] = float("-inf")
        for row, steps in self.schedule.items():
            if step in steps:
                scores[row] = float("-inf")
                scores[row, self.delimiter] = 0.0
        return scores


class ForwardCounter:
    """Forward hook on the input embedding: LM forward calls and rows × steps (Σ batch sizes)."""

    def __init__(self, model):
        self.calls = self.rows = 0
        self.handle = model.get_input_embeddings().register_forward_hook(self)

    def __call__(self, module, args, output):
        self.calls += 1
        self.rows += args[0].shape[0]


def tiny_scheduled_lm():
    tokenizer = build_tokenizer(160, extra_words=("Wait",))
    model = random_lm(
        lm_config(
            len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
        ),
        torch.float32,
    )
    return model, tokenizer


def scheduled_generate(
    model,
    tokenizer,
    prompts: list[str],
    n: int,
    steps: int,
    schedule,
    verifier=None,
    threshold=None,
    answer_length: int = 12,
):
    """One hooked ``generate`` under a forced delimiter schedule with scripted answers; returns (results, counter)."""
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    force = ForceDelimiters(inputs["input_ids"].shape[1], tokenizer.convert_tokens_to_ids("Wait"), schedule)
    script = ScriptedAnswers(model, tokenizer, filler_tokens=answer_length - 2)
    counter = ForwardCounter(model)
    try:
        with prepare_generation(
            model, tokenizer, verifier, delimiters=["Wait"], checker="exact" if verifier is not None else None
        ) as msv:
            torch.manual_seed(0)
            model.generate(
                **inputs,
                custom_generate=msv,
                do_sample=True,
                num_return_sequences=n,
                max_new_tokens=steps,
                min_new_tokens=steps,
                logits_processor=LogitsProcessorList([force]),
                stopping_criteria=[MSVEarlyStop(threshold)],
            )
            results = msv.pop_results()
    finally:
        script.handle.remove()
        counter.handle.remove()
    return results, counter


def forced_runs(model, tokenizer, inputs, n: int, steps: int):
    """`plain()` and `hooked(**prepare_generation_kwargs)()`: ``generate`` calls of exactly `steps` steps and N = `n`
    rows under `paper_schedule`'s forced "Wait", plain and through an `MSVSession` (full decoding; the latter returns
    the prompt's `MSVResult`); each seeds 0."""
    force = ForceDelimiters(
        inputs["input_ids"].shape[1], tokenizer.convert_tokens_to_ids("Wait"), paper_schedule(n, steps)
    )
    settings = dict(
        do_sample=True,
        num_return_sequences=n,
        max_new_tokens=steps,
        min_new_tokens=steps,
        logits_processor=LogitsProcessorList([force]),
    )

    def plain():
        torch.manual_seed(0)
        return model.generate(**inputs, **settings)

    def hooked(**msv_kwargs):
        def run():
            with prepare_generation(model, tokenizer, **msv_kwargs) as msv:
                torch.manual_seed(0)
                model.generate(**inputs, **settings, custom_generate=msv, stopping_criteria=[MSVEarlyStop(None)])
                return msv.pop_results()[0]

        return run

    return plain, hooked


def paper_schedule(n: int, steps: int, seed: int = 0) -> dict[int, set[int]]:
    """The steps at which each of `n` rows fires: every 150–300 steps, at independent offsets."""
    rng = random.Random(seed)
    schedule = {}
    for row in range(n):
        fire, at = set(), rng.randrange(150, 301)
        while at < steps - 1:
            fire.add(at)
            at += rng.randrange(150, 301)
        schedule[row] = fire
    return schedule


def paper_schedule_counts(n: int = 64, steps: int = 2048, answer_length: int = 12, seed: int = 0) -> dict:
    """Section A: forward calls per CoT step with each row firing every 150–300 steps at independent offsets."""
    model, tokenizer = tiny_scheduled_lm()
    schedule = paper_schedule(n, steps, seed)
    start = time.perf_counter()
    (result,), counter = scheduled_generate(
        model, tokenizer, ["Question: 17 + 25 = ?"], n, steps, schedule, answer_length=answer_length
    )
    seconds = time.perf_counter() - start
    assert counter.calls == result.compute["forward_calls"]
    assert all(a.length == answer_length for a in result.answers)
    delimiter_steps = {a.tau for a in result.answers if a.trigger == "delimiter"}
    # The serial design: per step with firings, one forward for the fed prompts + one per answer token (the
    # batch waits); the N terminal answers at the end once more.
    serial = steps + (len(delimiter_steps) + 1) * (1 + answer_length)
    figures = {
        "schedule_n": n,
        "schedule_steps": steps,
        "schedule_answers": len(result.answers),
        "schedule_firing_steps": len(delimiter_steps),
        "forward_calls": counter.calls,
        "forwards_per_cot_step": counter.calls / steps,
        "forwards_per_cot_step_serial": serial / steps,
        "schedule_rows_per_forward": counter.rows / counter.calls,
    }
    print(
        f"[A: paper schedule] N={n}, {steps} steps, {len(result.answers)} answers of {answer_length} tokens "
        f"({len(delimiter_steps)} steps with firings): {counter.calls} forwards = "
        f"{figures['forwards_per_cot_step']:.3f} per CoT step (serial design: "
        f"{figures['forwards_per_cot_step_serial']:.3f}); {figures['schedule_rows_per_forward']:.1f} rows per "
        f"forward on average; {seconds:.0f}s on this CPU"
    )
    return figures


def stopped_rows_fraction(n: int = 16, steps: int = 512, answer_length: int = 12) -> dict:
    """Section B: rows × steps of a 4-prompt call where prompts 0 and 1 stop at 25 % of the budget, over the same
    call without early stopping."""
    model, tokenizer = tiny_scheduled_lm()
    torch.manual_seed(0)
    config = MSVConfig(
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_sequences=n,
        mode="streaming",
        gamma_hidden_size=8,
    )
    verifier = MSVVerifier(config).eval()
    with torch.no_grad():
        verifier.head.bias.fill_(4.0)  # every score ≈ 0.98: the first available answer reaches λ = 0.5
    elicitation = len(tokenizer("### Final Answer ### \\boxed", add_special_tokens=False)["input_ids"])
    fire = steps // 4 - elicitation - answer_length  # available at exactly 25 % of the budget
    schedule = {row: {fire} for row in range(2 * n)}  # prompts 0 and 1 only
    prompts = [f"Question {i}: 17 + {i} = ?" for i in range(4)]
    rows = {}
    for lam in (None, 0.5):
        results, counter = scheduled_generate(
            model, tokenizer, prompts, n, steps, schedule, verifier, lam, answer_length
        )
        rows[lam] = counter.rows
        stops = [r.stop_step if r.stopped_early else None for r in results]
    assert stops[:2] == [steps // 4] * 2 and stops[2:] == [None, None], stops
    fraction = rows[0.5] / rows[None]
    print(
        f"[B: stopped prompts leave the batch] 4 prompts x N={n}, budget {steps}: prompts 0, 1 stop at step "
        f"{steps // 4}; rows x steps {rows[0.5]} vs {rows[None]} without stopping = {fraction:.3f}"
    )
    return {
        "rows_steps_fraction_two_of_four_stopped": fraction,
        "rows_steps_stopped": rows[0.5],
        "rows_steps_no_stop": rows[None],
    }


class TimedEarlyStop(MSVEarlyStop):
    """`MSVEarlyStop` that also accumulates the wall time of its own calls: a direct, noise-free reading of the
    per-step bookkeeping (delimiter pre-filter, row state) when nothing fires."""

    def __init__(self):
        super().__init__(None)
        self.seconds = 0.0

    def __call__(self, input_ids, scores=None, **kwargs):
        start = time.perf_counter()
        done = super().__call__(input_ids, scores, **kwargs)
        self.seconds += time.perf_counter() - start
        return done


def hook_overhead(steps: int, repeats: int, n: int = 16) -> dict:
    tokenizer = build_tokenizer(128)
    model = random_lm(
        lm_config(
            len(tokenizer),
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
        ),
        torch.float32,
    )
    inputs = tokenizer(["Question: what is 17 + 25? Answer:"], return_tensors="pt")
    # min_new_tokens keeps EOS away, so both runs decode exactly `steps` tokens per sequence.
    settings = dict(do_sample=True, num_return_sequences=n, max_new_tokens=steps, min_new_tokens=steps)

    def plain():
        torch.manual_seed(0)
        start = time.perf_counter()
        out = model.generate(**inputs, **settings)
        return time.perf_counter() - start, out

    bookkeeping = []

    def hooked():
        # "Wait" (4 characters) essentially never forms under random sampling; checked below.
        with prepare_generation(model, tokenizer, delimiters=["Wait"], checker=None) as msv:
            criterion = TimedEarlyStop()
            torch.manual_seed(0)
            out = model.generate(**inputs, **settings, custom_generate=msv, stopping_criteria=[criterion])
            (result,) = msv.pop_results()
        assert all(a.terminal for a in result.answers), "a delimiter fired"
        bookkeeping.append(criterion.seconds)
        return result.timings, out

    plain()  # warm-up
    plain_times, cot_times, total_times = [], [], []
    for _ in range(repeats):
        seconds, reference = plain()
        timings, out = hooked()
        assert torch.equal(reference, out), "hooked generate sampled different tokens"
        plain_times.append(seconds)
        cot_times.append(timings["cot"])
        total_times.append(timings["total"])
    # Best of R: the machine is shared, and interference only ever adds time.
    plain_s, cot_s, total_s = (min(x) for x in (plain_times, cot_times, total_times))
    print(
        f"[hook] N={n}, {steps} steps, best of {repeats}: plain {plain_s:.2f}s, hooked CoT {cot_s:.2f}s "
        f"(x{cot_s / plain_s:.3f}), hooked total incl. {n} terminal answers {total_s:.2f}s; time inside the "
        f"criterion per call of generate {min(bookkeeping):.3f}s (x{1 + min(bookkeeping) / plain_s:.3f})"
    )
    return {
        "hook_overhead_ratio": cot_s / plain_s,
        "hook_total_ratio_with_terminal_answers": total_s / plain_s,
        "hook_criterion_overhead_ratio": 1 + min(bookkeeping) / plain_s,
        "hook_plain_seconds": plain_s,
    }


def paper_shape(model, tokenizer, n: int, steps: int, every: int = 64, answer_length: int = 12) -> dict:
    config = MSVConfig(
        hidden_size=model.config.hidden_size,
        num_attention_heads=model.config.num_attention_heads,
        num_sequences=n,
        mode="streaming",
    )
    torch.manual_seed(0)
    verifier = MSVVerifier(config).to(model.dtype).eval()
    inputs = tokenizer(["Question: find all real x with x^2 - 5x + 6 = 0."], return_tensors="pt")
    script = ScriptedAnswers(model, tokenizer, filler_tokens=answer_length - 2)
    try:
        with prepare_generation(
            model, tokenizer, verifier, delimiters=[], every_k_tokens=every, checker="exact", max_answer_tokens=40
        ) as msv:
            torch.manual_seed(0)
            model.generate(
                **inputs,
                custom_generate=msv,
                do_sample=True,
                num_return_sequences=n,
                max_new_tokens=steps,
                min_new_tokens=steps,
                stopping_criteria=[MSVEarlyStop(1.5)],
            )
            (result,) = msv.pop_results()
    finally:
        script.handle.remove()
    assert all(a.length == answer_length for a in result.answers)
    t = result.timings
    figures = {
        "cot_seconds": t["cot"],
        "elicitation_seconds": t["elicitation"],
        "verifier_seconds": t["verifier"],
        "equivalence_seconds": t["equivalence"],
        "cot_tokens": result.tokens_decoded,
        "elicitation_tokens": result.elicitation_tokens,
        "answer_tokens": result.answer_tokens,
        "answers": len(result.answers),
    }
    figures["verifier_time_ratio"] = t["verifier"] / t["cot"]
    figures["elicitation_time_ratio"] = t["elicitation"] / t["cot"]
    figures["elicitation_token_ratio"] = result.elicitation_tokens / result.tokens_decoded
    figures["elicitation_answer_token_ratio"] = result.answer_tokens / result.tokens_decoded
    print(
        f"[paper shape] N={n}, {steps} steps, answers every {every} tokens: {len(result.answers)} answers; "
        f"CoT {t['cot']:.1f}s ({result.tokens_decoded} tokens, {t['cot'] / steps:.2f}s/step), "
        f"elicitation {t['elicitation']:.1f}s ({result.elicitation_tokens} tokens, "
        f"{result.answer_tokens} of them answer tokens), verifier {t['verifier']:.3f}s, "
        f"equivalence {t['equivalence']:.3f}s"
    )
    replay = replay_verifier(verifier, n, steps, every, answer_length)
    figures["verifier_time_ratio_cap40"] = replay_verifier(verifier, n, steps, every, 40) / t["cot"]
    print(
        f"    verifier replay of the same schedule: {replay:.3f}s (in generation {t['verifier']:.3f}s); with "
        f"40-token answers verifier/CoT would be {figures['verifier_time_ratio_cap40']:.4f}"
    )
    print(
        f"    verifier/CoT {figures['verifier_time_ratio']:.4f}; elicitation/CoT time "
        f"{figures['elicitation_time_ratio']:.3f} vs tokens {figures['elicitation_token_ratio']:.3f} "
        f"(answer tokens only {figures['elicitation_answer_token_ratio']:.3f})"
    )
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: N = 8 and 320 steps for A, 32 steps "
        "for the hook, a small LM (width 256, 4 layers) instead of the paper's shape for 2-3; the "
        "counts (A, B) hold, the ratios are not the paper shape's",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--steps", type=int, default=None, help="decode steps (default: 192, quick: 128)")
    parser.add_argument("--counts-only", action="store_true", help="only the machine-independent counts (A, B)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps or (96 if args.quick else 192)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {'quick' if args.quick else 'full'}")

    report = paper_schedule_counts(n=8, steps=320) if args.quick else paper_schedule_counts()
    report.update(stopped_rows_fraction(n=8, steps=256) if args.quick else stopped_rows_fraction())
    report["goals_met"] = {
        "forwards_per_cot_step_le_1.05": report["forwards_per_cot_step"] <= 1.05,
        "rows_steps_fraction_le_0.65": report["rows_steps_fraction_two_of_four_stopped"] <= 0.65,
    }
    if args.counts_only:
        print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in report.items()}))
        return
    report.update(hook_overhead(steps=32 if args.quick else steps, repeats=1 if args.quick else 5))

    tokenizer = build_tokenizer(1000)
    start = time.perf_counter()
    shape = dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2
    )
    if args.quick:
        shape = dict(
            hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
        )
    model = random_lm(lm_config(len(tokenizer), **shape), torch.bfloat16)
    print(
        f"{'small' if args.quick else 'paper-shape'} LM: {sum(p.numel() for p in model.parameters()) / 1e9:.3f}B "
        f"parameters, bf16, built in {time.perf_counter() - start:.0f}s"
    )
    runs = {n: paper_shape(model, tokenizer, n, steps) for n in (16, 64)}

    report.update(
        {
            "elicitation_time_ratio": runs[16]["elicitation_time_ratio"],
            "elicitation_token_ratio": runs[16]["elicitation_token_ratio"],
            "elicitation_answer_token_ratio": runs[16]["elicitation_answer_token_ratio"],
            "elicitation_time_ratio_n64": runs[64]["elicitation_time_ratio"],
            "elicitation_token_ratio_n64": runs[64]["elicitation_token_ratio"],
            "verifier_time_ratio_n16": runs[16]["verifier_time_ratio"],
            "verifier_time_ratio_n64": runs[64]["verifier_time_ratio"],
            "verifier_time_ratio_n16_cap40": runs[16]["verifier_time_ratio_cap40"],
            "verifier_time_ratio_n64_cap40": runs[64]["verifier_time_ratio_cap40"],
            "answer_length": 12,
            "cot_seconds_per_step_n16": runs[16]["cot_seconds"] / steps,
            "cot_seconds_per_step_n64": runs[64]["cot_seconds"] / steps,
            "decode_steps": steps,
            "every_k_tokens": 64,
            "quick": args.quick,
        }
    )
    report["goals_met"] |= {
        "hook_overhead_le_1.10": report["hook_overhead_ratio"] <= 1.10,
        "elicitation_time_le_1.2x_tokens": report["elicitation_time_ratio"] <= 1.2 * report["elicitation_token_ratio"],
        "verifier_le_2pct_at_n64": report["verifier_time_ratio_n64"] <= 0.02,
    }
    print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in report.items()}))


if __name__ == "__main__":
    main()
