"""The live checks of lessons 3-6, 8 and 11-14 FAIL on the wrong answers learners write, run for real: each
case takes the solution notebook, puts one realistic mistake in place of the solution line,
runs it on live ranks cell by cell until a check prints the verdict it expects (or up to the last check),
and reads the verdict.  A lesson's cases share one kernel and one start of its engines."""
import copy

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT
from scaledl.hpc import launchers

CHECK_TAG = "nbval-check-output"

CASES = {
    # lesson, the solution's text, the mistake in its place, what the failing verdict says
    "reduce_to_rank_0": ("03_collectives", "tdist.all_reduce(x, op=tdist.ReduceOp.SUM)", "tdist.reduce(x, dst=0)",
                         "only rank 0 holds the average"),
    "sum_not_averaged": ("03_collectives", "x /= dist.world_size\n", "", "that is the sum"),
    "shard_by_local_rank": ("03_collectives", "return indices[rank::world_size]",
                            "return indices[local_rank::world_size]", "trained on the same samples"),
    "shard_unpadded": ("03_collectives", "    indices += indices[:per_rank * world_size - num_samples]", "    pass",
                       "wait alone in its all-reduce"),
    "tf_summed": ("04_horovod_tf", "tape = hvd.DistributedGradientTape(tape)",
                  "tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)", "summed over ranks"),
    "tf_model_only": ("04_horovod_tf",
                      "        hvd.broadcast_variables(optimizer_variables, root_rank=0)\n",
                      "", "optimizer state"),
    "torch_sum_at_the_same_lr": ("05_horovod_torch", "stepped = w - lr / world_size * summed",
                                 "stepped = w - lr * summed", "too large"),
    "torch_default_average": ("05_horovod_torch", "summed = hvd.allreduce(g, op=hvd.Sum)", "summed = hvd.allreduce(g)",
                              "averages unless told otherwise"),
    "torch_summed": ("05_horovod_torch",
                     "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())",
                     "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), "
                     "op=hvd.Sum)", "summed over ranks"),
    "torch_model_only": ("05_horovod_torch", "hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n", "",
                         "optimizer state"),
    # The solution lines end in "\n": the markdown after the check names the same calls.
    "torch_lr_scaled_twice": ("05_horovod_torch", "hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n",
                              "hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n"
                              "for group in optimizer.param_groups:\n    group['lr'] *= world_size\n",
                              "differ from one process's steps"),
    "torch_unnamed": ("05_horovod_torch", ", named_parameters=model.named_parameters())\n", ")\n",
                      "allreduce.noname"),
    # A resumed start in the wrong order: the load after the broadcasts, or before the wrap.
    "torch_broadcast_before_load": ("05_horovod_torch",
                                    "optimizer.load_state_dict(resumed)  # this rank's checkpoint, into the wrapped "
                                    "optimizer\nhvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
                                    "hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n",
                                    "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n"
                                    "hvd.broadcast_optimizer_state(optimizer, root_rank=0)\n"
                                    "optimizer.load_state_dict(resumed)\n", "its own checkpoint's optimizer state"),
    "torch_loaded_before_wrap": ("05_horovod_torch",
                                 "optimizer = hvd.DistributedOptimizer(optimizer, "
                                 "named_parameters=model.named_parameters())\n"
                                 "optimizer.load_state_dict(resumed)  # this rank's checkpoint, into the wrapped "
                                 "optimizer\n",
                                 "optimizer.load_state_dict(resumed)\noptimizer = hvd.DistributedOptimizer(optimizer, "
                                 "named_parameters=model.named_parameters())\n", "not rank 0's checkpoint"),
    # Which GPU a rank drives behind CUDA_VISIBLE_DEVICES: the index it uses, not the GPU the mask maps it to.
    "rank_device_unmapped": ("06_ddp", '    return torch.device("cuda", index), visible[index]',
                             '    return torch.device("cuda", index), index', "the GPU behind it is not"),
    "uneven_step_equal_weights": ("06_ddp", "weight_gap = -1.0", "weight_gap = 0.0", "you predicted equal weights"),
    # One all-reduce per micro batch predicted: the count is one per bucket, in the window's last backward only.
    "accumulation_count_per_micro_batch": ("06_ddp", "predicted_all_reduces = 1  #", "predicted_all_reduces = 4  #",
                                           "you predicted 4"),
    "tp_without_all_reduce": ("12_tensor_parallel", "    tdist.all_reduce(partial)", "    pass",
                              "only its partial sum"),
    "stage2_one_backward": ("08_deepspeed", '"all_reduces": accumulation_steps * len(buckets),',
                            '"all_reduces": len(buckets),', "every backward reduces"),
    # The hand pipeline's backward.  Its other wrong answers (no requires_grad on the received tensor, a
    # backward without the received gradient) leave a rank waiting out its timeout before the check speaks:
    # tests/workshop/checks/test_lesson_11.py feeds the check their results instead.
    "pipeline_sends_activations": ("11_pipelines", "    tdist.send(activations.grad, dst=0)",
                                   "    tdist.send(activations.detach(), dst=0)", "not `activations`"),
    # The capstone: tensor parallelism across nodes.
    "layout_tp_across_nodes": ("14_layouts",
                               'layout = {"dp": 16, "tp": 1, "pp": 1, "zero": 1, "recompute": "none", '
                               '"micro_batch_size": 1}',
                               'layout = {"dp": 2, "tp": 8, "pp": 1, "zero": 1, "recompute": "none", '
                               '"micro_batch_size": 1}', "stays inside a node"),
    # Ring attention's subtle one: the running sums never rescaled when a block raises the maximum (the other
    # mistakes, tests/workshop/checks/test_lesson_13.py, from a ring run in one process).
    "ring_unscaled": ("13_sequences", "rescale = torch.exp(top - new_top)", "rescale = 1.0", "not rescaled"),
}


def verdicts(cells) -> list[str]:
    """Every verdict line the check cells printed: a cell may run two checks (a PASS, then a FAIL)."""
    texts = ["".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
             for cell in cells if cell.cell_type == "code" and CHECK_TAG in cell.metadata.get("tags", [])]
    return [line for text in texts for line in text.splitlines() if line.startswith(("PASS: ", "FAIL: "))]


LESSONS = sorted({stem for stem, *_ in CASES.values()})


@pytest.mark.slow
@pytest.mark.parametrize("stem", LESSONS)
def test_realistic_mistakes_fail_their_live_checks(stem, monkeypatch):
    """One kernel and one set of engines per lesson: its cells up to the engines' start run once, then each
    case runs the cells after it, from there to the check that speaks to its mistake (every name the
    check reads is made again, so no case sees another's state; only the engines and their process
    group carry over, as a learner who reruns a section keeps them)."""
    for name, value in launchers.local_env(2).items():
        monkeypatch.setenv(name, value)
    path = ROOT / "solutions" / f"{stem}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    cells = list(notebook.cells)  # the solution's cells: execute_cell puts the cell it ran into notebook.cells
    last = max(i for i, cell in enumerate(cells) if CHECK_TAG in cell.metadata.get("tags", []))
    started = [i for i, cell in enumerate(cells) if cell.cell_type == "code" and "engines.start(" in cell.source]
    first = started[0] + 1 if started else 0  # the first cell each case runs again
    stops = [cell for cell in cells[last + 1:] if "stop_cluster_sync" in cell.source]
    client = NotebookClient(notebook, timeout=300, allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    wrong_verdicts = {}
    with client.setup_kernel():
        for index in range(first):
            client.execute_cell(cells[index], index)
        for case, (lesson, right, wrong, expected) in CASES.items():
            if lesson != stem:
                continue
            copies = copy.deepcopy(cells[:last + 1])
            changed = [i for i, cell in enumerate(copies) if right in cell.source]
            assert len(changed) == 1 and changed[0] >= first, (case, "the solution line moved: update the case")
            copies[changed[0]].source = copies[changed[0]].source.replace(right, wrong)
            ran = []
            # Cell by cell, and no further than the check that speaks to the mistake: the cells after it cannot
            # change its verdict, and a lesson's later measurements would only add minutes.
            for index in range(first, last + 1):
                client.execute_cell(copies[index], index)
                ran.append(copies[index])
                if any(expected in text for text in verdicts([copies[index]])):
                    break
            found = [text for text in verdicts(ran) if expected in text]
            if not found or not all(text.startswith("FAIL: ") for text in found):
                wrong_verdicts[case] = verdicts(ran)
        for cell in stops:  # the engines end with the notebook, as its last cell ends them
            client.execute_cell(cell, cells.index(cell))
    assert not wrong_verdicts, wrong_verdicts
