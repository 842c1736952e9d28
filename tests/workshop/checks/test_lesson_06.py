"""Lesson 6's checks (DDP in sync, accumulation, buckets): each passes the solution, FAILs on what an untouched
exercise leaves, and FAILs on the wrong answers a learner plausibly writes, naming the fix in one line."""


from conftest import fails, untouched, verdict
from scaledl.workshop import checks


# ---------------------------------------------------------------- data parallelism

def test_in_sync_check_names_the_framework_fix(capsys):
    assert checks.check_in_sync(["abc", "abc"])
    verdict(capsys)
    fails(capsys, checks.check_in_sync(["abc", "abd"]), "rank 1 holds different parameters", "wrap the model in DDP")
    line = fails(capsys, checks.check_in_sync(["abc", "abd"], framework="deepspeed"), "engine")
    assert "DDP" not in line
    fails(capsys, checks.check_in_sync(["abc", None]), "did not finish")
    assert not checks.check_in_sync(None)


def test_rank_device_check(capsys):
    import torch

    def right(local_rank, visible):
        if not visible:
            return torch.device("cpu"), None
        return torch.device("cuda", local_rank % len(visible)), visible[local_rank % len(visible)]

    assert checks.check_rank_device(right)
    assert "CUDA_VISIBLE_DEVICES" in verdict(capsys)
    # Unusual but right: strings and a list.
    assert checks.check_rank_device(lambda lr, v: ["cpu", None] if not v else [f"cuda:{lr % len(v)}", v[lr % len(v)]])
    verdict(capsys)
    # The local rank as the device, whatever the process sees: wrong under the Polaris wrapper.
    fails(capsys, checks.check_rank_device(lambda lr, v: (torch.device("cuda", lr), v[lr % len(v)]) if v
                                           else (torch.device("cpu"), None)), "wrapper", "cuda:1 does not exist")
    # Always cuda:0: right under the wrapper, wrong for local rank 1 of CUDA_VISIBLE_DEVICES=2,3.
    fails(capsys, checks.check_rank_device(lambda lr, v: (torch.device("cuda", 0), v[0]) if v
                                           else (torch.device("cpu"), None)), "local rank 1 of 2", "share out")
    # The right device, but cuda:i taken for the node's GPU i.
    fails(capsys, checks.check_rank_device(lambda lr, v: (torch.device("cuda", lr % len(v)), lr % len(v)) if v
                                           else (torch.device("cpu"), None)), "CUDA_VISIBLE_DEVICES=2,3",
          "the GPU behind it is not 0")
    # The local rank as the GPU number.
    fails(capsys, checks.check_rank_device(lambda lr, v: (torch.device("cuda", lr % len(v)), lr) if v
                                           else (torch.device("cpu"), None)), "the GPU behind it is not 0")
    # A GPU number on the CPU.
    fails(capsys, checks.check_rank_device(lambda lr, v: right(lr, v) if v else (torch.device("cpu"), 0)),
          "give None")
    # A GPU where there is none.
    fails(capsys, checks.check_rank_device(lambda lr, v: right(lr, v) if v else (torch.device("cuda", 0), 0)),
          "sees no GPU")
    # A bare "cuda", only a device, an int, an error, the untouched exercise.
    fails(capsys, checks.check_rank_device(lambda lr, v: (torch.device("cuda"), v[0]) if v
                                           else (torch.device("cpu"), None)), "index")
    fails(capsys, checks.check_rank_device(lambda lr, v: right(lr, v)[0]), "return a pair")
    fails(capsys, checks.check_rank_device(lambda lr, v: (lr, v[0]) if v else ("cpu", None)), "return a torch.device")
    fails(capsys, checks.check_rank_device(lambda lr, v: (torch.device("cuda", lr % len(v)), v[lr])), "IndexError")
    fails(capsys, checks.check_rank_device(untouched), "NotImplementedError")
    fails(capsys, checks.check_rank_device(None), "not set")


def accumulation_report(max_error=1e-8, all_reduces=1, buckets=1, unscaled=0.03, over_ranks=0.01):
    return {"max_error": max_error, "all_reduces": all_reduces, "buckets": buckets, "error_unscaled": unscaled,
            "error_over_ranks": over_ranks}


def test_accumulation_check(capsys):
    assert checks.check_accumulation([accumulation_report()] * 2, 4)
    verdict(capsys)
    # Unusual but right: 3 buckets, each all-reduced once; reports without the optional errors.
    assert checks.check_accumulation([{"max_error": 2e-6, "all_reduces": 3, "buckets": 3}] * 4, 4)
    assert "3 buckets" in verdict(capsys)
    # No no_sync (or the forward outside it): every micro batch's backward all-reduced.
    fails(capsys, checks.check_accumulation([accumulation_report(all_reduces=4)] * 2, 4),
          "4 all-reduces in a window of 4", "skip the synchronization")
    # no_sync on every micro batch, the last included: nothing was ever averaged.
    fails(capsys, checks.check_accumulation([accumulation_report(0.02, all_reduces=0)] * 2, 4),
          "no gradient was all-reduced")
    # Loss not divided by the accumulation steps: the step is 4x too large.
    fails(capsys, checks.check_accumulation([accumulation_report(0.03, unscaled=1e-8)] * 2, 4),
          "4x too large", "divide each micro batch's loss by 4")
    # Divided by world_size too: DDP already averages over the ranks.
    fails(capsys, checks.check_accumulation([accumulation_report(0.01, over_ranks=1e-8)] * 2, 4),
          "2x too small", "already averages")
    # The first micro batch synchronized, the rest only accumulated: one all-reduce, wrong weights.
    fails(capsys, checks.check_accumulation([accumulation_report(0.004)] * 2, 4), "must be the last")
    # Right on rank 0 only: every rank's report counts.
    fails(capsys, checks.check_accumulation([accumulation_report(), accumulation_report(0.004)], 4),
          "differ from one big-batch step by 0.004")
    # One rank cannot show any of this.
    fails(capsys, checks.check_accumulation([accumulation_report()], 4), "start 2 or more")
    fails(capsys, checks.check_accumulation([None, None], 4), "did not finish")
    assert not checks.check_accumulation(None, 4)
    # The prediction of the all-reduces per window: graded when reported.
    assert checks.check_accumulation([{**accumulation_report(), "predicted": 1}] * 2, 4)
    verdict(capsys)
    fails(capsys, checks.check_accumulation([{**accumulation_report(), "predicted": 4}] * 2, 4),
          "you predicted 4", "fill 1 bucket")
    fails(capsys, checks.check_accumulation([{**accumulation_report(), "predicted": None}] * 2, 4),
          "set predicted_all_reduces")


def test_wrap_prediction_check(capsys):
    before, after = ["c24a29b5fafd", "e081c7c4da36"], ["c24a29b5fafd", "c24a29b5fafd"]
    assert checks.check_wrap_prediction([0, 0], after, before)  # rank numbers, as the exercise asks
    assert "rank 0's weights" in verdict(capsys)
    assert checks.check_wrap_prediction([before[0]] * 2, after, before)  # fingerprints are taken too
    verdict(capsys)
    fails(capsys, checks.check_wrap_prediction([0, 1], after, before), "each rank keeps its own weights")
    fails(capsys, checks.check_wrap_prediction([1, 1], after, before), "rank 1's weights")
    fails(capsys, checks.check_wrap_prediction([0, 2], after, before), "names rank 2")
    fails(capsys, checks.check_wrap_prediction(0, after, before), "give a list")
    assert checks.check_wrap_prediction(("c24a29b5fafd0123", "c24a29b5fafd"), after, before)  # longer, a tuple
    verdict(capsys)
    fails(capsys, checks.check_wrap_prediction(before, after, before), "each rank keeps its own weights")
    fails(capsys, checks.check_wrap_prediction([before[1]] * 2, after, before), "rank 1's weights")
    fails(capsys, checks.check_wrap_prediction([before[0]], after, before), "has 1 for 2 ranks")
    fails(capsys, checks.check_wrap_prediction(before[0], after, before), "give a list")
    fails(capsys, checks.check_wrap_prediction(["abc", "abc"], after, before), "not what the ranks print")
    fails(capsys, checks.check_wrap_prediction(None, after, before), "`after_wrap` is not set")
    fails(capsys, checks.check_wrap_prediction(after, [after[0], None], before), "did not run on every rank")
    fails(capsys, checks.check_wrap_prediction(after[:1], after[:1], before[:1]), "start 2 or more")


def uneven_reports(gradient=(0.5, -2.0, 1.0), lrs=(0.1, 0.2), grads=("g1", "g1")):
    import numpy as np

    g = np.array(gradient)
    return [{"lr": lr, "grads": fp, "grad": g, "step": -lr * g} for lr, fp in zip(lrs, grads)]


def test_uneven_step_check(capsys):
    """Exercise 1b's second answer: rank 1's weights minus rank 0's after the uneven step, as a multiple of g."""
    measured = uneven_reports()
    assert checks.check_uneven_step(-0.1, measured)
    line = verdict(capsys)
    assert "-0.100 x g" in line and "a further 0.1 x g" in line
    assert checks.check_uneven_step(-0.101, measured)  # within the tolerance
    verdict(capsys)
    fails(capsys, checks.check_uneven_step(-0.105, measured), "not what the ranks hold")  # outside it
    # The guess that DDP keeps the weights equal whatever the optimizers do.
    fails(capsys, checks.check_uneven_step(0, measured), "equal weights")
    # A step along the gradient, or the sign turned round.
    fails(capsys, checks.check_uneven_step(0.1, measured), "look at the sign")
    # Rank 1's whole step, or half the gap: not the difference.
    fails(capsys, checks.check_uneven_step(-0.2, measured), "not what the ranks hold")
    fails(capsys, checks.check_uneven_step(-0.05, measured), "not what the ranks hold")
    # The gap counted in units of lr x g, not of g.
    fails(capsys, checks.check_uneven_step(-1, measured), "in units of 0.1 x g")
    # Graded against the ranks: with rank 1 at 3 lr, k is -0.2.
    assert checks.check_uneven_step(-0.2, uneven_reports(lrs=(0.1, 0.3)))
    assert "a further 0.2 x g" in verdict(capsys)
    fails(capsys, checks.check_uneven_step(-0.1, uneven_reports(lrs=(0.1, 0.3))), "not what the ranks hold")
    fails(capsys, checks.check_uneven_step("-0.1", measured), "give one number")
    fails(capsys, checks.check_uneven_step(True, measured), "give one number")
    fails(capsys, checks.check_uneven_step(None, measured), "`weight_gap` is not set")
    fails(capsys, checks.check_uneven_step(-0.1, uneven_reports(grads=("g1", "g2"))), "different gradients")
    fails(capsys, checks.check_uneven_step(-0.1, [measured[0], None]), "did not run")
    fails(capsys, checks.check_uneven_step(-0.1, measured[:1]), "start 2 or more")


def test_in_sync_check_needs_two_ranks(capsys):
    fails(capsys, checks.check_in_sync(["abc"]), "start 2 or more")
    assert checks.check_in_sync(["abc"] * 3)
    verdict(capsys)



def learner_buckets(order=-1, default_first=2**20, strict=False, unit=2**20, frozen=False, per_element=False,
                    horovod=False):
    """A learner's predict_buckets, written out as one would, with one of the usual mistakes."""
    def predict(model, bucket_cap_mb=None):
        caps = [default_first, 25 * unit] if bucket_cap_mb is None else [int(bucket_cap_mb * unit)] * 2
        buckets, names, size = [], [], 0
        for name, p in list(model.named_parameters())[::order]:
            if not p.requires_grad and not frozen:
                continue
            nbytes = p.numel() if per_element else p.numel() * p.element_size()
            cap = caps[min(len(buckets), 1)]
            if horovod and names and size + nbytes > cap:
                buckets.append(names)
                names, size = [], 0
            names.append(name)
            size += nbytes
            if not horovod and (size > cap if strict else size >= cap):
                buckets.append(names)
                names, size = [], 0
        return buckets + ([names] if names else [])
    return predict


def test_bucket_check_names_each_wrong_rule(capsys):
    assert checks.check_ddp_buckets(learner_buckets())
    verdict(capsys)
    fails(capsys, checks.check_ddp_buckets(learner_buckets(order=1)), "last layer first", "bucket_cap_mb=1")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(default_first=25 * 2**20)), "first bucket is smaller")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(strict=True)), "reach the cap", "512x512")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(unit=10**6)), "1024 * 1024")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(frozen=True)), "requires_grad=False")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(per_element=True)), "4 bytes per element")
    fails(capsys, checks.check_ddp_buckets(learner_buckets(horovod=True)), "Horovod's fusion")
    fails(capsys, checks.check_ddp_buckets(lambda model, cap: [[n for n, _ in model.named_parameters()][::-1]]),
          "you made", "DDP makes")
    fails(capsys, checks.check_ddp_buckets(lambda model, cap: 1 / 0), "ZeroDivisionError")

    def untouched(model, bucket_cap_mb=None):
        raise NotImplementedError
    fails(capsys, checks.check_ddp_buckets(untouched), "NotImplementedError")


def test_bucket_check_takes_autograds_ready_order(capsys):
    """Inside a convolution autograd makes the weight's gradient before the bias's, the order DDP records: the
    same buckets as the parameters reversed at every cap the check uses, so both pass."""
    import torch.nn as nn

    def predict(model, bucket_cap_mb=None):
        buckets = learner_buckets()(model, bucket_cap_mb)
        conv = [name for name, module in model.named_modules() if isinstance(module, nn.Conv2d)]
        ordered = []
        for bucket in buckets:
            bucket = list(bucket)
            for layer in conv:  # the weight before the bias, where both are in this bucket
                if f"{layer}.bias" in bucket and f"{layer}.weight" in bucket:
                    i, j = bucket.index(f"{layer}.bias"), bucket.index(f"{layer}.weight")
                    bucket[i], bucket[j] = bucket[j], bucket[i]
            ordered.append(bucket)
        return ordered
    assert checks.check_ddp_buckets(predict)
    assert verdict(capsys).startswith("PASS: ")
    # A bucket that holds the right names but one too many is still wrong.
    fails(capsys, checks.check_ddp_buckets(lambda model, cap: [b + ["0.bias"] for b in learner_buckets()(model, cap)]),
          "you made", "DDP makes")


def test_bucket_check_takes_an_unusual_right_answer(capsys):
    """Tuples, a running total kept in a list, the caps worked out per bucket: still DDP's buckets."""
    import itertools

    def predict(model, bucket_cap_mb=None):
        sizes = [(n, p.nelement() * p.element_size()) for n, p in reversed(list(model.named_parameters()))
                 if p.requires_grad]
        out, current = [], []
        for name, nbytes in sizes:
            current.append((name, nbytes))
            cap = (2**20 if not out else 25 * 2**20) if bucket_cap_mb is None else bucket_cap_mb * 1024 * 1024
            if sum(b for _, b in current) >= cap:
                out.append(tuple(n for n, _ in current))
                current = []
        return out + [tuple(n for n, _ in current)] * bool(current) + list(itertools.islice([], 0))
    assert checks.check_ddp_buckets(predict)
    assert verdict(capsys).startswith("PASS: ")


def profiled(first_start=0.011, last_start=0.205, backward_end=0.2, reductions=2):
    """One rank's ddp_events rows: three backward ops, then `reductions` all-reduces."""
    rows = [("backward", "Addmm", 0.0, 0.01), ("backward", "Convolution", 0.01, 0.15),
            ("backward", "Convolution", 0.15, backward_end)]
    starts = [first_start, last_start][:reductions] if reductions <= 2 else [first_start] * reductions
    return rows + [("all-reduce", f"bucket {i}", start, start + 0.002) for i, start in enumerate(starts)]


def test_bucket_record_check(capsys):
    from scaledl import models

    model, recorded = models.torch_cnn(width=64), "3216936, 297984"  # DDP's record for this model at 1 MiB
    right = learner_buckets()
    assert checks.check_bucket_record(right, model, 1, recorded, [profiled(), profiled()])
    assert "3,216,936, 297,984 bytes" in verdict(capsys)
    # Unusual but right: the record as a list, on a GPU (its all-reduces on the device's clock: no during-check).
    assert checks.check_bucket_record(right, model, 1, [3216936, 297984], [profiled(first_start=0.3, last_start=0.3)],
                                      device_type="cuda")
    verdict(capsys)
    # Forward order: other bytes than DDP recorded.
    fails(capsys, checks.check_bucket_record(learner_buckets(order=1), model, 1, recorded, [profiled()] * 2),
          "DDP recorded 3,216,936, 297,984", "Exercise 2's check")
    # Every parameter in one bucket: the first iteration's buckets, not the rebuilt ones.
    fails(capsys, checks.check_bucket_record(lambda m, cap: [[n for n, _ in m.named_parameters()][::-1]], model, 1,
                                             recorded, [profiled()] * 2), "3,514,920 bytes")
    # Names that are not the model's.
    fails(capsys, checks.check_bucket_record(lambda m, cap: [["fc.weight"]], model, 1, recorded, [profiled()] * 2),
          "not a parameter")
    # The live side: a rank with one all-reduce, a last bucket before backward ended, a first one after it.
    fails(capsys, checks.check_bucket_record(right, model, 1, recorded, [profiled(), profiled(reductions=1)]),
          "rank 1 made 1 all-reduce")
    fails(capsys, checks.check_bucket_record(right, model, 1, recorded, [profiled(last_start=0.19)] * 2),
          "cannot exist yet")
    fails(capsys, checks.check_bucket_record(right, model, 1, recorded, [profiled(first_start=0.2)] * 2),
          "only after backward ended")
    fails(capsys, checks.check_bucket_record(right, model, 1, None, [profiled()] * 2), "run the profiled backward")
    fails(capsys, checks.check_bucket_record(right, model, 1, recorded, [profiled(), None]), "every rank")
    fails(capsys, checks.check_bucket_record(untouched, model, 1, recorded, [profiled()] * 2), "NotImplementedError")
    fails(capsys, checks.check_bucket_record(None, model, 1, recorded, [profiled()] * 2), "not set")
