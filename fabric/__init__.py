"""The fabric model: pure Python + numpy; never imports mpi4py."""
