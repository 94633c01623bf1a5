"""The report: the judge's lines, its JSON, the table of every judged position, the plot
(docs/scoring.md "Judging a candidate"). Functions of the judge's data (compare.judge_batches)."""

import math

import numpy as np
import pyarrow as pa

from scoring.compare import DRIFT_WINDOW, KL_FLOOR, Band, confident, quantile, steps_and_phases
from scoring.trace import ScoreError

SHOW = 5  # flips and worst positions listed in the report

ESTIMATORS = {
    "shared": "the tokens both sides kept plus one rest bucket (a lower bound on the true KL)",
    "against": "the reference's kept tokens plus one rest bucket, the candidate's full logits "
    "(a lower bound on the true KL, tighter)",
}


def stats_line(label, st):
    return (
        f"  {label}: {st['positions']} positions · {st['positions'] - st['flips']}/"
        f"{st['positions']} argmax agree ({st['confident']} confident flips) · KL p50 "
        f"{st['kl_p50']:.1e} · p99 {st['kl_p99']:.1e} · max {st['kl_max']:.1e} · reverse p99 "
        f"{st['kl_reverse_p99']:.1e} · top-k overlap {st['overlap_mean']:.2f}"
    )


def k_differs(top_k, name):
    """What a candidate kept at another top-k than a reference producer does to the figures: the
    overlap counts the producer's list, and the estimator sees the tokens both kept."""
    kc, kr = top_k["candidate"], top_k[name]
    if kc is None or kr is None or kc == kr:
        return ""
    return (f" · top-k differs: the candidate keeps {kc} ids a position, {name} {kr} (the "
            f"overlap counts {name}'s {kr}; KL sees only the tokens both kept)")  # fmt: skip


def floor_name(floor):
    return f"{floor:g}" + (" (kern's, the default)" if floor == KL_FLOOR else " (--kl-floor)")


def floor_line(j):
    """Which floor judged, and the smallest KL the verdict could see (compare.smallest_seen)."""
    b, seen = j["band"], j["kl_seen"]
    if b is None:
        return (f"KL floor {floor_name(j['kl_floor'])} unused: no band (one producer) · the "
                f"smallest KL seen is the limit, {seen:.1e}: a larger one anywhere is no PASS")  # fmt: skip
    return (
        f"KL floor {floor_name(b.floor)} · the producers' own KL p50 {b.measured_p50:.1e}, p99 "
        f"{b.measured_p99:.1e} · smallest KL seen {seen:.1e}, the band's KL p50 = max(floor, "
        f"their p50): a candidate whose KL is at most it at every position fails only on a flip"
    )


def report_lines(ref, ref_path, cand_label, cand_positions, j):
    positions = sum(ref.schedule(i).steps + 1 for i in range(len(ref.prompts)))
    left_out = j["left_out"]
    lines = [
        f"reference {ref_path} · producers {', '.join(sorted(j['results']))}"
        + (f" ({left_out}, the candidate's, left out)" if left_out else "")
        + " · "
        f"{len(ref.prompts)} prompts · {positions} positions ({len(ref.prompts)} prefill + "
        f"{positions - len(ref.prompts)} decode)"
        + (f" · split {ref.meta['split']}" if ref.meta.get("split") else ""),
        f"candidate {cand_label} · {cand_positions} positions",
        f"estimator {j['estimator']}: {ESTIMATORS[j['estimator']]}",
    ]
    b = j["band"]
    lines.append(
        f"band between producers · flips at margin <= {b.margin:.3f} · flip rate "
        f"{b.flip_rate:.2%} · KL p50 {b.kl_p50:.1e} · p99 {b.kl_p99:.1e}"
        if b
        else f"band none (one producer) · KL limit {j['limit']:.0e}: a flip beyond it fails"
    )
    lines.append(floor_line(j))
    first = sorted(j["results"])[0]
    for name, c in sorted(j["results"].items()):
        n = len(c.kl)
        lacks = [
            f"{m} {who} lacks"
            for m, who in ((j["rows"][name] - n, "the candidate"), (j["candidate_rows"] - n, name))
            if m > 0
        ]  # each side's positions the other has not
        lines.append(
            f"against {name}: judged on {n} positions"
            + (f" ({', '.join(lacks)})" if lacks else "")
            + k_differs(j["top_k"], name)
        )
        for label, st in j["strata"][name].items():
            if label == "all" or name == first:  # every stratum against the first producer
                lines.append(stats_line(label, st))
    d = j["drift"]
    per = ", ".join(f"{i}: {'-' if s is None else s}" for i, s in sorted(d["per_prompt"].items()))
    lines.append(
        f"drift against {d['against']}: "
        + ("stays within" if d["overall"] is None else f"left at decode step {d['overall']}")
        + f" (trailing mean of {DRIFT_WINDOW} steps over KL {d['threshold']:.1e}); per prompt: "
        + (per or "-")
    )
    c = j["results"][first]
    worst = np.argsort(-np.where(np.isnan(c.kl), np.inf, c.kl), kind="stable")[:SHOW]
    for w in worst:
        p = ref.prompts[c.prompt[w]]
        lines.append(f"worst prompt {c.prompt[w]} pos {c.pos[w]} · KL {c.kl[w]:.1e} · "
                     f"{p.name} {p.source}")  # fmt: skip
    conf = confident(c, j["band"], j["limit"])
    for f in np.flatnonzero(c.flip)[:SHOW]:
        lines.append(
            f"flip {'x ' if conf[f] else ''}prompt {c.prompt[f]} pos {c.pos[f]} vs {first}: "
            f"{c.argmax_a[f]} -> {c.argmax_b[f]} · margin {c.margin[f]:.3f} · KL {c.kl[f]:.1e} "
            f"· reference token is #{c.rank[f]} · fed logprob {c.lp_a[f]:.3f} -> {c.lp_b[f]:.3f}"
        )
    lines.append(f"{j['verdict'].word} {j['verdict'].why}")
    return lines


def as_json(ref, j):
    def num(x):
        return None if x is None else (x if math.isfinite(x) else str(x))

    def clean(d):
        return {k: (clean(v) if isinstance(v, dict) else num(v) if isinstance(v, float) else v)
                for k, v in d.items()}  # fmt: skip

    flips = []
    for name, c in sorted(j["results"].items()):
        for f in np.flatnonzero(c.flip):
            flips.append(dict(producer=name, prompt=int(c.prompt[f]), pos=int(c.pos[f]),
                              reference=int(c.argmax_a[f]), candidate=int(c.argmax_b[f]),
                              margin=num(float(c.margin[f])), kl=num(float(c.kl[f]))))  # fmt: skip
    d = j["drift"]
    return dict(
        summary=dict(prompts=len(ref.prompts), producers=sorted(j["results"]),
                     split=ref.meta.get("split"), estimator=j["estimator"], limit_kl=j["limit"],
                     kl_floor=j["kl_floor"], kl_seen=num(j["kl_seen"]), top_k=j["top_k"],
                     left_out=j["left_out"]),
        band=None if j["band"] is None else clean(
            {f: getattr(j["band"], f) for f in Band.__slots__}),
        strata={n: {k: clean(v) for k, v in st.items()} for n, st in j["strata"].items()},
        drift=dict(against=d["against"], threshold=d["threshold"], overall=d["overall"],
                   per_prompt={str(k): v for k, v in d["per_prompt"].items()}),
        flips=flips,
        verdict=dict(code=j["verdict"].code, word=j["verdict"].word, why=j["verdict"].why),
    )  # fmt: skip


def positions_table(ref, j):
    cols = {k: [] for k in ("producer", "prompt", "pos", "step", "kl", "kl_reverse", "flip",
                            "margin", "rank", "overlap", "ref_logprob", "cand_logprob",
                            "argmax_ref", "argmax_cand")}  # fmt: skip
    for name, c in sorted(j["results"].items()):
        step, _ = steps_and_phases(ref, c)
        for k, v in (("producer", np.full(len(c.kl), name, object)), ("prompt", c.prompt),
                     ("pos", c.pos), ("step", step), ("kl", c.kl), ("kl_reverse", c.kl_reverse),
                     ("flip", c.flip), ("margin", c.margin), ("rank", c.rank),
                     ("overlap", c.overlap), ("ref_logprob", c.lp_a), ("cand_logprob", c.lp_b),
                     ("argmax_ref", c.argmax_a), ("argmax_cand", c.argmax_b)):  # fmt: skip
            cols[k].append(v)
    return pa.table({k: pa.array(np.concatenate(v)) for k, v in cols.items()})


def step_bins(n):
    """Log-spaced bins of decode steps 1..n: (first, last) of each."""
    edges = np.unique(np.round(np.logspace(0, math.log10(max(n, 1)) + 1e-9, 40)).astype(int))
    edges = np.r_[edges[edges <= n], n + 1]
    return list(zip(edges[:-1], edges[1:] - 1))


def finite(v):
    """Values to draw: the non-finite ones left out (a gap in the line)."""
    v = np.asarray(v, np.float64)
    return np.where(np.isfinite(v), v, np.nan)


def binned(trace, c, bins):
    step, _ = steps_and_phases(trace, c)
    out = []
    for lo, hi in bins:
        sel = (step >= lo) & (step <= hi)
        out.append((quantile(c.kl[sel], 0.5), quantile(c.kl[sel], 0.99),
                    float(c.flip[sel].mean()) if sel.any() else 0.0))  # fmt: skip
    return np.array(out).reshape(-1, 3)


def plot(path, ref, j, title):
    """KL p50 / p99 and flip rate against decode step (log scale), the band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = sorted(j["results"])[0]
    c = j["results"][first]
    if not (steps_and_phases(ref, c)[0] > 0).any():
        raise ScoreError(
            f"--plot draws against the decode step, and no decode step was judged (the trace's "
            f"decode is {ref.decode}); leave --plot out. Nothing was written"
        )
    n = int(ref.decode)
    bins = step_bins(min(n, max(len(p.tokens) for p in ref.prompts)))
    x = np.array([(lo * hi) ** 0.5 for lo, hi in bins])
    cand = binned(ref, c, bins)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, height_ratios=(3, 1.3))
    floor = j["kl_floor"] / 10
    drawn = []  # the KL values drawn: non-finite ones are left out (the report names them)
    if j["band"] is not None:
        pairs = [binned(ref, c, bins) for c in j["between"].values()]  # both directions alike
        top99 = finite(np.maximum(np.max([p[:, 1] for p in pairs], 0), j["kl_floor"]))
        ax.fill_between(x, floor, top99, color="tab:green", alpha=0.2,
                        label="reference band (KL p99 between producers)")  # fmt: skip
        if math.isfinite(j["band"].kl_p99):
            ax.axhline(j["band"].kl_p99, color="tab:green", lw=1, ls="--",
                       label=f"band KL p99 {j['band'].kl_p99:.1e}")  # fmt: skip
        bx.fill_between(x, 0, finite(np.max([p[:, 2] for p in pairs], 0)), color="tab:green",
                        alpha=0.2)  # fmt: skip
        drawn += [top99, [j["band"].kl_p99]]
    else:
        ax.axhline(j["limit"], color="tab:green", lw=1, ls="--", label=f"KL limit {j['limit']:.0e}")
        drawn.append([j["limit"]])
    for col, mark, label in ((0, "o-", "candidate KL p50"), (1, "s-", "candidate KL p99")):
        ax.plot(x, finite(np.maximum(cand[:, col], floor)), mark, ms=3, label=label)
        drawn.append(cand[:, col])
    values = np.concatenate([np.asarray(v, np.float64) for v in drawn])
    if not np.isfinite(values).any():  # every value non-finite: a log axis needs limits
        ax.set_ylim(floor / 2, 1.0)
    if j["drift"]["overall"] is not None:
        for a in (ax, bx):
            a.axvline(j["drift"]["overall"], color="tab:red", lw=1, ls=":")
        ax.text(j["drift"]["overall"], ax.get_ylim()[1] if False else floor * 2,
                f" left the band at step {j['drift']['overall']}", color="tab:red")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylabel(
        f"KL(reference || candidate), nat\n({j['estimator']} estimator, a lower bound;"
        f" below {floor:.0e} drawn at it)"
    )
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=10)
    bx.plot(x, finite(cand[:, 2]), "o-", ms=3, color="tab:purple", label="candidate flip rate")
    bx.set_ylim(0, max(0.01, 1.2 * float(cand[:, 2].max(initial=0.0))))
    bx.set_ylabel("top-1 flip rate")
    bx.set_xlabel("decode step (log scale)")
    bx.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
