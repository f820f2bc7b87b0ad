"""`AsyncVLLMController`: prompts served as they arrive on one vLLM engine, each stopped on its own.

One asyncio task steps the engine (`LLMEngine.step`, in one worker thread so the event loop stays free) through an
`EngineSession`, the per-prompt state machine `VLLMController.generate` runs: prompts that arrive are admitted between
steps, each prompt's N chains share the engine's continuous batch with every other prompt's, and a prompt whose rule
decides leaves the batch and its caller gets its `MSVResult`. Why not vLLM's `AsyncLLM`: docs/vllm.md.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..generation import CERTIFIED, MSVEarlyStop, MSVResult
from ..pruning import PruneRule
from . import capture
from .controller import EngineSession, PromptRun, VLLMController, compute_counts

__all__ = ["AsyncVLLMController"]


@dataclass
class _Ticket:
    """One submitted prompt: its run, its chain request's sampling, its caller's future and its times."""

    run: PromptRun
    params: object
    future: asyncio.Future
    submitted: float
    admitted: float | None = None
    cancelled: bool = False
    outcome: MSVResult | BaseException | None = field(default=None, repr=False)


class AsyncVLLMController:
    """Answers prompts as they arrive with the elicitation, scoring and stopping rule of a `VLLMController`.

    Each `answer` call submits one prompt; it joins the engine's batch at the first step with room for its chains
    (`VLLMController.chain_slots`; prompts are sent in arrival order) and returns its
    `MSVResult` once its stopping rule has decided (λ reached, or every answer scored), its requests aborted
    and their KV blocks free for the prompts still running or waiting. Results equal those of
    `VLLMController.generate` over the same prompts and seeds (tests/test_vllm_serving.py says how exactly).

    Args:
        controller: the `VLLMController` whose engine, verifier, elicitation settings and checker serve the
            prompts. Its engine is stepped by this object while a prompt is in flight: nothing else may step it
            (e.g. ``controller.generate``) meanwhile.
        num_sequences: N per prompt.
        max_new_tokens: chain-of-thought tokens per chain at most.
        threshold: `CERTIFIED` (default: stop and prune as the verifier certified, full decoding when it certified
            nothing), a λ (needs a verifier), or `None` (full decoding: no stop, no pruning).
        prune: `False` turns the certified pruning off alone; a `PruneRule` replaces it.
        temperature, top_p, top_k: sampling of the chains (``top_k=0``: off).

    Attributes:
        core: the `RunCore` every prompt goes through; its ``queue`` scores the prompts in flight together and
            forgets each once it is answered.

    Raises:
        hf_msv.vllm.CaptureError: an untested vLLM version or engine settings the capture cannot follow.
        ValueError: settings `VLLMController.generate` refuses.
    """

    def __init__(
        self,
        controller: VLLMController,
        *,
        num_sequences: int = 16,
        max_new_tokens: int = 4096,
        threshold: float | str | None = CERTIFIED,
        prune: bool | PruneRule = True,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
    ):
        capture.check_vllm_version()
        capture.check_engine(controller.engine.vllm_config)
        criterion = MSVEarlyStop.resolve(threshold, controller.verifier, prune)
        threshold = criterion.threshold
        controller.check_settings(num_sequences, max_new_tokens, threshold, None)
        self.controller, self.N, self.budget, self.threshold = controller, num_sequences, max_new_tokens, threshold
        self.sampling: dict[str, float] = dict(temperature=temperature, top_p=top_p)
        self.top_k = top_k
        self.session = EngineSession(controller, max_new_tokens, criterion, num_sequences)
        self.core = self.session.core
        self._keys = itertools.count()
        self._arrivals: deque[_Ticket] = deque()  # appended by callers, taken by the stepping thread
        self._cancelled: deque[_Ticket] = deque()
        self._in_flight: dict[int, _Ticket] = {}  # admitted, by prompt key (the stepping thread's)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="hf-msv-engine")
        self._stepper: asyncio.Task | None = None
        self._closed = False

    @property
    def steps(self) -> int:
        """Engine steps taken so far."""
        return self.session.steps

    @property
    def in_flight(self) -> int:
        """Prompts submitted and not yet answered (waiting or running)."""
        return len(self._arrivals) + len(self._in_flight)

    async def answer(self, prompt, *, seed: int | None = None) -> MSVResult:
        """Sample, elicit, score and stop one prompt among whatever else is running; its `MSVResult`.

        Args:
            prompt: a string (tokenised with special tokens), chat messages (the chat template) or token ids.
            seed: chain n samples with vLLM's per-request seed ``seed + n`` (`None`: the engine's generator);
                refused where `VLLMController.supports_seeds` is false.

        Returns:
            The prompt's `MSVResult`: ``prompt`` is its submission number on this object; ``timings`` are its own
            (``total``: submission to answer, ``queued``: submission to admission, and its share of the engine
            steps and of the bookkeeping); ``compute`` counts the steps it was in flight and its own rows.

        Raises:
            ValueError: a prompt too long for the engine's ``max_model_len`` with this budget, or a refused seed.
            RuntimeError: the controller was closed (`aclose`).
            Exception: an engine error raised while the prompt was in flight (every prompt in flight gets it).
        """
        if self._closed:
            raise RuntimeError("this AsyncVLLMController was closed (aclose): make a new one.")
        c = self.controller
        c.check_settings(self.N, self.budget, self.threshold, seed)
        ids = c.encode(prompt)
        c.check_lengths([ids], self.budget)
        run = PromptRun(next(self._keys), ids, self.N, self.core, c.setup.new_classes())
        params = c.chain_params(self.N, self.budget, seed=seed, top_k=self.top_k, **self.sampling)
        ticket = _Ticket(run, params, asyncio.get_running_loop().create_future(), time.perf_counter())
        self._arrivals.append(ticket)
        if self._stepper is None or self._stepper.done():
            self._stepper = asyncio.create_task(self._serve())
        try:
            return await ticket.future
        except asyncio.CancelledError:
            ticket.cancelled = True  # aborted by the stepping thread before its next step
            self._cancelled.append(ticket)
            raise

    async def aclose(self):
        """Cancel every prompt in flight (their requests aborted) and stop the stepping thread."""
        self._closed = True  # the stepping thread cancels what is left at its next tick
        if self._stepper is not None:
            await asyncio.gather(self._stepper, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> AsyncVLLMController:
        return self

    async def __aexit__(self, *exc_info):
        await self.aclose()

    # -- the stepping loop -------------------------------------------------------------------------------------

    async def _serve(self):
        """Step while a prompt is waiting or running; hand each finished prompt's outcome to its caller."""
        loop = asyncio.get_running_loop()
        try:
            while self._arrivals or self._in_flight or self._cancelled:
                # Shielded: the thread finishes its step even if this task is cancelled: no step is left half done.
                finished = await asyncio.shield(loop.run_in_executor(self._executor, self._tick))
                for ticket in finished:
                    self._hand_over(ticket, ticket.outcome)
        except BaseException as error:  # the loop itself failed or was cancelled: no caller waits forever
            for ticket in [*list(self._arrivals), *list(self._in_flight.values())]:
                self._hand_over(ticket, error)
            raise

    @staticmethod
    def _hand_over(ticket: _Ticket, outcome):
        if ticket.future.done():  # its caller was cancelled meanwhile
            return
        if isinstance(outcome, asyncio.CancelledError):
            ticket.future.cancel()
        elif isinstance(outcome, BaseException):
            ticket.future.set_exception(outcome)
        else:
            ticket.future.set_result(outcome)

    def _tick(self) -> list[_Ticket]:
        """In the stepping thread: admit arrivals, abort cancellations, one engine step; the tickets finished."""
        if self._closed:
            return self._cancel_all()
        finished = self._admit()
        while self._cancelled:
            ticket = self._cancelled.popleft()
            if self._in_flight.pop(ticket.run.key, None) is not None:
                self.session.abort([ticket.run])
        if not self.session.busy:
            return finished
        try:
            done = self.session.step()
        except Exception as error:  # the engine failed: every prompt in flight fails with it, nothing is left
            failed = list(self._in_flight.values())
            self._in_flight.clear()
            self.session.abort([t.run for t in failed])
            for ticket in failed:
                ticket.outcome = error
            return finished + failed
        for run in done:
            ticket = self._in_flight.pop(run.key)
            ticket.outcome = self._result(ticket)
            finished.append(ticket)
        return finished

    def _cancel_all(self) -> list[_Ticket]:
        """In the stepping thread, once closed: abort every prompt waiting or running; their tickets, cancelled."""
        tickets = list(self._in_flight.values())
        while self._arrivals:
            tickets.append(self._arrivals.popleft())
        self._in_flight.clear()
        self._cancelled.clear()
        self.session.abort([t.run for t in tickets])  # those not admitted have nothing in the engine
        for ticket in tickets:
            ticket.outcome = asyncio.CancelledError()
        return tickets

    def _admit(self) -> list[_Ticket]:
        """Send the waiting prompts' chain requests, in arrival order while they fit (`EngineSession.has_room`);
        the tickets refused by the engine."""
        refused = []
        while self._arrivals and (self._arrivals[0].cancelled or self.session.has_room(self.N)):
            ticket = self._arrivals.popleft()
            if ticket.cancelled:
                continue
            try:
                self.session.admit(ticket.run, ticket.params)
            except Exception as error:
                ticket.outcome = error
                refused.append(ticket)
                continue
            ticket.admitted = time.perf_counter()
            self._in_flight[ticket.run.key] = ticket
        return refused

    def _result(self, ticket: _Ticket) -> MSVResult:
        run, now = ticket.run, time.perf_counter()
        timings = dict(run.timings, total=now - ticket.submitted, queued=(ticket.admitted or now) - ticket.submitted)
        result = run.result(self.budget, self.threshold, self.controller.capture_hidden_states, timings)
        result.compute = compute_counts(run)
        return result
