"""What the reduced-vocabulary draft tests share (test_draft_vocab.py,
test_draft_vocab_auto.py): the kept sizes they use with the tiny models (K_TINY) and with
Qwen2.5 (K_QWEN, the size --draft-vocab auto picks for it), Qwen's prompt, and a successful
`pipeinfer run --ignore-eos --json` under mpiexec (`run_json`)."""

from __future__ import annotations

from support import mpi_util
from support.tiny_set import PROMPT

K_TINY = 200
QWEN_PROMPT = ("Write a Python function that parses a CSV file of transactions (date, amount, "
               "category) and returns the total amount per category.")
K_QWEN = 32768


def run_json(n_ranks, model, *args, n_predict, timeout=180, prompt=PROMPT) -> dict:
    """The --json result of a successful `pipeinfer run --ignore-eos` under mpiexec -n N_RANKS."""
    launch = mpi_util.run_pipeinfer(n_ranks, model, prompt, "--ignore-eos", *args,
                                    n_predict=n_predict, timeout=timeout)
    assert launch.rc == 0 and not launch.timed_out, launch.describe()
    assert "Traceback" not in launch.stderr, launch.describe()
    return launch.json
