"""One ModelScope user: downloads a file into a hub cache through ``modelscope_hub``'s own download path.

The program lives in :mod:`sharedfs.testing.scenario_modelscope` (``sharedfs demo`` runs it too, from an
installed wheel, which does not ship tests/helpers); this path keeps the tests' command line.
"""

from sharedfs.testing.scenario_modelscope import main

if __name__ == "__main__":
    main()
