"""Memory: what each rank keeps at ZeRO stages 0-3 and with offload, three ways.

1. counted: bytes of parameters, gradients and optimizer states in a live DeepSpeed
   engine's tensors on each rank (`scaledl.zero_memory.measure`), for the ladder's CNN;
2. predicted: `scaledl.zero_memory.predict` for the same parameter count, ranks and stage
   (fp32 SGD with momentum, as trained here), and the paper's formula for mixed-precision
   Adam (2 + 2 + 12 bytes per parameter), which is what the literature quotes;
3. DeepSpeed's own estimator (`estimate_zero2_model_states_mem_needs`,
   `estimate_zero3_model_states_mem_needs`: the functions behind the `..._all_live` and
   `..._all_cold` printers), which also assumes mixed-precision Adam and adds its buffers.

`predict_table` is the predictor for any parameter count and world size; the second table
applies it to the paper's example (7.5B parameters on 64 ranks) unless told otherwise.
"""
from __future__ import annotations

from scaledl import zero_memory
from scaledl.perf.bench.common import Options, headline, result, rounded
from scaledl.perf.bench.launch import run_worker
from scaledl.perf.bench.variants import launcher_for

VARIANTS = ("deepspeed", "zero1", "zero2", "zero3", "zero3_offload")
MIXED_ADAM = {"param_bytes": 2, "grad_bytes": 2, "optimizer_bytes": 12}


def deepspeed_estimate(num_params: int, world_size: int, stage: int, offload: bool = False,
                       largest_layer_params: int | None = None) -> int | None:
    """Bytes per device from DeepSpeed's estimators (stages 2 and 3 only; None otherwise).

    Called with one rank per node so that `world_size` ranks share the states as here."""
    if stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        return estimate_zero2_model_states_mem_needs(num_params, world_size, 1, cpu_offload=offload)[1]
    if stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        largest = largest_layer_params if largest_layer_params is not None else num_params
        return estimate_zero3_model_states_mem_needs(num_params, largest, world_size, 1, cpu_offload=offload,
                                                     cpu_offload_params=offload)[1]
    return None


def predict_table(num_params: int, world_size: int, largest_layer_params: int | None = None) -> list[dict]:
    """Per-rank model-state bytes at every stage for any model size and world size."""
    rows = []
    for stage in range(4):
        fp32_sgd = zero_memory.predict(num_params, world_size, stage)
        mixed = zero_memory.predict(num_params, world_size, stage, **MIXED_ADAM)
        rows.append({"stage": stage, "params": num_params, "world_size": world_size,
                     "fp32_sgd_GB": rounded(fp32_sgd["total"] / 1e9),
                     "paper_mixed_adam_GB": rounded(mixed["total"] / 1e9),
                     "deepspeed_estimate_GB": _gb(deepspeed_estimate(num_params, world_size, stage,
                                                                     largest_layer_params=largest_layer_params or 0))})
    return rows


def _gb(value):
    return None if value is None else rounded(value / 1e9)


def expected_after_backward(num_params: int, world_size: int, stage: int) -> dict:
    """`predict`, as counted after backward: stage 1 has reduced its gradients to its
    partition by then (it holds them all, the paper's G*Psi, only during backward)."""
    expected = zero_memory.predict(num_params, world_size, stage)
    if stage == 1:
        expected["grads"] = zero_memory.predict(num_params, world_size, 2)["grads"]
        expected["total"] = expected["params"] + expected["grads"] + expected["optimizer"]
    return expected


def run(options: Options) -> dict:
    ranks = options.ranks
    measured = run_worker(launcher_for("deepspeed", options.quick), ranks, "memory", ["--variants", *VARIANTS,
                                                         "--micro-batch-size", options.micro_batch_size],
                          options.out_dir / "memory" / "counted.json", threads=options.threads)
    num_params = measured["num_params"]
    rows = []
    for name, counted in measured["counted"].items():
        stage, offload = counted["stage"], name.endswith("offload")
        expected = expected_after_backward(num_params, ranks, stage)
        estimate = deepspeed_estimate(num_params, ranks, stage, offload, largest_layer_params=_largest_layer())
        host = expected["optimizer"] + (expected["params"] if offload else 0)
        rows.append({"variant": name, "stage": stage, "params_B": counted["params"], "grads_B": counted["grads"],
                     "optimizer_B": counted["optimizer"], "counted_B": counted["total"],
                     "predicted_B": expected["total"],
                     "counted_over_predicted": rounded(counted["total"] / expected["total"]),
                     "offloaded_to_host_B": host if offload else 0,
                     "paper_mixed_adam_B": zero_memory.predict(num_params, ranks, stage, **MIXED_ADAM)["total"],
                     "deepspeed_estimate_B": estimate})
    worst = max(rows, key=lambda row: abs(row["counted_over_predicted"] - 1))
    zero3 = next(row for row in rows if row["variant"] == "zero3")
    saving = rows[0]["counted_B"] / zero3["counted_B"]
    text = (f"counted/predicted: worst {worst['counted_over_predicted']:.4f} ({worst['variant']}), "
            f"zero3 {zero3['counted_over_predicted']:.4f}; "
            f"ZeRO-3 keeps {1 / saving:.3f} of stage 0's bytes on {ranks} ranks")
    return result("memory", f"ZeRO model states per rank, {num_params:,} parameters on {ranks} ranks (bytes)",
                  ["variant", "stage", "params_B", "grads_B", "optimizer_B", "counted_B", "predicted_B",
                   "counted_over_predicted", "offloaded_to_host_B", "paper_mixed_adam_B", "deepspeed_estimate_B"], rows,
                  headline("worst counted/predicted", worst["counted_over_predicted"], "= 1.00 within 0.5%",
                           abs(worst["counted_over_predicted"] - 1) <= 0.005, text=text),
                  tables={f"Predicted per rank for {options.predict_params:,} parameters on "
                          f"{options.predict_world_size} ranks (GB)": predict_table(options.predict_params,
                                                                                     options.predict_world_size)},
                  notes=["counted after backward: stage 1 then holds only its partition of the gradients "
                         "(all of them during backward), so it is predicted so",
                         "DeepSpeed estimates device bytes for mixed-precision Adam: stage 2 and 3 only; stage 3 adds "
                         "4 bytes per parameter of the largest layer (left out of the predictor table)",
                         "with offload the optimizer states and parameters live in host memory: counted here, "
                         "not on the device"],
                  num_params=num_params, ranks=ranks)


def _largest_layer() -> int:
    from scaledl import models

    return max(sum(p.numel() for p in layer.parameters(recurse=False)) for layer in models.torch_cnn().modules())


def plot(data: dict, fig) -> None:
    ax = fig.subplots()
    rows = data["rows"]
    x = range(len(rows))
    bottom = [0] * len(rows)
    for part, color in (("params_B", "tab:blue"), ("grads_B", "tab:orange"), ("optimizer_B", "tab:green")):
        values = [row[part] / 1e6 for row in rows]
        ax.bar(x, values, bottom=bottom, color=color, label=f"counted {part[:-2]}")
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.plot(x, [row["predicted_B"] / 1e6 for row in rows], "k_", markersize=30, mew=2, label="predicted")
    ax.set_xticks(list(x), [row["variant"] for row in rows])
    ax.set(ylabel="MB per rank", title=f"{data['num_params']:,} parameters on {data['ranks']} ranks")
    ax.legend(fontsize=8)
