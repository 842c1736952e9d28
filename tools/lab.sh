#!/usr/bin/env bash
# Start JupyterLab on the lessons: print the address to open and where to start, then serve.
# Called by `make lab`; tests/workshop/test_browser.py starts it the same way. Extra arguments go to
# `jupyter lab` (the test gives it settings and workspace folders of its own).
# PORT picks the port (8888 when unset; the next free one when it is taken); JUPYTER_TOKEN the
# token (a new random one when unset).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${VENV:-.venv}

# The kernels start ranks with mpiexec, torchrun and horovodrun: the venv's tools come first, and
# Open MPI must be allowed to run as root (containers) and to put more ranks than cores.
export PATH="$root/$venv/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

port=$("$venv/bin/python" - "${PORT:-8888}" <<'PY'
import socket
import sys


def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


wanted = int(sys.argv[1])
port = next((p for p in range(wanted, wanted + 50) if free(p)), None)
if port is None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
print(port)
PY
)
if [ "$port" != "${PORT:-8888}" ]; then
    echo "port ${PORT:-8888} is taken: using $port" >&2
fi
# Jupyter reads the token from the environment, which keeps it out of `ps`.
JUPYTER_TOKEN=${JUPYTER_TOKEN:-$("$venv/bin/python" -c 'import secrets; print(secrets.token_hex(24))')}
export JUPYTER_TOKEN

# Where to start: the lessons' table of notebooks/README.md, without its markdown.
lessons=$("$venv/bin/python" - <<'PY'
import re

for line in open("notebooks/README.md"):
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if len(cells) >= 3 and cells[0].isdigit():
        path = re.search(r"`([^`]+[.]ipynb)`", cells[1])
        goal = cells[2] if len(cells[2]) <= 72 else cells[2][:69] + "..."
        print(f"{cells[0]:>4}  {path.group(1) if path else cells[1]:<36} {goal}")
PY
)
first=$(awk 'NR == 1 { print $2 }' <<<"$lessons")
url="http://127.0.0.1:$port"
cat <<EOF

JupyterLab on the lessons. Open this address in your browser:

    $url/lab?token=$JUPYTER_TOKEN

Start with ${first:-the first lesson}: $url/lab/tree/${first:-notebooks}?token=$JUPYTER_TOKEN
Then go down the table (notebooks/README.md): work in exercises/, answers are in solutions/.

$lessons

On a compute node, tunnel from your laptop first:
    ssh -L $port:localhost:$port -J you@login-node you@$(hostname -s)
Stop with Ctrl-C.

EOF

# Compute nodes rarely reach the internet: no news feed or update check, and no toast asking about
# them over the first lesson (tools/lab/overrides.json holds the defaults learners start from).
# Containers and CI run as root, which Jupyter refuses without being told.
options=(--no-browser --ip=127.0.0.1 --port="$port" --ServerApp.port_retries=0 --ServerApp.root_dir="$root"
         --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate
         --LabApp.app_settings_dir="$root/tools/lab")
[ "$(id -u)" -ne 0 ] || options+=(--allow-root)
exec "$venv/bin/jupyter" lab "${options[@]}" "$@"
