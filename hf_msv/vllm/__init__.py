"""Early stopping on vLLM: the MSV elicitation, scoring and stopping rule of `hf_msv.generation` driving a vLLM
engine's parallel samples, and collection of shards with it.

* `controller` — `VLLMController`, `vllm_generate`: N chains per prompt, elicitations as prefix-cached greedy
  requests, the online verifier, `decide_stop`, aborts; the same `MSVResult` objects as `msv_generate`.
* `capture` — the one module that touches vLLM internals (the final-norm states at sampling positions), with the
  tested version range.
* `serving` — `AsyncVLLMController`: prompts answered as they arrive (``await answer(prompt)``), each stopped
  on its own while the engine's continuous batch runs the others.
* `collect` — `collect_with_vllm`: the controller without a verifier writing the shards of live collection.

See docs/vllm.md.
"""

from .capture import TESTED_VLLM, CaptureError
from .collect import collect_with_vllm
from .controller import VLLMController, vllm_generate
from .serving import AsyncVLLMController

__all__ = [
    "TESTED_VLLM",
    "AsyncVLLMController",
    "CaptureError",
    "VLLMController",
    "collect_with_vllm",
    "vllm_generate",
]
