"""Filesystem primitives, standard library only: opening untrusted files, publishing a file
atomically, whole-file OS locks."""
