"""Model cards and Hub uploads for verifiers, with huggingface_hub's `ModelCard` and `HfApi`.

transformers' own `push_to_hub` replaces README.md with a generic card, so verifiers are pushed here: the same
`save_pretrained` files (safetensors weights, config with `auto_map`, the remote-code files) plus an MSV card that
says which base LM, delimiter and elicitation prompt the verifier belongs to.
"""

from __future__ import annotations

import os
import tempfile
from importlib import resources

from huggingface_hub import HfApi, ModelCard, ModelCardData

TEMPLATE = resources.files("hf_msv") / "templates" / "model_card.md"


def _metrics_table(metrics: dict[str, float] | None) -> str:
    if not metrics:
        return "Not measured yet."
    rows = "\n".join(f"| {name} | {value:.4f} |" if isinstance(value, float) else f"| {name} | {value} |"
                     for name, value in metrics.items())
    return "| metric | value |\n|---|---|\n" + rows


def build_model_card(
    verifier,
    repo_id: str = "your-name/msv-verifier",
    metrics: dict[str, float] | None = None,
    training_data: str | None = None,
) -> ModelCard:
    """The card of `verifier` (an `MSVVerifier`), filled from its config and optional metrics."""
    config = verifier.config
    base = config.base_model_name_or_path or "unknown base LM"
    card_data = ModelCardData(
        library_name="transformers",
        base_model=config.base_model_name_or_path,
        tags=["hf_msv", "multi-sequence-verifier", "verifier", "test-time-scaling"],
        pipeline_tag="text-classification",
        license="apache-2.0",
    )
    with resources.as_file(TEMPLATE) as path:
        return ModelCard.from_template(
            card_data,
            template_path=str(path),
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
            delimiters=", ".join(f"`{d!r}`" for d in config.delimiters or []) or
            (f"every {config.every_k_tokens} tokens" if config.every_k_tokens else "none (terminal answers)"),
            elicitation_prompt=config.elicitation_prompt,
            max_answer_tokens=config.max_answer_tokens,
            training_data=training_data or "Not recorded.",
            metrics_table=_metrics_table(metrics),
        )


def save_verifier(verifier, save_directory: str | os.PathLike, metrics=None, training_data=None, repo_id=None):
    """`save_pretrained` (safetensors) plus README.md built from the template."""
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
    """Create `repo_id` if needed and upload the verifier's files and card in one commit."""
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    with tempfile.TemporaryDirectory() as folder:
        save_verifier(verifier, folder, metrics, training_data, repo_id)
        return api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message,
                                 revision=revision, create_pr=create_pr)


__all__ = ["build_model_card", "push_verifier_to_hub", "save_verifier"]
