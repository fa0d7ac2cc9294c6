#!/bin/bash
# Issue 34: pipeinfer with default flags (--draft-vocab auto) against --draft-vocab 0 on
# NODES x CPU core nodes (default 8 x 0.25), interleaved, K=3 (draft_vocab.sh's runs).
DEFAULT=1 exec bash "$(dirname "$0")/../hop-2026-11-26e/draft_vocab.sh"
