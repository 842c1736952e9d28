"""Build the embedded text corpus (src/scaledl/embedded/python-stdlib/): pure-Python modules of
CPython's standard library, read from the Python running this script, as one gzip'd tar with
fixed metadata, so that it is the same bytes every time it is built from the same CPython.

    python tools/build_corpus.py            # writes the tar and prints its sha256 for scaledl.corpus

It was built from CPython 3.11.7; the package ships the result (the language model's data must
be the same on every machine, and every machine's own standard library differs by version).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import sys
import sysconfig
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "scaledl" / "embedded" / "python-stdlib" / "stdlib.tar.gz"
# Modules a reader of this package knows by name, about 1.5 MB of Python in all.
MODULES = """abc argparse ast base64 bisect calendar collections/__init__.py configparser contextlib copy csv
dataclasses datetime difflib enum fnmatch fractions ftplib functools getopt gettext glob gzip hashlib heapq
hmac imaplib inspect ipaddress json/__init__.py json/decoder.py json/encoder.py locale logging/__init__.py
logging/handlers.py mailbox numbers operator optparse os pathlib pickle pprint queue random re/_parser.py
re/_compiler.py sched selectors shlex shutil smtplib socket statistics string subprocess tarfile tempfile
textwrap threading tokenize traceback typing unittest/case.py uuid warnings weakref zipfile""".split()


def main() -> int:
    lib = Path(sysconfig.get_paths()["stdlib"])
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in MODULES:
            path = Path(name if name.endswith(".py") else name + ".py")
            data = (lib / path).read_bytes()
            info = tarfile.TarInfo(str(path))
            info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o644, "", ""
            tar.addfile(info, io.BytesIO(data))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(gzip.compress(buffer.getvalue(), compresslevel=9, mtime=0))
    print(f"{OUT.relative_to(ROOT)}: {OUT.stat().st_size} bytes, python {sys.version.split()[0]}, "
          f"sha256 {hashlib.sha256(OUT.read_bytes()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
