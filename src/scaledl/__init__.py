"""scaledl: scale deep-learning training from one device to many.

The names a training script of your own needs:

    import scaledl
    config = scaledl.parse_args()                       # --epochs, --batch-size, --lr, ...
    dist = scaledl.setup(timeout_s=config.timeout)      # rank, device, backend, process group
    data = scaledl.load_dataset(config.dataset)         # embedded MNIST by default
    ...
    scaledl.teardown()

Importing scaledl imports no framework: each is imported by the function that needs it.
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
