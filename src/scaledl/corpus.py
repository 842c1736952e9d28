"""The language model's text: Python's own standard library, shipped in the package.

    train, test = corpus.split()        # bytes: the training files and the held-out files

68 modules of CPython 3.11.7's `Lib/` (2.8 MB; `embedded/python-stdlib/README.md` says which and
under what licence), read from `embedded/python-stdlib/stdlib.tar.gz`, whose sha256 is pinned
here: every machine trains on the same bytes.  A test loss needs text the model never saw, so the
split is by file (every TEST_EVERY-th file by name is held out), not by position in one stream.
`scaledl.datasets.text` cuts the bytes into sequences.
"""
from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from importlib import resources

SHA256 = "ef94e6a0c11dfb3182a260805b472f49bdc844cfd23f0914092f9ccd536e93b4"
TEST_EVERY = 10  # files 9, 19, 29, ... (by name) are the test set: 6 of 68, about 10% of the bytes


class CorpusError(RuntimeError):
    """The shipped corpus is missing or not the pinned bytes (a damaged install)."""


@functools.lru_cache(maxsize=1)
def files() -> tuple[tuple[str, bytes], ...]:
    """(name, bytes) of every module, sorted by name."""
    path = resources.files("scaledl") / "embedded" / "python-stdlib" / "stdlib.tar.gz"
    try:
        packed = path.read_bytes()
    except OSError as error:
        raise CorpusError(f"the text corpus is missing from the installed package ({error}): reinstall scaledl "
                          "(make setup)") from None
    if hashlib.sha256(packed).hexdigest() != SHA256:
        raise CorpusError(f"{path} is not the corpus this version ships (sha256 differs): reinstall scaledl "
                          "(make setup)")
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
        found = [(member.name, tar.extractfile(member).read()) for member in tar.getmembers() if member.isfile()]
    return tuple(sorted(found))


def split() -> tuple[bytes, bytes]:
    """(training bytes, test bytes): the files joined, each set's in name order."""
    train = [data for i, (_, data) in enumerate(files()) if i % TEST_EVERY != TEST_EVERY - 1]
    test = [data for i, (_, data) in enumerate(files()) if i % TEST_EVERY == TEST_EVERY - 1]
    return b"".join(train), b"".join(test)
