"""The instructor's view of a class: its scaling curves with each point's spread across learners and
the predictor's line on top, who disagrees with the rest, and every learner's verdicts.

    from scaledl.workshop import class_report
    report = class_report.build("/eagle/YOUR_PROJECT/class")      # reads the class directory
    print(report.text)                                             # what `scaledl class report` prints
    report.figure                                                  # matplotlib Figure: the curves
    class_report.write(report, "/eagle/YOUR_PROJECT/class/report") # scaling.png and index.html

The page is one HTML file with the figure inside it: it opens from the file system, no server.
"""
from __future__ import annotations

import base64
import html
import io
import os
import time
from dataclasses import dataclass
from pathlib import Path

from scaledl.workshop import classroom


@dataclass
class Report:
    folder: Path
    records: classroom.Records
    key: str  # "nodes" or "ranks"
    points: list[dict]
    predicted: dict  # (rung, series, batch) -> [(x, efficiency)], the predictor's line per series
    predictor_note: str
    disagreements: list[str]
    verdicts: dict
    figure: object
    text: str


def _predicted(points: list[dict], key: str, runs: list[dict], system: str | None) -> tuple[dict, str]:
    """`scaledl predict`'s DDP efficiency for each series at its points, against its smallest point,
    from the series' own smallest point as the measured step (step = batch / samples/s per rank)."""
    from scaledl.perf import predict

    if system not in predict.SYSTEMS:
        return {}, (f"no predictor line: the class ran on {system or 'machines'} without a preset "
                    f"(scaledl class report --system {'|'.join(sorted(predict.SYSTEMS))} draws one)")
    chosen = predict.SYSTEMS[system]
    lines = {}
    for name in dict.fromkeys((p["rung"], p["series"], p["batch"]) for p in points):
        rows = [p for p in points if (p["rung"], p["series"], p["batch"]) == name]
        params = [r.get("num_params") for r in runs if r["summary"]["rung"] == name[0] and r.get("num_params")]
        if len(rows) < 2 or not params:
            continue
        first = rows[0]
        per_rank_batch = first["batch"] / first["ranks"] if name[1] == "strong" else first["batch"]
        step_s = per_rank_batch / (first["samples_per_s"] / first["ranks"])
        table = predict.table(step_s, int(params[0]), chosen, ranks=[r["ranks"] for r in rows], strategies=("ddp",))
        base = table[0]["efficiency"]
        lines[name] = [(r[key], t["efficiency"] / base) for r, t in zip(rows, table)]
    return lines, f"predictor: scaledl predict, DDP on {chosen.name}, step measured at each series' first point"


def _figure(points: list[dict], predicted: dict, key: str, klass: dict):
    from matplotlib.figure import Figure  # no pyplot: a notebook's backend stays as it is

    names = list(dict.fromkeys((p["rung"], p["series"], p["batch"]) for p in points))
    fig = Figure(figsize=(11, 4.2))
    speed, efficiency = fig.subplots(1, 2)
    for index, name in enumerate(names):
        rows = [p for p in points if (p["rung"], p["series"], p["batch"]) == name]
        label = f"{name[0]}, {name[1]} (batch {name[2]}{' per rank' if name[1] == 'weak' else ' global'})"
        color = f"C{index}"
        xs = [r[key] for r in rows]
        ys = [r["samples_per_s"] for r in rows]
        spread = [[y - r["low"] for y, r in zip(ys, rows)], [r["high"] - y for y, r in zip(ys, rows)]]
        speed.errorbar(xs, ys, yerr=spread, fmt="o-", color=color, capsize=4, label=label)
        for r in rows:
            speed.annotate(f"n={len(r['learners'])}", (r[key], r["samples_per_s"]), textcoords="offset points",
                           xytext=(4, -12), fontsize=7, color=color)
        efficiency.plot(xs, [r["efficiency"] for r in rows], "o", color=color, mec="black", label=f"{label}: measured")
        if name in predicted:
            px, py = zip(*predicted[name])
            efficiency.plot(px, py, "--", color=color, label=f"{label}: predicted")
    counts = sorted({p[key] for p in points})
    for ax in (speed, efficiency):
        ax.set_xlabel(key)
        if counts and counts[-1] > 8:
            ax.set_xscale("log", base=2)
        if counts:  # the counts themselves as ticks, whole numbers
            from matplotlib.ticker import NullFormatter, ScalarFormatter

            ax.set_xticks(counts)
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
    speed.set(ylabel="samples/s (median of learners; bars: lowest to highest)", title="throughput")
    efficiency.set(ylabel="efficiency per rank against the first point", ylim=(0, 1.2), title="efficiency")
    efficiency.axhline(1.0, color="gray", lw=0.6, ls=":")
    for ax in (speed, efficiency):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"class {klass['name']}: {len({n for p in points for n in p['learners']})} learners")
    fig.tight_layout()
    return fig


def _text(report_points: list[dict], key: str, lines: list[str], verdicts: dict, skipped: list[str], note: str,
          predicted: dict) -> str:
    nodes = key == "nodes"  # on one machine the axis is the ranks themselves
    out = [f"{'rung':14} {'series':22} {key:>6} " + (f"{'ranks':>5} " if nodes else "") + f"{'learners':>8} "
           f"{'runs':>4} {'samples/s':>10} {'spread':>15} {'efficiency':>10} {'predicted':>9}"]
    for p in report_points:
        series = f"{p['series']} (batch {p['batch']})"
        line = dict(predicted.get((p["rung"], p["series"], p["batch"]), []))
        guess = f"{line[p[key]]:.2f}" if p[key] in line else "-"
        spread = f"{p['low']:>7.0f}-{p['high']:<7.0f}"
        out.append(f"{p['rung']:14} {series:22} {p[key]:>6} " + (f"{p['ranks']:>5} " if nodes else "")
                   + f"{len(p['learners']):>8} {p['runs']:>4} {p['samples_per_s']:>10.0f} {spread} "
                   f"{p['efficiency']:>10.2f} {guess:>9}")
    out.append(note)
    out += lines or ["no learner disagrees with the others by 25% or more"]
    exercises = sorted({ex for table in verdicts.values() for ex in table})
    out.append(f"verdicts: {len(verdicts)} learners, {len(exercises)} checks")
    for learner, table in sorted(verdicts.items()):
        passed = sum(r["verdict"] == "PASS" for r in table.values())
        failing = [f"{lesson}:{ex}" for (lesson, ex), r in sorted(table.items()) if r["verdict"] == "FAIL"]
        out.append(f"  {learner}: {passed} of {len(table)} pass"
                   + (f"; failing {', '.join(failing)}" if failing else ""))
    return "\n".join(out + skipped)


def build(folder: str | os.PathLike, system: str | None = None) -> Report:
    """Read the class and make its report; `system` (polaris, aurora) names the predictor's preset,
    default the class's own (`scaledl class init --system`)."""
    records = classroom.read(folder)
    key = classroom.axis(records)
    rows = classroom.points(records)
    predicted, note = _predicted(rows, key, records.runs, system or records.klass.get("system"))
    lines = classroom.disagreements(rows, key)
    verdicts = classroom.latest_verdicts(records)
    return Report(Path(folder), records, key, rows, predicted, note, lines, verdicts,
                  _figure(rows, predicted, key, records.klass),
                  _text(rows, key, lines, verdicts, records.skipped, note, predicted))


def _table(header: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{cells}</tr>{body}</table>"


STYLE = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:2px 6px}")


def _items(lines: list[str], empty: str) -> str:
    return "<ul>" + ("".join(f"<li>{html.escape(line)}</li>" for line in lines) or f"<li>{empty}</li>") + "</ul>"


def page(report: Report, png: bytes) -> str:
    """The instructor's page: one HTML file, the figure inside it, so it opens from the file system."""
    records, key = report.records, report.key
    name = html.escape(records.klass["name"])
    exercises = sorted({ex for table in report.verdicts.values() for ex in table})
    verdict_rows = [[learner, *(table[ex]["verdict"] if ex in table else "" for ex in exercises)]
                    for learner, table in sorted(report.verdicts.items())]
    point_rows = [[p["rung"], f"{p['series']} (batch {p['batch']})", p[key], p["ranks"], len(p["learners"]), p["runs"],
                   f"{p['samples_per_s']:.0f}", f"{p['low']:.0f}", f"{p['high']:.0f}", f"{p['efficiency']:.2f}"]
                  for p in report.points]
    figure = base64.b64encode(png).decode()
    when = html.escape(time.strftime("%Y-%m-%d %H:%M:%S"))
    return "\n".join([
        f'<!doctype html><html><head><meta charset="utf-8"><title>class {name}</title><style>{STYLE}</style></head>',
        f"<body><h1>class {name}</h1>",
        f"<p>{when}: {len(records.runs)} runs, {len(records.verdicts)} verdicts, {len(records.skipped)} records "
        f"skipped. {html.escape(report.predictor_note)}</p>",
        f'<img alt="the class\'s scaling curves" src="data:image/png;base64,{figure}">',
        "<h2>Points</h2>" + _table(["rung", "series", key, "ranks", "learners", "runs", "samples/s", "lowest",
                                    "highest", "efficiency"], point_rows),
        "<h2>Who disagrees with the rest</h2>" + _items(report.disagreements, "nobody, by 25% or more"),
        "<h2>Verdicts (the last of each check)</h2>"
        + _table(["learner", *(f"{lesson}:{ex}" for lesson, ex in exercises)], verdict_rows),
        "<h2>Skipped</h2>" + _items(records.skipped, "none"),
        "</body></html>", ""])


def write(report: Report, out: str | os.PathLike) -> tuple[Path, Path]:
    """scaling.png and index.html (the figure inside it) in `out`; each written whole, then renamed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    report.figure.savefig(png, format="png", dpi=110)
    written = []
    for name, data in (("scaling.png", png.getvalue()), ("index.html", page(report, png.getvalue()).encode())):
        partial = out / f".{name}.partial"
        partial.write_bytes(data)
        os.replace(partial, out / name)
        written.append(out / name)
    return written[0], written[1]
