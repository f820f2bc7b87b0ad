"""Process-reward-model (PRM) baseline following the protocol of Qwen2.5-Math-PRM-7B (Zhang et al., 2025).

Protocol (model card): a system/user/assistant chat whose assistant turn is the solution's steps, each followed by
the step token ``<extra_0>``; the model returns 2-class logits per token and the reward of step i is
softmax(logits)[positive] at the i-th ``<extra_0>``. As in the paper's baseline, the chain of thought decoded so far
is split into steps and the (intermediate or terminal) answer is appended as a final step; the answer's score is that
last step's probability (``aggregate="last"``; ``"min"`` and ``"prod"`` are also offered).

Works with any model whose forward returns (B, T, 2) logits as ``.logits`` or ``[0]``: the real PRM loaded with
``AutoModel.from_pretrained(..., trust_remote_code=True)`` or a ``*ForTokenClassification`` with ``num_labels=2``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["STEP_TOKEN", "QWEN_PRM_SYSTEM", "split_steps", "build_prm_text", "PRMScorer"]

STEP_TOKEN = "<extra_0>"
QWEN_PRM_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
ANSWER_TEMPLATE = "The final answer is \\boxed{{{answer}}}."


def split_steps(reasoning_text: str, answer: str | None, step_separator: str = "\n\n",
                answer_template: str = ANSWER_TEMPLATE) -> list[str]:
    """Non-empty stripped steps of `reasoning_text` split on `step_separator`, plus the answer as the last step.

    Literal step tokens are removed from the text so a marker count always equals the step count. A missing
    answer (None: no box) is rendered with an empty box.
    """
    steps = [t.replace(STEP_TOKEN, "").strip() for t in reasoning_text.split(step_separator)]
    steps = [t for t in steps if t]
    return steps + [answer_template.format(answer="" if answer is None else answer.replace(STEP_TOKEN, ""))]


def build_prm_text(tokenizer, question: str, steps: Sequence[str], system: str = QWEN_PRM_SYSTEM) -> str:
    """The chat string the PRM scores: the tokenizer's chat template, or ChatML (Qwen's format) if it has none."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question},
                {"role": "assistant", "content": STEP_TOKEN.join(steps) + STEP_TOKEN}]
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
        system: system prompt of the chat (Qwen's default).
        batch_size: sequences per forward pass in the batched methods.
    """

    def __init__(self, model, tokenizer, step_separator: str = "\n\n", aggregate: str = "last",
                 system: str = QWEN_PRM_SYSTEM, answer_template: str = ANSWER_TEMPLATE, batch_size: int = 8):
        if aggregate not in ("last", "min", "prod"):
            raise ValueError(f"aggregate must be 'last', 'min' or 'prod', not {aggregate!r}")
        self.model, self.tokenizer = model, tokenizer
        self.step_separator, self.aggregate, self.system = step_separator, aggregate, system
        self.answer_template, self.batch_size = answer_template, batch_size
        self.step_token_id = tokenizer.convert_tokens_to_ids(STEP_TOKEN)
        if self.step_token_id is None or self.step_token_id == getattr(tokenizer, "unk_token_id", -1):
            raise ValueError(f"tokenizer has no single token for {STEP_TOKEN!r}")
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)

    def encode(self, question: str, reasoning_text: str, answer: str | None) -> tuple[list[int], int]:
        """(input ids, number of steps) for one (question, chain of thought so far, answer)."""
        steps = split_steps(reasoning_text, answer, self.step_separator, self.answer_template)
        text = build_prm_text(self.tokenizer, question, steps, self.system)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids, len(steps)

    @torch.inference_mode()
    def step_probabilities_batch(self, questions: Sequence[str], reasoning_texts: Sequence[str],
                                 answers: Sequence[str | None]) -> list[np.ndarray]:
        """Per input, (S,) P(positive) at each ``<extra_0>`` (one per step, the answer step last)."""
        enc = [self.encode(q, r, a) for q, r, a in zip(questions, reasoning_texts, answers, strict=True)]
        out: list[np.ndarray | None] = [None] * len(enc)
        device = getattr(self.model, "device", None) or next(self.model.parameters()).device
        order = np.argsort([len(ids) for ids, _ in enc], kind="stable")   # similar lengths share a batch
        for b in range(0, len(order), self.batch_size):
            idx = order[b:b + self.batch_size]
            width = max(len(enc[i][0]) for i in idx)
            # right padding: positions of real tokens are unchanged and a causal model never attends to pads
            ids = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                ids[r, :len(enc[i][0])] = torch.tensor(enc[i][0])
                mask[r, :len(enc[i][0])] = 1
            res = self.model(input_ids=ids.to(device), attention_mask=mask.to(device))
            logits = res.logits if hasattr(res, "logits") else res[0]
            prob = torch.softmax(logits.float(), dim=-1)[..., 1].cpu()
            for r, i in enumerate(idx):
                at = (ids[r] == self.step_token_id) & mask[r].bool()
                p = prob[r][at].numpy().astype(np.float64)
                if p.size != enc[i][1]:
                    raise RuntimeError(f"found {p.size} {STEP_TOKEN} markers for {enc[i][1]} steps")
                out[i] = p
        return out  # type: ignore[return-value]

    def _aggregate(self, p: np.ndarray) -> float:
        return float(p[-1] if self.aggregate == "last" else p.min() if self.aggregate == "min" else np.prod(p))

    def score_batch(self, questions: Sequence[str], reasoning_texts: Sequence[str],
                    answers: Sequence[str | None]) -> np.ndarray:
        """(B,) answer scores in (0, 1) for aligned questions / chains of thought so far / answers."""
        return np.array([self._aggregate(p) for p in self.step_probabilities_batch(questions, reasoning_texts,
                                                                                  answers)], dtype=np.float64)

    def score(self, question: str, reasoning_text: str, answer: str | None) -> float:
        """Score of one answer given the question and the chain of thought decoded so far."""
        return float(self.score_batch([question], [reasoning_text], [answer])[0])
