"""Parallel sampling with a Multi-Sequence Verifier inside ``model.generate``.

This package elicits answers while a Hugging Face causal LM samples N sequences per prompt, captures the last-layer
hidden states of the answer tokens, scores the answers with an `MSVVerifier`, and stops a prompt's N sequences as
soon as the best available answer reaches a threshold λ (paper, "Applications": t* = min{t : max over answers
available by t of ỹ ≥ λ}; output the best answer available then, or the best final answer if no answer ever
reaches λ).

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
* `forking` — `Branch`, `LiveBranch`, `AnswerElicitor`: a fired row copied into the batch, its elicitation segment
  and greedy answer.
* `lockstep` — `lockstep_sample`, `DecodingBatch`: the decoding loop ``generate`` runs (``custom_generate``), in
  which main rows and branch rows share every forward.
* `scoring` — `ScoringQueue`: answers wait until they are available, then go to the verifier's online cache in end
  order.
* `stopping` — `decide_stop` (the one implementation of the stopping rule, shared with the evaluation replay) and
  `MSVEarlyStop`, the `StoppingCriteria`.
* `tracking` — `RowTracker`: per-row and per-prompt bookkeeping of one call.
* `accounting` — `assemble_results`: token accounting, one `MSVResult` per prompt.
* `run` — `GenerationRun`: one ``generate`` call, per step: rows that fire, branch progress, scoring, the rule.
* `session` — `MSVSession`, `prepare_generation`, `msv_generate`: the ``generate`` wrapper and the entry points.

Design
======

**A decoding loop of our own, installed through ``custom_generate``.** transformers 5.x lets ``generate`` run a
callable in place of its sampling loop (``generate(custom_generate=fn)``): ``generate`` still prepares the
generation config, logits processors, stopping criteria, expanded inputs, mask, positions and cache, then calls
``fn(model, input_ids, logits_processor=..., stopping_criteria=..., generation_config=..., **model_kwargs)``.
`prepare_generation` replaces ``model.generate`` (an instance attribute, removed by `MSVSession.detach`) with a thin
wrapper that resets the per-call state, binds the `MSVEarlyStop` it finds in ``stopping_criteria`` (adding a
never-stopping one when there is none, so collection needs no criterion), reads N, the EOS ids and the token budget
from the effective generation config, and passes ``custom_generate=lockstep_sample``; so a plain
``model.generate(..., stopping_criteria=[MSVEarlyStop(λ)])`` decodes with `lockstep`. Main rows are sampled exactly
as ``_sample`` samples them (same processors, one ``multinomial`` over every row), so with early stopping off the
sampled tokens equal a plain ``generate``'s with the same seed. The loop also ships in transformers' Hub layout
(``custom_generate/generate.py`` at the repository root). Which transformers internals it relies on: `lockstep`.

**Branches ride in the decoding batch** (`forking`, `lockstep`). When a row fires at step τ (a delimiter, every K
tokens, EOS, or the budget), its cache is copied into the batch as an extra row, which from the next forward on is
fed its elicitation segment (P tokens: the newest token when it belongs to the context, the re-encoded prefix of a
merged delimiter token, the elicitation prompt) one token per step, then its greedy answer, in the same forward
calls as the main rows, and leaves the batch once its closing token has been fed. Rows that fire together need no
common length. When every main row has ended, the branches still decoding (the terminal answers of rows that reached
the budget among them) finish in a tail of about P + L forwards.

**Time line, scoring and stopping.** Time t is the shared decode step (0 at the first generated token; forward t
computes token t of the main rows and the next token of every branch). An answer taken at τ with P segment tokens
and L answer tokens is complete, and available, at step ``MSVAnswer.end`` = τ + P + L (P + L steps after the
paper's τ + L, which assumed the prompt prefilled at no cost; collections store this step as ``answer_end``, and
shards written before it read as τ + L). `scoring` releases answers to the verifier in end order (which is what
makes online scores equal the offline forward). After each release the stopping rule (`stopping.decide_stop`) is
applied to the prompts that received scores; a prompt that stops has its rows reported done to ``generate`` and
removed from the decoding batch together with its branches (answers still decoding are abandoned: they were never
available), and the loop ends once every prompt has stopped or finished. Rows that end (EOS, budget) leave the batch
as well: their sampled token is the pad token, as in ``_sample``. When all sequences of a prompt have ended and all
its answers are complete, its remaining answers are scored and the rule is applied to them too; if no answer ever
reached λ, the chosen answer is the best-scored terminal answer. In terminal mode only the end of each sequence is
elicited and the rule never stops. With N > M = ``verifier.config.num_sequences``, the N sequences of a prompt are
scored in groups of M; the stopping rule still looks at all N. Equivalence classes (`EquivalenceClasses`, one per
prompt) are assigned when an answer completes; γ is left to the verifier. Wall time of a ``generate`` call is split
into elicitation (the branch rows' share of each forward, by rows, plus branch bookkeeping and detokenisation),
verifier, equivalence checking and chain of thought (the rest, which includes the per-step delimiter detection).

**Hidden states** of completed answers move to CPU at once (pinned memory, non-blocking, on CUDA) unless
``prepare_generation(offload_hidden_states=False)``; the accelerator holds only the live branches' states. The
verifier reads them back onto its device when it scores them.

**Token accounting**: see `accounting`; ``MSVResult.compute`` has the call's LM forward calls and rows × steps.

**Cost.** A forward over a few more rows costs about what a forward over the main rows costs on a latency-bound
accelerator, so elicitation adds (almost) no forward calls: on a paper-shaped schedule (N = 64, 2,048 steps, each
row firing every 150–300 steps, 12-token answers) 1.01 forwards per CoT step, where eliciting each firing step's
rows synchronously while the batch waits needed 4.07 (``benchmarks/generation_overhead.py``). On short traces the
tail after the last main step (about P + L forwards for the last terminal answers) weighs more: 1.20 at N = 16 and
1.17 at N = 64 on the testbed LM's ~170-step traces (1.42 and 1.62 with serial elicitation). On a CPU, where cost
scales with rows × tokens, elicitation costs what its tokens cost. Each change of the batch's membership (a fork, a
completed answer, a stopped prompt) is one gather of the cache (`fork_cache`), of the order of one decode step's
own cache concatenation.

Supported: decoder-only models with the default dynamic cache (`DynamicCache`; tested on Llama, Qwen2, Qwen3, GPT-2,
Mistral, Phi-3, GPT-NeoX, Gemma-2, OPT, Falcon, BLOOM, OLMo-2), including its recurrent layers (conv / SSM / linear
attention; tested on LFM2, Mamba, Mamba-2, Qwen3-Next, Jamba, FalconMamba, Bamba, Falcon-H1 and GraniteMoeHybrid;
`caches` lists the layer types and what a recurrent branch costs in memory), sampling or greedy search (not beam
search, assisted decoding or ``synced_gpus``; ``return_dict_in_generate`` returns the sequences only). A recurrent
branch that leaves out a delimiter's consumed tokens starts from the recurrent state the run saved before the
delimiter's first token (`caches.RecurrentHistory`, updated once per step after that step's forks); its attention
layers mask those tokens as above. Static, quantized and offloaded caches, other cache layer types and
encoder-decoders raise a clear error naming the layer. Branches are exact (equal to recomputing the branch from
scratch) except on sliding-window layers, where masked positions (a dropped delimiter) still count towards the
window, so such a branch sees up to that many fewer of its oldest tokens. Main rows share each forward with other
rows: kernels whose rounding depends on the batch's shape (common on GPUs in bf16) can change low bits, and then
sampled tokens, relative to a plain ``generate`` (the distribution is the same).
"""

from .caches import RecurrentHistory, branch_cache, fork_cache, recurrent_state_bytes
from .delimiters import DelimiterMatch, DelimiterMatcher
from .lockstep import lockstep_sample
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
    "lockstep_sample",
    "msv_generate",
    "prepare_generation",
    "recurrent_state_bytes",
]
