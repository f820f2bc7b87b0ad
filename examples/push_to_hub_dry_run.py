"""Share a verifier on the Hub — dry run: the upload call is replaced by one that lists what would be sent.

    python examples/push_to_hub_dry_run.py       # (--quick runs the same: it is quick already)

Drop the two `mock.patch` lines (and log in with `hf auth login`) to push for real.
"""

import argparse
import json
import os
from pathlib import Path
from unittest import mock

from huggingface_hub import HfApi

from hf_msv import MSVConfig, MSVVerifier


def show_upload(self, *, repo_id, folder_path, **kwargs):
    print(f"would upload to {repo_id}:")
    for name in sorted(os.listdir(folder_path)):
        print(f"  {name:<24} {os.path.getsize(os.path.join(folder_path, name)):>9} bytes")
    card = Path(folder_path, "README.md").read_text()
    print("\n".join(card.splitlines()[:14]))
    return json.loads(Path(folder_path, "config.json").read_text())["auto_map"]


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--quick", action="store_true", help="the same run (it is quick already)")
parser.parse_args()
verifier = MSVVerifier(
    MSVConfig(
        hidden_size=256,
        num_attention_heads=4,
        num_sequences=16,
        base_model_name_or_path="your-org/your-reasoning-lm",
        delimiters=["Wait"],
    )
)
with (
    mock.patch.object(HfApi, "create_repo", lambda self, repo_id, **kw: mock.Mock(repo_id=repo_id)),
    mock.patch.object(HfApi, "upload_folder", show_upload),
):
    print("auto_map sent:", verifier.push_to_hub("your-name/msv16-demo", metrics={"brier": 0.05}))
