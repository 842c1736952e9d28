"""The one configuration every rung shares, as a dataclass and as command-line flags.

    config = Config(num_epochs=2, lr=0.01)            # in a notebook
    config = parse_args(["--epochs", "2"])            # in a script (sys.argv by default)

Each field is one flag with the same name in every framework.  Values are checked in one
place (`Config.__post_init__`), so a notebook and a command line get the same one-line error.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import sys
from dataclasses import dataclass, field

from scaledl.errors import CHECK_FLAGS_VAR, FlagsChecked, UserError
from scaledl.models import GPT_DEFAULT, GPT_PRESETS, MODELS, RECOMPUTE, TRANSFORMER_DEFAULTS

DATASETS = ("mnist-embedded", "mnist", "cifar10", "synthetic", "tokens", "text")
TRANSFORMER_FLAGS = tuple(TRANSFORMER_DEFAULTS)  # the sizes: width, depth, heads, seq_len
# Every flag about the model: a rung that trains the CNN only leaves them all out.
MODEL_FLAGS = ("model", *TRANSFORMER_FLAGS, "preset", "recompute")
MODEL_DATA = {"cnn": ("mnist-embedded", "mnist", "cifar10", "synthetic"), "transformer": ("tokens",), "gpt": ("text",)}
PRECISIONS = ("fp32", "bf16", "fp16")


class ConfigError(UserError, ValueError):
    """A bad value; the message names the flag."""


@dataclass
class Config:
    num_epochs: int = field(default=3, metadata={"flag": "--epochs", "help": "passes over the training set"})
    batch_size: int = field(default=64, metadata={
        "flag": "--batch-size", "help": "micro batch per rank; the global batch is this times --grad-accum times "
        "the data-parallel ranks"})
    grad_accum: int = field(default=1, metadata={
        "flag": "--grad-accum", "help": "micro batches whose gradients add up before each optimizer step (the "
        "data-parallel ranks reduce them once, after the last)"})
    lr: float = field(default=0.03, metadata={
        "flag": "--lr", "help": "learning rate for a global batch of --base-batch-size"})
    base_batch_size: int = field(default=64, metadata={
        "flag": "--base-batch-size", "help": "global batch that --lr is tuned for (with --scale-lr)"})
    scale_lr: bool = field(default=True, metadata={
        "flag": "--scale-lr", "help": "scale lr linearly with global_batch_size / base_batch_size"})
    warmup_epochs: float = field(default=0.5, metadata={
        "flag": "--warmup-epochs", "help": "linear learning-rate warm-up (0 switches it off)"})
    momentum: float = field(default=0.9, metadata={"flag": "--momentum", "help": "SGD momentum"})
    seed: int = field(default=0, metadata={"flag": "--seed", "help": "seed for model init and data order"})
    precision: str = field(default="fp32", metadata={
        "flag": "--precision", "help": "fp32, bf16, or fp16 with loss scaling", "choices": PRECISIONS})
    model: str = field(default="cnn", metadata={
        "flag": "--model", "help": "cnn (images), transformer (classifies token sequences) or gpt (a language "
        "model on text); the last two on PyTorch rungs", "choices": MODELS})
    preset: str | None = field(default=None, metadata={
        "flag": "--preset", "help": f"gpt: a size by name (default {GPT_DEFAULT}; scaledl.models.GPT_PRESETS); "
        "--width, --depth, --heads and --seq-len change one dimension of it", "choices": tuple(GPT_PRESETS)})
    recompute: str = field(default="none", metadata={
        "flag": "--recompute", "help": "transformer, gpt: run each block's forward again in backward instead of "
        "keeping its activations: none, selective (the cheap operations) or full (all of it)",
        "choices": RECOMPUTE})
    width: int | None = field(default=None, metadata={
        "flag": "--width", "help": f"transformer: model width (default {TRANSFORMER_DEFAULTS['width']})"})
    depth: int | None = field(default=None, metadata={
        "flag": "--depth", "help": f"transformer: number of blocks (default {TRANSFORMER_DEFAULTS['depth']})"})
    heads: int | None = field(default=None, metadata={
        "flag": "--heads", "help": f"transformer: attention heads (default {TRANSFORMER_DEFAULTS['heads']})"})
    seq_len: int | None = field(default=None, metadata={
        "flag": "--seq-len", "help": f"transformer: tokens per sample (default {TRANSFORMER_DEFAULTS['seq_len']})"})
    dataset: str | None = field(default=None, metadata={
        "flag": "--dataset", "help": "data set to train on (default: mnist-embedded for the CNN, tokens for the "
        "transformer, text for gpt)", "choices": DATASETS})
    data_dir: str | None = field(default=None, metadata={
        "flag": "--data-dir", "help": "where staged MNIST / CIFAR-10 files are (default: $SCALEDL_DATA)"})
    train_limit: int | None = field(default=None, metadata={
        "flag": "--train-limit", "help": "use only the first N training samples (quick runs)"})
    tensorboard: bool = field(default=False, metadata={
        "flag": "--tensorboard", "help": "also write TensorBoard events to OUT_DIR/tensorboard"})
    log_interval: int = field(default=20, metadata={
        "flag": "--log-interval", "help": "steps between metric reductions"})
    out_dir: str = field(default="runs/latest", metadata={
        "flag": "--out-dir", "help": "metrics, checkpoints and plots go here"})
    checkpoint_every: int = field(default=0, metadata={
        "flag": "--checkpoint-every", "help": "save a checkpoint every N steps (0: only at the end)"})
    keep_checkpoints: int = field(default=1, metadata={
        "flag": "--keep-checkpoints", "help": "how many checkpoints to keep in OUT_DIR (the newest)"})
    resume: bool = field(default=False, metadata={"flag": "--resume", "help": "continue from OUT_DIR/checkpoint.pt"})
    overwrite: bool = field(default=False, metadata={
        "flag": "--overwrite", "help": "replace the run already in OUT_DIR (default: refuse)"})
    on_nonfinite: str = field(default="stop", metadata={
        "flag": "--on-nonfinite", "help": "when gradients become NaN/inf: stop the run (at the next log line or "
        "checkpoint, naming the step; nothing after it is saved), or skip the step (a host sync every step)",
        "choices": ("stop", "skip")})
    max_steps: int | None = field(default=None, metadata={
        "flag": "--max-steps", "help": "stop after N optimizer steps"})
    device: str | None = field(default=None, metadata={
        "flag": "--device", "help": "cuda, xpu, mps or cpu (default: picked per rank)"})
    backend: str | None = field(default=None, metadata={
        "flag": "--backend", "help": "nccl, xccl, ccl, gloo or mpi (default: picked from the device)"})
    timeout: float = field(default=300.0, metadata={
        "flag": "--timeout", "help": "seconds a collective may wait for a peer"})

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.metadata['flag']} must be a finite number, got {value}")
        if not isinstance(self.out_dir, str) or not self.out_dir.strip():
            raise ConfigError("--out-dir is empty (an unset variable in a job script?): name a directory")
        if self.data_dir is not None and not self.data_dir.strip():
            raise ConfigError("--data-dir is empty (an unset variable in a job script?): name a directory")
        positive = ["num_epochs", "batch_size", "grad_accum", "base_batch_size", "log_interval", "timeout", "lr",
                    "keep_checkpoints"]
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"{flag_of(name)} must be > 0, got {getattr(self, name)}")
        for name in ["warmup_epochs", "checkpoint_every", "momentum"]:
            if getattr(self, name) < 0:
                raise ConfigError(f"{flag_of(name)} must be >= 0, got {getattr(self, name)}")
        for name in ["train_limit", "max_steps"]:
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ConfigError(f"{flag_of(name)} must be > 0, got {getattr(self, name)}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        self._check_model()
        if self.dataset not in DATASETS:
            raise ConfigError(f"--dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.tensorboard and importlib.util.find_spec("tensorboard") is None:
            # PyTorch's SummaryWriter needs it; TensorFlow 2.21 (Python 3.12+) does not bring it.
            raise ConfigError("--tensorboard needs the tensorboard package, which is not installed: pip install "
                              "tensorboard (make setup installs it), or leave out --tensorboard")

    def _check_model(self) -> None:
        """--model and its data set, size and recompute flags agree; fills in the model's defaults."""
        if self.model not in MODELS:
            raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.dataset is not None and self.dataset in DATASETS and self.dataset not in MODEL_DATA[self.model]:
            owner = next(model for model, names in MODEL_DATA.items() if self.dataset in names)
            raise ConfigError(f"--dataset {self.dataset} is for --model {owner}; --model {self.model} trains on "
                              f"{' or '.join(MODEL_DATA[self.model])} (leave out --dataset for its default)")
        self.dataset = self.dataset or MODEL_DATA[self.model][0]
        given = [name for name in TRANSFORMER_FLAGS if getattr(self, name) is not None]
        if self.model == "cnn":
            extra = [flag_of(n) for n in given] + (["--preset"] if self.preset else []) + \
                (["--recompute"] if self.recompute != "none" else [])
            if extra:
                raise ConfigError(f"{', '.join(extra)} {'is' if len(extra) == 1 else 'are'} for --model transformer "
                                  "or gpt: add one, or leave them out")
            return
        if self.preset is not None and self.model != "gpt":
            raise ConfigError(f"--preset names a size of --model gpt; --model {self.model} takes --width, --depth, "
                              "--heads and --seq-len")
        if self.preset is not None and self.preset not in GPT_PRESETS:
            raise ConfigError(f"--preset must be one of {', '.join(GPT_PRESETS)}, got {self.preset!r}")
        if self.model == "gpt":
            self.preset = self.preset or GPT_DEFAULT
        defaults = GPT_PRESETS[self.preset] if self.model == "gpt" else TRANSFORMER_DEFAULTS
        for name in TRANSFORMER_FLAGS:
            if getattr(self, name) is None:
                setattr(self, name, defaults[name])
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ConfigError(f"{flag_of(name)} must be a whole number > 0, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ConfigError(f"--width {self.width} must be a multiple of --heads {self.heads} (each head gets "
                              "width/heads features)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def flag_of(name: str) -> str:
    return next(f.metadata["flag"] for f in dataclasses.fields(Config) if f.name == name)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block) and exits with status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser(prog: str | None = None, description: str | None = None,
                 without: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """Flags for every Config field but those in `without` (fields a rung does not honour: it
    refuses them rather than ignoring them); a rung adds its own flags to the parser it gets back."""
    parser = OneLineParser(prog=prog, description=description,
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(Config):
        if f.name in without:
            continue
        kwargs = {"dest": f.name, "default": f.default, "help": f.metadata["help"]}
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if f.type in ("bool",):
            # `--scale-lr` alone means true; `--scale-lr false` switches it off.
            kwargs.update(type=_parse_bool, nargs="?", const=True)
        elif f.type in ("int", "int | None"):
            kwargs["type"] = int
        elif f.type in ("float",):
            kwargs["type"] = float
        parser.add_argument(f.metadata["flag"], **kwargs)
    return parser


def config_from_args(parser: argparse.ArgumentParser, argv=None) -> tuple[Config, argparse.Namespace]:
    """Parse argv; return the Config and the namespace (which also holds the rung's own flags).

    Parsing only checks values: it creates, claims or deletes nothing (the run does that when
    it starts, see scaledl.run_dir)."""
    args = parser.parse_args(argv)
    names = {f.name for f in dataclasses.fields(Config)}
    try:
        config = Config(**{k: v for k, v in vars(args).items() if k in names})
    except ConfigError as error:
        parser.error(str(error))
    if os.environ.get(CHECK_FLAGS_VAR):  # `scaledl demo` checks the flags it will pass on before it runs anything
        raise FlagsChecked()
    return config, args


def parse_args(argv=None, prog: str | None = None) -> Config:
    return config_from_args(build_parser(prog or sys.argv[0]), argv)[0]
