"""Hub test builders: `FakeHub` (the `HfApi` calls of an upload, recorded instead of sent), `check_card_offline`
(huggingface_hub's `ModelCard.validate` checks that need no network) and `write_evidence` (a checkpoint directory's
``training_log.json`` and stopping rule, shaped as training writes them)."""

import json
from pathlib import Path

import yaml
from huggingface_hub import HfApi, ModelCard
from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results

from hf_msv.lambda_rule import LambdaChoice
from hf_msv.stop_rules import StopHead
from hf_msv.training.guard import GuardReport


class FakeHub:
    """Replaces `HfApi.create_repo`, `create_branch`, `upload_folder` and `create_commit` (with `monkeypatch`):
    ``calls[name]`` holds each call's keyword arguments, ``files`` the uploaded folder's files (name -> bytes)."""

    def __init__(self, monkeypatch):
        self.calls: dict[str, list[dict]] = {}
        self.files: dict[str, bytes] = {}
        hub = self

        class Repo:
            def __init__(self, repo_id):
                self.repo_id = repo_id

        def record(name):
            def call(api, *args, **kwargs):
                hub.calls.setdefault(name, []).append(dict(zip(("repo_id",), args)) | kwargs)
                if name == "upload_folder":
                    folder = Path(kwargs["folder_path"])
                    hub.files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
                    return f"commit of {kwargs['repo_id']}"
                return Repo(args[0] if args else kwargs["repo_id"])

            return call

        for name in ("create_repo", "create_branch", "upload_folder", "create_commit"):
            monkeypatch.setattr(HfApi, name, record(name))

    def card(self) -> str:
        return self.files["README.md"].decode("utf-8")


def check_card_offline(text: str) -> dict:
    """What `ModelCard.validate` asks the Hub to check, offline: the YAML header parses, the ``model-index`` has its
    required keys and round-trips through huggingface_hub's eval-results conversion, `ModelCard` reads it back.

    Returns:
        The parsed metadata.
    """
    assert text.startswith("---\n"), "a card starts with its YAML header"
    header = text.split("---\n", 2)[1]
    metadata = yaml.safe_load(header)
    assert isinstance(metadata, dict) and {"library_name", "license", "tags"} <= set(metadata)
    card = ModelCard(text)
    index = metadata.get("model-index")
    if index is not None:
        for entry in index:
            assert entry["name"] and entry["results"]
            for result in entry["results"]:
                assert result["task"]["type"] and result["dataset"]["type"] and result["dataset"]["name"]
                assert all(m["type"] and isinstance(m["value"], (int, float)) for m in result["metrics"])
        name, results = model_index_to_eval_results(index)
        assert eval_results_to_model_index(name, results) == index
        assert card.data.model_name == name and card.data.eval_results == results
    return metadata


def write_evidence(directory, config=None, passed: bool = True) -> dict:
    """Write a ``training_log.json`` into `directory` (three validations, the second kept, a guard) and, with an MSV
    `config`, a stopping rule into it (what training stores in ``config.early_stopping``).

    Returns:
        The log written.
    """
    history = [
        {"epoch": i, "step": 10 * i, "val_bce": bce, "val_brier": bce / 3, "val_auroc": 0.8 + i / 100}
        | {"val_ece": 0.01 * (i + 1), "val_answers": 500, "val_accuracy": 0.4}
        for i, bce in enumerate((0.6, 0.31, 0.45))
    ]
    scores = {"brier": 0.2, "auroc": 0.7, "nll": 0.6}
    guard = GuardReport(
        name="MSV_4",
        num_sequences=4,
        answers=500,
        base_rate=0.4,
        verifier={"brier": 0.1033, "auroc": 0.81, "nll": 0.31},
        self_consistency=scores,
        linear_probe=scores | {"brier": 0.25},
        passed=passed,
        baselines={"Probe+WV": scores | {"brier": 0.09}},
        best="Probe+WV",
    )
    log = {"best_epoch": 1, "best_step": 10, "history": history, "training_data": "Four problems of a test."}
    log |= {"guard": guard.to_dict(), "early_stopping": {"stop_head_penalty": {"penalty": 16.0, "folds": 4}}}
    Path(directory, "training_log.json").write_text(json.dumps(log))
    if config is not None:
        choice = LambdaChoice(0.8, "guarantee", True, 0.02, 0.1, None, 300, 149, 0.7, 60.0, 0.0, 0.7, 100.0)
        head = StopHead(coef=(0.5, -0.25, 1.0), intercept=-1.0, num_chains=4)
        config.early_stopping = {"stop_head": head.to_dict(), "lambda": choice.to_dict()}
    return log
