"""The paper's claims tested on the reproduction's numbers (`compute_claims`): pure functions from the summary dict
to verdicts ``{"id", "claim", "paper", "held", "sentence", "numbers"}`` (``held``: True, False, or None when not
testable), in report order. A main-study verdict is "held" only if its paired bootstrap 95 % interval clears the
target; summaries without intervals get point verdicts. See ``docs/reproduction.md``.
"""

from __future__ import annotations

import math
from dataclasses import fields

from .config import ReproduceConfig
from .paper import PAPER
from .summary import best_bon_baseline, best_method, stat_mean

__all__ = [
    "SINGLE_SEQUENCE",
    "VOTE_BASELINES",
    "compute_claims",
    "config_of",
    "make_claim",
    "main_claims",
    "checker_claims",
    "mask_claims",
    "delimiter_claims",
    "grouping_claims",
    "training_size_claims",
]

# The single-sequence verifiers (and trace-confidence baselines) MSV_N must beat on calibration (C1, C4).
SINGLE_SEQUENCE = ("Token Probs", "DeepConf", "Probe", "MSV_1")
# The baselines built on the vote that MSV_N's Brier is also held against (when the summary has them).
VOTE_BASELINES = ("Self-consistency (calibrated)", "Stacked (vote + Probe)")


def _interval(r: dict, setting: str, base: str | None, key: str) -> dict | None:
    """The bootstrap interval of MSV_N − `base` (a ratio for ``brier_ratio``) on `key`; None in older summaries."""
    return (r.get("intervals") or {}).get(setting, {}).get(base or "", {}).get(key)


def _end(iv: dict, which: str) -> float:
    """An interval end, with null (JSON for an infinite end) read as +∞."""
    v = iv.get(which)
    return math.inf if v is None else float(v)


def _ci(iv: dict, scale: float = 1.0, digits: int = 3, transform=None) -> str:
    """ "[low, high]" of an interval, scaled or transformed (e.g. ratio -> reduction, which swaps the ends)."""
    lo, hi = _end(iv, "low") * scale, _end(iv, "high") * scale
    if transform is not None:
        lo, hi = sorted((transform(lo), transform(hi)))
    f = lambda x: "∞" if math.isinf(x) else f"{x:.{digits}f}"  # noqa: E731
    return f"[{f(lo)}, {f(hi)}]"


def make_claim(cid: str, text: str, paper: str, held: bool | None, sentence: str, **numbers) -> dict:
    """One claim; `sentence` is prefixed with the verdict `held` stands for."""
    verdict = "Held" if held else ("Not testable" if held is None else "Did not hold")
    return {
        "id": cid,
        "claim": text,
        "paper": paper,
        "held": held,
        "sentence": f"{verdict}: {sentence}",
        "numbers": numbers,
    }


def _headline_ns(ns: list[int]) -> list[int]:
    """The N the paper's headline tables report (16 and 64), or the largest N > 1 of a smaller run."""
    return [x for x in (16, 64) if x in ns] or ns[-1:]


def _terminal_brier(main: dict, n: int) -> dict:
    """C1: terminal Brier ≥ 20 % lower than the best single-sequence baseline at `n`."""
    r = main[str(n)]
    msv, term = r["msv"], r["terminal"]
    base, bb = best_method(term, [m for m in SINGLE_SEQUENCE if m != msv], "brier", lower=True)
    ours = stat_mean(term[msv]["brier"]) if msv in term else math.nan
    red = 1 - ours / bb if bb and not math.isnan(ours) else math.nan
    paper = PAPER["terminal"].get(str(n), {}).get("MSV_N", {}).get("brier")
    paper_best = min(PAPER["terminal"]["1"][m]["brier"] for m in ("Probe", "MSV_1", "PRM"))
    iv = _interval(r, "terminal", base, "brier_ratio")
    held = None if math.isnan(red) else bool(red >= 0.20 if iv is None else _end(iv, "high") <= 0.80)
    return make_claim(
        f"terminal_brier_N{n}",
        f"MSV_{n} terminal Brier ≥ 20 % lower than the best single-sequence baseline",
        f"AIME: MSV_N {paper} vs best single-sequence {paper_best} ({1 - paper / paper_best:.0%} lower)"
        if paper
        else "—",
        held,
        f"at N={n}, {msv} Brier {ours:.4f} vs {base} {bb:.4f} ("
        + (f"{red:.0%} lower" if red >= 0 else f"{-red:.0%} higher")
        + (
            "; needed ≥ 20 % lower)."
            if iv is None
            else f"; 95 % interval of the reduction {_ci(iv, transform=lambda x: 1 - x, digits=2)}, needed ≥ 0.20 "
            "throughout)."
        ),
        msv=ours,
        best_baseline=base,
        best_baseline_value=bb,
        reduction=red,
        **({} if iv is None else {"interval": iv}),
    )


def _brier_vs_votes(main: dict, n: int) -> list[dict]:
    """MSV_N's terminal Brier below the vote baselines' (calibrated self-consistency, stacked), interval < 0; only
    for summaries that have them."""
    r = main[str(n)]
    msv, term = r["msv"], r["terminal"]
    rows = {b: _interval(r, "terminal", b, "brier") for b in VOTE_BASELINES if b in term}
    rows = {b: iv for b, iv in rows.items() if iv is not None}
    if not rows or msv not in term:
        return []
    ours = stat_mean(term[msv]["brier"])
    return [
        make_claim(
            f"terminal_brier_vs_votes_N{n}",
            f"MSV_{n} terminal Brier below calibrated self-consistency's and the stacked [vote, Probe] baseline's",
            "— (not in the paper: the recalibrated vote is what MSV_N's Brier gain could be)",
            bool(all(_end(iv, "high") < 0 for iv in rows.values())),
            f"at N={n}, {msv} Brier {ours:.4f}; "
            + "; ".join(
                f"vs {b} {stat_mean(term[b]['brier']):.4f} (difference {iv['estimate']:+.4f}, 95 % interval "
                f"{_ci(iv, digits=4)})"
                for b, iv in rows.items()
            )
            + " (needed: every interval below 0).",
            msv=ours,
            intervals=rows,
        )
    ]


def _best_of_n(main: dict, n: int) -> dict:
    """C2: MSV_N's best-of-N accuracy ≥ the best baseline's + 2 pp."""
    r = main[str(n)]
    msv, term = r["msv"], r["terminal"]
    base, bb = best_bon_baseline(term, msv)
    ours = stat_mean(term[msv]["bon_accuracy"]) if msv in term else math.nan
    gain = ours - bb
    pb = PAPER["bon_accuracy"].get(str(n), {})
    iv = _interval(r, "terminal", base, "bon_accuracy")
    held = None if math.isnan(gain) else bool(gain >= 0.02 if iv is None else _end(iv, "low") >= 0.02)
    return make_claim(
        f"best_of_{n}",
        f"{msv} best-of-{n} accuracy ≥ best baseline + 2 pp",
        f"AIME: MSV_N {pb.get('MSV_N')} vs best baseline {max(v for k, v in pb.items() if k != 'MSV_N'):.4f}"
        if pb
        else "—",
        held,
        f"{msv} best-of-{n} {ours:.3f} vs {base} {bb:.3f} ({100 * gain:+.1f} pp; "
        + ("needed ≥ +2 pp)." if iv is None else f"95 % interval {_ci(iv, 100, 1)} pp, needed ≥ +2 pp throughout)."),
        msv=ours,
        best_baseline=base,
        best_baseline_value=bb,
        gain=gain,
        **({} if iv is None else {"interval": iv}),
    )


def _early_stop(main: dict, n: int) -> dict:
    """C3: MSV_N reaches the best baseline's peak accuracy with ≤ 0.40 of its tokens (None: it never does)."""
    r = main[str(n)]
    tf = r["early_stop_token_fraction"]
    held = None if tf is None and r["early_stop_best_baseline"] is None else (tf is not None and tf <= 0.40)
    return make_claim(
        f"early_stop_N{n}",
        f"{r['msv']} reaches the best baseline's peak accuracy with ≤ 0.40 of its tokens",
        PAPER["early_stop"]["token_fraction_statement"],
        held,
        f"at N={n}, {r['msv']} needs "
        + (f"{tf:.2f}× the tokens" if tf is not None else "— (never reaches the peak; fraction ∞)")
        + f" of {r['early_stop_best_baseline']} to reach its peak accuracy "
        f"{(r['early_stop_best_baseline_peak_accuracy'] or math.nan):.3f} (needed ≤ 0.40).",
        fraction=tf,
        best_baseline=r["early_stop_best_baseline"],
    )


_EARLY_STOP_POOLS = (
    ("single_sequence", "", "the best single-sequence baseline's"),
    ("all", "_all", "the best baseline's (aggregations included)"),
)


def _early_stop_twice(main: dict, n: int) -> list[dict]:
    """C3 on the paper's axis (token position t*), stated twice: against the best single-sequence baseline (the
    paper's sentence) and against the best of all baselines; held if the fraction's 95 % interval is ≤ 0.40.
    Older summaries (no comparisons): the single tokens-axis claim `_early_stop`."""
    r = main[str(n)]
    comps = r.get("early_stop_comparisons")
    if not comps:
        return [_early_stop(main, n)]
    out = []
    for pool, suffix, whose in _EARLY_STOP_POOLS:
        text = f"{r['msv']} reaches {whose} peak accuracy with ≤ 0.40 of its token position t*"
        c = comps.get(pool)
        if c is None:
            out.append(
                make_claim(
                    f"early_stop{suffix}_N{n}",
                    text,
                    PAPER["early_stop"]["token_fraction_statement"],
                    None,
                    f"at N={n}, no such baseline was evaluated.",
                )
            )
            continue
        f, iv = c["steps"]["fraction"], c["steps"]["interval"]
        held = bool(_end(iv, "high") <= 0.40) if iv else (f is not None and f <= 0.40)
        fmt = lambda x: "∞" if x is None else f"{x:.2f}"  # noqa: E731
        out.append(
            make_claim(
                f"early_stop{suffix}_N{n}",
                text,
                PAPER["early_stop"]["token_fraction_statement"],
                held,
                f"at N={n}, {r['msv']} needs {fmt(f)}× the token position t* of {c['baseline']} to reach its peak "
                f"accuracy {c['baseline_peak_accuracy']:.3f}"
                + (f" (95 % interval {_ci(iv, digits=2)})" if iv else "")
                + f"; {fmt(c['latency']['fraction'])}× its latency, {fmt(c['tokens']['fraction'])}× its summed tokens "
                "(needed: t* fraction ≤ 0.40" + (" throughout the interval)." if iv else ")."),
                fraction=f,
                interval=iv,
                best_baseline=c["baseline"],
                latency_fraction=c["latency"]["fraction"],
                token_fraction=c["tokens"]["fraction"],
            )
        )
    return out


def _streaming_brier(main: dict, n: int) -> dict:
    """C4: MSV_N's streaming Brier below every single-sequence baseline's (and their weighted-voting variants)."""
    r = main[str(n)]
    msv, st = r["msv"], r["streaming"]
    names = [m for m in SINGLE_SEQUENCE + tuple(f"{x}+WV" for x in SINGLE_SEQUENCE) if m != msv]
    base, bb = best_method(st, names, "brier", True)
    ours = stat_mean(st[msv]["brier"]) if msv in st else math.nan
    pa = PAPER["streaming"].get(str(n), {}).get("MSV_N", {}).get("brier")
    iv = _interval(r, "streaming", base, "brier")
    held = None if math.isnan(ours) or base is None else bool(ours < bb if iv is None else _end(iv, "high") < 0)
    return make_claim(
        f"streaming_brier_N{n}",
        f"{msv} streaming Brier below every single-sequence baseline (and its WV)",
        f"AIME: MSV_N {pa}, best baseline {min(v['brier'] for k, v in PAPER['streaming']['1'].items())}"
        if pa
        else "—",
        held,
        f"at N={n}, {msv} streaming Brier {ours:.4f} vs best baseline {base} {bb:.4f}"
        + ("." if iv is None else f" (difference 95 % interval {_ci(iv, digits=4)}, needed below 0)."),
        msv=ours,
        best_baseline=base,
        best_baseline_value=bb,
        **({} if iv is None else {"interval": iv}),
    )


def _bon_ece(main: dict, n: int) -> dict:
    """C5: MSV_N's best-of-N confidence has a lower ECE than every baseline's."""
    r = main[str(n)]
    msv, term = r["msv"], r["terminal"]
    base, bb = best_method(term, [m for m in term if m != msv], "bon_ece", True)
    ours = stat_mean(term[msv]["bon_ece"]) if msv in term else math.nan
    pc = PAPER["bon_calibration"].get(str(n), {})
    iv = _interval(r, "terminal", base, "bon_ece")
    held = None if math.isnan(ours) or base is None else bool(ours < bb if iv is None else _end(iv, "high") < 0)
    return make_claim(
        f"bon_ece_N{n}",
        f"{msv} best-of-{n} confidence better calibrated (ECE) than every baseline's",
        f"AIME: MSV_N ECE {pc['MSV_N']['ece']} vs best baseline {min(v['ece'] for k, v in pc.items() if k != 'MSV_N')}"
        if pc
        else "—",
        held,
        f"at N={n}, best-of-{n} ECE {ours:.3f} for {msv} vs {bb:.3f} for {base}"
        + ("." if iv is None else f" (difference 95 % interval {_ci(iv)}, needed below 0)."),
        msv=ours,
        best_baseline=base,
        best_baseline_value=bb,
        **({} if iv is None else {"interval": iv}),
    )


def main_claims(s: dict, config: ReproduceConfig) -> list[dict]:
    """C1-C5 on the main study: terminal Brier, best-of-N, early stopping, streaming Brier, best-of-N ECE."""
    main = s["main"]
    ns = [n for n in config.num_sequences if n > 1]
    claims = [_terminal_brier(main, n) for n in _headline_ns(ns)]
    claims += [c for n in _headline_ns(ns) for c in _brier_vs_votes(main, n)]
    claims.append(_best_of_n(main, ns[-1] if ns else config.max_n))
    claims += [c for n in _headline_ns(ns) for c in _early_stop_twice(main, n)]
    claims += [_streaming_brier(main, n) for n in ns]
    claims += [_bon_ece(main, n) for n in _headline_ns(ns)]
    return claims


def checker_claims(s: dict) -> list[dict]:
    """Checker robustness (MSV trained with a weak checker loses ≤ 1.2 pp), logit averaging (with vs without, from
    the reference-checker run of the same study), and random checker: MSV degrades less than Probe+WV."""
    n = s["checkers"]["n"]
    rows = s["checkers"]["rows"]
    ref = rows.get("reference", {})
    key = f"MSV_{n} (trained with checker)"
    drops = {c: stat_mean(ref.get(key)) - stat_mean(r.get(key)) for c, r in rows.items() if c != "reference"}
    wv_drops = {
        c: stat_mean(ref.get("Probe+WV")) - stat_mean(r.get("Probe+WV")) for c, r in rows.items() if c != "reference"
    }
    worst = max(drops, key=lambda c: drops[c]) if drops else None
    held = None if not drops else bool(all(d <= 0.012 for d in drops.values()))
    claims = [
        make_claim(
            "checker_robustness",
            f"MSV_{n} trained with a weak checker loses ≤ 1.2 pp of best-of-{n} accuracy",
            "Omni-MATH: ≤ 0.4 pp (embedding), ≤ 1.2 pp (random); Probe+WV loses 2.0 / 7.5 pp",
            held,
            (
                f"largest drop {100 * drops[worst]:+.1f} pp ({worst}); Probe+WV drops "
                + ", ".join(f"{c} {100 * v:+.1f} pp" for c, v in wv_drops.items())
                + "."
            ),
            drops=drops,
            probe_wv_drops=wv_drops,
        )
        if drops
        else make_claim("checker_robustness", "—", "—", None, "no weak checker")
    ]
    mn = s["main"].get(str(n), {})
    if key in ref and mn.get("msv") in mn.get("terminal", {}):
        with_avg, without = stat_mean(mn["terminal"][mn["msv"]]["bon_accuracy"]), stat_mean(ref[key])
        base, bb = best_bon_baseline(mn["terminal"], mn["msv"])
        claims.append(
            make_claim(
                "best_of_logit_averaging",
                f"Logit averaging over equivalent answers raises MSV_{n}'s best-of-{n}",
                "Omni-MATH: MSV_64 0.356 with vs 0.348 without",
                bool(with_avg > without),
                f"MSV_{n} best-of-{n} {with_avg:.3f} with averaging (main) vs {without:.3f} without (checker study, "
                f"reference checker); without it MSV_{n} is {100 * (without - bb):+.1f} pp over {base} {bb:.3f}.",
                with_averaging=with_avg,
                without_averaging=without,
                gain_without=without - bb,
            )
        )
    if "random" in drops:
        claims.append(
            make_claim(
                "checker_random_vs_wv",
                "With the random checker MSV degrades less than Probe+WV",
                "Omni-MATH: MSV_64 −1.2 pp vs Probe+WV −7.5 pp",
                bool(drops["random"] < wv_drops["random"]),
                f"random checker: MSV_{n} {100 * drops['random']:+.1f} pp vs Probe+WV "
                f"{100 * wv_drops['random']:+.1f} pp (drop relative to the reference checker).",
            )
        )
    return claims


def mask_claims(s: dict) -> list[dict]:
    """Every attention mask contributes: removing any one raises the streaming Brier."""
    n = s["masks"]["n"]
    rows = s["masks"]["rows"]
    full = stat_mean(rows.get(f"MSV_{n}", {}).get("brier"))
    ups = {k: stat_mean(v["brier"]) - full for k, v in rows.items() if k != f"MSV_{n}"}
    return [
        make_claim(
            "masks",
            "Every attention mask contributes: removing any one raises the streaming Brier",
            "AIME MSV_16: 0.038 → 0.040 / 0.045 / 0.048 / 0.050 (w/o full / equiv. / within-seq / within-ans)",
            None if not ups else bool(all(v > 0 for v in ups.values())),
            f"MSV_{n} Brier {full:.4f}; " + ", ".join(f"{k} {v:+.4f}" for k, v in ups.items()) + ".",
            brier_increase=ups,
        )
    ]


def delimiter_claims(s: dict) -> list[dict]:
    """MSV_N has a larger AUTC (accuracy × tokens) than the Probe with every elicitation delimiter."""
    rows = s["delimiters"]["rows"]
    compared = {d: r for d, r in rows.items() if "MSV_N" in r and "Probe" in r}
    # the normalised AUTC over t* (the paper's axis) when every row has it; older runs: raw AUTC over summed tokens
    key = (
        "autc_steps_norm"
        if compared and all("autc_steps_norm" in r["MSV_N"] for r in compared.values())
        else "autc_tokens"
    )
    ok = {d: stat_mean(r["MSV_N"][key]) > stat_mean(r["Probe"][key]) for d, r in compared.items()}
    digits = 3 if key == "autc_steps_norm" else 1
    return [
        make_claim(
            "delimiters",
            f"MSV_{s['delimiters']['n']} has a larger AUTC than the Probe for every delimiter",
            "AIME N=16: holds for Wait, Alternatively, But and every 200 tokens",
            None if not ok else bool(all(ok.values())),
            "; ".join(
                f"{d}: MSV_N {stat_mean(r['MSV_N'][key]):.{digits}f} vs Probe {stat_mean(r['Probe'][key]):.{digits}f}"
                for d, r in compared.items()
            )
            + (" (normalised AUTC over t*)." if key == "autc_steps_norm" else " (AUTC, accuracy × tokens)."),
        )
    ]


def grouping_claims(s: dict) -> list[dict]:
    """Grouped MSV_M matches or beats the best baseline's accuracy-latency AUTC at every N > M, and its cost per
    answer stays flat as N grows (≤ 2× from the smallest to the largest N)."""
    g = s["grouping"]
    res = {}
    for k in [k for k in g["per_n"] if int(k) > g["m"]]:
        r = g["per_n"][k]
        autc_l, msv = r["autc_latency_norm"], r["msv"]
        base = [m for m in autc_l if m != msv]
        bb = max(base, key=lambda m: stat_mean(autc_l[m])) if base else None
        res[k] = (msv, stat_mean(autc_l.get(msv)), bb, stat_mean(autc_l.get(bb)) if bb else math.nan)
    held = None if not res else bool(all(v[1] >= v[3] for v in res.values()))
    claims = [
        make_claim(
            "grouping",
            f"MSV_{g['m']} (grouped) matches or beats the best baseline's accuracy-latency AUTC at N > {g['m']}",
            PAPER["grouping"]["statement"],
            held,
            "; ".join(f"N={k}: {v[0]} {v[1]:.3f} vs {v[2]} {v[3]:.3f}" for k, v in res.items())
            + " (normalised AUTC over latency)."
            if res
            else "no N above M evaluated.",
        )
    ]
    costs = {k: g["per_n"][k]["verifier_online_s_per_answer"].get(g["per_n"][k]["msv"]) for k in g["per_n"]}
    ks = sorted((int(k) for k in costs if costs[k]), key=int)
    if len(ks) >= 2:
        ratio = costs[str(ks[-1])] / costs[str(ks[0])]
        claims.append(
            make_claim(
                "grouping_linear",
                "With grouping the MSV cost per answer stays flat as N grows (linear total)",
                "latency of MSV_64 scales linearly in N",
                bool(ratio <= 2.0),
                f"MSV cost per answer at N={ks[-1]} is {ratio:.2f}× that at N={ks[0]} (needed ≤ 2×).",
                ratio=ratio,
            )
        )
    return claims


def training_size_claims(s: dict, config: ReproduceConfig) -> list[dict]:
    """The Probe's Brier plateaus beyond the second-largest training size (the largest lowers it by < 5 %; the
    paper: beyond 224, its main size), and whether MSV_N meets the best-of-N and early-stop targets with the most
    training problems."""
    ts = s["training_size"]
    per = ts["per_size"]
    sizes = sorted(per, key=int)
    if len(sizes) < 2:
        return []
    base_k, top_k = sizes[-2], sizes[-1]
    b0, b1 = (stat_mean(per[k]["terminal"]["Probe"]["brier"]) for k in (base_k, top_k))
    pt = PAPER["training_size"]["Probe"]
    r = per[top_k]
    tf = r["early_stop_token_fraction"]
    return [
        make_claim(
            "training_size_probe",
            f"The Probe's terminal Brier plateaus beyond {base_k} problems ({top_k} lower it by < 5 %)",
            "AIME: " + " / ".join(f"{v}" for v in pt.values()) + f" at {' / '.join(pt)} problems",
            bool(b1 > 0.95 * b0),
            f"Probe Brier {b0:.4f} with {base_k} problems, {b1:.4f} with {top_k} ({1 - b1 / b0:+.0%} lower).",
            brier=b0,
            brier_more=b1,
        ),
        make_claim(
            "training_size_msv",
            f"With {top_k} training problems MSV_{ts['n']} meets the best-of-N (+2 pp) and "
            "early-stop (≤ 0.40) targets",
            "— (not in the paper: tests whether the testbed's gaps are a lack of training data)",
            bool(r["bon_gain"] >= 0.02 and tf is not None and tf <= 0.40),
            "; ".join(
                f"{k} problems: best-of-{ts['n']} {100 * v['bon_gain']:+.1f} pp vs "
                f"{v['bon_best_baseline']}, token fraction "
                + ("∞" if v["early_stop_token_fraction"] is None else f"{v['early_stop_token_fraction']:.2f}")
                + f" vs {v['early_stop_best_baseline']}"
                for k, v in per.items()
            )
            + ".",
            gain=r["bon_gain"],
            fraction=tf,
        ),
    ]


def config_of(summary: dict) -> ReproduceConfig:
    """The `ReproduceConfig` a summary was produced with (its ``config`` entry; JSON lists back to tuples). Keys of
    older runs that are no longer settings (``seeds``: random N-subsets, replaced by training seeds) are ignored; a
    summary without ``task`` was written when v1 was the only testbed."""
    known = {f.name for f in fields(ReproduceConfig)}
    config = {"task": "v1"} | summary["config"]
    return ReproduceConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in known})


def compute_claims(summary: dict, config: ReproduceConfig | None = None) -> list[dict]:
    """Every claim the summary can test, in report order (`config`: default, the summary's own)."""
    config = config or config_of(summary)
    claims = main_claims(summary, config)
    if "checkers" in summary:
        claims += checker_claims(summary)
    if "masks" in summary:
        claims += mask_claims(summary)
    if "delimiters" in summary:
        claims += delimiter_claims(summary)
    if "grouping" in summary:
        claims += grouping_claims(summary)
    if "training_size" in summary:
        claims += training_size_claims(summary, config)
    return claims
