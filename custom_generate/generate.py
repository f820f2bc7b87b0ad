"""hf_msv's lockstep decoding loop in transformers' Hub layout for decoding methods (``custom_generate/``).

    model.generate(**inputs, do_sample=True, custom_generate="<this repository>", trust_remote_code=True)

runs ``generate`` with `hf_msv.generation.lockstep_sample` as its decoding loop: sampling or greedy search exactly
as ``generate``'s own (same processors, same random draws), rows that finish leave the decoding batch. MSV
elicitation, scoring and early stopping additionally need an `MSVSession`, which installs this same loop:
``hf_msv.prepare_generation(model, tokenizer, verifier)`` and then a plain ``model.generate(...,
stopping_criteria=[MSVEarlyStop(λ)])``. Requires the ``hf_msv`` package (requirements.txt).
"""

from transformers import GenerationMixin

from hf_msv.generation import lockstep_sample


def generate(model, **kwargs):
    """``generate`` with the lockstep loop; `kwargs` are ``generate``'s own arguments."""
    return GenerationMixin.generate(model, custom_generate=lockstep_sample, **kwargs)
