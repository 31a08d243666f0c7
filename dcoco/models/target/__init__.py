"""The target model: loading, GGUF weights, precisions, the layer loop, the KV cache."""
