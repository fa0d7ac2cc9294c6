"""Do pieces of 4/16 tokens give a 64-token chunk's cells? Compare logits of a continuation."""
import sys, numpy as np
sys.path.insert(0, ".")  # run from the repository
from llama_cpp import Llama
from pipeinfer.model.llama_lib import llama_repacking
from pipeinfer.model.models import resolve_model
path = str(resolve_model(sys.argv[1]))
repack = sys.argv[2] == "repack"
with llama_repacking(repack):
    llm = Llama(model_path=path, n_ctx=1024, n_batch=64, n_ubatch=64, n_threads=1,
                flash_attn=True, logits_all=True, verbose=False)
import inspect, difflib
toks = llm.tokenize(inspect.getsource(difflib).encode())[:64 * 4 + 8]
def run(piece):
    llm.reset()
    llm.eval(toks[:64])
    for i in range(64, 192, piece):
        llm.eval(toks[i:i + piece])
    llm.eval(toks[192:256])          # a following chunk of 64, as a fresh evaluation has
    out = [np.array(llm.scores[255])]
    for t in toks[256:262]:
        llm.eval([t]); out.append(np.array(llm.scores[llm.n_tokens - 1]))
    return np.stack(out)
ref = run(64)
for piece in (32, 16, 8, 4, 2, 1):
    got = run(piece)
    print(piece, "exact" if np.array_equal(ref, got) else f"differs {np.abs(ref - got).max():.2e}")
