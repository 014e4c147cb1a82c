"""Model scale, above the compile driver: graph rewrites that change weights, not kernels
(``rewrite``: Conv-BN folding, kernel enlarging) and splitting an operator chain into fusion
blocks (``chain``). The ONNX importer, the extended computation graph, the fusion planners, the
executor and the inter-operator scheduler are built here, on ``kernelgen.compile``; the kernel
layer below never imports this package."""
