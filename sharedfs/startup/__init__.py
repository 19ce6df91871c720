"""Start-up: what runs once a target framework is imported (the bootstrap's side),
activation, and enable/disable."""
