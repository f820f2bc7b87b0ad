"""`VLLMController`: N sampled chains per prompt on a vLLM engine, answers elicited at delimiters, MSV scoring and
early stopping; `vllm_generate`, the one-call entry. How it works: docs/vllm.md.
"""

from __future__ import annotations

import collections
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..elicitation import ElicitationSettings
from ..generation import CERTIFIED, MSVEarlyStop, MSVResult, eos_token_ids
from ..generation.accounting import assemble_results
from ..generation.core import RunCore, RunSetup
from ..generation.forking import Branch, LiveBranch
from ..generation.queue import ScoringQueue
from ..generation.tracking import LIVE, RowTracker
from ..pruning import PruneRule
from . import capture

if TYPE_CHECKING:
    from ..equivalence import EquivalenceChecker

__all__ = ["ELICITATION_RESERVE", "EngineSession", "PromptRun", "VLLMController", "compute_counts", "vllm_generate"]

ELICITATION_RESERVE = 0.25
"""The share of the engine's ``max_num_seqs`` `VLLMController` keeps free of chains for elicitation requests."""

_RUN_IDS = itertools.count()


@dataclass
class _Elicitation:
    """One elicitation request in flight: its branch state and where its answer tokens sit in its prompt."""

    live: LiveBranch
    run: PromptRun
    internal_id: str
    prompt_length: int
    fed_last: bool = False  # a token after the closing one arrived: the closing token has been fed
    sampled: int = 0  # tokens the engine sampled for it (the first one comes from its prompt's last row)


class VLLMController:
    """Elicits, scores and stops a vLLM engine's parallel samples with the rules of `hf_msv.generation`.

    Args:
        engine: a ``vllm.LLM`` or its v1 ``LLMEngine`` (generating runner, no speculative decoding, no pipeline
            parallelism); its model runner is hooked once (`hf_msv.vllm.capture`).
        tokenizer: the LM's transformers tokenizer (default: loaded from the engine's tokenizer path).
        verifier: an `MSVVerifier`, a `ProbeVerifier` (Probe+WV) or a scorer (`hf_msv.generation.scorers`) whose
            ``config.hidden_size`` is the LM's; `None` only collects answers.
        elicitation: `ElicitationSettings` (default: the verifier's, else the defaults); keyword `overrides`
            (``mode``, ``delimiters``, ``every_k_tokens``, ``prompt``, ``max_answer_tokens``, ``keep_delimiter``)
            replace single fields.
        checker: equivalence checker name or object (`hf_msv.equivalence.get_checker`); `None` only without
            verifier.
        capture_hidden_states: keep every answer's `(L, d)` hidden states (the LM's dtype, CPU) in the results.
        confidence_top_k: record DeepConf's token confidence of every chain token (−mean of its top-k
            log-probs, the LM's raw ones) in `MSVResult.cot_confidence`, computed inside the engine from its logits
            (`hf_msv.vllm.capture`); `None`: not recorded.
        elicitation_reserve: share of the engine's ``max_num_seqs`` kept free of chains for elicitation requests: a
            prompt's N chains are sent once the chains still decoding plus N fit in the rest (the first prompt
            always is); the others wait in the controller. 0 sends every prompt at once, and a full engine then
            holds each elicitation until a chain ends (docs/vllm.md "Admission").

    Raises:
        hf_msv.vllm.CaptureError: untested vLLM, unsupported engine settings or an architecture the hook cannot wrap.
        ValueError: a verifier of another width, a delimiter the tokenizer cannot express, bad settings.
    """

    def __init__(
        self,
        engine,
        tokenizer=None,
        verifier=None,
        *,
        elicitation: ElicitationSettings | None = None,
        checker: str | EquivalenceChecker | None = "symbolic",
        capture_hidden_states: bool = False,
        elicitation_reserve: float = ELICITATION_RESERVE,
        confidence_top_k: int | None = None,
        **overrides,
    ):
        if not 0.0 <= elicitation_reserve < 1.0:
            raise ValueError(f"elicitation_reserve must be in [0, 1), got {elicitation_reserve}.")
        self.engine = getattr(engine, "llm_engine", engine)
        model_config = self.engine.model_config
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer)
        # vLLM stops a chain at the tokenizer's EOS and at the model's generation EOS ids alike.
        eos_ids = eos_token_ids(getattr(model_config, "hf_config", None), tokenizer)
        self.setup = RunSetup.build(
            tokenizer,
            verifier.config if verifier is not None else None,
            model_config.get_hidden_size(),
            model_config.model,
            elicitation=elicitation,
            checker=checker,
            eos_ids=eos_ids,
            **overrides,
        )
        self.settings, self.policy, self.checker = self.setup.settings, self.setup.policy, self.setup.checker
        if confidence_top_k is not None and confidence_top_k < 1:
            raise ValueError(f"confidence_top_k must be at least 1, got {confidence_top_k}.")
        self.model_name = capture.install(self.engine)
        self.tokenizer, self.verifier = tokenizer, verifier
        self.confidence_top_k = confidence_top_k
        self.capture_hidden_states = capture_hidden_states
        max_num_seqs = self.engine.vllm_config.scheduler_config.max_num_seqs
        # Chains beyond this wait in the controller, not in the engine's queue, where the elicitation requests sent
        # later would queue behind them (FCFS) and a prompt's answers would arrive long after their chains asked.
        self.chain_slots = max(1, int((1.0 - elicitation_reserve) * max_num_seqs))
        self.elicitor, self.matcher, self.eos_ids = self.policy.elicitor, self.policy.matcher, self.policy.eos_ids

    # -- entry -------------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[str | list[dict] | list[int]],
        *,
        num_sequences: int = 16,
        max_new_tokens: int = 4096,
        threshold: float | str | None = CERTIFIED,
        prune: bool | PruneRule = True,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
    ) -> list[MSVResult]:
        """Sample `num_sequences` chains per prompt with early stopping at `threshold`; one `MSVResult` per prompt.

        Args:
            prompts: strings (tokenised with special tokens), chat message lists (the chat template) or token ids.
            threshold: `CERTIFIED` (default: stop and prune as the verifier certified, full decoding when it
                certified nothing), a λ (needs a verifier), or `None` (full decoding: no stop, no pruning).
            prune: `False` turns the certified pruning off alone; a `PruneRule` replaces it.
            temperature, top_p, top_k: sampling of the chains (``top_k=0``: off); answers are greedy.
            seed: chain n of prompt p samples with vLLM's per-request seed ``seed + p × N + n`` (default: the
                engine's global generator), so a call samples the same chains whatever else the engine runs; not
                on the CPU backend with chunked prefill (`supports_seeds`).

        Returns:
            One `MSVResult` per prompt, in order.

        Raises:
            ValueError: bad arguments, or prompts too long for the engine's ``max_model_len`` with this budget.
        """
        criterion = MSVEarlyStop.resolve(threshold, self.verifier, prune)
        self.check_settings(num_sequences, max_new_tokens, criterion.threshold, seed)
        ids = [self.encode(p) for p in prompts]
        self.check_lengths(ids, max_new_tokens)
        run = _GenerateCall(self, ids, num_sequences, max_new_tokens, criterion)
        return run.execute(dict(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed))

    def check_settings(self, num_sequences: int, max_new_tokens: int, threshold: float | None, seed: int | None):
        """Refuse settings this controller cannot run.

        Args:
            num_sequences, max_new_tokens, threshold, seed: as in `generate`.

        Raises:
            ValueError: a threshold without verifier, N or the budget below 1, a seed where seeds are unsafe.
        """
        if threshold is not None and self.verifier is None:
            raise ValueError("a threshold needs a verifier: pass verifier=... to VLLMController.")
        if num_sequences < 1 or max_new_tokens < 1:
            raise ValueError("num_sequences and max_new_tokens must be at least 1.")
        if seed is not None and not self.supports_seeds:
            raise ValueError(
                "per-request seeds crash vLLM's CPU backend with chunked prefill ('CPU Generator does "
                "not use offset'): pass seed=None, or start the engine with enable_chunked_prefill=False."
            )

    def chain_params(
        self,
        num_sequences: int,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
    ):
        """The `SamplingParams` of a prompt's chain request: ``n = N`` deltas without detokenisation.

        Args:
            num_sequences, max_new_tokens, temperature, top_p, top_k: as in `generate` (``top_k=0``: off).
            seed: chain n samples with seed + n (`None`: the engine's generator).

        Returns:
            The `SamplingParams`.
        """
        # Resolved from the engine environment (vLLM is optional; the lint environment has none).
        from vllm import SamplingParams  # pyright: ignore[reportAttributeAccessIssue, reportMissingImports]
        from vllm.sampling_params import RequestOutputKind  # pyright: ignore[reportMissingImports]

        sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k if top_k else -1, seed=seed)
        return SamplingParams(
            n=num_sequences,
            max_tokens=max_new_tokens,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            **{k: v for k, v in sampling.items() if v is not None},
        )

    @property
    def supports_seeds(self) -> bool:
        """Whether per-request seeds are safe: not on the CPU backend with chunked prefill, where a seeded request
        whose prompt is split over steps crashes the engine."""
        config = self.engine.vllm_config
        cpu = str(getattr(config.device_config, "device", "")).startswith("cpu")
        return not (cpu and getattr(config.scheduler_config, "enable_chunked_prefill", False))

    def encode(self, prompt) -> list[int]:
        """Token ids of a prompt: a string (with special tokens), chat messages (chat template) or token ids.

        Args:
            prompt: a string, a list of chat message dicts, or a list of token ids (returned as they are).

        Returns:
            The prompt's token ids.
        """
        tokenizer = self.tokenizer
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, (list, tuple)):
            text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
            return tokenizer(text, add_special_tokens=False)["input_ids"]
        return tokenizer(prompt)["input_ids"]

    def room(self, prompt_ids: list[int]) -> int:
        """The most chain-of-thought tokens a prompt may get so that every elicitation (re-fed delimiter text,
        elicitation prompt, answer and the token that feeds its last one) fits the engine's ``max_model_len``.

        Args:
            prompt_ids: the prompt's token ids.

        Returns:
            The token budget (may be below 1 for a long prompt).
        """
        return self.engine.model_config.max_model_len - len(prompt_ids) - self.policy.extra_tokens - 1

    def check_lengths(self, ids: list[list[int]], max_new_tokens: int):
        """Raise ValueError when a prompt of `ids` leaves less `room` than `max_new_tokens`."""
        room = min((self.room(p) for p in ids), default=max_new_tokens)
        if room < max_new_tokens:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} with these prompts and the elicitation exceeds the "
                f"engine's max_model_len={self.engine.model_config.max_model_len}: use at most {room}."
            )


def vllm_generate(
    engine,
    prompts,
    *,
    verifier=None,
    tokenizer=None,
    threshold: float | str | None = CERTIFIED,
    prune: bool | PruneRule = True,
    num_sequences: int = 16,
    max_new_tokens: int = 4096,
    sampling: dict | None = None,
    **controller_kwargs,
) -> list[MSVResult]:
    """One call: a `VLLMController` on `engine` (`controller_kwargs`: its arguments) generating `prompts`
    (`sampling`: temperature, top_p, top_k, seed).

    Args:
        engine: the vLLM engine.
        prompts: strings, chat message lists or token id lists.
        verifier: what scores the answers (as in `prepare_generation`); `None`: no scoring.
        tokenizer: the LM's tokenizer; `None`: loaded from the engine's tokenizer path.
        threshold: `CERTIFIED` (default: stop and prune as the verifier certified), a λ, or `None` (full decoding).
        prune: `False` turns the certified pruning off alone; a `PruneRule` replaces it.
        num_sequences: N per prompt.
        max_new_tokens: chain-of-thought tokens per sequence at most.
        sampling: sampling settings (temperature, top_p, top_k, seed).
        **controller_kwargs: other `VLLMController` arguments.

    Returns:
        One `MSVResult` per prompt.

    Raises:
        ValueError: what `VLLMController` and its ``generate`` refuse (e.g. `max_new_tokens` beyond the engine's
            ``max_model_len``).
    """
    controller = VLLMController(engine, tokenizer, verifier, **controller_kwargs)
    return controller.generate(
        prompts,
        num_sequences=num_sequences,
        max_new_tokens=max_new_tokens,
        threshold=threshold,
        prune=prune,
        **(sampling or {}),
    )


class _GenerateCall:
    """One `VLLMController.generate` call: its prompts admitted at once into an `EngineSession` (one scoring queue
    for all, so each step scores them in one verifier call), stepped until every prompt is done."""

    def __init__(
        self,
        controller: VLLMController,
        prompts: list[list[int]],
        num_sequences: int,
        budget: int,
        criterion: MSVEarlyStop,
    ):
        self.controller, self.N, self.budget, self.threshold = controller, num_sequences, budget, criterion.threshold
        self.session = EngineSession(controller, budget, criterion, num_sequences)
        self.core = self.session.core
        self.runs = [
            PromptRun(p, ids, num_sequences, self.core, controller.setup.new_classes())
            for p, ids in enumerate(prompts)
        ]

    def execute(self, sampling: dict) -> list[MSVResult]:
        start = time.perf_counter()
        session, seed = self.session, sampling.pop("seed", None)
        waiting = collections.deque(self.runs)
        try:
            while waiting or session.busy:
                while waiting and session.has_room(self.N):
                    run = waiting.popleft()
                    # vLLM seeds child i with seed + i: one stream per chain of the call
                    run_seed = None if seed is None else seed + run.key * self.N
                    session.admit(run, self.controller.chain_params(self.N, self.budget, seed=run_seed, **sampling))
                session.step()
        except BaseException:
            session.abort(self.runs)
            raise
        total = time.perf_counter() - start
        queue = self.core.queue
        timings: dict[str, float] = {**session.timings, "verifier": queue.seconds if queue is not None else 0.0}
        timings["total"], timings["cot"] = total, total - sum(timings.values())
        compute = compute_counts(session)
        keep = self.controller.capture_hidden_states
        results = [run.result(self.budget, self.threshold, keep, timings) for run in self.runs]
        for result in results:
            result.compute = dict(compute)
        return results


def compute_counts(counter: PromptRun | EngineSession) -> dict[str, int]:
    """`MSVResult.compute` of a session (a whole `generate` call) or of one prompt (the steps it was in flight)."""
    return {
        "forward_calls": counter.steps,
        "rows_computed": counter.rows,
        "elicitation_prefill_tokens": counter.computed["prefill"],
        "elicitation_answer_tokens_fed": counter.computed["answers"],
    }


class PromptRun:
    """One prompt's N chains on the engine: their rows, clock, requests in flight, scoring queue and decision.

    Args:
        key: the prompt's index (`MSVResult.prompt`, `MSVAnswer.prompt`, its key in the scoring queue).
        prompt_ids: its token ids.
        num_sequences: N.
        core: the `RunCore` its tokens, answers and scores go through: its session's (`EngineSession.core`), whose
            one scoring queue scores every prompt in flight together.
        new_classes: factory of its `EquivalenceClasses` (`None`: no classes).
    """

    def __init__(self, key: int, prompt_ids: list[int], num_sequences: int, core: RunCore, new_classes):
        self.key, self.ids, self.N, self.core = key, prompt_ids, num_sequences, core
        self.tracker = RowTracker(num_sequences, num_sequences, new_classes)
        self.group = self.tracker.groups[0]
        self.clock = -1  # engine steps since its first token
        self.pending: set[str] = set()  # its external request ids not finished in the engine
        self.steps = self.rows = 0  # engine steps while it was in flight; its rows over them
        # Tokens the engine computed for its elicitations: prompt tokens not served from the prefix cache (the
        # elicitation segment and the chain's tokens after its last full cached block), and answer tokens fed.
        self.computed = {"prefill": 0, "answers": 0}
        self.internal_ids: list[str] = []  # its chain requests' ids in the engine, by row
        self.confidence: list[list[float]] = []  # DeepConf's per chain token, read from the engine once it is done
        # Its share of the wall time: its rows' share of each step (chains and elicitations), its bookkeeping.
        self.timings: dict[str, float] = dict.fromkeys(("cot", "elicitation", "verifier", "equivalence"), 0.0)

    @property
    def queue(self) -> ScoringQueue | None:
        """Its answers' `ScoringQueue` (`None`: no scoring)."""
        return self.core.queue

    def result(self, budget: int, threshold: float | None, keep_hidden_states: bool, timings: dict) -> MSVResult:
        """Its `MSVResult` once it is done (`assemble_results` over its rows).

        Args:
            budget: max_new_tokens per chain.
            threshold: λ.
            keep_hidden_states: keep every answer's states.
            timings: the result's ``timings``.

        Returns:
            The result, with ``prompt`` = `key`.
        """
        result = assemble_results(self.tracker, budget, threshold, keep_hidden_states, timings)[0]
        result.prompt = self.key
        if self.confidence:
            result.cot_confidence = [list(c) for c in self.confidence]
        return result


class EngineSession:
    """Prompts in flight on one engine: their requests, the engine step and what its outputs do to them.
    `VLLMController.generate` runs one per call with every prompt admitted at once; `AsyncVLLMController` runs one
    for its lifetime and admits prompts between steps.

    Args:
        controller: the `VLLMController` (policy, elicitor, verifier, settings, the hooked engine).
        budget: max_new_tokens per chain.
        stop: the `MSVEarlyStop` of its prompts (λ, the pruning rule: a pruned chain's request is aborted, the
            reported confidence's map), handed whole to the run core.
        num_sequences: N of its prompts.

    Attributes:
        core: the `RunCore` every prompt goes through: one `ScoringQueue` (none without verifier) for all, so that
            each step scores every prompt in flight in one verifier call; a prompt that is done leaves it
            (`ScoringQueue.forget`).
    """

    def __init__(self, controller: VLLMController, budget: int, stop: MSVEarlyStop, num_sequences: int):
        self.controller, self.engine = controller, controller.engine
        self.budget, self.stop, self.threshold = budget, stop, stop.threshold
        self.streaming = controller.settings.mode == "streaming"
        self.run_id = next(_RUN_IDS)
        self.chains: dict[str, PromptRun] = {}  # `prompt_id` → its prompt, in admission order
        self.chain_rows: dict[str, tuple[PromptRun, int]] = {}  # chain request id in the engine → (prompt, row)
        self.elicitations: dict[str, _Elicitation] = {}  # in flight, in the order they were sent
        self.counter = itertools.count()
        self.timings: dict[str, float] = dict.fromkeys(
            ("elicitation", "equivalence"), 0.0
        )  # the verifier's: its queues'
        self.steps = self.rows = 0
        self.computed = {"prefill": 0, "answers": 0}
        queue = None
        if controller.verifier is not None:
            queue = ScoringQueue(
                controller.verifier, num_sequences, self.streaming, controller.capture_hidden_states, self.threshold
            )
        self.core = RunCore(controller.policy, queue, stop, controller.capture_hidden_states, budget=budget)
        capture.configure(self.engine, controller.confidence_top_k)  # the engine's one setting, this run's

    @property
    def busy(self) -> bool:
        """Whether a prompt is in flight."""
        return bool(self.chains)

    def has_room(self, num_sequences: int) -> bool:
        """Whether a prompt of `num_sequences` chains may be sent now: nothing is in flight, or the chains still
        decoding plus these fit in the controller's ``chain_slots``."""
        live = sum(run.group.live for run in self.chains.values())
        return not self.chains or live + num_sequences <= self.controller.chain_slots

    def admit(self, run: PromptRun, params):
        """Send `run`'s N chains (`params`: the `SamplingParams` of ``n = N``, `VLLMController.chain_params`) as N
        requests of ``n = 1``, chain n seeded with seed + n as vLLM seeds the children of ``n = N``. They share the
        prompt's KV blocks through prefix caching as ``n = N``'s children do, and one chain can be aborted alone
        (a pruned chain's blocks are freed at once)."""
        base = self.prompt_id(run)
        for n in range(run.N):
            chain = params.clone()
            chain.n = 1
            if params.seed is not None:
                chain.seed = params.seed + n
            rid = f"{base}:{n}"
            run.internal_ids.append(self.engine.add_request(rid, {"prompt_token_ids": run.ids}, chain))
            self.chain_rows[rid] = (run, n)
            run.pending.add(rid)
        self.chains[base] = run

    def prompt_id(self, run: PromptRun) -> str:
        """The prefix of `run`'s chain request ids (chain n's is ``f"{prompt_id}:{n}"``)."""
        return f"{capture.CHAIN_PREFIX}{self.run_id}:{run.key}"

    def requests_of(self, run: PromptRun, rows=None) -> list[str]:
        """`run`'s requests still in the engine: its chains' and its elicitations' (only those of `rows` when
        given)."""
        chains = [rid for rid, (r, n) in self.chain_rows.items() if r is run and (rows is None or n in rows)]
        elicitations = [
            rid
            for rid, el in self.elicitations.items()
            if el.run is run and (rows is None or el.live.branch.row in rows)
        ]
        return chains + elicitations

    def step(self) -> list[PromptRun]:
        """One engine step and what it does to the prompts in flight.

        Returns:
            The prompts that are done (no request left in the engine; decided, or without verifier), in admission
            order; they leave the session.
        """
        runs = list(self.chains.values())
        n_el, n_main = len(self.elicitations), sum(r.group.live for r in runs)
        start = time.perf_counter()
        outputs = self.engine.step()
        seconds = time.perf_counter() - start
        self.steps += 1
        self.rows += n_el + n_main
        # On a device whose cost scales with rows, elicitation costs its rows' share of the step.
        self.timings["elicitation"] += seconds * n_el / max(1, n_el + n_main)
        for run in runs:
            run.steps += 1
            run.rows += run.group.inflight + run.group.live
            run.timings["elicitation"] += seconds * run.group.inflight / max(1, n_el + n_main)
            run.timings["cot"] += seconds * run.group.live / max(1, n_el + n_main)
        self._consume(outputs)
        self._decide()
        return self._done()

    def _consume(self, outputs):
        """A step's outputs: chain tokens (branches fired), answer tokens, each prompt's clock; completed answers."""
        ticked = set()
        completed: list[_Elicitation] = []
        for output in outputs:
            rid = output.request_id
            run, row = self.chain_rows.get(rid, (None, -1))
            el = self.elicitations.get(rid) if run is None else None
            owner = run if run is not None else el.run if el is not None else None
            if owner is not None and output.finished:
                owner.pending.discard(rid)
            if run is not None:
                if run.key not in ticked and run.clock < 0:
                    run.clock = 0
                    ticked.add(run.key)
                for completion in output.outputs:  # one: n = 1
                    self.chain_tokens(run, row, completion)
                if output.finished:
                    del self.chain_rows[rid]
            elif el is not None:
                self._count_computed(el, output)
                if self._answer_tokens(el, output):
                    completed.append(el)
        for run in self.chains.values():
            if run.clock >= 0 and run.key not in ticked:
                run.clock += 1
        self._complete(completed)

    def _done(self) -> list[PromptRun]:
        """Take the prompts with no request left out of the session (their token confidences read, when
        recorded)."""
        done = [(rid, run) for rid, run in self.chains.items() if not run.pending]
        if done and self.controller.confidence_top_k is not None:
            self._read_confidence([run for _, run in done])
        for rid, run in done:
            del self.chains[rid]
            if run.queue is not None:
                run.queue.forget(run.key)  # nothing is waiting: the shared queue and its scorer forget the prompt
        return [run for _, run in done]

    def _read_confidence(self, runs: list[PromptRun]):
        """Each chain token's confidence, from the engine (one call for `runs`): chain token j sits at position
        len(prompt) + j; a pruned chain's end where it was pruned."""
        read = capture.drain_confidence(self.engine, [rid for run in runs for rid in run.internal_ids])
        for run in runs:
            start = len(run.ids)
            run.confidence = [
                [read[rid].get(start + j, float("nan")) for j in range(len(history))]
                for rid, history in zip(run.internal_ids, run.tracker.history)
            ]

    def abort(self, runs: list[PromptRun]):
        """Abort `runs`' requests (cancelled, or an engine error) and forget them and their captures."""
        for run in runs:
            if self.chains.pop(self.prompt_id(run), None) is None:
                continue
            run.group.decided = True  # nothing more of it is elicited or scored
            self._abort(run, self.requests_of(run))
            capture.discard(self.engine, run.internal_ids)
            if run.queue is not None:
                run.queue.forget(run.key)

    # -- chains ------------------------------------------------------------------------------------------------

    def chain_tokens(self, run: PromptRun, row: int, completion):
        """New tokens of chain `row` of `run` (`RunCore.feed`): fire branches, end the row."""
        tracker, core = run.tracker, run.core
        if tracker.status[row] != LIVE:
            return
        for token in completion.token_ids:
            branch = core.feed(tracker, row, token)
            if branch is not None:
                self._fork(branch, run)
            if tracker.status[row] != LIVE:  # EOS
                return
        if completion.finish_reason is not None:  # "stop": a stop token outside the tokenizer's EOS ids
            branch = core.end_chain(tracker, row, eos=completion.finish_reason == "stop")
            if branch is not None:
                self._fork(branch, run)

    def _fork(self, branch: Branch, run: PromptRun):
        """Send the elicitation request of `branch`: the chain's kept tokens, the segment, a greedy answer."""
        # Resolved from the engine environment (vLLM is optional; the lint environment has none).
        from vllm import SamplingParams  # pyright: ignore[reportAttributeAccessIssue, reportMissingImports]
        from vllm.sampling_params import RequestOutputKind  # pyright: ignore[reportMissingImports]

        if not run.core.fork(run.tracker, branch):
            return
        start = time.perf_counter()
        history = run.tracker.history[branch.row]
        # The newest token, when it belongs to the context, is among the kept ones: the engine has it already.
        live = LiveBranch(branch, list(branch.prefix_ids) + list(self.controller.elicitor.prompt_ids))
        ids = run.ids + history[: branch.kept] + live.segment
        params = SamplingParams(
            n=1,
            temperature=0.0,
            max_tokens=self.controller.settings.max_answer_tokens + 1,
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        rid = f"{capture.REQUEST_PREFIX}{self.run_id}:{next(self.counter)}"
        internal = self.engine.add_request(rid, {"prompt_token_ids": ids}, params)
        self.elicitations[rid] = _Elicitation(live, run, internal, len(ids))
        run.pending.add(rid)
        self._charge(run, "elicitation", time.perf_counter() - start)

    def _charge(self, run: PromptRun, phase: str, seconds: float):
        self.timings[phase] += seconds
        run.timings[phase] += seconds

    # -- answers -----------------------------------------------------------------------------------------------

    def _count_computed(self, el: _Elicitation, output):
        new = len(output.outputs[0].token_ids)
        first = el.sampled == 0 and new > 0  # its prompt was prefilled in this step
        prefill = el.prompt_length - (output.num_cached_tokens or 0) if first else 0
        # every sampled token but the first came from feeding the one before it
        for counts in (self.computed, el.run.computed):
            counts["prefill"] += prefill
            counts["answers"] += new - first
        el.sampled += new

    def _answer_tokens(self, el: _Elicitation, output) -> bool:
        """Consume an elicitation's new tokens; True once its closing token has been fed (its state exists)."""
        live, completion = el.live, output.outputs[0]
        logprobs = completion.logprobs or [None] * len(completion.token_ids)
        for token, entry in zip(completion.token_ids, logprobs):
            if live.closed:
                el.fed_last = True
                break
            live.token_ids.append(token)
            live.token_logprobs.append(float(entry[token].logprob) if entry else float("nan"))
            live.closed = self.controller.elicitor.ends_answer(live.token_ids, self.controller.eos_ids)
        return live.closed and (el.fed_last or output.finished)

    def _complete(self, completed: list[_Elicitation]):
        if not completed:
            return
        start = time.perf_counter()
        by_internal = {el.internal_id: el for el in completed}
        rids = [rid for rid, el in self.elicitations.items() if el.internal_id in by_internal]
        unfinished = [rid for rid in rids if rid in self.elicitations[rid].run.pending]
        if unfinished:  # each has sampled one token past its answer
            self.engine.abort_request(unfinished)
            for rid in unfinished:
                self.elicitations[rid].run.pending.discard(rid)
        rows = capture.drain(self.engine, list(by_internal))
        for rid in rids:
            el = self.elicitations.pop(rid)
            positions = range(el.prompt_length, el.prompt_length + len(el.live.token_ids))
            states = rows.get(el.internal_id, {})
            if any(pos not in states for pos in positions):
                el.run.core.abandon(el.run.tracker, el.live.branch)
                continue  # cut by max_model_len before its last token was fed: never available
            el.live.hidden = [states[pos] for pos in positions]  # the state where answer token j is the input
            self._record(el)
        seconds = (time.perf_counter() - start) / len(completed)
        for el in completed:
            self._charge(el.run, "elicitation", seconds)

    def _record(self, el: _Elicitation):
        run, core = el.run, el.run.core
        before = core.equivalence_seconds
        hidden = torch.stack(el.live.hidden)
        core.record(run.tracker, el.live, prompt=run.key, end=max(run.clock, 0), hidden=hidden)
        self._charge(run, "equivalence", core.equivalence_seconds - before)

    # -- scoring and stopping ----------------------------------------------------------------------------------

    def _decide(self):
        """Score every completed answer (each was pushed at the step it became available, so all are) and apply
        the rule to the prompts that got scores or have nothing more to come (`RunCore.decide`); one scorer call
        for all of them."""
        queue = self.core.queue
        if queue is None:
            return
        runs = list(self.chains.values())
        decisions = self.core.decide(sys.maxsize, {run.key: (run.tracker, 0) for run in runs})
        for run in runs:
            run.timings["verifier"] = queue.prompt_seconds.get(run.key, 0.0)
            decision = decisions.get(run.key)
            if decision is not None and decision.stopped:
                self._abort(run, self.requests_of(run))
            elif decision is not None and decision.rows:  # pruned chains: their requests and elicitations
                self._abort(run, self.requests_of(run, set(decision.rows)))

    def _abort(self, run: PromptRun, rids: list[str]):
        """Abort `run`'s requests `rids` (chains and elicitations) and forget them and their captures."""
        live = [rid for rid in rids if rid in run.pending]
        if live:
            self.engine.abort_request(live)
        run.pending.difference_update(rids)
        for rid in rids:
            self.chain_rows.pop(rid, None)
        dropped = [
            self.elicitations.pop(rid)
            for rid in rids
            if rid in self.elicitations and rid.startswith(capture.REQUEST_PREFIX) and self._dropped(rid)
        ]
        if dropped:
            capture.discard(self.engine, [el.internal_id for el in dropped])

    def _dropped(self, rid: str) -> bool:
        """Whether an aborted elicitation is abandoned (its prompt was decided), not completed."""
        el = self.elicitations[rid]
        if not el.run.core.wants(el.run.tracker, el.live.branch):
            el.run.core.abandon(el.run.tracker, el.live.branch)
            return True
        return False
