"""The generation hook: `prepare_generation` makes an `MSVSession` for an LM; `msv_generate` is the one-call entry.

An `MSVSession` is a ``generate`` decoding loop: ``model.generate(**inputs, custom_generate=msv,
stopping_criteria=[MSVEarlyStop(λ)])`` runs the lockstep loop with MSV elicitation, scoring, early stopping and
pruning, and collects one `MSVResult` per prompt in ``msv.results`` (``docs/generation.md``). The model is not
modified.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from ..elicitation import ElicitationSettings
from ..pruning import PruneRule
from .core import RunSetup
from .lockstep import lockstep_sample
from .outputs import MSVResult
from .policy import eos_token_ids
from .run import GenerationRun
from .scorers import as_scorer
from .stopping import CERTIFIED, MSVEarlyStop

if TYPE_CHECKING:
    from ..equivalence import EquivalenceChecker

__all__ = ["MSVSession", "msv_generate", "prepare_generation"]


class MSVSession:
    """MSV generation for one LM, made by `prepare_generation` (arguments documented there): the decoding loop to
    pass as ``model.generate(..., custom_generate=msv)``, and the results of the calls it ran.

    Args:
        model, tokenizer, verifier: the LM, its tokenizer and what scores the answers (`None`: no scoring).
        elicitation: the base `ElicitationSettings` (`resolve_elicitation`).
        checker: an equivalence checker name or object; required with a verifier.
        num_sequences: N of `generate` when called without one (``model.generate`` takes ``num_return_sequences``).
        capture_hidden_states: keep every answer's hidden states in the results.
        offload_hidden_states: move each answer's states to CPU as soon as it completes.
        **overrides: `ElicitationSettings` fields to change.

    Raises:
        NotImplementedError: for an encoder-decoder LM.
        ValueError: if a verifier is given with ``checker=None``, or it cannot read the LM's hidden states.

    Attributes:
        results: `MSVResult`s of the ``generate`` calls since the last `pop_results` (one per prompt, in order).
        elicitor: the `AnswerElicitor`: how fired rows become branches and when an answer ends.
        matcher: the `DelimiterMatcher` (`None` without text delimiters, or in terminal mode).
        scorer: the `AnswerScorer` made of ``verifier`` (`scorers.as_scorer`; `None` without verifier).
    """

    def __init__(
        self,
        model,
        tokenizer,
        verifier=None,
        *,
        elicitation: ElicitationSettings | None = None,
        checker: str | EquivalenceChecker | None = "symbolic",
        num_sequences: int | None = None,
        capture_hidden_states: bool = False,
        offload_hidden_states: bool = True,
        **overrides,
    ):
        if getattr(model.config, "is_encoder_decoder", False):
            raise NotImplementedError("MSV generation supports decoder-only LMs.")
        scorer = as_scorer(verifier) if verifier is not None else None
        self.setup = RunSetup.build(
            tokenizer,
            scorer.config if scorer is not None else None,
            model.config.get_text_config().hidden_size,
            model.config.name_or_path,
            elicitation=elicitation,
            checker=checker,
            **overrides,
        )
        self.elicitation, self.checker, self.policy = self.setup.settings, self.setup.checker, self.setup.policy
        self.model, self.tokenizer, self.verifier, self.scorer = model, tokenizer, verifier, scorer
        self.num_sequences = num_sequences
        self.capture_hidden_states = capture_hidden_states
        self.offload_hidden_states = offload_hidden_states
        self.elicitor, self.matcher = self.policy.elicitor, self.policy.matcher
        self.prompt_ids, self.pad_token_id = self.elicitor.prompt_ids, self.elicitor.pad_token_id
        self.results: list[MSVResult] = []

    def __enter__(self) -> MSVSession:
        return self

    def __exit__(self, *exc):
        return None

    def pop_results(self) -> list[MSVResult]:
        """Return and clear the accumulated results."""
        results, self.results = self.results, []
        return results

    # -- the decoding loop -------------------------------------------------------------------------------------

    def __call__(
        self,
        model,
        input_ids: torch.LongTensor,
        logits_processor,
        stopping_criteria,
        generation_config,
        synced_gpus: bool = False,
        streamer=None,
        **model_kwargs,
    ):
        """The decoding loop of ``model.generate(**inputs, custom_generate=msv, stopping_criteria=[MSVEarlyStop(λ)])``:
        `lockstep_sample` driven by one `GenerationRun`, whose λ and pruning rule are the `MSVEarlyStop`'s (none
        given: full decoding). Appends one `MSVResult` per prompt to `results`.

        Args: as ``GenerationMixin._sample`` (``generate`` passes them). Returns: what `lockstep_sample` returns.

        Raises:
            ValueError: another model than the session's, two `MSVEarlyStop`, or a threshold without verifier.
            NotImplementedError: beam search.
        """
        if model is not self.model:
            raise ValueError("this MSVSession was prepared for another model: prepare_generation(model, ...) first.")
        if (generation_config.num_beams or 1) > 1:
            raise NotImplementedError("MSV generation supports sampling and greedy search, not beam search.")
        ours = [c for c in stopping_criteria if isinstance(c, MSVEarlyStop)]
        if len(ours) > 1:
            raise ValueError("pass at most one MSVEarlyStop.")
        if not ours:
            ours = [MSVEarlyStop(None)]
            stopping_criteria.append(ours[0])
        criterion = ours[0]
        if criterion.threshold is not None and self.verifier is None:
            raise ValueError("MSVEarlyStop(threshold) needs a verifier: pass verifier=... to prepare_generation.")
        run = GenerationRun(
            self.policy.with_eos(eos_token_ids(generation_config)),
            self.scorer,
            new_classes=self.setup.new_classes(),
            keep_hidden_states=self.capture_hidden_states,
            offload_hidden_states=self.offload_hidden_states,
            num_sequences=generation_config.num_return_sequences or 1,
            max_new_tokens=generation_config.max_new_tokens,
            max_length=generation_config.max_length,
            stop=criterion,
        )
        if model.training:
            warnings.warn(
                "MSV generation with a model in training mode: call model.eval() (dropout would make answers random).",
                stacklevel=2,
            )
        criterion.bind(run)
        start = time.perf_counter()
        try:
            output = lockstep_sample(
                model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer,
                **model_kwargs,
            )  # fmt: skip
            results = run.finalize()
        finally:
            criterion.bind(None)
        total = time.perf_counter() - start
        timings = dict(run.timings, total=total)
        timings["cot"] = total - sum(run.timings.values())
        for result in results:
            result.timings = timings
        self.results.extend(results)
        return output

    # -- convenience -------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[str | list[dict]],
        *,
        threshold: float | str | None = CERTIFIED,
        prune: bool | PruneRule = True,
        num_sequences: int | None = None,
        max_new_tokens: int = 4096,
        do_sample: bool = True,
        **generate_kwargs,
    ) -> list[MSVResult]:
        """Tokenise `prompts` (strings, or chat messages formatted with the tokenizer's chat template), sample
        `num_sequences` per prompt with early stopping at `threshold`, and return one `MSVResult` per prompt.

        Args:
            prompts: strings (used as they are) or chat message lists, not both.
            threshold: `CERTIFIED` (default: stop and prune as the verifier certified, full decoding when it
                certified nothing), a λ, or `None` (full decoding: no stop, no pruning); `MSVEarlyStop.resolve`.
            prune: `False` turns the certified pruning off alone; a `PruneRule` replaces it.
            num_sequences: N per prompt; default the session's, else 1.
            max_new_tokens: the sampling budget per sequence.
            do_sample: sample (else greedy).
            **generate_kwargs: extra arguments for ``model.generate``.

        Returns:
            One `MSVResult` per prompt, in order.

        Raises:
            ValueError: if `prompts` mixes strings and chat message lists.
        """
        tokenizer = self.tokenizer
        chat = [isinstance(p, (list, tuple)) for p in prompts]
        if any(chat) and not all(chat):
            raise ValueError("pass either strings or chat message lists, not both.")
        if all(chat) and prompts:
            texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
            special = False
        else:
            texts, special = list(prompts), True
        padding_side = tokenizer.padding_side
        tokenizer.padding_side = "left"
        try:
            inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=special)
        finally:
            tokenizer.padding_side = padding_side
        inputs = inputs.to(self.model.device)
        if tokenizer.pad_token_id is None:
            generate_kwargs.setdefault("pad_token_id", tokenizer.eos_token_id)
        n = num_sequences or self.num_sequences or 1
        before = len(self.results)
        self.model.generate(
            **inputs,
            custom_generate=self,
            do_sample=do_sample,
            num_return_sequences=n,
            max_new_tokens=max_new_tokens,
            stopping_criteria=[MSVEarlyStop.resolve(threshold, self.verifier, prune)],
            **generate_kwargs,
        )
        results = self.results[before:]
        del self.results[before:]
        return results


def prepare_generation(
    model,
    tokenizer,
    verifier=None,
    *,
    elicitation: ElicitationSettings | None = None,
    checker: str | EquivalenceChecker | None = "symbolic",
    num_sequences: int | None = None,
    capture_hidden_states: bool = False,
    offload_hidden_states: bool = True,
    **elicitation_overrides,
) -> MSVSession:
    """MSV elicitation and scoring for `model`: ``model.generate(**inputs, custom_generate=msv,
    stopping_criteria=[MSVEarlyStop(λ)])`` elicits, scores, stops early and prunes; the model is not modified.

    Args:
        model: a decoder-only transformers LM (any architecture with the default dynamic KV cache).
        tokenizer: its tokenizer (delimiter matching, elicitation prompt, answer text).
        verifier: what scores the answers, reading hidden states of the LM's width (``config.hidden_size``): an
            `MSVVerifier`; a `ProbeVerifier`, whose scores are weighted-voted as the evaluation's Probe+WV; or a
            scorer (`MSVScorer`, `WeightedVoteScorer`, e.g. ``WeightedVoteScorer(msv_1)`` for MSV_1+WV). `None`
            collects answers (and hidden states) without scoring.
        elicitation: where and how answers are elicited. Defaults to the verifier's ``config.elicitation``, else
            `ElicitationSettings()` (streaming, ``("Wait",)``, ``"### Final Answer ### \\boxed"``, 40 tokens).
        checker: equivalence checker name for `hf_msv.equivalence.get_checker` or a checker object; `None`
            (only without verifier) skips class assignment.
        num_sequences: N of ``msv.generate`` when called without one (``model.generate`` takes
            ``num_return_sequences``).
        capture_hidden_states: keep every answer's `(L, d)` hidden states in the results.
        offload_hidden_states: move each answer's states to CPU as soon as the answer completes (pinned memory,
            non-blocking, on CUDA); `False` keeps them on the LM's device.
        **elicitation_overrides: `ElicitationSettings` fields to change (``mode``, ``delimiters``,
            ``every_k_tokens``, ``prompt`` or ``elicitation_prompt``, ``max_answer_tokens``, ``keep_delimiter``),
            each replacing its field only (`hf_msv.elicitation.resolve_elicitation`).

    Returns:
        The `MSVSession`: pass it as ``custom_generate``; read ``msv.results`` / ``msv.pop_results()`` after
        ``generate``. It is also a context manager (for scoping; there is nothing to restore).

    Raises:
        ValueError: invalid settings, a mode other than the verifier's, or a verifier whose hidden size differs
            from the LM's.
        TypeError: a `verifier` that is none of the above.
    """
    return MSVSession(
        model,
        tokenizer,
        verifier,
        elicitation=elicitation,
        checker=checker,
        num_sequences=num_sequences,
        capture_hidden_states=capture_hidden_states,
        offload_hidden_states=offload_hidden_states,
        **elicitation_overrides,
    )


def msv_generate(
    model,
    tokenizer,
    prompts: Iterable[str | list[dict]],
    *,
    verifier=None,
    threshold: float | str | None = CERTIFIED,
    prune: bool | PruneRule = True,
    num_sequences: int = 16,
    max_new_tokens: int = 4096,
    do_sample: bool = True,
    generate_kwargs: dict | None = None,
    **prepare_kwargs,
) -> list[MSVResult]:
    """Sample `num_sequences` chains of thought per prompt with MSV early stopping; one `MSVResult` per prompt.

    Args:
        prompts: strings (used as they are) or chat message lists (formatted with the tokenizer's chat template).
        threshold: `CERTIFIED` (default: stop and prune as the verifier certified on held-out calibration
            problems, full decoding when it certified nothing), a λ, or `None` (full decoding: no stop, no pruning).
        prune: `False` turns the certified pruning off alone; a `PruneRule` replaces it.
        generate_kwargs: extra arguments for ``model.generate`` (temperature, top_p, ...).
        **prepare_kwargs: any argument of `prepare_generation` (elicitation, delimiters, mode, checker, ...).

    Returns:
        One `MSVResult` per prompt, in order.
    """
    with prepare_generation(model, tokenizer, verifier, **prepare_kwargs) as msv:
        return msv.generate(
            list(prompts),
            threshold=threshold,
            prune=prune,
            num_sequences=num_sequences,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            **(generate_kwargs or {}),
        )
