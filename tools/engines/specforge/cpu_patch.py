"""CPU workarounds for SpecForge 0.2.0 offline capture (imported by run_prepare.py
when SF_CPU_PATCH=1). Each is numbered as in the README."""
import torch
import torch.distributed as dist
import specforge.offline_capture.sglang_backend.capture as cap
from specforge.distributed import get_tp_group


# W2: specforge/offline_capture/sglang_backend/capture.py,
# OfflineSGLangCaptureBackend.build: the ServerArgs it builds has no `device`
# (so SGLang's get_device() raises "No accelerator ... is available" on a CPU
# host), and it passes gpu_id=torch.cuda.current_device(). Same body with
# device="cpu" and gpu_id=0.
@classmethod
def build(cls, pretrained_model_name_or_path, *, torch_dtype=None,
          trust_remote_code=False, **kwargs):
    tp_size = dist.get_world_size(get_tp_group())
    server_args = cap.ServerArgs(
        model_path=pretrained_model_name_or_path,
        trust_remote_code=trust_remote_code,
        dtype=torch_dtype if torch_dtype is not None else "auto",
        enable_return_hidden_states=True,
        disable_cuda_graph=True,
        chunked_prefill_size=-1,
        tp_size=tp_size,
        pp_size=1,
        device="cpu",                                   # W2
        # W3: sglang/srt/server_args.py ServerArgs._handle_mamba_radix_cache picks
        # the "extra_buffer" mamba cache strategy while the overlap scheduler is on,
        # and _validate_mamba_extra_buffer asserts "extra_buffer needs CUDA/MUSA/NPU
        # (FLA)". The offline capture never schedules, so turn overlap off, which
        # selects "no_buffer" (only relevant to hybrid GDN/mamba targets).
        disable_overlap_schedule=True,                  # W3
        **kwargs,
    )
    tp_rank = dist.get_rank(get_tp_group())
    moe_ep_rank = tp_rank // (server_args.tp_size // server_args.ep_size)
    model_config = cap.ModelConfig.from_server_args(server_args)
    model_runner = cap.SGLangRunner(
        model_config=model_config,
        mem_fraction_static=server_args.mem_fraction_static,
        gpu_id=0,                                       # W2
        tp_rank=tp_rank,
        tp_size=server_args.tp_size,
        moe_ep_rank=moe_ep_rank,
        moe_ep_size=server_args.ep_size,
        pp_rank=0,
        pp_size=1,
        server_args=server_args,
        nccl_port=None,
        is_draft_worker=False,
    )
    model_runner.alloc_memory_pool()
    model_runner.init_attention_backends()
    model_runner.init_cuda_graphs()
    cap.wrap_offline_eagle3_logits_processors(model_runner.model)
    return cls(model_runner)


cap.OfflineSGLangCaptureBackend.build = build
