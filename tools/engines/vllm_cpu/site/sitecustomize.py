# Imported by Python at start-up when this folder is on PYTHONPATH (run.py puts it there for
# the processes vLLM spawns). It only acts when HSPARITY_VLLM_FIX_GROUPED_K_NORM=1; see
# ../fix_grouped_k_norm.py for what it changes.
import os
import sys

if os.environ.get("HSPARITY_VLLM_FIX_GROUPED_K_NORM") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import fix_grouped_k_norm

    fix_grouped_k_norm.install_import_hook()
