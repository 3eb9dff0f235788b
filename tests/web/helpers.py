"""What the web tests share: a predict form, a small Hugging Face config and a test client."""

from __future__ import annotations

import json

# the demo job's values, as the predict page sends them
FORM = {
    "model_source": "catalog", "model": "llama-3-8b", "cluster_source": "catalog", "cluster": "aws-p5.48xlarge",
    "num_nodes": "4", "tp": "2", "pp": "2", "micro_batch_size": "2", "global_batch_size": "512",
    "zero_stage": "1", "recompute": "selective", "sequence_parallel": "on", "precision": "bf16",
    "train_tokens": "1T",
}
POST = {"X-Paraplan": "1"}

# a Llama-shaped config.json (about Llama-3-8B's shapes)
HF_CONFIG = json.dumps({
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
    "max_position_embeddings": 8192, "tie_word_embeddings": False,
}).encode()
