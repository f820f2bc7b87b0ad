"""Training throughput of `hf_msv.training.train_verifier` (groups per second) for streaming MSV_16 and MSV_64.

Synthetic shards shaped like the testbed's collected data: the testbed LM's width and heads (read from the shipped
checkpoint, else 192 / 6), 64 sequences per problem, 1 terminal answer plus a Poisson number of ``Wait`` answers per
sequence (mean `--waits`, as the testbed's re-checks), answers of 3-6 tokens (``{52}`` is 4 characters = 4 tokens).
The timed part is the whole training step as `train_verifier` runs it: reading groups from the shards (held in
memory: the split is below `hf_msv.data.PRELOAD_BYTES`), collate with γ, forward, backward, clipping and AdamW, with
the paper's batch of 64 groups; validation is excluded. Reading alone is also timed both ways, memory-mapped per
item and preloaded (``read_groups_per_s_*``: one epoch of MSV_16 streaming groups; the items are identical).

    python benchmarks/train_throughput.py            # 128 training problems, 1 epoch each
    python benchmarks/train_throughput.py --quick    # 16 problems, at most 3 steps each

Last line: JSON with ``groups_per_s`` per configuration and the reading rates.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch


def testbed_shape() -> tuple[int, int]:
    from hf_msv.testbed import TESTBED_LM_DIR

    config = TESTBED_LM_DIR / "config.json"
    if config.exists():
        data = json.loads(config.read_text())
        return data["hidden_size"], data["num_attention_heads"]
    return 192, 6


def synthetic_problem(pid: str, rng: np.random.Generator, d: int, sequences: int, waits: float):
    from hf_msv.data import CollectedProblem

    rows = []
    for n in range(sequences):
        length = int(rng.integers(80, 160))  # CoT tokens
        k = int(rng.poisson(waits))
        taus = sorted(rng.choice(np.arange(5, length - 1), size=min(k, length - 6), replace=False).tolist())
        taus.append(length - 1)
        for step, tau in enumerate(taus):
            rows.append((tau, n, step, step == len(taus) - 1, str(int(rng.integers(0, 5))), int(rng.integers(3, 7))))
    rows.sort()
    texts = [r[4] for r in rows]
    lengths = [r[5] for r in rows]
    t = sum(lengths)
    seq_len = [max(r[0] for r in rows if r[1] == n) + 1 for n in range(sequences)]
    return CollectedProblem(
        problem_id=pid,
        gold="0",
        hidden_states=torch.randn(t, d),
        token_ids=np.zeros(t),
        token_logprobs=np.zeros(t, dtype=np.float32),
        answer_text=texts,
        answer_raw_text=texts,
        answer_trigger=["eos" if r[3] else "delimiter" for r in rows],
        answer_sequence=[r[1] for r in rows],
        answer_step=[r[2] for r in rows],
        answer_tau=[r[0] for r in rows],
        answer_length=lengths,
        answer_class=[int(x) for x in texts],
        answer_terminal=[r[3] for r in rows],
        answer_correct=[x == "0" for x in texts],
        sequence_length=seq_len,
        sequence_finish=["eos"] * sequences,
    )


def write_split(directory: Path, count: int, d: int, heads: int, sequences: int, waits: float, seed: int):
    from hf_msv.data import write_shard

    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    problems = [synthetic_problem(f"{directory.name}/{i}", rng, d, sequences, waits) for i in range(count)]
    for s in range(0, count, 16):
        write_shard(
            directory / f"shard-r000-{s // 16:05d}.safetensors",
            problems[s : s + 16],
            info={"lm_name_or_path": "testbed-shaped", "lm_num_attention_heads": heads, "checker": "exact"},
        )


def read_rate(directory: Path, preload: bool) -> float:
    """Groups read per second over one epoch of MSV_16 streaming groups (after a first read of each shard)."""
    import time

    from hf_msv.data import ShardDataset

    dataset = ShardDataset(directory, num_sequences=16, mode="streaming", preload=preload)
    dataset[0]  # open / load the first shard outside the clock
    start = time.perf_counter()
    for i in range(len(dataset)):
        dataset[i]
    return len(dataset) / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=128)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--waits", type=float, default=2.3, help="mean Wait answers per sequence")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.problems, args.max_steps = 16, 3
    torch.set_num_threads(args.threads)

    from hf_msv.training import MSVTrainingConfig, train_verifier

    d, heads = testbed_shape()
    root = Path(tempfile.mkdtemp(prefix="train_bench_"))
    report = {"hidden_size": d, "heads": heads, "problems": args.problems, "threads": args.threads}
    try:
        write_split(root / "train", args.problems, d, heads, args.sequences, args.waits, 0)
        write_split(root / "val", 2, d, heads, args.sequences, args.waits, 1)
        from hf_msv.data import ShardDataset

        stats = ShardDataset(root / "train").stats()
        report["answers_per_sequence"] = round(stats["answers"] / stats["sequences"], 3)
        for name, preload in (("memory_mapped", False), ("preloaded", True)):
            report[f"read_groups_per_s_{name}"] = round(read_rate(root / "train", preload), 1)
        report["read_speedup_preloaded"] = round(
            report["read_groups_per_s_preloaded"] / report["read_groups_per_s_memory_mapped"], 2
        )
        print(
            f"reading MSV_16 streaming groups: {report['read_groups_per_s_memory_mapped']} / s memory-mapped, "
            f"{report['read_groups_per_s_preloaded']} / s preloaded"
        )
        for n in (16, 64):
            config = MSVTrainingConfig(
                kind="msv",
                num_sequences=n,
                mode="streaming",
                num_epochs=1,
                max_steps=args.max_steps,
                num_workers=args.num_workers,
                progress=False,
                eval_steps=args.max_steps,  # --quick: validate at its last step
                vote_folds=0,
            )  # the whole budget: on random labels the vote CV keeps 0 steps
            result = train_verifier(root / "train", root / "val", root / f"msv{n}", config)
            epoch = result.history[1]
            report[f"msv{n}_groups_per_s"] = round(epoch["train_groups_per_s"], 2)
            report[f"msv{n}_steps"] = epoch["step"]
            print(
                f"MSV_{n} streaming: {epoch['train_groups']} groups in {epoch['train_seconds']:.1f} s "
                f"= {epoch['train_groups_per_s']:.2f} groups/s"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
