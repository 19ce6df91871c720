"""Directories and jobs on a cluster: makedirs and wait_for, collectives, node-local and job
directories, node gates, team caches, worker caps.
"""
