"""Tests of the PRM baseline (hf_msv.evaluation.prm): the Qwen2.5-Math-PRM protocol (steps, markers, the 2-class
probability at each marker, batching), the chains of thought decoded from shards, and ``hf-msv evaluate --prm`` on a
tiny collected split scored by a tiny random PRM-shaped model, with the clear error on shards without CoT tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer, LlamaConfig, LlamaForTokenClassification, PreTrainedTokenizerFast

from helpers.collect import SETTINGS, make_tokenizer, tiny_lm, tiny_problems
from helpers.tokenizer import word_level_tokenizer
from hf_msv.collect import collect
from hf_msv.data import ShardDataset, list_shards, read_shard, write_shard
from hf_msv.evaluation import PRMScorer, build_prm_text, load_lm_tokenizer, main, split_steps
from hf_msv.evaluation.prm import QWEN_PRM_SYSTEM, STEP_TOKEN, answer_contexts

pytestmark = pytest.mark.usefixtures("single_thread")

CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
COT = "Let think.\n\nWhat is 2 + 3?\n\n\n\nadd then 2 + 3 = 5."


def prm_tokenizer() -> PreTrainedTokenizerFast:
    return word_level_tokenizer([STEP_TOKEN, "<|im_start|>", "<|im_end|>"])


def prm_model(tokenizer, seed: int = 0) -> LlamaForTokenClassification:
    """A tiny random PRM-shaped model: per-token 2-class logits, as Qwen2.5-Math-PRM returns. (Llama rather than
    Qwen2: a saved Qwen2 config makes AutoTokenizer rebuild the word-level test tokenizer as a byte-level one.)"""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=2,
        max_position_embeddings=1024,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForTokenClassification(cfg).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return prm_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return prm_model(tokenizer)


# ----------------------------------------------------------------------------------------------------------------
# Protocol
# ----------------------------------------------------------------------------------------------------------------


def test_split_steps_appends_answer_and_drops_markers():
    assert split_steps(COT, "5") == [
        "Let think.",
        "What is 2 + 3?",
        "add then 2 + 3 = 5.",
        "The final answer is \\boxed{5}.",
    ]
    assert split_steps(f"a{STEP_TOKEN}b", None) == ["ab", "The final answer is \\boxed{}."]
    assert split_steps("", "7") == ["The final answer is \\boxed{7}."]  # an answer elicited at τ = 0


def test_chat_template_and_chatml_fallback_agree(tokenizer):
    steps = ["a", "b"]
    fallback = build_prm_text(tokenizer, f"q{STEP_TOKEN}", steps)  # a marker in the question is dropped too
    assert fallback.count(STEP_TOKEN) == 2 and fallback.startswith("<|im_start|>system\n" + QWEN_PRM_SYSTEM)
    tokenizer.chat_template = CHATML
    try:
        assert build_prm_text(tokenizer, "q", steps) == fallback
    finally:
        tokenizer.chat_template = None


def test_markers_found_probabilities_in_unit_interval(tokenizer, model):
    scorer = PRMScorer(model, tokenizer)
    ids, n_steps = scorer.encode("What is 2 + 3?", COT, "5")
    assert n_steps == 4 and ids.count(tokenizer.convert_tokens_to_ids(STEP_TOKEN)) == 4
    (p,) = scorer.step_probabilities_batch(["What is 2 + 3?"], [COT], ["5"])
    assert p.shape == (4,) and np.all((p > 0) & (p < 1))
    assert scorer.tokens == len(ids)
    assert scorer.score("What is 2 + 3?", COT, "5") == pytest.approx(p[-1])
    assert PRMScorer(model, tokenizer, aggregate="min").score("What is 2 + 3?", COT, "5") == pytest.approx(p.min())
    assert PRMScorer(model, tokenizer, aggregate="prod").score("What is 2 + 3?", COT, "5") == pytest.approx(p.prod())


def test_batch_equals_single(tokenizer, model):
    scorer = PRMScorer(model, tokenizer, batch_size=2)
    qs = ["What is 2 + 3?", "What is 2?", "What is 3 + 3?"]
    cots = [COT, "so we get 2.", "Let think.\n\nadd then 3 + 3."]
    answers = ["5", "2", None]
    batch = scorer.score_batch(qs, cots, answers)  # padded batches of different lengths
    single = [scorer.score(q, c, a) for q, c, a in zip(qs, cots, answers)]
    np.testing.assert_allclose(batch, single, atol=1e-5)


class _StubPRM(torch.nn.Module):
    """Logit difference (positive − negative) = 0.1 · position, so P(positive) at position i is σ(0.1 i)."""

    def __init__(self, classes: int = 2):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.classes = classes

    def forward(self, input_ids, attention_mask=None):
        pos = torch.arange(input_ids.shape[1], dtype=torch.float32).expand(input_ids.shape)
        logits = torch.stack([torch.zeros_like(pos), 0.1 * pos] + [pos] * (self.classes - 2), dim=-1)
        return (logits + self.w,)


def test_positive_class_probability_at_markers(tokenizer):
    scorer = PRMScorer(_StubPRM(), tokenizer)
    ids, _ = scorer.encode("q", "a\n\nb", "1")
    at = np.flatnonzero(np.array(ids) == tokenizer.convert_tokens_to_ids(STEP_TOKEN))
    (p,) = scorer.step_probabilities_batch(["q"], ["a\n\nb"], ["1"])
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-0.1 * at)), rtol=1e-6)


def test_bad_models_and_tokenizers_are_refused(model, tokenizer):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match="extra_0"):
        PRMScorer(model, PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]"))
    # a base model (what AutoModel gives a PRM checkpoint without its remote code) returns states, not 2 logits
    with pytest.raises(ValueError, match=r"not \(B, T, 2\)"):
        PRMScorer(_StubPRM(classes=5), tokenizer).score("q", "a", "1")
    with pytest.raises(ValueError, match="aggregate"):
        PRMScorer(model, tokenizer, aggregate="mean")


# ----------------------------------------------------------------------------------------------------------------
# On shards and through `hf-msv evaluate --prm`
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """A tiny collected split (4 problems × 2 sequences) whose info names a saved LM tokenizer, and a saved PRM."""
    root = tmp_path_factory.mktemp("prm")
    make_tokenizer().save_pretrained(root / "lm-tokenizer")
    lm_tok = AutoTokenizer.from_pretrained(root / "lm-tokenizer")
    torch.set_num_threads(1)
    collect(tiny_lm(), lm_tok, tiny_problems(4), root / "eval", **SETTINGS)
    tok = prm_tokenizer()
    prm_model(tok, seed=1).save_pretrained(root / "prm")
    tok.save_pretrained(root / "prm")
    return root


def test_answer_contexts_decode_the_cot_prefix_of_each_answer(collected):
    lm_tok = load_lm_tokenizer(ShardDataset(collected / "eval").info)
    assert lm_tok.name_or_path == str(collected / "lm-tokenizer")  # named by the shards' collection info
    (problem, *_), _ = read_shard(list_shards(collected / "eval")[0], hidden=False)
    contexts = answer_contexts(problem, lm_tok)
    assert len(contexts) == problem.num_answers
    for a, text in enumerate(contexts):
        seq = problem.cot_token_ids[problem.answer_sequence[a]].tolist()
        ids = seq if problem.answer_terminal[a] else seq[: problem.answer_tau[a]]
        assert text == lm_tok.decode(ids, skip_special_tokens=True)
        assert "<eos>" not in text
    assert any(not t for t in problem.answer_terminal)  # streaming answers (delimiters) are among them


def test_evaluate_with_prm_scores_every_answer(collected, tmp_path):
    out = tmp_path / "report"
    results = main(
        [
            "--eval-dir",
            str(collected / "eval"),
            "--output-dir",
            str(out),
            "--num-sequences",
            "1",
            "2",
            "--no-figures",
            "--no-progress",
            "--prm",
            str(collected / "prm"),
            "--prm-batch-size",
            "3",
        ]
    )
    # The same answers scored directly, as the baseline defines them.
    scorer = PRMScorer.from_pretrained(str(collected / "prm"))
    lm_tok = load_lm_tokenizer({}, str(collected / "lm-tokenizer"))  # the --lm-tokenizer override path
    problems = ShardDataset(collected / "eval").read_problems()
    expected = [
        scorer.score_batch([p.question] * p.num_answers, answer_contexts(p, lm_tok), p.answer_text) for p in problems
    ]
    assert all(p.question.startswith("Q") for p in problems)
    for setting, rows in (
        ("terminal", [p.answer_terminal for p in problems]),
        ("streaming", [np.ones(p.num_answers, bool) for p in problems]),
    ):
        assert {"PRM", "PRM+WV", "Token Probs", "DeepConf"} <= set(results.setting(setting)["2"])
        s = np.concatenate([e[r] for e, r in zip(expected, rows)])
        y = np.concatenate([p.answer_correct[r] for p, r in zip(problems, rows)])
        # N = 2 = every collected sequence: the pooled Brier is over every answer of the setting
        got = results.setting(setting)["2"]["PRM"].metrics["brier"].values[0]
        assert got == pytest.approx(np.mean((s - y) ** 2), abs=1e-6), setting
    assert results.costs is not None and results.costs.prm is not None
    cost = results.costs.prm["eval"]
    assert cost["answers"] == sum(p.num_answers for p in problems)
    assert cost["tokens"] == sum(
        len(scorer.encode(p.question, c, a)[0])
        for p in problems
        for c, a in zip(answer_contexts(p, lm_tok), p.answer_text)
    )
    assert results.config.prm is not None and results.config.prm["aggregate"] == "last"
    assert results.costs.verifier_online_s_per_answer["2"]["PRM"] > 0
    report = (out / "report.md").read_text()
    assert "| PRM |" in report and "PRM (`" in report


def test_evaluate_with_prm_refuses_shards_without_cot_token_ids(collected, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    for path in list_shards(collected / "eval"):  # the same shards as written before CoT token ids were kept
        problems, info = read_shard(path)
        for p in problems:
            p.cot_token_ids = []
        write_shard(old / path.name, problems, info)
    args = [
        "--eval-dir",
        str(old),
        "--output-dir",
        str(tmp_path / "r"),
        "--num-sequences",
        "2",
        "--no-figures",
        "--no-progress",
    ]
    # checked before the PRM is loaded: a missing PRM is not what fails
    with pytest.raises(ValueError, match=r"predate CoT token ids.*re-collected"):
        main(args + ["--prm", str(tmp_path / "no-such-prm")])
    assert "PRM" not in main(args).terminal["2"]  # without --prm they evaluate as before
