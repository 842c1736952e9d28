"""The exercises' checks, one module per lesson: each check prints one line, PASS or FAIL, that says what
is right, or what is wrong and how to fix it, and returns True or False.

A notebook calls `checks.check_...` after the learner's code; the tests feed each check right and wrong
answers alike.  On what an untouched exercise leaves behind, no check passes: a name never set prints
NOT ATTEMPTED YET (`common._unfinished`), a NotImplementedError FAILs.  `common` holds the verdict line
and the reading of a name off every live rank.

May import: the helpers (scaledl.*), scaledl.hpc, scaledl.perf and the rest of scaledl.workshop.
"""
from scaledl.workshop.checks.common import from_ranks, gather
from scaledl.workshop.checks.lesson_00 import check_binding_launch, check_binding_verdicts
from scaledl.workshop.checks.lesson_01 import (check_parallelism_choice, check_training_days, check_training_memory,
                                              check_training_nodes)
from scaledl.workshop.checks.lesson_02 import (SimulatedDevice, check_samples_per_s, check_step_prediction,
                                               check_stopwatch_prediction)
from scaledl.workshop.checks.lesson_03 import (check_all_reduce, check_ring_prediction, check_ring_steps,
                                               check_sharding, ring_allreduce_s)
from scaledl.workshop.checks.lesson_04 import check_fusion, check_horovod_sync, horovod_fuse
from scaledl.workshop.checks.lesson_05 import check_resumed_start, check_summed_step, horovod_gradient_names
from scaledl.workshop.checks.lesson_06 import (check_accumulation, check_bucket_record, check_ddp_buckets,
                                               check_in_sync, check_rank_device, check_uneven_step,
                                               check_wrap_prediction)
from scaledl.workshop.checks.lesson_07 import check_efficiency, check_predicted_efficiency, check_warmup
from scaledl.workshop.checks.lesson_08 import (batch_triple_answer, check_batch_pair, check_batch_triple,
                                               check_deepspeed_config, check_stage2_window, check_window_prediction,
                                               deepspeed_batch)
from scaledl.workshop.checks.lesson_09 import check_engine_bytes, check_fsdp_collectives, check_zero_formula
from scaledl.workshop.checks.lesson_10 import (check_activation_prediction, check_bf16_state, check_flops_per_token,
                                               check_recompute, check_selective_values)
from scaledl.workshop.checks.lesson_11 import (check_bubble, check_interleaved_bubble, check_peak_in_flight,
                                               check_pipeline, check_pipeline_backward)
from scaledl.workshop.checks.lesson_12 import (check_allreduce_count, check_crossing_groups, check_rank_groups,
                                               check_tensor_parallel_mlp)
from scaledl.workshop.checks.lesson_13 import check_ring_attention, check_sp_block_bytes
from scaledl.workshop.checks.lesson_14 import check_layout, check_layouts_here, check_memory_per_rank

__all__ = [
    "check_allreduce_count", "check_crossing_groups",
    "batch_triple_answer", "check_accumulation", "check_batch_pair", "check_batch_triple",
    "check_activation_prediction",
    "check_all_reduce", "check_binding_launch", "check_memory_per_rank", "check_flops_per_token", "check_recompute",
    "check_bf16_state", "check_selective_values", "check_binding_verdicts", "check_bubble",
    "check_bucket_record", "check_ddp_buckets", "check_deepspeed_config", "check_efficiency", "check_engine_bytes",
    "check_layouts_here", "check_fsdp_collectives", "check_fusion", "check_horovod_sync", "check_in_sync",
    "check_interleaved_bubble", "check_layout", "check_parallelism_choice", "check_peak_in_flight",
    "check_pipeline", "check_pipeline_backward", "check_predicted_efficiency", "check_rank_device",
    "check_rank_groups", "check_ring_attention", "check_ring_prediction", "check_sp_block_bytes", "check_samples_per_s",
    "check_resumed_start", "check_ring_steps", "check_sharding", "check_step_prediction", "check_stopwatch_prediction",
    "check_summed_step", "check_uneven_step",
    "check_stage2_window", "check_tensor_parallel_mlp", "check_training_memory", "check_training_days",
    "check_training_nodes",
    "check_warmup", "check_window_prediction", "check_wrap_prediction", "check_zero_formula", "deepspeed_batch",
    "from_ranks", "gather", "horovod_fuse", "horovod_gradient_names", "ring_allreduce_s", "SimulatedDevice",
]
