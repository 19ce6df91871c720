"""The command line: ``sharedfs status|doctor|env|cleanup|demo`` and the probes behind ``doctor``."""
