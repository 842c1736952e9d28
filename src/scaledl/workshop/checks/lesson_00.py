"""Lesson 0's checks: a launch that binds each rank next to its GPU, the verdicts and the prediction."""
from __future__ import annotations

from scaledl.workshop.checks.common import _unfinished, _verdict


def check_binding_launch(placements: list, min_cpus: int = 8) -> bool:
    """A launch the learner wrote (`scaledl.hpc.binding.plan` of it on a node's sysfs tree): every rank
    local to its GPU, on CPUs of its own, and at least `min_cpus` CPUs (hardware threads) each: one
    CPU per rank is local too, but starves the data loader and the host side.  The sysfs copy holds
    no core siblings, so CPUs are counted, not cores."""
    from scaledl.hpc.binding import format_cpulist as format_cpus

    if not placements:
        return _unfinished("CPU_BIND")
    for p in placements:
        if p.verdict != "local":
            return _verdict(False, f"local rank {p.local_rank}: CPUs {format_cpus(p.cpus)} on NUMA node "
                                   f"{','.join(map(str, p.cpu_nodes))}, its GPU on NUMA node {p.gpu_node} "
                                   f"({p.verdict}): give it CPUs of NUMA node {p.gpu_node} only (the table above "
                                   "lists them)")
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


def check_binding_verdicts(verdicts, placements: list) -> bool:
    """`verdicts[local_rank]` is "local", "split" or "far" for a launch whose ranks land as
    `placements` (`scaledl.hpc.binding.plan`): the learner reads it off the node's table before the
    launch's own printout shows it.  Local ranks as ints or digit strings; the words in any case.

    The verdicts are graded together, as `check_binding_prediction` grades its mapping: every wrong
    set FAILs with the same words, which name no rank, so that trying words until the check passes
    learns nothing from its messages.  What a failure may name is the form: a rank left out, or a
    word that is not a verdict."""
    words = ("local", "split", "far")
    if not verdicts:
        return _unfinished("VERDICTS")
    if not isinstance(verdicts, dict):
        return _verdict(False, "`VERDICTS` is a dict: {local rank: 'local', 'split' or 'far'}")
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
    if any(given[p.local_rank] != p.verdict for p in placements):
        # One answer for every wrong set, however many of its words are right: it names the reasoning, no rank.
        return _verdict(False, "not the verdicts of this launch (the check does not say which): for each rank, list "
                               "the NUMA nodes its cores span (the table above gives each NUMA node's cores), and "
                               "compare them with its GPU's")
    return _verdict(True, "; ".join(f"local rank {p.local_rank}: {p.verdict}" for p in placements))


def check_binding_prediction(prediction, placements: list, gpu_nodes: dict) -> bool:
    """`prediction[local_rank] = (GPU, NUMA node of that GPU)` for a launch whose ranks land as
    `placements` (`scaledl.hpc.binding.plan` on a node's sysfs tree); GPU as its number in PCI order
    (what nvidia-smi shows) or its PCI address.  `gpu_nodes`: each GPU's PCI address -> NUMA node,
    in PCI order.  The launch itself must put every rank on its GPU's NUMA node (local): a launch
    with a far or split rank FAILs whatever was predicted.

    The mapping is graded whole: a wrong one FAILs with the same words however many of its GPUs are
    right, so that trying values until the check passes tells nothing (4 GPUs for each of 4 ranks:
    256 mappings).  What a failure may say is what the learner can read anyway: an entry that is not
    (GPU, NUMA node), a GPU the node does not have, a NUMA node that is not the named GPU's row of the
    table, and the one usual misreading (GPU number = local rank).  The learner answers from the table
    before the wrapper is shown, so no message names the wrapper's formula."""
    for p in placements:
        if p.verdict != "local":
            return _verdict(False, f"the launch runs local rank {p.local_rank} on NUMA node "
                                   f"{','.join(map(str, p.cpu_nodes))} with a GPU on NUMA node {p.gpu_node} "
                                   f"({p.verdict}): give each rank the GPU on its own cores' NUMA node")
    if not isinstance(prediction, dict) or any(p.local_rank not in prediction for p in placements):
        return _unfinished("prediction") if not prediction else _verdict(
            False, f"predict every local rank 0-{len(placements) - 1}: `prediction` has {sorted(prediction)}")
    order = list(gpu_nodes)
    given = {}
    for p in placements:
        try:
            gpu, node = prediction[p.local_rank]
            gpu = order.index(gpu.lower()) if isinstance(gpu, str) else int(gpu)
            node = int(node)
        except (TypeError, ValueError):
            return _verdict(False, f"prediction[{p.local_rank}] = {prediction[p.local_rank]!r}: write (GPU number, "
                                   "NUMA node), e.g. (2, 1)")
        if not 0 <= gpu < len(order):
            return _verdict(False, f"prediction[{p.local_rank}] names GPU {gpu}: this node has GPUs 0-{len(order) - 1}")
        given[p.local_rank] = gpu, node
    # The usual misreading, named as an idea (it is the cell's first guess): it tells no entry of the answer.
    if all(gpu == rank for rank, (gpu, _) in given.items()):
        return _verdict(False, "GPU number = local rank is cuda:<local_rank>, the GPU as the rank sees it, not its "
                               "number on the node: for each local rank, find the NUMA node of its cores in the "
                               "table, then the GPU that sits on it")
    # Each NUMA node against the table, for the GPU the learner named (right or wrong): the table is printed.
    unread = [rank for rank, (gpu, node) in sorted(given.items()) if gpu_nodes[order[gpu]] != node]
    if unread:
        return _verdict(False, f"local rank{'s' * (len(unread) > 1)} {', '.join(map(str, unread))}: the NUMA node "
                               "is not the one the table gives for the GPU you name: read that GPU's row (a GPU's "
                               "NUMA node is its PCI root's, not its number)")
    if all(given[p.local_rank][0] == order.index(p.gpu) for p in placements):
        mapping = ", ".join(f"{p.local_rank}->GPU {order.index(p.gpu)}" for p in placements)
        return _verdict(True, f"every local rank drives the GPU on its own NUMA node ({mapping}), all local")
    # One answer for every other wrong mapping, near or far: it names the reasoning, never an entry.
    return _verdict(False, "not the GPUs this launch gives its ranks (the check does not say which entries): "
                           "for each local rank, find the NUMA node of its cores (8r to 8r+7), then the GPU that "
                           "the table puts on it")
