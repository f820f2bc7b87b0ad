"""Model cards and Hub uploads for verifiers (MSV and Probe), with huggingface_hub's `ModelCard` and `HfApi`.

transformers' own `push_to_hub` replaces README.md with a generic card, so verifiers are pushed here: the same
`save_pretrained` files (safetensors weights, config with `auto_map`, the remote-code files), the checkpoint's evidence
(``training_log.json``, ``early_stopping.json``) and a card, built from a template in ``hf_msv/templates/``, that
says which base LM, delimiter and elicitation prompt the verifier belongs to and how it was validated (metrics as
``model-index`` eval results, the guard's verdict, the λ of early stopping). The card is rebuilt from the checkpoint
directory's files, so a pushed verifier carries the card training wrote. Every card hf_msv writes is built here:
`save_verifier` (training's checkpoints), `push_verifier_to_hub`, and the examples in the repository's
``model_cards/`` (`write_model_cards`). See docs/hub.md.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path

from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData, try_to_load_from_cache
from huggingface_hub.utils import HFValidationError, validate_repo_id

from .errors import UserError
from .lambda_rule import LambdaChoice
from .pruning import PruneRule
from .stop_rules import StopHead
from .utils import file_mode

TEMPLATE = resources.files("hf_msv") / "templates" / "model_card.md"
"""The MSV card template (Jinja, rendered by `ModelCard.from_template`)."""

PROBE_TEMPLATE = resources.files("hf_msv") / "templates" / "probe_card.md"
"""The Probe baseline's card template."""

TRAINING_LOG = "training_log.json"
"""Written by `hf-msv train` beside the weights: the validation history, the kept step, the guard."""

EARLY_STOPPING_FILE = "early_stopping.json"
"""Written beside a verifier whose stopping rule was refitted (the shipped one): the λ and how it was chosen."""

EVIDENCE_FILES = (TRAINING_LOG, EARLY_STOPPING_FILE)
"""The files that travel with the weights (when present) and from which the card is rebuilt."""

PACKAGE_URL = "https://pypi.org/project/hf-msv/"

# validation metric -> (model-index metric type, its name on the card); the answers' accuracy is a base rate, not a
# score of the verifier, so it stays in the table only.
_EVAL_METRICS = {
    "brier": ("brier_score", "Brier score"),
    "auroc": ("roc_auc", "AUROC"),
    "ece": ("ece", "expected calibration error"),
    "bce": ("bce", "binary cross-entropy"),
}


@dataclass(frozen=True)
class VerifierEvidence:
    """How a checkpoint was validated, read from its directory and its config: what its card reports.

    Args:
        validation: the kept checkpoint's validation metrics (``training_log.json``'s history), name -> value.
        step: the training step of the kept checkpoint.
        guard: the guard's comparison with the baselines (``training_log.json["guard"]``).
        choice: the λ generation stops at, and the evidence behind it.
        guarantee: what Learn-then-Test certified on the calibration problems (ε, δ, n, the n ε needs); None when
            not recorded.
        stop_head: the stop head λ applies to.
        stop_head_penalty: its cross-validated ridge penalty (∞: Platt scaling of the class's mean score); None
            when not recorded.
        at_stop: the stop-time calibration on validation (stopped share, accuracy, confidence).
        training_data: the log's description of the training and validation data.
        pruning: the pruning rule certified jointly with a λ (``config.early_stopping["pruning"]``); None when none.
        files: the evidence files found (`EVIDENCE_FILES`), uploaded with the weights.
    """

    validation: dict = field(default_factory=dict)
    step: int | None = None
    guard: dict | None = None
    choice: LambdaChoice | None = None
    guarantee: LambdaChoice | None = None
    stop_head: StopHead | None = None
    stop_head_penalty: float | None = None
    at_stop: dict | None = None
    training_data: str | None = None
    pruning: dict | None = None
    files: tuple[Path, ...] = ()


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def read_evidence(directory: str | os.PathLike, config) -> VerifierEvidence:
    """The evidence of the verifier saved in `directory` (its `EVIDENCE_FILES`) and of its `config`.

    Args:
        directory: a checkpoint directory (missing files mean no evidence of that kind).
        config: the verifier's config; its ``early_stopping`` (what generation reads) wins over the files'.

    Returns:
        The `VerifierEvidence`.
    """
    directory = Path(directory)
    log, refit = _read_json(directory / TRAINING_LOG), _read_json(directory / EARLY_STOPPING_FILE)
    history = log.get("history") or []
    best = history[log["best_epoch"]] if 0 <= log.get("best_epoch", -1) < len(history) else {}
    fitted = log.get("early_stopping") or {}
    stored = refit.get("choice") or fitted.get("lambda")
    certified = (getattr(config, "early_stopping", None) or {}).get("guarantee") or refit.get("guarantee")
    certified = certified or fitted.get("guarantee")
    head = refit.get("stop_head") or fitted.get("stop_head")
    penalty = None if refit.get("stop_head") else fitted.get("stop_head_penalty")
    return VerifierEvidence(
        validation={k.removeprefix("val_"): v for k, v in best.items() if k.startswith("val_")},
        step=best.get("step"),
        guard=log.get("guard"),
        choice=LambdaChoice.of(config) or (LambdaChoice.from_dict(stored) if stored else None),
        guarantee=LambdaChoice.from_dict(certified) if certified else None,
        stop_head=StopHead.of(config) or (StopHead.from_dict(head) if head else None),
        stop_head_penalty=None if penalty is None else math.inf if penalty["penalty"] is None else penalty["penalty"],
        at_stop=refit.get("at_stop") or fitted.get("at_stop"),  # the refit rewrote the config's λ too
        training_data=log.get("training_data"),
        pruning=(getattr(config, "early_stopping", None) or {}).get("pruning") or None,
        files=tuple(directory / name for name in EVIDENCE_FILES if (directory / name).is_file()),
    )


def hub_base_model(name: str | None) -> str | None:
    """`name` when it reads as a Hub model id (``org/name``) and is not a local path, else `None`.

    Args:
        name: a config's ``base_model_name_or_path``.

    Returns:
        The id for the card's ``base_model`` field, or `None` (the card then names the LM in its text only).
    """
    if not name or name.count("/") != 1 or os.path.exists(name):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def guard_rows(guard: dict) -> dict:
    """The card rows of the guard (``GuardReport.to_dict()``): the baselines' validation Brier and AUROC and the
    verdict.

    Args:
        guard: the guard's comparison as ``training_log.json`` holds it.

    Returns:
        Row name -> value.
    """
    rows = {guard["reference"]: guard["self_consistency"]}
    rows |= ({"linear probe": guard["linear_probe"]} if guard.get("linear_probe") else {}) | guard["baselines"]
    table = {}
    for method, scores in rows.items():
        table |= {f"validation brier ({method})": scores["brier"], f"validation auroc ({method})": scores["auroc"]}
    if guard["passed"]:
        verdict = "passed"
    elif guard["extra"].get("kept_vote"):
        verdict = "FAILED: kept the calibrated vote it started from (no trained checkpoint beat it)"
    else:
        verdict = f"FAILED: worse than {guard['best']}"
    return table | {"guard": verdict}


def _metrics_table(metrics: dict | None) -> str:
    if not metrics:
        return "Not measured yet."
    rows = "\n".join(
        f"| {name} | {value:.4f} |" if isinstance(value, float) else f"| {name} | {value} |"
        for name, value in metrics.items()
    )
    return "| metric | value |\n|---|---|\n" + rows


def _card_metrics(evidence: VerifierEvidence, metrics: dict | None) -> dict:
    """The card's metrics table: the evidence's rows, then the caller's (which win on a shared name)."""
    rows = {f"validation {name}": value for name, value in evidence.validation.items()}
    rows |= {"step": evidence.step} if evidence.step is not None else {}
    rows |= guard_rows(evidence.guard) if evidence.guard else {}
    return rows | (metrics or {})


def _eval_results(evidence: VerifierEvidence, lm: str) -> list[EvalResult]:
    """The verifier's validation scores (and its early stopping's) as ``model-index`` entries."""
    result = partial(
        EvalResult,
        task_type="other",
        task_name="answer verification",
        dataset_type="hf_msv-shards",
        dataset_name=f"validation answers of {lm}",
        dataset_split="validation",
    )
    validation = evidence.validation
    results = [
        result(metric_type=kind, metric_name=f"validation {label}", metric_value=validation[name])
        for name, (kind, label) in _EVAL_METRICS.items()
        if isinstance(validation.get(name), float) and math.isfinite(validation[name])
    ]
    choice = evidence.choice
    if choice is not None and not math.isinf(choice.lam):
        at = f"with early stopping at λ = {choice.lam:g}"
        results += [
            result(metric_type="accuracy", metric_name=f"accuracy {at}", metric_value=choice.accuracy),
            result(
                metric_type="token_fraction",
                metric_name=f"fraction of full-decoding tokens {at}",
                metric_value=choice.token_fraction,
            ),
        ]
    return results


def _early_stopping(evidence: VerifierEvidence) -> str | None:
    """The card's early-stopping section: λ, what it certifies (ε, δ, validation problems), the stop head."""
    choice = evidence.choice
    if choice is None:
        return None
    lines = [f"- {choice.describe()} (the {choice.rule} rule; `MSVEarlyStop.from_verifier` stops at this λ)."]
    certified = evidence.guarantee or (choice if choice.rule == "guarantee" else None)
    if certified is not None:
        lines.append(
            f"- Learn-then-Test: ε = {certified.epsilon:g}, δ = {certified.delta:g}, on {certified.num_problems} "
            f"calibration problems the stop head was not fitted on (ε needs ≥ {certified.problems_needed} without an "
            f"observed loss); certified: {'yes' if certified.reached else 'no (full decoding by default)'}."
        )
    else:
        lines.append("- No guarantee recorded: this λ carries none.")
    if evidence.stop_head is not None:
        head = evidence.stop_head
        fires_on = (
            "P(this class is correct), which it also reports"
            if head.confidence_coef is None
            else "P(stopping loses nothing against full decoding); it outputs the available answer of highest "
            "P(this class is correct) and reports that P"
        )
        lines.append(
            f"- Stop head: logistic over {len(head.coef)} stopping features of {head.num_chains} chains "
            f"(`hf_msv.StopHead.of(verifier.config)`), firing on {fires_on}"
            + _penalty_note(evidence.stop_head_penalty)
            + "."
        )
        if head.min_share > 0:
            lines.append(floor_card_line(head))
    if evidence.pruning:
        lines.append(pruning_card_line(evidence.pruning))
    if evidence.at_stop and evidence.at_stop.get("stopped"):
        at = evidence.at_stop
        lines.append(
            f"- At the stop ({at['stopped']:.0%} of validation groups stop early): accuracy {at['accuracy']:.3f}, "
            f"mean confidence {at['confidence']:.3f}."
        )
    return "\n".join(lines)


PRUNING_CARD_PREFIX = "- Default with pruning:"  # the start of `pruning_card_line`: a re-fit replaces that line


FLOOR_CARD_PREFIX = "- Support floor"  # the start of `floor_card_line`: a re-fit replaces that line


def floor_card_line(head) -> str:
    """The card's line for a stop head's support floor (`StopHead.min_share`, `StopHead.floor_below`)."""
    below = "" if head.floor_below is None else f" in runs at λ < {head.floor_below:g} (off at and above it)"
    return (
        f"{FLOOR_CARD_PREFIX}{below}: a class fewer than {head.min_share:g} × N chains hold neither stops the group "
        "nor is output while a larger class has any confidence."
    )


def pruning_card_line(entry: dict) -> str:
    """The card's line for a pruning rule certified jointly with its λ (docs/pruning.md)."""
    pair = LambdaChoice.from_dict(entry["lambda"])
    joint = entry.get("joint") or {}
    loss = "net accuracy drop" if "net loss" in joint.get("procedure", "") else "answers lost"
    return (
        f"{PRUNING_CARD_PREFIX} {PruneRule.from_dict(entry['rule']).describe()}, beside the stop at λ = "
        f"{pair.lam:g}, certified jointly ({loss} ≤ ε = {pair.epsilon:g} at δ = {pair.delta:g} on "
        f"{pair.num_problems} calibration problems; calibration accuracy {pair.accuracy:.3f} against full "
        f"decoding's {pair.full_accuracy:.3f}). `prune=False` stops alone at the λ above."
    )


def _penalty_note(penalty: float | None) -> str:
    if penalty is None:
        return ""
    if math.isinf(penalty):
        return "; cross-validation kept the prior: Platt scaling of the class's mean score"
    return f"; ridge penalty {penalty:g} beyond the class's mean score, chosen by cross-validation over problems"


def _card_data(config, model_name: str, evidence: VerifierEvidence, tags: list[str]) -> ModelCardData:
    lm = config.base_model_name_or_path or "an unrecorded base LM"
    results = _eval_results(evidence, lm)
    # No pipeline_tag: the verifier reads hidden states of another model, not text, so no Hub task widget can run it.
    return ModelCardData(
        library_name="transformers",
        base_model=hub_base_model(config.base_model_name_or_path),
        tags=list(dict.fromkeys(tags)),
        license="apache-2.0",
        model_name=model_name if results else None,
        eval_results=results or None,
    )


def _from_template(template, card_data: ModelCardData, **fields) -> ModelCard:
    with resources.as_file(template) as path:
        return ModelCard.from_template(card_data, template_path=str(path), **fields)


def _probe_card(config, repo_id: str, evidence: VerifierEvidence, metrics, training_data, tags) -> ModelCard:
    card_data = _card_data(config, repo_id.split("/")[-1], evidence, ["hf_msv", "verifier", "probe", *tags])
    return _from_template(
        PROBE_TEMPLATE,
        card_data,
        repo_id=repo_id,
        package_url=PACKAGE_URL,
        base_model=config.base_model_name_or_path or "an unrecorded base LM",
        intermediate_size=config.intermediate_size,
        hidden_size=config.hidden_size,
        mode=config.mode,
        training_data=training_data or evidence.training_data or "Not recorded.",
        metrics_table=_metrics_table(_card_metrics(evidence, metrics)),
    )


def build_model_card(
    verifier,
    repo_id: str = "your-name/msv-verifier",
    metrics: dict | None = None,
    training_data: str | None = None,
    evidence: VerifierEvidence | None = None,
    tags: list[str] | tuple[str, ...] = (),
) -> ModelCard:
    """The card of `verifier`, filled from its config, its evidence and optional extra metrics.

    Args:
        verifier: an `MSVVerifier` or a `ProbeVerifier`, or the config of either (nothing but the config is read).
        repo_id: where the card will live (title and loading snippet; the ``model-index`` name).
        metrics: extra name -> value rows of the card's metrics table, after the evidence's (floats: 4 decimals).
        training_data: a sentence or two on what the verifier was trained on (default: the evidence's).
        evidence: what `read_evidence` found (default: the config's stopping rule only).
        tags: Hub tags added to hf_msv's.

    Returns:
        The rendered `ModelCard` (the Probe template for a ``msv_probe`` config, else the MSV one).
    """
    config = getattr(verifier, "config", verifier)
    evidence = evidence or VerifierEvidence(choice=LambdaChoice.of(config), stop_head=StopHead.of(config))
    if config.model_type == "msv_probe":
        return _probe_card(config, repo_id, evidence, metrics, training_data, tags)
    base = config.base_model_name_or_path or "an unrecorded base LM"
    elicitation = config.elicitation
    card_data = _card_data(
        config,
        repo_id.split("/")[-1],
        evidence,
        ["hf_msv", "multi-sequence-verifier", "verifier", "test-time-scaling", *tags],
    )
    return _from_template(
        TEMPLATE,
        card_data,
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        package_url=PACKAGE_URL,
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
        training_data=training_data or evidence.training_data or "Not recorded.",
        metrics_table=_metrics_table(_card_metrics(evidence, metrics)),
        early_stopping=_early_stopping(evidence),
    )


def _evidence_sources(verifier) -> list[Path]:
    """The evidence files of the checkpoint `verifier` was loaded from: its local directory's, or the cached copies
    of a Hub repository's (offline: only what ``from_pretrained`` or a download already cached)."""
    origin = getattr(verifier, "name_or_path", "") or ""
    if origin and os.path.isdir(origin):
        return [Path(origin) / name for name in EVIDENCE_FILES if (Path(origin) / name).is_file()]
    if hub_base_model(origin) is None:
        return []
    cached = (try_to_load_from_cache(origin, name) for name in EVIDENCE_FILES)
    return [Path(path) for path in cached if isinstance(path, str)]


def save_verifier(
    verifier,
    save_directory: str | os.PathLike,
    metrics: dict | None = None,
    training_data: str | None = None,
    repo_id: str | None = None,
    tags: list[str] | tuple[str, ...] = (),
    max_shard_size: int | str | None = "50GB",
) -> ModelCard:
    """`save_pretrained` (safetensors), the evidence files of the checkpoint it was loaded from, and README.md:
    the card `build_model_card` makes of the directory's evidence (`read_evidence`).

    Args:
        verifier: an `MSVVerifier` or a `ProbeVerifier`.
        save_directory: where to write the files (its ``training_log.json`` is the card's evidence).
        metrics: extra rows of the card's metrics table.
        training_data: the card's training-data sentence (default: the log's).
        repo_id: the card's repo id; default the directory's name.
        tags: Hub tags added to hf_msv's.
        max_shard_size: passed to `save_pretrained`.

    Returns:
        The card written.
    """
    save_directory = Path(save_directory)
    verifier.save_pretrained(save_directory, max_shard_size=max_shard_size)
    for source in _evidence_sources(verifier):
        if source.parent.resolve() != save_directory.resolve():
            shutil.copyfile(source, save_directory / source.name)
    evidence = read_evidence(save_directory, verifier.config)
    card = build_model_card(verifier, repo_id or save_directory.resolve().name, metrics, training_data, evidence, tags)
    card.save(save_directory / "README.md")
    _umask_modes(save_directory)
    return card


def _umask_modes(directory: Path) -> None:
    """Give the files of `directory` the mode the user's umask gives a new file: safetensors writes weights 0600,
    which keeps a verifier saved in a shared directory from the colleagues who share it."""
    mode = file_mode()
    for path in directory.iterdir():
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def _check_push_arguments(repo_id, tags) -> None:
    """User errors of `push_verifier_to_hub`, raised before the repository is created."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise UserError(f"push_to_hub: {error}") from None
    if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags or ()):
        raise UserError(f"push_to_hub: tags must be a list of strings, got {tags!r}")


def push_verifier_to_hub(
    verifier,
    repo_id: str,
    *,
    commit_message: str | None = None,
    commit_description: str | None = None,
    private: bool | None = None,
    token: bool | str | None = None,
    revision: str | None = None,
    create_pr: bool = False,
    max_shard_size: int | str | None = "50GB",
    tags: list[str] | None = None,
    metrics: dict | None = None,
    training_data: str | None = None,
):
    """Create `repo_id` if needed and upload, in one commit, what `save_verifier` writes: weights, config (with
    ``auto_map``), remote code, the evidence files and the card rebuilt from them. The arguments are
    `PreTrainedModel.push_to_hub`'s, plus the card's extras.

    Args:
        verifier: an `MSVVerifier` or a `ProbeVerifier` (its evidence: the directory it was loaded from).
        repo_id: the Hub repository (created if missing).
        commit_message: the commit's title (default: "Upload <class name>").
        commit_description: the commit's description.
        private: visibility of a newly created repository (`None`: the Hub's default).
        token: the Hub token (`None` / `True`: the cached login).
        revision: the branch to commit to (created from the default branch if missing).
        create_pr: open a pull request instead of committing to the branch.
        max_shard_size: passed to `save_pretrained`.
        tags: Hub tags added to the card's.
        metrics, training_data: extra card rows and the training-data sentence (`build_model_card`).

    Returns:
        What `HfApi.upload_folder` returns (the commit's info).
    """
    _check_push_arguments(repo_id, tags)
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision and not create_pr and not revision.startswith("refs/"):
        api.create_branch(repo_id, branch=revision, exist_ok=True)  # upload_folder needs the branch to exist
    with tempfile.TemporaryDirectory() as folder:
        save_verifier(verifier, folder, metrics, training_data, repo_id, tags or (), max_shard_size)
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            commit_message=commit_message or f"Upload {type(verifier).__name__}",
            commit_description=commit_description,
            revision=revision,
            create_pr=create_pr,
        )


# ----------------------------------------------------------------------------------------------------------------
# The repository's model_cards/: example cards rendered from the templates above
# ----------------------------------------------------------------------------------------------------------------

EXAMPLE_BASE_MODEL = "your-org/your-reasoning-lm"
_EXAMPLE_TRAINING_DATA = (
    "Example card: rendered by `hf_msv.hub.write_model_cards` from the package template for an "
    "untrained verifier; `hf-msv train` fills this section, the validation table (with the guard) and the "
    "early stopping from the checkpoint's training_log.json and config (docs/hub.md)."
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


__all__ = [
    "EVIDENCE_FILES",
    "VerifierEvidence",
    "build_model_card",
    "example_model_cards",
    "guard_rows",
    "hub_base_model",
    "push_verifier_to_hub",
    "read_evidence",
    "save_verifier",
    "write_model_cards",
]
