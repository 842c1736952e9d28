import gzip
import hashlib
import pickle
import time

import numpy as np
import pytest

from scaledl.datasets import DataError, load_dataset, read_idx


def write_idx(path, array, compress=True):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


def test_embedded_mnist_is_the_real_test_split_in_fixed_subsets():
    data = load_dataset()
    assert data.x_train.shape == (8000, 28, 28, 1) and data.x_test.shape == (2000, 28, 28, 1)
    assert data.x_train.dtype == np.uint8 and set(np.unique(data.y_train)) == set(range(10))
    # Per-class counts of MNIST's t10k labels (published with the data set).
    counts = np.bincount(np.concatenate([data.y_train, data.y_test]))
    assert counts.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    again = load_dataset()
    assert np.array_equal(again.y_train, data.y_train) and np.array_equal(again.x_test, data.x_test)


def test_embedded_files_are_the_published_ones():
    from importlib import resources

    folder = resources.files("scaledl") / "embedded" / "mnist-t10k"
    digest = hashlib.md5((folder / "t10k-images-idx3-ubyte.gz").read_bytes()).hexdigest()
    assert digest == "9fb629c4189551a2d022fa330f9573f3"


def test_staged_full_mnist_in_torchvision_layout(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    write_idx(raw / "train-images-idx3-ubyte.gz", rng.integers(0, 255, (30, 28, 28)))
    write_idx(raw / "train-labels-idx1-ubyte", rng.integers(0, 10, 30), compress=False)
    write_idx(raw / "t10k-images-idx3-ubyte.gz", rng.integers(0, 255, (5, 28, 28)))
    write_idx(raw / "t10k-labels-idx1-ubyte.gz", rng.integers(0, 10, 5))
    data = load_dataset("mnist", tmp_path)
    assert data.x_train.shape == (30, 28, 28, 1) and data.y_test.shape == (5,)


def test_missing_mnist_says_where_to_put_the_files(tmp_path):
    started = time.monotonic()
    with pytest.raises(DataError, match=f"not found in {tmp_path}.*put the four MNIST IDX files there"):
        load_dataset("mnist", tmp_path)
    assert time.monotonic() - started < 60  # no internet here: the download attempt fails fast


def test_truncated_idx_file_is_named(tmp_path):
    path = tmp_path / "x.gz"
    write_idx(path, np.zeros((4, 28, 28)))
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:-10]))
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)


def test_cifar10_from_staged_pickles(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8),
                         b"labels": rng.integers(0, 10, 4).tolist()}, f)
    data = load_dataset("cifar10", tmp_path)
    assert data.x_train.shape == (20, 32, 32, 3) and data.x_test.shape == (4, 32, 32, 3)
    assert data.normalized(data.x_test).dtype == np.float32


def test_missing_cifar10_and_missing_data_dir(tmp_path):
    with pytest.raises(DataError, match="unpack cifar-10-python.tar.gz into"):
        load_dataset("cifar10", tmp_path)
    with pytest.raises(DataError, match="needs --data-dir"):
        load_dataset("cifar10", None)
    (tmp_path / "file").write_text("")
    with pytest.raises(DataError, match="is a file, not a directory"):
        load_dataset("mnist", tmp_path / "file")
