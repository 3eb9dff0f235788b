"""The architecture of a decoder-only transformer, named as Megatron-LM names its arguments."""

from __future__ import annotations

import functools
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from paraplan.specs._types import Bool, Float, Int


class ModelSpec(BaseModel):
    """A GPT-style decoder. Optional fields are derived as Megatron-LM derives them."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = "custom"
    aliases: tuple[str, ...] = ()
    num_layers: Int = Field(ge=1)
    hidden_size: Int = Field(ge=1)
    num_attention_heads: Int = Field(ge=1)
    num_query_groups: Int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("num_query_groups", "num_kv_heads")
    )
    kv_channels: Int | None = Field(default=None, ge=1)
    ffn_hidden_size: Int | None = Field(default=None, ge=1)
    seq_length: Int = Field(ge=1)
    # the tokenizer's tokens; with only padded_vocab_size given, the padded size stands for it
    vocab_size: Int | None = Field(default=None, ge=1)
    padded_vocab_size: Int | None = Field(default=None, ge=1)
    make_vocab_size_divisible_by: Int = Field(default=128, ge=1)
    activation: Literal["gelu", "swiglu"] = "gelu"
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    position_embedding: Literal["rotary", "learned", "alibi", "none"] = "learned"
    rotary_percent: Float = Field(default=1.0, gt=0, le=1.0)
    # RoPE's base frequency (HF rope_theta, Megatron-LM --rotary-base); None: the framework's
    # default (10000). It changes no cost, only the launch recipe.
    rope_theta: Float | None = Field(default=None, gt=0)
    attention: Literal["flash", "unfused"] = "flash"
    parallel_residual: Bool = False
    untie_embeddings_and_output_weights: Bool = False
    add_bias_linear: Bool = True
    add_bias_mlp: Bool | None = None  # GPT-NeoX's use_bias_in_mlp; default: add_bias_linear
    # a bias on the QKV projection (Megatron-LM --add-qkv-bias; Qwen2); default: add_bias_linear
    add_qkv_bias: Bool | None = None
    # Megatron-LM applies the MLP up projection's bias inside the fused bias-GELU kernel
    # (default on); without the fusion (GPT-NeoX's default) it is an add kernel of its own.
    bias_gelu_fusion: Bool = True
    # Megatron-Core applies SwiGLU in one fused kernel (--bias-swiglu-fusion, on by default);
    # eager PyTorch (torchtitan and fms-fsdp without torch.compile) runs silu, then a multiply
    swiglu_fusion: Bool = True
    # Megatron-Core, Transformer Engine and Apex run RMSNorm as one fused kernel that keeps its
    # input for the backward pass; Hugging Face's eager RMSNorm (transformers
    # models/llama/modeling_llama.py ``LlamaRMSNorm.forward``: ``hidden_states.to(torch.float32)``,
    # ``pow(2).mean(-1)``, ``hidden_states * torch.rsqrt(...)``, ``self.weight *
    # hidden_states.to(input_dtype)``) runs it as separate aten operators and keeps the float32
    # copy of its input and the normalized 16-bit tensor (``inventory.layer.norm``)
    rmsnorm_fusion: Bool = True
    # Megatron-Core projects q, k and v with one GEMM (``linear_qkv``) and a gated MLP's gate and
    # up halves with one (``linear_fc1``, 2 x ffn wide); torchtitan's, IBM fms' and Hugging Face's
    # Llama code run an ``nn.Linear`` each (``wq``/``wk``/``wv``, ``w1``/``w3``): thinner GEMMs,
    # each reading the layer input, and autograd summing their input gradients
    # (``inventory.layer``). The framework presets say which their model code runs.
    qkv_fusion: Bool = True
    gate_up_fusion: Bool = True
    # Megatron-LM fuses the bias of the row-parallel projections into the dropout-residual
    # kernel (default on); GPT-NeoX's bias_dropout_fusion defaults to off: one more add each.
    bias_dropout_fusion: Bool = True
    # Megatron-Core's fused rotary embedding (Transformer Engine's fused_apply_rotary_pos_emb, one
    # kernel per tensor); off with --no-rope-fusion (megatron/training/arguments.py, store_false
    # dest apply_rope_fusion: on by default). Off, the rotary embedding runs as its multi-kernel
    # form (``RoPE``, GPT-NeoX's and Megatron's unfused rotate_half, which the GPUs' ``RoPE``
    # curves time); on, one kernel per tensor (``RoPE_fused``, on the generic memory curve:
    # ``inventory.layer.FUSED_ROPE``), and fewer host launches (``inventory.moe_kernels``).
    rope_fusion: Bool = True
    # how the model code rotates q and k: ``kernel``, one RoPE operator (fused or not:
    # ``rope_fusion``; Megatron-Core, Transformer Engine, NeMo, GPT-NeoX); ``complex``, Meta's Llama reference code as
    # torchtitan runs it eagerly (``torch.view_as_complex(xq.float().reshape(...)) * freqs_cis``,
    # ``view_as_real``, ``type_as``: a float32 cast, a complex multiply and a cast back per
    # tensor); ``rotation``, IBM fms' ``RotaryEmbedding.adjusted_qk`` (a float32 cast, a multiply
    # by gathered 2 x 2 float32 rotation matrices into a doubled tensor, a sum over it and a cast
    # back per tensor). The eager forms are timed from their own bytes (``inventory.layer``).
    rope_impl: Literal["kernel", "complex", "rotation"] = "kernel"
    # grouped-query attention's K and V as the attention kernel gets them: ``none``, grouped (the
    # kernel reads each K/V head for its query heads: Transformer Engine, flash-attn, SDPA with
    # enable_gqa); ``copy``, repeated to every query head first (torchtitan 2024's ``repeat_kv``,
    # ``unsqueeze(3).expand(...).reshape(...)``; IBM fms' ``unsqueeze(2).expand(...).flatten(1,
    # 2)``): a copy of each forward, a sum over the repeats backward, and the attention kernel
    # reads and keeps K and V at every head. No copy for a model without GQA.
    gqa_expand: Literal["none", "copy"] = "none"
    attention_dropout: Float = Field(default=0.0, ge=0, lt=1.0)
    hidden_dropout: Float = Field(default=0.0, ge=0, lt=1.0)
    # Qwen3's and OLMo 2's RMSNorm of each query and key head (Megatron-LM --qk-layernorm)
    qk_layernorm: Bool = False
    # Multi-head latent attention (DeepSeek-V2/V3; Megatron-LM --multi-latent-attention,
    # --q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim):
    # queries and keys/values pass through low-rank latents; each head's query and key are a
    # qk_head_dim part without position and a qk_pos_emb_head_dim rotary part shared by the
    # heads' keys.
    multi_latent_attention: Bool = False
    q_lora_rank: Int | None = Field(default=None, ge=1)  # None: queries are not compressed
    kv_lora_rank: Int | None = Field(default=None, ge=1)
    qk_head_dim: Int | None = Field(default=None, ge=1)
    qk_pos_emb_head_dim: Int | None = Field(default=None, ge=1)
    v_head_dim: Int | None = Field(default=None, ge=1)
    # Mixture of experts, named as Megatron-Core names it (--num-experts, --moe-router-topk,
    # --moe-ffn-hidden-size, --moe-shared-expert-intermediate-size, --moe-layer-freq, ...).
    num_moe_experts: Int | None = Field(
        default=None, ge=1, validation_alias=AliasChoices("num_moe_experts", "num_experts")
    )
    moe_router_topk: Int | None = Field(default=None, ge=1)  # default 2 (Megatron-LM's)
    moe_ffn_hidden_size: Int | None = Field(default=None, ge=1)  # default: ffn_hidden_size
    # the shared experts' summed width (DeepSeek: n_shared_experts x moe_intermediate_size)
    moe_shared_expert_intermediate_size: Int | None = Field(default=None, ge=1)
    # which layers are MoE: every n-th (layer i when i % n == 0, Megatron-LM's int form) or a
    # 0/1 pattern over the layers (its list form, e.g. DeepSeek-V3's [0]*3+[1]*58)
    moe_layer_freq: Int | tuple[Literal[0, 1], ...] | None = None
    # the first k layers dense (DeepSeek's first_k_dense_replace); combines with moe_layer_freq
    moe_first_k_dense: Int | None = Field(default=None, ge=0)
    moe_router_score_function: Literal["softmax", "sigmoid"] | None = None  # default softmax
    # tokens an expert takes, as a multiple of its even share; None: dropless (Megatron's default)
    moe_expert_capacity_factor: Float | None = Field(default=None, gt=0)
    # the auxiliary load-balancing loss's coefficient (0: none, as DeepSeek-V3's aux-loss-free
    # balancing); default 1e-2 (Megatron-LM's --moe-aux-loss-coeff default is 0, its recipes 1e-2)
    moe_aux_loss_coeff: Float | None = Field(default=None, ge=0)
    # one grouped GEMM for a rank's experts (--moe-grouped-gemm, on in every Megatron MoE
    # recipe); off: one GEMM per local expert in a loop (SequentialMLP)
    moe_grouped_gemm: Bool | None = None
    # the CUDA streams the grouped GEMM runs its per-expert GEMMs on side by side: Transformer
    # Engine's GroupedLinear (TEGroupedMLP) puts the i-th on stream i % 4 (inventory.moe
    # TE_GROUPED_GEMM_STREAMS, the default); a single-kernel grouped GEMM (CUTLASS) is at least
    # the local experts (their summed rows as one GEMM, paraplan's costing before this field)
    moe_grouped_gemm_streams: Int | None = Field(default=None, ge=1)
    # Megatron-Core's --moe-router-fusion (Transformer Engine's fused top-k and aux-loss kernels)
    # and --moe-permute-fusion (TE's fused permute, unpermute and chunk sort): how many kernels
    # the router and the dispatcher launch (inventory.moe_kernels). Unset: off, Megatron-LM's
    # default (megatron/training/arguments.py, store_true); the MoE recipes turn both on
    moe_router_fusion: Bool | None = None
    moe_permute_fusion: Bool | None = None
    # group-limited routing (Megatron-Core --moe-router-num-groups / --moe-router-group-topk; HF
    # DeepSeek-V2/V3 n_group / topk_group): the experts split into equal groups, each token picks
    # its top group_topk groups and its top-k experts among them. With one group per node
    # (DeepSeek-V3: 8 groups, 4 of them, "each token will be sent to at most 4 nodes", report
    # section 3.2.2) it bounds the nodes a token's dispatch crosses to.
    moe_router_num_groups: Int | None = Field(default=None, ge=1)
    moe_router_group_topk: Int | None = Field(default=None, ge=1)
    # which parameters the model's authors count as active: with the input embedding (Mistral's
    # 12.9B of Mixtral 8x7B, Qwen's 3.3B of Qwen3-30B-A3B: total minus the experts a token skips;
    # the default) or without it (OpenAI's gpt-oss model card: 5.13B of gpt-oss-120b counts the
    # unembedding but not the embedding, a table lookup)
    active_params_count_embedding: Bool | None = None
    # multi-token prediction (DeepSeek-AI 2024, DeepSeek-V3 report section 2.2; Megatron-Core
    # --mtp-num-layers): D sequential modules on the last pipeline stage, each predicting one
    # token further: RMSNorms of the previous depth's hidden state and of the next token's
    # embedding, their concatenation projected 2h -> h, one transformer layer (the model's last
    # layer's kind), the shared output head and its loss. The embedding and head are shared with
    # the main model. Off (0) by default; DeepSeek-V3 trains with D = 1.
    mtp_num_layers: Int = Field(default=0, ge=0)
    # where each layer's operators come from: the hand-written inventory (``hand``), or traced
    # from the model's own code (``traced``; needs ``hf_config`` and the 'hf' extra), its
    # tensor parallelism from the model's ``base_model_tp_plan``
    inventory: Literal["hand", "traced"] = "hand"
    # how a traced inventory is costed: ``fused`` (the default) as training frameworks run the
    # model (one kernel per norm, rotary embedding, gated activation and residual add, q/k/v
    # and gate/up as one GEMM each, timed on the hand-written operators' curves), or ``eager``
    # as Hugging Face's eager code runs it (each aten operator, by the roofline)
    kernels: Literal["fused", "eager"] = "fused"
    # the Hugging Face config.json a traced inventory builds the model from (set by the reader
    # of ``model: {hf_config: ...}`` when ``inventory: traced``)
    hf_config: str | None = None
    source: str | None = None

    @model_validator(mode="after")
    def _derive(self) -> ModelSpec:
        if self.inventory == "traced" and not self.hf_config:
            raise ValueError("inventory: traced needs the model's hf_config (a config.json to trace)")
        fields = {}
        if self.vocab_size is None:
            if self.padded_vocab_size is None:
                raise ValueError(
                    "vocab_size: required but missing (give vocab_size, the tokenizer's tokens, "
                    "or padded_vocab_size, the embedding rows the model holds)"
                )
            fields["vocab_size"] = self.padded_vocab_size
        if self.rope_theta is not None and self.position_embedding != "rotary":
            raise ValueError(
                f"rope_theta: only rotary position embeddings have a base frequency "
                f"(position_embedding is {self.position_embedding})"
            )
        if self.rope_impl != "kernel" and self.position_embedding != "rotary":
            raise ValueError(
                f"rope_impl: only rotary position embeddings rotate q and k "
                f"(position_embedding is {self.position_embedding})"
            )
        if not self.rmsnorm_fusion and self.normalization != "rmsnorm":
            raise ValueError(
                f"rmsnorm_fusion: only an RMSNorm model runs its norm fused or eagerly "
                f"(normalization is {self.normalization})"
            )
        if not self.gate_up_fusion and self.activation != "swiglu":
            raise ValueError(
                f"gate_up_fusion: only a gated MLP (activation swiglu) has a gate and an up projection "
                f"(activation is {self.activation})"
            )
        if not self.qkv_fusion and self.multi_latent_attention:
            raise ValueError("qkv_fusion: multi-head latent attention has its own projections (no q, k, v GEMMs)")
        if self.num_query_groups is None:
            fields["num_query_groups"] = self.num_attention_heads
        if self.kv_channels is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"hidden_size={self.hidden_size} is not divisible by "
                    f"num_attention_heads={self.num_attention_heads}; give kv_channels"
                )
            fields["kv_channels"] = self.hidden_size // self.num_attention_heads
        if self.add_bias_mlp is None:
            fields["add_bias_mlp"] = self.add_bias_linear
        if self.add_qkv_bias is None:
            fields["add_qkv_bias"] = self.add_bias_linear
        fields.update(self._derive_attention())
        if self.ffn_hidden_size is None:
            if self.activation == "swiglu":
                # Megatron-LM's default for SwiGLU keeps the parameter count of a 4h GELU MLP.
                fields["ffn_hidden_size"] = int(4 * self.hidden_size * 2 / 3 / 64) * 64
            else:
                fields["ffn_hidden_size"] = 4 * self.hidden_size
        fields.update(self._derive_moe(fields.get("ffn_hidden_size", self.ffn_hidden_size)))
        for key, value in fields.items():
            object.__setattr__(self, key, value)
        groups = self.num_query_groups or self.num_attention_heads
        if self.num_attention_heads % groups:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by "
                f"num_query_groups={groups}"
            )
        return self

    def _derive_attention(self) -> dict:
        mla = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
        if not self.multi_latent_attention:
            for name in mla:
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only with multi_latent_attention: true")
            return {}
        if self.attention != "flash":
            raise ValueError("multi_latent_attention: paraplan models MLA with flash attention only")
        # DeepSeek-V3's sizes (Megatron-Core MLATransformerConfig's defaults)
        defaults = {"kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128}
        return {k: v for k, v in defaults.items() if getattr(self, k) is None}

    def _derive_moe(self, ffn: int) -> dict:
        moe = ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
               "moe_layer_freq", "moe_first_k_dense", "moe_router_score_function",
               "moe_expert_capacity_factor", "moe_aux_loss_coeff", "moe_grouped_gemm",
               "moe_grouped_gemm_streams", "moe_router_num_groups", "moe_router_group_topk",
               "moe_router_fusion", "moe_permute_fusion")
        if self.num_moe_experts is None:
            for name in moe:
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: the model is dense (give num_moe_experts for a mixture of experts)")
            return {}
        topk = self.moe_router_topk or 2
        if topk > self.num_moe_experts:
            raise ValueError(
                f"moe_router_topk: {topk} is more than num_moe_experts={self.num_moe_experts}"
            )
        self._check_groups(topk)
        freq = self.moe_layer_freq
        if isinstance(freq, tuple) and len(freq) != self.num_layers:
            raise ValueError(
                f"moe_layer_freq: the pattern has {len(freq)} entries but num_layers={self.num_layers}"
            )
        if isinstance(freq, int) and freq < 1:
            raise ValueError(f"moe_layer_freq: {freq} is not >= 1")
        if (self.moe_first_k_dense or 0) >= self.num_layers:
            raise ValueError(
                f"moe_first_k_dense: {self.moe_first_k_dense} leaves no MoE layer of num_layers={self.num_layers}"
            )
        return {
            "moe_router_topk": topk,
            "moe_ffn_hidden_size": self.moe_ffn_hidden_size or ffn,
            "moe_layer_freq": 1 if freq is None else freq,
            "moe_first_k_dense": self.moe_first_k_dense or 0,
            "moe_router_score_function": self.moe_router_score_function or "softmax",
            "moe_aux_loss_coeff": 1e-2 if self.moe_aux_loss_coeff is None else self.moe_aux_loss_coeff,
            "moe_grouped_gemm": True if self.moe_grouped_gemm is None else self.moe_grouped_gemm,
        }

    def _check_groups(self, topk: int) -> None:
        """Megatron-Core's group_limited_topk: equal groups, group_topk of them, enough experts
        in the chosen groups for the top-k."""
        groups, chosen, experts = self.moe_router_num_groups, self.moe_router_group_topk, self.num_moe_experts
        if (groups is None) != (chosen is None):
            raise ValueError("moe_router_group_topk: group-limited routing needs both moe_router_num_groups "
                             "and moe_router_group_topk")
        if groups is None or chosen is None or experts is None:
            return
        if experts % groups:
            raise ValueError(f"moe_router_num_groups: {groups} does not divide num_moe_experts={experts}")
        if chosen > groups:
            raise ValueError(f"moe_router_group_topk: {chosen} is more than moe_router_num_groups={groups}")
        if chosen * (experts // groups) < topk:
            raise ValueError(f"moe_router_group_topk: {chosen} groups of {experts // groups} experts hold fewer "
                             f"than moe_router_topk={topk}")

    @property
    def is_moe(self) -> bool:
        return self.num_moe_experts is not None

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        """Whether each layer (in order) is a mixture of experts; all False for a dense model."""
        return _moe_pattern(self.num_layers, self.num_moe_experts is not None, self.moe_layer_freq,
                            self.moe_first_k_dense or 0)

    def vocab_for(self, tp: int) -> int:
        """The vocabulary rows the model really holds, padded as Megatron-LM pads it for ``tp``."""
        if self.padded_vocab_size is not None:
            return self.padded_vocab_size
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple


@functools.lru_cache(maxsize=64)
def _moe_pattern(num_layers: int, moe: bool, freq: int | tuple[int, ...] | None, first: int) -> tuple[bool, ...]:
    """Megatron-LM's --moe-layer-freq: layer i is MoE when i % freq == 0 (an int) or the
    pattern says 1 (a list), except the first ``first`` layers (DeepSeek's first_k_dense_replace)."""
    if not moe:
        return (False,) * num_layers
    freq = 1 if freq is None else freq
    pattern = freq if isinstance(freq, tuple) else tuple(int(i % freq == 0) for i in range(num_layers))
    return tuple(bool(v) and i >= first for i, v in enumerate(pattern))
