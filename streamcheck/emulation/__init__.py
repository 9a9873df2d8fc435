"""Libraries emulated on the sim, so their unmodified programs run on a CPU-only machine:
`torch_cuda` (torch's CUDA device: tensors, operators, streams, events, the caching allocator,
graphs) over `allocator` (torch's caching allocator and its reuse rule). Imported only when a
run asks for the sim: importing it imports torch."""
