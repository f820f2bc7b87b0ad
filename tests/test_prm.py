import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForTokenClassification

from hf_msv.evaluation.prm import STEP_TOKEN, PRMScorer, build_prm_text, split_steps

SPECIALS = ["[PAD]", "[UNK]", STEP_TOKEN, "<|im_start|>", "<|im_end|>"]
WORDS = ("system user assistant Please reason step by step , and put your final answer within \\ boxed {} { } . "
         "The is What 2 3 5 + = ? add then so we get the Let think").split()
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {w: i for i, w in enumerate(dict.fromkeys(SPECIALS + WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")


@pytest.fixture(scope="module")
def model(tokenizer):
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, num_labels=2, max_position_embeddings=256,
                      pad_token_id=tokenizer.pad_token_id)
    return Qwen2ForTokenClassification(cfg).eval()


COT = "Let think .\n\nWhat is 2 + 3 ?\n\n\n\nadd then 2 + 3 = 5 ."


def test_split_steps_appends_answer_and_drops_markers():
    assert split_steps(COT, "5") == ["Let think .", "What is 2 + 3 ?", "add then 2 + 3 = 5 .",
                                     "The final answer is \\boxed{5}."]
    assert split_steps(f"a{STEP_TOKEN}b", None) == ["ab", "The final answer is \\boxed{}."]


def test_chat_template_and_chatml_fallback_agree(tokenizer):
    steps = ["a", "b"]
    fallback = build_prm_text(tokenizer, "q", steps)
    assert fallback.count(STEP_TOKEN) == 2 and fallback.startswith("<|im_start|>system\nPlease reason")
    tokenizer.chat_template = CHATML
    try:
        assert build_prm_text(tokenizer, "q", steps) == fallback
    finally:
        tokenizer.chat_template = None


def test_markers_found_probabilities_in_unit_interval(tokenizer, model):
    scorer = PRMScorer(model, tokenizer)
    ids, n_steps = scorer.encode("What is 2 + 3 ?", COT, "5")
    assert n_steps == 4 and ids.count(tokenizer.convert_tokens_to_ids(STEP_TOKEN)) == 4
    (p,) = scorer.step_probabilities_batch(["What is 2 + 3 ?"], [COT], ["5"])
    assert p.shape == (4,) and np.all((p > 0) & (p < 1))
    assert scorer.score("What is 2 + 3 ?", COT, "5") == pytest.approx(p[-1])
    assert PRMScorer(model, tokenizer, aggregate="min").score("What is 2 + 3 ?", COT, "5") == pytest.approx(p.min())
    assert PRMScorer(model, tokenizer, aggregate="prod").score("What is 2 + 3 ?", COT, "5") == pytest.approx(p.prod())


def test_batch_equals_single(tokenizer, model):
    scorer = PRMScorer(model, tokenizer, batch_size=2)
    qs = ["What is 2 + 3 ?", "What is 2 ?", "What is 3 + 3 ?"]
    cots = [COT, "so we get 2 .", "Let think .\n\nadd then 3 + 3 ."]
    answers = ["5", "2", None]
    batch = scorer.score_batch(qs, cots, answers)
    single = [scorer.score(q, c, a) for q, c, a in zip(qs, cots, answers)]
    np.testing.assert_allclose(batch, single, atol=1e-5)


class _StubPRM(torch.nn.Module):
    """Logit difference (positive − negative) = 0.1 · position, so P(positive) at position i is σ(0.1 i)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, attention_mask=None):
        pos = torch.arange(input_ids.shape[1], dtype=torch.float32).expand(input_ids.shape)
        return (torch.stack([torch.zeros_like(pos), 0.1 * pos], dim=-1) + self.w,)


def test_positive_class_probability_at_markers(tokenizer):
    scorer = PRMScorer(_StubPRM(), tokenizer)
    ids, _ = scorer.encode("q", "a\n\nb", "1")
    at = np.flatnonzero(np.array(ids) == tokenizer.convert_tokens_to_ids(STEP_TOKEN))
    (p,) = scorer.step_probabilities_batch(["q"], ["a\n\nb"], ["1"])
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-0.1 * at)), rtol=1e-6)


def test_rejects_tokenizer_without_step_token(model):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match="extra_0"):
        PRMScorer(model, PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]"))
