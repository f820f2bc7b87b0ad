"""Scripted tiny LMs and MSV verifiers for the generation tests (tests/test_generation.py and the modules that decode
the same way: cache exactness, hybrid caches, scorers, stopping, CUDA).

Builds a character-level tokenizer whose vocabulary also holds whole-word tokens ("Wait", " Wait", "\\n\\nWait", "Wa",
"it"), tiny random LMs of several architectures over it (`tiny_model`), tiny verifiers (`tiny_verifier`), and two
instruments that make runs deterministic:

* `ForceTokens`, a logits processor for the *sampled* chain of thought: it forbids delimiter and EOS tokens
  everywhere except where a test schedules them, so a test decides when delimiters fire and sequences end.
* `ScriptedAnswers`, a forward hook on the LM that makes its greedy continuation after ``\\boxed`` write ``{d}``
  (d the digit the random LM prefers in that context) or, with ``close=False``, never close the box.

Also the references the tests compare against: a cache-free recomputation of an answer (`recompute_answer`), an
offline verifier forward (`offline_scores`) and an online scripted run (`online_run`).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import transformers
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerFast

from hf_msv import MSVConfig, MSVVerifier
from hf_msv.answers import ELICITATION_PROMPT
from hf_msv.data import AnswerGroup
from hf_msv.generation import MSVEarlyStop, MSVResult, MSVSession, prepare_generation
from hf_msv.stop_rules import StopEvents

from .tokenizer import CHARS, SPECIAL, word_level_tokenizer

WORDS = ["\\boxed", "###", " Final", " Answer", "\n\nWait", " Wait", "Wait", "Wa", "it", "\n\n"]
PAD, BOS, EOS = 0, 1, 2


def make_tokenizer() -> PreTrainedTokenizerFast:
    return word_level_tokenizer(WORDS)


TOK = make_tokenizer()
V = len(TOK)
ID = {t: TOK.convert_tokens_to_ids(t) for t in SPECIAL + WORDS + CHARS}
HIDDEN = 32


def tiny_config(arch: str):
    common = dict(vocab_size=V, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    decoder = dict(hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, **common)
    configs = {
        "llama": lambda: transformers.LlamaConfig(num_key_value_heads=2, **decoder),
        "qwen2": lambda: transformers.Qwen2Config(num_key_value_heads=2, **decoder),
        "qwen3": lambda: transformers.Qwen3Config(num_key_value_heads=2, head_dim=8, **decoder),
        "gpt2": lambda: transformers.GPT2Config(n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=256, **common),
        "mistral": lambda: transformers.MistralConfig(num_key_value_heads=2, sliding_window=512, **decoder),
        "phi3": lambda: transformers.Phi3Config(num_key_value_heads=2, **decoder),
        "gpt_neox": lambda: transformers.GPTNeoXConfig(**decoder),
        "gemma2": lambda: transformers.Gemma2Config(num_key_value_heads=2, head_dim=8, sliding_window=512, **decoder),
        "opt": lambda: transformers.OPTConfig(
            hidden_size=HIDDEN,
            ffn_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=HIDDEN,
            **common,
        ),
        "falcon": lambda: transformers.FalconConfig(
            hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, **common
        ),
        "bloom": lambda: transformers.BloomConfig(hidden_size=HIDDEN, n_layer=2, n_head=4, **common),
        "olmo2": lambda: transformers.Olmo2Config(num_key_value_heads=2, **decoder),
    }
    return configs[arch]()


ARCHS = ["llama", "qwen2", "qwen3", "gpt2", "mistral", "phi3", "gpt_neox", "gemma2", "opt", "falcon", "bloom", "olmo2"]


def tiny_model(arch: str = "llama", seed: int = 0):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(tiny_config(arch)).eval()


def tiny_verifier(mode: str = "streaming", num_sequences: int = 4, bias: float | None = None, hidden=HIDDEN):
    torch.manual_seed(123)
    verifier = MSVVerifier(
        MSVConfig(
            hidden_size=hidden,
            num_attention_heads=2,
            intermediate_size=64,
            num_sequences=num_sequences,
            mode=mode,
            gamma_hidden_size=8,
        )
    ).eval()
    if bias is not None:
        with torch.no_grad():
            verifier.head.bias.fill_(bias)
    return verifier


class ForceTokens(LogitsProcessor):
    """Sampled chain of thought under test control: `schedule[(row, step)] = token` forces a token; `banned`
    tokens (delimiter pieces, EOS) are never sampled otherwise."""

    BANNED = ("\n\nWait", " Wait", "Wait", "Wa", "W", "<eos>", "<pad>", "<bos>", "\\boxed")

    def __init__(self, prompt_length: int, schedule: dict[tuple[int, int], int] | None = None):
        self.prompt_length = prompt_length
        self.schedule = schedule or {}
        self.banned = [ID[t] for t in self.BANNED]

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_length
        scores = scores.clone()
        scores[:, self.banned] = float("-inf")
        for (row, when), token in self.schedule.items():
            if when == step:
                scores[row] = float("-inf")
                scores[row, token] = 0.0
        return scores


class ScriptedAnswers:
    """Forward hook: after ``\\boxed`` the LM prefers ``{``, then a digit, then ``}`` (or the digit ``1`` forever
    with `close=False`). It edits the logits at every position from that position's input token, so a cache-free
    recomputation of a branch sees the same script."""

    def __init__(self, model, close: bool = True):
        self.close = close
        self.digits = torch.tensor([ID[str(d)] for d in range(10)])
        self.handle = model.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs, output):
        logits = output.logits  # (batch, positions kept, vocab)
        inputs = (kwargs["input_ids"] if "input_ids" in kwargs else args[0])[:, -logits.shape[1] :]
        digits = self.digits.to(logits.device)
        digit = digits[logits[..., digits].argmax(-1)] if self.close else torch.full_like(inputs, ID["1"])
        target = torch.where(inputs == ID["\\boxed"], ID["{"], -1)
        target = torch.where(inputs == ID["{"], digit, target)
        target = torch.where(torch.isin(inputs, digits), ID["}"] if self.close else ID["1"], target)
        rows, positions = (target >= 0).nonzero(as_tuple=True)
        logits[rows, positions, target[rows, positions]] += 1000.0
        return output


def prompts(texts=("Hello there, solve 2+2", "Hi")):
    return TOK(list(texts), return_tensors="pt", padding=True)


def generate(msv, inputs, n, max_new_tokens, schedule=None, threshold=None, seed=1, criteria=True, prune=None):
    """A seeded, scripted ``model.generate`` through the `MSVSession` `msv` (its loop as ``custom_generate``); a bare
    model instead of a session calls plain ``generate``."""
    torch.manual_seed(seed)
    processors = LogitsProcessorList([ForceTokens(inputs["input_ids"].shape[1], schedule)])
    kwargs = dict(stopping_criteria=[MSVEarlyStop(threshold, prune)]) if criteria else {}
    model = msv
    if isinstance(msv, MSVSession):
        model, kwargs["custom_generate"] = msv.model, msv
    return model.generate(
        **inputs,
        do_sample=True,
        num_return_sequences=n,
        max_new_tokens=max_new_tokens,
        logits_processor=processors,
        **kwargs,
    )


def recompute_answer(model, inputs, result: MSVResult, answer):
    """Hidden states and greedy tokens of `answer`, recomputed without cache from its full context."""
    prompt = inputs["input_ids"][result.prompt][inputs["attention_mask"][result.prompt].bool()].tolist()
    context = prompt + result.sequences[answer.sequence][: answer.cot_tokens] + answer.elicitation_ids
    with torch.no_grad():
        out = model(torch.tensor([context + answer.token_ids]), output_hidden_states=True)
    hidden = out.hidden_states[-1][0, len(context) :]
    greedy = out.logits[0, len(context) - 1 : -1].argmax(-1).tolist()
    return hidden, greedy


P = len(TOK(ELICITATION_PROMPT, add_special_tokens=False)["input_ids"])  # elicitation prompt tokens


def offline_scores(verifier, result_list, group_size):
    """Score every scored answer of `result_list` in one offline verifier forward (no cache)."""
    answers = [a for r in result_list for a in r.answers if a.score is not None]
    n_groups = -(-max(r.num_sequences for r in result_list) // group_size)
    column = lambda values: torch.tensor(values, dtype=torch.long)
    out = verifier(
        hidden_states=torch.cat([a.hidden_states for a in answers]),
        token_answer=torch.repeat_interleave(torch.arange(len(answers)), column([a.length for a in answers])),
        answer_group=column([a.prompt * n_groups + a.sequence // group_size for a in answers]),
        answer_sequence=column([a.sequence % group_size for a in answers]),
        answer_step=column([a.step for a in answers]),
        answer_end=column([a.end for a in answers]),
        answer_class=column([a.class_id for a in answers]),
    )
    return out.probabilities, torch.tensor([a.score for a in answers])


def online_run(n: int, group_size: int, device="cpu"):
    """Tiny LM and verifier on `device` decode n sequences per prompt with scripted Waits and λ > 1 (nothing stops).
    Returns (plain sampling, hooked sampling, results, a CPU copy of the verifier for the offline reference)."""
    model = tiny_model("llama").to(device)
    ScriptedAnswers(model)
    verifier = tiny_verifier(num_sequences=group_size)
    cpu_verifier = copy.deepcopy(verifier)
    inputs = prompts().to(device)
    schedule = {(r, s): ID["Wait"] for r in range(2 * n) for s in range(r % 3 + 1, 14, 4)}
    torch.manual_seed(3)
    plain = model.generate(
        **inputs,
        do_sample=True,
        num_return_sequences=n,
        max_new_tokens=14,
        logits_processor=LogitsProcessorList([ForceTokens(inputs["input_ids"].shape[1], schedule)]),
    )
    with prepare_generation(
        model, TOK, verifier.to(device), delimiters=["Wait"], checker="exact", capture_hidden_states=True
    ) as msv:
        hooked = generate(msv, inputs, n=n, max_new_tokens=14, schedule=schedule, threshold=1.5, seed=3)
        results = msv.pop_results()
    return plain, hooked, results, cpu_verifier


def answer_group(result: MSVResult) -> tuple[AnswerGroup, np.ndarray | str]:
    """The recorded answer stream of `result` (from any engine) as the evaluation sees it, with its online scores
    (nan: unscored); with a class-level statistic, the live class snapshots too, under the method name returned."""
    answers = result.answers
    scores = np.array([np.nan if a.score is None else a.score for a in answers])
    live = sorted(((a.end, v) for a in answers for v in a.class_values or ()), key=lambda row: row[0])
    position = {id(a): i for i, a in enumerate(answers)}
    events = {}
    if live:
        events["live"] = StopEvents(
            time=np.array([t for t, _ in live]),
            answer=np.array([position[id(v.answer)] for _, v in live]),
            statistic=np.array([v.statistic for _, v in live]),
            confidence=np.array([v.confidence for _, v in live]),
            klass=np.array([v.answer.class_id for _, v in live]),
        )
    group = AnswerGroup(
        sequence=[a.sequence for a in answers],
        end=[a.end for a in answers],
        klass=[a.class_id for a in answers],
        correct=np.zeros(len(answers), bool),
        is_terminal=[a.terminal for a in answers],
        seq_len=[len(s) for s in result.sequences],
        start=[a.tau for a in answers],
        scores={"live": np.nan_to_num(scores)} if live else {},
        events=events,
    )
    return group, ("live" if live else scores)


def replay_group(result: MSVResult):
    """The recorded answer stream of `result` (from any engine) as the pruning replay reads it
    (`hf_msv.training.pruned_replay.ReplayGroup`). A chain without a terminal answer (cut by a prune or the stop) has
    no known end: its length is unbounded, so the replay treats it as decoding until the replay cuts it."""
    from hf_msv.training.pruned_replay import ReplayGroup

    a = result.answers
    column = lambda name: np.array([getattr(x, name) for x in a], np.int64)
    terminal = np.array([x.terminal for x in a], bool)
    seq_len = np.full(result.num_sequences, 10**9, np.int64)
    seq_len[column("sequence")[terminal]] = column("tau")[terminal]
    return ReplayGroup(
        sequence=column("sequence"),
        step=column("step"),
        end=column("end"),
        start=column("tau"),
        klass=column("class_id"),
        correct=np.zeros(len(a), bool),
        terminal=terminal,
        seq_len=seq_len,
    )
