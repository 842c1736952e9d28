"""scaledl: scale deep-learning training from one device to many.

The names a training script of your own needs:

    import scaledl
    config = scaledl.parse_args()                       # --epochs, --batch-size, --lr, ...
    dist = scaledl.setup(timeout_s=config.timeout)      # rank, device, backend, process group
    data = scaledl.load_dataset(config.dataset)         # embedded MNIST by default
    ...
    scaledl.teardown()

Importing scaledl imports no framework: each is imported by the function that needs it.

The package's rooms, lowest floor first (docs/architecture.md draws them from the imports):

* `scaledl` itself: the helpers above and the rest of what a training script of your own may
  import (`sharding`, `checkpoint`, `metrics`, `timing`, `devices`, `precision`, `models`,
  `datasets`, `zero_memory`, ...).  They import nothing from the rooms below.
* `scaledl.ladder`: the rungs, one runnable module each, over `scaledl.ladder.harness`.
* `scaledl.hpc`: launching ranks and knowing the machine (launchers, systems, job scripts, binding).
* `scaledl.perf`: the step-time predictor and the benchmarks.
* `scaledl.workshop`: what the lessons run on (live ranks, each lesson's checks, figures).
* `scaledl.cli`: the `scaledl` command.

A module imports only from its own room and the rooms listed before it.
"""
from scaledl.config import Config, ConfigError, build_parser, config_from_args, parse_args
from scaledl.datasets import DataError, Dataset, load_dataset
from scaledl.distributed import Distributed, setup, teardown
from scaledl.launch_env import LaunchError, detect
from scaledl.log import get_logger, progress
from scaledl.metrics import History, torch_gather
from scaledl.timing import Stopwatch

__version__ = "0.1.0"

__all__ = [
    "Config", "ConfigError", "DataError", "Dataset", "Distributed", "History", "LaunchError", "Stopwatch",
    "build_parser", "config_from_args", "detect", "get_logger", "load_dataset", "parse_args", "progress",
    "setup", "teardown", "torch_gather",
]
