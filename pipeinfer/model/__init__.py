"""The model side: GGUF files and their slices into stages, the llama.cpp boundary, the
tokenizer, embedding, sampling, layer partitions, the model cache and tiny test models."""
