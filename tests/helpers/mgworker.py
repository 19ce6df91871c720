"""Megatron's GPT dataset on CPU: ``prepare PREFIX`` writes a tiny indexed dataset, ``rank CACHE PREFIX SAMPLES``
is one gloo rank that builds the datasets from it.

The program lives in :mod:`sharedfs.demo.scenario_megatron` (``sharedfs demo`` runs it too, from an
installed wheel, which does not ship tests/helpers); this path keeps the tests' command line.
"""

import sys

from sharedfs.demo.scenario_megatron import prepare, rank

if __name__ == "__main__":
    if sys.argv[1] == "prepare":
        prepare(sys.argv[2])
    else:
        rank(sys.argv[2], sys.argv[3], int(sys.argv[4]))
