"""The plugin machinery: hook specifications, the registry, this process's runtime, the
plugins' remembered choices, the shape of a shim, stand-ins and one-line logs."""
