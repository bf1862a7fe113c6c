"""vLLM's ExampleHiddenStatesConnector with the KV-cache copy done on the CPU.

vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py,
ExampleHiddenStatesConnector._submit_async_write, copies a finished request's hidden states
out of the CacheOnlyAttentionLayer's cache with CUDA-only calls: torch.cuda.Stream,
torch.cuda.Event and pinned host memory (torch.empty_like(..., pin_memory=True)). On vLLM's
CPU build those fail. This subclass overrides that one method: it reads the same slots with
the same helper (extract_from_kv_cache), clones them, and writes the same file
({"hidden_states": [T, L, H], "token_ids": [T]}, named {shared_storage_path}/{req_id}.safetensors
by build_connector_meta) synchronously, releasing the same per-file lock. Everything else
(scheduling, file names, which tokens, the lock files, get_finished's bookkeeping) is the
parent's code; get_finished only calls .query() on what _req_copy_events holds, so a finished
copy is recorded as an object whose query() is True.

Load it with
    kv_transfer_config={"kv_connector": "CPUHiddenStatesConnector",
                        "kv_connector_module_path": "cpu_connector",   # this file on sys.path
                        "kv_role": "kv_producer",
                        "kv_connector_extra_config": {"shared_storage_path": DIR}}
(vllm/distributed/kv_transfer/kv_connector/factory.py, KVConnectorFactory: with
kv_connector_module_path set, the class named kv_connector is taken from that module).
"""
from __future__ import annotations

import fcntl
import os

import torch
from safetensors.torch import save_file

from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the parent's torch.cuda.Event: the copy is already complete."""

    @staticmethod
    def query() -> bool:
        return True

    @staticmethod
    def synchronize() -> None:
        return None


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        block_ids_t = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(0, self._block_size, dtype=torch.long)
        slot_mapping = (offsets.reshape(1, -1) + block_ids_t.reshape(-1, 1) * self._block_size).flatten()
        num_tokens = pending.token_ids.shape[0]
        hidden_states = extract_from_kv_cache(self._kv_cache, slot_mapping, num_tokens).clone()
        tensors = {"hidden_states": hidden_states.contiguous(), "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename) or ".", exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            save_file(tensors, pending.filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
        self._req_copy_events[pending.req_id] = _Done()
