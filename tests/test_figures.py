"""Figures a researcher can put in a paper (issue 29 §2), checked on rendered figures: legends and
labels off the data, no two series alike (nor alike in greyscale), colours apart under colour-vision
deficiencies, log axes for values that span a decade, score axes that do not magnify one seed's
noise, "1 seed" where there is one, print size, PDF beside PNG and SVG. The geometry checks live in
tests/figure_checks.py (they measure the drawn artists, not the drawing code's intentions)."""

import itertools
import json
import math

import numpy as np
import pytest
from figure_checks import TEXT_WIDTH_IN, drawn_texts, problems, series

from conftest import REPO
from sentemb.evaluate.senteval import TASKS


# ------------------------------------------------------------------------------------ the checker itself
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def test_the_checks_catch_what_the_issue_saw():
    """The defects of issue 29 on hand-made figures: each is reported (the checker is not blind)."""
    plt = _plt()
    # a legend on top of bars (table1_bars), too wide for the page
    fig, ax = plt.subplots(figsize=(8, 3))
    for i in range(6):
        ax.bar(np.arange(3) + i * 0.12, [70, 75, 72], 0.12, label=f"method {i}")
    ax.legend(loc="lower left")
    found = problems(fig)
    assert any("legend" in p and "covers" in p for p in found) and any("wide" in p for p in found)
    plt.close(fig)
    # two labels overprinting each other; two baselines alike
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1.0], [1.0], "s", color="grey", label="untrained (avg)")
    ax.plot([1.02], [1.0], "s", color="grey", label="untrained (cls)")
    ax.annotate("paser / minilm", (1.0, 1.0), xytext=(4, 4), textcoords="offset points")
    ax.annotate("minilm untrained (cls_before_pooler)", (1.0, 1.0), xytext=(4, 6), textcoords="offset points")
    found = problems(fig)
    assert any(p.startswith("texts overlap") for p in found)
    assert any("look the same" in p for p in found)
    plt.close(fig)
    # study points in SimCSE's colour and marker; colour the only difference
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([1, 2], [80, 81], "-o", color="#1f77b4", label="simcse")
    ax.plot([1, 2], [80.5, 81.5], "-o", color="#1f77b4", label="temperature=0.05")
    ax.plot([1, 2], [79, 80], "-o", color="#d62728", label="sarcse")
    found = problems(fig)
    assert any("look the same" in p for p in found) and any("colour only" in p for p in found)
    plt.close(fig)
    # text below 6 pt and a label cut off at the edge
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_title("tiny", fontsize=4)
    ax.text(1.3, 0.5, "off the page", transform=ax.transAxes)
    found = problems(fig)
    assert any("4.0 pt" in p for p in found) and any("cut off" in p for p in found)
    plt.close(fig)


# ------------------------------------------------------------------------------------ palette and styles
#: Machado, Oliveira & Fernandes (2009), full-severity simulation matrices in linear RGB
CVD = {
    "normal vision": np.eye(3),
    "protanopia": np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                            [-0.003882, -0.048116, 1.051998]]),
    "deuteranopia": np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                              [-0.011820, 0.042940, 0.968881]]),
    "tritanopia": np.array([[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                            [0.004733, 0.691367, 0.303900]]),
}


def _lab(hex_colour: str, matrix) -> np.ndarray:
    """CIELAB (D65) of a colour as seen through a CVD simulation matrix."""
    rgb = np.array([int(hex_colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)])
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    lin = np.clip(matrix @ lin, 0, 1)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ lin
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_method_colours_stay_apart_under_colour_vision_deficiencies():
    """Every two methods' colours differ by ΔE*ab ≥ 12 (clearly visible) for normal vision and the
    three dichromacies; the former matplotlib default palette fails this (red/green ΔE ≈ 5)."""
    from sentemb.report.style import METHOD_STYLES

    colours = [c for c, _ in METHOD_STYLES.values()]
    for name, matrix in CVD.items():
        for a, b in itertools.combinations(colours, 2):
            assert np.linalg.norm(_lab(a, matrix) - _lab(b, matrix)) >= 12, (name, a, b)
    old = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]
    assert min(np.linalg.norm(_lab(a, CVD["protanopia"]) - _lab(b, CVD["protanopia"]))
               for a, b in itertools.combinations(old, 2)) < 12


def test_style_book_keeps_a_run_s_look_and_tells_every_entry_apart():
    from sentemb.report.style import METHOD_STYLES, StyleBook

    runs = [("simcse", "simcse"), ("simcse-cls", "simcse"), ("una", "una"), ("una-para", "una"),
            ("una-code", "una"), ("una-simcse", "una"), ("sarcse-wo-sal", "sarcse"), ("debiased", "debiased")]
    baselines = [("bert", "avg"), ("bert", "cls_before_pooler"), ("roberta", "avg"), ("roberta", "avg_static_last")]
    book = StyleBook(runs, baselines)
    small = StyleBook([("una-para", "una"), ("simcse", "simcse")])
    # a seed method's own run has its colour and marker whatever else the figures hold
    for m, (colour, marker) in METHOD_STYLES.items():
        assert (book.run(m, m).colour, book.run(m, m).marker) == (colour, marker)
    assert book.run("simcse", "simcse") == small.run("simcse", "simcse")
    # a variant keeps its method's colour; every entry has its own marker and fill (greyscale)
    styles = [book.run(n, m) for n, m in runs] + [book.baseline(b, p) for b, p in baselines]
    assert book.run("una-para", "una").colour == book.run("una", "una").colour
    assert len({s.mark for s in styles}) == len(styles)
    assert len({(s.colour, s.marker, s.fill) for s in styles}) == len(styles)
    assert book.baseline("bert", "avg") != book.baseline("roberta", "avg")  # each backbone × pooler


def test_series_styles_are_distinct_in_greyscale():
    from sentemb.report.style import series_styles

    styles = series_styles(40)
    assert len({s.mark for s in styles}) == 40
    assert all(a.colour != b.colour and a.marker != b.marker and a.linestyle != b.linestyle
               for a, b in zip(styles, styles[1:]))  # neighbours in a legend differ in all three


@pytest.mark.parametrize("values, scale", [
    ([0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1], "log"),  # ArcCSE τ: a decade
    ([0.02, 0.05, 0.1], "log"),  # the demo's τ: geometric steps
    ([0.0, 1e-5, 5e-5, 1e-4, 5e-3, 5e-2], "symlog"),  # InfoCSE λ, with 0
    ([32, 64, 128, 192, 256, 512], "log"),  # batch size
    ([0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0], "linear"),  # margin: an even grid from 0
    ([1, 3, 5, 7, 9], "linear"),  # UNA α
    ([1000, 2000, 3000, 4000, 5000, 6000], "linear"),  # UNA r
    ([0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45], "linear"),  # mask rate
    (["none", "rs", "rd"], "category"),
])
def test_value_scale(values, scale):
    from sentemb.report.style import value_scale

    assert value_scale(values) == scale


# ------------------------------------------------------------------------------------ report figures
def _write(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return path


def _results(tmp_path):
    """eval_sts.json / train.json of two backbones: runs with 3 seeds and with 1, variants of one
    method, two baselines on a backbone whose geometry lies on the same spot as a run, study points."""
    rng = np.random.default_rng(0)
    runs = [("simcse", "simcse", "bert", 3, 76.0), ("simcse-cls", "simcse", "bert", 1, 75.5),
            ("una", "una", "bert", 3, 77.0), ("una-para", "una", "bert", 3, 77.6), ("una-randsel", "una", "bert", 1, 76.4),
            ("sarcse", "sarcse", "roberta", 3, 77.4), ("simcse", "simcse", "roberta", 3, 76.6)]
    evals, trains = [], []
    for name, method, backbone, n, avg in runs:
        for seed in range(n):
            meta = {"name": name, "method": method, "backbone": backbone, "seed": seed}
            d = tmp_path / "runs" / name / backbone / f"seed{seed}"
            sts = {t: avg + off + rng.normal(0, 0.5) for t, off in zip(TASKS, (-7, 5, -1, 5, 2, 2, -6))}
            geo = {"align": 0.2 + 0.01 * len(name), "uniform": -2.0 - 0.05 * len(name),
                   "cosine_buckets": {f"{b}-{b + 1}": {"cosines": list(rng.normal(0.2 * b, 0.1, 30))} for b in range(5)}}
            evals.append(_write(d / "eval_sts.json", {**sts, "pooler": "cls_before_pooler", "geometry": geo, "run": meta}))
            hist = [{"step": s, "dev_stsb": avg + 4 - 6 * math.exp(-s / 40) + rng.normal(0, 0.3)} for s in range(10, 130, 10)]
            trains.append(_write(d / "train.json", {**meta, "best_dev_stsb": max(h["dev_stsb"] for h in hist),
                                                    "history": hist}))
    for pooler, avg, align in (("avg", 52.0, 0.2 + 0.01 * len("simcse")), ("cls_before_pooler", 31.0, 0.35)):
        meta = {"name": f"bert-{pooler}", "method": "baseline", "backbone": "bert", "seed": 0}
        sts = {t: avg + off for t, off in zip(TASKS, (-7, 5, -1, 5, 2, 2, -6))}
        # the avg baseline sits where simcse does: their markers and labels must stay apart
        geo = {"align": align, "uniform": -2.0 - 0.05 * len("simcse") if pooler == "avg" else -1.0,
               "cosine_buckets": {f"{b}-{b + 1}": {"cosines": list(rng.normal(0.9, 0.03, 30))} for b in range(5)}}
        evals.append(_write(tmp_path / "baselines" / "bert" / pooler / "eval_sts.json",
                            {**sts, "pooler": pooler, "geometry": geo, "run": meta}))
    for t in (0.02, 0.05, 0.1):  # a dev-only study: one evaluation at step 5 each, and no eval_sts.json
        meta = {"name": f"simcse-temperature/temperature={t}", "method": "simcse", "backbone": "bert", "seed": 0}
        trains.append(_write(tmp_path / "runs" / "simcse-temperature" / f"temperature={t}" / "bert" / "seed0" / "train.json",
                             {**meta, "best_dev_stsb": 80.5, "history": [{"step": 5, "dev_stsb": 80.5 + t}]}))
    return evals, trains


def _paper(evals, trains):
    import pandas as pd

    from sentemb.report.paper import collect_dev, table_paper
    from sentemb.report.tables import collect

    published = [{"method": "simcse", "backbone": "bert", "table": "sts", "source": "T1", "scores": {"Avg": 76.25}},
                 {"method": "simcse", "name": "simcse-cls", "backbone": "bert", "table": "sts", "source": "T9",
                  "scores": {"Avg": 76.0}},
                 {"method": "baseline", "backbone": "bert", "pooler": "avg", "table": "sts", "source": "T5",
                  "scores": {"Avg": 52.5}}]
    t = table_paper(collect(evals, TASKS), None, published, collect_dev(trains))
    return t.astype(object).where(pd.notna(t), None)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    from sentemb.report.figures import draw_figures

    evals, trains = _results(tmp_path_factory.mktemp("results"))
    plt = _plt()
    out = {}
    for stem, fig in draw_figures(evals, trains, _paper(evals, trains)):
        out[stem] = (problems(fig), [t.get_text() for t in drawn_texts(fig)], fig)
    yield out
    for *_, fig in out.values():
        plt.close(fig)


@pytest.mark.parametrize("stem", ["table1_bars", "dev_curves", "align_uniform", "cosine_buckets", "paper_vs_reproduced"])
def test_every_report_figure_passes_the_checks(drawn, stem):
    found, _, fig = drawn[stem]
    assert found == []
    assert fig.get_figwidth() <= TEXT_WIDTH_IN


def test_table1_shows_the_seeds_spread_and_says_1_seed(drawn):
    from sentemb.report.style import MIN_SCORE_SPAN

    _, texts, fig = drawn["table1_bars"]
    assert "simcse-cls (1 seed)" in texts and "una-randsel (1 seed)" in texts and "simcse" in texts
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        assert hi - lo >= MIN_SCORE_SPAN
        # a run with 3 seeds has a whisker (the error-bar container's bar lines), one with a single seed none
        bars = {c.get_label(): c.lines[2] for c in ax.containers}
        if "simcse" in bars and "simcse-cls" in bars:
            assert len(bars["simcse"]) == 1 and len(bars["simcse-cls"]) == 0
    # the untrained [CLS] baseline (31) would squeeze the trained runs: it is an arrow with its value
    assert any(t.startswith("← 2") or t.startswith("← 3") for t in texts)


def test_dev_curves_keep_study_points_in_their_study(drawn):
    _, _, fig = drawn["dev_curves"]
    labels = {label for ax in fig.axes for label, _ in series(ax)}
    assert {"simcse", "una", "una-para", "sarcse"} <= {label.removesuffix(" (1 seed)") for label in labels}
    assert not any("temperature" in label for label in labels)


def test_paper_figure_legend_shows_the_marker_its_points_have(drawn):
    """The legend's "reproduced" entry is drawn like the figure's first run (a grey circle beside runs
    drawn as crosses matched no point), and the published one is the hollow star."""
    _, _, fig = drawn["paper_vs_reproduced"]
    legends = [lg for lg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if lg is not None]
    handles = legends[0].legend_handles
    first = next(ln for ln in fig.axes[0].get_lines() if ln.get_marker() not in ("*", "None", None, ""))
    assert (handles[0].get_marker(), handles[0].get_color()) == (first.get_marker(), first.get_color())
    assert handles[1].get_marker() == "*"


def test_a_short_runs_dev_curve_has_whole_optimizer_steps():
    import pandas as pd

    from sentemb.report.figures import dev_panel
    from sentemb.report.style import StyleBook

    plt = _plt()
    fig, ax = plt.subplots()
    curve = pd.Series([70.0, 71.0, 71.5, 72.0], index=[1, 2, 3, 4])
    dev_panel(ax, {"simcse": [curve, curve + 0.5]}, [StyleBook().of({"name": "simcse", "method": "simcse"})])
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    plt.close(fig)


def test_align_uniform_labels_both_baselines_apart(drawn):
    from matplotlib.text import Annotation

    _, texts, fig = drawn["align_uniform"]
    assert {"untrained (avg)", "untrained (cls_before_pooler)", "simcse", "una-para"} <= set(texts)
    styles = {label.split(" / ")[0]: line for ax in fig.axes for label, line in series(ax)}
    a, b = styles["untrained (avg)"], styles["untrained (cls_before_pooler)"]
    assert (a.get_marker(), a.get_fillstyle()) != (b.get_marker(), b.get_fillstyle())
    assert any(isinstance(t, Annotation) for ax in fig.axes for t in ax.texts)  # labelled beside the points


def test_figures_write_png_svg_and_pdf(tmp_path):
    from PIL import Image

    from sentemb.cli import main
    from sentemb.report.style import DPI

    evals, trains = _results(tmp_path / "results")
    assert main(["figures", "--evals", *map(str, evals), "--train", *map(str, trains),
                 "--output-dir", str(tmp_path / "figs")]) == 0
    for stem in ("table1_bars", "dev_curves", "align_uniform", "cosine_buckets", "paper_vs_reproduced"):
        assert (tmp_path / "figs" / f"{stem}.pdf").read_bytes()[:5] == b"%PDF-"
        assert (tmp_path / "figs" / f"{stem}.svg").read_text()[:200].lstrip().startswith("<?xml")
        width = Image.open(tmp_path / "figs" / f"{stem}.png").size[0]
        assert width <= TEXT_WIDTH_IN * DPI + 1


# ------------------------------------------------------------------------------------ study figures
def _spec(name, key, values, seeds=(1,), metric="best_dev_stsb"):
    return {"name": name, "method": "simcse", "backbone": "bert", "metric": metric, "seeds": list(seeds),
            "expanded": [{"point": {key: v}, "run": f"{name}/{key}={v}", "reused": False} for v in values]}


def _histories(spec):
    import pandas as pd

    return {(p["run"], spec["method"], spec["backbone"]): {s: pd.Series({10: 78.0 + i, 20: 79.0 + i}) for s in spec["seeds"]}
            for i, p in enumerate(spec["expanded"])}


def _study(spec, values, published=None, histories=None):
    from sentemb.report.studies import draw_study_figure

    fig = draw_study_figure(spec, values, published, histories)
    return fig, problems(fig), [t.get_text() for t in drawn_texts(fig)]


def test_a_decade_of_temperature_is_a_log_axis_and_one_seed_s_noise_stays_small():
    """The demo's study: three temperatures, one seed, 0.3 points apart (issue 29's figure)."""
    from sentemb.report.style import MIN_SCORE_SPAN

    plt = _plt()
    spec = _spec("simcse-temperature", "temperature", [0.02, 0.05, 0.1])
    values = {(p["run"], 1): v for p, v in zip(spec["expanded"], (80.48, 80.78, 80.75))}
    fig, found, texts = _study(spec, values, histories=_histories(spec))
    assert found == []
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    lo, hi = ax.get_ylim()
    assert hi - lo >= MIN_SCORE_SPAN
    assert any("1 seed" in t for t in texts)
    assert len(fig.axes) == 2 and fig.axes[1].get_xlabel() == "optimizer step"  # the points' dev curves beside
    plt.close(fig)


@pytest.mark.parametrize("key, values, scale", [
    ("aux_weight", [0.0, 1e-5, 5e-5, 1e-4, 5e-3, 5e-2], "symlog"),
    ("margin_deg", [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0], "linear"),
    ("batch_size", [32, 64, 128, 192, 256, 512], "log"),
])
def test_study_axes_follow_the_values(key, values, scale):
    plt = _plt()
    spec = _spec("s", key, values, seeds=(1, 2, 3), metric="Avg")
    rng = np.random.default_rng(1)
    vals = {(p["run"], s): 76 + rng.normal(0, 0.4) for p in spec["expanded"] for s in (1, 2, 3)}
    published = {"points": [{"at": {key: values[1]}, "scores": {"Avg": 77.0}}]}
    fig, found, texts = _study(spec, vals, published)
    assert found == []
    ax = fig.axes[0]
    assert ax.get_xscale() == scale
    assert "±1 std over seeds" in texts and "each seed" in texts and "published" in texts
    assert not any("1 seed" in t for t in texts)  # three seeds: the spread, not a note
    plt.close(fig)


def test_grid_study_colour_range_and_seeds_study():
    from sentemb.report.style import MIN_SCORE_SPAN

    plt = _plt()
    spec = {"name": "g", "method": "arccse", "backbone": "bert", "metric": "best_dev_stsb", "seeds": [1],
            "expanded": [{"point": {"mask_rate": a, "mask_rate_large": b}, "run": f"g/{a},{b}", "reused": False}
                         for a, b in ((0.1, 0.2), (0.1, 0.3), (0.2, 0.3), (0.2, 0.4))]}
    values = {(p["run"], 1): 84 + 0.1 * i for i, p in enumerate(spec["expanded"])}
    fig, found, texts = _study(spec, values, histories=_histories(spec))
    assert found == []
    (image,) = fig.axes[0].images
    lo, hi = image.get_clim()
    assert hi - lo >= MIN_SCORE_SPAN and any("1 seed" in t for t in texts)
    plt.close(fig)
    seeds = {"name": "v", "method": "una", "backbone": "bert", "metric": "Avg", "seeds": [1, 2, 3, 4],
             "reference": "una-simcse", "expanded": [{"point": {}, "run": "una-para", "reused": True}]}
    values = {(r, s): 77 + 0.2 * s + (0.5 if r == "una-para" else 0) for r in ("una-para", "una-simcse") for s in range(1, 5)}
    fig, found, texts = _study(seeds, values, {"points": [{"at": {"seed": 1}, "scores": {"Avg": 77.5}}]})
    assert found == [] and "mean, 95 % t-interval" in texts and "published (per seed)" in texts
    plt.close(fig)


def test_study_cli_writes_pdf_with_the_dev_curves(tmp_path):
    from sentemb.cli import main

    spec = _spec("simcse-temperature", "temperature", [0.02, 0.05, 0.1])
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    files = []
    for i, p in enumerate(spec["expanded"]):
        files.append(_write(tmp_path / p["run"] / "train.json",
                            {"name": p["run"], "method": "simcse", "backbone": "bert", "seed": 1,
                             "best_dev_stsb": 80.0 + i, "history": [{"step": 5, "dev_stsb": 80.0 + i}]}))
    args = ["study", "--spec", str(tmp_path / "spec.json"), "--inputs", *map(str, files), "--train", *map(str, files),
            "--output", str(tmp_path / "s.csv"), "--figure", str(tmp_path / "s.png")]
    assert main(args) == 0
    assert {p.suffix for p in tmp_path.glob("s.*")} == {".csv", ".png", ".svg", ".pdf"}
    pdf = (tmp_path / "s.pdf").read_bytes()
    assert pdf[:5] == b"%PDF-" and b"/FontFile2" in pdf and b"/Type3" not in pdf  # TrueType fonts embedded
    first = {ext: (tmp_path / f"s.{ext}").read_bytes() for ext in ("png", "svg", "pdf")}
    assert main(args) == 0  # the same inputs write the same files (no time stamps, stable SVG ids)
    assert first == {ext: (tmp_path / f"s.{ext}").read_bytes() for ext in ("png", "svg", "pdf")}


# ------------------------------------------------------------------------------------ the paper configuration
def test_every_figure_of_the_paper_configuration_passes_the_checks(tmp_path, monkeypatch):
    """config/config.yaml on synthetic results for every run, seed, study point and baseline
    (scripts/synthetic_figures.py): each report and study figure passes every check."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("synthetic_figures", REPO / "scripts" / "synthetic_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.chdir(REPO)
    assert module.main(["--out", str(tmp_path), "--check", "--formats", "png"]) == 0
