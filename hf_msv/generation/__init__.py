"""Parallel sampling with a Multi-Sequence Verifier inside ``model.generate``.

Answers are elicited at delimiters while a causal LM samples N sequences per prompt, their last-layer hidden states
are scored by a verifier, a prompt's N sequences stop as soon as the best available answer reaches λ, and single
chains the verifier no longer needs are pruned::

    msv = prepare_generation(model, tokenizer, verifier)          # delimiters etc. from verifier.config.elicitation
    model.generate(**inputs, do_sample=True, num_return_sequences=16, max_new_tokens=4096,
                   custom_generate=msv, stopping_criteria=[MSVEarlyStop.from_verifier(verifier)])
    result = msv.pop_results()[0]                                 # one `MSVResult` per prompt

The verifier may also be a `ProbeVerifier` (scored as the evaluation's Probe+WV) or any scorer of `scorers`.
How the decoding loop works, its timing, the supported caches and its limits: ``docs/generation.md``.
"""

from ..elicitation import resolve_elicitation
from .caches import RecurrentHistory, branch_cache, check_forkable, fork_cache, recurrent_state_bytes
from .delimiters import DelimiterMatch, DelimiterMatcher
from .hook import MSVSession, msv_generate, prepare_generation
from .lockstep import lockstep_sample
from .outputs import MSVAnswer, MSVResult
from .policy import ElicitationPolicy, eos_token_ids
from .scorers import AnswerScorer, MSVScorer, ProbeScorer, StopRuleScorer, WeightedVoteScorer, as_scorer
from .stopping import CERTIFIED, MSVEarlyStop, StopDecision, decide_stop

__all__ = [
    "AnswerScorer",
    "DelimiterMatch",
    "DelimiterMatcher",
    "ElicitationPolicy",
    "MSVAnswer",
    "CERTIFIED",
    "MSVEarlyStop",
    "MSVResult",
    "MSVScorer",
    "MSVSession",
    "ProbeScorer",
    "StopRuleScorer",
    "RecurrentHistory",
    "StopDecision",
    "WeightedVoteScorer",
    "as_scorer",
    "branch_cache",
    "check_forkable",
    "decide_stop",
    "eos_token_ids",
    "fork_cache",
    "lockstep_sample",
    "msv_generate",
    "prepare_generation",
    "resolve_elicitation",
    "recurrent_state_bytes",
]
