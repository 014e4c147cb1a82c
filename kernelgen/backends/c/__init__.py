"""The C family (OpenCL C, NEON C): statements, vector code and the contraction holes."""
