import subprocess
import sys

import pytest

from scaledl import Config, ConfigError, build_parser, config_from_args, parse_args


def test_flags_fill_the_config():
    config = parse_args(["--epochs", "2", "--batch-size", "32", "--lr", "0.1", "--precision", "bf16",
                         "--scale-lr", "false", "--out-dir", "x"])
    assert (config.num_epochs, config.batch_size, config.lr, config.precision, config.scale_lr, config.out_dir) == \
        (2, 32, 0.1, "bf16", False, "x")
    assert parse_args(["--resume"]).resume is True


def test_notebook_and_command_line_build_the_same_config():
    assert Config(num_epochs=2, lr=0.5) == parse_args(["--epochs", "2", "--lr", "0.5"])


def test_a_rung_adds_its_own_flags():
    parser = build_parser()
    parser.add_argument("--zero-stage", type=int, default=0)
    config, args = config_from_args(parser, ["--zero-stage", "2", "--epochs", "1"])
    assert args.zero_stage == 2 and config.num_epochs == 1


@pytest.mark.parametrize("argv, flag", [
    (["--lr", "-1"], "--lr must be > 0"),
    (["--batch-size", "0"], "--batch-size must be > 0"),
    (["--epochs", "two"], "argument --epochs: invalid int value"),
    (["--precision", "fp8"], "argument --precision: invalid choice"),
    (["--dataset", "imagenet"], "argument --dataset: invalid choice"),
    (["--warmup-epochs", "-0.5"], "--warmup-epochs must be >= 0"),
])
def test_bad_values_get_one_line_naming_the_flag(argv, flag):
    code = f"from scaledl import parse_args; parse_args({argv!r}, prog='rung')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0] and lines[0].startswith("rung: error:")


def test_bad_value_from_a_notebook_raises():
    with pytest.raises(ConfigError, match="--log-interval must be > 0"):
        Config(log_interval=0)


def test_tensorboard_without_its_package_is_one_line_before_anything_runs(monkeypatch, tmp_path):
    # TensorFlow 2.15 brings tensorboard and 2.21 does not; an environment without it is told
    # at the flag, not by a ModuleNotFoundError from inside the first rank's metrics writer.
    monkeypatch.setattr(sys, "path", [str(tmp_path)])  # an environment without the package
    for name in [name for name in sys.modules if name == "tensorboard" or name.startswith("tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ConfigError, match="--tensorboard needs the tensorboard package"):
        Config(tensorboard=True)
    Config(tensorboard=False)  # nothing asked of it without the flag
