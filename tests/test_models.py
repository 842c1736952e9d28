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
    ({"depth": 2}, "--depth is for --model transformer or gpt"),
    ({"recompute": "full"}, "--recompute is for --model transformer or gpt"),
    ({"preset": "tiny", "heads": 2}, "--heads, --preset are for --model transformer or gpt"),
    ({"dataset": "tokens"}, "--dataset tokens is for --model transformer; --model cnn trains on mnist-embedded"),
    ({"model": "transformer", "dataset": "mnist"}, "--dataset mnist is for --model cnn; --model transformer trains "
                                                   "on tokens"),
    ({"model": "gpt", "dataset": "tokens"}, "--dataset tokens is for --model transformer; --model gpt trains on text"),
    ({"model": "transformer", "preset": "tiny"}, "--preset names a size of --model gpt"),
    ({"model": "gpt", "preset": "huge"}, "--preset must be one of tiny, small, gpt2-small"),
    ({"model": "gpt", "recompute": "some"}, "--recompute must be one of none, selective, full"),
    ({"model": "gpt", "preset": "gpt2-small", "heads": 5}, "--width 768 must be a multiple of --heads 5"),
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
    gpt = Config(model="gpt", preset="gpt2-small", seq_len=256)  # a preset, one dimension changed
    assert gpt.dataset == "text" and (gpt.width, gpt.depth, gpt.heads, gpt.seq_len) == (768, 12, 12, 256)
    assert Config(model="gpt").preset == "tiny" and Config(model="gpt").recompute == "none"


@pytest.mark.parametrize("preset", list(models.GPT_PRESETS))
def test_the_language_model_has_the_parameters_its_formula_says(preset):
    import torch

    sizes = models.GPT_PRESETS[preset]
    with torch.device("meta"):  # the 2.7B shape too: no memory, only shapes
        model = models.gpt(**sizes)
    assert sum(p.numel() for p in model.parameters()) == models.gpt_num_params(
        sizes["width"], sizes["depth"], sizes["seq_len"])


def test_the_language_model_predicts_every_next_byte_causally():
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = models.gpt(32, 2, 4, 16)
    tokens = torch.randint(0, 256, (3, 16))
    logits = model(tokens)
    assert logits.shape == (3, 256, 16)  # N x V x L: F.cross_entropy's class dimension second
    assert F.cross_entropy(logits, tokens).ndim == 0  # next-token targets, N x L, as the rungs pass them
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    after = model(changed)
    assert torch.equal(after[:, :, :10], logits[:, :, :10])  # a later byte changes no earlier prediction
    assert not torch.allclose(after[:, :, 10:], logits[:, :, 10:])


def test_the_flops_formula_is_what_torch_counts():
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    width, depth, heads, seq_len, batch = 64, 3, 4, 32, 2
    model = models.gpt(width, depth, heads, seq_len)
    counter = FlopCounterMode(display=False)
    # Attention as plain matrix products: torch's counter has no count for the CPU's fused kernel.
    with counter, torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        model(torch.randint(0, 256, (batch, seq_len))).float().sum().backward()
    formula = models.gpt_flops_per_token(width, depth, seq_len) * batch * seq_len
    # torch counts matrix products only: the formula's 6 flops per bias and LayerNorm weight are the rest.
    not_products = depth * 13 * width + 2 * width + models.VOCAB_SIZE
    assert counter.get_total_flops() == formula - 6 * not_products * batch * seq_len


def test_the_text_is_the_pinned_corpus_split_by_file():
    import hashlib

    from scaledl import corpus

    names = [name for name, _ in corpus.files()]
    assert len(names) == 68 and names == sorted(names) and "argparse.py" in names
    train, test = corpus.split()
    held_out = {name for i, (name, _) in enumerate(corpus.files()) if i % corpus.TEST_EVERY == corpus.TEST_EVERY - 1}
    assert len(held_out) == 6 and all(data not in train for name, data in corpus.files() if name in held_out)
    assert 0.05 < len(test) / (len(train) + len(test)) < 0.2
    assert hashlib.sha256(train + test).hexdigest() != corpus.SHA256  # the pin is of the shipped file, checked on read
    data = datasets.text(seq_len=64)
    assert data.x_train.shape[1:] == (64, 1, 1) and data.y_train.shape == (len(data.x_train), 64)
    # y is x shifted by one byte, and each window follows the last in the text
    assert np.array_equal(data.x_train[0, 1:, 0, 0], data.y_train[0, :-1])
    assert bytes(data.x_train[:2, :, 0, 0].ravel()) == train[:128] and data.y_train[1, -1] == train[128]
    assert bytes(data.x_test[0, :, 0, 0]) == test[:64] and data.num_classes == 256


def test_a_damaged_corpus_is_refused_with_the_fix(monkeypatch):
    from scaledl import corpus

    corpus.files.cache_clear()
    monkeypatch.setattr(corpus, "SHA256", "0" * 64)
    with pytest.raises(corpus.CorpusError, match="reinstall scaledl"):
        corpus.files()
    corpus.files.cache_clear()


def test_a_bad_model_flag_is_one_line_and_creates_nothing(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "scaledl.ladder.single_torch", "--model", "transformer",
                             "--width", "65", "--heads", "4", "--out-dir", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and not out.exists(), result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--width 65 must be a multiple of --heads 4" in lines[0], result.stderr




@pytest.mark.slow
def test_the_transformer_learns_the_token_task(tmp_path):
    subprocess.run([sys.executable, "-m", "scaledl.ladder.single_torch", *SMALL, "--epochs", "1", "--lr", "0.1",
                    "--out-dir", str(tmp_path)], check=True, capture_output=True, timeout=300)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.4  # chance is 0.1
