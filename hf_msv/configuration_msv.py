"""MSV verifier configuration.

This file imports only `transformers` (and `huggingface_hub` and numpy, which transformers depends on) and two
hf_msv modules that import nothing else (`elicitation`, `baselines`), so that a verifier pushed to the Hub carries
them as remote code and loads with ``trust_remote_code=True`` for users who do not have hf_msv installed.
"""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from .baselines import WV_THRESHOLD
from .elicitation import ElicitationSettings

MASK_NAMES = ("full", "within_sequence", "equivalence", "within_answer")
MODES = ("terminal", "streaming")
READOUTS = ("last", "mean")
ATTENTION_BACKENDS = ("chunked", "dense")


@strict
class MSVConfig(PreTrainedConfig):
    r"""
    Configuration of a Multi-Sequence Verifier (MSV, "Calibrated and Efficient Parallel Test-Time Scaling with
    Multi-Sequence Verifiers"). An MSV reads the last-layer hidden states of the answer tokens of N parallel
    samples and predicts, for every answer, the probability that it is correct.

    Args:
        hidden_size (`int`, defaults to 1536):
            Width of the answer-token hidden states. Must equal the hidden size of the base LM the verifier reads
            (1536 for DeepSeek-R1-Distill-Qwen-1.5B).
        num_attention_heads (`int`, defaults to 12):
            Attention heads of each Multi-Mask Transformer Block (the paper follows the base LM).
        intermediate_size (`int`, *optional*):
            Width of the block's MLP. Defaults to `4 * hidden_size`.
        num_hidden_layers (`int`, defaults to 1):
            Number of Multi-Mask Transformer Blocks. The paper uses one. 0 is the no-block ablation: each answer's
            logit reads only its own last-token state, γ and (with `vote_pathway`) the weighted vote.
        masks (`list[str]`, *optional*):
            Attention masks mixed in every block, any non-empty subset of `"full"`, `"within_sequence"`,
            `"equivalence"`, `"within_answer"`. Defaults to all four; ablations are a config change. In terminal
            mode `within_answer` equals `within_sequence` (one answer per sequence), so it is dropped from
            `effective_masks` when both are present.
        mode (`str`, defaults to `"streaming"`):
            `"terminal"`: one answer per sequence, read after decoding ends. `"streaming"`: intermediate answers
            elicited at delimiters; an answer may attend only to answers that ended no later than itself
            (end = τ + L), which also makes online KV-cached scoring exact.
        logit_averaging (`bool`, *optional*):
            Average logits over each equivalence class (eq. 1 of the paper). Defaults to on for terminal, off for
            streaming (where the average is taken causally over earlier equivalent answers, the paper's ablation).
        readout (`str`, defaults to `"last"`):
            `"last"`: the block output at each answer's last token. `"mean"`: the mean over the answer's tokens
            (appendix "MSV with Mean Across Answer Tokens").
        num_sequences (`int`, defaults to 64):
            N, the size of the learnable per-sequence embedding table e⁽ⁿ⁾. Groups of more sequences are split into
            groups of at most `num_sequences` (appendix "Scaling with MSV_M for Large N").
        gamma_hidden_size (`int`, defaults to 64):
            Width of the MLP that embeds the agreement feature γ ∈ [0, 1].
        gamma_skip (`bool`, defaults to `False`):
            Add a learnable affine skip from γ to each answer's logit, `logit = head(...) + w·γ + b` (per answer,
            before logit averaging). Training initialises (w, b) from a Platt fit of γ on the training answers and
            zeroes the head, so the verifier starts exactly at calibrated self-consistency and learns a residual.
            Off by default so that checkpoints saved without it load unchanged; `MSVTrainingConfig` turns it on.
        vote_pathway (`bool`, defaults to `False`):
            Add a per-answer single-chain head (a Probe-shaped MLP on the answer's own last-token hidden state) and
            the weighted vote of its probabilities over each answer's equivalence class (causal in streaming, the
            evaluation's Probe+WV rule). The vote share and the head's own probability enter the final head beside
            γ (an MLP embedding), and an affine skip `w_share·share + w_own·own_logit + b` is added to the logit, so
            that `MSVVerifier.anchor_to_weighted_vote` makes the verifier exactly a calibrated weighted vote of its
            own single-chain scores. Off by default: checkpoints saved without it load and score unchanged.
            See docs/msv_vote_pathway.md.
        vote_hidden_size (`int`, defaults to 1024):
            Hidden width of the per-answer head (the Probe's, so a trained Probe can be loaded into it).
        vote_hidden_act (`str`, defaults to `"relu"`):
            Activation of the per-answer head (the Probe's).
        vote_threshold (`int`, defaults to 16, `hf_msv.baselines.WV_THRESHOLD`):
            R of streaming weighted voting: an answer's share is the weighted vote only once more than R answers
            are available at its end, else its own probability (`hf_msv.baselines.streaming_weighted_voting`).
            Ignored in terminal mode.
        vote_loss_weight (`float`, defaults to 1.0):
            With labels, the loss adds this times the single-chain head's own BCE, so that head stays a calibrated
            single-chain scorer (its weighted vote is then Probe+WV's). 0 trains it through the final logit only.
        hidden_act (`str`, defaults to `"gelu"`):
            Activation of the block MLP and the γ MLP.
        layer_norm_eps (`float`, defaults to 1e-5):
            Epsilon of the pre-MLP LayerNorm.
        attention_dropout (`float`, defaults to 0.0):
            Dropout on the mixed attention output.
        initializer_range (`float`, defaults to 0.02):
            Std of the normal initialiser.
        attention_backend (`str`, defaults to `"chunked"`):
            `"chunked"`: memory-bounded attention that never materialises a (T, T) tensor. `"dense"`: the simple
            reference with explicit (T, T) masks, used by tests to check the chunked path.
        attention_chunk_elements (`int`, defaults to 2**25):
            Upper bound on heads × query rows × key columns held at once by the chunked backend.
        base_model_name_or_path (`str`, *optional*):
            The base LM this verifier was trained on (Hub id or local path).
        base_model_revision (`str`, *optional*):
            Revision (commit) of the base LM.
        elicitation (`ElicitationSettings` or `dict`, *optional*):
            How the answers the verifier reads were elicited (delimiters, every-k, prompt, answer cap); its `mode`
            is always this config's `mode`. Configs saved with the flat keys `delimiters`, `every_k_tokens`,
            `elicitation_prompt`, `max_answer_tokens` load into it.
        early_stopping (`dict`, *optional*):
            The verifier's stopping rule, fitted on validation when a streaming verifier is trained:
            `{"stop_head": ..., "lambda": ...}` (`hf_msv.stop_rules.StopHead` and `hf_msv.lambda_rule.LambdaChoice`
            as dicts). With it, generation stops on the stop head's statistic (the verifier's score, its answer's
            support among the N chains, the share that has answered) and `MSVEarlyStop.from_verifier` uses the λ.
            `None`: the raw score is the statistic, as in the paper.

    Example:

    ```python
    >>> from hf_msv import MSVConfig, MSVVerifier
    >>> config = MSVConfig(hidden_size=576, num_attention_heads=9, num_sequences=16, mode="terminal")
    >>> verifier = MSVVerifier(config)
    ```"""

    model_type = "msv"

    hidden_size: int = 1536
    num_attention_heads: int = 12
    intermediate_size: int | None = None
    num_hidden_layers: int = 1
    masks: list[str] | None = None
    mode: str = "streaming"
    logit_averaging: bool | None = None
    readout: str = "last"
    num_sequences: int = 64
    gamma_hidden_size: int = 64
    gamma_skip: bool = False
    vote_pathway: bool = False
    vote_hidden_size: int = 1024
    vote_hidden_act: str = "relu"
    vote_threshold: int = WV_THRESHOLD
    vote_loss_weight: float | int = 1.0
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-5
    attention_dropout: float | int = 0.0
    initializer_range: float = 0.02
    attention_backend: str = "chunked"
    attention_chunk_elements: int = 2**25
    base_model_name_or_path: str | None = None
    base_model_revision: str | None = None
    elicitation: ElicitationSettings | dict | None = None
    early_stopping: dict | None = None

    def __post_init__(self, **kwargs):
        self.elicitation = coerce_elicitation(self.elicitation, self.mode, kwargs)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.masks is None:
            self.masks = list(MASK_NAMES)
        self.masks = list(self.masks)
        if self.logit_averaging is None:
            self.logit_averaging = self.mode == "terminal"
        super().__post_init__(**kwargs)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["elicitation"] = elicitation_to_json(self.elicitation)
        return out

    @classmethod
    def paper_preset(cls, **kwargs) -> "MSVConfig":
        """The paper's architecture: one Multi-Mask Transformer Block, the four masks, γ through an MLP only (no γ
        skip, no vote pathway), logit averaging in terminal mode. `kwargs` set the other fields (width, heads, N,
        mode, ...); an architecture field of the preset given with another value is a `ValueError`.

        Args:
            **kwargs: any other `MSVConfig` field.

        Returns:
            The `MSVConfig`.

        Raises:
            ValueError: if `kwargs` sets a preset field (``num_hidden_layers``, ``masks``, ``readout``,
                ``gamma_skip``, ``vote_pathway``) to another value.
        """
        preset = {
            "num_hidden_layers": 1,
            "masks": list(MASK_NAMES),
            "readout": "last",
            "gamma_skip": False,
            "vote_pathway": False,
        }
        clash = sorted(k for k in preset if k in kwargs and kwargs[k] != preset[k])
        if clash:
            raise ValueError(f"MSVConfig.paper_preset fixes {clash}; build MSVConfig(...) directly to change them.")
        return cls(**{**kwargs, **preset})

    @property
    def effective_masks(self) -> list[str]:
        """The masks actually computed: `masks` minus `within_answer` when it duplicates `within_sequence`."""
        masks = list(self.masks or ())  # a list from __post_init__ on
        if self.mode == "terminal" and "within_sequence" in masks and "within_answer" in masks:
            return [m for m in masks if m != "within_answer"]
        return masks

    @property
    def streaming(self) -> bool:
        return self.mode == "streaming"

    def validate_architecture(self):
        """Part of `@strict` validation: every name and shape is checked when the config is built or loaded."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not a multiple of num_attention_heads "
                f"({self.num_attention_heads})."
            )
        masks = list(self.masks or ())
        unknown = [m for m in masks if m not in MASK_NAMES]
        if unknown:
            raise ValueError(f"Unknown MSV mask name(s) {unknown}; valid names are {list(MASK_NAMES)}.")
        if not masks or len(set(masks)) != len(masks):
            raise ValueError(f"masks must be a non-empty list without repeats, got {self.masks}.")
        for name, value, allowed in (
            ("mode", self.mode, MODES),
            ("readout", self.readout, READOUTS),
            ("attention_backend", self.attention_backend, ATTENTION_BACKENDS),
        ):
            if value not in allowed:
                raise ValueError(f"Unknown {name} {value!r}; valid values are {list(allowed)}.")
        if self.num_sequences < 1 or self.num_hidden_layers < 0:
            raise ValueError("num_sequences must be at least 1 and num_hidden_layers at least 0.")
        if self.vote_hidden_size < 1 or self.vote_threshold < 0 or self.vote_loss_weight < 0:
            raise ValueError(
                f"vote_hidden_size must be at least 1, vote_threshold and vote_loss_weight at least 0, "
                f"got {self.vote_hidden_size}, {self.vote_threshold}, {self.vote_loss_weight}."
            )
        if self.vote_hidden_act not in ACT2FN:
            raise ValueError(f"Unknown vote_hidden_act {self.vote_hidden_act!r}; valid values are {sorted(ACT2FN)}.")


def coerce_elicitation(value, mode: str, kwargs: dict) -> ElicitationSettings:
    """A config's `ElicitationSettings` from what it was built with: settings, their JSON dict, or nothing, plus
    the flat keys of configs saved before the settings existed (popped from `kwargs`). The mode is the config's."""
    legacy = ElicitationSettings.pop_legacy(kwargs)
    if isinstance(value, ElicitationSettings):
        settings = value
    else:
        data = {k: v for k, v in dict(value or {}).items() if k != "mode"}
        settings = ElicitationSettings.from_dict({**legacy, **data})
    return settings.replace(mode=mode)


def elicitation_to_json(settings: ElicitationSettings | dict | None) -> dict:
    """The settings as stored in config.json: without the mode, which the config holds."""
    out = settings.to_dict() if isinstance(settings, ElicitationSettings) else dict(settings or {})
    out.pop("mode", None)
    return out


# Saved configs carry this file and an ``auto_map``, so that ``trust_remote_code=True`` loads them without hf_msv.
MSVConfig.register_for_auto_class()

__all__ = ["MSVConfig", "MASK_NAMES"]
