"""The class as one experiment, read back: every learner's runs and verdicts, the class's scaling
points, who disagrees with the rest, and who runs which node count.

    from scaledl.workshop import classroom
    records = classroom.read("/eagle/YOUR_PROJECT/class")   # skips what it cannot trust, one line each
    points = classroom.points(records)                       # one per (rung, series, node count)
    classroom.assign("/eagle/YOUR_PROJECT/class", [1, 2, 4, 8, 16, 32, 64])

What learners write is in `scaledl.class_records`; the figure and the instructor's page are in
`scaledl.workshop.class_report`; `scaledl class init|assign|report` is the command.
"""
from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from scaledl import class_records
from scaledl.class_records import ASSIGNMENTS, RUNS, VERDICTS, ClassError

DISAGREE = 0.25  # a learner this far from the others' median throughput at the same point is named


@dataclass
class Records:
    klass: dict
    runs: list[dict] = field(default_factory=list)
    verdicts: list[dict] = field(default_factory=list)  # in each learner's file order
    skipped: list[str] = field(default_factory=list)  # one line per file or line not read, saying why


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and value > 0


def _run_problem(record, klass: dict) -> str | None:
    if not isinstance(record, dict) or record.get("kind") != "run" or record.get("format") != class_records.FORMAT:
        return "not a run record of this scaledl"
    if record.get("class") != klass["id"]:
        return f"a record of another class ({record.get('class')!r}, this one is {klass['id']!r})"
    summary = record.get("summary")
    if not isinstance(summary, dict) or not isinstance(summary.get("rung"), str):
        return "no summary with a rung"
    if not (isinstance(summary.get("world_size"), int) and summary["world_size"] > 0
            and _number(summary.get("samples_per_s")) and isinstance(record.get("learner"), str)
            and isinstance(record.get("batch_size"), int) and record["batch_size"] > 0):
        return "its world_size, samples_per_s, batch_size or learner is missing or not a positive number"
    if record.get("nodes") is not None and not (isinstance(record["nodes"], int) and record["nodes"] > 0):
        return "its node count is not a positive whole number"
    return None


def _verdict_problem(record, klass: dict, learner: str) -> str | None:
    if not isinstance(record, dict) or record.get("kind") != "verdict" or record.get("format") != class_records.FORMAT:
        return "not a verdict record of this scaledl"
    if record.get("class") != klass["id"]:
        return f"a record of another class ({record.get('class')!r})"
    if record.get("learner") != learner:
        return f"names learner {record.get('learner')!r} in {learner}'s file"
    if record.get("verdict") not in ("PASS", "FAIL") or not all(
            isinstance(record.get(k), str) for k in ("lesson", "exercise", "line")):
        return "its lesson, exercise, verdict or line is missing"
    return None


def read(folder: str | os.PathLike) -> Records:
    """Every record in the class directory that can be trusted; the rest named in `skipped`."""
    folder = Path(folder)
    records = Records(class_records.read_class(folder))
    for path in sorted(Path(folder, RUNS).iterdir()) if Path(folder, RUNS).is_dir() else []:
        if path.name.startswith("."):
            continue  # a run being written (renamed into place when whole)
        if path.suffix != ".json" or not path.is_file():
            records.skipped.append(f"skipped {path}: not a run record (runs/ holds <learner>-...json files)")
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            records.skipped.append(f"skipped {path}: cannot be read as JSON ({error})")
            continue
        problem = _run_problem(record, records.klass)
        if problem:
            records.skipped.append(f"skipped {path}: {problem}")
        else:
            records.runs.append({**record, "file": path.name})
    for path in sorted(Path(folder, VERDICTS).iterdir()) if Path(folder, VERDICTS).is_dir() else []:
        if path.suffix != ".jsonl" or not path.is_file():
            records.skipped.append(f"skipped {path}: not a learner's verdicts (verdicts/ holds <learner>.jsonl)")
            continue
        try:
            lines = path.read_text().split("\n")
        except (OSError, UnicodeDecodeError) as error:
            records.skipped.append(f"skipped {path}: cannot be read ({error})")
            continue
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                records.skipped.append(f"skipped {path} line {number}: not a whole record")
                continue
            problem = _verdict_problem(record, records.klass, path.stem)
            if problem:
                records.skipped.append(f"skipped {path} line {number}: {problem}")
            else:
                records.verdicts.append(record)
    return records


def latest_verdicts(records: Records) -> dict[str, dict[tuple[str, str], dict]]:
    """learner -> (lesson, exercise) -> the last verdict in that learner's file.  File order, not the
    records' clocks: a learner's nodes may disagree on the time, the file's order cannot."""
    table: dict[str, dict[tuple[str, str], dict]] = {}
    for record in records.verdicts:
        table.setdefault(record["learner"], {})[(record["lesson"], record["exercise"])] = record
    return table


def axis(records: Records) -> str:
    """"nodes" when the class's runs span nodes, else "ranks" (a class on laptops or one node)."""
    return "nodes" if any((run.get("nodes") or 1) > 1 for run in records.runs) else "ranks"


def _x(run: dict, key: str) -> int:
    return (run.get("nodes") or 1) if key == "nodes" else run["summary"]["world_size"]


def points(records: Records) -> list[dict]:
    """The class's scaling points.  A weak-scaling series holds a rung's runs of one per-rank batch
    (the global batch grows with the ranks), a strong-scaling series the runs of one global batch
    whose per-rank batches differ.  Per point: each learner's median samples/s (a learner who
    reran a point counts once), their median and spread, and the efficiency of the median per rank
    against the series' smallest point."""
    key = axis(records)
    series: dict[tuple, list[dict]] = {}
    for run in records.runs:
        rung = run["summary"]["rung"]
        series.setdefault((rung, "weak", run["batch_size"]), []).append(run)
        series.setdefault((rung, "strong", run.get("global_batch_size")), []).append(run)
    out = []
    for (rung, kind, batch), runs in sorted(series.items(), key=lambda item: str(item[0])):
        if kind == "strong" and (batch is None or len({run["batch_size"] for run in runs}) < 2):
            continue  # one per-rank batch: the weak series already holds these runs
        by_x: dict[int, dict[str, list[dict]]] = {}
        for run in runs:
            by_x.setdefault(_x(run, key), {}).setdefault(run["learner"], []).append(run)
        rows = []
        for x, learners in sorted(by_x.items()):
            per_learner = {name: statistics.median(r["summary"]["samples_per_s"] for r in rs)
                           for name, rs in learners.items()}
            ranks = statistics.median(r["summary"]["world_size"] for rs in learners.values() for r in rs)
            hosts = {name: sorted({r.get("host", "?") for r in rs}) for name, rs in learners.items()}
            rows.append({"rung": rung, "series": kind, "batch": batch, key: x, "ranks": int(ranks),
                         "learners": per_learner, "runs": sum(len(rs) for rs in learners.values()),
                         "hosts": hosts, "samples_per_s": statistics.median(per_learner.values()),
                         "low": min(per_learner.values()), "high": max(per_learner.values())})
        base = rows[0]["samples_per_s"] / rows[0]["ranks"]
        for row in rows:
            row["efficiency"] = row["samples_per_s"] / row["ranks"] / base
        out.extend(rows)
    return out


def disagreements(rows: list[dict], key: str, threshold: float = DISAGREE) -> list[str]:
    """One line per learner whose throughput at a point is `threshold` or more off the others'
    median there: a slow node, a wrong binding, another job on the node.  Two learners only: the
    slower is named, since either could be the odd one."""
    lines = []
    for row in rows:
        values = row["learners"]
        for name, value in sorted(values.items()):
            others = [v for n, v in values.items() if n != name]
            if not others:
                continue
            reference = statistics.median(others)
            gap = value / reference - 1
            if abs(gap) < threshold or (len(others) == 1 and gap > 0):
                continue
            where = ", ".join(row["hosts"][name])
            lines.append(f"{row['rung']} ({row['series']}, batch {row['batch']}) at {row[key]} {key}: {name} ran "
                         f"{value:.0f} samples/s, {abs(gap):.0%} {'below' if gap < 0 else 'above'} "
                         f"{'the other learner' if len(others) == 1 else f'the median of {len(others)} others'} "
                         f"({reference:.0f}); its rank 0 ran on {where}: "
                         + ("a slow or shared node, or a wrong binding?" if gap < 0 else
                            "do the others share their nodes, or bind their ranks wrongly?"))
    return lines


def learners(records: Records) -> list[str]:
    return sorted({r["learner"] for r in records.runs} | {r["learner"] for r in records.verdicts})


def assign(folder: str | os.PathLike, counts: list[int], users: list[str] | None = None, rung: str = "ddp",
           run_flags: str = "--epochs 3") -> dict:
    """Give each learner a node count, round-robin over `counts`: the learners `users` names (user
    names, in this order), else those the class has seen (by name).  A learner who joins later gets
    a count from their pseudonym (`class_records.assignment`).  Written atomically to assignments.json."""
    folder = Path(folder)
    klass = class_records.read_class(folder)
    if not counts or any(not isinstance(n, int) or n < 1 for n in counts):
        raise ClassError(f"--nodes needs whole numbers of nodes, at least 1, got {counts}")
    names = [class_records.learner(klass, user) for user in users] if users else learners(read(folder))
    plan = {"format": class_records.FORMAT, "class": klass["id"], "nodes": list(counts), "rung": rung,
            "run_flags": run_flags, "by_learner": {name: counts[i % len(counts)] for i, name in enumerate(names)}}
    partial = folder / f".{ASSIGNMENTS}.partial"
    partial.write_text(json.dumps(plan, indent=1) + "\n")
    os.replace(partial, folder / ASSIGNMENTS)
    return plan


def submit_command(part: dict, system: str, folder: str | os.PathLike) -> str:
    """The one command that runs a learner's assigned point on `system`, recorded in the class:
    the rung's job script with the node count and the class directory passed in."""
    import shlex

    from scaledl.hpc import jobs

    nodes, rung, flags = part["nodes"], part["rung"], part.get("run_flags", "")
    variables = f"SCALEDL_CLASS_DIR={folder}" + (f",SCALEDL_RUN_FLAGS={flags}" if flags else "")
    if system in ("polaris", "aurora"):
        select = f"{nodes}:system=polaris" if system == "polaris" else str(nodes)
        return (f"qsub -q {jobs.queue(system, nodes)} -l select={select} -v {shlex.quote(variables)} "
                f"jobs/{system}/{rung}.sh")
    if system == "slurm":
        return f"sbatch --nodes={nodes} --export={shlex.quote('ALL,' + variables)} jobs/slurm/{rung}.sh"
    # One machine: the assigned count is a count of ranks.
    return (f"SCALEDL_CLASS_DIR={shlex.quote(str(folder))} scaledl launch -n {nodes} -- scaledl.ladder.{rung} "
            f"--out-dir runs/class/{rung}-{nodes} {flags}").rstrip()


def simulate(folder: str | os.PathLike, counts: list[int], per_count: int = 2, rung: str = "ddp",
             flags: tuple[str, ...] = ("--epochs", "1", "--train-limit", "512")) -> Path:
    """A class on this machine, for an instructor to try the report before the workshop: `per_count`
    learners at each rank count, each a real run of `rung` under `scaledl launch`, two learners at a
    time with one thread a rank (as two jobs share a node).  Makes the class if `folder` holds none."""
    import subprocess
    import tempfile

    from scaledl.hpc import launchers

    folder = Path(folder)
    if not (folder / class_records.CLASS_FILE).exists():
        subprocess.run([launchers.tool("scaledl"), "class", "init", str(folder), "--name", "simulated", "--system",
                        "local"], check=True, capture_output=True)
    outs = Path(tempfile.mkdtemp(prefix="class-runs-"))
    learners = [(f"learner{i + 1}", ranks) for i, ranks in enumerate(n for n in counts for _ in range(per_count))]
    for start in range(0, len(learners), 2):
        running = []
        for user, ranks in learners[start:start + 2]:
            env = launchers.local_env(ranks, {**os.environ, class_records.ENV: str(folder),
                                              class_records.LEARNER_ENV: user, "OMP_NUM_THREADS": "1"})
            command = [launchers.tool("scaledl"), "launch", "-n", str(ranks), "--", f"scaledl.ladder.{rung}", *flags,
                       "--out-dir", str(outs / user)]
            running.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            text=True))
        for process in running:
            output, _ = process.communicate()
            if process.returncode != 0:
                raise RuntimeError(f"a simulated learner's run failed:\n{output[-2000:]}")
    return folder


def my_point(system: str | None = None) -> str:
    """What lesson 7 prints for a learner: their node count and the command that runs it, on the
    class's system unless `system`; or why there is none yet."""
    folder = class_records.from_env()
    if folder is None:
        return (f"not in a class ({class_records.ENV} is unset): on your own, the sweep above is your curve; "
                "in a workshop, join the class first (lesson 0)")
    part = class_records.assignment(folder)
    if part is None:
        return (f"in the class at {folder}, but no node count is assigned yet: your instructor runs "
                "`scaledl class assign`")
    system = system or class_records.read_class(folder).get("system", "polaris")
    return (f"{part['learner']}: {part['nodes']} node{'s' * (part['nodes'] > 1)} of {part['rung']}; submit it from a "
            f"login node:\n{submit_command(part, system, folder)}")
