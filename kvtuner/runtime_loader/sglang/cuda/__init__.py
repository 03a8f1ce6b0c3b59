"""The kvtuner attention backend (CUDA): fused kernels over the pool's packed rows."""
