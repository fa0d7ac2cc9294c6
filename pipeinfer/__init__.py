"""pipeinfer: asynchronous pipelined speculation for GGUF models on CPU clusters with MPI."""

__version__ = "0.1.0"
