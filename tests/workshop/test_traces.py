"""scaledl.workshop.traces on a real profile: a DDP backward over a real Gloo process group (one rank,
in this process), profiled by torch.profiler."""
import datetime
import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

from scaledl import models
from scaledl.workshop import traces


@pytest.fixture
def gloo_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_ddp_backward_and_its_buckets_from_the_profiler(gloo_group, tmp_path):
    torch.manual_seed(0)
    model = DDP(models.torch_cnn(width=64), bucket_cap_mb=1)
    x, y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    for step in range(3):  # the buckets are rebuilt after the first iteration
        loss = F.cross_entropy(model(x), y)
        if step < 2:
            loss.backward()
            continue
        with profile(activities=traces.activities(torch.device("cpu"))) as prof:
            loss.backward()
    rows = traces.ddp_events(prof.events(), min_share=0.0)
    backward = [r for r in rows if r[0] == "backward"]
    buckets = [r for r in rows if r[0] == "all-reduce"]
    labels = {label for _, label, _, _ in backward}
    # Every op of backward, those without parameters too; named without "Backward0".
    assert {"Convolution", "MaxPool2DWithIndices", "Relu", "Addmm"} <= labels, labels
    # Two buckets at 1 MiB (the 3.2 MB linear weight alone, then the rest), in the order they ran,
    # the first while backward still computes, the last after the last backward op began.
    assert [label for _, label, _, _ in buckets] == ["bucket 0", "bucket 1"]
    assert buckets[0][2] < max(start for _, _, start, _ in backward) <= buckets[1][2]
    assert min(start for _, _, start, _ in backward) == 0.0
    assert all(end >= start for _, _, start, end in rows)
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    assert "gloo:all_reduce" in (tmp_path / "trace.json").read_text()
    assert "AccumulateGrad" not in " ".join(labels)  # DDP's hooks' op, not the model's
    # With the default, neighbouring short ops become one bar, and the bars still cover backward.
    merged = [r for r in traces.ddp_events(prof.events()) if r[0] == "backward"]
    assert len(merged) < len(backward) and "small ops" in {label for _, label, _, _ in merged}
    assert max(end for *_, end in merged) == max(end for *_, end in backward)


def test_a_profile_without_backward_is_one_clear_error():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(3).sum()
    with pytest.raises(ValueError, match="profile the loss.backward"):
        traces.ddp_events(prof.events())


def test_activities_follow_the_device():
    assert traces.activities(torch.device("cpu")) == [ProfilerActivity.CPU]
    assert traces.activities(torch.device("cuda", 1)) == [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    assert traces.activities("xpu") == [ProfilerActivity.CPU, ProfilerActivity.XPU]


def test_ddp_bucket_bytes_is_ddps_record_before_and_after_the_rebuild(gloo_group):
    torch.manual_seed(0)
    model = DDP(models.torch_cnn(width=64), bucket_cap_mb=1)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    record = traces.ddp_bucket_bytes(model)
    assert [int(n) for n in record["first"].split(",")] == [total]  # one bucket in the first iteration
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    for _ in range(3):  # DDP rebuilds its buckets at the second forward, as lesson 6 runs it
        F.cross_entropy(model(x), y).backward()
    record = traces.ddp_bucket_bytes(model)
    assert [int(n) for n in record["first"].split(",")] == [total]
    assert [int(n) for n in record["rebuilt"].split(",")] == [3_216_936, 297_984]  # the 3.2 MB weight, then the rest
