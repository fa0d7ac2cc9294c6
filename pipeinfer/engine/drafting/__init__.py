"""Where draft jobs run: drafter.py (the draft model: greedy token trees with a confidence
cutoff) -> executors.py (inline, or on a thread of its own); ngram_drafts.py and
ngram_tree_drafts.py (drafts from the text itself), tree_drafts.py (specpipe's tree levels),
grammar_drafts.py (drafts under a grammar); hierarchy.py -> hierarchy_drafts.py (PipeSpec's
model hierarchy on the head) and hierarchy_remote.py (on ranks of its own)."""
