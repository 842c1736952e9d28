"""Lesson 0's checks: a launch that binds each rank next to its GPU, the verdicts and the prediction."""
from __future__ import annotations

from scaledl.workshop.checks.common import _unfinished, _verdict


def check_binding_launch(placements: list, min_cpus: int = 8, name: str = "CPU_BIND") -> bool:
    """A launch the learner wrote (`scaledl.hpc.binding.plan` of it on a node's sysfs tree): every rank
    local to its GPU, on CPUs of its own, and at least `min_cpus` CPUs (hardware threads) each: one
    CPU per rank is local too, but starves the data loader and the host side.  The sysfs copy holds
    no core siblings, so CPUs are counted, not cores.

    `name`: the variable the learner sets, a `--cpu-bind` value: a rank away from its GPU is told
    which NUMA node's CPUs to take.  Ranks may not share CPUs."""
    from scaledl.hpc.binding import format_cpulist as format_cpus

    if not placements:
        return _unfinished(name)
    for p in placements:
        if p.gpu is None:
            return _verdict(False, f"local rank {p.local_rank} has no GPU ({p.reason}): give every rank a GPU")
    for p in placements:
        if p.verdict != "local":
            where = (f"local rank {p.local_rank}: CPUs {format_cpus(p.cpus)} on NUMA node "
                     f"{','.join(map(str, p.cpu_nodes))}, its GPU ({p.gpu}) on NUMA node {p.gpu_node} ({p.verdict})")
            return _verdict(False, f"{where}: give it CPUs of NUMA node {p.gpu_node} only (the table above lists "
                                   "them)")
    for p, q in ((p, q) for i, p in enumerate(placements) for q in placements[i + 1:]):
        if p.cpus & q.cpus:
            return _verdict(False, f"local ranks {p.local_rank} and {q.local_rank} share CPUs "
                                   f"{format_cpus(p.cpus & q.cpus)}: give each rank CPUs of its own")
    for p in placements:
        cpus = len(p.cpus)
        if cpus < min_cpus:
            return _verdict(False, f"local rank {p.local_rank} has {cpus} CPU{'s' * (cpus != 1)}, local but few: "
                                   f"give it at least {min_cpus} of its NUMA node's {len(p.node_cpus)}")
    shown = "; ".join(f"rank {p.local_rank}: CPUs {format_cpus(p.cpus)}, GPU on NUMA {p.gpu_node}" for p in placements)
    return _verdict(True, f"every rank on its GPU's NUMA node, with CPUs of its own ({shown})")


def check_binding_verdicts(verdicts, placements: list, name: str = "VERDICTS") -> bool:
    """`verdicts[local_rank]` is "local", "split" or "far" for a launch whose ranks land as
    `placements` (`scaledl.hpc.binding.plan`): the learner reads it off the node's table before the
    launch's own printout shows it.  Local ranks as ints or digit strings; the words in any case.

    The verdicts are graded together: a wrong set FAILs with how many of its verdicts are wrong and
    names no rank, so that a learner knows how far off the set is, but trying words rank by rank
    until the check passes learns little from its messages.  What a failure may name is the form: a
    rank left out, or a word that is not a verdict.  `name`: the variable the learner sets."""
    words = ("local", "split", "far")
    if not verdicts:
        return _unfinished(name)
    if not isinstance(verdicts, dict):
        return _verdict(False, f"`{name}` is a dict: {{local rank: 'local', 'split' or 'far'}}")
    given = {}
    for key, value in verdicts.items():
        rank = int(key) if isinstance(key, int) or (isinstance(key, str) and key.strip().isdigit()) else key
        given[rank] = value.strip().lower() if isinstance(value, str) else value
    missing = [p.local_rank for p in placements if p.local_rank not in given]
    if missing:
        return _verdict(False, f"give a verdict for every local rank: {', '.join(map(str, missing))} missing")
    for word in given.values():
        if word not in words:
            return _verdict(False, f"{word!r} is not a verdict; say 'local', 'split' or 'far'")
    wrong = sum(given[p.local_rank] != p.verdict for p in placements)
    if wrong:
        # How many are wrong, never which: it names the reasoning, no rank.
        return _verdict(False, f"not the verdicts of this launch: {wrong} of the {len(placements)} "
                               f"{'is' if wrong == 1 else 'are'} wrong (the check does not say which). For each "
                               "rank, list the NUMA nodes its cores span (the table above gives each NUMA node's "
                               "cores), and compare them with its GPU's")
    return _verdict(True, "; ".join(f"local rank {p.local_rank}: {p.verdict}" for p in placements))
