"""What the tests share: mpirun launches with time limits (mpi_launcher), numpy references of
the kernels and schedules (reference), and a Transport over threads (thread_transport)."""
