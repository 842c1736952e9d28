"""Data sets as NumPy arrays, the same for every framework.

- `mnist-embedded` (default): the real MNIST test split (10k images) shipped inside the
  package, split into fixed train/test subsets; works offline, everywhere.
- `mnist`: the full 70k MNIST from a staged directory (IDX files, gzipped or not, flat or in
  torchvision's `MNIST/raw/` layout), downloaded there first where the machine has internet.
- `cifar10`: CIFAR-10's python pickles (`cifar-10-batches-py/`) from a staged directory.
- `synthetic`: random images and labels, for throughput measurements without I/O.
- `tokens`: synthetic token sequences with a learnable label, for `--model transformer`
  (`tokens()` says how they are made); `for_config` sizes them by `--seq-len`.

torchvision.datasets reads the same files, but it is not installed beside the CPU build of
PyTorch this project pins (their wheels do not match), and TensorFlow rungs need the arrays
too, so the readers are here: IDX and CIFAR's pickles are two simple formats.
"""
from __future__ import annotations

import gzip
import os
import pickle
import urllib.request
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from scaledl.errors import UserError
from scaledl.models import GPT_DEFAULT, GPT_PRESETS, TRANSFORMER_DEFAULTS

EMBEDDED_TRAIN_SIZE = 8000  # of the 10k embedded images; the other 2000 are the test subset
EMBEDDED_SPLIT_SEED = 1234  # fixed: the subsets must not change with the run's --seed
MNIST_MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"
MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte",
}
MEAN_STD = {"mnist": ((0.1307,), (0.3081,)),
            "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))}


class DataError(UserError, RuntimeError):
    """Missing or malformed data; the message says where the files should be."""


@dataclass
class Dataset:
    name: str
    x_train: np.ndarray  # uint8, N x H x W x C
    y_train: np.ndarray  # int64, N (N x L for next-token targets)
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int = 10

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def normalized(self, x: np.ndarray) -> np.ndarray:
        """uint8 N x H x W x C -> float32 N x H x W x C, standardized per channel."""
        mean, std = MEAN_STD["cifar10" if self.name == "cifar10" else "mnist"]
        return ((x.astype(np.float32) / 255.0 - np.array(mean, np.float32)) / np.array(std, np.float32))


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (MNIST's format), gzipped or not; a damaged one is a DataError naming it."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise DataError(f"{path} is not a whole gzip file ({error or type(error).__name__}): "
                        "download it again") from None
    except OSError as error:
        raise DataError(f"cannot read {path}: {error.strerror or error}") from None
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise DataError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = data[3]
    if not 1 <= ndim <= 3 or len(data) < 4 + 4 * ndim:
        raise DataError(f"{path} has a damaged IDX header ({ndim} dimensions, {len(data)} bytes)")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        what = "truncated" if body.size < int(np.prod(shape)) else "longer than its header says"
        raise DataError(f"{path} is {what}: header says {shape}, found {body.size} bytes of data")
    return body.reshape(shape)


def _check_split(images: np.ndarray, labels: np.ndarray, images_path, labels_path, shape, classes: int = 10):
    """Images N x H x W (x C), labels N in 0..classes-1, from the same N."""
    if images.ndim < 3 or tuple(images.shape[1:len(shape) + 1]) != tuple(shape)[:images.ndim - 1]:
        raise DataError(f"{images_path} holds arrays of shape {tuple(images.shape)}, not images of {shape}")
    if labels.ndim != 1:
        raise DataError(f"{labels_path} holds arrays of shape {tuple(labels.shape)}, not one label per image")
    if len(images) != len(labels):
        raise DataError(f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels: "
                        "the two files come from different sets")
    if len(labels) and (labels.min() < 0 or labels.max() >= classes):
        raise DataError(f"{labels_path} has labels outside 0..{classes - 1} (found {labels.min()}..{labels.max()})")


def _find_idx(directory: Path, stem: str) -> Path | None:
    for folder in (directory, directory / "MNIST" / "raw", directory / "mnist"):
        for name in (stem, stem + ".gz"):
            if (folder / name).is_file():
                return folder / name
    return None


def load_embedded_mnist() -> Dataset:
    folder = resources.files("scaledl") / "embedded" / "mnist-t10k"
    with resources.as_file(folder) as path:
        images = read_idx(path / "t10k-images-idx3-ubyte.gz")[..., None]
        labels = read_idx(path / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
    order = np.random.default_rng(EMBEDDED_SPLIT_SEED).permutation(len(labels))
    train, test = order[:EMBEDDED_TRAIN_SIZE], order[EMBEDDED_TRAIN_SIZE:]
    return Dataset("mnist-embedded", images[train], labels[train], images[test], labels[test])


def load_mnist(data_dir: Path, download: bool = True) -> Dataset:
    arrays, paths = {}, {}
    for key, stem in MNIST_FILES.items():
        path = _find_idx(data_dir, stem)
        if path is None and download and _can_write(data_dir):
            path = _download(MNIST_MIRROR + stem + ".gz", data_dir / (stem + ".gz"))
        if path is None:
            why = "" if _can_write(data_dir) else f" (and {data_dir} is read-only, so they cannot be downloaded there)"
            raise DataError(f"MNIST file {stem}[.gz] not found in {data_dir}{why}: put the four MNIST "
                            f"IDX files there (or in {data_dir}/MNIST/raw), or use --dataset mnist-embedded")
        arrays[key], paths[key] = read_idx(path), path
    for split in ("train", "test"):
        _check_split(arrays[f"x_{split}"], arrays[f"y_{split}"], paths[f"x_{split}"], paths[f"y_{split}"], (28, 28))
    return Dataset("mnist", arrays["x_train"][..., None], arrays["y_train"].astype(np.int64),
                   arrays["x_test"][..., None], arrays["y_test"].astype(np.int64))


def _can_write(folder: Path) -> bool:
    """Can files be made in `folder` (or, if it does not exist yet, in its nearest existing parent)?"""
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    try:
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            return False
    except OSError:
        return False
    return existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


class _BatchUnpickler(pickle.Unpickler):
    """CIFAR-10's batches hold dicts, lists, bytes and NumPy arrays; a pickle that asks for any
    other class is not one of them (and unpickling it could run its code)."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
               ("__builtin__", "object"), ("builtins", "object")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}")
        return super().find_class(module, name)


def load_cifar10(data_dir: Path) -> Dataset:
    folder = data_dir / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DataError(f"CIFAR-10 not found: {folder} lacks {', '.join(missing)}; unpack "
                        f"cifar-10-python.tar.gz into {data_dir}")

    def batch(name):
        path = folder / name
        try:
            with open(path, "rb") as f:
                entry = _BatchUnpickler(f, encoding="bytes").load()
        except OSError as error:
            raise DataError(f"cannot read {path}: {error.strerror or error}") from None
        except Exception as error:  # noqa: BLE001  unpickling raises anything a damaged file makes it raise
            detail = " ".join(str(error).split())[:160]  # one line, whatever the unpickler said
            raise DataError(f"{path} is not a CIFAR-10 python batch ({type(error).__name__}: {detail})") from None
        if not isinstance(entry, dict) or b"data" not in entry or b"labels" not in entry:
            raise DataError(f"{path} is not a CIFAR-10 python batch (expected a dict with b'data' and b'labels')")
        data, labels = entry[b"data"], entry[b"labels"]
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            shape = getattr(data, "shape", type(data).__name__)
            raise DataError(f"{path}: b'data' must be a uint8 array of N x 3072 pixels, found {shape}")
        if not isinstance(labels, (list, np.ndarray)) or not all(isinstance(v, (int, np.integer)) for v in labels):
            raise DataError(f"{path}: b'labels' must be a list of integers")
        x = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        y = np.asarray(labels, np.int64)
        _check_split(x, y, path, path, (32, 32, 3))
        return x, y

    parts = [batch(n) for n in names[:-1]]
    x_test, y_test = batch("test_batch")
    return Dataset("cifar10", np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                   x_test, y_test)


def synthetic(num_train: int = 4096, num_test: int = 512, shape=(28, 28, 1), seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    return Dataset("synthetic", rng.integers(0, 256, (num_train, *shape), dtype=np.uint8),
                   rng.integers(0, 10, num_train), rng.integers(0, 256, (num_test, *shape), dtype=np.uint8),
                   rng.integers(0, 10, num_test))


class TokenDataset(Dataset):
    """Token sequences in the image layout, N x L x 1 x 1 uint8 (a byte per token), so that every
    loader, sampler and evaluation serves them unchanged: the transformer reads the ids back
    from the float tensor they arrive as (exact: floats hold integers up to 2**24)."""

    def normalized(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32)  # ids, not intensities: no scaling


TOKENS_SEED = 4321  # fixed: the sequences must not change with the run's --seed
TOKENS_PLANTED = 2  # one position in TOKENS_PLANTED holds a token of the label's group


def tokens(seq_len: int = 128, num_train: int = 8192, num_test: int = 1024, num_classes: int = 10,
           seed: int = TOKENS_SEED) -> TokenDataset:
    """Sequences of random bytes in which the label's group is planted: a sample of class c has
    one position in TOKENS_PLANTED (at random places) holding a token t with t % num_classes == c,
    the others uniform over 0..255.  The class is the group that is most frequent, which mean
    pooling over the sequence can see, so a small transformer learns it in a few dozen steps
    (chance is 1/num_classes)."""
    rng = np.random.default_rng(seed)

    def make(count):
        labels = rng.integers(0, num_classes, count)
        x = rng.integers(0, 256, (count, seq_len), dtype=np.uint8)
        planted = rng.random((count, seq_len)) < 1 / TOKENS_PLANTED
        per_group = (256 - num_classes) // num_classes + 1  # tokens c, c + C, c + 2C, ... below 256, for every c
        group = labels[:, None] + num_classes * rng.integers(0, per_group, (count, seq_len))
        x[planted] = group[planted].astype(np.uint8)
        return x[:, :, None, None], labels.astype(np.int64)

    (x_train, y_train), (x_test, y_test) = make(num_train), make(num_test)
    return TokenDataset("tokens", x_train, y_train, x_test, y_test, num_classes)


def text(seq_len: int = 128) -> TokenDataset:
    """Next-token sequences of the embedded corpus (`scaledl.corpus`): the bytes cut into windows of
    seq_len + 1 one after another, x a window's first seq_len bytes and y (N x seq_len) the same
    shifted by one, so every position of every sample is a prediction.  Test windows come from the
    held-out files; `num_classes` is the vocabulary, the 256 byte values."""
    from scaledl import corpus

    def windows(stream: bytes):
        count = (len(stream) - 1) // seq_len
        if count < 1:
            raise DataError(f"--seq-len {seq_len} is longer than the held-out text ({len(stream)} bytes): use a "
                            "shorter --seq-len")
        flat = np.frombuffer(stream, np.uint8)
        starts = np.arange(count) * seq_len
        x = flat[starts[:, None] + np.arange(seq_len)]
        y = flat[starts[:, None] + np.arange(1, seq_len + 1)].astype(np.int64)
        return x[:, :, None, None], y

    train, test = corpus.split()
    (x_train, y_train), (x_test, y_test) = windows(train), windows(test)
    return TokenDataset("text", x_train, y_train, x_test, y_test, num_classes=256)


def _download(url: str, target: Path) -> Path | None:
    """Fetch one file; None when the machine has no internet (the caller says what to stage).  A fetch
    that fails leaves nothing behind, not even the folders it made for the file (a mistyped --data-dir)."""
    made = [folder for folder in (target.parent, *target.parent.parents) if not folder.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=20) as response, open(partial, "wb") as out:
            out.write(response.read())
    except OSError:
        partial.unlink(missing_ok=True)
        for folder in made:  # deepest first; one that something else has filled meanwhile stays
            try:
                folder.rmdir()
            except OSError:
                break
        return None
    partial.replace(target)
    return target


def for_config(config) -> Dataset:
    """The data set a `scaledl.Config` names (--dataset, --data-dir, --train-limit, --seq-len)."""
    return load_dataset(config.dataset, config.data_dir, config.train_limit, seq_len=config.seq_len)


def load_dataset(name: str = "mnist-embedded", data_dir: str | os.PathLike | None = None,
                 train_limit: int | None = None, seq_len: int | None = None) -> Dataset:
    """Load a data set by its --dataset name; `train_limit` keeps the first N training samples;
    `seq_len` is the length of the `tokens` sequences (default 128)."""
    if name == "mnist-embedded":
        data = load_embedded_mnist()
    elif name == "synthetic":
        data = synthetic()
    elif name == "tokens":
        data = tokens(seq_len or TRANSFORMER_DEFAULTS["seq_len"])
    elif name == "text":
        data = text(seq_len or GPT_PRESETS[GPT_DEFAULT]["seq_len"])
    elif name in ("mnist", "cifar10"):
        folder = data_dir or os.environ.get("SCALEDL_DATA")
        if not folder:
            raise DataError(f"--dataset {name} needs --data-dir (or $SCALEDL_DATA) naming a directory "
                            "with the staged files")
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise DataError(f"--data-dir {folder} is a file, not a directory")
        data = load_mnist(folder) if name == "mnist" else load_cifar10(folder)
    else:
        raise DataError(f"unknown dataset {name!r}: use mnist-embedded, mnist, cifar10, synthetic, tokens or text")
    if train_limit is not None:
        data.x_train, data.y_train = data.x_train[:train_limit], data.y_train[:train_limit]
    return data
