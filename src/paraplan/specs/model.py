"""The architecture of a decoder-only transformer, named as Megatron-LM names its arguments."""

from __future__ import annotations

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
    # Megatron-LM fuses the bias of the row-parallel projections into the dropout-residual
    # kernel (default on); GPT-NeoX's bias_dropout_fusion defaults to off: one more add each.
    bias_dropout_fusion: Bool = True
    attention_dropout: Float = Field(default=0.0, ge=0, lt=1.0)
    hidden_dropout: Float = Field(default=0.0, ge=0, lt=1.0)
    source: str | None = None

    @model_validator(mode="after")
    def _derive(self) -> ModelSpec:
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
        if self.ffn_hidden_size is None:
            if self.activation == "swiglu":
                # Megatron-LM's default for SwiGLU keeps the parameter count of a 4h GELU MLP.
                fields["ffn_hidden_size"] = int(4 * self.hidden_size * 2 / 3 / 64) * 64
            else:
                fields["ffn_hidden_size"] = 4 * self.hidden_size
        for key, value in fields.items():
            object.__setattr__(self, key, value)
        groups = self.num_query_groups or self.num_attention_heads
        if self.num_attention_heads % groups:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by "
                f"num_query_groups={groups}"
            )
        return self

    def vocab_for(self, tp: int) -> int:
        """The vocabulary rows the model really holds, padded as Megatron-LM pads it for ``tp``."""
        if self.padded_vocab_size is not None:
            return self.padded_vocab_size
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple
