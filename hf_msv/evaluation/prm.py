"""The process-reward-model (PRM) baseline (``hf-msv evaluate --prm``): `PRMScorer` scores every collected answer
with the Qwen2.5-Math-PRM protocol, from the question and the chain of thought up to the answer decoded from the
shards' CoT token ids (`answer_contexts`, `score_with_prm`). Works with any model whose forward returns (B, T, 2)
logits. Protocol and cost: ``docs/evaluation.md``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from ..data import CollectedProblem, ShardDataset
from ..errors import UserError

__all__ = [
    "STEP_TOKEN",
    "QWEN_PRM_SYSTEM",
    "ANSWER_TEMPLATE",
    "split_steps",
    "build_prm_text",
    "PRMScorer",
    "require_cot_token_ids",
    "load_lm_tokenizer",
    "answer_contexts",
    "score_with_prm",
]

STEP_TOKEN = "<extra_0>"
QWEN_PRM_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
ANSWER_TEMPLATE = "The final answer is \\boxed{{{answer}}}."
AGGREGATES = ("last", "min", "prod")


def split_steps(
    reasoning_text: str, answer: str | None, step_separator: str = "\n\n", answer_template: str = ANSWER_TEMPLATE
) -> list[str]:
    """Non-empty stripped steps of `reasoning_text` split on `step_separator`, plus the answer as the last step.

    Literal step tokens are removed from the text so a marker count always equals the step count. A missing
    answer (None: no box) is rendered with an empty box.
    """
    steps = [t.replace(STEP_TOKEN, "").strip() for t in reasoning_text.split(step_separator)]
    steps = [t for t in steps if t]
    return steps + [answer_template.format(answer="" if answer is None else answer.replace(STEP_TOKEN, ""))]


def build_prm_text(tokenizer, question: str, steps: Sequence[str], system: str = QWEN_PRM_SYSTEM) -> str:
    """The chat string the PRM scores: the tokenizer's chat template, or ChatML (Qwen's format) if it has none."""
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": question.replace(STEP_TOKEN, "")},
        {"role": "assistant", "content": STEP_TOKEN.join(steps) + STEP_TOKEN},
    ]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


class PRMScorer:
    """Score answers with a Qwen2.5-Math-PRM-style model.

    Args:
        model: returns per-token 2-class logits (B, T, 2); class 1 = "step is correct".
        tokenizer: must map ``<extra_0>`` to a single token id.
        step_separator: splits the chain of thought into steps (Qwen's PRM was trained on "\\n\\n"-separated steps).
        aggregate: "last" (default: the answer step's probability), "min" or "prod" over the step probabilities.
        system, answer_template: the chat's system prompt (Qwen's default) and how the answer step is written.
        batch_size: inputs per forward pass in the batched methods.
    Attributes: ``tokens`` (real tokens forwarded so far), ``padded_tokens`` (with padding), ``over_context``
    (inputs longer than the model's ``max_position_embeddings``, if it has one), ``name``.
    """

    def __init__(
        self,
        model,
        tokenizer,
        step_separator: str = "\n\n",
        aggregate: str = "last",
        system: str = QWEN_PRM_SYSTEM,
        answer_template: str = ANSWER_TEMPLATE,
        batch_size: int = 8,
    ):
        if aggregate not in AGGREGATES:
            raise UserError(f"aggregate must be one of {AGGREGATES}, not {aggregate!r}")
        if batch_size < 1:
            raise UserError(f"batch_size must be positive, got {batch_size}")
        self.model, self.tokenizer = model, tokenizer
        self.step_separator, self.aggregate, self.system = step_separator, aggregate, system
        self.answer_template, self.batch_size = answer_template, batch_size
        self.step_token_id = tokenizer.convert_tokens_to_ids(STEP_TOKEN)
        if self.step_token_id is None or self.step_token_id == getattr(tokenizer, "unk_token_id", -1):
            raise UserError(
                f"the PRM's tokenizer has no single token for {STEP_TOKEN!r} (a Qwen2.5-Math-PRM-style "
                "model marks the end of every step with it)"
            )
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)
        self.name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
        self.context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.tokens = self.padded_tokens = self.over_context = 0

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, trust_remote_code: bool = False, dtype: str = "auto", device=None, **kwargs
    ) -> PRMScorer:
        """Load a PRM (a directory or Hub id) and its tokenizer: ``AutoModelForTokenClassification`` for a
        ``*ForTokenClassification`` checkpoint, else ``AutoModel`` (Qwen2.5-Math-PRM maps it to its remote
        ``Qwen2ForProcessRewardModel``: pass ``trust_remote_code=True`` to run that code). `kwargs` go to
        `PRMScorer`."""
        from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification, AutoTokenizer

        from ..utils import resolve_device

        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        token_classifier = any(a.endswith("ForTokenClassification") for a in config.architectures or [])
        auto = AutoModelForTokenClassification if token_classifier else AutoModel
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        model = auto.from_pretrained(name_or_path, dtype=torch_dtype, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        return cls(model.to(resolve_device(device)).eval(), tokenizer, **kwargs)

    def encode(self, question: str, reasoning_text: str, answer: str | None) -> tuple[list[int], int]:
        """(input ids, number of steps) for one (question, chain of thought so far, answer)."""
        steps = split_steps(reasoning_text, answer, self.step_separator, self.answer_template)
        text = build_prm_text(self.tokenizer, question, steps, self.system)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids, len(steps)

    def _forward(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) right-padded ids and (B, T) float32 P(step correct) of one batch of encoded inputs."""
        device = getattr(self.model, "device", None) or next(self.model.parameters()).device
        width = max(len(r) for r in rows)
        # right padding: positions of real tokens are unchanged and a causal model never attends to pads
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row)
            mask[r, : len(row)] = 1
        res = self.model(input_ids=ids.to(device), attention_mask=mask.to(device))
        logits = res.logits if hasattr(res, "logits") else res[0]
        if logits.dim() != 3 or logits.shape[-1] != 2:
            raise UserError(
                f"the PRM returned outputs of shape {tuple(logits.shape)}, not (B, T, 2) step logits: "
                "load a PRM head (Qwen2.5-Math-PRM needs trust_remote_code) or a "
                "*ForTokenClassification model with num_labels=2"
            )
        self.tokens += int(mask.sum())
        self.over_context += sum(len(r) > self.context for r in rows) if self.context else 0
        self.padded_tokens += ids.numel()
        return ids, torch.softmax(logits.float(), dim=-1)[..., 1].cpu()

    @torch.inference_mode()
    def step_probabilities_batch(
        self, questions: Sequence[str], reasoning_texts: Sequence[str], answers: Sequence[str | None]
    ) -> list[np.ndarray]:
        """Per input, (S,) P(positive) at each ``<extra_0>`` (one per step, the answer step last)."""
        enc = [self.encode(q, r, a) for q, r, a in zip(questions, reasoning_texts, answers, strict=True)]
        out: list[np.ndarray | None] = [None] * len(enc)
        order = np.argsort([len(ids) for ids, _ in enc], kind="stable")  # similar lengths share a batch
        for b in range(0, len(order), self.batch_size):
            idx = order[b : b + self.batch_size]
            ids, prob = self._forward([enc[i][0] for i in idx])
            for r, i in enumerate(idx):
                at = torch.zeros(ids.shape[1], dtype=torch.bool)
                at[: len(enc[i][0])] = ids[r, : len(enc[i][0])] == self.step_token_id
                p = prob[r][at].numpy().astype(np.float64)
                if p.size != enc[i][1]:
                    raise RuntimeError(f"found {p.size} {STEP_TOKEN} markers for {enc[i][1]} steps")
                out[i] = p
        return out  # type: ignore[return-value]

    def _aggregate(self, p: np.ndarray) -> float:
        return float(p[-1] if self.aggregate == "last" else p.min() if self.aggregate == "min" else np.prod(p))

    def score_batch(
        self, questions: Sequence[str], reasoning_texts: Sequence[str], answers: Sequence[str | None]
    ) -> np.ndarray:
        """(B,) answer scores in (0, 1) for aligned questions / chains of thought so far / answers."""
        return np.array(
            [self._aggregate(p) for p in self.step_probabilities_batch(questions, reasoning_texts, answers)],
            dtype=np.float64,
        )

    def score(self, question: str, reasoning_text: str, answer: str | None) -> float:
        """Score of one answer given the question and the chain of thought decoded so far."""
        return float(self.score_batch([question], [reasoning_text], [answer])[0])


# ----------------------------------------------------------------------------------------------------------------
# Scoring shards
# ----------------------------------------------------------------------------------------------------------------


def require_cot_token_ids(dataset: ShardDataset, what: str = "evaluation") -> None:
    """Raise a clear error when some problem of `dataset` has no chain-of-thought token ids (the PRM reads the
    CoT text), without reading any tensor."""
    missing = [pid for p, pid in enumerate(dataset.problem_ids) if not dataset.has_cot_token_ids(p)]
    if missing:
        raise UserError(
            f"the PRM baseline needs each sequence's chain-of-thought token ids, but {len(missing)} of "
            f"{dataset.num_problems} {what} problems have none (e.g. {missing[0]!r} in {dataset.files[0].parent}): "
            "these shards predate CoT token ids (or their traces lacked them) and must be re-collected with "
            "this version of `hf-msv collect` to run --prm"
        )


def load_lm_tokenizer(info: dict, override=None):
    """The tokenizer of the LM that sampled the shards: `override` (a tokenizer, a path or Hub id, or the name of a
    registered LM, `hf_msv.registry`, e.g. ``"testbed"``), else the one named in the shards' collection info
    (``tokenizer``, else ``lm_name_or_path``)."""
    if override is not None and not isinstance(override, str):
        return override
    from transformers import AutoTokenizer

    from ..registry import get_named_lm

    name = override or info.get("tokenizer") or info.get("lm_name_or_path")
    named = get_named_lm(name)
    if named is not None:
        name = str(named.path)
    if not name:
        raise UserError(
            "the shards' collection info names no LM tokenizer to decode the chains of thought with: "
            "pass the LM's tokenizer (--lm-tokenizer PATH_OR_HUB_ID)"
        )
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise UserError(
            f"cannot load the LM tokenizer {name!r} to decode the chains of thought ({err}); pass "
            "--lm-tokenizer PATH_OR_HUB_ID"
        ) from err


def answer_contexts(problem: CollectedProblem, lm_tokenizer) -> list[str]:
    """`A` strings: the chain of thought each stored answer saw, ``cot_token_ids[n][:τ]`` (terminal answers: the
    whole sequence) decoded with the LM's tokenizer, special tokens dropped."""
    if not problem.cot_token_ids:
        raise UserError(f"problem {problem.problem_id!r} has no chain-of-thought token ids")
    out = []
    for n, tau, terminal in zip(problem.answer_sequence, problem.answer_tau, problem.answer_terminal):
        ids = problem.cot_token_ids[n] if terminal else problem.cot_token_ids[n][:tau]
        out.append(lm_tokenizer.decode(ids.tolist(), skip_special_tokens=True))
    return out


def score_with_prm(
    scorer: PRMScorer, problems: Sequence[CollectedProblem], lm_tokenizer, progress: bool = False
) -> tuple[list[np.ndarray], dict]:
    """Every stored answer's PRM score: per problem an `(A,)` float64 array, and the cost ``{"answers",
    "tokens" (real tokens forwarded), "padded_tokens", "seconds", "over_context" (inputs longer than the PRM's
    ``max_position_embeddings``)}``. Problems are scored one at a time (each one's answers batched by length)."""
    from tqdm.auto import tqdm

    before = (scorer.tokens, scorer.padded_tokens, scorer.over_context)
    start, scores = time.perf_counter(), []
    for problem in tqdm(problems, desc="PRM", unit="problem", disable=not progress, dynamic_ncols=True):
        contexts = answer_contexts(problem, lm_tokenizer)
        scores.append(scorer.score_batch([problem.question] * problem.num_answers, contexts, problem.answer_text))
    tokens, padded, over = (
        now - b for now, b in zip((scorer.tokens, scorer.padded_tokens, scorer.over_context), before)
    )
    if over:
        warnings.warn(
            f"{over} PRM inputs are longer than the PRM's {scorer.context} positions: their scores are extrapolated",
            RuntimeWarning,
            stacklevel=2,
        )
    return scores, {
        "answers": sum(p.num_answers for p in problems),
        "tokens": tokens,
        "padded_tokens": padded,
        "seconds": time.perf_counter() - start,
        "over_context": over,
    }
