"""The DeepSpeed rung's real run, counting the blocks' calls of DeepSpeed's own checkpoint and reading
the settings its config gave DeepSpeed's activation checkpointing.  Reports both.

    deepspeed --num_gpus 2 --module ds_checkpoint_probe --model gpt --recompute full --max-steps 3 ...
"""
import deepspeed
from deepspeed.runtime.activation_checkpointing import checkpointing

from report import report
from scaledl.ladder import deepspeed as rung
from scaledl.ladder import harness

calls = [0]
plain = deepspeed.checkpointing.checkpoint


def counted(function, *args):
    calls[0] += 1
    return plain(function, *args)


deepspeed.checkpointing.checkpoint = counted  # what the rung hands the blocks (layers.use_checkpoint)
code = rung.main()
report(calls=calls[0], cpu_checkpoint=checkpointing.CPU_CHECKPOINT,
       partition_activations=checkpointing.PARTITION_ACTIVATIONS)
harness.exit_process(code)
