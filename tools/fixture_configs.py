"""Model-config pieces shared by the fixture generators (standard library only).

``make_fixtures.py``, ``make_mid_checkpoint.py``, ``make_moe_fixtures.py`` and ``train_toy_pair.py`` build
their transformers configs from these helpers. Every helper returns a fresh dict or list (transformers may
edit a config's nested dicts in place, so no two configs share one), with the keys in a fixed order:
the configs are serialised to JSON, and each script's dicts are byte for byte what it wrote before
the helpers existed. Build a variant with explicit overrides (``dict(MICRO_VISION_CONFIG, key=value)``),
never by editing a shared dict.
"""
from __future__ import annotations

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


def hybrid_layer_types(linear_per_full: int, blocks: int) -> list[str]:
    """Qwen3.5's hybrid stack: ``linear_per_full`` Gated DeltaNet layers, then one full-attention layer,
    ``blocks`` times (``hybrid_layer_types(1, 2)`` is [linear, full, linear, full])."""
    return ([LINEAR_ATTENTION] * linear_per_full + [FULL_ATTENTION]) * blocks


def attention_fields(heads: int, kv_heads: int, head_dim: int) -> dict:
    """The full-attention head layout, in config order."""
    return dict(num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim)


def gated_deltanet_fields(key_heads: int, value_heads: int, head_dim: int) -> dict:
    """The Gated DeltaNet (linear attention) layout, in config order: key and value heads of the same
    dimension (as in every fixture) and a causal conv of kernel 4."""
    return dict(
        linear_num_key_heads=key_heads,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=head_dim,
        linear_value_head_dim=head_dim,
        linear_conv_kernel_dim=4,
    )


def interleaved_mrope(mrope_section: list[int], rope_theta: float = 10000.0) -> dict:
    """Qwen3.5's ``rope_parameters``: multimodal RoPE on a quarter of each head, its frequencies split
    into temporal / height / width sections by ``mrope_section`` and interleaved."""
    return dict(
        rope_type="default",
        rope_theta=rope_theta,
        partial_rotary_factor=0.25,
        mrope_section=mrope_section,
        mrope_interleaved=True,
    )


def default_rope(rope_theta: float) -> dict:
    """A dense Qwen3's ``rope_parameters`` (targets and DFlash drafters): plain RoPE on the whole head."""
    return dict(rope_type="default", rope_theta=rope_theta)


def qwen3_5_text_config(*, vocab_size: int, hidden_size: int, intermediate_size: int, layer_types: list[str],
                        attention: dict, gated_deltanet: dict, max_position_embeddings: int, eos_token_id: int,
                        rope_parameters: dict, tie_word_embeddings: bool | None = False) -> dict:
    """A dense Qwen3.5 ``text_config`` (RMSNorm eps 1e-6): ``attention`` from ``attention_fields``,
    ``gated_deltanet`` from ``gated_deltanet_fields``. ``tie_word_embeddings=None`` leaves the key out
    (the checkpoint's top-level flag decides)."""
    tie = {} if tie_word_embeddings is None else dict(tie_word_embeddings=tie_word_embeddings)
    return dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=len(layer_types),
        layer_types=layer_types,
        **attention,
        **gated_deltanet,
        rms_norm_eps=1e-6,
        max_position_embeddings=max_position_embeddings,
        **tie,
        eos_token_id=eos_token_id,
        rope_parameters=rope_parameters,
    )


def qwen3_5_vision_config(*, depth: int, hidden_size: int, intermediate_size: int, num_heads: int,
                          patch_size: int, spatial_merge_size: int, out_hidden_size: int,
                          num_position_embeddings: int) -> dict:
    """A Qwen3.5 ``vision_config`` (temporal patch 2); ``out_hidden_size`` is the text hidden size."""
    return dict(
        depth=depth,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_heads=num_heads,
        patch_size=patch_size,
        temporal_patch_size=2,
        spatial_merge_size=spatial_merge_size,
        out_hidden_size=out_hidden_size,
        num_position_embeddings=num_position_embeddings,
    )


# The micro vision tower (depth 1, hidden 16, out 32) of the divergence and MoE fixtures; the toy pair's
# target uses it with out_hidden_size 64.
MICRO_VISION_CONFIG = qwen3_5_vision_config(
    depth=1,
    hidden_size=16,
    intermediate_size=16,
    num_heads=2,
    patch_size=2,
    spatial_merge_size=1,
    out_hidden_size=32,
    num_position_embeddings=4,
)
