"""glowlm's CPU kernels: one C++ source tree for every CPU family, and how to build it.

- ``csrc/cpu/``: the algorithms (GEMV, GEMM, paged attention, norms, rotary,
  activations), torch-free and written once against ``cpu/vec.h``.
- ``csrc/arch/``: the only per-architecture code, one vector header per ISA family.
- ``csrc/torch/``: the torch binding (argument checks, dispatch, the fused layers, the
  quantized linear ops one file per tile family over ``quant_common.h``,
  ``TORCH_LIBRARY`` registration under each plugin's namespace).
- ``csrc/test/``: the torch-free contract driver run under qemu (``make test-cross``).
- :mod:`.build`: the variant table (plugin x ISA -> flags), source hash, the
  install-time extensions (:func:`.build.setup_kwargs`) and the run-time loader.
"""
