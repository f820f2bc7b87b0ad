"""Model cards and Hub uploads for verifiers (MSV and Probe), with huggingface_hub's `ModelCard` and `HfApi`.

transformers' own `push_to_hub` replaces README.md with a generic card, so verifiers are pushed here: the same
`save_pretrained` files (safetensors weights, config with `auto_map`, the remote-code files) plus a card, built from
a template in ``hf_msv/templates/``, that says which base LM, delimiter and elicitation prompt the verifier belongs to.
Every card hf_msv writes is built here: `save_verifier` (training's checkpoints), `push_verifier_to_hub`, and the
examples in the repository's ``model_cards/`` (`write_model_cards`).
"""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from pathlib import Path

from huggingface_hub import HfApi, ModelCard, ModelCardData

TEMPLATE = resources.files("hf_msv") / "templates" / "model_card.md"
"""The MSV card template (Jinja, rendered by `ModelCard.from_template`)."""

PROBE_TEMPLATE = resources.files("hf_msv") / "templates" / "probe_card.md"
"""The Probe baseline's card template."""


def _metrics_table(metrics: dict[str, float] | None) -> str:
    if not metrics:
        return "Not measured yet."
    rows = "\n".join(
        f"| {name} | {value:.4f} |" if isinstance(value, float) else f"| {name} | {value} |"
        for name, value in metrics.items()
    )
    return "| metric | value |\n|---|---|\n" + rows


def _from_template(template, card_data: ModelCardData, **fields) -> ModelCard:
    with resources.as_file(template) as path:
        return ModelCard.from_template(card_data, template_path=str(path), **fields)


def _probe_card(config, metrics: dict | None, training_data: str | None) -> ModelCard:
    card_data = ModelCardData(
        library_name="transformers",
        base_model=config.base_model_name_or_path,
        tags=["hf_msv", "verifier", "probe"],
        license="apache-2.0",
    )
    return _from_template(
        PROBE_TEMPLATE,
        card_data,
        base_model=config.base_model_name_or_path,
        intermediate_size=config.intermediate_size,
        mode=config.mode,
        training_data=training_data or "Not recorded.",
        metrics_table=_metrics_table(metrics),
    )


def build_model_card(
    verifier,
    repo_id: str = "your-name/msv-verifier",
    metrics: dict[str, float] | None = None,
    training_data: str | None = None,
) -> ModelCard:
    """The card of `verifier`, filled from its config and optional metrics.

    Args:
        verifier: an `MSVVerifier` or a `ProbeVerifier`, or the config of either (nothing but the config is read).
        repo_id: where the card will live (the MSV card's title and loading snippet use it).
        metrics: name -> value rows of the card's metrics table (floats shown with 4 decimals).
        training_data: a sentence or two on what the verifier was trained on.

    Returns:
        The rendered `ModelCard` (the Probe template for a ``msv_probe`` config, else the MSV one).
    """
    config = getattr(verifier, "config", verifier)
    if config.model_type == "msv_probe":
        return _probe_card(config, metrics, training_data)
    base = config.base_model_name_or_path or "unknown base LM"
    elicitation = config.elicitation
    card_data = ModelCardData(
        library_name="transformers",
        base_model=config.base_model_name_or_path,
        tags=["hf_msv", "multi-sequence-verifier", "verifier", "test-time-scaling"],
        pipeline_tag="text-classification",
        license="apache-2.0",
    )
    return _from_template(
        TEMPLATE,
        card_data,
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        base_model=base,
        base_model_revision=config.base_model_revision,
        mode=config.mode,
        num_sequences=config.num_sequences,
        masks=", ".join(config.masks),
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        readout=config.readout,
        logit_averaging=config.logit_averaging,
        delimiters=", ".join(f"`{d!r}`" for d in elicitation.delimiters)
        or (f"every {elicitation.every_k_tokens} tokens" if elicitation.every_k_tokens else "none (terminal answers)"),
        elicitation_prompt=elicitation.prompt,
        max_answer_tokens=elicitation.max_answer_tokens,
        training_data=training_data or "Not recorded.",
        metrics_table=_metrics_table(metrics),
    )


def save_verifier(verifier, save_directory: str | os.PathLike, metrics=None, training_data=None, repo_id=None):
    """`save_pretrained` (safetensors) plus README.md from `build_model_card` (an MSV or a Probe verifier).

    Args:
        verifier: an `MSVVerifier` or a `ProbeVerifier`.
        save_directory: where to write the files.
        metrics: the card's metrics table (`build_model_card`).
        training_data: the card's training-data sentence.
        repo_id: the card's repo id; default the directory's name.
    """
    verifier.save_pretrained(save_directory)
    card = build_model_card(verifier, repo_id or os.path.basename(os.fspath(save_directory)), metrics, training_data)
    card.save(os.path.join(save_directory, "README.md"))


def push_verifier_to_hub(
    verifier,
    repo_id: str,
    *,
    metrics: dict[str, float] | None = None,
    training_data: str | None = None,
    commit_message: str = "Upload MSV verifier",
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
):
    """Create `repo_id` if needed and upload the verifier's files and card in one commit.

    Args:
        verifier: an `MSVVerifier` or a `ProbeVerifier`.
        repo_id: the Hub repository (created if missing).
        metrics, training_data: the card's metrics table and training-data sentence (`build_model_card`).
        commit_message: the commit's message.
        private: visibility of a newly created repository (`None`: the Hub's default).
        token: the Hub token (`None`: the cached login).
        revision: the branch to commit to.
        create_pr: open a pull request instead of committing to the branch.

    Returns:
        What `HfApi.upload_folder` returns (the commit's info).
    """
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    with tempfile.TemporaryDirectory() as folder:
        save_verifier(verifier, folder, metrics, training_data, repo_id)
        return api.upload_folder(
            repo_id=repo_id, folder_path=folder, commit_message=commit_message, revision=revision, create_pr=create_pr
        )


# ----------------------------------------------------------------------------------------------------------------
# The repository's model_cards/: example cards rendered from the templates above
# ----------------------------------------------------------------------------------------------------------------

EXAMPLE_BASE_MODEL = "your-org/your-reasoning-lm"
_EXAMPLE_TRAINING_DATA = (
    "Example card: rendered by `hf_msv.hub.write_model_cards` from the package template for an "
    "untrained verifier; `hf-msv train` fills this section and the metrics."
)


def example_model_cards() -> dict[str, str]:
    """File name -> text of the example cards kept in the repository's ``model_cards/`` (no weights needed)."""
    from .configuration_msv import MSVConfig
    from .modeling_probe import ProbeConfig

    msv = MSVConfig(
        hidden_size=1536,
        num_attention_heads=12,
        num_sequences=16,
        mode="streaming",
        base_model_name_or_path=EXAMPLE_BASE_MODEL,
    )
    probe = ProbeConfig(hidden_size=1536, mode="streaming", base_model_name_or_path=EXAMPLE_BASE_MODEL)
    return {
        "msv-example.md": str(
            build_model_card(msv, "your-name/msv16-streaming", training_data=_EXAMPLE_TRAINING_DATA)
        ),
        "probe-example.md": str(
            build_model_card(probe, "your-name/probe-streaming", training_data=_EXAMPLE_TRAINING_DATA)
        ),
    }


def write_model_cards(directory: str | os.PathLike = "model_cards") -> list[Path]:
    """(Re)write `example_model_cards` into `directory`; ``tests/test_hub.py`` checks the committed ones are current.

    python -c "from hf_msv.hub import write_model_cards; write_model_cards()"   # from the repository root

    Args:
        directory: the target directory (created if missing).

    Returns:
        The paths written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in example_model_cards().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


__all__ = ["build_model_card", "example_model_cards", "push_verifier_to_hub", "save_verifier", "write_model_cards"]
