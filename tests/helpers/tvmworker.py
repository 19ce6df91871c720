"""One tvm-ffi user: ``tvm_ffi.cpp.load_inline`` of one tiny C++ function, then a call of it.

The program lives in :mod:`sharedfs.demo.scenario_tvm_ffi` (``sharedfs demo`` runs it too, from an
installed wheel, which does not ship tests/helpers); this path keeps the tests' command line.
"""

from sharedfs.demo.scenario_tvm_ffi import main

if __name__ == "__main__":
    main()
