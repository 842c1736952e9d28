"""Every lesson figure draws from realistic numbers and shows what its caption claims."""
import matplotlib
import numpy as np
import pytest

from conftest import DATA
from scaledl import schedule
from scaledl.workshop import plots

PNG = b"\x89PNG\r\n\x1a\n"


def drawn(fig) -> bytes:
    data = plots.png(fig)
    assert data.startswith(PNG) and len(data) > 5000
    return data


def test_parallelism_and_memory_figures():
    drawn(plots.parallelism())
    fig = plots.training_memory({"params": 28, "grads": 28, "optimizer": 56, "activations": 18}, 40, "A100")
    assert "130 GB needed, 40 GB" in fig.axes[0].get_title()
    drawn(fig)


def rendered(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    return renderer


def test_memory_legend_stays_off_the_bars():
    fig = plots.training_memory({"params": 28, "grads": 28, "optimizer": 56, "activations": 18}, 40, "A100")
    renderer = rendered(fig)
    legend = fig.axes[0].get_legend().get_window_extent(renderer)
    for bar in fig.axes[0].patches:
        assert not legend.overlaps(bar.get_window_extent(renderer))


def test_every_title_fits_inside_its_figure():
    for fig in (plots.ring_allreduce(4), plots.ring_allreduce(8), plots.parallelism(),
                plots.training_memory({"params": 6, "grads": 6, "optimizer": 12}, 40)):
        renderer = rendered(fig)
        page = fig.bbox
        for ax in fig.axes:
            box = ax.title.get_window_extent(renderer)
            assert page.x0 + 2 <= box.x0 and box.x1 <= page.x1 - 2, ax.get_title()  # not cut at the edge


def test_ring_allreduce_every_rank_sends_a_different_chunk_each_step():
    fig = plots.ring_allreduce(4)
    grid = fig.axes[1].images[0].get_array()
    assert grid.shape == (4, 6)  # 4 ranks, 2 x (4 - 1) steps
    for step in range(6):
        assert sorted(grid[:, step]) == [0, 1, 2, 3]
    drawn(fig)


def test_allreduce_cost_is_log_log_with_the_model_line():
    nbytes = 4 * np.array([2**k for k in range(8, 23, 2)])
    alpha, inverse_beta = 30e-6, 1 / 2e9
    seconds = 2 * alpha + nbytes * inverse_beta * 1.1
    fig = plots.allreduce_cost(nbytes, seconds, alpha, inverse_beta, 2)
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert len(ax.get_lines()) == 3
    drawn(fig)


def test_sampler_order_and_ddp_timeline():
    orders = {"forgotten": [[3, 1, 2, 0]] * 3, "set_epoch": [[3, 1, 2, 0], [0, 2, 1, 3], [1, 0, 3, 2]]}
    fig = plots.sampler_order(orders, 4)
    assert len(fig.axes) == 3 and fig.axes[2].get_ylabel() == "sample index"  # two panels and their colour key
    drawn(fig)
    events = [("backward", "Linear 9", 0.0, 0.001), ("backward", "Conv2d 0", 0.003, 0.006),
              ("all-reduce", "bucket 0", 0.0012, 0.004), ("all-reduce", "bucket 1", 0.0061, 0.007)]
    fig = plots.ddp_timeline([events, events])
    assert len(fig.axes[0].patches) == 8  # two bars of each kind per rank
    drawn(fig)
    # As measured: a 0.3 ms and a 50 us layer beside a 100 ms one, a short last bucket.
    events = [("backward", "Linear 9", 0.0, 0.0003), ("backward", "Linear 7", 0.0003, 0.013),
              ("backward", "Conv2d 3", 0.018, 0.112), ("backward", "Conv2d 0", 0.1525, 0.15255),
              ("all-reduce", "bucket 0", 0.011, 0.032), ("all-reduce", "bucket 1", 0.167, 0.1685)]
    fig = plots.ddp_timeline([events, events])
    ax, renderer = fig.axes[0], rendered(fig)
    span = ax.get_xlim()[1]
    assert min(patch.get_width() for patch in ax.patches) >= span / 400  # no bar too thin to see
    boxes = [text.get_window_extent(renderer) for text in ax.texts]
    assert len(boxes) == 12
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]  # labels apart
    axes_box = ax.get_window_extent(renderer)
    assert all(axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1 for box in boxes)  # and inside the axes
    drawn(fig)


def test_zero_memory_stacks_the_three_kinds():
    from scaledl import zero_memory

    paper = {stage: zero_memory.predict(7_500_000_000, 64, stage, 2, 2, 12) for stage in range(4)}
    fig = plots.zero_memory({"paper": paper})
    ax = fig.axes[0]
    assert ax.get_ylabel() == "GB per rank" and len(ax.patches) == 12
    assert [t.get_text() for t in ax.texts] == ["120", "31.4", "16.6", "1.88"]  # the paper's Figure 1
    drawn(fig)


@pytest.mark.parametrize("microbatches", [1, 4, 8])
def test_pipeline_bubble_matches_the_formula_for_equal_stages(microbatches):
    fig = plots.pipeline_schedule([0.001, 0.001], [0.002, 0.002], microbatches)
    assert fig.bubble == pytest.approx(1 / (microbatches + 1))
    drawn(fig)


def test_pipeline_schedule_runs_the_backwards_in_torchs_order():
    """torch's ScheduleGPipe runs micro batch 0's backward first on every stage (`_step_microbatches`)."""
    fig = plots.pipeline_schedule([0.001, 0.001], [0.002, 0.002], 4)
    for row in (0, 1):
        backwards = sorted((t.get_position()[0], t.get_text()) for t in fig.axes[0].texts
                           if t.get_text().startswith("B") and round(t.get_position()[1]) == row)
        assert [text for _, text in backwards] == ["B0", "B1", "B2", "B3"]
    drawn(fig)


def test_the_measured_pipeline_timeline_draws_each_event_on_its_rank():
    events = [[3, 0, 0, "F", 0, 10.0, 10.001], [3, 0, 0, "F", 1, 10.001, 10.002], [3, 1, 1, "F", 0, 10.001, 10.002],
              [3, 1, 1, "F", 1, 10.002, 10.003], [3, 1, 1, "B", 1, 10.003, 10.004], [3, 1, 1, "B", 0, 10.004, 10.005],
              [3, 0, 0, "B", 1, 10.004, 10.005], [3, 0, 0, "B", 0, 10.005, 10.006],
              [2, 0, 0, "F", 0, 1.0, 9.0]]  # an earlier step, not drawn
    fig = plots.pipeline_timeline(events)
    bars = [p for p in fig.axes[0].patches if p.get_facecolor()[:3] != matplotlib.colors.to_rgb(plots.COLORS["idle"])]
    assert len(bars) == 8 and fig.bubble == pytest.approx(1 / 3)
    assert sorted({round(b.get_y() + b.get_height() / 2) for b in bars}) == [0, 1]  # one row a rank
    assert [t.get_text() for t in fig.axes[0].texts][:2] == ["F0", "F1"]
    assert not any(b.get_hatch() for b in bars)  # one stage a rank: nothing hatched
    drawn(fig)


def test_the_interleaved_timeline_hatches_each_ranks_second_chunk():
    """2 ranks x 2 chunks: stages 0 and 2 on rank 0, 1 and 3 on rank 1; one micro batch goes round twice."""
    events = [[1, 0, 0, "F", 0, 0.000, 0.001], [1, 1, 1, "F", 0, 0.001, 0.002], [1, 0, 2, "F", 0, 0.002, 0.003],
              [1, 1, 3, "F", 0, 0.003, 0.004], [1, 1, 3, "B", 0, 0.004, 0.005], [1, 0, 2, "B", 0, 0.005, 0.006],
              [1, 1, 1, "B", 0, 0.006, 0.007], [1, 0, 0, "B", 0, 0.007, 0.008]]
    fig = plots.pipeline_timeline(events)
    bars = [p for p in fig.axes[0].patches if p.get_facecolor()[:3] != matplotlib.colors.to_rgb(plots.COLORS["idle"])]
    assert [bool(b.get_hatch()) for b in bars] == [e[2] >= 2 for e in events]
    assert {t.get_text() for t in fig.axes[0].texts} == {"0"}  # the micro batch; the colour and hatch say the rest
    assert "second chunk (stages 2-3)" in " ".join(t.get_text() for t in fig.legends[0].get_texts())
    drawn(fig)


def test_pipeline_labels_only_bars_wide_enough_for_them():
    """Stage 1's forwards are a hundredth of stage 0's: their labels would spill out of the bars, so they are left
    out; every other bar keeps its label."""
    fig = plots.pipeline_schedule([0.002, 0.00002], [0.004, 0.004], 4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("F0") == 1 and texts.count("B0") == 2  # stage 0's F0 only; both stages' B0
    assert len(texts) == 4 + 4 + 4  # stage 0's forwards, both stages' backwards
    drawn(fig)


def test_pipeline_bubble_grows_when_one_stage_is_slower():
    balanced = plots.pipeline_schedule([0.001, 0.001], [0.002, 0.002], 4).bubble
    assert plots.pipeline_schedule([0.003, 0.001], [0.006, 0.002], 4).bubble > balanced


def test_scaling_and_lr_schedules():
    fig = plots.scaling({"weak": {1: 1000.0, 2: 1800.0, 4: 3400.0}, "strong": {1: 1000.0, 2: 1500.0, 4: 2000.0}})
    efficiency = fig.axes[1].get_lines()[0].get_ydata()
    assert list(np.round(efficiency, 3)) == [1.0, 0.9, 0.85]
    drawn(fig)
    curves = {"global batch 256": [schedule.lr_at(s, lr=0.1, global_batch_size=256, base_batch_size=64,
                                                  scale_lr=True, warmup_steps=10) for s in range(40)]}
    fig = plots.lr_schedules(curves, {"global batch 256": 20})
    line = fig.axes[0].get_lines()[0]
    assert line.get_ydata()[0] == pytest.approx(0.1) and line.get_ydata()[-1] == pytest.approx(0.4)
    assert line.get_xdata()[-1] == pytest.approx(39 / 20)
    drawn(fig)


def test_image_is_what_a_notebook_stores():
    image = plots.image(plots.parallelism())
    assert image.format == "png" and image.data.startswith(PNG)


def test_horovod_cycles_wait_for_every_rank_and_fuse_what_is_ready():
    sizes = {"fc2": 4_000, "fc1": 400_000, "conv2": 18_000, "conv1": 600}
    submitted = [{"fc2": 0.2, "fc1": 0.3, "conv2": 1.4, "conv1": 1.5},
                 {"conv1": 0.1, "fc2": 0.5, "fc1": 1.2, "conv2": 1.3}]  # another order on rank 1
    fig = plots.horovod_cycles(submitted, sizes, cycle_ms=1.0)
    # fc2 is ready on both ranks in the first cycle; fc1 waits for rank 1 (1.2 ms), conv1 for rank 0.
    # In the second, Horovod's coordinator counts rank 0's requests first (conv2, then conv1: conv1 is
    # complete), then rank 1's (fc1, then conv2): its order, not the order of the clock.
    assert fig.reductions == [(1.0, ["fc2"]), (2.0, ["conv1", "fc1", "conv2"])]
    small = plots.horovod_cycles(submitted, sizes, cycle_ms=1.0, fusion_bytes=100_000)
    # fc1 is over the threshold and between the two convolutions: three buffers.
    assert small.reductions == [(1.0, ["fc2"]), (2.0, ["conv1"]), (2.0, ["fc1"]), (2.0, ["conv2"])]
    model_ax = fig.axes[1]  # the modelled row says so in the figure itself, not only in the text around it
    assert model_ax.get_title().startswith("model, not measured")
    assert [label.get_text() for label in model_ax.get_yticklabels()] == ["all ranks (model)"]
    drawn(fig)


def test_close_labels_are_staggered_and_spans_drawn():
    assert plots._stagger([0.0, 0.05, 0.1, 5.0], span=10) == [0, 1, 2, 0]  # close ones climb, a far one goes low
    assert plots._stagger([5.0, 0.0], span=10) == [0, 0]
    assert plots._stagger([0.0, 0.3, 0.6, 0.9, 1.2], span=10) == [0, 1, 2, 0, 1]  # a level is free again 0.7 on
    sizes = {"9.bias": 40, "9.weight": 5_120, "7.weight": 802_816}
    submitted = [{"9.bias": 0.10, "9.weight": 0.12, "7.weight": 0.9},
                 {"9.bias": 0.2, "9.weight": 0.21, "7.weight": 1.4}]
    spans = [{"backward": (0, 1.1), "step()": (1.1, 2.3)}, {"backward": (0, 1.5), "step()": (1.5, 2.4)}]
    fig = plots.horovod_cycles(submitted, sizes, cycle_ms=1.0, spans=spans, title="measured")
    assert fig.reductions == [(1.0, ["9.bias", "9.weight"]), (2.0, ["7.weight"])]
    assert [text.get_text() for text in fig.axes[0].get_legend().get_texts()] == ["backward", "step()"]
    drawn(fig)


def test_accumulation_timeline_marks_each_window():
    def window(t0, applied=True):
        events = []
        for micro in range(3):
            start = t0 + micro * 10
            events += [("forward", start, start + 3), ("backward", start + 3, start + 8)]
            if micro == 2:
                events.append(("all-reduce", start + 6, start + 8))
            events.append(("optimizer step" if micro == 2 and applied else "step()", start + 8, start + 8.01))
        return events
    fig = plots.accumulation_timeline([window(0) + window(30), window(0) + window(30)], accumulation_steps=3)
    assert fig.windows == 2
    labels = [text.get_text() for text in fig.legends[0].get_texts()]
    assert labels == ["forward", "backward", "all-reduce", "step()", "optimizer step"]
    widths = [patch.get_width() for patch in fig.axes[0].patches]
    assert min(widths) >= 0.004 * 58  # a step() of 0.01 ms still shows
    # A dashed end of window on each rank's own row, at its own optimizer step: 2 ranks x 2 windows.
    dashed = sorted((tuple(round(x, 6) for x in line.get_xdata()), tuple(round(y, 6) for y in line.get_ydata()))
                    for line in fig.axes[0].get_lines())
    assert dashed == [((28.01, 28.01), (-0.45, 0.45)), ((28.01, 28.01), (0.55, 1.45)),
                      ((58.01, 58.01), (-0.45, 0.45)), ((58.01, 58.01), (0.55, 1.45))]
    drawn(fig)


def test_node_binding_shows_polaris_reverse_gpu_order():

    from scaledl.hpc import binding

    root = DATA / "sysfs" / "polaris"
    depth = ["mpiexec", "-n", "4", "--ppn", "4", "--depth", "8", "--cpu-bind", "depth", "python", "train.py"]
    wrapper = ["bash", "-c", 'export CUDA_VISIBLE_DEVICES=$((3 - PALS_LOCAL_RANKID)); exec "$@"', "bind"]
    identity = binding.plan(depth, {}, "cuda", 4, root)
    reverse = binding.plan([*depth[:-2], *wrapper, *depth[-2:]], {}, "cuda", 4, root)
    gpu_nodes = binding.gpu_numa_nodes(root, "cuda")
    assert list(gpu_nodes.values()) == [3, 2, 1, 0]  # GPU 0 on NUMA node 3: the reverse order the figure draws
    fig = plots.node_binding({"cuda:<local_rank>": identity, "GPU 3 - local_rank": reverse},
                             binding.numa_nodes(root), gpu_nodes)
    assert fig.local_counts == {"cuda:<local_rank>": 0, "GPU 3 - local_rank": 4}
    assert [ax.get_title() for ax in fig.axes] == ["cuda:<local_rank>: 0 of 4 ranks local",
                                                   "GPU 3 - local_rank: 4 of 4 ranks local"]
    drawn(fig)


def test_node_binding_draws_a_split_rank_across_its_numa_nodes_and_labels_each_gpu():
    """--depth 16 on Polaris: rank 0 spans NUMA nodes 0-1 (split, drawn across both, not on the first
    only), rank 1 spans 2-3 while its GPU 2 is on NUMA node 1 (far); each GPU names its rank."""

    from matplotlib.colors import to_hex

    from scaledl.hpc import binding

    root = DATA / "sysfs" / "polaris"
    launch = ["mpiexec", "-n", "2", "--ppn", "2", "--depth", "16", "--cpu-bind", "depth", "bash", "-c",
              'export CUDA_VISIBLE_DEVICES=$((3 - PALS_LOCAL_RANKID)); exec "$@"', "bind", "python", "train.py"]
    placements = binding.plan(launch, {}, "cuda", 2, root)
    assert [p.verdict for p in placements] == ["split", "far"]
    fig = plots.node_binding({"depth 16": placements}, binding.numa_nodes(root), binding.gpu_numa_nodes(root, "cuda"))
    ax = fig.axes[0]
    labels = {t.get_text(): t for t in ax.texts}
    rank0, rank1 = labels["rank 0: CPUs 0-15"], labels["rank 1: CPUs 16-31"]
    assert rank0.get_position()[0] == pytest.approx(1.0) and rank1.get_position()[0] == pytest.approx(3.0)
    assert to_hex(rank0.get_bbox_patch().get_facecolor()) != to_hex(rank1.get_bbox_patch().get_facecolor())
    bars = [line.get_xdata() for line in ax.lines if len(line.get_xdata()) == 2]
    assert [tuple(round(x, 2) for x in bar) for bar in bars] == [(0.1, 1.9), (2.1, 3.9)]
    # GPU 3 sits under NUMA node 0 (column 0), GPU 2 under NUMA node 1: each says whose it is.
    assert labels["rank 0's"].get_position()[0] == pytest.approx(0.5)
    assert labels["rank 1's"].get_position()[0] == pytest.approx(1.5)
    drawn(fig)


def test_cpu_map_shows_aurora_depth_binding_splitting_rank_6():
    """ALCF's list keeps all 12 ranks on their tile's socket; --depth 8 --cpu-bind depth gives rank 6
    CPUs 49-51,53-57, across the socket boundary at 52: drawn orange on both NUMA nodes."""

    from matplotlib.colors import to_hex

    from scaledl.hpc import binding, systems

    root = DATA / "sysfs" / "aurora"
    alcf = ["mpiexec", "-n", "12", "--ppn", "12", "--cpu-bind", "list:" + ":".join(systems.AURORA_CPU_LISTS),
            "python", "train.py"]
    depth = ["mpiexec", "-n", "12", "--ppn", "12", "--depth", "8", "--cpu-bind", "depth", "python", "train.py"]
    env = {"ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}
    reserved = systems.RESERVED_CPUS["aurora"]  # cores 0 and 52 are the system's (ALCF's hello_affinity output)
    panels = {"list": binding.plan(alcf, env, "xpu", 12, root, reserved),
              "depth": binding.plan(depth, env, "xpu", 12, root, reserved)}
    fig = plots.cpu_map(panels, binding.numa_nodes(root), binding.gpu_numa_nodes(root, "xpu"))
    assert fig.local_counts == {"list": 12, "depth": 11}
    bars = [patch for patch in fig.axes[1].patches if patch.get_height() == pytest.approx(0.7)]
    assert len(bars) == 13  # rank 6's CPUs are two runs, one a socket
    split = [(bar.get_x(), bar.get_width()) for bar in bars if to_hex(bar.get_facecolor()) == "#dd8452"]
    assert split == [(49, 3), (53, 5)]  # ALCF's output: "MPI 006 ... HWT 49-51,53-57"
    assert fig.axes[0].get_xlim() == (0, 104)  # the cores, not the second hardware threads (104-207)
    texts = [text.get_text() for text in fig.axes[1].texts]
    assert "rank 6: CPUs 49-51,53-57 -> GPU 3 (NUMA node 1)" in texts
    drawn(fig)


@pytest.mark.parametrize("world_size", [2, 4])
def test_data_parallel_step_draws_each_rank_and_one_average(world_size):
    fig = plots.data_parallel_step(world_size)
    ax = fig.axes[0]
    texts = [text.get_text() for text in ax.texts]
    assert [t for t in texts if t.startswith("rank ")] == [f"rank {r}\nmicro batch {r}" for r in range(world_size)]
    assert [t for t in texts if t.startswith("$g_")] == [f"$g_{{{r}}}$" for r in range(world_size)]  # each its own
    averages = [t for t in texts if t.startswith("all-reduce")]
    assert len(averages) == 1 and f"/\\,{world_size}$" in averages[0]  # one all-reduce, an average over all ranks
    assert " + ".join(f"g_{r}" for r in range(world_size)) in averages[0]
    for identical in (r"$\bar g$", "$w$"):  # what the all-reduce makes the same on every rank
        assert texts.count(identical) == world_size
    assert f"{world_size} x micro_batch_size" in " ".join(texts)
    renderer = rendered(fig)
    boxes = [text.get_window_extent(renderer) for text in ax.texts]
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]  # labels apart
    page = fig.bbox
    assert all(page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
               for box in [*boxes, ax.title.get_window_extent(renderer)])  # nothing cut at the edge
    drawn(fig)


def test_data_parallel_step_needs_two_ranks():
    with pytest.raises(ValueError, match="at least 2 ranks"):
        plots.data_parallel_step(1)


def test_layout_parts_stack_to_each_layouts_predicted_step():
    from scaledl import models
    from scaledl.perf import choose, predict

    rows = choose.layouts(models.GPT_PRESETS["gpt3-2.7b"], predict.POLARIS, choose.DEVICES["polaris"], 4, 512)[:5]
    rows.append(choose.evaluate(models.GPT_PRESETS["gpt3-2.7b"], predict.POLARIS, choose.DEVICES["polaris"], 4, 512,
                                4, 2, 2, 1, "none", 1))  # every part present: bubble, tp, pp and dp
    fig = plots.layout_parts(rows)
    ax = fig.axes[0]
    for y, row in enumerate(rows):
        bars = [patch for patch in ax.patches if abs(patch.get_y() + patch.get_height() / 2 - y) < 1e-9]
        assert len(bars) == 5
        assert sum(bar.get_width() for bar in bars) == pytest.approx(row["step_s"], rel=1e-9)
        assert [bar.get_width() > 0 for bar in bars] == [True, row["pp"] > 1, row["tp"] > 1, row["pp"] > 1,
                                                        row["dp"] > 1]
    assert [label.get_text() for label in fig.legends[0].get_texts()] == [  # below the axes, never clipped
        "compute", "bubble", "tp all-reduces", "pp sends", "dp communication"]


def test_ring_hiding_crosses_one_at_each_links_threshold():
    thresholds = {"NVLink": 3120.0, "Slingshot": 6240.0}
    fig = plots.ring_hiding(thresholds, ranks=8)
    drawn(fig)
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) > 2]
    assert len(lines) == 2
    for line, threshold in zip(lines, thresholds.values()):
        xs, ys = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
        assert ys == pytest.approx(xs / threshold)  # compute / send = tokens per rank / threshold
        assert ys[xs < threshold].max() < 1 < ys[xs > threshold].min()
    assert "hides from 3,120 tokens a rank" in ax.get_legend().get_texts()[0].get_text()
    assert "tokens per rank" in ax.get_xlabel()
    assert "ring of 8 ranks" in ax.child_axes[0].get_xlabel()  # the sequence length, s = 8 n, on the top axis
