"""`VLLMController`: N sampled chains per prompt on a vLLM engine, answers elicited at delimiters, MSV scoring and
early stopping; `vllm_generate`, the one-call entry. How it works: docs/vllm.md.
"""

from __future__ import annotations

import functools
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..answers import extract_boxed
from ..elicitation import ElicitationSettings, resolve_elicitation
from ..generation import ElicitationPolicy, MSVAnswer, MSVResult, eos_token_ids
from ..generation.accounting import assemble_results
from ..generation.forking import Branch, LiveBranch
from ..generation.scoring import ScoringQueue
from ..generation.tracking import BUDGET, EOS, LIVE, STOPPED, RowTracker
from . import capture
from .settings import check_delimiters

__all__ = ["VLLMController", "vllm_generate"]

_COT_PREFIX = "msv-cot:"
_RUN_IDS = itertools.count()


@dataclass
class _Elicitation:
    """One elicitation request in flight: its branch state and where its answer tokens sit in its prompt."""

    live: LiveBranch
    prompt: int
    internal_id: str
    prompt_length: int
    kept: int
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
        checker="symbolic",
        capture_hidden_states: bool = False,
        **overrides,
    ):
        self.engine = getattr(engine, "llm_engine", engine)
        model_config = self.engine.model_config
        if verifier is not None and verifier.config.hidden_size != model_config.get_hidden_size():
            raise ValueError(
                f"the verifier reads hidden states of width {verifier.config.hidden_size} but the "
                f"engine's LM {model_config.model!r} has hidden size {model_config.get_hidden_size()}."
            )
        if verifier is not None and checker is None:
            raise ValueError("a verifier needs equivalence classes: pass a checker (e.g. 'symbolic').")
        self.settings = resolve_elicitation(
            verifier.config if verifier is not None else None, elicitation, **overrides
        )
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer)
        check_delimiters(tokenizer, self.settings.delimiters)
        self.model_name = capture.install(self.engine)
        self.tokenizer, self.verifier = tokenizer, verifier
        self.capture_hidden_states = capture_hidden_states
        # vLLM stops a chain at the tokenizer's EOS and at the model's generation EOS ids alike.
        self.policy = ElicitationPolicy(
            tokenizer, self.settings, eos_token_ids(getattr(model_config, "hf_config", None), tokenizer)
        )
        self.elicitor, self.matcher, self.eos_ids = self.policy.elicitor, self.policy.matcher, self.policy.eos_ids
        if isinstance(checker, str):
            from ..equivalence import get_checker

            checker = get_checker(checker)
        self.checker = checker

    # -- entry -------------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[str | list[dict] | list[int]],
        *,
        num_sequences: int = 16,
        max_new_tokens: int = 4096,
        threshold: float | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
    ) -> list[MSVResult]:
        """Sample `num_sequences` chains per prompt with early stopping at `threshold`; one `MSVResult` per prompt.

        Args:
            prompts: strings (tokenised with special tokens), chat message lists (the chat template) or token ids.
            threshold: λ (`None`: never stop); needs a verifier.
            temperature, top_p, top_k: sampling of the chains (``top_k=0``: off); answers are greedy.
            seed: chain n of prompt p samples with vLLM's per-request seed ``seed + p × N + n`` (default: the
                engine's global generator), so a call samples the same chains whatever else the engine runs; not
                on the CPU backend with chunked prefill (`supports_seeds`).

        Returns:
            One `MSVResult` per prompt, in order.

        Raises:
            ValueError: bad arguments, or prompts too long for the engine's ``max_model_len`` with this budget.
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
        ids = [self.encode(p) for p in prompts]
        self._check_lengths(ids, max_new_tokens)
        run = _Run(self, ids, num_sequences, max_new_tokens, threshold)
        return run.execute(dict(temperature=temperature, top_p=top_p, top_k=top_k if top_k else -1, seed=seed))

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

    def _check_lengths(self, ids: list[list[int]], max_new_tokens: int):
        room = min((self.room(p) for p in ids), default=max_new_tokens)
        if room < max_new_tokens:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} with these prompts and the elicitation exceeds the "
                f"engine's max_model_len={self.engine.model_config.max_model_len}: use at most {room}."
            )

    def new_classes(self):
        """A factory of one prompt's `EquivalenceClasses` (`None` without checker)."""
        if self.checker is None:
            return None
        from ..equivalence import EquivalenceClasses

        return functools.partial(EquivalenceClasses, self.checker)


def vllm_generate(
    engine,
    prompts,
    *,
    verifier=None,
    tokenizer=None,
    threshold: float | None = None,
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
        threshold: λ of the stopping rule (`None`: never stop).
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
        prompts, num_sequences=num_sequences, max_new_tokens=max_new_tokens, threshold=threshold, **(sampling or {})
    )


class _Run:
    """One `VLLMController.generate` call: requests in flight, row bookkeeping, scoring and the stopping rule."""

    def __init__(
        self,
        controller: VLLMController,
        prompts: list[list[int]],
        num_sequences: int,
        budget: int,
        threshold: float | None,
    ):
        self.c, self.engine, self.prompts = controller, controller.engine, prompts
        self.N, self.budget, self.threshold = num_sequences, budget, threshold
        self.streaming = controller.settings.mode == "streaming"
        self.tracker = RowTracker(len(prompts) * num_sequences, num_sequences, controller.new_classes())
        self.queue = (
            ScoringQueue(controller.verifier, num_sequences, self.streaming, controller.capture_hidden_states)
            if controller.verifier is not None
            else None
        )
        self.run_id = next(_RUN_IDS)
        self.clock = [-1] * len(prompts)  # per prompt: engine steps since its first token
        self.elicitations: dict[str, _Elicitation] = {}
        self.last_fired: dict[int, _Elicitation] = {}
        self.pending: set[str] = set()  # our external request ids not finished in the engine
        self.counter = itertools.count()
        self.timings = dict.fromkeys(("elicitation", "verifier", "equivalence"), 0.0)
        self.steps = self.rows = 0
        # Tokens the engine computed for elicitation: prompt tokens not served from the prefix cache (the
        # elicitation segment and the chain's tokens after its last full cached block), and answer tokens fed.
        self.elicitation_computed = {"prefill": 0, "answers": 0}

    # -- the loop ----------------------------------------------------------------------------------------------

    def execute(self, sampling: dict) -> list[MSVResult]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        start = time.perf_counter()
        seed = sampling.pop("seed", None)
        params = SamplingParams(
            n=self.N,
            max_tokens=self.budget,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            **{k: v for k, v in sampling.items() if v is not None},
        )
        for p, ids in enumerate(self.prompts):
            rid = f"{_COT_PREFIX}{self.run_id}:{p}"
            if seed is not None:  # vLLM seeds child i with seed + i: one stream per chain of the call
                params = params.clone()
                params.seed = seed + p * self.N
            self.engine.add_request(rid, {"prompt_token_ids": ids}, params)
            self.pending.add(rid)
        try:
            while self.pending:
                self._step()
        except BaseException:
            self._abort(list(self.pending))
            raise
        self._release()
        total = time.perf_counter() - start
        timings = dict(self.timings, total=total)
        timings["cot"] = total - sum(self.timings.values())
        results = assemble_results(self.tracker, self.budget, self.threshold, self.c.capture_hidden_states, timings)
        compute = {
            "forward_calls": self.steps,
            "rows_computed": self.rows,
            "elicitation_prefill_tokens": self.elicitation_computed["prefill"],
            "elicitation_answer_tokens_fed": self.elicitation_computed["answers"],
        }
        for result in results:
            result.compute = dict(compute)
        return results

    def _step(self):
        n_el = len(self.elicitations)
        n_main = sum(g.live for g in self.tracker.groups)
        start = time.perf_counter()
        outputs = self.engine.step()
        seconds = time.perf_counter() - start
        self.steps += 1
        self.rows += n_el + n_main
        # On a device whose cost scales with rows, elicitation costs its rows' share of the step.
        self.timings["elicitation"] += seconds * n_el / max(1, n_el + n_main)
        ticked = set()
        completed: list[_Elicitation] = []
        for output in outputs:
            rid = output.request_id
            if output.finished:
                self.pending.discard(rid)
            if rid.startswith(_COT_PREFIX):
                p = int(rid.rsplit(":", 1)[1])
                if p not in ticked and self.clock[p] < 0:
                    self.clock[p], ticked = 0, ticked | {p}
                for completion in output.outputs:
                    self._chain_tokens(p, completion)
            elif rid in self.elicitations:
                el = self.elicitations[rid]
                self._count_computed(el, output)
                if self._answer_tokens(el, output):
                    completed.append(el)
        for p, value in enumerate(self.clock):
            if value >= 0 and p not in ticked:
                self.clock[p] += 1
        self._complete(completed)
        self._release()

    # -- chains ------------------------------------------------------------------------------------------------

    def _chain_tokens(self, p: int, completion):
        """New tokens of chain `completion.index` of prompt `p`: append, fire branches, end the row."""
        row = p * self.N + completion.index
        tracker = self.tracker
        if tracker.status[row] != LIVE:
            return
        history = tracker.history[row]
        for token in completion.token_ids:
            history.append(token)
            t = len(history) - 1
            previous = self.last_fired.get(row)
            branch = self.c.policy.fire(row, history, t, previous.live.branch if previous is not None else None)
            if branch is not None and branch.trigger == "eos":
                tracker.end_row(row, t, EOS)
                self._fork(branch, p)
                return
            if branch is not None:
                self._fork(branch, p)
        if completion.finish_reason == "stop":  # a stop token outside the tokenizer's EOS ids
            tracker.end_row(row, len(history) - 1, EOS)
            self._fork(Branch(row, "eos", len(history) - 1), p)
        elif completion.finish_reason is not None:
            self._end_budget_row(row, p)

    def _end_budget_row(self, row: int, p: int):
        """The engine ended a row without EOS (its budget, or ``max_model_len``): its terminal answer."""
        t = len(self.tracker.history[row]) - 1
        self.tracker.end_row(row, t, BUDGET)
        previous = self.last_fired.get(row)
        branch = self.c.policy.at_budget(row, t, previous.live.branch if previous is not None else None)
        if branch is not None:
            self._fork(branch, p)

    def _fork(self, branch: Branch, p: int):
        """Send the elicitation request of `branch`: the chain's kept tokens, the segment, a greedy answer."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self.tracker.groups[p].decided:
            return
        start = time.perf_counter()
        history = self.tracker.history[branch.row]
        kept = branch.tau + 1 - (0 if branch.feed_newest else 1) - branch.drop
        live = LiveBranch(branch, list(branch.prefix_ids) + list(self.c.elicitor.prompt_ids))
        ids = self.prompts[p] + history[:kept] + live.segment
        params = SamplingParams(
            n=1,
            temperature=0.0,
            max_tokens=self.c.settings.max_answer_tokens + 1,
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        rid = f"{capture.REQUEST_PREFIX}{self.run_id}:{next(self.counter)}"
        internal = self.engine.add_request(rid, {"prompt_token_ids": ids}, params)
        el = _Elicitation(live, p, internal, len(ids), kept)
        self.elicitations[rid] = el
        self.last_fired[branch.row] = el
        self.pending.add(rid)
        self.tracker.groups[p].inflight += 1
        self.timings["elicitation"] += time.perf_counter() - start

    # -- answers -----------------------------------------------------------------------------------------------

    def _count_computed(self, el: _Elicitation, output):
        new = len(output.outputs[0].token_ids)
        first = el.sampled == 0 and new > 0  # its prompt was prefilled in this step
        if first:
            self.elicitation_computed["prefill"] += el.prompt_length - (output.num_cached_tokens or 0)
        # every sampled token but the first came from feeding the one before it
        self.elicitation_computed["answers"] += new - first
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
            live.closed = self.c.elicitor.ends_answer(live.token_ids, self.c.eos_ids)
        return live.closed and (el.fed_last or output.finished)

    def _complete(self, completed: list[_Elicitation]):
        if not completed:
            return
        start = time.perf_counter()
        by_internal = {el.internal_id: el for el in completed}
        rids = [rid for rid, el in self.elicitations.items() if el.internal_id in by_internal]
        unfinished = [rid for rid in rids if rid in self.pending]
        if unfinished:  # each has sampled one token past its answer
            self.engine.abort_request(unfinished)
            self.pending.difference_update(unfinished)
        rows = capture.drain(self.engine, list(by_internal))
        for rid in rids:
            el = self.elicitations.pop(rid)
            positions = range(el.prompt_length, el.prompt_length + len(el.live.token_ids))
            states = rows.get(el.internal_id, {})
            group = self.tracker.groups[el.prompt]
            group.inflight -= 1
            if any(pos not in states for pos in positions):
                continue  # cut by max_model_len before its last token was fed: never available
            el.live.hidden = [states[pos] for pos in positions]  # the state where answer token j is the input
            self._record(el)
        self.timings["elicitation"] += time.perf_counter() - start

    def _record(self, el: _Elicitation):
        b, ids, tracker = el.live.branch, el.live.token_ids, self.tracker
        row, group = b.row, tracker.groups[el.prompt]
        text = self.c.elicitor.decode(ids)
        answer = MSVAnswer(
            text=extract_boxed(text),
            raw_text=text,
            token_ids=list(ids),
            prompt=el.prompt,
            sequence=row % self.N,
            step=tracker.num_answers[row],
            tau=b.tau,
            length=len(ids),
            end=max(self.clock[el.prompt], 0),
            trigger=b.trigger,
            terminal=b.terminal or b.trigger in ("eos", "budget"),
            cot_tokens=el.kept,
            elicitation_ids=list(b.prefix_ids) + list(self.c.elicitor.prompt_ids),
            hidden_states=torch.stack(el.live.hidden),
            token_logprobs=list(el.live.token_logprobs),
        )
        tracker.record_answer(row, answer, len(el.live.segment))
        start = time.perf_counter()
        if group.classes is not None:
            answer.class_id = group.classes.add(answer.text)
        self.timings["equivalence"] += time.perf_counter() - start
        group.answers.append(answer)
        if self.queue is not None and not group.decided:
            self.queue.push(answer)
        elif not self.c.capture_hidden_states:
            answer.hidden_states = None

    # -- scoring and stopping ----------------------------------------------------------------------------------

    def _release(self):
        """Score every completed answer (each was pushed at the step it became available, so all are) and apply
        the rule to the prompts that got scores or have nothing more to come."""
        if self.queue is None:
            return
        groups = self.tracker.groups
        released = self.queue.pop_due(sys.maxsize, [g.settled for g in groups])
        self.timings["verifier"] = self.queue.seconds
        for p, group in enumerate(groups):
            if not group.decided and (p in released or group.settled):
                self._apply_stop_rule(p)

    def _apply_stop_rule(self, p: int):
        group = self.tracker.groups[p]
        threshold = self.threshold if self.streaming else None  # terminal mode never stops
        stopped = group.apply_stop_rule(threshold, self.queue.has_pending(p))
        if stopped:
            group.stopped_early = not group.finished
            for row in self.tracker.rows_of(p):
                if self.tracker.status[row] == LIVE:
                    self.tracker.end_row(row, len(self.tracker.history[row]) - 1, STOPPED)
            self._abort(
                [f"{_COT_PREFIX}{self.run_id}:{p}"] + [rid for rid, el in self.elicitations.items() if el.prompt == p]
            )
            self.queue.discard(p)

    def _abort(self, rids: list[str]):
        """Abort our requests `rids` (a chain request id aborts its n children) and forget their captures."""
        live = [rid for rid in rids if rid in self.pending]
        if live:
            self.engine.abort_request(live)
        self.pending.difference_update(rids)
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
        if self.tracker.groups[el.prompt].decided:
            self.tracker.groups[el.prompt].inflight -= 1
            return True
        return False
