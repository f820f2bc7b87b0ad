"""Packed random inputs for `MSVVerifier` forwards (the modeling and vote-pathway tests): `random_answers` draws
groups of sequences with answers at increasing ends, `inputs_for` packs answer dicts into forward keyword arguments,
`select` restricts packed inputs to some answers; `D` is their hidden size."""

import torch

D = 32


def random_answers(seed=0, groups=2, sequences=4, steps=3, max_len=4, classes=3, terminal=False):
    """Packed inputs for random groups: list of answer tuples plus the forward kwargs."""
    g = torch.Generator().manual_seed(seed)
    answers = []
    for group in range(groups):
        for n in range(sequences):
            tau = 0
            for k in range(1 if terminal else steps):
                tau += int(torch.randint(1, 8, (1,), generator=g))
                length = int(torch.randint(1, max_len + 1, (1,), generator=g))
                answers.append(
                    dict(
                        group=group,
                        sequence=n,
                        step=k,
                        end=tau + length,
                        length=length,
                        klass=int(torch.randint(0, classes, (1,), generator=g)),
                    )
                )
    token_answer = torch.cat([torch.full((a["length"],), i) for i, a in enumerate(answers)])
    hidden = torch.randn(len(token_answer), D, generator=g)
    return answers, inputs_for(answers, hidden, token_answer)


def inputs_for(answers, hidden, token_answer):
    col = lambda key: torch.tensor([a[key] for a in answers], dtype=torch.long)
    return dict(
        hidden_states=hidden,
        token_answer=token_answer,
        answer_group=col("group"),
        answer_sequence=col("sequence"),
        answer_step=col("step"),
        answer_end=col("end"),
        answer_class=col("klass"),
    )


def select(inputs, answer_idx):
    """The packed inputs restricted to some answers, re-indexed."""
    idx = torch.as_tensor(answer_idx)
    keep = torch.isin(inputs["token_answer"], idx)
    remap = torch.full((int(inputs["token_answer"].max()) + 1,), -1)
    remap[idx] = torch.arange(len(idx))
    out = {k: v[idx] for k, v in inputs.items() if k.startswith("answer_")}
    out["hidden_states"] = inputs["hidden_states"][keep]
    out["token_answer"] = remap[inputs["token_answer"][keep]]
    return out
