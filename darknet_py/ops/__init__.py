"""The op families, one folder each: a family's NumPy reference (a mixin of NumpyBackend),
its CUDA launchers (a mixin of CudaBackend naming its KERNEL_FILES) and its .cu/.cuh
files; headers several families include are in ops/common/. docs/internals.md ("Op
families") lists them."""
