"""Hopper (sm_90) kernels in Gluon. DRAFT: compiled on the CPU, not yet run on a GPU, not a backend yet."""
