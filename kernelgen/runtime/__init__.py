"""Device runtimes: compile generated source and run it on NumPy arrays."""
