"""The data model: settings, environment variables, the policy and its layers, filesystem
facts, holder records, process identity."""
