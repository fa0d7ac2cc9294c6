"""The model side: GGUF files, their slices into stages, and the llama.cpp boundary.

models.py (the model cache: GGUF files assembled from PyPI wheels; gguf_files.py checks a
file, gguf_header.py parses headers) -> partition.py and balance.py (layer splits;
handover.py: who takes over a lost stage's layers) ->
slicing.py (a model cut into stage files) with stage_cache.py (content-keyed;
slice_pieces.py: a stage assembled from a cached slice and the piece it lacks) ->
llama_lib.py (the ctypes boundary) -> stage.py (a slice evaluated by llama.cpp, in batches of
batch.py; stage_loading.py loads one on a thread; row_costs.py times it on runs of a few
rows) -> kept_cells.py (a stage's KV cells of a request,
copied to disk and taken back after a failure, written on kept_writer.py's thread;
kv_state.py takes them apart by layer). On the head: tokenizer.py (with chat_template.py
and grammar.py), embedding.py (token embeddings), sampling.py. The draft's files:
draft_cache.py (compact.py's Q4_0 copy), draft_vocab.py and draft_vocab_stage.py (a reduced
vocabulary), vocab_check.py (the same vocabulary as the target)."""
