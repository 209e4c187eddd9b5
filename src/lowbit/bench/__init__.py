"""Benchmarks: machine read bandwidth (the roofline's roof), GEMV/GEMM per format, end to end."""
