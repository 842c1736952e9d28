"""The models and their data: the transformer's parameter formula, the token task, --model at the boundary."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from scaledl import datasets, models
from scaledl.config import Config, ConfigError

SMALL = ["--model", "transformer", "--width", "64", "--depth", "2", "--heads", "4", "--seq-len", "32"]


@pytest.mark.parametrize("width, depth, heads, seq_len", [(64, 2, 4, 32), (48, 3, 6, 7)])
def test_the_transformer_has_the_parameters_its_formula_says(width, depth, heads, seq_len):
    model = models.transformer(width, depth, heads, seq_len)
    assert sum(p.numel() for p in model.parameters()) == models.transformer_num_params(width, depth, seq_len)
    sharded = sum(p.numel() for name, p in model.named_parameters()
                  if any(f".{layer}." in name for layer in models.COLUMNWISE)
                  or any(f".{layer}.weight" in name for layer in models.ROWWISE))
    assert sharded == models.transformer_sharded_params(width, depth)


def test_the_transformer_reads_tokens_in_the_loaders_layout():
    import torch

    model = models.transformer(32, 1, 2, 8)
    tokens = torch.randint(0, 256, (3, 8))
    same = model(tokens.float()[:, None, :, None])  # N x 1 x L x 1, as sharding.torch_train_set serves them
    assert torch.equal(same, model(tokens)) and same.shape == (3, 10)


def test_a_token_sample_is_labelled_by_its_most_frequent_group():
    data = datasets.tokens(seq_len=32, num_train=2000, num_test=10)
    groups = data.x_train[:, :, 0, 0].astype(np.int64) % 10
    counts = np.stack([(groups == c).sum(1) for c in range(10)], 1)
    assert (counts.argmax(1) == data.y_train).mean() > 0.95  # learnable by counting
    assert np.array_equal(datasets.tokens(seq_len=32, num_train=2000, num_test=10).x_train, data.x_train)
    assert data.image_shape == (32, 1, 1) and data.normalized(data.x_test).max() == data.x_test.max()


@pytest.mark.parametrize("options, message", [
    ({"depth": 2}, "only --model transformer takes --depth"),
    ({"dataset": "tokens"}, "--dataset tokens holds token sequences for --model transformer"),
    ({"model": "transformer", "dataset": "mnist"}, "--model transformer trains on --dataset tokens"),
    ({"model": "transformer", "width": 65, "heads": 4}, "--width 65 must be a multiple of --heads 4"),
    ({"model": "transformer", "seq_len": 0}, "--seq-len must be a whole number > 0"),
])
def test_model_flags_that_do_not_fit_together_are_refused(options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config(**options)


def test_transformer_defaults_fill_in_and_the_cnn_keeps_its_data():
    assert Config().dataset == "mnist-embedded" and Config().width is None
    config = Config(model="transformer", depth=2)
    assert config.dataset == "tokens" and (config.width, config.depth, config.heads) == (1024, 2, 16)


def test_a_bad_model_flag_is_one_line_and_creates_nothing(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "scaledl.ladder.single_torch", "--model", "transformer",
                             "--width", "65", "--heads", "4", "--out-dir", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not out.exists(), result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--width 65 must be a multiple of --heads 4" in lines[0], result.stderr


def test_the_pipeline_rung_refuses_the_transformer(tmp_path):
    result = subprocess.run([sys.executable, "-m", "scaledl.ladder.pipeline", *SMALL, "--out-dir", str(tmp_path / "r")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "unrecognized arguments: --model transformer" in result.stderr


@pytest.mark.slow
def test_the_transformer_learns_the_token_task(tmp_path):
    subprocess.run([sys.executable, "-m", "scaledl.ladder.single_torch", *SMALL, "--epochs", "1", "--lr", "0.1",
                    "--out-dir", str(tmp_path)], check=True, capture_output=True, timeout=300)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.4  # chance is 0.1
