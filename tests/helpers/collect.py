"""The tiny scripted random Llama of the collection tests (tests/test_collect.py, and the PRM and training tests
that collect with it): a character-level tokenizer with ``\\boxed`` and ``Wait`` tokens, `ScriptedAnswers` (after
``\\boxed`` the LM writes ``{d}``, d the parity of where it branched: a learnable label), tiny problems, the
reference collection settings and `run_collect`, the reference collection itself (also run by subprocess scripts)."""

from __future__ import annotations

import torch
import transformers
from transformers import PreTrainedTokenizerFast

from hf_msv.collect import collect
from hf_msv.data.problems import Problem

from .tokenizer import CHARS, SPECIAL, word_level_tokenizer

WORDS = ["\\boxed", "Wait"]
HIDDEN = 32


def make_tokenizer() -> PreTrainedTokenizerFast:
    return word_level_tokenizer(WORDS)


TOK = make_tokenizer()
ID = {t: TOK.convert_tokens_to_ids(t) for t in SPECIAL + WORDS + CHARS}


class ScriptedAnswers:
    """Forward hook: after ``\\boxed`` the LM writes ``{d}`` with d = parity of the position of ``{`` ("0" or "1"),
    so answers vary with where the sequence branched, and whether an answer is "1" is visible in its tokens (a
    learnable label). Positions come from ``position_ids`` (as generate and the elicitation branches pass them), so a
    cache-free recomputation of a branch sees the same script."""

    def __init__(self, model):
        self.digits = torch.tensor([ID[str(d)] for d in range(10)])
        model.register_forward_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs, output):
        logits = output.logits
        inputs = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(inputs.shape[1]).expand_as(inputs)
        inputs, positions = inputs[:, -logits.shape[1] :], positions[:, -logits.shape[1] :]
        digit = self.digits[positions % 2]
        target = torch.where(inputs == ID["\\boxed"], ID["{"], -1)
        target = torch.where(inputs == ID["{"], digit, target)
        target = torch.where(torch.isin(inputs, self.digits), ID["}"], target)
        rows, cols = (target >= 0).nonzero(as_tuple=True)
        logits[rows, cols, target[rows, cols]] += 1000.0
        return output


def tiny_lm(seed: int = 0, scripted: bool = True):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(TOK),
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    if scripted:
        ScriptedAnswers(model)
    return model


def tiny_problems(n: int, offset: int = 0) -> list[Problem]:
    return [
        Problem(id=f"tiny/{i}", question=f"Q{i}: add {i} and {i % 7}. Wait", gold=str(i % 3), source="tiny")
        for i in range(offset, offset + n)
    ]


SETTINGS = dict(
    num_samples=2,
    max_new_tokens=12,
    delimiters=["Wait", "e"],
    checker="exact",
    prompt_template="plain",
    problems_per_shard=3,
    seed=3,
    progress=False,
)


def run_collect(output_dir, num_problems: int = 7, **overrides):
    """The reference collection used by every test of tests/test_collect.py and by its subprocess scripts."""
    torch.set_num_threads(1)
    settings = dict(SETTINGS, **overrides)
    return collect(tiny_lm(), TOK, tiny_problems(num_problems), output_dir, **settings)
