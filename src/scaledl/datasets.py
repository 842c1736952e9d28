"""Data sets as NumPy arrays, the same for every framework.

- `mnist-embedded` (default): the real MNIST test split (10k images) shipped inside the
  package, split into fixed train/test subsets; works offline, everywhere.
- `mnist`: the full 70k MNIST from a staged directory (IDX files, gzipped or not, flat or in
  torchvision's `MNIST/raw/` layout), downloaded there first where the machine has internet.
- `cifar10`: CIFAR-10's python pickles (`cifar-10-batches-py/`) from a staged directory.
- `synthetic`: random images and labels, for throughput measurements without I/O.

torchvision.datasets reads the same files, but it is not installed beside the CPU build of
PyTorch this project pins (their wheels do not match), and TensorFlow rungs need the arrays
too, so the readers are here: IDX and CIFAR's pickles are two simple formats.
"""
from __future__ import annotations

import gzip
import os
import pickle
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from scaledl.errors import UserError

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
    y_train: np.ndarray  # int64, N
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
    """Read an IDX file (MNIST's format), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise DataError(f"{path} is not an unsigned-byte IDX file (bad magic number)")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise DataError(f"{path} is truncated: header says {shape}, found {body.size} bytes")
    return body.reshape(shape)


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
    arrays = {}
    for key, stem in MNIST_FILES.items():
        path = _find_idx(data_dir, stem)
        if path is None and download:
            path = _download(MNIST_MIRROR + stem + ".gz", data_dir / (stem + ".gz"))
        if path is None:
            raise DataError(f"MNIST file {stem}[.gz] not found in {data_dir}: put the four MNIST "
                            f"IDX files there (or in {data_dir}/MNIST/raw), or use --dataset mnist-embedded")
        arrays[key] = read_idx(path)
    return Dataset("mnist", arrays["x_train"][..., None], arrays["y_train"].astype(np.int64),
                   arrays["x_test"][..., None], arrays["y_test"].astype(np.int64))


def load_cifar10(data_dir: Path) -> Dataset:
    folder = data_dir / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DataError(f"CIFAR-10 not found: {folder} lacks {', '.join(missing)}; unpack "
                        f"cifar-10-python.tar.gz into {data_dir}")

    def batch(name):
        try:
            with open(folder / name, "rb") as f:
                entry = pickle.load(f, encoding="bytes")
            x = np.asarray(entry[b"data"], np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            return x, np.asarray(entry[b"labels"], np.int64)
        except (pickle.UnpicklingError, KeyError, ValueError, EOFError) as error:
            raise DataError(f"{folder / name} is not a CIFAR-10 python batch ({error})") from None

    parts = [batch(n) for n in names[:-1]]
    x_test, y_test = batch("test_batch")
    return Dataset("cifar10", np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                   x_test, y_test)


def synthetic(num_train: int = 4096, num_test: int = 512, shape=(28, 28, 1), seed: int = 0) -> Dataset:
    rng = np.random.default_rng(seed)
    return Dataset("synthetic", rng.integers(0, 256, (num_train, *shape), dtype=np.uint8),
                   rng.integers(0, 10, num_train), rng.integers(0, 256, (num_test, *shape), dtype=np.uint8),
                   rng.integers(0, 10, num_test))


def _download(url: str, target: Path) -> Path | None:
    """Fetch one file; None when the machine has no internet (the caller says what to stage)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=20) as response, open(partial, "wb") as out:
            out.write(response.read())
    except OSError:
        partial.unlink(missing_ok=True)
        return None
    partial.replace(target)
    return target


def load_dataset(name: str = "mnist-embedded", data_dir: str | os.PathLike | None = None,
                 train_limit: int | None = None) -> Dataset:
    """Load a data set by its --dataset name; `train_limit` keeps the first N training samples."""
    if name == "mnist-embedded":
        data = load_embedded_mnist()
    elif name == "synthetic":
        data = synthetic()
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
        raise DataError(f"unknown dataset {name!r}: use mnist-embedded, mnist, cifar10 or synthetic")
    if train_limit is not None:
        data.x_train, data.y_train = data.x_train[:train_limit], data.y_train[:train_limit]
    return data
