"""The Probe baseline (Zhang et al., 2025) as a transformers model: a 2-layer MLP on an answer's last-token state.

Imports only torch and transformers, like `modeling_msv`, so it is registered with the Auto classes cheaply.
"""

from __future__ import annotations

from typing import Any

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN

from .configuration_msv import coerce_elicitation, elicitation_to_json
from .elicitation import ElicitationSettings
from .modeling_msv import MSVOutput, MSVVerifier


@strict
class ProbeConfig(PreTrainedConfig):
    r"""
    Configuration of the Probe baseline (Zhang et al., 2025): a 2-layer MLP on the hidden state of an answer's last
    token, predicting P(correct) for each answer independently.

    Args:
        hidden_size (`int`, defaults to 1536): width of the base LM's hidden states.
        intermediate_size (`int`, defaults to 1024): hidden width of the MLP (paper: 1024).
        hidden_act (`str`, defaults to `"relu"`): activation between the two layers.
        dropout (`float`, defaults to 0.0): dropout on the hidden layer.
        mode (`str`, defaults to `"streaming"`): the answers it was trained on (`"terminal"` / `"streaming"`).
        initializer_range (`float`, defaults to 0.02): std of the normal initialiser.
        base_model_name_or_path (`str`, *optional*): the base LM it was trained on.
        elicitation (`ElicitationSettings` or `dict`, *optional*): how the answers it reads were elicited (as in
            `MSVConfig`; its mode is this config's `mode`).
    """

    model_type = "msv_probe"

    hidden_size: int = 1536
    intermediate_size: int = 1024
    hidden_act: str = "relu"
    dropout: float | int = 0.0
    mode: str = "streaming"
    initializer_range: float = 0.02
    base_model_name_or_path: str | None = None
    elicitation: ElicitationSettings | dict | None = None

    def __post_init__(self, **kwargs):
        self.elicitation = coerce_elicitation(self.elicitation, self.mode, kwargs)
        super().__post_init__(**kwargs)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["elicitation"] = elicitation_to_json(self.elicitation)
        return out


class ProbeVerifier(PreTrainedModel):
    """Probe: logit = W₂ act(W₁ h_last + b₁) + b₂ on the last answer token's hidden state h_last.

    Takes the same packed inputs as `MSVVerifier` (extra answer metadata is accepted and ignored), so training,
    evaluation and generation code treat both alike::

        out = probe(hidden_states, token_answer, labels=labels)   # out.logits, out.probabilities: (A,)

    Args:
        config (`ProbeConfig`): the architecture; weights are initialised as `post_init` does.
    """

    config: ProbeConfig
    config_class = ProbeConfig
    base_model_prefix = "probe"
    main_input_name = "hidden_states"

    def __init__(self, config: ProbeConfig):
        super().__init__(config)
        self.up = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(config.intermediate_size, 1)
        self.post_init()

    def forward(
        self,
        hidden_states: torch.Tensor,
        token_answer: torch.Tensor,
        answer_group: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> MSVOutput:
        r"""
        Args:
            hidden_states (`(T, d)`): packed answer-token hidden states.
            token_answer (`(T,)` long): answer index of each token; an answer's last token is its highest row.
            answer_group (`(A,)`, *optional*): only used for the number of answers A (default: max index + 1).
            labels (`(A,)` float, *optional*): 1 correct, 0 wrong, negative ignored; gives the mean BCE loss.
            **kwargs: other answer metadata (accepted and ignored).

        Returns:
            `MSVOutput` with `logits` and `probabilities` of shape `(A,)` and, with `labels`, `loss`.
        """
        device = self.head.weight.device
        token_answer = token_answer.to(device=device, dtype=torch.long)
        num_answers = (
            len(answer_group)
            if answer_group is not None
            else (int(token_answer.max()) + 1 if len(token_answer) else 0)
        )
        positions = torch.arange(len(token_answer), device=device)
        last = torch.full((num_answers,), -1, dtype=torch.long, device=device).scatter_reduce(
            0, token_answer, positions, reduce="amax"
        )
        h = hidden_states.to(device=device, dtype=self.dtype)[last]
        logits = self.head(self.dropout(self.act(self.up(h)))).squeeze(-1).float()
        loss = None
        if labels is not None:
            labels = labels.to(device=device, dtype=torch.float32)
            keep = labels >= 0
            loss = F.binary_cross_entropy_with_logits(logits[keep], labels[keep])
        return MSVOutput(loss=loss, logits=logits, probabilities=torch.sigmoid(logits))

    def push_to_hub(self, repo_id: str, **kwargs) -> Any:  # pyright: ignore[reportIncompatibleVariableOverride]  (transformers wraps its own)
        """Upload weights, config, remote code, evidence files and the Probe's card, like `MSVVerifier.push_to_hub`
        (one uploader for both verifiers, `MSVVerifier.hub_uploader`; transformers' own upload where the Probe was
        loaded as remote code).

        Args:
            repo_id: the Hub repository.
            **kwargs: `PreTrainedModel.push_to_hub`'s (``commit_message``, ``commit_description``, ``private``,
                ``token``, ``revision``, ``create_pr``, ``max_shard_size``, ``tags``), plus the card's ``metrics``
                and ``training_data``.

        Returns:
            What the uploader returns (the commit's info).
        """
        uploader = MSVVerifier.hub_uploader()
        if uploader is None:
            return super().push_to_hub(repo_id, **kwargs)  # pyright: ignore[reportArgumentType]  (wrapped method)
        return uploader(self, repo_id, **kwargs)


# Saved Probes carry this file (and what it imports) and an ``auto_map``, so that
# ``AutoModel.from_pretrained(repo, trust_remote_code=True)`` loads them without hf_msv, as MSVVerifier's do.
ProbeConfig.register_for_auto_class()
ProbeVerifier.register_for_auto_class("AutoModel")

__all__ = ["ProbeConfig", "ProbeVerifier"]
