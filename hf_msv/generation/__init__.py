"""Parallel sampling with a Multi-Sequence Verifier inside ``model.generate``.

This package elicits answers while a Hugging Face causal LM samples N sequences per prompt, captures the last-layer
hidden states of the answer tokens, scores the answers with an `MSVVerifier`, and stops a prompt's N sequences as
soon as the best available answer reaches a threshold λ (paper, "Applications": t* = min{t : max over answers with
τ + L ≤ t of ỹ ≥ λ}; output the best answer available then, or the best final answer if no answer ever reaches λ).

Usage::

    msv = prepare_generation(model, tokenizer, verifier=verifier, delimiters=["Wait"])
    model.generate(**inputs, do_sample=True, num_return_sequences=16, max_new_tokens=4096,
                   stopping_criteria=[MSVEarlyStop(0.9)])
    result = msv.pop_results()[0]          # one `MSVResult` per prompt
    result.chosen.text, result.confidence, result.stop_step
    msv.detach()                           # or use `with prepare_generation(...) as msv:`

    # or in one call
    results = msv_generate(model, tokenizer, ["What is 2+2?"], verifier=verifier, threshold=0.9, num_sequences=16)

Without a verifier (``verifier=None``) the same machinery only collects answers and, with
``capture_hidden_states=True``, their hidden states: the data-collection path.

Layout
======

One concept per module, as in ``transformers.generation``:

* `outputs` — `MSVAnswer`, `MSVResult`: what a call returns.
* `delimiters` — `DelimiterMatcher`: text delimiters found on decoded text, whatever the tokenisation.
* `caches` — `fork_cache`, `branch_cache`, `RecurrentHistory`: copying cache rows (attention and recurrent layers)
  and starting a recurrent branch before tokens it already consumed.
* `forking` — `AnswerElicitor`: branching fired rows off the live cache, greedy answer decoding.
* `scoring` — `ScoringQueue`: answers wait for τ + L, then go to the verifier's online cache in end order.
* `stopping` — `decide_stop` (the one implementation of the stopping rule, shared with the evaluation replay) and
  `MSVEarlyStop`, the `StoppingCriteria`.
* `tracking` — `RowTracker`: per-row and per-prompt bookkeeping of one call.
* `accounting` — `assemble_results`: token accounting, one `MSVResult` per prompt.
* `run` — `GenerationRun`: one ``generate`` call, per step: rows that fire, elicitation, scoring, the rule.
* `session` — `MSVSession`, `prepare_generation`, `msv_generate`: the hooks on the LM and the entry points.

Design
======

**Why a hook, a stopping criterion and a thin ``generate`` wrapper.** In transformers 5.x a `StoppingCriteria` is
called right after each sampled token with ``(input_ids, scores)`` only: no cache, no hidden states. The session
therefore registers a forward *pre*-hook (``with_kwargs=True``) on the LM that records, at every decode forward, the
``past_key_values`` Cache object, the 2D attention mask and the position ids that `generate` passes in (references
only: no copy, no extra compute). When `MSVEarlyStop` is then called, that cache holds the keys/values of every token
except the newest sampled one, which is exactly the state needed to branch a sequence. Recording *inputs* (a
pre-hook) rather than outputs keeps the hook independent of each model's output class. The ``generate`` wrapper
(installed as an instance attribute, removed by `MSVSession.detach`) is needed because criteria get no start/end
callbacks: it resets the per-call state, binds the `MSVEarlyStop` it finds in ``stopping_criteria`` (adding a
never-stopping one when there is none, so collection needs no criterion), reads N, the EOS ids and the token budget
from the effective generation config, and after the decoding loop elicits the terminal answers of the sequences that
ran out of budget (the length criterion fires in the same call as ours, so their cache is still the one recorded)
and assembles the results.

**Branching without recomputation** (`forking`): see that module.

**Time line, scoring and stopping.** Time t is the shared decode step (0 at the first generated token). An answer
elicited at step τ with L tokens becomes available at τ + L; `scoring` releases answers to the verifier in end-time
order (which is what makes online scores equal the offline forward). After each release the stopping rule
(`stopping.decide_stop`) is applied to the prompts that received scores; a prompt that stops has all its rows
reported done to `generate`, whose loop ends once every prompt has stopped or finished. When all sequences of a
prompt have ended (EOS or budget), its remaining answers are scored and the rule is applied to them too; if no
answer ever reached λ, the chosen answer is the best-scored terminal answer. In terminal mode only the end of each
sequence is elicited and the rule never stops. With N > M = ``verifier.config.num_sequences``, the N sequences of a
prompt are scored in groups of M; the stopping rule still looks at all N. Equivalence classes (`EquivalenceClasses`,
one per prompt) are assigned when an answer is elicited; γ is left to the verifier. Wall time of a ``generate`` call
is split into elicitation (forks, forwards, detokenisation), verifier, equivalence checking and chain of thought (the
rest, which includes the per-step delimiter detection).

**Token accounting**: see `accounting`.

**Cost.** Elicitation is synchronous: the decoding loop waits while the rows that fired at a step are elicited,
batched together. Delimiters that fire for all rows at once (every K tokens) batch as well as the chain of thought;
text delimiters usually fire for one or two rows at a time, whose answer tokens then cost about as much as a whole
decode step each (the price of the paper's semantics, where an answer is available at τ + L).

Supported: decoder-only models with the default dynamic cache (`DynamicCache`; tested on Llama, Qwen2, Qwen3,
GPT-2, Mistral, Phi-3, GPT-NeoX, Gemma-2, OPT, Falcon, BLOOM, OLMo-2), including its recurrent layers (conv / SSM /
linear attention; tested on LFM2, Mamba, Mamba-2 and Qwen3-Next; `caches` lists the layer types and the memory a
recurrent branch costs), sampling or greedy search (not beam search or assisted decoding). Static and quantized
caches, other cache layer types and encoder-decoders raise a clear error. Branches are exact (equal to
recomputing the branch from scratch) except on sliding-window layers, where masked positions (a dropped delimiter,
padding inside a batched prompt segment) still count towards the window, so such a branch sees up to that many
fewer of its oldest tokens.
"""

from .caches import RecurrentHistory, branch_cache, fork_cache, recurrent_state_bytes
from .delimiters import DelimiterMatch, DelimiterMatcher
from .outputs import MSVAnswer, MSVResult
from .session import MSVSession, msv_generate, prepare_generation
from .stopping import MSVEarlyStop, StopDecision, decide_stop

__all__ = [
    "DelimiterMatch",
    "DelimiterMatcher",
    "MSVAnswer",
    "MSVEarlyStop",
    "MSVResult",
    "MSVSession",
    "RecurrentHistory",
    "StopDecision",
    "branch_cache",
    "decide_stop",
    "fork_cache",
    "msv_generate",
    "prepare_generation",
    "recurrent_state_bytes",
]
